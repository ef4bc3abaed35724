"""The backward pass on the GPU (marked `gpu`): every gradient of tirx_gemm.op.autograd's
matmul, linear and swiglu against torch's autograd on the same 16-bit tensors, over ragged
token counts, both 16-bit dtypes, the bias, each fused activation, SwiGLU and the main_grad
buffer.

Tolerance: ``max|ours - torch| <= TOL * max|torch|`` per gradient (both accumulate in fp32 and
round once to the 16-bit dtype; TOL as tests/test_gpu_op.py's). The backward's default path:
dgrad and wgrad on v15 reading the transposed operands in place (autograd.layout_kwargs' builds),
every other GEMM (forward, fp32 recomputes, a main_grad wgrad) on v12 with N and K at run time
(``step="v12"``, autograd.set_backward_step("v12")); test_copy_path_grads runs the layout
copies instead. ``lab/training_backward/export.py`` exports exactly the kernels these tests
call (it replays them on the CPU and records each GEMM).

Skipped without an sm_90a GPU, or without kernels (no TIRX_GEMM_BUNDLE and no TVM).
"""
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

CAP = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
TOL = 2e-2
TOKENS = (1, 7, 77, 333, 1000)  # ragged: wgrad's reduction dimension padded to 8 in the copy
LAYERS = ((256, 512, True), (512, 256, False))  # (N, K, bias)
DTYPES = (torch.bfloat16, torch.float16)
ACTS = ("relu", "gelu", "gelu_tanh", "silu")
DEVICE = "cuda"  # export_tests.py replays these tests' calls on the CPU


@pytest.fixture(autouse=True)
def _gpu():
    if CAP is None:
        pytest.skip("no CUDA GPU visible")
    if CAP != (9, 0):
        pytest.skip(f"needs an sm_90a GPU (compute capability 9.0); this one is "
                    f"{CAP[0]}.{CAP[1]}")
    if not os.environ.get("TIRX_GEMM_BUNDLE") and importlib.util.find_spec("tvm") is None:
        pytest.skip("no kernels: set TIRX_GEMM_BUNDLE or install TVM")
    from tirx_gemm.op import autograd as AG
    AG.set_backward_step("v12")
    yield
    AG.set_backward_step(None)


def _leaves(*shapes, dtype, seed=0):
    device = DEVICE
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(*s, generator=g, device=device, dtype=dtype).div_(s[-1] ** 0.25)
            .requires_grad_() for s in shapes]


def _twins(ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def _close(name, got, want):
    assert got is not None and got.shape == want.shape and got.dtype == want.dtype, name
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert err <= TOL * scale + 1e-6, f"{name}: max error {err:.3g} vs max |torch| {scale:.3g}"


def _sync():
    from tirx_gemm.matmul import synchronize
    synchronize()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N,K,bias", LAYERS)
@pytest.mark.parametrize("M", TOKENS)
def test_linear_grads(M, N, K, bias, dtype):
    from tirx_gemm.op import autograd as AG
    shapes = [(M, K), (N, K)] + ([(N,)] if bias else [])
    ours = _leaves(*shapes, dtype=dtype, seed=M)
    ref = _twins(ours)
    dy = torch.randn(M, N, device=DEVICE, dtype=dtype)
    AG.linear(*ours[:2], ours[2] if bias else None, step="v12").backward(dy)
    F.linear(*ref).backward(dy)
    _sync()
    for name, o, r in zip(("input", "weight", "bias"), ours, ref):
        _close(f"{name} M={M}", o.grad, r.grad)


@pytest.mark.parametrize("act", ACTS)
def test_activation_grads(act):
    from tirx_gemm.op import autograd as AG
    M, N, K = 77, 256, 512
    ours = _leaves((M, K), (N, K), (N,), dtype=torch.bfloat16, seed=1)
    ref = _twins(ours)
    dy = torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16)
    AG.matmul(*ours, act, step="v12").backward(dy)
    approx = "tanh" if act == "gelu_tanh" else "none"
    z = F.linear(*ref)
    {"relu": F.relu, "silu": F.silu}.get(act, lambda t: F.gelu(t, approximate=approx))(
        z).backward(dy)
    _sync()
    for name, o, r in zip(("input", "weight", "bias"), ours, ref):
        _close(f"{act} {name}", o.grad, r.grad)


