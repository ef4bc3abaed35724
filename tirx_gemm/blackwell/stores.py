"""The epilogue stores: TMEM to GMEM, registers to swizzled SMEM to a TMA store (tile, band, box), guarded rows."""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from ..helpers import TMA, tma_store_swizzled
from .tcgen05 import tmem_to_registers


@T.inline
def epilogue_to_gmem(tmem, D, m_st, n_st, BLK_N, row, dtype):
    # TMEM -> registers -> GMEM: thread `row` of the warpgroup stores output row m_st + row
    # (`dtype`: D's dtype, what the fp32 accumulator is narrowed to)
    Dreg_out = T.alloc_local((BLK_N,), dtype)
    tmem_to_registers(tmem, 0, BLK_N, Dreg_out)
    Tx.copy(D[m_st + row, n_st:n_st + BLK_N], Dreg_out[:])


@T.inline
def store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, bar_id):
    # registers -> swizzled Dsmem -> TMA store -> GMEM; `row` is the thread's index in the
    # storing warpgroup and `bar_id` names the barrier that syncs its 128 threads. The
    # store is issued as every async copy is: by the lane `elect_sync` picks in one warp
    # (here the warpgroup's first). Rows and columns of the tile past D's edge are dropped
    # by the TMA store (tma_store_swizzled).
    Tx.copy(Dsmem[row, 0:BLK_N], Dreg_out[:])
    # generic-proxy SMEM writes must be fenced before the async proxy (TMA) reads them
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if row < 32:
        if T.cuda.elect_sync():
            tma_store_swizzled(D, Dsmem, 0, m_st, n_st, BLK_M, BLK_N)
            T.ptx.cp.async_.bulk.commit_group()
            # Dsmem may be overwritten only after the store has read it
            T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)


@T.inline
def epilogue_to_tma_store(tmem, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, bar_id, dtype):
    # TMEM -> registers (narrowed to `dtype`, D's dtype) -> swizzled Dsmem -> (one
    # thread) TMA store -> GMEM
    Dreg_out = T.alloc_local((BLK_N,), dtype)
    tmem_to_registers(tmem, 0, BLK_N, Dreg_out)
    store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, bar_id)


@T.inline
def store_row_guarded(Dreg_out, D, m, n0, COLS, M, N):
    # one thread stores its row's COLS values (a multiple of 8) straight from registers to
    # D[m, n0:n0 + COLS] in 8-column (16-byte) pieces, skipping a row past M and pieces
    # past N (N is a multiple of 8, so a piece is wholly inside D or wholly outside)
    if m < M:
        for j in T.unroll(COLS // 8):
            if n0 + j * 8 < N:
                Tx.copy(D[m, n0 + j * 8:n0 + j * 8 + 8], Dreg_out[j * 8:j * 8 + 8])


@T.inline
def store_rows_via_tma(Dreg_out, Dsmem, r0, D, m_st, n_st, BLK_M, EPI_N, row, bar_id):
    # store_tile_via_tma through rows [r0, r0 + BLK_M) of a taller staging buffer, so
    # that several epilogue warpgroups can share one Dsmem allocation (one band each)
    Tx.copy(Dsmem[r0 + row, 0:EPI_N], Dreg_out[:])
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if row < 32:
        if T.cuda.elect_sync():
            tma_store_swizzled(D, Dsmem, r0, m_st, n_st, BLK_M, EPI_N)
            T.ptx.cp.async_.bulk.commit_group()
            T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)


@T.inline
def store_rows_box_via_tma(Dout, d0, Dsmem, r0, D, m_st, n_st, BLK_M, OUT_N, row, bar_id):
    # store_rows_via_tma for a chunk of any dtype, Dout[d0:d0 + OUT_N]: OUT_N columns are
    # one 128-byte swizzle atom per row (64 16-bit or 32 fp32 values), stored as one TMA
    # box; rows and columns past D's edge are dropped by the store
    Tx.copy(Dsmem[r0 + row, 0:OUT_N], Dout[d0:d0 + OUT_N])
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if row < 32:
        if T.cuda.elect_sync():
            Tx.copy_async(D[m_st:m_st + BLK_M, n_st:n_st + OUT_N],
                          Dsmem[r0:r0 + BLK_M, 0:OUT_N], dispatch=TMA)
            T.ptx.cp.async_.bulk.commit_group()
            T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)
