"""The bias gradient beside wgrad (tirx_gemm.op.wgrad_dbias, v15's WGRAD_DBIAS) on the CPU: the
backward's wiring with a CPU stand-in of the kernel (saved-z path, a plain Linear, where it
does not apply), the compiled step's node, and (with TVM and nvcc here) the builds. The GPU
comparison with torch's gradients: tests/test_gpu_autograd.py (test_wgrad_dbias_grads).
"""
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from test_autograd_act_grad import _close  # tests/ is on sys.path under pytest
from tirx_gemm.op import act_save as AS
from tirx_gemm.op import autograd as AG
from tirx_gemm.op import wgrad_dbias as WD

HAVE_TVM = importlib.util.find_spec("tvm") is not None
RAN: list = []     # the stand-in's calls: (M, N, K, dtype)
LAYOUT: list = []  # v15's plain layout GEMMs (a_mn, b_mn)


def _act(z, act):
    return z if act is None else {"gelu": F.gelu, "silu": F.silu}[act](z)


def _ref_matmul(a, b, step=None, bias=None, activation=None, out_dtype=None):
    z = a.float() @ b.float().T + (0 if bias is None else bias.float())
    return _act(z, activation).to(out_dtype or a.dtype)


def _layout(a_store, a_mn, b_store, b_mn, tune=None):
    LAYOUT.append((a_mn, b_mn))
    a = a_store.float().T if a_mn else a_store.float()
    b = b_store.float().T if b_mn else b_store.float()
    return (a @ b.T).to(a_store.dtype)


def _kernel(dtype, N, K, M, device):
    """The kernel's CPU stand-in, as the GPU kernel takes its operands: dz (M x N) and a
    (M x K) as stored, db (N x K) in their dtype, dbias fp32 (N,) = dz's column sums."""
    def run(dz, a, db, dbias):
        assert dz.shape == (M, N) and a.shape == (M, K) and db.shape == (N, K)
        assert db.dtype == dz.dtype == dtype and dbias.dtype == torch.float32
        RAN.append((M, N, K, dtype))
        db.copy_(dz.float().T @ a.float())
        dbias.copy_(dz.float().sum(0))
    return run


def _save_kernel(dtype, M, N, K, act, bias, device):
    def run(a, b, y, z, *bias_words):
        acc = a.float() @ b.float().T + (bias_words[0].view(dtype).float() if bias else 0)
        z.copy_(acc)
        y.copy_(_act(acc, act))
    return run


@pytest.fixture
def stand_in(monkeypatch):
    """The matmul op's CPU reference, the GPU said to be sm_90a, v15's layout GEMMs and the
    save and wgrad_dbias kernels by CPU stand-ins, wgrad_dbias on."""
    RAN.clear()
    LAYOUT.clear()
    lib = torch.library.Library("tirx_gemm", "IMPL")
    lib.impl("matmul", _ref_matmul, "CPU")
    lib.impl("act_save_mm", AS._run, "CPU")
    monkeypatch.setattr(AG, "_arch", lambda device: "sm_90a")
    monkeypatch.setattr(AG, "_gemm_layout", _layout)
    monkeypatch.setattr(AS, "kernel", _save_kernel)
    monkeypatch.setattr(WD, "kernel", _kernel)
    monkeypatch.setattr(WD, "ENABLED", True)
    try:
        yield
    finally:
        lib._destroy()



def _step(M, act, dtype=torch.bfloat16, N=24, K=16, seed=3, main_grad=False):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(N, generator=g).to(dtype).requires_grad_()
    if main_grad:
        b.main_grad = torch.ones(N)
    dy = torch.randn(M, N, generator=g).to(dtype)
    AG.matmul(a, w, b, act).backward(dy)
    ref = [t.detach().float().requires_grad_() for t in (a, w, b)]
    _act(F.linear(*ref), act).backward(dy.float())
    return (a, w, b), ref


