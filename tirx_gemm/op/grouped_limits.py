"""The grouped kernel's (v14's) size limits, checked before any build or launch, one line each.

The operands v14 reads by TMA (a, b) have no size limit on sm_90a: its tensor maps take 64-bit
strides (``wide`` in steps/sm90a/hgemm_v14.py). Two limits remain: the result's bounded stores
address it with int32 element offsets (:func:`check_result_size`, every arch), and sm_100a's
twin still builds its tensor maps from int32 extents (:func:`check_twin_strides`).
"""

from __future__ import annotations

from tirx_gemm.op.keywords import INT32_MAX

__all__ = ["TWIN_STRIDE_BITS", "check_result_size", "check_twin_strides"]

# sm_100a's v14 twin: TVM computes its tensor maps' byte strides from int32 extents, an
# expert's weight N*K elements x 16 bits at compile time (refused from 2^27 elements) and a
# masked a's T*K x 2 bytes at run time (wrapping from 2^30); v14 sm_90a's extents are int64
TWIN_STRIDE_BITS = 1 << 31


def check_result_size(layout: str, M: int, N: int, E: int, what: str = "the result") -> None:
    """The result within v14's int32 store offsets: its bounded stores address D[row, col]
    (masked: D[e, row, col]) in int32 element offsets, which past 2^31-1 elements would wrap
    and write elsewhere. A one-line ValueError with the split that fits. (The operands read
    by TMA -- a, b -- have no such limit: their tensor maps take 64-bit strides.)"""
    rows = M if layout == "contiguous" else E * M
    if rows * N <= INT32_MAX:
        return
    shape = (M, N) if layout == "contiguous" else (E, M, N)
    if layout == "contiguous":
        way = (f"split a's rows into calls of at most {INT32_MAX // N} rows (each with offs "
               f"clamp(offs - first row, 0, rows))")
    elif INT32_MAX // (M * N):
        way = (f"split the experts into calls of at most {INT32_MAX // (M * N)} (a[e0:e1], "
               f"b[e0:e1], counts[e0:e1])")
    else:
        way = f"split a's T={M} rows per expert into calls of at most {INT32_MAX // N} rows"
    raise ValueError(f"{what} {shape} holds {rows * N} elements, past 2^31-1: the grouped "
                     f"kernel's stores address it with int32 offsets; {way}")


def check_twin_strides(rows: int, E: int, N: int, K: int, layout: str) -> None:
    """sm_100a's twin: the byte strides of its tensor maps within int32 (TWIN_STRIDE_BITS);
    a one-line ValueError naming the operand and the way out."""
    if N * K * 16 >= TWIN_STRIDE_BITS:
        raise ValueError(f"an expert's weight N*K = {N}*{K} = {N * K} elements: sm_100a's v14 twin "
                         f"takes fewer than 2^27 (its tensor map's expert stride is int32 "
                         f"bits); split the experts' N into parts of at most "
                         f"{(TWIN_STRIDE_BITS // 16 - 1) // K // 8 * 8} rows, one call each, or "
                         f"run on sm_90a")
    T = rows // E
    if layout == "masked" and T * K * 2 >= TWIN_STRIDE_BITS:
        raise ValueError(f"a masked a's T*K = {T}*{K} = {T * K} elements per expert: sm_100a's "
                         f"v14 twin takes fewer than 2^30 (its tensor map's expert stride is "
                         f"int32 bytes); use fewer rows per expert (T) or layout='contiguous'")