# the fused activation gradient (tirx_gemm.op.act_grad: v15's ACT_GRAD): (act, dtype, bias)
FUSED_ACT_CASES = (("gelu", torch.bfloat16, True), ("gelu_tanh", torch.bfloat16, True),
                   ("silu", torch.bfloat16, True), ("gelu", torch.float16, False),
                   ("gelu_tanh", torch.float16, False), ("silu", torch.float16, False))


@pytest.mark.parametrize("build", ("cta_pair", "one_cta"))
@pytest.mark.parametrize("act,dtype,bias", FUSED_ACT_CASES, ids=str)
@pytest.mark.parametrize("M", (1, 77, 500))
def test_act_save_grads(M, act, dtype, bias, build):
    """The forward that keeps z (tirx_gemm.op.act_save: v15's ACT_SAVE writes y = act(z) and z
    from one accumulator; no forced step, so autograd takes it) and the elementwise backward
    from z: y and every gradient against torch's at TOL, ragged M, and the save kernel (not the
    recompute) is the one that ran; on v15's CTA pair (v9's build) and on one CTA (the
    backward's LAYOUT_TUNE)."""
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import act_save as AS
    from tirx_gemm.op import autograd as AG
    prev = AS.TUNE
    AS.TUNE = {} if build == "cta_pair" else dict(AG.LAYOUT_TUNE)
    try:
        _act_save_case(M, act, dtype, bias, AS, AG, AGR)
    finally:
        AS.TUNE = prev


def _act_save_case(M, act, dtype, bias, AS, AG, AGR):
    N, K = 256, 512
    ours = _leaves(*[(M, K), (N, K)] + ([(N,)] if bias else []), dtype=dtype, seed=M + 17)
    ref = _twins(ours)
    dy = torch.randn(M, N, device=DEVICE, dtype=dtype)
    saved, recomputed = [], []
    real_op, real_dz = AS.OP, AGR.dz
    AS.OP = lambda *a: saved.append(a[-1]) or real_op(*a)
    AGR.dz = lambda *a, **k: recomputed.append(1) or real_dz(*a, **k)
    try:
        y = AG.matmul(ours[0], ours[1], ours[2] if bias else None, act)
        y.backward(dy)
    finally:
        AS.OP, AGR.dz = real_op, real_dz
    approx = "tanh" if act == "gelu_tanh" else "none"
    z = F.linear(*ref)
    want = F.silu(z) if act == "silu" else F.gelu(z, approximate=approx)
    want.backward(dy)
    _sync()
    if DEVICE == "cuda":  # (the CPU replay of lab/training_backward/export.py: any path)
        assert saved == [act] and recomputed == [], (saved, recomputed)
        with torch.no_grad():  # the kept z itself: a @ b.T + bias in the operands' dtype
            _, z_kept = AS.forward(*[t.detach() for t in ours[:2]],
                                   ours[2].detach() if bias else None, act)
        _close(f"save {act} z M={M}", z_kept, z.detach())
    _close(f"save {act} y M={M}", y.detach(), want.detach())
    for name, o, r in zip(("input", "weight", "bias"), ours, ref):
        _close(f"save {act} {name} M={M}", o.grad, r.grad)


