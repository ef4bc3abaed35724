"""The bad-input sweep (lab/bad_input_sweep/) as a regression check: a representative subset
of its catalogue -- the Python API on an emulated GPU host, the CLI, suite files, bundles,
settings -- each case in its own process, none of which may end in a traceback, a silent
accept or a hang; and the classifier's self-test, which plants each of those outcomes and
sees it caught."""
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lab" / "bad_input_sweep"))
sweep = importlib.import_module("sweep")
catalogue = importlib.import_module("catalogue")

# one or more cases of each group of the catalogue, each refused clearly or answered right
# on the tree the sweep last ran on (lab/bad_input_sweep/records/outcomes.jsonl)
SUBSET = [
    "matmul.operands.a_float32", "matmul.operands.k_mismatch", "matmul.operands.a_sparse_coo",
    "matmul.operands.a_odd_offset", "matmul.operands.bf16", "matmul.operands.m_0",
    "torch_op.operands.a_transposed_m_300", "matmul.operands.ab_transposed", "epilogue.operands.a_requires_grad",
    "matmul.keywords.bias_true", "matmul.keywords.act_upper", "matmul.keywords.step_v99",
    "matmul.keywords.out_same_as_a", "matmul.keywords.bias_fp16", "matmul.overlap.epilogue",
    "matmul.keywords.out_dtype_fp32",
    "swiglu.concatenated", "swiglu.works.fused", "swiglu.fused_after_clone",
    "choose.negative_m", "explain.dtype_torch_bf16", "choose.card_bogus",
    "fp8.a_e5m2", "fp8.works.row", "fp8.k_24",
    "nn.works.patch_sequential", "nn.works.patch_weight_norm_kept", "nn.patch_none",
    "settings.cache._nosuchuser_", "settings.typo.tirx_gemm_bundel",
    "cli.unknown_command", "cli.choose.letters", "cli.build.step_space",
    "cli.export.suite_m_huge", "cli.export.suite_binary", "cli.bundle.manifest_deep",
    "cli.regress.update_list", "cli.run.sha_without_bundle",
    "use_bundle.manifest_list",
    "grouped.offs_int64", "grouped.works.masked", "moe.works.fallback_matches_reference",
    "grouped_fp8.scale_b_short", "grouped_fp8.counts_with_2d_a", "grouped_fp8.works.masked",
    "fp8_nn.from_checkpoint_e5m2", "autograd.set_step_bogus",
]
BAD = ("traceback", "silent", "hang")


def _cases():
    by_id = {c.id: c for c in catalogue.cases()}
    missing = [i for i in SUBSET if i not in by_id]
    assert not missing, f"cases no longer in the catalogue: {missing}"
    return [by_id[i] for i in SUBSET]


def test_the_subset_ends_in_no_traceback_silent_accept_or_hang():
    """Under 60 s on this machine: the Python cases run in children forked from one warm
    process, the CLI cases in their own interpreters, two at a time."""
    import concurrent.futures as futures
    with futures.ThreadPoolExecutor(2) as pool:
        records = list(pool.map(sweep.run_case, _cases()))
    bad = [f"{r['id']}: {r['outcome']}: {r['message'][:200]}" for r in records
           if r["outcome"] in BAD]
    assert not bad, "\n".join(bad)
    assert {r["outcome"] for r in records} <= {"worked", "clear", "unclear"}
    assert sum(r["outcome"] == "worked" for r in records) >= 8  # the valid ones answered right


# --------------------------------------------------------------------------------------
# the classifier's self-test: each bad outcome planted, and caught
# --------------------------------------------------------------------------------------
def _planted(want, **kw):
    return sweep.Case(id=f"planted.{want}", group="planted", **kw)


PLANTED = [
    # a bug deep in the project: a KeyError from a tirx_gemm frame
    ("traceback", dict(kind="py", code="from tirx_gemm import registry\n"
                                       "registry.get.__globals__['STEPS'] = None\n"
                                       "registry.get('v9', 'sm_90a')\n")),
    # Python's own words from inside the project, whatever the exception's kind
    ("traceback", dict(kind="py", code="from tirx_gemm.op import keywords\n"
                                       "keywords._ceil_div(None, 8)\n")),
    # a traceback printed by a command
    ("traceback", dict(kind="sh", argv=[sys.executable, "-c", "import tirx_gemm.cli\n"
                                                              "{}['x']"])),
    # an error where the input should have been refused
    ("silent", dict(kind="py", code="from tirx_gemm import matmul as mm\n"
                                    "mm.choose(128, 4096, 4096)\n", expect="error")),
    # a wrong answer
    ("silent", dict(kind="py", code="ok(1 + 1 == 3, 'arithmetic')\n", expect="work")),
    # a refused command that left a change behind
    ("silent", dict(kind="sh", argv=["bash", "-c", "echo changed > {T}/f; exit 2"],
                    files={"f": "kept\n"}, unchanged=("f",))),
    ("hang", dict(kind="py", code="import time\ntime.sleep(30)\n", timeout=2)),
    ("unclear", dict(kind="py", code="raise ValueError('bad')\n")),
    ("clear", dict(kind="py", code="from tirx_gemm import matmul as mm\n"
                                   "mm.choose(-5, 4096, 4096)\n", needles=("M=-5",))),
]


@pytest.mark.parametrize("want, fields", PLANTED,
                         ids=[f"{w}-{i}" for i, (w, _) in enumerate(PLANTED)])
def test_the_classifier_catches_what_is_planted(want, fields):
    rec = sweep.run_case(_planted(want, **fields))
    assert rec["outcome"] == want, rec


def test_a_message_is_judged_on_one_line_the_input_and_a_way_out():
    judge = sweep.judge_message
    assert judge("x=5 must be a positive int", ["x=5"], "/t")[0] == "clear"
    assert judge("x=5 is bad", ["x=5"], "/t")[0] == "unclear"  # no way out
    assert judge("bad value: pass x=1", ["x=5"], "/t")[0] == "unclear"  # the input unnamed
    assert judge("x=5 bad\npass x=1", ["x=5"], "/t")[0] == "unclear"  # two lines
    assert judge("cannot run x=5: no GPU\nto run it on a Hopper GPU host: export it", ["x=5"],
                 "/t")[0] == "clear"  # a refusal and one line of how to go on
