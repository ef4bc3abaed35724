"""PDL by call site (tirx_gemm/op/launch_site.py): which kernels have a twin, which one a
call launches in each mode, and that a suite's bundle carries the twins."""

import pytest

from tirx_gemm.op import launch_site

DECODE = {"BLK_M": 64, "BLK_N": 16, "SWAP_AB": True, "PDL": True, "RUNTIME_M": True,
          "dtype": "bfloat16", "SM_COUNT": 132}


def test_a_start_trigger_kernel_has_a_twin_without_the_attribute():
    assert launch_site.twin_kwargs("v12", DECODE) == {**DECODE, "PDL_ATTR": False}


@pytest.mark.parametrize("step, kw", [
    ("v12", {**DECODE, "PDL": False}),
    ("v12", {**DECODE, "PDL_TRIGGER": "exit"}),
    ("v12", {**DECODE, "CLUSTER": 2}),
    ("v12", {**DECODE, "PDL_ATTR": False}),
    ("v9", {"PDL": True}),
])
def test_other_kernels_have_none(step, kw):
    assert launch_site.twin_kwargs(step, kw) is None


class _T:
    def __init__(self, ptr, version=0):
        self.ptr, self._version = ptr, version

    def data_ptr(self):
        return self.ptr


class _C:
    kernel, lone = "pick", "twin"


@pytest.fixture
def mode():
    old = launch_site.MODE
    launch_site._last[:] = [0, -1, 0]
    yield lambda m: setattr(launch_site, "MODE", m)
    launch_site.MODE = old


def test_site_keeps_the_attribute_only_after_one_of_ours(mode):
    mode("site")
    x, q, k, h = _T(0x1000), _T(0x2000), _T(0x3000), _T(0x4000)
    assert launch_site.kernel(_C, x, q) == "twin"   # after a norm: not ours
    assert launch_site.kernel(_C, x, k) == "pick"   # k of the same hidden state
    assert launch_site.kernel(_C, k, h) == "pick"   # reads what the last launch wrote
    assert launch_site.kernel(_C, x, q) == "twin"   # x is not what the last launch read
    x._version += 1                                 # x written in place since
    assert launch_site.kernel(_C, x, k) == "twin"


class _Inference(_T):  # torch.inference_mode's tensors keep no version counter
    @property
    def _version(self):
        raise RuntimeError("Inference tensors do not track version counter.")

    @_version.setter
    def _version(self, value):
        pass


def test_an_inference_tensor_is_judged_by_its_pointer(mode):
    mode("site")
    x = _Inference(0x1000)
    assert [launch_site.kernel(_C, x, _T(a)) for a in (0x2000, 0x3000)] == ["twin", "pick"]


@pytest.mark.parametrize("m, want", [("always", "pick"), ("never", "twin")])
def test_the_other_modes_ignore_the_site(mode, m, want):
    mode(m)
    x = _T(0x1000)
    assert [launch_site.kernel(_C, x, _T(0x2000)) for _ in range(2)] == [want, want]


def test_set_mode_refuses_an_unknown_mode_and_drops_the_calls(mode):
    from tirx_gemm.op import matmul
    with pytest.raises(ValueError, match="one of site, always, never"):
        launch_site.set_mode("sometimes")
    matmul._calls["sentinel"] = object()
    launch_site.set_mode("site")
    assert "sentinel" not in matmul._calls


def test_a_suite_export_carries_each_twin_when_asked(tmp_path):
    import json
    from tirx_gemm.cli.export import suite_requests
    suite = {"name": "t", "description": "decode", "dtypes": ["bfloat16"],
             "shapes": [{"M": 1, "N": 2048, "K": 2048, "model": "m", "layer": "q", "why": "w",
                         "all_m": False}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(suite))
    assert not any(kw.get("PDL_ATTR") is False  # twins only when asked (--pdl-twins)
                   for _, _, kw in suite_requests(str(path), "matmul", "sm_90a", 132, ("h100",)))
    reqs = suite_requests(str(path), "matmul", "sm_90a", 132, ("h100",), twins=True)
    kws = [kw for _, _, kw in reqs]
    picks = [kw for kw in kws if kw.get("PDL_ATTR", True)]
    with_twin = [kw for kw in picks if launch_site.twin_kwargs("v12", kw)]
    assert with_twin, "the decode pick of 1x2048x2048 takes PDL's start trigger"
    for kw in with_twin:
        assert {**kw, "PDL_ATTR": False} in kws


def test_v12_without_the_attribute_keeps_its_trigger():
    pytest.importorskip("tvm")
    from tirx_gemm import registry
    st = registry.get("v12", "sm_90a")
    kw = dict(DECODE, PIPE_DEPTH=8)
    with_attr = st.build_primfunc(128, 256, 256, **kw)
    without = st.build_primfunc(128, 256, 256, **dict(kw, PDL_ATTR=False))
    from tirx_gemm.pdl import PDL_TAG
    assert PDL_TAG in [str(t) for t in with_attr.attrs["tirx.kernel_launch_params"]]
    assert without.attrs.get("tirx.kernel_launch_params") is None
    assert "launch_dependents" in without.script()
    with pytest.raises(ValueError, match="PDL_ATTR=False"):
        st.build_primfunc(128, 256, 256, **dict(kw, PDL=False, PDL_ATTR=False))


def test_the_study_quotes_its_records_and_its_verdict():
    """lab/pdl_launch_site/README.md: the rule's figures as decode_stack.py --verdict computes
    them from the records, and the verdict (fail: MODE stays "always")."""
    import json
    import math
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    recs = [json.loads(x) for x in
            (root / "lab/pdl_launch_site/records/decode_stack_h100.jsonl").read_text().splitlines()]
    text = " ".join((root / "lab/pdl_launch_site/README.md").read_text().split())
    for cls in ("suite", "held_out"):
        g = [r["us"]["always"] / r["us"]["site"] for r in recs if r["class"] == cls]
        gm = math.exp(sum(map(math.log, g)) / len(g))
        assert f"{gm:.3f} (lowest {min(g):.3f}" in text, (cls, gm, min(g))
        assert gm < 1.01 or min(g) < 0.995  # the rule fails in each class
    slowest = sum(r["us"]["never"] >= max(r["us"]["always"], r["us"]["site"]) for r in recs)
    assert f"slowest arm at {slowest} of {len(recs)} cases" in text
    assert launch_site.MODE == "always" and re.search(r"Decision: Not adopted", text)
