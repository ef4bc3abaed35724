"""Operand layouts (v15, sm_100a): K-major or MN-major A and B tiles, through TMA and tcgen05.

The twin of tirx_gemm/hopper/layouts.py. An MN-major operand is the transposed tensor, A as
(K, M), B as (K, N) row-major. Its stage tile is kept as it lies, (BLK_K, rows) in SMEM with
the same 128B-swizzled atoms (helpers.swizzled_layout: 64-element rows of 128 bytes, so a
128-row tile is two 8 KiB chunks of 64 K rows), and ``Tx.gemm_async(..., transA=True)``
(``transB``) tells TIRx's tcgen05 lowering that the buffer is [K, MN]: it reads the layout,
finds the MN-major atom, and encodes the shared-memory descriptor (LBO between MN chunks,
SBO between 8-row K groups) and the instruction descriptor's major bits (a_major / b_major =
MN) itself. TMA loads the tile in boxes one 128-byte swizzle row wide (64 MN elements).
"""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from .. import helpers as H
from ..hopper.layouts import MAJORS, check_layout_shape, check_major  # noqa: F401 (one home)


def smem_shape(depth: int, rows: int, blk_k: int, mn: bool):
    """The ring's SMEM shape of one operand: (depth, rows, blk_k) K-major, (depth, blk_k,
    rows) MN-major (the tile as the transposed tensor lies)."""
    return (depth, blk_k, rows) if mn else (depth, rows, blk_k)


@T.inline
def tma_load_operand(Xsmem, stage, X, r_st, k_st, ROWS: int, BLK_K: int, mn: bool, bar):
    # one thread: the operand's ROWS x BLK_K tile at (r_st, k_st) into stage `stage` of
    # the ring Xsmem, completing on `bar` (the caller's expect_tx counts the bytes);
    # MN-major: the transposed tensor's box X[k_st:, r_st:], one copy per 64-element chunk
    if mn:
        for c in T.unroll(ROWS // H.SWIZZLE_COLS):
            Tx.copy_async(Xsmem[stage, :, c * H.SWIZZLE_COLS:(c + 1) * H.SWIZZLE_COLS],
                          X[k_st:k_st + BLK_K,
                            r_st + c * H.SWIZZLE_COLS:r_st + (c + 1) * H.SWIZZLE_COLS],
                          dispatch=H.TMA, mbar=bar)
    else:
        Tx.copy_async(Xsmem[stage, :, :], X[r_st:r_st + ROWS, k_st:k_st + BLK_K],
                      dispatch=H.TMA, mbar=bar)


@T.inline
def expect_stage_bytes(bar, ROWS_A: int, ROWS_B: int, BLK_K: int):
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((ROWS_A + ROWS_B) * BLK_K * H.ELEM_BYTES))


@T.inline
def mma_tile_major(tmem, col, Asmem, Bsmem, BLK_N, accum, a_mn: bool, b_mn: bool):
    # W.mma_tile_at with each operand's major order: transA / transB = the buffer is [K, MN]
    Tx.gemm_async(tmem[:, col:col + BLK_N], Asmem, Bsmem, transA=a_mn, transB=b_mn,
                  accum=accum, dispatch="tcgen05", cta_group=1)
