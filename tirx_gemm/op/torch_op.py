"""``torch.ops.tirx_gemm.matmul``: tirx_gemm.matmul as a PyTorch custom op.

Importing this module registers the op ``tirx_gemm::matmul(Tensor a, Tensor b, str? step=None,
Tensor? bias=None, str? activation=None, ScalarType? out_dtype=None) -> Tensor`` (the fused
epilogue's arguments as in tirx_gemm.matmul.matmul; the fake returns ``(M, N)`` in
``out_dtype`` or a's dtype after the bias and activation checks) and
``tirx_gemm::swiglu(Tensor a, Tensor fused, ScalarType? out_dtype=None) -> Tensor``
(tirx_gemm.matmul.swiglu over a fused gate/up weight; the fake returns ``(M, rows/2)``)
with ``torch.library.Library`` (one Python kernel per call; see _LIB): its implementation is
:func:`tirx_gemm.matmul.matmul` (``a @ b.T`` for 2-D CUDA fp16/bf16 tensors, asynchronous: it
returns once the kernel is queued), and its fake (meta) implementation returns an empty
``(M, N)`` tensor of ``a``'s dtype after the checks that need no data (tensor type, dtype,
2-D, the shared K, N and K multiples of 8, contiguity), each a one-line TypeError or
ValueError as in eager mode. With it, ``torch.compile(model, fullgraph=True)`` traces a model
that calls :func:`matmul` without a graph break (the op is one node of the graph, run as is
by inductor), ``torch.export`` exports it, and CUDA graphs (``torch.cuda.graph`` or
``mode="reduce-overhead"``) capture its launch.

**Two paths, one function.** The dispatcher adds one boxed Python call per call (the op is
registered with ``torch.library.Library``, not ``custom_op``, whose three Python kernels cost
several times more; lab/serving_stacks measures both against F.linear). So :func:`matmul`
here, the function models call, checks ``torch.compiler.is_compiling()``:

* while torch.compile / torch.export traces it, it returns ``torch.ops.tirx_gemm.matmul(a,
  b)``, so the graph holds the op (dynamo cannot trace the launch itself);
* in eager mode (and inside ``torch.cuda.graph`` capture, which is eager) it calls
  ``tirx_gemm.matmul.matmul(a, b)`` directly: the same kernel, checks and errors, without
  the dispatcher.

Both paths give the same result; call ``torch.ops.tirx_gemm.matmul`` (or :data:`OP`)
yourself to force the dispatcher path. ``tirx_gemm.matmul(a, b)`` (the callable module) is
the eager direct path; dynamo cannot call a module object, so code that torch.compile traces
calls this module's :func:`matmul` or uses :class:`tirx_gemm.nn.Linear`.

The backward is tirx_gemm.op.autograd's, registered through :func:`register_autograd`: a call
that records no gradient costs one boxed Python call, not the two of torch.library.register_autograd
(lab/serving_stacks measures both on a GPU host). This module's
eager :func:`matmul` runs the kernel directly and refuses inputs that require grad while grad mode
is on; the differentiable calls are ``tirx_gemm.matmul(a, b)`` and ``tirx_gemm.nn.Linear``.
"""

from __future__ import annotations

from typing import Optional

import torch

from tirx_gemm import epilogue as E
from tirx_gemm.op.matmul import check_bias, epilogue_kwargs
from tirx_gemm.op import layouts as _layouts
from tirx_gemm.op.operands import _dtype_name, _gpu_arch, check_layout
from tirx_gemm.op.matmul import matmul as _matmul
from tirx_gemm.op.matmul import swiglu as _swiglu

__all__ = ["matmul", "swiglu", "OP", "SWIGLU_OP", "check_fake", "register_autograd"]

NAME = "tirx_gemm::matmul"
SWIGLU_NAME = "tirx_gemm::swiglu"


# Registered with torch.library.Library, not torch.library.custom_op: custom_op wraps the
# implementation in three Python kernels (autograd, ADInplaceOrView, the backend's aliasing
# check), each a boxed call from the dispatcher; here the dispatcher makes one, to the
# CompositeExplicitAutograd kernel below (every backend: a CPU tensor gets matmul's one-line
# refusal); its Autograd kernel is the backward of tirx_gemm.op.autograd (:func:`register_autograd`,
# loaded with tirx_gemm.torch_op and tirx_gemm.nn). The fake (meta) kernels are register_fake's.
_LIB = torch.library.Library("tirx_gemm", "DEF")
_LIB.define("matmul(Tensor a, Tensor b, str? step=None, Tensor? bias=None, str? activation=None, "
            "ScalarType? out_dtype=None) -> Tensor")
_LIB.define("swiglu(Tensor a, Tensor fused, ScalarType? out_dtype=None) -> Tensor")


def _op(a, b, step=None, bias=None, activation=None, out_dtype=None):
    if bias is None and activation is None and out_dtype is None:
        return _matmul(a, b, step=step, sync=False)
    return _matmul(a, b, bias, activation, out_dtype, step=step, sync=False)


