"""fp8 and grouped entries of shape suites: the public fp8 suite file, its validation, the
bundle requests `tirx-gemm export --suite` makes of it (and of grouped entries through
tirx_gemm.op.grouped.suite_builds, called lazily), the CLI export with its digest, and the
benchmark table's fp8 rows. No GPU: the timing itself is tirx_gemm.op.fp8_bench's, run by
`tirx-gemm bench --suite` on a Hopper host (lab/fp8_on_hopper)."""
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tirx_gemm.op import suite

ROOT = Path(__file__).resolve().parent.parent
FP8_SUITE = ROOT / "tirx_gemm" / "op" / "suites" / "fp8-models.json"
TEXT = {"model": "m", "layer": "l", "why": "w"}


def _write(tmp_path, shapes, **top):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"name": "t", "dtypes": ["bfloat16"], **top, "shapes": shapes}))
    return p


def test_the_public_fp8_suite_covers_the_models_and_token_counts():
    s = suite.load_suite(FP8_SUITE)
    assert len(s.entries) >= 30 and all(e.kind == suite.FP8 for e in s.entries)
    assert {e.M for e in s.entries} == {1, 16, 64, 128, 512, 2048, 8192}
    models = {e.model for e in s.entries}
    assert {"Llama-3-8B", "Llama-3-70B", "DeepSeek-V3"} <= models
    assert any(m.startswith("Qwen2.5") for m in models)
    assert any("lm_head" in e.layer and e.model == "DeepSeek-V3" for e in s.entries)
    assert all(e.scales == ("tensor", "row", "block") for e in s.entries)
    assert all(e.K % 128 == 0 for e in s.entries)  # block scales need whole 128-K blocks
    assert len(s.fp8_cases()) == 3 * len(s.entries) and s.cases() == []


@pytest.mark.parametrize("entry,needle", [
    ({"M": 1, "N": 64, "K": 200, "scales": ["block"]}, "K=200 is not a multiple of 16"),
    ({"M": 1, "N": 64, "K": 400, "scales": ["block"]}, "K=400 with block scales"),
    ({"M": 1, "N": 64, "K": 256, "scales": ["mx"]}, "scales must be a non-empty list"),
    ({"M": 1, "N": 64, "K": 256, "scales": []}, "scales must be a non-empty list"),
    ({"M": 1, "N": 64, "K": 256, "epilogues": [{"ACT": "gelu"}]}, "has no epilogues"),
])
def test_bad_fp8_entries_are_one_line_errors(tmp_path, entry, needle):
    p = _write(tmp_path, [{"kind": "fp8", **TEXT, **entry}])
    with pytest.raises(ValueError, match=needle) as e:
        suite.load_suite(p)
    assert "\n" not in str(e.value) and "entry 0" in str(e.value)


def test_kinds_mix_and_repeat_per_kind(tmp_path):
    gemm = {"M": 64, "N": 256, "K": 256, **TEXT}
    p = _write(tmp_path, [gemm, {**gemm, "kind": "fp8", "scales": ["row"]}])
    s = suite.load_suite(p)  # the same shape as a bf16 GEMM and as fp8: two cases
    assert [e.kind for e in s.entries] == ["gemm", "fp8"] and s.fp8_cases()[0][2] == "row"
    with pytest.raises(ValueError, match="repeats entry 0"):
        suite.load_suite(_write(tmp_path, [gemm, gemm]))
    with pytest.raises(ValueError, match="scales are for fp8 entries"):
        suite.load_suite(_write(tmp_path, [{**gemm, "scales": ["row"]}]))
    with pytest.raises(ValueError, match="kind='int8' must be one of gemm, fp8, grouped"):
        suite.load_suite(_write(tmp_path, [{**gemm, "kind": "int8"}]))