@pytest.mark.parametrize("act", (None, "gelu", "silu"))
@pytest.mark.parametrize("M", (1, 40, 333))
def test_bias_gradient_from_wgrad_kernel(stand_in, act, M):
    """On: the backward's wgrad is the kernel with the bias gradient (once), on the saved-z
    path (gelu, silu) and a Linear with no activation; every gradient as torch's; dgrad stays
    v15's plain NT GEMM."""
    (a, w, b), ref = _step(M, act)
    assert RAN == [(M, 24, 16, torch.bfloat16)] and LAYOUT == [(False, True)]
    for name, o, r in zip(("input", "weight", "bias"), (a, w, b), ref):
        _close(o.grad, r.grad)
    assert b.grad.dtype == torch.bfloat16


def test_bias_gradient_is_the_kernels(stand_in, monkeypatch):
    """The bias gradient is the kernel's dbias output, not a sum taken by the backward."""
    def marked(dtype, N, K, M, device):
        inner = _kernel(dtype, N, K, M, device)

        def run(dz, a, db, dbias):
            inner(dz, a, db, dbias)
            dbias.fill_(7.0)
        return run
    monkeypatch.setattr(WD, "kernel", marked)
    (_, _, b), _ = _step(40, "gelu")
    assert bool((b.grad == 7.0).all())


@pytest.mark.parametrize("why", ("off", "no bias grad", "weight main_grad", "not sm_90a",
                                 "copies", "K fixed", "over the bound"))
def test_not_taken(stand_in, monkeypatch, why):
    """Off, a frozen bias, a weight with main_grad (fp32 wgrad on the copies), another arch,
    the layout copies or wgrad's K fixed: no wgrad_dbias kernel, the bias gradient (if any)
    from dz.sum(0)."""
    from tirx_gemm.op import layouts as L
    monkeypatch.setattr(WD, "ENABLED", why != "off")
    if why == "K fixed":
        monkeypatch.setattr(L, "WGRAD_RUNTIME_K", False)
    if why == "not sm_90a":
        monkeypatch.setattr(AG, "_arch", lambda device: "sm_100a")
    if why == "copies":
        monkeypatch.setattr(AG, "LAYOUT_STEP", None)
    if why == "over the bound":  # 40 tokens x 16 in-features, one over
        monkeypatch.setattr(WD, "BOUND", 40 * 16 - 1)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(40, 16, generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(24, 16, generator=g) / 4).to(torch.bfloat16).requires_grad_()
    b = torch.randn(24, generator=g).to(torch.bfloat16).requires_grad_(why != "no bias grad")
    if why == "weight main_grad":
        w.main_grad = torch.zeros(24, 16)
    dy = torch.randn(40, 24, generator=g).to(torch.bfloat16)
    AG.matmul(a, w, b, "gelu").backward(dy)
    assert RAN == []
    if why != "no bias grad":
        ref = [t.detach().float().requires_grad_() for t in (a, w, b)]
        F.gelu(F.linear(*ref)).backward(dy.float())
        _close(b.grad, ref[2].grad)


def test_into_bias_main_grad(stand_in):
    """A bias with main_grad: the kernel's fp32 sum is added into it in place, .grad None."""
    (_, _, b), ref = _step(33, "silu", main_grad=True)
    assert b.grad is None and RAN
    _close(b.main_grad - 1.0, ref[2].grad)


def test_compiled_training_step_keeps_the_kernel(stand_in, monkeypatch):
    """torch.compile(fullgraph=True, aot_eager): the traced backward calls
    tirx_gemm::wgrad_dbias_mm (its fake gives db and the fp32 dbias), and the compiled step's
    gradients are eager's."""
    nodes = []
    real = WD.OP
    monkeypatch.setattr(WD, "OP", lambda *a: nodes.append(tuple(a[0].shape)) or real(*a))
    g = torch.Generator().manual_seed(9)
    a = torch.randn(40, 16, generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(24, 16, generator=g) / 4).to(torch.bfloat16).requires_grad_()
    b = torch.randn(24, generator=g).to(torch.bfloat16).requires_grad_()

    def step(a, w, b):
        return AG.matmul(a, w, b).float().square().sum()
    torch._dynamo.reset()
    torch.compile(step, fullgraph=True, backend="aot_eager")(a, w, b).backward()
    got = [t.grad.clone() for t in (a, w, b)]
    for t in (a, w, b):
        t.grad = None
    step(a, w, b).backward()
    assert nodes and RAN
    for x, y in zip(got, (a.grad, w.grad, b.grad)):
        _close(x, y.float())