def _swiglu_op(a, fused, out_dtype=None):
    return _swiglu(a, fused=fused, out_dtype=out_dtype, sync=False)


_LIB.impl("matmul", _op, "CompositeExplicitAutograd")
_LIB.impl("swiglu", _swiglu_op, "CompositeExplicitAutograd")


def check_fake(a, b, epilogue: bool = False, step: str | None = None) -> None:
    """The checks of tirx_gemm.matmul.check_operands that need no data and no device: one
    line, TypeError for a type or dtype, ValueError for a shape or layout. Run by the fake
    implementation, so a traced model fails where the eager one would. A transposed view (a
    or b ``x.T`` of a row-major x: NT, TN, TT) passes where eager tirx_gemm.matmul takes it
    (tirx_gemm.op.layouts: v15 reads it in place on sm_90a), unless ``epilogue`` (the fused
    epilogues and swiglu read K-major operands only; so does a forced ``step`` but v15)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if a.device != b.device:
        raise ValueError(f"the operands are on {a.device} and {b.device}: put them on one GPU")
    if _layouts.has_transposed(a, b) and _layouts.layout_of(a, b) is not None:
        _check_view(a, b, epilogue)
        _layouts.check_view_step(step, _layouts.layout_of(a, b))
    else:
        check_layout(a, b)


def _check_view(a, b, epilogue: bool) -> None:
    """check_layout's checks for a call with a transposed view: dtype, rank and K as there,
    then the layout's own rule (layouts.check_shape: TMA's row rule per operand, no epilogue,
    sm_90a: the arch of a visible GPU, else the one that reads views)."""
    for name, t in (("a", a), ("b", b)):
        if _dtype_name(t) is None:
            raise TypeError(f"{name} has dtype {t.dtype}: matmul takes torch.float16 or "
                            f"torch.bfloat16 (convert with {name}.half() or {name}.bfloat16())")
    if b.dtype != a.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}: the operands (and out) must "
                        f"share one dtype")
    (M, K), (N, Kb) = a.shape, b.shape  # both 2-D: layout_of found a layout
    if Kb != K:
        raise ValueError(f"a is {M}x{K} but b is {N}x{Kb}: matmul computes a @ b.T, so both "
                         f"need the same number of columns K")
    arch = _layouts.ARCH
    if a.device.type == "cuda" and torch.cuda.is_available():
        arch = _gpu_arch(a.device)[0]
    _layouts.check_shape(M, N, K, _layouts.layout_of(a, b), arch,
                         {"epilogue": True} if epilogue else None)


def _result_dtype(a, bias, activation, out_dtype, swiglu=False):
    """The output dtype of a call, after the epilogue arguments' checks (one line each)."""
    epi = epilogue_kwargs(bias, activation, out_dtype, swiglu, str(a.dtype).removeprefix(
        "torch."))
    return torch.float32 if epi.get("OUT_DTYPE") == "float32" else a.dtype


@torch.library.register_fake(NAME, lib=_LIB)
def _fake(a, b, step=None, bias=None, activation=None, out_dtype=None):
    check_fake(a, b, bias is not None or activation is not None or out_dtype is not None, step)
    dt = _result_dtype(a, bias, activation, out_dtype)
    if bias is not None:
        check_bias(bias, b.shape[0], a.device)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=dt)


