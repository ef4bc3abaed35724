"""The public name ``tirx_gemm.matmul``: the module :mod:`tirx_gemm.op.matmul` itself, callable.

``tirx_gemm.matmul(a, b, ...)`` is differentiable: while autograd records the call (grad mode
on, and a, b or the bias requires grad) it runs :func:`tirx_gemm.op.autograd.matmul` (the torch
custom op and the backward registered for it: dgrad and wgrad on the kernels), else
:func:`tirx_gemm.op.matmul.matmul` directly, as before. Importing it imports neither torch nor
TVM; the autograd module is imported at the first recorded call."""
import sys

from tirx_gemm.op import matmul as _module


def _records(*tensors) -> bool:
    """True when autograd records a call with these operands (torch is imported by then)."""
    if not any(getattr(t, "requires_grad", False) for t in tensors):
        return False
    return sys.modules["torch"].is_grad_enabled()


class _DifferentiableModule(type(_module)):
    """``tirx_gemm.matmul(a, b)``: recorded calls through the autograd op, the others direct."""

    def __call__(self, a, b, bias=None, activation=None, out_dtype=None, *, step=None,
                 out=None, sync=False):
        if not _records(a, b, bias):
            return _module.matmul(a, b, bias, activation, out_dtype, step=step, out=out,
                                  sync=sync)
        if out is not None:
            raise ValueError("out= records no gradient: drop out= to train through "
                             "tirx_gemm.matmul, or pass it under torch.no_grad()")
        from tirx_gemm.op import autograd
        y = autograd.matmul(a, b, bias, activation, out_dtype, step=step)
        if sync:
            _module.synchronize()
        return y


_module.__class__ = _DifferentiableModule
sys.modules[__name__] = _module
