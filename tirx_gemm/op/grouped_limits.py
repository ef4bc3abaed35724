"""The grouped kernel's (v14's) size limits, checked before any build or launch, one line each.

An expert's weight has no size limit: both arches' v14 build its tensor map from int64 extents
where its stride needs them (``weight_shape`` in tirx_gemm/hopper/grouped.py). Two limits
remain, on every arch: the result's bounded stores address it with int32 element offsets
(:func:`check_result_size`), and a masked a's expert stride (T x K at run time) is computed in
int32 bytes on the host (:func:`check_masked_stride`). And what ``TIRX_GEMM_CHECK=1`` adds before
each launch, bf16 and fp8 alike (:func:`checking`): :func:`check_routing` reads offs / counts.
"""

from __future__ import annotations

from tirx_gemm import settings
from tirx_gemm.op.keywords import INT32_MAX

__all__ = ["INT32_STRIDE_BITS", "CHECK_ENV", "check_result_size", "check_masked_stride",
           "checking", "check_routing"]

CHECK_ENV = "TIRX_GEMM_CHECK"

# TVM computes a tensor map's strides from the extents in their type: with int32 ones a product
# this large overflows -- an expert's weight N*K elements x 16 bits at compile time (v14's
# WIDE_FROM_BITS, the same bound, widens it) and a masked a's T*K x element bytes on the host
# at run time (both arches)
INT32_STRIDE_BITS = 1 << 31


def check_result_size(layout: str, M: int, N: int, E: int, what: str = "the result") -> None:
    """The result within v14's int32 store offsets: its bounded stores address D[row, col]
    (masked: D[e, row, col]) in int32 element offsets, which past 2^31-1 elements would wrap
    and write elsewhere. A one-line ValueError with the split that fits."""
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


def check_masked_stride(T: int, K: int, elem_bytes: int) -> None:
    """A masked a (E, T, K): its expert stride T*K*elem_bytes within int32 (the host computes it
    in int32 at run time: past it the stride would wrap and the kernel read elsewhere); a
    one-line ValueError with the way out."""
    limit = INT32_STRIDE_BITS  # the host's int32 product counts bytes here, not bits
    if T * K * elem_bytes >= limit:
        raise ValueError(f"a masked a's T*K = {T}*{K} = {T * K} elements per expert is "
                         f"{T * K * elem_bytes} bytes, past the grouped kernel's int32 expert "
                         f"stride (2^31 bytes); use at most {(limit - 1) // (K * elem_bytes)} "
                         f"rows per expert (T) or layout='contiguous'")


def checking() -> bool:
    """Whether TIRX_GEMM_CHECK asks for the checks that sync (off while the setting is not
    declared in tirx_gemm/settings.py, as tirx_gemm.op.fp8 reads it)."""
    return CHECK_ENV in settings.TABLE and bool(settings.get(CHECK_ENV))


def check_routing(p, offs=None, counts=None) -> None:
    """The checks that read offs / counts (a sync), one-line ValueErrors: what
    ``TIRX_GEMM_CHECK=1`` adds before each launch of grouped_mm, bf16 and fp8 alike (``p``:
    a tirx_gemm.op.grouped.Problem; its M, E and K are read)."""
    import torch
    if offs is not None:
        o = offs.detach().to("cpu", torch.int64)
        prev = torch.cat([o.new_zeros(1), o[:-1]])
        bad = (o < prev).nonzero()
        if o.numel() and int(o[0]) < 0:
            raise ValueError(f"offs[0]={int(o[0])} is negative: offs are cumulative row ends, "
                             f"0 <= offs[0] <= ... <= offs[-1] <= {p.M} (a's rows)")
        if bad.numel():
            e = int(bad[0])
            raise ValueError(f"offs decreases at expert {e} (offs[{e - 1}]={int(o[e - 1])} > "
                             f"offs[{e}]={int(o[e])}): offs are cumulative row ends, "
                             f"non-decreasing (torch.cumsum of the counts)")
        if o.numel() and int(o[-1]) > p.M:
            raise ValueError(f"offs[-1]={int(o[-1])} is past a's {p.M} rows: the last expert "
                             f"would read rows that do not exist")
    if counts is not None:
        c = counts.detach().to("cpu", torch.int64)
        bad = ((c < 0) | (c > p.M)).nonzero()
        if bad.numel():
            e = int(bad[0])
            raise ValueError(f"counts[{e}]={int(c[e])} is outside 0..{p.M} (the rows per expert "
                             f"of a, shape {(p.E, p.M, p.K)})")