@pytest.mark.parametrize("act,dtype,bias", FUSED_ACT_CASES, ids=str)
@pytest.mark.parametrize("M", (1, 77, 500))
def test_fused_act_grad(M, act, dtype, bias):
    """The backward of act(a @ b.T + bias) with dz = dy * act'(z) formed in the recompute's
    epilogue (one kernel, ragged M: rows past M neither read nor stored; the default build,
    with ACT_GRAD_PREFETCH); every gradient against torch's at TOL, and the fused kernel is
    the one that ran."""
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import autograd as AG
    N, K = 256, 512
    ours = _leaves(*[(M, K), (N, K)] + ([(N,)] if bias else []), dtype=dtype, seed=M + 11)
    ref = _twins(ours)
    dy = torch.randn(M, N, device=DEVICE, dtype=dtype)
    ran = []
    real = AGR.kernel  # the fused kernel's loader: what it was asked for
    AGR.kernel = lambda *a: ran.append(a[:1] + a[4:6]) or real(*a)
    try:
        AG.matmul(ours[0], ours[1], ours[2] if bias else None, act, step="v12").backward(dy)
    finally:
        AGR.kernel = real
    approx = "tanh" if act == "gelu_tanh" else "none"
    z = F.linear(*ref)
    (F.silu(z) if act == "silu" else F.gelu(z, approximate=approx)).backward(dy)
    _sync()
    assert ran == [(dtype, act, bias)]
    for name, o, r in zip(("input", "weight", "bias"), ours, ref):
        _close(f"fused {act} {name} M={M}", o.grad, r.grad)


def test_swiglu_grads():
    from tirx_gemm.op import autograd as AG
    M, N, K = 77, 256, 512
    from tirx_gemm.matmul import fuse_gate_up
    a, w_gate, w_up = _leaves((M, K), (N, K), (N, K), dtype=torch.bfloat16, seed=2)
    fused = fuse_gate_up(w_gate.detach(), w_up.detach()).requires_grad_()  # marked, a leaf
    ra, rf = _twins((a, fused))
    dy = torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16)
    AG.swiglu(a, fused).backward(dy)
    v = rf.view(N // 8, 2, 8, K)
    g, u = v[:, 0].reshape(N, K), v[:, 1].reshape(N, K)
    (F.silu(F.linear(ra, g)) * F.linear(ra, u)).backward(dy)
    _sync()
    _close("swiglu input", a.grad, ra.grad)
    _close("swiglu fused weight", fused.grad, rf.grad)


@pytest.mark.parametrize("M", (7, 500))
def test_fused_swiglu_grad(M):
    """SwiGLU's backward with d gate and d up formed in the fused gate/up GEMM's epilogue (v15
    ACT_GRAD="swiglu"; test_swiglu_grads covers M=77): ragged M, both gradients against
    torch's at TOL, and the fused kernel is the one that ran."""
    from tirx_gemm.matmul import fuse_gate_up
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import autograd as AG
    N, K = 256, 512
    a, w_gate, w_up = _leaves((M, K), (N, K), (N, K), dtype=torch.bfloat16, seed=M + 9)
    fused = fuse_gate_up(w_gate.detach(), w_up.detach()).requires_grad_()
    ra, rf = _twins((a, fused))
    dy = torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16)
    ran = []
    real = AGR.kernel
    AGR.kernel = lambda *args: ran.append(args[4]) or real(*args)
    try:
        AG.swiglu(a, fused).backward(dy)
    finally:
        AGR.kernel = real
    v = rf.view(N // 8, 2, 8, K)
    (F.silu(F.linear(ra, v[:, 0].reshape(N, K))) * F.linear(ra, v[:, 1].reshape(N, K))
     ).backward(dy)
    _sync()
    assert ran == ["swiglu"]
    _close(f"fused swiglu input M={M}", a.grad, ra.grad)
    _close(f"fused swiglu weight M={M}", fused.grad, rf.grad)


def test_main_grad_accumulates():
    from tirx_gemm.op import autograd as AG
    M, N, K = 333, 256, 512
    x, w, b = _leaves((M, K), (N, K), (N,), dtype=torch.bfloat16, seed=3)
    w.main_grad = torch.zeros(N, K, device=DEVICE)
    for _ in range(2):
        AG.linear(x, w, b, step="v12").sum().backward()
    _sync()
    assert w.grad is None
    want = 2 * (torch.ones(M, N, device=DEVICE).T @ x.detach().float())
    err = (w.main_grad - want).abs().max().item()
    assert err <= 1e-3 * want.abs().max().item(), f"main_grad max error {err:.3g}"


def test_deterministic():
    from tirx_gemm.op import autograd as AG
    M, N, K = 1000, 512, 256
    grads = []
    for _ in range(2):
        x, w = _leaves((M, K), (N, K), dtype=torch.bfloat16, seed=4)
        AG.linear(x, w, step="v12").square().sum().backward()
        grads.append((x.grad, w.grad))
    _sync()
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("M", (7, 333))
def test_copy_path_grads(M):
    """dgrad and wgrad on v12 from K-major copies of the weight and the tokens (the path
    off sm_90a and for operands v15 cannot read in place)."""
    from tirx_gemm.op import autograd as AG
    N, K = 256, 512
    ours = _leaves((M, K), (N, K), (N,), dtype=torch.bfloat16, seed=5 + M)
    ref = _twins(ours)
    dy = torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16)
    AG.set_layout_step(None)
    try:
        AG.linear(*ours, step="v12").backward(dy)
    finally:
        AG.set_layout_step("v15")
    F.linear(*ref).backward(dy)
    _sync()
    for name, o, r in zip(("input", "weight", "bias"), ours, ref):
        _close(f"copies {name} M={M}", o.grad, r.grad)


