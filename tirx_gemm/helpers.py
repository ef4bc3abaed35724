"""Shared TIRx building blocks for every step (both arches).

The steps hold only their lesson; everything they share lives here: argument
validation, shared-memory layouts, barrier init, TMEM setup/teardown (sm_100a) and
the epilogues. This is also the one place that absorbs TIRx API churn: the
0.27.0.post1 spellings of PTX intrinsics are wrapped here once.

Python-level helpers (validation, layouts) run when a builder is called.
``@T.inline`` helpers are expanded into the kernel body at the call site, so the
generated CUDA is the same as if the code had been written inline.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.tirx.layout import S, TCol, TileLayout, TLane, tid_in_wg
from tvm.backend.cuda.tile_primitive.tma_utils import SwizzleMode, mma_shared_layout

# D = A @ B.T: fp16 operands, fp32 accumulation, fp16 output.
AB_DTYPE = "float16"
ACC_DTYPE = "float32"
F16_BYTES = 2
SUPPORTED_DTYPES = ("float16",)


# --------------------------------------------------------------------------------------
# argument validation: every builder calls these before it builds anything
# --------------------------------------------------------------------------------------
def check_dtype(dtype: str) -> None:
    if str(dtype) not in SUPPORTED_DTYPES:
        raise ValueError(
            f"dtype={dtype!r} is not supported: these steps compute fp16 x fp16 -> fp32 "
            f"accumulate -> fp16 (dtype must be one of {SUPPORTED_DTYPES})"
        )


def check_positive_ints(**dims: int) -> None:
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}={value!r} must be a Python int")
        if value <= 0:
            raise ValueError(f"{name}={value} must be positive")


def check_multiple(name: str, value: int, tile_name: str, tile: int) -> None:
    if value % tile != 0:
        raise ValueError(f"{name}={value} is not a multiple of {tile_name}={tile}")


def check_tiled_shape(M: int, N: int, K: int, BLK_M: int, BLK_N: int, BLK_K: int,
                      dtype: str = AB_DTYPE) -> None:
    """The common contract of all steps: positive ints, fp16, whole tiles only."""
    check_dtype(dtype)
    check_positive_ints(M=M, N=N, K=K)
    check_multiple("M", M, "BLK_M", BLK_M)
    check_multiple("N", N, "BLK_N", BLK_N)
    check_multiple("K", K, "BLK_K", BLK_K)


def check_equal(name: str, value: int, expected: int, why: str) -> None:
    if value != expected:
        raise ValueError(f"{name}={value} must equal {expected}: {why}")


# --------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------
def swizzled_layout(shape, dtype: str = AB_DTYPE):
    """128B-swizzled K-major SMEM layout, consumable by both TMA and the tensor cores."""
    return mma_shared_layout(tvm.DataType(dtype), SwizzleMode.SWIZZLE_128B_ATOM, tuple(shape))
