"""The forward that keeps its pre-activation (tirx_gemm.op.act_save, v15's ACT_SAVE) on the CPU:
the backward's wiring with a CPU stand-in of the kernel (an elementwise backward, no recompute),
when it falls back to the recompute path, and (with TVM and nvcc here) the builds and refusals.
The GPU comparison with torch's gradients: tests/test_gpu_autograd.py (test_act_save_grads).
"""
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from test_autograd_act_grad import (  # tests/ is on sys.path under pytest
    _close, assert_grads_as_eager_and_torch, compiled_silu_step)
from tirx_gemm.op import act_grad as AGR
from tirx_gemm.op import act_save as AS
from tirx_gemm.op import autograd as AG

ACTS = ("gelu", "gelu_tanh", "silu")
GEMMS: list = []   # the matmul op's calls (forward or recompute)
SAVED: list = []   # the save kernel's calls: (M, N, K, act, bias)
FUSED: list = []   # the fused recompute kernel's calls (act_grad)


def _act(z, act):
    return {"gelu": F.gelu, "silu": F.silu, "relu": F.relu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act](z)


def _ref_matmul(a, b, step=None, bias=None, activation=None, out_dtype=None):
    GEMMS.append((tuple(a.shape), tuple(b.shape), activation, out_dtype))
    z = a.float() @ b.float().T + (0 if bias is None else bias.float())
    return (z if activation is None else _act(z, activation)).to(out_dtype or a.dtype)


def _save_kernel(dtype, M, N, K, act, bias, device):
    """The save kernel's CPU stand-in, as the GPU kernel takes its operands (the bias as int32
    words): y = act(z) from z in fp32, z rounded to the operands' dtype."""
    def run(a, b, y, z, *bias_words):
        assert len(bias_words) == int(bias) and y.shape == z.shape == (M, N)
        assert y.dtype == z.dtype == dtype and (not bias or bias_words[0].dtype == torch.int32)
        SAVED.append((M, N, K, act, bias))
        acc = a.float() @ b.float().T + (bias_words[0].view(dtype).float() if bias else 0)
        z.copy_(acc)
        y.copy_(_act(acc, act))
    return run


def _fused_kernel(dtype, M, N, K, act, bias, device):
    def run(a, b, out, dy_words, *bias_words):
        FUSED.append((M, N, K, act, bias))
        out.copy_(AGR.reference(a, b, dy_words.view(dtype),
                                bias_words[0].view(dtype) if bias else None, act))
    return run


@pytest.fixture
def stand_in(monkeypatch):
    """The matmul op's CPU reference, the GPU said to be sm_90a, the save kernel's and the
    fused recompute kernel's stand-ins, the save op's CPU kernel (v15's layout GEMMs left to
    the copies: LAYOUT_STEP None)."""
    for rec in (GEMMS, SAVED, FUSED):
        rec.clear()
    lib = torch.library.Library("tirx_gemm", "IMPL")
    lib.impl("matmul", _ref_matmul, "CPU")
    lib.impl("act_save_mm", AS._run, "CPU")
    monkeypatch.setattr(AG, "_arch", lambda device: "sm_90a")
    monkeypatch.setattr(AS, "kernel", _save_kernel)
    monkeypatch.setattr(AGR, "kernel", _fused_kernel)
    monkeypatch.setattr(AG, "LAYOUT_STEP", None)
    try:
        yield
    finally:
        lib._destroy()



