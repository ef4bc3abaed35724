"""What ``tirx-gemm export --suite`` puts in a bundle for a grouped entry's fused epilogues
(``"epilogues"``) and fp8 operands (``"fp8": true``), on the CPU, no build: exactly the kernels
the op's choosers look up at every token count (grouped.fused_call over choose_grouped with
grouped_epilogue.fused_keywords, swiglu_plan, grouped_fp8.choose_grouped_fp8), each bad value
refused in one line naming the entry, and the op's warning, once per kernel, when a fused call
runs unfused for want of its kernel (the launches are torch stand-ins)."""
import contextlib
import functools
import json
import warnings
from pathlib import Path

import pytest
import torch

from tirx_gemm.op import grouped as G
from tirx_gemm.op import grouped_epilogue as GE
from tirx_gemm.op import grouped_fp8 as GF
from tirx_gemm.op import grouped_kernels as GK
from tirx_gemm.op import grouped_swiglu as GS
from tirx_gemm.op import suite
from test_grouped_op import _Calls, _fake_kernel, _operands, _reference  # tests/ on sys.path

ROOT = Path(__file__).resolve().parent.parent
MOE_SUITE = ROOT / "lab" / "moe_grouped_gemm" / "suites" / "moe_experts.json"
BF16 = torch.bfloat16
MAX_TOKENS = 16384  # the Mixtral entries' last token count


def _entry(layer: str, **extra) -> dict:
    shapes = json.loads(MOE_SUITE.read_text())["shapes"]
    e = next(s for s in shapes if s["model"] == "Mixtral-8x7B" and layer in s["layer"])
    return {**e, "dtypes": ["bfloat16", "float16"], "sm_count": 132, **extra}


def _key(kw: dict) -> tuple:
    return tuple(sorted(kw.items()))


def _listed(entry: dict) -> set:
    builds = G.suite_builds(entry)
    assert all(s == "v14" and mnk[1:] == (entry["N"], entry["K"]) for s, mnk, _ in builds)
    keys = [_key(kw) for _, _, kw in builds]
    assert len(keys) == len(set(keys))  # each once
    return set(keys)


def _like(dtype):
    """An operand of ``dtype`` as grouped_mm's epilogue check reads it (its dtype only)."""
    return torch.empty(0, dtype=dtype, device="meta")


# -- the listing: exactly what the op looks up ----------------------------------------------
def test_fused_epilogues_list_exactly_the_ops_lookups_at_every_token_count():
    """Mixtral's down projection with a row scale (Experts' routing weights) and with bias and
    scale, its gate/up with SwiGLU ("halves"): the listed kernels are the plain picks plus,
    for each call, the kernel the op asks for at 1 .. 16384 tokens (grouped_mm: the pick and
    fused_keywords of real bias / scale operands; grouped_swiglu: swiglu_plan) -- no more."""
    down = _entry("down", epilogues=[{"ROW_SCALE": True}, {"ROW_SCALE": True, "BIAS": True}])
    gate_up = _entry("gate/up", epilogues=[{"SWIGLU": "halves"}])
    for entry in (down, gate_up):
        E, k, N, K = entry["E"], entry["top_k"], entry["N"], entry["K"]
        want = set()
        for name, dtype in (("bfloat16", BF16), ("float16", torch.float16)):
            for t in range(1, MAX_TOKENS + 1):
                step, kw = G.choose_grouped(t * k, E, N, K, name, "contiguous", "sm_90a", 132)
                want.add(_key(kw))
                if entry is down:
                    for bias in (None, _like(dtype)):
                        fused = GE.fused_keywords("sm_90a", name, bias, _like(torch.float32))
                        want.add(_key({**kw, **fused}))
                else:
                    s, sk = GS.swiglu_plan(t * k, E, N, K, name, "contiguous", "sm_90a", 132,
                                           "halves")
                    if s is not None:
                        want.add(_key(sk))
        assert _listed(entry) == want
    # what the fused calls add: down, 2 epilogues x every tile x 2 dtypes; SwiGLU, the wide
    # tile only (swap-AB decode tiles run unfused), without TMA_STORE
    plain_down = _listed({**down, "epilogues": []})
    assert len(_listed(down)) == 3 * len(plain_down)
    fused_gu = _listed(gate_up) - _listed({**gate_up, "epilogues": []})
    assert {dict(k)["SWIGLU"] for k in fused_gu} == {"halves"} and len(fused_gu) == 2
    assert all(dict(k)["BLK_N"] == G.WIDE_TILE[1] and "TMA_STORE" not in dict(k)
               for k in fused_gu)