# tirx_gemm.matmul on transposed views: (M, N, K); TN and TT need M % 8 == 0, TT takes any K
MATMUL_LAYOUT_CASES = ((1000, 512, 256), (64, 256, 512), (256, 512, 333))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M,N,K", MATMUL_LAYOUT_CASES)
def test_matmul_layouts(M, N, K, dtype):
    """``tirx_gemm.matmul(a, b)`` with a and b row-major (NN) or transposed views (NT, TN,
    TT): v15 reads the views in place (the NN call's kernel, remembered first for these
    shapes, refuses them and the call goes to v15); each against torch at TOL, with out=."""
    import tirx_gemm
    from tirx_gemm.op import layouts as L
    g = torch.Generator(device=DEVICE).manual_seed(M + N + K)
    at = torch.randn(K, M, generator=g, device=DEVICE, dtype=dtype)  # stored (K, M)
    bt = torch.randn(K, N, generator=g, device=DEVICE, dtype=dtype)  # stored (K, N)
    a_rm, b_rm = at.t().contiguous(), bt.t().contiguous()
    want = (a_rm.float() @ b_rm.float().T).to(dtype)
    for lay in L.LAYOUTS if K % 8 == 0 else ("TT",):
        a = at.t() if lay[0] == "T" else a_rm
        b = bt.t() if lay[1] == "T" else b_rm
        assert L.layout_of(a, b) == lay
        for _ in range(2):  # the first call of a layout, then the one after it
            got = tirx_gemm.matmul(a, b)
        out = torch.full((M, N), float("nan"), device=DEVICE, dtype=dtype)
        tirx_gemm.matmul(a, b, out=out, sync=True)
        _close(f"{lay} {M}x{N}x{K}", got, want)
        _close(f"{lay} {M}x{N}x{K} out=", out, want)


@pytest.mark.parametrize("act,dtype,bias", FUSED_ACT_CASES, ids=str)
@pytest.mark.parametrize("M", (77, 500))
def test_fused_act_grad_without_prefetch(M, act, dtype, bias):
    """The build without ACT_GRAD_PREFETCH (act_grad.PREFETCH off: dy loaded after the tile's
    last wgmma wait; test_fused_act_grad runs the default, with it): every gradient against
    torch's at TOL, ragged M."""
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import autograd as AG
    N, K = 256, 512
    ours = _leaves(*[(M, K), (N, K)] + ([(N,)] if bias else []), dtype=dtype, seed=M + 3)
    ref = _twins(ours)
    dy = torch.randn(M, N, device=DEVICE, dtype=dtype)
    default, AGR.PREFETCH = AGR.PREFETCH, False
    try:
        AG.matmul(ours[0], ours[1], ours[2] if bias else None, act, step="v12").backward(dy)
    finally:
        AGR.PREFETCH = default
    approx = "tanh" if act == "gelu_tanh" else "none"
    z = F.linear(*ref)
    (F.silu(z) if act == "silu" else F.gelu(z, approximate=approx)).backward(dy)
    _sync()
    for name, o, r in zip(("input", "weight", "bias"), ours, ref):
        _close(f"without prefetch {act} {name} M={M}", o.grad, r.grad)