def _grads(M, N, K, act, bias, dtype=torch.bfloat16, out_dtype=None, step=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(N, generator=g).to(dtype).requires_grad_() if bias else None
    dy = torch.randn(M, N, generator=g).to(out_dtype or dtype)
    y = AG.matmul(a, w, b, act, out_dtype, step=step)
    ref = [t.detach().float().requires_grad_() for t in (a, w) + ((b,) if bias else ())]
    want = _act(F.linear(*ref), act)
    _close(y.detach(), want.detach())
    y.backward(dy)
    want.backward(dy.float())
    return [t.grad for t in (a, w) + ((b,) if bias else ())], [t.grad for t in ref]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("M,bias,dtype", [(77, True, torch.bfloat16), (13, False, torch.float16),
                                          (1, True, torch.float16)])
def test_saved_z_makes_the_backward_elementwise(stand_in, act, M, bias, dtype):
    """With grad recorded, the forward is the save kernel (y and z) and the backward forms dz
    from z elementwise: no matmul op call at all (neither forward nor fp32 recompute) and no
    fused recompute kernel; every gradient as torch's at the 16-bit tolerance."""
    got, ref = _grads(M, 64, 32, act, bias, dtype)
    assert SAVED == [(M, 64, 32, act, bias)]
    assert FUSED == [] and len(GEMMS) == 2  # dgrad and wgrad only, plain
    assert not [g for g in GEMMS if g[2] is not None or g[3] is torch.float32]
    for x, r in zip(got, ref):
        _close(x, r)


def test_the_saved_z_is_the_only_extra_tensor(stand_in):
    """The graph keeps a, b and z (one M x N tensor in the operands' dtype), as torch's Linear +
    activation keeps its input, weight and pre-activation (saved_tensors_hooks sees each)."""
    a = torch.randn(40, 32).bfloat16().requires_grad_()
    w = torch.randn(64, 32).bfloat16().requires_grad_()
    kept = []

    def pack(t):
        kept.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        AG.matmul(a, w, None, "gelu").sum().backward()
    assert SAVED == [(40, 64, 32, "gelu", False)]
    assert sorted(k for k in kept if k[0] != ()) == sorted(
        [((40, 32), torch.bfloat16), ((64, 32), torch.bfloat16), ((40, 64), torch.bfloat16)])


@pytest.mark.parametrize("why", ["missing", "disabled", "relu", "fp32_out", "step", "no_grad"])
def test_fallbacks_keep_the_recompute_path(stand_in, monkeypatch, why):
    """The save kernel is skipped (and the backward recomputes z, fused on sm_90a) where it is
    not in the bundle, switched off, for relu (its mask is y > 0), an fp32 output or a forced
    forward step; without grad the plain forward kernel runs."""
    act = "relu" if why == "relu" else "gelu"
    if why == "missing":
        monkeypatch.setattr(AS, "kernel", lambda *args: None)
    if why == "disabled":
        AS.set_enabled(False)
    try:
        if why == "no_grad":
            a = torch.randn(16, 32).bfloat16().requires_grad_()
            w = torch.randn(64, 32).bfloat16()
            monkeypatch.setattr(AG.torch_op, "matmul", lambda a, b, bias, act, out_dtype, step=None:
                                _ref_matmul(a, b, step, bias, act, out_dtype))  # the direct (inference) call
            with torch.no_grad():
                y = AG.matmul(a, w, None, act)
            assert SAVED == [] and y.grad_fn is None and GEMMS[0][2] == act
            return
        got, ref = _grads(16, 64, 32, act, True,
                          out_dtype=torch.float32 if why == "fp32_out" else None,
                          step="v12" if why == "step" else None)
    finally:
        AS.set_enabled(True)
    assert SAVED == []
    assert [g[2] for g in GEMMS if g[2] is not None] == [act]  # the forward through the op
    if why != "relu" and why != "fp32_out":
        assert FUSED == [(16, 64, 32, act, True)]  # the recompute, fused
    for x, r in zip(got, ref):
        _close(x, r)


@pytest.mark.parametrize("missing", [False, True])
def test_compiled_training_step_keeps_z(stand_in, monkeypatch, missing):
    """torch.compile(fullgraph=True, aot_eager) of a step with silu and a bias: the traced forward
    is the save op (one graph node, the kernel asked for once while tracing) and the traced
    backward is elementwise from z (no recompute, fused or not); where the kernel is missing the
    compiled step keeps the recompute path. The gradients equal eager's and torch's."""
    if missing:
        monkeypatch.setattr(AS, "kernel", lambda *args: None)
    nodes, step, tensors, compiled = compiled_silu_step(AS)
    if missing:
        assert nodes == [] and SAVED == [] and [f[3] for f in FUSED] == ["silu"]
    else:  # traced once, ran once; the backward neither recomputed nor ran a forward GEMM
        assert nodes == ["silu"] and SAVED == [(40, 64, 32, "silu", True)] and FUSED == []
        assert [g[2] for g in GEMMS] == [None, None]  # dgrad and wgrad only
    assert_grads_as_eager_and_torch(step, tensors, compiled)


def test_compiled_inference_keeps_the_plain_kernel(stand_in):
    """Compiled without grad, the fused epilogue's op runs (no z is written)."""
    w = torch.randn(64, 32).bfloat16()
    x = torch.randn(40, 32).bfloat16()
    torch._dynamo.reset()
    with torch.no_grad():
        y = torch.compile(lambda x: AG.matmul(x, w, None, "gelu"), fullgraph=True,
                          backend="aot_eager")(x)
    assert SAVED == [] and [g[2] for g in GEMMS] == ["gelu"]
    _close(y, F.gelu(x.float() @ w.float().T))


def test_not_applied_on_cpu_or_odd_shapes():
    """act_save.applies: a CPU tensor (no GPU arch), N or K not a multiple of 8, a bias in
    another dtype, fp32 operands: the recompute path."""
    a = torch.zeros(8, 16, dtype=torch.bfloat16)
    w = torch.zeros(8, 16, dtype=torch.bfloat16)
    assert not AS.applies(a, w, None, "gelu", None, AG._arch(a.device))
    assert not AS.applies(a, torch.zeros(12, 16, dtype=torch.bfloat16), None, "gelu", None,
                          "sm_90a")
    assert not AS.applies(a, w, torch.zeros(8), "gelu", None, "sm_90a")
    assert not AS.applies(a.float(), w.float(), None, "gelu", None, "sm_90a")
    assert not AS.applies(a, w, None, "relu", None, "sm_90a")
    with pytest.raises(TypeError, match="True or False"):
        AS.set_enabled(1)


def test_elementwise_dz_matches_torch():
    """act_save.dz: torch's own activation backward on (dy, z), as autograd's for F.gelu/silu."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(33, 40, generator=g).bfloat16()
    dy = torch.randn(33, 40, generator=g).bfloat16()
    for act in ACTS:
        zr = z.float().requires_grad_()
        _act(zr, act).backward(dy.float())
        _close(AS.dz(dy, z, act), zr.grad)


def test_act_save_kwargs_and_request():
    """The build: v15's backward keywords (one CTA, PDL, M at run time, K fixed), K-major both,
    ACT_SAVE, BIAS only with a bias (the operands' dtype)."""
    from tirx_gemm import registry
    st, shape, kw = AS.request(4096, 14336, 4096, "bfloat16", "silu", False)
    assert st is registry.get("v15", "sm_90a") and shape[1:] == (14336, 4096)
    assert kw["ACT_SAVE"] == "silu" and "BIAS" not in kw and not kw.get("RUNTIME_K")
    assert (kw["A_MAJOR"], kw["B_MAJOR"], kw["RUNTIME_M"], kw["CLUSTER"], kw["PDL"]) == \
        ("K", "K", True, 1, True)
    assert "ACT_GRAD" not in kw
    assert AS.request(77, 64, 32, "float16", "gelu", True)[2]["BIAS"] == "float16"


HAVE_TVM = importlib.util.find_spec("tvm") is not None


@pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")
def test_act_save_refusals():
    from steps.sm90a.hgemm_v15 import hgemm_v15
    with pytest.raises(ValueError, match="ACT_SAVE='tanh' must be None or one of"):
        hgemm_v15(512, 512, 320, ACT_SAVE="tanh")
    with pytest.raises(ValueError, match="one kernel takes one of them"):
        hgemm_v15(512, 512, 320, ACT_SAVE="gelu", ACT_GRAD="gelu")
    with pytest.raises(ValueError, match="ACT_SAVE is a Linear's forward: A_MAJOR and B_MAJOR"):
        hgemm_v15(512, 512, 320, ACT_SAVE="gelu", A_MAJOR="MN")
    with pytest.raises(ValueError, match="BIAS='float32'.*operands' dtype"):
        hgemm_v15(512, 512, 320, dtype="bfloat16", ACT_SAVE="gelu", BIAS="float32")


@pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")
@pytest.mark.parametrize("act,dtype,bias", [("gelu", "bfloat16", "bfloat16"),
                                            ("silu", "float16", False)])
def test_act_save_builds(act, dtype, bias):
    """The forward's build with ACT_SAVE compiles without spills: one HGMMA per k16 step, the
    activation once per accumulator, the bias read as 32-bit words (one per 8-column block and
    thread), Z's and D's stores through stmatrix and TMA (three stmatrix sites: Z at the tile's
    end, D in the next tile's K loop and after the last tile)."""
    from tirx_gemm.compile.api import build
    r = build("v15", 512, 512, 320, arch="sm_90a", SM_COUNT=4, dtype=dtype, CLUSTER=1,
              PDL=True, RUNTIME_M=True, ACT_SAVE=act, BIAS=bias)
    assert r.spill_stores == 0 and r.spill_loads == 0
    assert r.sass_counts.get("HGMMA.64x256x16.F32" + (".BF16" if dtype == "bfloat16" else ""),
                             0) == 4
    assert r.sass_counts.get("STSM.16.M88.4", 0) == 3 * 16  # 3 sites x 4 chunks x 4
    src = r.cuda_path.read_text()
    assert src.count(f"tirx_gemm_act_{act}(acc") == 128  # one per accumulator register
    assert src.count(f"tirx_gemm_word_lo_{dtype}(") == (1 + 32 if bias else 0)  # def + calls
