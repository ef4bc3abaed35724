"""The activation gradient in one kernel: ``dz = dy * act'(a @ b.T + bias)`` for the backward
of a fused-epilogue call ``y = act(a @ b.T + bias)`` (tirx_gemm.op.autograd).

Without it the backward recomputes ``z`` with one GEMM writing fp32 (M x N x 4 bytes), then
torch forms ``act'(z)`` and ``dy * act'(z)`` in several elementwise passes over M x N. With
it, v15 built with ``ACT_GRAD`` (steps/sm90a/hgemm_v15.py; the verbs in
tirx_gemm/hopper/layouts.py) recomputes ``z`` in its accumulators, loads ``dy`` at each
accumulator's place in the epilogue, and stores ``dz`` in the operands' dtype: one kernel,
reading dy once and writing dz once. gelu, gelu_tanh and silu (relu needs no GEMM: its mask
is ``y > 0``); sm_90a; a and b as the forward saved them (row-major, K-major). ``act =
"swiglu"``: the backward of tirx_gemm::swiglu, b the fused gate/up weight (2N rows), dy
M x N, dz M x 2N (d gate and d up interleaved as the fused weight's rows).

:func:`dz` returns None where the fused kernel does not apply (another arch or device,
another activation, dy or bias not in the operands' dtype, a shape or layout the
kernel cannot read), and the caller keeps the GEMM + elementwise path. A dy the kernel cannot
read as it lies (strided, as loss.sum()'s expanded ones) is copied first. A compiled training
step keeps the fused kernel: the traced backward calls it through the op
``torch.ops.tirx_gemm.act_grad_mm`` (:data:`OP`). :data:`ENABLED` turns
it off everywhere (the A/B of lab/training_backward). :data:`PREFETCH` (on): gelu, gelu_tanh
and silu load dy before the tile's last wgmma wait (v15's ``ACT_GRAD_PREFETCH``), the
decision of lab/training_backward; SwiGLU's build loads it after.

:data:`DBIAS` (off: built and compiled, never yet run on a GPU): where the bias needs a
gradient, the kernel is built with v15's ``ACT_GRAD_DBIAS`` and also writes the column sums of
each 16 rows of the dz it stores (fp32, ceil(M/16) x N, no atomics: :func:`dz_dbias`), and
autograd takes the bias gradient as their ``sum(0)`` instead of a pass over all of dz
(``dz.sum(0)``); deterministic, equal to it up to fp32 summation order. Eager and traced
alike: the traced backward calls the op ``torch.ops.tirx_gemm.act_grad_dbias_mm``
(:data:`OP_DBIAS`, two outputs). It applies on the recompute path only (the forward that keeps
z, tirx_gemm.op.act_save, has no fused backward kernel), for gelu, gelu_tanh and silu.
"""

from __future__ import annotations

import torch

from tirx_gemm.op.launch_site import new_cache

__all__ = ["ENABLED", "ACTS", "SWIGLU", "OP", "OP_DBIAS", "DBIAS", "DBIAS_ROWS", "set_enabled",
           "kwargs", "request", "applies", "dz", "dz_dbias", "kernel", "reference",
           "dbias_partials"]

ENABLED = True
PREFETCH = True  # v15's ACT_GRAD_PREFETCH (dy loaded under the last wgmmas) for ACTS, not SwiGLU
ACTS = ("gelu", "gelu_tanh", "silu")  # hopper/layouts.ACT_GRADS (that module imports TVM)
SWIGLU = "swiglu"  # act for tirx_gemm::swiglu's backward: b the fused gate/up weight
DBIAS = False  # v15's ACT_GRAD_DBIAS: the bias gradient from the kernel's column sums (not yet run)
# dz rows per row of those sums: hopper/layouts.DBIAS_ROWS (that module imports TVM)
DBIAS_ROWS = 16
_DTYPES = (torch.float16, torch.bfloat16)
_kernels: dict = new_cache()  # (N, K, act, dtype, bias, device, bundle, PREFETCH, dbias) -> kernel


def set_enabled(on: bool) -> None:
    """Fused activation gradients on (the default) or off (the GEMM + elementwise path)."""
    global ENABLED
    if not isinstance(on, bool):
        raise TypeError(f"set_enabled({on!r}): True or False")
    ENABLED = on


def kwargs(step, dtype: str, sm_count: int, act: str, bias: bool,
           prefetch: bool | None = None, dbias: bool = False) -> dict:
    """v15's build keywords for the fused activation gradient: the backward's build
    (layouts.layout_kwargs with LAYOUT_TUNE, both operands K-major, M at run time), K fixed,
    ``ACT_GRAD`` and, with a bias, ``BIAS`` = the operands' dtype; ``ACT_GRAD_PREFETCH``
    where ``prefetch`` (None: :data:`PREFETCH`) and ``act`` is one of :data:`ACTS` (v15 has
    no SwiGLU build of it); ``ACT_GRAD_DBIAS`` where ``dbias`` (v15 refuses it without a
    bias or with SwiGLU)."""
    from tirx_gemm.op.layouts import LAYOUT_TUNE, layout_kwargs
    kw = {**layout_kwargs(step, dtype, sm_count, False, False, LAYOUT_TUNE), "ACT_GRAD": act}
    if bias:
        kw["BIAS"] = dtype
    if act in ACTS and (PREFETCH if prefetch is None else prefetch):
        kw["ACT_GRAD_PREFETCH"] = True
    if dbias:
        kw["ACT_GRAD_DBIAS"] = True
    return kw