# the bias gradient from the fused kernel's column sums (act_grad.DBIAS, v15's
# ACT_GRAD_DBIAS): ragged M, N past one 256-column tile (264: a second tile of 8 columns)
DBIAS_LAYER = (264, 320)  # (N, K)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ("gelu", "silu"))
@pytest.mark.parametrize("M", (1, 17, 300))
def test_fused_act_grad_dbias(M, act, dtype):
    """With act_grad.DBIAS on, the backward of act(a @ b.T + bias) takes the bias gradient
    from the kernel's 16-row column sums of dz (the kernel built with ACT_GRAD_DBIAS is the one
    that ran); every gradient, the bias's first, against torch's at TOL."""
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import autograd as AG
    N, K = DBIAS_LAYER
    ours = _leaves((M, K), (N, K), (N,), dtype=dtype, seed=M + 23)
    ref = _twins(ours)
    dy = torch.randn(M, N, device=DEVICE, dtype=dtype)
    ran = []
    real, default = AGR.kernel, AGR.DBIAS
    AGR.kernel = lambda *a, **k: ran.append(a[:1] + a[4:6] + (k.get("dbias", False),)) \
        or real(*a, **k)
    AGR.DBIAS = True
    try:
        AG.matmul(*ours, act, step="v12").backward(dy)
    finally:
        AGR.kernel, AGR.DBIAS = real, default
    z = F.linear(*ref)
    (F.silu(z) if act == "silu" else F.gelu(z)).backward(dy)
    _sync()
    assert ran == [(dtype, act, True, True)]
    for name, o, r in zip(("bias", "weight", "input"), ours[::-1], ref[::-1]):
        _close(f"dbias {act} {name} M={M}", o.grad, r.grad)


