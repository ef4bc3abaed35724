"""The public name ``tirx_gemm.matmul``: the module :mod:`tirx_gemm.op.matmul` itself, callable.

``tirx_gemm.matmul(a, b, ...)`` is differentiable: while autograd records the call (grad mode
on, and a, b or the bias requires grad) it runs :func:`tirx_gemm.op.autograd.matmul` (the torch
custom op and the backward registered for it: dgrad and wgrad on the kernels), else
:func:`tirx_gemm.op.matmul.matmul` directly, as before. Importing it imports neither torch nor
TVM; the autograd module is imported at the first recorded call."""
import sys

from tirx_gemm.op import matmul as _module


class _DifferentiableModule(type(_module)):
    """``tirx_gemm.matmul(a, b)``: recorded calls through the autograd op, the others direct
    (one attribute read per operand on that path: it is the inference hot path)."""

    def __call__(self, a, b, *args, **kw):
        try:
            rec = a.requires_grad or b.requires_grad
        except AttributeError:  # not tensors: the direct call says what is wrong
            rec = False
        if (rec or (args or kw) and getattr(args[0] if args else kw.get("bias"),
                                            "requires_grad", False)) \
                and sys.modules["torch"].is_grad_enabled():
            return _recorded(a, b, *args, **kw)
        return _module.matmul(a, b, *args, **kw)


def _recorded(a, b, bias=None, activation=None, out_dtype=None, *, step=None, out=None,
              sync=False):
    """The call through tirx_gemm.op.autograd.matmul (the op and its registered backward)."""
    if out is not None:
        raise ValueError("out= records no gradient: drop out= to train through "
                         "tirx_gemm.matmul, or pass it under torch.no_grad()")
    from tirx_gemm.op import autograd
    y = autograd.matmul(a, b, bias, activation, out_dtype, step=step)
    if sync:
        _module.synchronize(a.device, what="tirx_gemm.matmul")
    return y


_module.__class__ = _DifferentiableModule
sys.modules[__name__] = _module