def request(M: int, N: int, K: int, dtype: str, act: str, bias: bool,
            sm_count: int | None = None, arch: str = "sm_90a", prefetch: bool | None = None,
            dbias: bool = False):
    """The bundle.export request (step, build shape, kwargs) of the kernel :func:`dz` loads,
    or with ``dbias`` the one :func:`dz_dbias` loads (``sm_count`` None: the arch's,
    tirx_gemm.spec)."""
    from tirx_gemm import registry, spec
    from tirx_gemm.op.keywords import build_shape
    sm_count = spec.SM_COUNT[arch] if sm_count is None else sm_count
    st = registry.get("v15", arch)
    kw = kwargs(st, dtype, sm_count, act, bias, prefetch, dbias)
    return st, build_shape((M, N, K), kw), kw


def kernel(dtype, M: int, N: int, K: int, act: str, bias: bool, device, dbias: bool = False):
    """The loaded kernel ``fn(a, b, dz, dy_words, bias_words)`` (bias_words only with a
    bias; with ``dbias`` also the fp32 column sums after them), the one :func:`request` names,
    kept per (N, K, act, dtype, bias, device, dbias): matmul's loader (build cache or bundle)
    and its arch probe."""
    from tirx_gemm.op import matmul as MM
    bundle = MM.bundle_path()
    key = (N, K, act, dtype, bias, device, bundle, PREFETCH, dbias)
    hit = _kernels.get(key)
    if hit is None:
        arch, sm_count = MM._gpu_arch(device)
        st, _, kw = request(M, N, K, str(dtype).removeprefix("torch."), act, bias, sm_count,
                            arch, dbias=dbias)
        hit = _kernels[key] = MM._load(st, (M, N, K), kw).kernel
    return hit


def _readable(t, traced: bool) -> bool:
    return t.is_contiguous() and (traced or t.data_ptr() % 16 == 0)  # traced: no data pointer