@pytest.mark.parametrize("act", ("gelu", "silu"))
@pytest.mark.parametrize("M", (1, 17, 300))
def test_dbias_partials_are_dz_row_sums(M, act):
    """The kernel's partials themselves: fp32, ceil(M/16) x N, each row the column sums of 16
    rows of the dz it stored (act_grad.dbias_partials of that dz, up to fp32 summation order:
    1e-5 of the row block's absolute sum), and dz as act_grad.reference's at TOL."""
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import autograd as AG
    N, K = DBIAS_LAYER
    a, w, bias = (t.detach() for t in _leaves((M, K), (N, K), (N,), dtype=torch.bfloat16,
                                                seed=M + 29))
    dy = torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16)
    default, AGR.DBIAS = AGR.DBIAS, True
    try:
        got = AGR.dz_dbias(a, w, dy, bias, act, AG._arch(a.device))
    finally:
        AGR.DBIAS = default
    _sync()
    assert got is not None
    dz, parts = got
    assert parts.dtype == torch.float32 and tuple(parts.shape) == ((M + 15) // 16, N)
    want = AGR.dbias_partials(dz)
    scale = AGR.dbias_partials(dz.abs())
    err = (parts - want).abs()
    assert bool((err <= 1e-5 * scale + 1e-30).all()), f"max error {err.max().item():.3g}"
    _close(f"dbias dz {act} M={M}", dz, AGR.reference(a, w, dy, bias, act).to(dz.dtype))


def test_compiled_training_step_fused_dbias():
    """torch.compile(fullgraph=True, aot_eager) of a step with gelu and act_grad.DBIAS on: the
    traced backward calls tirx_gemm::act_grad_dbias_mm (dz and the column sums as one graph
    node); loss and every gradient against torch's at TOL (test_fused_act_grad_dbias' layer,
    bf16: its kernels)."""
    from tirx_gemm.op import act_grad as AGR
    default, AGR.DBIAS = AGR.DBIAS, True
    try:
        _compiled_gelu_step(17, *DBIAS_LAYER, 5, "OP_DBIAS", "compiled dbias gelu")
    finally:
        AGR.DBIAS = default


def test_compiled_training_step_fused_act_grad():
    """torch.compile(fullgraph=True, aot_eager) of a step with gelu: the traced backward forms
    dz through tirx_gemm::act_grad_mm (the fused kernel as a graph node); loss and every
    gradient against torch's at TOL (test_activation_grads' layer: its kernels)."""
    _compiled_gelu_step(77, 256, 512, 1, "OP", "compiled fused gelu")


def _compiled_gelu_step(M, N, K, seed, op, what):
    """torch.compile(fullgraph=True, aot_eager) of gelu(x @ w.T + b).square().sum() through
    AG.matmul (step v12, bf16), its backward: traced through act_grad's op ``op`` (once, for
    gelu); loss and every gradient against torch's at TOL."""
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import autograd as AG
    ours = _leaves((M, K), (N, K), (N,), dtype=torch.bfloat16, seed=seed)
    ref = _twins(ours)
    nodes = []
    real = getattr(AGR, op)
    setattr(AGR, op, lambda *a: nodes.append(a[-1]) or real(*a))
    try:
        torch._dynamo.reset()
        loss = torch.compile(lambda x, w, b: AG.matmul(x, w, b, "gelu", step="v12").float()
                             .square().sum(), fullgraph=True, backend="aot_eager")(*ours)
        loss.backward()
    finally:
        setattr(AGR, op, real)
    want = F.gelu(F.linear(*ref)).float().square().sum()
    want.backward()
    _sync()
    assert nodes == ["gelu"]
    assert abs(loss.item() - want.item()) <= TOL * abs(want.item())
    for name, o, r in zip(("input", "weight", "bias"), ours, ref):
        _close(f"{what} {name}", o.grad, r.grad)


def test_compiled_op_on_a_transposed_view():
    """torch.compile (aot_eager, fullgraph) of torch_op.matmul on views (NT: w.T of a
    row-major (K, N) weight; TN: x.T): the fake takes them and v15 reads them in place, as
    eager tirx_gemm.matmul does; against torch at TOL."""
    from tirx_gemm.op import torch_op
    M, N, K = MATMUL_LAYOUT_CASES[0]
    g = torch.Generator(device=DEVICE).manual_seed(5)
    x = torch.randn(M, K, generator=g, device=DEVICE, dtype=torch.bfloat16)
    xt = torch.randn(K, M, generator=g, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(K, N, generator=g, device=DEVICE, dtype=torch.bfloat16)  # stored (K, N)
    torch._dynamo.reset()
    nt = torch.compile(lambda x, w: torch_op.matmul(x, w.t()), backend="aot_eager",
                       fullgraph=True)
    tn = torch.compile(lambda xt, w: torch_op.matmul(xt.t(), w.t().contiguous()),
                       backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        got_nt, got_tn = nt(x, w), tn(xt, w)
    _sync()
    _close("compiled NT", got_nt, (x.float() @ w.float()).to(torch.bfloat16))
    _close("compiled TN", got_tn, (xt.t().float() @ w.float()).to(torch.bfloat16))


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_compiled_training_step_act_save(backend):
    """torch.compile(fullgraph=True) of a step with gelu and a bias (no forced step): the traced
    forward is tirx_gemm::act_save_mm (y and the kept z from one kernel), the traced backward
    forms dz from z elementwise (no recompute node); loss and every gradient against torch's
    at TOL (test_act_save_grads' layer: its kernels)."""
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import act_save as AS
    from tirx_gemm.op import autograd as AG
    M, N, K = 77, 256, 512
    ours = _leaves((M, K), (N, K), (N,), dtype=torch.bfloat16, seed=8)
    ref = _twins(ours)
    saved, recomputed = [], []
    real_op, real_agr = AS.OP, AGR.OP
    AS.OP = lambda *a: saved.append(a[-1]) or real_op(*a)
    AGR.OP = lambda *a: recomputed.append(a[-1]) or real_agr(*a)
    try:
        torch._dynamo.reset()
        loss = torch.compile(lambda x, w, b: AG.matmul(x, w, b, "gelu").float().square().sum(),
                             fullgraph=True, backend=backend)(*ours)
        loss.backward()
    finally:
        AS.OP, AGR.OP = real_op, real_agr
    want = F.gelu(F.linear(*ref)).float().square().sum()
    want.backward()
    _sync()
    if DEVICE == "cuda":  # (the CPU replay of lab/training_backward/export.py: any path)
        assert saved == ["gelu"] and recomputed == [], (saved, recomputed)
    assert abs(loss.item() - want.item()) <= TOL * abs(want.item())
    for name, o, r in zip(("input", "weight", "bias"), ours, ref):
        _close(f"compiled {backend} save {name}", o.grad, r.grad)


@pytest.mark.parametrize("backend", ("aot_eager", "inductor"))
def test_compiled_training_step(backend):
    """torch.compile(fullgraph=True) of a Linear's training step: the forward's op and the
    traced backward's (dgrad and wgrad on tirx_gemm::layout_mm, v15 in place); the loss and
    every gradient against torch's at TOL."""
    from tirx_gemm.op import autograd as AG
    M, N, K = 77, 256, 512
    ours = _leaves((M, K), (N, K), (N,), dtype=torch.bfloat16, seed=6)
    ref = _twins(ours)

    def step(x, w, b):
        return AG.linear(x, w, b, step="v12").float().square().sum()

    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True, backend=backend)(*ours)
    loss.backward()
    want = F.linear(*ref).float().square().sum()
    want.backward()
    _sync()
    assert abs(loss.item() - want.item()) <= TOL * abs(want.item())
    for name, o, r in zip(("input", "weight", "bias"), ours, ref):
        _close(f"compiled {backend} {name}", o.grad, r.grad)


# the bias gradient beside wgrad (tirx_gemm.op.wgrad_dbias, v15's WGRAD_DBIAS): the saved-z path
# (gelu) and a Linear with no activation, ragged M, N past one 128-row tile (DBIAS_LAYER)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", (None, "gelu"))
@pytest.mark.parametrize("M", (1, 17, 300, 1000))
def test_wgrad_dbias_grads(M, act, dtype):
    """With wgrad_dbias on, wgrad's kernel (built with WGRAD_DBIAS) also gives the bias
    gradient (the kernel ran, once); every gradient, the bias's first, against torch's at TOL."""
    from tirx_gemm.op import autograd as AG
    from tirx_gemm.op import wgrad_dbias as WD
    N, K = DBIAS_LAYER
    ours = _leaves((M, K), (N, K), (N,), dtype=dtype, seed=M + 31)
    ref = _twins(ours)
    dy = torch.randn(M, N, device=DEVICE, dtype=dtype)
    ran = []
    real, default = WD.kernel, WD.ENABLED
    WD.kernel = lambda *a: ran.append(a[1:4]) or real(*a)
    WD.ENABLED = True
    try:
        AG.matmul(*ours, act).backward(dy)
    finally:
        WD.kernel, WD.ENABLED = real, default
    z = F.linear(*ref)
    (z if act is None else F.gelu(z)).backward(dy)
    _sync()
    assert ran == [(N, K, M)], ran
    for name, o, r in zip(("bias", "weight", "input"), ours[::-1], ref[::-1]):
        _close(f"wgrad_dbias {act} {name} M={M}", o.grad, r.grad)
