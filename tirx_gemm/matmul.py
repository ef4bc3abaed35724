"""The public name ``tirx_gemm.matmul``: the module :mod:`tirx_gemm.op.matmul` itself."""
import sys

from tirx_gemm.op import matmul as _module

sys.modules[__name__] = _module
