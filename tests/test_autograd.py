"""tirx_gemm.op.autograd on the CPU: the backward's wiring, shapes and messages.

The custom ops run on CUDA only, so these tests register, for the CPU, a reference kernel of
``tirx_gemm::matmul`` and ``tirx_gemm::swiglu`` that checks what the GPU kernels require of
their operands (2-D, contiguous, 16-byte aligned, K and N multiples of 8) and computes the
product in the operands' dtype (float64 here, so torch.autograd.gradcheck can compare the
backward with finite differences). It is registered only inside the ``cpu_kernels`` fixture.
The GPU comparison with torch's gradients: tests/test_gpu_autograd.py.
"""
import pytest
import torch
import torch.nn.functional as F

from tirx_gemm import epilogue as E
from tirx_gemm.op import autograd as AG
from tirx_gemm.op import torch_op

CALLS: list = []  # (op, a.shape, b.shape, out_dtype) of each reference-kernel call


def _check_kernel_operands(a, b):
    for name, t in (("a", a), ("b", b)):
        assert t.dim() == 2 and t.is_contiguous(), f"{name} {tuple(t.shape)} {t.stride()}"
        assert t.data_ptr() % 16 == 0, f"{name} misaligned"
    assert a.shape[1] == b.shape[1] and a.shape[1] % 8 == 0 and b.shape[0] % 8 == 0, \
        f"a {tuple(a.shape)} b {tuple(b.shape)}"