def test_swap_fused_switch_has_one_home_the_listing_reads():
    """grouped_epilogue.SWAP_FUSED, the switch swiglu_plan reads: with it on, a "halves"
    entry lists the swap-AB decode tiles' fused kernels too (what swiglu_mm then asks for);
    "interleaved" stays unfused at decode."""
    entry = _entry("gate/up", dtypes=["bfloat16"], epilogues=[{"SWIGLU": "halves"}])
    off = _listed(entry)
    before = GE.SWAP_FUSED
    try:
        GE.SWAP_FUSED = True
        on = _listed(entry)
        inter = _listed({**entry, "epilogues": [{"SWIGLU": "interleaved"}]})
    finally:
        GE.SWAP_FUSED = before
    swap = {k for k in on - off if dict(k).get("SWAP_AB")}
    assert swap and all(dict(k)["SWIGLU"] == "halves" for k in swap)
    assert not any(dict(k).get("SWAP_AB") and "SWIGLU" in dict(k) for k in inter)


def test_fp8_entry_lists_exactly_the_fp8_picks():
    """``"fp8": true``: the FP8_BLOCK kernels choose_grouped_fp8 picks at every token count
    (dtypes: the output dtypes), contiguous and masked; no 16-bit kernel."""
    for layout, last in (("contiguous", MAX_TOKENS), ("masked", 300)):
        entry = _entry("gate/up", fp8=True, layout=layout)
        E, k, N, K = entry["E"], entry["top_k"], entry["N"], entry["K"]
        want = set()
        for odt in ("bfloat16", "float16"):
            for t in range(1, last + 1):
                rows = t * k if layout == "contiguous" else E * t
                want.add(_key(GF.choose_grouped_fp8(rows, E, N, K, odt, 132, layout=layout)[1]))
        listed = _listed(entry)
        assert listed == want and len(listed) == 4  # BLK_M 64 and 128, two out dtypes
        assert all(dict(kw)["FP8_BLOCK"] is True for kw in listed)
    assert GF.fp8_token_counts(8, 2) == [1, GF.DECODE_TOKENS * 8 // 2 + 1]


def test_fp8_calls_look_up_listed_kernels(monkeypatch):
    """fp8 grouped_mm at decode and past it asks for kernels an ``"fp8": true`` entry of its
    layer lists (the launch a stand-in, the loads recorded)."""
    monkeypatch.setattr(GF, "_gpu", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(GF, "check_grouped_fp8",
                        functools.partial(GF.check_grouped_fp8, require_cuda=False))
    loads = []
    monkeypatch.setattr(GF, "_load", lambda step, arch, N, K, kw: (
        loads.append(kw) or (lambda *ops: None), "v14 fp8 stand-in"))
    g = torch.Generator().manual_seed(0)
    qw, sw = GF.quantize_experts(torch.randn(4, 200, 384, generator=g))
    for rows in (45, 280):  # ~11 and 70 tokens per expert: BLK_M 64, then 128
        qa, sa = GF.quantize_rows(torch.randn(rows, 384, generator=g))
        offs = torch.tensor([rows // 4, rows // 2, rows // 2, rows], dtype=torch.int32)
        G.grouped_mm(qa, qw.transpose(1, 2), offs, scale_a=sa, scale_b=sw)
    entry = {"kind": "grouped", "E": 4, "N": 200, "K": 384, "tokens": [1], "fp8": True,
             "dtypes": ["bfloat16"], "sm_count": 132}
    assert [kw["BLK_M"] for kw in loads] == [64, 128]
    assert {_key(kw) for kw in loads} == _listed(entry)


def test_export_requests_carry_the_new_keys(tmp_path):
    """Through suite.load_suite and export_requests (what `tirx-gemm export --suite` builds):
    the fused and fp8 kernels of grouped entries reach the bundle's requests."""
    down = _entry("down", dtypes=["bfloat16"], epilogues=[{"ROW_SCALE": True}])
    fp8 = _entry("gate/up", dtypes=["bfloat16"], fp8=True)
    for e in (down, fp8):
        e.pop("sm_count")
    path = tmp_path / "moe.json"
    path.write_text(json.dumps({"name": "moe", "shapes": [down, fp8]}))
    reqs = suite.export_requests(suite.load_suite(path), "matmul", "sm_90a", 132)
    got = {(mnk[1], mnk[2], _key(kw)) for _, mnk, kw in reqs}
    for e in (down, fp8):
        assert {(e["N"], e["K"], k) for k in _listed({**e, "sm_count": 132})} <= got
    assert any("ROW_SCALE" in dict(k) for _, _, k in got)
    assert any("FP8_BLOCK" in dict(k) for _, _, k in got)


@pytest.mark.parametrize("bad,match", [
    ({"epilogues": ["ROW_SCALE"]}, r"epilogues\[0\]: 'ROW_SCALE' is none of"),
    ({"epilogues": [{"SWIGLU": "rows"}]}, r"epilogues\[0\]: .* is none of"),
    ({"epilogues": [{"BIAS": "bfloat16"}]}, r"epilogues\[0\]: .* is none of"),
    ({"epilogues": [{"SWIGLU": "halves", "BIAS": True}]}, r"epilogues\[0\]: .* is none of"),
    ({"epilogues": {"BIAS": True}}, "epilogues=.* must be a list of objects"),
    ({"epilogues": [{"BIAS": True}, {"BIAS": True}]}, r"epilogues\[1\] repeats an earlier"),
    ({"N": 4104, "epilogues": [{"SWIGLU": "halves"}]}, "4104 rows per expert: 2I"),
    ({"fp8": "yes"}, "fp8='yes' must be true or false"),
    ({"fp8": True, "epilogues": [{"ROW_SCALE": True}]}, "an fp8 entry has no epilogues"),
    ({"fp8": True, "arch": "sm_100a"}, "fp8 grouped_mm runs on sm_90a only"),
    ({"fp8": True, "K": 4160}, "K=4160"),
    ({"dtypes": ["float8_e4m3fn"]}, r'fp8 operands: "fp8": true'),
])
def test_bad_values_refused_in_one_line_naming_the_entry(bad, match):
    with pytest.raises(ValueError, match=match) as info:
        G.suite_builds(_entry("down", **bad))
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("grouped entry Mixtral-8x7B expert down projection")


# -- the op's warning when a fused call runs unfused ----------------------------------------
@pytest.fixture
def no_fused_kernel(monkeypatch):
    """grouped_mm on CPU tensors with a stand-in loader that has every plain kernel and no
    fused one (a CLI bundle without them, no TVM to build them); the loads recorded."""
    monkeypatch.setattr(G, "check_grouped", functools.partial(G.check_grouped,
                                                              require_cuda=False))
    monkeypatch.setattr(G, "_gpu", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(GE, "ENABLED", True)
    loads = []

    def load(step_id, arch, N, K, kwargs):
        loads.append(dict(kwargs))
        if set(kwargs) & {"ROW_SCALE", "BIAS", "SWIGLU"}:
            raise ValueError(f"no kernel for {step_id} with {kwargs} in bundle B")
        return _fake_kernel(_Calls(), kwargs), "v14 stand-in"
    monkeypatch.setattr(G, "_load", load)
    G.clear_cache()
    GS._calls.clear()
    yield loads
    G.clear_cache()
    GS._calls.clear()


@contextlib.contextmanager
def _caught():
    """The warnings issued inside, every one (the once is the op's, not the filter's)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        yield got


def test_missing_fused_kernel_warns_once_per_kernel_naming_its_suite_key(no_fused_kernel):
    """A scale (then a bias and scale) the bundle has no fused kernel for: the result is the
    unfused one, and one warning per kernel, on one line, names the kernel's keywords and the
    suite entry that exports it -- which suite_builds indeed turns into that kernel."""
    a, w, offs = _operands()
    ref = _reference(a, w.transpose(1, 2), offs)
    scale = torch.rand(10)
    with _caught() as got:
        for _ in range(3):
            out = G.grouped_mm(a, w, offs, scale=scale)
            G._calls.clear()  # a new call each time: the load is asked again
        bias = torch.randn(4, 16).to(BF16)
        G.grouped_mm(a, w, offs, bias=bias, scale=scale)
        G._calls.clear()
        G.grouped_mm(a, w, offs, bias=bias, scale=scale)
    torch.testing.assert_close(out.float(), ref * scale[:, None], atol=3e-2, rtol=3e-2)
    fused = [kw for kw in no_fused_kernel if "ROW_SCALE" in kw]
    assert len(fused) == 5  # asked at every new call ...
    msgs = [str(w.message) for w in got]
    assert len(msgs) == 2  # ... said once per kernel
    for msg, epi in zip(msgs, ({"ROW_SCALE": True}, {"ROW_SCALE": True, "BIAS": True})):
        assert "\n" not in msg and "running the plain kernel, then torch ops" in msg
        assert "tirx-gemm export --suite" in msg
        kw = next(k for k in fused if set(epi) == set(k) & {"ROW_SCALE", "BIAS"})
        assert str(kw) in msg
        entry = json.loads(msg[msg.index("suite entry ") + 12:msg.index("} (") + 1])
        assert entry["epilogues"] == [epi]
        listed = G.suite_builds({**entry, "tokens": [3], "all_m": False, "sm_count": 132})
        assert [b[2] for b in listed if set(epi) <= set(b[2])] == [kw]


def test_missing_swiglu_kernel_warns_once_and_runs_unfused(no_fused_kernel):
    """grouped_swiglu past decode (a wide tile: the fused launch) without its kernel: the
    unfused result (grouped_mm, then SwiGLU with torch ops) and one warning naming SWIGLU."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(300, 32, generator=g).to(BF16)
    w = (torch.randn(2, 32, 32, generator=g) / 32 ** 0.5).to(BF16)  # gate rows, then up
    offs = torch.tensor([100, 300], dtype=torch.int32)
    outs = []
    with _caught() as got:
        for _ in range(2):
            outs.append(GS.swiglu_mm(a, w.transpose(1, 2), offs, gate_up="halves"))
            GS._calls.clear()
    h = _reference(a, w.transpose(1, 2), offs)
    gate, up = h.chunk(2, dim=-1)
    for out in outs:
        torch.testing.assert_close(out.float(), torch.nn.functional.silu(gate) * up,
                                   atol=3e-2, rtol=3e-2)
    assert sum("SWIGLU" in kw for kw in no_fused_kernel) == 2
    assert len(got) == 1 and '"epilogues": [{"SWIGLU": "halves"}]' in str(got[0].message)


def test_no_warning_when_the_fused_kernel_is_had_or_fusing_is_off(no_fused_kernel,
                                                                    monkeypatch):
    """The warning is the fallback's alone: a loader that has the fused kernel, or the fused
    epilogues turned off, warns nothing."""
    a, w, offs = _operands()
    monkeypatch.setattr(G, "_load", lambda s, arch, N, K, kw: (_fake_kernel(_Calls(), kw), "ok"))
    with _caught() as got:
        G.grouped_mm(a, w, offs, scale=torch.rand(10))
        G._calls.clear()
        monkeypatch.setattr(GE, "ENABLED", False)
        G.grouped_mm(a, w, offs, scale=torch.rand(10))
    assert got == [] and GK._warned == set()
