"""The public name ``tirx_gemm.torch_op``: the module :mod:`tirx_gemm.op.torch_op` itself."""
import sys

from tirx_gemm.op import torch_op as _module

sys.modules[__name__] = _module
