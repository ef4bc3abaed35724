"""grouped_mm's checks and its bundle on the CPU: what ``tirx-gemm export --suite`` lists for a
grouped entry (every kernel the pick makes at any token count), the fp8 path's
TIRX_GEMM_CHECK=1 checks (routing, finite scales; skipped while a CUDA graph is captured) and
its refusal of autograd on every operand, and the remembered call's key (a bad call of the same
shapes is checked again, never launched). The launches are torch stand-ins."""
import functools
import json
from pathlib import Path

import pytest
import torch

from tirx_gemm.op import grouped as G
from tirx_gemm.op import grouped_fp8 as GF
from tirx_gemm.op import suite

ROOT = Path(__file__).resolve().parent.parent
MOE_SUITE = ROOT / "lab" / "moe_grouped_gemm" / "suites" / "moe_experts.json"
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


# -- the export of a grouped suite entry -------------------------------------------------
def _mixtral_gate_up() -> dict:
    shapes = json.loads(MOE_SUITE.read_text())["shapes"]
    return next(e for e in shapes if e["model"] == "Mixtral-8x7B" and "gate/up" in e["layer"])


def _key(kw: dict) -> tuple:
    return tuple(sorted(kw.items()))


def test_export_of_a_grouped_entry_holds_the_pick_at_every_token_count():
    """The Mixtral gate/up entry lists 1, 16, 128, ... tokens; a bundle made from it must
    still serve 32 and 64 tokens (swap-AB token tiles of 16 and 32), as dense entries serve
    every M. Checked through suite.export_requests (what `tirx-gemm export --suite` builds)
    and grouped.suite_builds; ``"all_m": false`` keeps to the entry's own tokens."""
    entry = _mixtral_gate_up()
    assert 32 not in entry["tokens"] and 64 not in entry["tokens"]
    E, top_k, N, K = entry["E"], entry["top_k"], entry["N"], entry["K"]
    exported = {(mnk[1], mnk[2], _key(kw))
                for _, mnk, kw in suite.export_requests(suite.load_suite(MOE_SUITE), "matmul",
                                                        "sm_90a", 132)}
    own = {_key(kw) for _, _, kw in G.suite_builds({**entry, "all_m": False,
                                                    "sm_count": 132})}
    listed = {_key(kw) for _, _, kw in G.suite_builds({**entry, "sm_count": 132})}
    missing_before = []
    for dtype in ("bfloat16", "float16"):
        for t in (1, 16, 32, 64, 128, 4096):
            step, kw = G.choose_grouped(t * top_k, E, N, K, dtype, "contiguous", "sm_90a", 132)
            assert step == "v14"
            assert (N, K, _key(kw)) in exported, (dtype, t, kw)
            assert _key(kw) in listed, (dtype, t, kw)
            if _key(kw) not in own:
                missing_before.append((dtype, t, kw["BLK_N"]))
    # the opt-out is what the default used to be: it lacks the 32- and 64-token tiles
    assert sorted(missing_before) == [("bfloat16", 32, 16), ("bfloat16", 64, 32),
                                      ("float16", 32, 16), ("float16", 64, 32)]
    assert own < listed


@pytest.mark.parametrize("E,N,top_k,layout,arch", [
    (8, 28672, 2, "contiguous", "sm_90a"), (128, 1536, 8, "contiguous", "sm_90a"),
    (1, 256, 1, "contiguous", "sm_90a"), (8, 4096, 2, "masked", "sm_90a"),
    (4, 128, 1, "contiguous", "sm_90a"), (8, 4096, 2, "contiguous", "sm_100a")])
def test_the_walk_stops_where_the_pick_stops_changing(E, N, top_k, layout, arch):
    """grouped_variants(max_tokens=None) ends where no larger token count picks anything
    new: the same kernels as a walk four times as long."""
    short = G.grouped_variants(E, N, 4096, top_k, "bfloat16", layout, arch, None, None)
    last = short[-1][3]
    long = G.grouped_variants(E, N, 4096, top_k, "bfloat16", layout, arch, None,
                              min(4 * last, 40000))
    assert [kw for _, kw, _, _ in short] == [kw for _, kw, _, _ in long]
    assert short[0][2] == 1 and all(a[3] + 1 == b[2] for a, b in zip(short, short[1:]))


