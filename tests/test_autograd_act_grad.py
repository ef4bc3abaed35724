"""The fused activation gradient (tirx_gemm.op.act_grad, v15's ACT_GRAD) on the CPU: the
backward's wiring with a CPU stand-in of the kernel, when it falls back, and (with TVM and
nvcc here) the builds. The GPU comparison with torch's gradients: tests/test_gpu_autograd.py.
"""
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from tirx_gemm.op import act_grad as AGR
from tirx_gemm.op import autograd as AG
from tirx_gemm.op import torch_op

ACTS = ("gelu", "gelu_tanh", "silu")
GEMMS: list = []   # the forward matmul calls of the CPU reference op
FUSED: list = []   # the stand-in kernel's calls: (M, N, K, act, bias[, "dbias"])
PARTS: list = []   # the partials the stand-in wrote (ACT_GRAD_DBIAS builds)


def _act(z, act):
    return {"gelu": F.gelu, "silu": F.silu, "relu": F.relu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act](z)


def _ref_matmul(a, b, step=None, bias=None, activation=None, out_dtype=None):
    GEMMS.append((tuple(a.shape), tuple(b.shape), activation, out_dtype))
    z = a.float() @ b.float().T + (0 if bias is None else bias.float())
    return (z if activation is None else _act(z, activation)).to(out_dtype or a.dtype)