@torch.library.register_fake(SWIGLU_NAME, lib=_LIB)
def _swiglu_fake(a, fused, out_dtype=None):
    check_fake(a, fused, epilogue=True)
    if fused.shape[0] % (2 * E.SWIGLU_GROUP):
        raise ValueError(f"fused has {fused.shape[0]} rows: a fused gate/up weight "
                         f"(fuse_gate_up) has 2N rows, N a multiple of {E.SWIGLU_GROUP}")
    dt = _result_dtype(a, None, None, out_dtype, swiglu=True)
    return a.new_empty((a.shape[0], fused.shape[0] // 2), dtype=dt)


OP = torch.ops.tirx_gemm.matmul.default  # the op's overload, looked up once
_is_compiling = torch.compiler.is_compiling
SWIGLU_OP = torch.ops.tirx_gemm.swiglu.default


# A backward registered with torch.library.register_autograd puts torch's Python autograd kernel
# in front of the op: every call, gradient or not, then runs it and redispatches into the op's
# kernel, a second boxed Python call (about 5 us on a 2-core host, 9 on a GPU host). The kernel
# register_autograd below answers a call that records no gradient itself: where the next kernel
# after autograd would be the op's own implementation (plain CUDA tensors: no tensor subclass,
# fake tensor, mode or functionalization in the key set, and no kernel registered for the op at
# CUDA itself; decided once per key set, so a CUDA kernel registered after the first call is
# not seen) it runs that implementation directly; every other call takes torch's generated one.
def _matmul_kernel(generated, plain, direct):
    """The Autograd kernel of tirx_gemm::matmul (see register_autograd): ``plain`` maps a key
    set's raw bits to whether the op's own kernel comes next after autograd (``direct``
    decides a key set not seen before)."""
    grad_on = torch._C.is_grad_enabled

    def kernel(keyset, a, b, step=None, bias=None, activation=None, out_dtype=None):
        if (plain.get(keyset.raw_repr()) or direct(keyset)) and not (grad_on() and (
                a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad))):
            if bias is None and activation is None and out_dtype is None:
                return _matmul(a, b, step=step, sync=False)
            return _matmul(a, b, bias, activation, out_dtype, step=step, sync=False)
        return generated(keyset, a, b, step, bias, activation, out_dtype)
    return kernel


def _swiglu_kernel(generated, plain, direct):
    """The Autograd kernel of tirx_gemm::swiglu (see register_autograd)."""
    grad_on = torch._C.is_grad_enabled

    def kernel(keyset, a, fused, out_dtype=None):
        if (plain.get(keyset.raw_repr()) or direct(keyset)) and not (grad_on() and (a.requires_grad or fused.requires_grad)):
            return _swiglu(a, fused=fused, out_dtype=out_dtype, sync=False)
        return generated(keyset, a, fused, out_dtype)
    return kernel


_KERNELS = {NAME: (OP, _matmul_kernel), SWIGLU_NAME: (SWIGLU_OP, _swiglu_kernel)}
# where the op's own implementation (the CompositeExplicitAutograd kernel) serves the call; a
# kernel registered for the op at that key itself (a test's CPU reference kernel) is honoured
_BACKEND_KEYS = (torch._C.DispatchKey.CUDA,)


def register_autograd(name: str, backward, *, setup_context) -> None:
    """``torch.library.register_autograd(name, backward, setup_context=...)`` for this module's
    ops (:data:`NAME`, :data:`SWIGLU_NAME`), with the op's per-call cost kept where no gradient
    is recorded (grad mode off or no input requiring grad, plain tensors): the same backward
    and setup_context, the same results. On a torch without the pieces the fast path needs,
    it is torch.library.register_autograd itself."""
    if name not in _KERNELS:
        raise ValueError(f"register_autograd: {name!r} is not one of {sorted(_KERNELS)}")
    op, make = _KERNELS[name]
    C = torch._C
    try:
        from torch._library.autograd import Info, make_autograd_impl
        after = C._after_autograd_keyset
        C.DispatchKeySet.raw_repr  # noqa: B018 (present on every torch this runs on)
    except (ImportError, AttributeError):
        torch.library.register_autograd(name, backward, setup_context=setup_context, lib=_LIB)
        return
    plain: dict = {}  # key set (raw) -> whether the op's own kernel comes next after autograd

    def direct(keyset) -> bool:  # a key set not seen before (or one that is not plain)
        raw = keyset.raw_repr()
        if raw not in plain:
            key = (keyset & after).highestPriorityTypeId()
            plain[raw] = key in _BACKEND_KEYS and not C._dispatch_has_kernel_for_dispatch_key(
                name, key.name)
        return plain[raw]

    kernel = make(make_autograd_impl(op, Info(backward, setup_context)), plain, direct)
    try:  # replaces an earlier registration (torch.library.register_autograd's, or this one's)
        _LIB.impl(name.split("::")[1], kernel, "Autograd", with_keyset=True, allow_override=True)
    except TypeError:  # a torch whose Library.impl has no allow_override: it always replaces
        _LIB.impl(name.split("::")[1], kernel, "Autograd", with_keyset=True)


def matmul(a, b, bias=None, activation: str | None = None, out_dtype=None, *,
           step: str | None = None, out=None):
    """``a @ b.T`` (``F.linear(a, b)`` without bias) for 2-D CUDA fp16/bf16 tensors, usable
    in a model that torch.compile traces: the op ``torch.ops.tirx_gemm.matmul`` while tracing,
    ``tirx_gemm.matmul.matmul`` directly in eager mode (see the module docstring).

    ``step`` and ``out`` as in tirx_gemm.matmul.matmul (eagerly, an ``out`` overlapping an
    input is refused there); while tracing, ``out`` gets a copy of the op's result (the op
    itself is functional, so the copy lands after every input was read: fake tensors have no
    addresses to compare). Asynchronous: returns once the kernel is
    queued; ``tirx_gemm.matmul.synchronize()`` waits with the project's hang guard."""
    if _is_compiling():
        y = OP(a, b, step, bias, activation, out_dtype)
        if out is None:
            return y
        out.copy_(y)
        return out
    if bias is None and activation is None and out_dtype is None:
        return _matmul(a, b, step=step, out=out, sync=False)
    return _matmul(a, b, bias, activation, out_dtype, step=step, out=out, sync=False)


def swiglu(a, fused, *, out_dtype=None):
    """``silu(a @ w_gate.T) * (a @ w_up.T)`` from the fused weight
    (tirx_gemm.matmul.fuse_gate_up), usable under torch.compile like :func:`matmul`: the op
    ``torch.ops.tirx_gemm.swiglu`` while tracing, tirx_gemm.matmul.swiglu in eager mode."""
    if _is_compiling():
        return SWIGLU_OP(a, fused, out_dtype)
    return _swiglu(a, fused=fused, out_dtype=out_dtype, sync=False)