def test_explain_names_swiglu_as_the_op_fuses_it():
    """SWIGLU is listed with the fused epilogues, 'not on swap-AB tiles' exactly where
    grouped_swiglu.swiglu_plan runs it unfused."""
    from tirx_gemm.op import grouped_swiglu as GS
    for rows in (2, 16, 128, 512, 8192, 65536):
        text = G.explain_grouped(rows, 8, 28672, 4096, "bfloat16")
        step, _ = GS.swiglu_plan(rows, 8, 28672, 4096, "bfloat16", "contiguous", "sm_90a",
                                 None, "halves")
        assert "BIAS, ROW_SCALE, SWIGLU (grouped_swiglu.swiglu_mm" in text
        assert ("not on swap-AB tiles" in text) is (step is None), rows


# -- the fp8 path: TIRX_GEMM_CHECK=1, autograd ---------------------------------------------
def _fp8_operands(rows=(10, 0, 15, 15), N=136, K=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    E = len(rows)
    qa, sa = GF.quantize_rows(torch.randn(sum(rows), K, generator=g))
    qw, sw = GF.quantize_experts(torch.randn(E, N, K, generator=g) / K ** 0.5)
    offs = torch.tensor(rows, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return qa, sa, qw, sw, offs


@pytest.fixture
def fp8_launch(monkeypatch):
    """grouped_mm's fp8 plumbing on CPU: the device checks off, the launch recorded."""
    launches = []
    monkeypatch.setattr(GF, "check_grouped_fp8",
                        functools.partial(GF.check_grouped_fp8, require_cuda=False))
    monkeypatch.setattr(GF, "_gpu", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(GF, "_load", lambda step, arch, N, K, kw: (
        lambda *ops: launches.append(ops), "v14 fp8 stand-in"))
    return launches


@pytest.fixture
def check_on(monkeypatch):
    monkeypatch.setenv(G.CHECK_ENV, "1")
    assert G._checking()


def _one_line(exc_type, match, fn, *args, **kw):
    with pytest.raises(exc_type, match=match) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)


def test_fp8_routing_and_scales_checked_with_the_setting(fp8_launch, check_on):
    qa, sa, qw, sw, offs = _fp8_operands()
    w = qw.transpose(1, 2)
    G.grouped_mm(qa, w, offs, scale_a=sa, scale_b=sw)  # a valid call launches
    assert len(fp8_launch) == 1
    bad_offs = torch.tensor([10, 25, 20, 40], dtype=torch.int32)
    _one_line(ValueError, r"offs decreases at expert 2 \(offs\[1\]=25 > offs\[2\]=20\)",
              G.grouped_mm, qa, w, bad_offs, scale_a=sa, scale_b=sw)
    _one_line(ValueError, r"offs\[-1\]=41 is past a's 40 rows", G.grouped_mm, qa, w,
              torch.tensor([10, 10, 25, 41], dtype=torch.int32), scale_a=sa, scale_b=sw)
    nan_a = sa.clone()
    nan_a[3, 1] = float("nan")
    _one_line(ValueError, r"scale_a holds nan at flat index 7: scales must be finite and > 0",
              G.grouped_mm, qa, w, offs, scale_a=nan_a, scale_b=sw)
    zero_b = sw.clone()
    zero_b[1, 0, 0] = 0.0
    _one_line(ValueError, r"scale_b holds 0.0 at flat index 4", G.grouped_mm, qa, w, offs,
              scale_a=sa, scale_b=zero_b)
    assert len(fp8_launch) == 1  # none of the bad calls launched


def test_fp8_masked_counts_checked_with_the_setting(fp8_launch, check_on):
    qa, sa, qw, sw, _ = _fp8_operands(rows=(12, 12, 12, 12))
    E, T = 4, 12
    qa, sa = qa.reshape(E, T, -1), sa.reshape(E, T, -1)
    _one_line(ValueError, r"counts\[2\]=13 is outside 0..12", G.grouped_mm, qa, qw,
              counts=torch.tensor([1, 0, 13, 2], dtype=torch.int32), scale_a=sa, scale_b=sw)
    assert fp8_launch == []
    G.grouped_mm(qa, qw, counts=torch.tensor([1, 0, 12, 2], dtype=torch.int32), scale_a=sa,
                 scale_b=sw)
    assert len(fp8_launch) == 1


def test_fp8_data_checks_off_without_the_setting_and_under_capture(fp8_launch, monkeypatch):
    """Off by default (they sync); with the setting on, skipped while a CUDA graph is being
    captured (the bf16 path's rule): the bad routing reaches the launch then."""
    qa, sa, qw, sw, _ = _fp8_operands()
    bad = torch.tensor([10, 25, 20, 40], dtype=torch.int32)
    monkeypatch.delenv(G.CHECK_ENV, raising=False)
    G.grouped_mm(qa, qw.transpose(1, 2), bad, scale_a=sa, scale_b=sw)
    assert len(fp8_launch) == 1
    monkeypatch.setenv(G.CHECK_ENV, "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    G.grouped_mm(qa, qw.transpose(1, 2), bad, scale_a=sa, scale_b=sw)
    assert len(fp8_launch) == 2


def test_fp8_data_check_function_on_cpu_tensors():
    """check_fp8_data, what the setting adds, run directly on CPU tensors."""
    qa, sa, qw, sw, offs = _fp8_operands()
    GF.check_fp8_data("contiguous", 40, 136, 256, 4, offs, None, sa, sw)
    _one_line(ValueError, r"offs\[0\]=-1 is negative", GF.check_fp8_data, "contiguous", 40,
              136, 256, 4, torch.tensor([-1, 0, 25, 40], dtype=torch.int32), None, sa, sw)
    _one_line(ValueError, r"scale_a holds -\d", GF.check_fp8_data, "contiguous", 40, 136, 256,
              4, offs, None, -sa, sw)
    _one_line(ValueError, r"counts\[0\]=5 is outside 0..4", GF.check_fp8_data, "masked", 4,
              136, 256, 4, None, torch.tensor([5, 0, 0, 0], dtype=torch.int32), sa, sw)
    assert G.check_routing is GF.check_routing  # one routing check for bf16 and fp8


@pytest.mark.parametrize("name", ["a", "b", "scale_a", "scale_b"])
def test_fp8_refuses_autograd_on_every_operand(name, fp8_launch):
    qa, sa, qw, sw, offs = _fp8_operands()
    ops = {"a": qa, "b": qw.transpose(1, 2), "scale_a": sa, "scale_b": sw}
    ops[name] = ops[name].detach().requires_grad_(True)
    _one_line(ValueError, rf"^{name} requires grad but fp8 grouped_mm has no backward: .*"
              rf"torch.no_grad\(\) or pass {name}.detach\(\)", G.grouped_mm, ops["a"], ops["b"],
              offs, scale_a=ops["scale_a"], scale_b=ops["scale_b"])
    assert fp8_launch == []
    with torch.no_grad():
        G.grouped_mm(ops["a"], ops["b"], offs, scale_a=ops["scale_a"], scale_b=ops["scale_b"])
    assert len(fp8_launch) == 1


# -- the remembered call's key -------------------------------------------------------------
def _bf16_operands():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(10, 32, generator=g).to(BF16)
    w = (torch.randn(4, 16, 32, generator=g) / 6).to(BF16)
    offs = torch.tensor([3, 3, 8, 10], dtype=torch.int32)
    return a, w, offs


def _call_key(layout=None, out_dtype=None, grad=True, a=None, b=None, offs=None, counts=None,
              bias=None, scale=None, out=None):
    return G.call_key(layout, out_dtype, grad, a, b, offs, counts, bias, scale, out)


class _OnDevice:
    """A tensor as if on CUDA device ``index`` (its get_device()), for the key alone: the key
    reads the device index, which tells CUDA devices apart and each from the CPU (-1); calls
    are remembered only for CUDA operands."""

    def __init__(self, t, index):
        self._t, self._index = t, index

    def get_device(self):
        return self._index

    def __getattr__(self, name):
        return getattr(self._t, name)


def test_the_key_holds_what_decides_a_calls_validity():
    a, w, offs = _bf16_operands()
    bias, scale = torch.zeros(4, 16, dtype=BF16), torch.ones(10)
    base = dict(a=a, b=w.transpose(1, 2), offs=offs, bias=bias, scale=scale,
                out=torch.empty(10, 16, dtype=BF16))
    key = _call_key(**base)
    assert key == _call_key(**{**base, "a": a.clone(), "offs": offs.clone()})  # data aside
    changed = {
        "offs dtype": {"offs": offs.long()}, "offs device": {"offs": _OnDevice(offs, 1)},
        "offs strides": {"offs": torch.zeros(8, dtype=torch.int32)[::2]},
        "b dtype": {"b": w.transpose(1, 2).half()}, "b device": {"b": _OnDevice(w.transpose(1, 2), 1)},
        "b strides": {"b": w.transpose(1, 2).contiguous()},
        "bias dtype": {"bias": bias.float()}, "bias device": {"bias": _OnDevice(bias, 0)},
        "scale dtype": {"scale": scale.double()}, "scale device": {"scale": _OnDevice(scale, 0)},
        "out dtype": {"out": torch.empty(10, 16)}, "no out": {"out": None},
        "bias grad": {"bias": bias.clone().requires_grad_(True)},
        "counts given": {"counts": offs},
    }
    for what, change in changed.items():
        assert _call_key(**{**base, **change}) != key, what
    # a tensor that needs a gradient counts only while autograd records
    grad_bias = {**base, "bias": bias.clone().requires_grad_(True)}
    assert _call_key(grad=False, **grad_bias) == _call_key(grad=False, **base)


@pytest.fixture
def remembered(monkeypatch):
    """A good call's kernel remembered under its key, as grouped_mm does on a GPU (CPU calls
    are not remembered): the launch a torch stand-in, check_grouped counted."""
    a, w, offs = _bf16_operands()
    launches, checks = [], []

    def kernel(A, B, D, index, *extra):
        launches.append(index.dtype)
        start = 0
        for e, end in enumerate(index.tolist()):
            D[start:end] = (A[start:end].float() @ B[e].float().T).to(D.dtype)
            start = end

    original = G.check_grouped

    def check(*args, **kw):
        checks.append(1)
        return original(*args, require_cuda=False, **kw)
    monkeypatch.setattr(G, "check_grouped", check)
    G.clear_cache()
    p = original(a, w, offs, require_cuda=False)
    G._calls[_call_key(a=a, b=w, offs=offs, grad=torch.is_grad_enabled())] = (
        kernel, p, "v14 stand-in", {}, ())
    yield a, w, offs, launches, checks
    G.clear_cache()


def test_a_bad_call_of_the_same_shapes_is_checked_again(remembered):
    a, w, offs, launches, checks = remembered
    out = G.grouped_mm(a, w, offs)  # the remembered call: no check, one launch
    assert (len(checks), launches) == (0, [torch.int32])
    want = torch.cat([a[0:3].float() @ w[0].float().T, a[3:8].float() @ w[2].float().T,
                      a[8:10].float() @ w[3].float().T])
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    for kw, err, match in (
            ({"offs": offs.long()}, TypeError, "offs is torch.int64"),
            ({"offs": offs, "bias": torch.zeros(4, 16, dtype=BF16).requires_grad_(True)},
             ValueError, "grouped_mm has no backward"),
            ({"offs": offs, "out": torch.empty(10, 16)}, ValueError, "out is"),
            ({"offs": offs, "scale": torch.ones(10, dtype=torch.float64)}, TypeError,
             "scale has dtype torch.float64")):
        _one_line(err, match, G.grouped_mm, a, w, **kw)
    assert launches == [torch.int32] and len(checks) == 4
    _one_line(TypeError, "a is torch.bfloat16 but b is torch.float16", G.grouped_mm, a,
              w.half(), offs)
    assert launches == [torch.int32]