def _fake_kernel(dtype, M, N, K, act, bias, device, dbias=False):
    """The fused kernel's CPU stand-in: the operands as the GPU kernel takes them (dy and
    bias as int32 words), dz = dy * act'(z) from torch's autograd of the activation; with
    ``dbias`` also the fp32 partials (act_grad.dbias_partials of dz as stored)."""
    def run(a, b, out, dy_words, *rest):
        words = N // 4 if act == AGR.SWIGLU else N // 2  # two 16-bit values a word
        assert dy_words.dtype == torch.int32 and dy_words.shape == (M, words)
        assert len(rest) == int(bias) + int(dbias) and out.shape == (M, N) and out.dtype == dtype
        FUSED.append((M, N, K, act, bias) + (("dbias",) if dbias else ()))
        out.copy_(AGR.reference(a, b, dy_words.view(dtype), rest[0].view(dtype)
                                if bias else None, act))
        if dbias:
            parts = rest[1]
            assert parts.dtype == torch.float32 and parts.shape == ((M + 15) // 16, N)
            parts.copy_(AGR.dbias_partials(out))
            PARTS.append(parts)
    return run


def _close(got, want, tol=2e-2):
    """tests/test_gpu_autograd.py's rule: max |got - want| <= tol * max |want| (dz and the
    GEMMs' outputs are rounded to bf16 once each)."""
    err = (got.float() - want).abs().max().item()
    assert err <= tol * want.abs().max().item() + 1e-6, err


@pytest.fixture
def stand_in(monkeypatch):
    """The matmul op's CPU reference, the GPU said to be sm_90a, the fused kernel's stand-in
    (v15's layout GEMMs left to the copies: LAYOUT_STEP None), the forward that keeps z off
    (the recompute path these tests are about; tests/test_autograd_act_save.py has the other)."""
    GEMMS.clear()
    FUSED.clear()
    PARTS.clear()
    lib = torch.library.Library("tirx_gemm", "IMPL")
    lib.impl("matmul", _ref_matmul, "CPU")
    monkeypatch.setattr(AG, "_arch", lambda device: "sm_90a")
    monkeypatch.setattr(AGR, "kernel", _fake_kernel)
    monkeypatch.setattr(AG, "LAYOUT_STEP", None)
    monkeypatch.setattr(AG._AS, "ENABLED", False)
    try:
        yield
    finally:
        lib._destroy()


def _grads(M, N, K, act, bias, dtype=torch.bfloat16, out_dtype=None, seed=0, bias_dtype=None):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(N, generator=g).to(bias_dtype or dtype).requires_grad_() if bias else None
    dy = torch.randn(M, N, generator=g).to(out_dtype or dtype)
    AG.matmul(a, w, b, act, out_dtype).backward(dy)
    ref = [t.detach().float().requires_grad_() for t in (a, w) + ((b,) if bias else ())]
    _act(F.linear(*ref), act).backward(dy.float())
    return [t.grad for t in (a, w) + ((b,) if bias else ())], [t.grad for t in ref]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("M,bias", [(77, True), (13, False), (256, True)])
def test_fused_act_grad_replaces_the_recompute(stand_in, act, M, bias):
    """On sm_90a the backward of act(a @ b.T + bias) runs one fused kernel (no fp32 recompute
    through matmul: the forward is its only call); gradients as torch's at bf16's tolerance."""
    got, ref = _grads(M, 64, 32, act, bias)
    assert FUSED == [(M, 64, 32, act, bias)]
    assert [g[2] for g in GEMMS if g[2] is not None] == [act]  # the forward's
    assert not [g for g in GEMMS if g[3] is torch.float32]     # no fp32 recompute
    for x, r in zip(got, ref):
        _close(x, r)


@pytest.mark.parametrize("M", [13, 40])
def test_fused_swiglu_grad(stand_in, M):
    """SwiGLU's backward on sm_90a: d gate and d up from the fused kernel (act "swiglu", dy
    M x N, dz M x 2N interleaved), no fp32 recompute; gradients as torch's of silu(x g.T) *
    (x u.T) at bf16's tolerance, the weight's in the fused layout."""
    torch_op.SWIGLU_OP  # noqa: B018 (the op is defined by torch_op)
    lib = torch.library.Library("tirx_gemm", "IMPL")

    def ref_swiglu(a, fused, out_dtype=None):
        v = fused.float().view(fused.shape[0] // 16, 2, 8, -1)
        g, u = v[:, 0].reshape(-1, a.shape[1]), v[:, 1].reshape(-1, a.shape[1])
        return (F.silu(a.float() @ g.T) * (a.float() @ u.T)).to(out_dtype or a.dtype)

    lib.impl("swiglu", ref_swiglu, "CPU")
    try:
        g = torch.Generator().manual_seed(M)
        a = torch.randn(M, 32, generator=g).bfloat16().requires_grad_()
        fused = (torch.randn(64, 32, generator=g) / 6).bfloat16().requires_grad_()
        dy = torch.randn(M, 32, generator=g).bfloat16()
        AG.swiglu(a, fused).backward(dy)
    finally:
        lib._destroy()
    assert FUSED == [(M, 64, 32, AGR.SWIGLU, False)]
    assert not [g for g in GEMMS if g[3] is torch.float32]  # no fp32 recompute
    ra, rf = (t.detach().float().requires_grad_() for t in (a, fused))
    v = rf.view(4, 2, 8, 32)
    (F.silu(F.linear(ra, v[:, 0].reshape(32, 32))) * F.linear(ra, v[:, 1].reshape(32, 32))
     ).backward(dy.float())
    _close(a.grad, ra.grad)
    _close(fused.grad, rf.grad)


def test_fused_act_grad_takes_a_strided_dy(stand_in):
    """loss.sum()'s backward hands an expanded dy (strides 0): copied, then the fused kernel."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(24, 32, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(64, 32, generator=g) / 6).bfloat16().requires_grad_()
    AG.matmul(a, w, None, "gelu_tanh").sum().backward()
    assert FUSED == [(24, 64, 32, "gelu_tanh", False)]
    ref = [t.detach().float().requires_grad_() for t in (a, w)]
    F.gelu(F.linear(*ref), approximate="tanh").sum().backward()
    for x, r in zip((a, w), ref):
        _close(x.grad, r.grad)


@pytest.mark.parametrize("why", ["disabled", "fp32 dy", "relu", "arch", "fp32 bias", "odd N"])
def test_fused_act_grad_falls_back(stand_in, monkeypatch, why):
    """Where the fused kernel does not apply, the GEMM + elementwise path runs (its fp32
    recompute goes through matmul) with the same gradients."""
    act, N, bias_dtype, out_dtype = "gelu", 64, None, None
    if why == "fp32 bias":  # a bias in fp32 while the operands are bf16
        bias_dtype = torch.float32
    if why == "disabled":
        monkeypatch.setattr(AGR, "ENABLED", False)
    elif why == "fp32 dy":
        out_dtype = torch.float32
    elif why == "relu":
        act = "relu"
    elif why == "arch":
        monkeypatch.setattr(AG, "_arch", lambda device: "sm_100a")
    elif why == "odd N":
        N = 60
    got, ref = _grads(24, N, 32, act, True, out_dtype=out_dtype, bias_dtype=bias_dtype)
    assert FUSED == []
    recomputes = [g for g in GEMMS[1:] if g[3] is torch.float32]  # z in fp32 through matmul
    assert len(recomputes) == (0 if act == "relu" else 1)
    for x, r in zip(got, ref):
        _close(x, r)


def compiled_silu_step(owner):
    """torch.compile(fullgraph=True, aot_eager) of one training step through AG.matmul (silu
    and a bias, x 40 x 32, w 64 x 32), run once with ``owner.OP``'s calls recorded: (the act
    of each recorded call, the step, its tensors (x, w, bias), their compiled gradients).
    tests/test_autograd_act_save.py's compiled step is this one too."""
    nodes = []
    real = owner.OP
    owner.OP = lambda *a: nodes.append(a[-1]) or real(*a)
    try:
        g = torch.Generator().manual_seed(4)
        w = (torch.randn(64, 32, generator=g) / 6).bfloat16().requires_grad_()
        bias = torch.randn(64, generator=g).bfloat16().requires_grad_()
        x = torch.randn(40, 32, generator=g).bfloat16().requires_grad_()

        def step(x):
            return AG.matmul(x, w, bias, "silu").float().square().sum()

        torch._dynamo.reset()
        torch.compile(step, fullgraph=True, backend="aot_eager")(x).backward()
    finally:
        owner.OP = real
    return nodes, step, (x, w, bias), [t.grad.clone() for t in (x, w, bias)]


def assert_grads_as_eager_and_torch(step, tensors, compiled):
    """The compiled gradients equal eager's (the step run again, uncompiled) and are torch's
    in fp32 at :func:`_close`'s tolerance."""
    for t in tensors:
        t.grad = None
    step(tensors[0]).backward()
    ref = [t.detach().float().requires_grad_() for t in tensors]
    F.silu(F.linear(*ref)).square().sum().backward()
    for got, t, r in zip(compiled, tensors, ref):
        torch.testing.assert_close(got, t.grad)
        _close(got, r.grad)


def test_compiled_training_step_keeps_the_fused_kernel(stand_in):
    """torch.compile(fullgraph=True, aot_eager) of a step with a fused activation: the traced
    backward forms dz through the op tirx_gemm::act_grad_mm (a graph node that runs the fused
    kernel); the gradients equal eager's and torch's."""
    nodes, step, tensors, compiled = compiled_silu_step(AGR)
    assert nodes == ["silu"] and [f[3] for f in FUSED] == ["silu"]  # traced once, ran once
    assert_grads_as_eager_and_torch(step, tensors, compiled)


def test_act_grad_op_fake_refuses_in_one_line():
    m = lambda *s: torch.empty(s, device="meta", dtype=torch.bfloat16)  # noqa: E731
    assert tuple(AGR.OP(m(5, 16), m(24, 16), m(5, 24), None, "gelu").shape) == (5, 24)
    with pytest.raises(ValueError, match="act_grad_mm: .*dy must be"):
        AGR.OP(m(5, 16), m(24, 16), m(5, 16), None, "gelu")


def test_act_grad_kwargs_and_request():
    """The build: v15's backward keywords (one CTA, PDL, M at run time, K fixed), K-major both,
    ACT_GRAD, BIAS only with a bias (the operands' dtype); ACT_GRAD_PREFETCH by default for
    gelu, gelu_tanh and silu, never for SwiGLU (v15 refuses it there)."""
    from tirx_gemm import registry
    st, shape, kw = AGR.request(4096, 14336, 4096, "bfloat16", "silu", False)
    assert st is registry.get("v15", "sm_90a") and shape[1:] == (14336, 4096)
    assert kw["ACT_GRAD"] == "silu" and "BIAS" not in kw and not kw.get("RUNTIME_K")
    assert (kw["A_MAJOR"], kw["B_MAJOR"], kw["RUNTIME_M"], kw["CLUSTER"], kw["PDL"]) == \
        ("K", "K", True, 1, True)
    assert AGR.request(77, 64, 32, "float16", "gelu", True)[2]["BIAS"] == "float16"
    assert AGR.PREFETCH is True and kw["ACT_GRAD_PREFETCH"] is True
    assert "ACT_GRAD_PREFETCH" not in AGR.request(77, 64, 32, "float16", "gelu", True,
                                                  prefetch=False)[2]
    for prefetch in (None, True):
        sw = AGR.request(4096, 28672, 4096, "bfloat16", AGR.SWIGLU, False, prefetch=prefetch)[2]
        assert sw["ACT_GRAD"] == "swiglu" and "ACT_GRAD_PREFETCH" not in sw
    with pytest.raises(TypeError, match="True or False"):
        AGR.set_enabled("yes")


def test_act_grad_on_cpu_tensors_falls_back():
    """A CPU tensor (no GPU arch) never reaches the fused kernel."""
    a = torch.zeros(8, 16, dtype=torch.bfloat16)
    assert not AGR.applies(a, torch.zeros(8, 16, dtype=torch.bfloat16),
                           torch.zeros(8, 8, dtype=torch.bfloat16), None, "gelu",
                           AG._arch(a.device))
    assert AGR.dz(a, a, torch.zeros(8, 8, dtype=torch.bfloat16), None, "gelu",
                  AG._arch(a.device)) is None
    assert AGR.applies(a, a, torch.zeros(8, 8, dtype=torch.bfloat16), None, "gelu", "sm_90a")
    assert not AGR.applies(a, a, torch.zeros(8, 8, dtype=torch.bfloat16), None, "relu",
                           "sm_90a")
    big = torch.empty(2 ** 31 // 64, 8, dtype=torch.bfloat16, device="meta")  # M * N = 2**31
    w64 = torch.empty(64, 8, dtype=torch.bfloat16, device="meta")
    assert not AGR.applies(big, w64, torch.empty(2 ** 31 // 64, 64, dtype=torch.bfloat16,
                                                 device="meta"), None, "gelu", "sm_90a", True)
    small = big[:2 ** 31 // 64 - 8]  # one row group less: applies
    assert AGR.applies(small, w64, torch.empty(small.shape[0], 64, dtype=torch.bfloat16,
                                               device="meta"), None, "gelu", "sm_90a", True)


HAVE_TVM = importlib.util.find_spec("tvm") is not None


@pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")
def test_act_grad_refusals():
    from steps.sm90a.hgemm_v15 import hgemm_v15
    with pytest.raises(ValueError, match="ACT_GRAD='relu'.*y > 0"):
        hgemm_v15(512, 512, 320, ACT_GRAD="relu")
    with pytest.raises(ValueError, match="A_MAJOR and B_MAJOR must be 'K'"):
        hgemm_v15(512, 512, 320, ACT_GRAD="gelu", B_MAJOR="MN")
    with pytest.raises(ValueError, match="BIAS='bfloat16': v15 takes a bias only with ACT_GRAD"):
        hgemm_v15(512, 512, 320, dtype="bfloat16", BIAS="bfloat16")
    with pytest.raises(ValueError, match="BIAS='float32'.*operands' dtype"):
        hgemm_v15(512, 512, 320, dtype="bfloat16", ACT_GRAD="gelu", BIAS="float32")
    with pytest.raises(ValueError, match="ACT_GRAD_PREFETCH=True: .*only with ACT_GRAD"):
        hgemm_v15(512, 512, 320, ACT_GRAD_PREFETCH=True)


@pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")
@pytest.mark.parametrize("act,dtype,bias", [("gelu", "bfloat16", "bfloat16"),
                                            ("silu", "float16", False)])
def test_act_grad_builds(act, dtype, bias):
    """The backward's build with ACT_GRAD compiles without spills: one HGMMA per k16 step, dy
    (and the bias) read as 32-bit words, the device function called once per word pair."""
    from tirx_gemm.compile.api import build
    r = build("v15", 512, 512, 320, arch="sm_90a", SM_COUNT=4, dtype=dtype, CLUSTER=1,
              PDL=True, RUNTIME_M=True, ACT_GRAD=act, BIAS=bias)
    assert r.spill_stores == 0 and r.spill_loads == 0
    assert r.sass_counts.get("HGMMA.64x256x16.F32" + (".BF16" if dtype == "bfloat16" else ""),
                             0) == 4
    src = r.cuda_path.read_text()
    assert src.count(f"tirx_gemm_dact_{act}_{dtype}(acc") == 64  # 256 columns / 2 x 2 rows
    assert ("bias_ptr[" in src) == bool(bias)


@pytest.mark.skipif(not HAVE_TVM, reason="the verbs import TVM")
@pytest.mark.parametrize("act", ACTS)
def test_act_grad_device_formula_against_torch(act, tmp_path):
    """The device function's body (hopper/layouts.py), compiled for the host with the fast-math
    intrinsics as their exact libm forms, against torch's derivative in float64 over
    [-12, 12]: within 2e-6 absolute plus 1e-5 relative (gelu's erfc approximation: 6.1e-7
    absolute on gelu, epilogue.GELU_ABS_ERR; the device's __expf and __fdividef add a few
    ulp on the GPU, which the GPU tests cover)."""
    import ctypes
    import shutil
    import subprocess
    cc = shutil.which("g++") or shutil.which("c++")
    if cc is None:
        pytest.skip("no host C++ compiler")
    from tirx_gemm.hopper import layouts as HL
    src = tmp_path / "dact.cpp"
    src.write_text("#include <cmath>\n#define __fdividef(a, b) ((a) / (b))\n"
                   "#define __expf expf\nusing namespace std;\n"
                   f'extern "C" float dact(float x, float dy) {{{HL._DACT_SRC[act]}}}\n')
    lib = tmp_path / "dact.so"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    fn = ctypes.CDLL(str(lib)).dact
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    x = torch.linspace(-12, 12, 4801, dtype=torch.float64)
    got = torch.tensor([fn(float(v), 1.0) for v in x.float()], dtype=torch.float64)
    xr = x.float().double().requires_grad_()
    _act(xr, act).sum().backward()
    err = (got - xr.grad).abs()
    assert (err <= 2e-6 + 1e-5 * xr.grad.abs()).all(), (x[err.argmax()].item(), err.max().item())
    assert fn(1.5, -2.0) == pytest.approx(-2.0 * fn(1.5, 1.0), rel=1e-6)  # dy scales it


@pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")
def test_swiglu_grad_build_and_refusals():
    """ACT_GRAD="swiglu" compiles without spills, each accumulator pair's gate and up
    gradients from one dy word; no bias, no prefetch, N a multiple of 16."""
    from steps.sm90a.hgemm_v15 import hgemm_v15
    from tirx_gemm.compile.api import build
    for bad in ({"BIAS": "bfloat16"}, {"ACT_GRAD_PREFETCH": True}):
        with pytest.raises(ValueError, match="ACT_GRAD='swiglu'.*takes no BIAS"):
            hgemm_v15(512, 512, 320, dtype="bfloat16", ACT_GRAD="swiglu", **bad)
    with pytest.raises(ValueError, match="N = 520 its rows: a multiple of 16"):
        hgemm_v15(512, 520, 320, dtype="bfloat16", ACT_GRAD="swiglu")
    r = build("v15", 512, 512, 320, arch="sm_90a", SM_COUNT=4, dtype="bfloat16", CLUSTER=1,
              PDL=True, RUNTIME_M=True, ACT_GRAD="swiglu")
    assert r.spill_stores == 0 and r.spill_loads == 0
    src = r.cuda_path.read_text()
    assert src.count("tirx_gemm_dswiglu_gate_bfloat16(acc") == 32  # 256 columns / 16 x 2 rows
    assert src.count("tirx_gemm_dswiglu_up_bfloat16(acc") == 32


# --- the bias gradient from the kernel's column sums (act_grad.DBIAS, v15's ACT_GRAD_DBIAS) ---
def _dbias_step(M, act="gelu", bias_grad=True, main_grad=False, seed=7):
    """One backward of AG.matmul(a, w, bias, act) (a M x 32, w 64 x 32); (a, w, bias) and
    their fp32 twins' torch gradients."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, 32, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(64, 32, generator=g) / 6).bfloat16().requires_grad_()
    bias = torch.randn(64, generator=g).bfloat16().requires_grad_(bias_grad)
    if main_grad:
        bias.main_grad = torch.zeros(64)
    dy = torch.randn(M, 64, generator=g).bfloat16()
    AG.matmul(a, w, bias, act).backward(dy)
    ref = [t.detach().float().requires_grad_() for t in (a, w, bias)]
    _act(F.linear(*ref), act).backward(dy.float())
    return (a, w, bias), [t.grad for t in ref]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("M", [1, 17, 40])
def test_dbias_flag_takes_the_bias_gradient_from_the_partials(stand_in, monkeypatch, act, M):
    """act_grad.DBIAS on: the kernel built with ACT_GRAD_DBIAS runs (once), the bias gradient
    is the sum of its partials (exactly, in fp32 then the bias's dtype), every gradient as
    torch's at bf16's tolerance."""
    monkeypatch.setattr(AGR, "DBIAS", True)
    (a, w, bias), ref = _dbias_step(M, act)
    assert FUSED == [(M, 64, 32, act, True, "dbias")] and len(PARTS) == 1
    assert torch.equal(bias.grad, PARTS[0].sum(0).to(bias.dtype))
    for x, r in zip((a, w, bias), ref):
        _close(x.grad, r)


def test_dbias_gradient_comes_from_the_partials_alone(stand_in, monkeypatch):
    """What the kernel writes into the partials is the bias gradient: a stand-in whose partials
    are 1 / ceil(M/16) everywhere gives a bias gradient of ones, whatever dz is."""
    monkeypatch.setattr(AGR, "DBIAS", True)
    fake = AGR.kernel

    def ones(*args, **kw):
        run = fake(*args, **kw)
        return lambda *ts: run(*ts) or ts[-1].fill_(1 / ts[-1].shape[0])
    monkeypatch.setattr(AGR, "kernel", ones)
    (_, _, bias), _ = _dbias_step(40)
    assert torch.equal(bias.grad, torch.ones(64, dtype=torch.bfloat16))


@pytest.mark.parametrize("why", ["off", "no bias grad", "relu", "arch"])
def test_dbias_not_taken(stand_in, monkeypatch, why):
    """Without the flag (the default), without a bias that needs a gradient, for relu (no
    fused kernel) or off sm_90a: no ACT_GRAD_DBIAS build, the bias gradient (if any) from dz;
    the same gradients."""
    monkeypatch.setattr(AGR, "DBIAS", why != "off")
    act = "relu" if why == "relu" else "gelu"
    if why == "arch":
        monkeypatch.setattr(AG, "_arch", lambda device: "sm_100a")
    (a, w, bias), ref = _dbias_step(24, act, bias_grad=why != "no bias grad")
    assert PARTS == [] and all("dbias" not in f for f in FUSED)
    assert FUSED == ([(24, 64, 32, act, True)] if why in ("off", "no bias grad") else [])
    for x, r in zip((a, w, bias), ref):
        if x.requires_grad:
            _close(x.grad, r)


def test_dbias_into_main_grad(stand_in, monkeypatch):
    """A bias with a main_grad buffer: the partials' sum is added into it in place (fp32, no
    rounding to the bias's dtype), the bias's .grad stays None."""
    monkeypatch.setattr(AGR, "DBIAS", True)
    (_, _, bias), ref = _dbias_step(33, main_grad=True)
    assert bias.grad is None and len(PARTS) == 1
    assert torch.equal(bias.main_grad, PARTS[0].sum(0))
    _close(bias.main_grad, ref[2])


def test_compiled_training_step_keeps_the_dbias_kernel(stand_in, monkeypatch):
    """torch.compile(fullgraph=True, aot_eager) with act_grad.DBIAS on: the traced backward calls
    tirx_gemm::act_grad_dbias_mm (dz and the partials as one graph node, its fake giving both
    shapes); the gradients equal eager's and torch's."""
    monkeypatch.setattr(AGR, "DBIAS", True)
    nodes = []
    real = AGR.OP_DBIAS
    monkeypatch.setattr(AGR, "OP_DBIAS", lambda *a: nodes.append(a[-1]) or real(*a))
    _, step, tensors, compiled = compiled_silu_step(AGR)
    assert nodes == ["silu"] and FUSED == [(40, 64, 32, "silu", True, "dbias")]
    assert_grads_as_eager_and_torch(step, tensors, compiled)


def test_act_grad_dbias_op_fake_shapes_and_refusal():
    m = lambda *s: torch.empty(s, device="meta", dtype=torch.bfloat16)  # noqa: E731
    for M in (1, 16, 17, 300):
        dz, parts = AGR.OP_DBIAS(m(M, 16), m(24, 16), m(M, 24), m(24), "gelu")
        assert tuple(dz.shape) == (M, 24) and dz.dtype == torch.bfloat16
        assert tuple(parts.shape) == (-(-M // 16), 24) and parts.dtype == torch.float32
    with pytest.raises(ValueError, match="act_grad_dbias_mm: .*bias \\(b rows,\\)"):
        AGR.OP_DBIAS(m(5, 16), m(24, 16), m(5, 24), m(16), "gelu")
    with pytest.raises(ValueError, match="act_grad_dbias_mm: .*act one of gelu"):
        AGR.OP_DBIAS(m(5, 16), m(24, 16), m(5, 24), m(24), "swiglu")


def test_dbias_partials_reference():
    """act_grad.dbias_partials (the stand-ins' model of the kernel): row r sums dz's rows
    16r .. 16r + 15 in fp32, the last block short at a ragged M."""
    dz = torch.arange(17 * 3, dtype=torch.float32).view(17, 3).bfloat16()
    parts = AGR.dbias_partials(dz)
    assert parts.dtype == torch.float32 and parts.shape == (2, 3)
    torch.testing.assert_close(parts[0], dz[:16].float().sum(0))
    torch.testing.assert_close(parts[1], dz[16].float())
    assert AGR.dbias_partials(dz[:1]).shape == (1, 3)


def test_dbias_request_is_what_kernel_loads(monkeypatch):
    """kernel(..., dbias=True) loads exactly the build request(..., dbias=True) names (one
    keyword set: ACT_GRAD_DBIAS with the bias, the prefetch as act_grad.PREFETCH); the
    kernel without dbias is another cache entry."""
    from tirx_gemm.op import matmul as MM
    loaded = []

    class Loaded:
        kernel = "fn"
    monkeypatch.setattr(MM, "_gpu_arch", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(MM, "_load", lambda st, mnk, kw: loaded.append((st, kw)) or Loaded)
    monkeypatch.setattr(AGR, "_kernels", {})
    for dbias in (True, False, True):
        AGR.kernel(torch.bfloat16, 300, 264, 320, "gelu", True, "dev", dbias=dbias)
    assert len(loaded) == 2  # the third call is the first's cache entry
    st, _, kw = AGR.request(300, 264, 320, "bfloat16", "gelu", True, 132, dbias=True)
    assert loaded[0] == (st, kw) and kw["ACT_GRAD_DBIAS"] is True and kw["BIAS"] == "bfloat16"
    assert kw["ACT_GRAD_PREFETCH"] is True
    assert "ACT_GRAD_DBIAS" not in loaded[1][1]
    assert "ACT_GRAD_DBIAS" not in AGR.request(300, 264, 320, "bfloat16", "gelu", True)[2]


@pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")
def test_act_grad_dbias_refusals():
    """ACT_GRAD_DBIAS only with ACT_GRAD gelu / gelu_tanh / silu and a BIAS, as a bool."""
    from steps.sm90a.hgemm_v15 import hgemm_v15
    from tirx_gemm.hopper import layouts as HL
    assert AGR.DBIAS_ROWS == HL.DBIAS_ROWS  # the op's copy of the kernel's row block
    bf = {"dtype": "bfloat16"}
    for bad in ({}, {"ACT_GRAD": "swiglu"}, {"ACT_GRAD": "gelu"},
                {"ACT_SAVE": "gelu", "BIAS": "bfloat16"}):
        with pytest.raises(ValueError, match="ACT_GRAD_DBIAS=True: .*only with ACT_GRAD one of "
                                             "gelu, gelu_tanh, silu and a BIAS"):
            hgemm_v15(512, 512, 320, ACT_GRAD_DBIAS=True, **bf, **bad)
    with pytest.raises(ValueError, match="ACT_GRAD_DBIAS='yes': True or False"):
        hgemm_v15(512, 512, 320, ACT_GRAD="gelu", BIAS="bfloat16", ACT_GRAD_DBIAS="yes", **bf)


@pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")
@pytest.mark.parametrize("act,dtype,M,N,extra", [
    ("gelu", "bfloat16", 512, 512, {"RUNTIME_M": True, "ACT_GRAD_PREFETCH": True}),
    ("silu", "float16", 300, 264, {})])
def test_act_grad_dbias_builds(act, dtype, M, N, extra):
    """The build with ACT_GRAD_DBIAS compiles without spills (the op's: M at run time, dy
    prefetched; and M, N fixed and ragged, dy loaded after the wait): per 64-column chunk 14
    shuffles (SHFL.BFLY: 8 + 4 + 2) and one 8-byte store a lane (STG.E.64), no atomics;
    DBP an fp32 operand after the bias."""
    from tirx_gemm.compile.api import build
    r = build("v15", M, N, 320, arch="sm_90a", SM_COUNT=4, dtype=dtype, CLUSTER=1, PDL=True,
              ACT_GRAD=act, BIAS=dtype, ACT_GRAD_DBIAS=True, **extra)
    assert r.spill_stores == 0 and r.spill_loads == 0
    chunks = 256 // 64
    assert r.sass_counts.get("SHFL.BFLY", 0) == 14 * chunks
    assert r.sass_counts.get("STG.E.64", 0) == chunks
    assert not [op for op in r.sass_counts if "ATOM" in op or "RED" in op.split(".")[0]]
    src = r.cuda_path.read_text()
    assert src.count("tirx_gemm_halve_sum(s") == 14 * chunks
    assert "int* __restrict__ bias_ptr" in src and "float* __restrict__ DBP_ptr" in src