def test_op_fake_shapes_and_refusal():
    """The op's fake: db (N x K) in dz's dtype, dbias fp32 (N,); one token count."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        dz, a = torch.empty(300, 24, dtype=torch.bfloat16), torch.empty(300, 16,
                                                                         dtype=torch.bfloat16)
        db, dbias = WD.OP(dz, a)
        assert db.shape == (24, 16) and db.dtype == torch.bfloat16
        assert dbias.shape == (24,) and dbias.dtype == torch.float32
        with pytest.raises(ValueError, match="wgrad_dbias_mm: .*one token count"):
            WD.OP(dz, torch.empty(299, 16, dtype=torch.bfloat16))


def test_request_is_what_kernel_loads(monkeypatch):
    """kernel() loads exactly the build request() names: layouts' TT build (both MN-major,
    K at run time where the wgrad build takes it) plus WGRAD_DBIAS; off is the default."""
    from tirx_gemm.op import layouts as L
    from tirx_gemm.op import matmul as MM
    assert WD.ENABLED is False
    loaded = []
    monkeypatch.setattr(MM, "_load", lambda st, shape, kw: loaded.append((st, shape, kw))
                        or type("K", (), {"kernel": None})())
    monkeypatch.setattr(MM, "_gpu_arch", lambda device: ("sm_90a", 132))
    L._layout_kernels.clear()
    WD.kernel(torch.bfloat16, 6400, 1600, 4096, "dev")
    st, shape, kw = WD.request(6400, 1600, 4096, "bfloat16", 132)
    from tirx_gemm.op.keywords import build_shape
    assert [(x[0], build_shape(x[1], x[2]), x[2]) for x in loaded] == [(st, shape, kw)]
    assert kw["WGRAD_DBIAS"] is True
    assert kw["A_MAJOR"] == kw["B_MAJOR"] == "MN"
    assert kw.get("RUNTIME_K") == L.WGRAD_RUNTIME_K or not L.WGRAD_RUNTIME_K
    L._layout_kernels.clear()


@pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")
def test_wgrad_dbias_refusals():
    """WGRAD_DBIAS only as a bool, with a plain D (no ACT_GRAD, ACT_SAVE, BIAS)."""
    from steps.sm90a.hgemm_v15 import hgemm_v15
    bf = {"dtype": "bfloat16"}
    for bad in ({"ACT_GRAD": "gelu"}, {"ACT_SAVE": "gelu"},
                {"ACT_GRAD": "gelu", "BIAS": "bfloat16"}):
        with pytest.raises(ValueError, match="WGRAD_DBIAS=True: .*only without ACT_GRAD"):
            hgemm_v15(512, 512, 320, WGRAD_DBIAS=True, **bf, **bad)
    with pytest.raises(ValueError, match="WGRAD_DBIAS='yes': True or False"):
        hgemm_v15(512, 512, 320, WGRAD_DBIAS="yes", **bf)
    with pytest.raises(ValueError, match="WGRAD_DBIAS=True needs RUNTIME_K=True"):
        hgemm_v15(512, 512, 320, WGRAD_DBIAS=True, A_MAJOR="MN", B_MAJOR="MN", **bf)


@pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")
@pytest.mark.parametrize("dtype,extra", [
    ("bfloat16", {}), ("float16", {"PIPE_DEPTH": 3})])
def test_wgrad_dbias_builds(dtype, extra):
    """The wgrad build with WGRAD_DBIAS compiles without spills: four m64n8k16 row-sum wgmmas
    a K step beside D's four m64n256k16 (transposed A: dz read MN-major), issued first so the
    group's last wgmma is D's and ptxas keeps the wgmmas in flight (one wait of each depth, as
    without it: no serialized HGMMA); two plain fp32 stores a thread, no atomics."""
    from tirx_gemm.compile.api import build
    kw = dict(arch="sm_90a", SM_COUNT=4, dtype=dtype, CLUSTER=1, PDL=True, A_MAJOR="MN",
              B_MAJOR="MN", RUNTIME_M=True, RUNTIME_K=True, **extra)
    r = build("v15", 512, 768, 320, WGRAD_DBIAS=True, **kw)
    plain = build("v15", 512, 768, 320, **kw)
    assert r.spill_stores == 0 and r.spill_loads == 0
    t = ".BF16" if dtype == "bfloat16" else ""  # (fp16's mnemonic names no operand type)
    assert r.sass_counts.get(f"HGMMA.64x8x16.F32{t}", 0) == 4
    assert r.sass_counts.get(f"HGMMA.64x256x16.F32{t}", 0) == 4
    assert r.sass_counts.get("WARPGROUP.DEPBAR.LE") == plain.sass_counts.get(
        "WARPGROUP.DEPBAR.LE") == 2
    assert not [op for op in r.sass_counts if op.startswith("HGMMA") and ".F32" not in op]
    assert r.sass_counts.get("STG.E", 0) == 2
    assert not [op for op in r.sass_counts if "ATOM" in op or "RED" in op.split(".")[0]]
    assert "float* __restrict__ DB_ptr" in r.cuda_path.read_text()


LAB = Path(__file__).resolve().parents[1] / "lab" / "training_backward"
RECORD = LAB / "records" / "wgrad_dbias_h100.jsonl"


def _geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _fused_rows():
    rows = [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]
    assert not [r for r in rows if r["what"] == "error"]
    return [r for r in rows if r["what"] == "wgrad_dbias"]


def test_rule_verdict_from_the_record():
    """The README's rule, computed from the H100 record: 18 correct cases (bias gradient within
    1e-3 of max |dz.sum(0)|), geomean speedup >= 1.02 over all and over the held-out cases, none
    under 0.98. It fails (cases under 0.98) and ENABLED stays off; the README shows the
    geomeans and the least speedup as computed here."""
    fused = _fused_rows()
    assert len(fused) == 18 and {r["card"] for r in fused} == {"NVIDIA H100 80GB HBM3"}
    assert max(r["db_rel_err"] for r in fused) <= 1e-3
    speedup = [r["speedup"] for r in fused]
    held = [r["speedup"] for r in fused if r["class"] == "held_out"]
    g_all, g_held, least = _geomean(speedup), _geomean(held), min(speedup)
    verdict = g_all >= 1.02 and g_held >= 1.02 and least >= 0.98
    assert not verdict and WD.ENABLED is False
    readme = (LAB / "README.md").read_text()
    for value in (g_all, g_held, least):
        assert f"-->{value:.3f}<!-- /rec -->x" in readme, value
    assert "The decision: not adopted by its rule (a case under 0.98)" in readme


def test_bounded_rule_quote_and_cases():
    """The bounded rule's quoted figures (M*K <= BOUND in the H100 record: count, geomean and
    least speedup) are the record's; every case of its held-out set lies within the bound and
    none is a shape the record timed."""
    sys.path.insert(0, str(LAB))
    try:
        import bench_wgrad_dbias as BW
    finally:
        sys.path.remove(str(LAB))
    fused = _fused_rows()
    inside = [r["speedup"] for r in fused if r["M"] * r["K"] <= BW.BOUND]
    beyond_losses = [r for r in fused if r["speedup"] < 1 and r["M"] * r["K"] <= BW.BOUND]
    assert not beyond_losses
    quote = (f"`M*K <= 2**{int(math.log2(BW.BOUND))}`: {len(inside)} cases, geomean "
             f"{_geomean(inside):.3f}, least {min(inside):.3f}")
    readme = " ".join((LAB / "README.md").read_text().split())
    assert quote in readme, quote
    bounded = BW.cases("bounded")
    assert len(bounded) == 15 and f"{len(bounded)} cases" in readme
    timed = {(r["N"], r["K"]) for r in fused}
    assert all(M * K <= BW.BOUND and (N, K) not in timed for *_, M, N, K in bounded)
    assert len(BW.cases("all")) == 18
