"""The public name ``tirx_gemm.nn``: the module :mod:`tirx_gemm.op.nn` itself, with the layers
that live beside it: ``Fp8Linear`` and ``patch(model, fp8=...)`` (:mod:`tirx_gemm.op.fp8_nn`),
``Experts`` and ``patch_moe`` (:mod:`tirx_gemm.op.moe`)."""
import sys

from tirx_gemm.op import fp8_nn as _fp8_nn
from tirx_gemm.op import moe as _moe
from tirx_gemm.op import nn as _module

_module.Fp8Linear, _module.patch_fp8 = _fp8_nn.Fp8Linear, _fp8_nn.patch_fp8
_module.Experts, _module.MoEReport, _module.patch_moe = _moe.Experts, _moe.MoEReport, _moe.patch_moe
sys.modules[__name__] = _module
