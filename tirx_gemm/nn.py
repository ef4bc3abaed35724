"""The public name ``tirx_gemm.nn``: the module :mod:`tirx_gemm.op.nn` itself."""
import sys

from tirx_gemm.op import nn as _module

sys.modules[__name__] = _module
