"""Grouped GEMM (v14, sm_100a): the tile walk is sm_90a's (tirx_gemm/hopper/grouped.py: shared
memory and CTA barriers only, nothing arch-specific), re-exported here so that the twin reads
``W.scan_experts`` / ``W.tile_at`` like sm_90a's step; the stores are the TMEM epilogue's
(one thread per accumulator row), bounded by the expert's row end."""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm.hopper.grouped import (  # noqa: F401 (the one home of the walk)
    BOUND_ROWS, E_MAX, LAYOUTS, log2_ceil, python_walk, scan_experts, tile_at, tma_load_unit)


@T.inline
def store_row_bounded(Dreg_out, D, e, m, n0, COLS: int, row_end, N, masked: bool):
    """One thread: its row's COLS values (a multiple of 8) -> D[m, n0:n0 + COLS] (masked:
    D[e, m, ...]) in 16-byte pieces, only if the row is below its expert's row_end, pieces
    past N skipped (N is a multiple of 8: a piece lies wholly inside D or wholly outside)."""
    if m < row_end:
        for j in T.unroll(COLS // 8):
            if n0 + j * 8 < N:
                if masked:
                    Tx.copy(D[e, m, n0 + j * 8:n0 + j * 8 + 8], Dreg_out[j * 8:j * 8 + 8])
                else:
                    Tx.copy(D[m, n0 + j * 8:n0 + j * 8 + 8], Dreg_out[j * 8:j * 8 + 8])


@T.inline
def store_column_bounded(Dcol, D, e, m0, n, ROWS: int, row_end, N, masked: bool):
    """Swap-AB, one thread: its accumulator row is D's column n (a weight row); its ROWS
    values go to D[m0 + j, n] (masked: D[e, ...]), 2 bytes each, only tokens below the
    expert's row_end and a column below N."""
    if n < N:
        for j in T.unroll(ROWS):
            if m0 + j < row_end:
                if masked:
                    D[e, m0 + j, n] = Dcol[j]
                else:
                    D[m0 + j, n] = Dcol[j]
