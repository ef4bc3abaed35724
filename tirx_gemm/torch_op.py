"""The public name ``tirx_gemm.torch_op``: the module :mod:`tirx_gemm.op.torch_op` itself, with
the ops registered beside it loaded: the backward of ``torch.ops.tirx_gemm.matmul`` and
``swiglu`` (:mod:`tirx_gemm.op.autograd`) and ``torch.ops.tirx_gemm.grouped_mm``
(:mod:`tirx_gemm.op.moe`, also ``tirx_gemm.torch_op.grouped_mm``)."""
import sys

from tirx_gemm.op import autograd as _autograd  # noqa: F401 (registers the backward)
from tirx_gemm.op import moe as _moe
from tirx_gemm.op import torch_op as _module

_module.grouped_mm, _module.GROUPED_OP = _moe.grouped_mm, _moe.OP
sys.modules[__name__] = _module