def _act(z, act):
    if act is None:
        return z
    return {"relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act](z)


def _ref_matmul(a, b, step=None, bias=None, activation=None, out_dtype=None):
    _check_kernel_operands(a, b)
    CALLS.append(("matmul", tuple(a.shape), tuple(b.shape), out_dtype))
    z = a @ b.T + (0 if bias is None else bias)
    return _act(z, activation).to(out_dtype or a.dtype)


def _ref_swiglu(a, fused, out_dtype=None):
    _check_kernel_operands(a, fused)
    CALLS.append(("swiglu", tuple(a.shape), tuple(fused.shape), out_dtype))
    g, u = _unfuse(fused)
    return (F.silu(a @ g.T) * (a @ u.T)).to(out_dtype or a.dtype)


def _unfuse(fused):
    N2, K = fused.shape
    v = fused.view(N2 // 16, 2, 8, K)
    return v[:, 0].reshape(N2 // 2, K), v[:, 1].reshape(N2 // 2, K)


@pytest.fixture
def cpu_kernels():
    """The reference kernels as the ops' CPU kernels, for one test (removed after it)."""
    CALLS.clear()
    lib = torch.library.Library("tirx_gemm", "IMPL")
    lib.impl("matmul", _ref_matmul, "CPU")
    lib.impl("swiglu", _ref_swiglu, "CPU")
    try:
        yield CALLS
    finally:
        lib._destroy()


def _rand(*shape, grad=True, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    t = torch.randn(*shape, generator=g, dtype=dtype)
    return t.requires_grad_(grad)


@pytest.mark.parametrize("M", [1, 5, 8, 13])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_gradcheck(cpu_kernels, M, bias):
    a, b = _rand(M, 16), _rand(24, 16, seed=1)
    inputs = (a, b) + ((_rand(24, seed=2),) if bias else ())
    assert torch.autograd.gradcheck(
        lambda a, b, *bi: torch_op.OP(a, b, None, bi[0] if bi else None), inputs)


@pytest.mark.parametrize("act", E.ACTIVATIONS)
def test_activation_gradcheck(cpu_kernels, act):
    a, b, bias = _rand(6, 16), _rand(16, 16, seed=1), _rand(16, seed=2)
    if act == "relu":  # keep |z| away from relu's kink, where finite differences break
        with torch.no_grad():
            z = a @ b.T + bias
            bias += torch.where(z.abs() < 1e-3, 1e-2, 0.0).amax(0)
    assert torch.autograd.gradcheck(lambda a, b, bi: AG.matmul(a, b, bi, act), (a, b, bias))


def test_swiglu_gradcheck(cpu_kernels):
    a, fused = _rand(7, 16), _rand(32, 16, seed=1)
    assert torch.autograd.gradcheck(lambda a, w: AG.swiglu(a, w), (a, fused))


def test_backward_gemms_are_k_major_and_token_padded(cpu_kernels):
    """dgrad reads b.T and wgrad dz.T, a.T: each made K-major, the tokens padded to 8."""
    a, b = _rand(13, 16), _rand(24, 16, seed=1)
    torch_op.OP(a, b).sum().backward()
    assert CALLS == [("matmul", (13, 16), (24, 16), None),      # forward
                     ("matmul", (13, 24), (16, 24), None),      # dgrad: dy @ (b.T)^T
                     ("matmul", (24, 16), (16, 16), None)]      # wgrad: 13 tokens -> 16


def test_only_the_needed_gradients_run(cpu_kernels):
    a, b = _rand(8, 16, grad=False), _rand(24, 16, seed=1)
    torch_op.OP(a, b).sum().backward()
    assert [c[1:3] for c in CALLS[1:]] == [((24, 8), (16, 8))]  # wgrad only
    assert a.grad is None and b.grad.shape == b.shape


def test_bias_and_out_dtype(cpu_kernels):
    a, b = _rand(5, 16, dtype=torch.float32), _rand(8, 16, seed=1, dtype=torch.float32)
    bias = _rand(8, seed=2, dtype=torch.float32)
    y = AG.matmul(a, b, bias, "gelu", torch.float32)
    y.square().sum().backward()
    ref = [t.detach().clone().requires_grad_() for t in (a, b, bias)]
    F.gelu(F.linear(*ref)).square().sum().backward()
    for got, want in zip((a, b, bias), ref):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-5)


def test_main_grad_accumulates_in_place(cpu_kernels):
    a = _rand(13, 16, dtype=torch.float32)
    w = torch.nn.Parameter(_rand(24, 16, seed=1, grad=False, dtype=torch.float32))
    bias = torch.nn.Parameter(_rand(24, seed=2, grad=False, dtype=torch.float32))
    w.main_grad = torch.ones(24, 16)
    bias.main_grad = torch.ones(24)
    buf = w.main_grad
    for _ in range(2):
        AG.linear(a, w, bias).sum().backward()
    assert w.grad is None and bias.grad is None and w.main_grad is buf
    dy = torch.ones(13, 24)
    torch.testing.assert_close(w.main_grad, 1 + 2 * dy.T @ a.detach())
    torch.testing.assert_close(bias.main_grad, 1 + 2 * dy.sum(0))
    assert CALLS[2][3] is torch.float32  # wgrad written in fp32


def test_main_grad_must_be_fp32():
    w = torch.nn.Parameter(torch.zeros(8, 8, dtype=torch.bfloat16))
    w.main_grad = torch.zeros(8, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must be a float32 tensor of the parameter's shape"):
        AG._main_grad(w)


def test_deterministic(cpu_kernels):
    grads = []
    for _ in range(2):
        a, b = _rand(29, 16), _rand(24, 16, seed=1)
        torch_op.OP(a, b).pow(2).sum().backward()
        grads.append((a.grad, b.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_linear_flattens_leading_dims(cpu_kernels):
    x = _rand(2, 3, 16)
    w, bias = _rand(8, 16, seed=1), _rand(8, seed=2)
    y = AG.linear(x, w, bias)
    assert y.shape == (2, 3, 8)
    y.sum().backward()
    ref = [t.detach().clone().requires_grad_() for t in (x, w, bias)]
    F.linear(*ref).sum().backward()
    for got, want in zip((x, w, bias), ref):
        torch.testing.assert_close(got.grad, want.grad)


def test_zero_tokens(cpu_kernels):
    a, b = _rand(0, 16), _rand(8, 16, seed=1)
    torch_op.OP(a, b).sum().backward()
    assert a.grad.shape == (0, 16) and torch.equal(b.grad, torch.zeros(8, 16, dtype=b.dtype))


def test_double_backward_refused(cpu_kernels):
    a, b = _rand(8, 16), _rand(8, 16, seed=1)
    y = torch_op.OP(a, b).sum()
    with pytest.raises(RuntimeError, match="has no double backward"):
        torch.autograd.grad(y, a, create_graph=True)


def test_fp8_requires_grad_refused():
    a = torch.zeros(8, 16).to(torch.float8_e4m3fn)
    try:
        a.requires_grad_()
    except RuntimeError:
        pytest.skip("this torch refuses requires_grad on float8 tensors itself")
    with pytest.raises(TypeError, match="float8 GEMM has no backward"):
        AG.matmul(a, torch.zeros(8, 16))


def test_linear_shape_messages():
    with pytest.raises(ValueError, match="last dimension must be the weight's in_features 16"):
        AG.linear(torch.zeros(4, 8), torch.zeros(8, 16))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        AG.linear(torch.zeros(4, 8), torch.zeros(8))


def test_backward_step_setting():
    with pytest.raises(ValueError, match="backward step 'v9'"):
        AG.set_backward_step("v9")
    AG.set_backward_step("v12")
    try:
        assert AG._step(torch.device("cpu")) is None  # v12 only on sm_90a
    finally:
        AG.set_backward_step(None)


def test_layout_copy_bytes():
    # 13 tokens pad to 16: 2 bytes x (read + write) x (24*16 + 16*24 + 16*16)
    assert AG.layout_copy_bytes(13, 24, 16) == 4 * (384 + 384 + 256)


def test_reference_kernel_off_outside_the_fixture():
    with pytest.raises(Exception):
        torch_op.OP(torch.zeros(8, 8, dtype=torch.bfloat16), torch.zeros(8, 8,
                                                                         dtype=torch.bfloat16))


def _fake_layout_kernel(monkeypatch, seen):
    """autograd's v15 kernel replaced by a CPU product that records its operands, the GPU
    said to be sm_90a."""
    def fake_kernel(dtype, rows_a, rows_b, red, a_mn, b_mn, device, tune=None):
        def run(a, b, out):
            seen.append((a_mn, b_mn, tuple(a.shape), tuple(b.shape), a.data_ptr(), b.data_ptr()))
            out.copy_((a.T if a_mn else a) @ (b.T if b_mn else b).T)
        return run

    monkeypatch.setattr(AG, "_layout_kernel", fake_kernel)
    monkeypatch.setattr(AG, "_arch", lambda device: "sm_90a")


def test_layout_step_reads_the_operands_in_place(cpu_kernels, monkeypatch):
    """By default on sm_90a, dgrad reads b and wgrad reads dz and a as they are stored
    (MN-major on v15, no copy, tokens unpadded); the gradients are unchanged."""
    seen = []
    _fake_layout_kernel(monkeypatch, seen)
    assert AG.LAYOUT_STEP == "v15"
    a, b = _rand(13, 16), _rand(24, 16, seed=1)
    torch_op.OP(a, b).pow(2).sum().backward()
    assert [s[:4] for s in seen] == [(False, True, (13, 24), (24, 16)),   # dgrad: dz, b
                                     (True, True, (13, 24), (13, 16))]    # wgrad: dz, a
    assert seen[0][5] == b.data_ptr() and seen[1][5] == a.data_ptr()     # no copies
    ref = [t.detach().clone().requires_grad_() for t in (a, b)]
    F.linear(*ref).pow(2).sum().backward()
    torch.testing.assert_close(a.grad, ref[0].grad)
    torch.testing.assert_close(b.grad, ref[1].grad)
    assert len(CALLS) == 1  # the forward only: no K-major copy went through matmul


def test_layout_step_setting():
    with pytest.raises(ValueError, match="layout step 'v9'"):
        AG.set_layout_step("v9")


def test_compiled_training_step(cpu_kernels):
    """torch.compile(fullgraph=True) traces linear's forward and the registered backward
    (AOTAutograd, aot_eager: the op stays one node each way); the gradients equal eager's."""
    bf = torch.bfloat16
    w = torch.randn(24, 16, dtype=bf, requires_grad=True)
    bias = torch.randn(24, dtype=bf, requires_grad=True)
    x = torch.randn(13, 16, dtype=bf, requires_grad=True)

    def step(x):
        return AG.linear(x, w, bias).float().relu().sum()

    torch.compile(step, fullgraph=True, backend="aot_eager")(x).backward()
    compiled = [t.grad.clone() for t in (x, w, bias)]
    for t in (x, w, bias):
        t.grad = None
    step(x).backward()
    for got, t in zip(compiled, (x, w, bias)):
        torch.testing.assert_close(got, t.grad)


def test_layout_step_off_copies(cpu_kernels, monkeypatch):
    """set_layout_step(None): the K-major copies on sm_90a too, no v15 call."""
    seen = []
    _fake_layout_kernel(monkeypatch, seen)
    a, b = _rand(13, 16), _rand(24, 16, seed=1)
    AG.set_layout_step(None)
    try:
        torch_op.OP(a, b).sum().backward()
    finally:
        AG.set_layout_step("v15")
    assert seen == [] and len(CALLS) == 3  # forward, dgrad and wgrad through matmul


def test_layout_readable():
    """What v15 reads in place (else the GEMM takes the copy path): contiguous, 16-byte
    aligned, rows of a multiple of 8 elements."""
    t = torch.zeros(16, 24, dtype=torch.bfloat16)
    assert AG._layout_readable(t)
    assert not AG._layout_readable(t.t())                                 # strided
    assert not AG._layout_readable(torch.zeros(16, 12, dtype=torch.bfloat16))  # 24-byte rows
    assert not AG._layout_readable(t.view(-1)[1:97].view(4, 24))          # 2 bytes on


def test_main_grad_wgrad_copies_dgrad_in_place(cpu_kernels, monkeypatch):
    """A main_grad weight: wgrad on the copy path (fp32 out, added in place), dgrad on v15."""
    seen = []
    _fake_layout_kernel(monkeypatch, seen)
    a, b = _rand(13, 16), _rand(24, 16, seed=1)
    b.main_grad = torch.zeros(24, 16, dtype=torch.float32)
    torch_op.OP(a, b).pow(2).sum().backward()
    assert [s[:2] for s in seen] == [(False, True)] and b.grad is None
    ref = [t.detach().clone().requires_grad_() for t in (a, b)]
    F.linear(*ref).pow(2).sum().backward()
    torch.testing.assert_close(b.main_grad, ref[1].grad.float(), atol=2e-2, rtol=2e-2)


def test_layout_kwargs_and_shape():
    """The backward's v15 builds: LAYOUT_TUNE over the step's defaults, and for wgrad (both
    MN-major) the token count at run time, built and found at the nominal K; an explicit
    tune is taken as given ({}: the lesson's)."""
    from tirx_gemm import registry
    from tirx_gemm.op.keywords import NOMINAL_K
    st = registry.get("v15", "sm_90a")
    dgrad = AG.layout_kwargs(st, "bfloat16", 132, False, True)
    assert dgrad["B_MAJOR"] == "MN" and dgrad["RUNTIME_M"] and "RUNTIME_K" not in dgrad
    assert all(dgrad[k] == v for k, v in AG.LAYOUT_TUNE.items())
    assert AG.layout_shape(256, 512, 1000, dgrad) == (256, 512, 1000)
    wgrad = AG.layout_kwargs(st, "bfloat16", 132, True, True)
    assert wgrad["RUNTIME_K"] and AG.layout_shape(256, 512, 1000, wgrad) == (256, 512, NOMINAL_K)
    lesson = AG.layout_kwargs(st, "bfloat16", 132, True, True, {})
    assert "CLUSTER" not in lesson and AG.layout_shape(256, 512, 1000, lesson) == (256, 512, 1000)
    assert AG.layout_kwargs(st, "bfloat16", 132, False, True, {"RUNTIME_K": True})["RUNTIME_K"]


def test_compiled_training_step_reads_the_operands_in_place(cpu_kernels, monkeypatch):
    """torch.compile(fullgraph=True) of a training step on sm_90a (said to be): the traced
    backward runs dgrad and wgrad through the op tirx_gemm::layout_mm (v15 in place, a graph
    node each) where eager calls the kernel; the gradients equal eager's and torch's."""
    seen = []
    _fake_layout_kernel(monkeypatch, seen)
    nodes = []
    real = AG.LAYOUT_OP
    monkeypatch.setattr(AG, "LAYOUT_OP", lambda *a: nodes.append(a[2:]) or real(*a))
    bf = torch.bfloat16
    w = torch.randn(24, 16, dtype=bf, requires_grad=True)
    x = torch.randn(13, 16, dtype=bf, requires_grad=True)

    def step(x):
        return AG.linear(x, w).float().square().sum()

    torch.compile(step, fullgraph=True, backend="aot_eager")(x).backward()
    assert nodes == [(False, True), (True, True)]  # dgrad (b MN-major), wgrad (both)
    assert [s[:2] for s in seen] == [(False, True), (True, True)]  # the op ran v15
    compiled = [t.grad.clone() for t in (x, w)]
    for t in (x, w):
        t.grad = None
    step(x).backward()
    ref = [t.detach().clone().requires_grad_() for t in (x, w)]
    F.linear(*ref).float().square().sum().backward()
    for got, t, r in zip(compiled, (x, w), ref):
        torch.testing.assert_close(got, t.grad)
        torch.testing.assert_close(got, r.grad, atol=0.1, rtol=2e-2)


def test_the_public_callable_is_differentiable(cpu_kernels):
    """tirx_gemm.matmul(a, b, bias=...) records its call through the op while autograd records
    (grad mode on, an operand requiring grad): its gradients are torch's; out= is refused."""
    import tirx_gemm
    a, b, bias = _rand(13, 16), _rand(24, 16, seed=1), _rand(24, seed=2)
    tirx_gemm.matmul(a, b, bias=bias).sum().backward()
    got = [t.grad.clone() for t in (a, b, bias)]
    for t in (a, b, bias):
        t.grad = None
    F.linear(a, b, bias).sum().backward()
    for g, t in zip(got, (a, b, bias)):
        torch.testing.assert_close(g, t.grad)
    assert [c[0] for c in CALLS] == ["matmul"] * 3  # forward, dgrad, wgrad on the op
    with pytest.raises(ValueError, match=r"^out= records no gradient: drop out=") as info:
        tirx_gemm.matmul(a, b, out=torch.empty(13, 24, dtype=a.dtype))
    assert "\n" not in str(info.value)


def test_main_grad_under_torch_compile_is_refused_or_run_eagerly(cpu_kernels):
    """The traced backward cannot see main_grad: fullgraph refuses it with the one-line reason
    (inside dynamo's report); without fullgraph the call runs eagerly and main_grad gets the
    gradient, as in eager mode."""
    bf = torch.bfloat16
    x = torch.randn(13, 16, dtype=bf, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(24, 16, dtype=bf))
    w.main_grad = torch.zeros(24, 16)

    def step(x):
        return AG.linear(x, w).float().sum()

    with pytest.raises(Exception, match=r"weight has a main_grad: tirx_gemm accumulates into "
                                        r"main_grad in eager mode only"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    torch._dynamo.reset()
    torch.compile(step, backend="aot_eager")(x).backward()
    assert w.grad is None
    want = torch.ones(13, 24).T @ x.detach().float()
    torch.testing.assert_close(w.main_grad, want, rtol=2e-2, atol=2e-2)


def test_importing_the_layers_registers_the_backward():
    """tirx_gemm.nn alone (no tirx_gemm.torch_op) registers the op's Autograd kernel."""
    import subprocess
    import sys
    code = ("import torch, tirx_gemm.nn; print(torch._C._dispatch_has_kernel_for_dispatch_key("
            "'tirx_gemm::matmul', 'Autograd'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.stdout.strip() == "True", out.stderr[-2000:]