def applies(a, b, dy, bias, act, arch: str | None, traced: bool = False) -> bool:
    """Whether :func:`dz` runs the fused kernel for these tensors (module docstring) on a GPU
    of ``arch`` (autograd._arch's answer; None: not a GPU); ``traced``: fake tensors."""
    if not ENABLED or act not in ACTS + (SWIGLU,) or a.dtype not in _DTYPES \
            or dy.dtype != a.dtype or b.dtype != a.dtype \
            or (bias is not None and (bias.dtype != a.dtype or act == SWIGLU)):
        return False
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N % (16 if act == SWIGLU else 8) or K % 8 or M * N >= 2 ** 31 \
            or dy.shape != (M, N // 2 if act == SWIGLU else N):
        return False  # (the kernel indexes dy's words with 32-bit integers)
    if arch != "sm_90a":
        return False
    return all(_readable(t, traced) for t in (a, b) + (() if bias is None else (bias,)))


def dz(a, b, dy, bias, act, arch: str | None, traced: bool = False):
    """``dy * act'(a @ b.T + bias)`` (M x N, a's dtype) from the fused kernel, or None where
    it does not apply (:func:`applies`; ``arch`` and ``traced`` as there). While torch.compile
    traces the backward (``traced``: fake tensors), the op :data:`OP` instead: one graph node
    that runs the kernel."""
    return _fused(a, b, dy, bias, act, arch, traced, False)


def dz_dbias(a, b, dy, bias, act, arch: str | None, traced: bool = False):
    """(dz, partials) from the kernel built with ``ACT_GRAD_DBIAS``: dz as :func:`dz`'s,
    partials fp32 (ceil(M/16), N), row r the column sums of dz's rows 16r .. 16r + 15 as
    stored (so ``partials.sum(0)`` is the bias gradient); or None where it does not apply:
    :data:`DBIAS` off, no bias, SwiGLU, or where :func:`dz` would not run. While
    torch.compile traces the backward, the op :data:`OP_DBIAS`."""
    if not DBIAS or bias is None or act not in ACTS:
        return None
    return _fused(a, b, dy, bias, act, arch, traced, True)


def _fused(a, b, dy, bias, act, arch, traced: bool, dbias: bool):
    if not applies(a, b, dy, bias, act, arch, traced):
        return None
    if not _readable(dy, traced):  # e.g. the expanded ones of loss.sum()'s backward
        dy = dy.contiguous() if not dy.is_contiguous() else dy.clone()
    if traced:
        return (OP_DBIAS if dbias else OP)(a, b, dy, bias, act)
    return (_run_dbias if dbias else _run)(a, b, dy, bias, act)


def _run(a, b, dy, bias, act):
    M, K = a.shape
    N = b.shape[0]
    fn = kernel(a.dtype, M, N, K, act, bias is not None, a.device)
    out = dy.new_empty((M, N))  # SwiGLU: dy is M x N/2, dz M x N (the fused weight's rows)
    words = (dy.view(torch.int32),) + (() if bias is None else (bias.view(torch.int32),))
    fn(a, b, out, *words)
    return out


def _partials_shape(M, N):
    return ((M + DBIAS_ROWS - 1) // DBIAS_ROWS, N)


def _run_dbias(a, b, dy, bias, act):
    M, K = a.shape
    N = b.shape[0]
    fn = kernel(a.dtype, M, N, K, act, True, a.device, dbias=True)
    out = dy.new_empty((M, N))
    parts = dy.new_empty(_partials_shape(M, N), dtype=torch.float32)  # the kernel writes all
    fn(a, b, out, dy.view(torch.int32), bias.view(torch.int32), parts)
    return out, parts


# tirx_gemm::act_grad_mm(a, b, dy, bias, act): the fused kernel as a graph node. AOTAutograd
# traces the backward with fake tensors, where a direct kernel call has no data and becomes no
# node; so under tracing :func:`dz` calls this op (its fake gives dz's shape) and a compiled
# training step keeps the fused kernel. No backward (double backward is refused before it).
_LIB = torch.library.Library("tirx_gemm", "FRAGMENT")
_LIB.define("act_grad_mm(Tensor a, Tensor b, Tensor dy, Tensor? bias, str act) -> Tensor")
_LIB.impl("act_grad_mm", _run, "CompositeExplicitAutograd")


@torch.library.register_fake("tirx_gemm::act_grad_mm", lib=_LIB)
def _act_grad_mm_fake(a, b, dy, bias, act):
    M, K = a.shape
    cols = b.shape[0] // 2 if act == SWIGLU else b.shape[0]
    if b.shape[1] != K or tuple(dy.shape) != (M, cols) or act not in ACTS + (SWIGLU,):
        raise ValueError(f"act_grad_mm: a {tuple(a.shape)}, b {tuple(b.shape)}, dy "
                         f"{tuple(dy.shape)}, act {act!r}: dy must be (a rows, b rows; half "
                         f"for swiglu), one K, act one of {', '.join(ACTS + (SWIGLU,))}")
    return dy.new_empty((M, b.shape[0]))


OP = torch.ops.tirx_gemm.act_grad_mm.default

# tirx_gemm::act_grad_dbias_mm(a, b, dy, bias, act) -> (dz, partials): the same for
# :func:`dz_dbias` (gelu, gelu_tanh, silu with a bias); no backward either.
_LIB.define("act_grad_dbias_mm(Tensor a, Tensor b, Tensor dy, Tensor bias, str act) "
            "-> (Tensor, Tensor)")
_LIB.impl("act_grad_dbias_mm", _run_dbias, "CompositeExplicitAutograd")


@torch.library.register_fake("tirx_gemm::act_grad_dbias_mm", lib=_LIB)
def _act_grad_dbias_mm_fake(a, b, dy, bias, act):
    M, K = a.shape
    N = b.shape[0]
    if b.shape[1] != K or tuple(dy.shape) != (M, N) or tuple(bias.shape) != (N,) \
            or act not in ACTS:
        raise ValueError(f"act_grad_dbias_mm: a {tuple(a.shape)}, b {tuple(b.shape)}, dy "
                         f"{tuple(dy.shape)}, bias {tuple(bias.shape)}, act {act!r}: dy must "
                         f"be (a rows, b rows), bias (b rows,), one K, act one of "
                         f"{', '.join(ACTS)}")
    return dy.new_empty((M, N)), dy.new_empty(_partials_shape(M, N), dtype=torch.float32)


OP_DBIAS = torch.ops.tirx_gemm.act_grad_dbias_mm.default


def reference(a, b, dy, bias, act):
    """dz in fp32 by torch (the CPU stand-ins of the tests and of the lab's replay): dy *
    act'(a @ b.T + bias), or SwiGLU's interleaved (d gate, d up)."""
    z = a.float() @ b.float().T + (0 if bias is None else bias.float())
    d = dy.float()
    if act == SWIGLU:
        M, N2 = z.shape
        v = z.view(M, N2 // 16, 2, 8)
        g, u = v[:, :, 0], v[:, :, 1]
        s = torch.sigmoid(g)
        d = d.view(M, N2 // 16, 8)
        return torch.stack((d * u * s * (1 + g * (1 - s)), d * g * s), dim=2).reshape(M, N2)
    z.requires_grad_(True)
    with torch.enable_grad():
        f = {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
             "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act]
        f(z).backward(d)
    return z.grad


def dbias_partials(dz):
    """The partials :func:`dz_dbias`'s kernel writes, by torch (the CPU stand-ins of the tests
    and of the lab's replay): fp32 (ceil(M/16), N), row r the sum of dz's rows 16r .. 16r + 15
    (rows past M 0)."""
    M, N = dz.shape
    rows = _partials_shape(M, N)[0]
    pad = dz.float().new_zeros((rows * DBIAS_ROWS, N))
    pad[:M] = dz.float()
    return pad.view(rows, DBIAS_ROWS, N).sum(1)
