"""``torch.ops.tirx_gemm.matmul``: tirx_gemm.matmul as a PyTorch custom op.

Importing this module registers the op ``tirx_gemm::matmul(Tensor a, Tensor b, str? step=None)
-> Tensor`` with ``torch.library.custom_op``: its implementation is
:func:`tirx_gemm.matmul.matmul` (``a @ b.T`` for 2-D CUDA fp16/bf16 tensors, asynchronous: it
returns once the kernel is queued), and its fake (meta) implementation returns an empty
``(M, N)`` tensor of ``a``'s dtype after the checks that need no data (tensor type, dtype,
2-D, the shared K, N and K multiples of 8, contiguity), each a one-line TypeError or
ValueError as in eager mode. With it, ``torch.compile(model, fullgraph=True)`` traces a model
that calls :func:`matmul` without a graph break (the op is one node of the graph, run as is
by inductor), ``torch.export`` exports it, and CUDA graphs (``torch.cuda.graph`` or
``mode="reduce-overhead"``) capture its launch.

**Two paths, one function.** The dispatcher of a custom op costs microseconds per call
(measured by ``scripts/bench_overhead.py``), as much as the whole launch of a small GEMM. So
:func:`matmul` here, the function models call, checks ``torch.compiler.is_compiling()``:

* while torch.compile / torch.export traces it, it returns ``torch.ops.tirx_gemm.matmul(a,
  b)``, so the graph holds the op (dynamo cannot trace the launch itself);
* in eager mode (and inside ``torch.cuda.graph`` capture, which is eager) it calls
  ``tirx_gemm.matmul.matmul(a, b)`` directly: the same kernel, checks and errors, without
  the dispatcher.

Both paths give the same result; call ``torch.ops.tirx_gemm.matmul`` (or :data:`OP`)
yourself to force the dispatcher path. ``tirx_gemm.matmul(a, b)`` (the callable module) is
the eager direct path; dynamo cannot call a module object, so code that torch.compile traces
calls this module's :func:`matmul` or uses :class:`tirx_gemm.nn.Linear`.

Not autograd-aware, like tirx_gemm.matmul: the op has no backward; inputs that require grad
are refused while grad mode is on (tirx_gemm.nn.Linear falls back to torch's F.linear then).
"""

from __future__ import annotations

from typing import Optional

import torch

from tirx_gemm.matmul import ROW_MULTIPLE
from tirx_gemm.matmul import matmul as _matmul

__all__ = ["matmul", "OP", "check_fake"]

NAME = "tirx_gemm::matmul"
_DTYPES = (torch.float16, torch.bfloat16)


@torch.library.custom_op(NAME, mutates_args=())
def _op(a: torch.Tensor, b: torch.Tensor, step: Optional[str] = None) -> torch.Tensor:
    return _matmul(a, b, step=step, sync=False)


def check_fake(a, b) -> None:
    """The checks of tirx_gemm.matmul.check_operands that need no data and no device: one
    line, TypeError for a type or dtype, ValueError for a shape or layout. Run by the fake
    implementation, so a traced model fails where the eager one would."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}: matmul takes torch.float16 or "
                            f"torch.bfloat16 (convert with {name}.half() or {name}.bfloat16())")
    if b.dtype != a.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}: the operands must share one dtype")
    if a.device != b.device:
        raise ValueError(f"the operands are on {a.device} and {b.device}: put them on one GPU")
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)} (flatten the "
                             f"leading dimensions: {name}.reshape(-1, {name}.shape[-1]))")
    (M, K), (N, Kb) = a.shape, b.shape
    if Kb != K:
        raise ValueError(f"a is {M}x{K} but b is {N}x{Kb}: matmul computes a @ b.T, so both "
                         f"need the same number of columns K (b is out-features x in-features, "
                         f"like a Linear weight)")
    for name, v in (("K", K), ("N", N)):
        if v % ROW_MULTIPLE:
            raise ValueError(f"{name}={v} is not a multiple of {ROW_MULTIPLE}: TMA needs row "
                             f"strides of a multiple of 16 bytes; pad {name} with zeros")
    for name, t in (("a", a), ("b", b)):
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous (strides {t.stride()}): the kernels' "
                             f"TMA descriptors take compact rows; pass {name}.contiguous()")


@_op.register_fake
def _fake(a, b, step=None):
    check_fake(a, b)
    return a.new_empty((a.shape[0], b.shape[0]))


OP = torch.ops.tirx_gemm.matmul.default  # the op's overload, looked up once


def matmul(a, b, *, step: str | None = None, out=None):
    """``a @ b.T`` (``F.linear(a, b)`` without bias) for 2-D CUDA fp16/bf16 tensors, usable
    in a model that torch.compile traces: the op ``torch.ops.tirx_gemm.matmul`` while tracing,
    ``tirx_gemm.matmul.matmul`` directly in eager mode (see the module docstring).

    ``step`` and ``out`` as in tirx_gemm.matmul.matmul; while tracing, ``out`` gets a copy of
    the op's result (the op itself is functional). Asynchronous: returns once the kernel is
    queued; ``tirx_gemm.matmul.synchronize()`` waits with the project's hang guard."""
    if torch.compiler.is_compiling():
        y = OP(a, b, step)
        if out is None:
            return y
        out.copy_(y)
        return out
    return _matmul(a, b, step=step, out=out, sync=False)