def test_export_requests_hold_every_pick_of_each_scale_kind():
    s = suite.load_suite(FP8_SUITE)
    reqs = suite.export_requests(s, suite.MATMUL, "sm_90a", 132)
    assert {r[0].key for r in reqs} == {"v13@sm_90a"}
    kws = [r[2] for r in reqs]
    from tirx_gemm.op import fp8
    # promoted every stage, or every second one on the deep-K 128 x 128 pick (per tensor, rowwise)
    assert all(k["RUNTIME_M"] and k["RUNTIME_NK"] and k["PROMOTE"] in (4, 8) for k in kws)
    assert any(k["PROMOTE"] == 8 for k in kws)
    for e, dt, mode in s.fp8_cases():  # every call bench --suite makes finds its kernel
        assert fp8.choose_fp8(e.M, mode, False, dt, 132, N=e.N, K=e.K) in kws
    with pytest.raises(ValueError, match="export for sm_90a only.*--arch sm_90a"):
        suite.export_requests(s, suite.MATMUL, "sm_100a", 148)


def test_grouped_entries_reach_suite_builds_lazily(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("tirx_gemm.op.grouped")

    def suite_builds(entry):
        calls.append(entry)
        return [("v13", (128, 256, 256), {"SCALE": "tensor"})]  # any registered step
    fake.suite_builds = suite_builds
    monkeypatch.setitem(sys.modules, "tirx_gemm.op.grouped", fake)
    import tirx_gemm.op as op_pkg
    monkeypatch.setattr(op_pkg, "grouped", fake, raising=False)
    g = {"kind": "grouped", "E": 8, "N": 512, "K": 256, "tokens": [1, 64], **TEXT}
    s = suite.load_suite(_write(tmp_path, [g]))
    assert calls == [] and len(s.grouped()) == 1 and s.cases() == [] == s.fp8_cases()
    reqs = suite.export_requests(s, suite.MATMUL, "sm_90a", 132)
    assert len(calls) == 1 and calls[0]["E"] == 8 and calls[0]["tokens"] == [1, 64]
    assert calls[0]["arch"] == "sm_90a" and calls[0]["sm_count"] == 132
    assert calls[0]["dtypes"] == ["bfloat16"] and calls[0]["kind"] == "grouped"
    assert [(r[0].key, r[1], r[2]) for r in reqs] == [("v13@sm_90a", (128, 256, 256),
                                                       {"SCALE": "tensor"})]


def test_format_table_names_the_scale_and_summarizes_each_kind():
    recs = [{"M": 2048, "N": 4096, "K": 4096, "step": "v13", "verified": True,
             "build_kwargs": {"BLK_M": 128}, "tflops": 900.0, "torch_tflops": 1000.0,
             "ratio_to_torch": r, "ratio_to_torch_tensor": 0.9,
             "suite": {"dtype": "bfloat16", "scale": sc}}
            for sc, r in (("tensor", 0.9), ("block", 1.2))]
    table = suite.format_table(recs, [("1x8x16 bfloat16 row", "time budget spent")])
    assert "bfloat16 e4m3 block" in table and "NOT RUN: time budget spent" in table
    assert "fp8 tensor: geomean x torch._scaled_mm 0.900" in table
    assert "fp8 block: geomean x torch._scaled_mm 1.200" in table
    assert "x torch per tensor at M >= 2048: geomean 0.900 over 1" in table


def test_cli_export_suite_bundles_fp8_entries_with_a_digest(tmp_path):
    p = _write(tmp_path, [{"kind": "fp8", "M": 64, "N": 256, "K": 256, "scales": ["tensor"],
                           "all_m": False, **TEXT}])
    out = tmp_path / "bundle"
    r = subprocess.run([sys.executable, "-m", "tirx_gemm.cli", "export", "--suite", str(p),
                        "--arch", "sm_90a", "--out", str(out), "-q"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "exported 1 kernels for the suite" in r.stdout and "--expect-sha256" in r.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    text = json.dumps(manifest)
    assert "v13" in text and "SCALE" in text
