"""Grouped GEMM (v14, sm_100a): the tile walk is sm_90a's (tirx_gemm/hopper/grouped.py: shared
memory and CTA barriers only, nothing arch-specific), re-exported here so that the twin reads
``W.scan_experts`` / ``W.tile_at`` like sm_90a's step; the stores are the TMEM epilogue's
(one thread per accumulator row), bounded by the expert's row end; store_unit_epilogue adds
sm_90a's fused epilogue (ROW_SCALE, BIAS, SWIGLU) in fp32 before the cast, and the SWIGLU
"halves" weight tile is sm_90a's tma_load_gate_up. SCALE="mx" (block-scaled
MXFP8) adds the scale factors' loads (load_sfa_atom, tma_load_mx_unit) and re-exports fp8.py's
cta_group::1 forms (mx_sf_to_tmem, mma_tile_mx) beside them."""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm.epilogue import SWIGLU_GROUP
from ..helpers import ACC_DTYPE
from .fused import activation
from .tcgen05 import tmem_to_fp32, tmem_to_registers
from .fp8 import (  # noqa: F401 (v14 SCALE="mx" reads them from here)
    MX_SF_ATOM_BYTES, MX_SF_BOX, MX_SF_ROWS, mma_tile_mx, mx_sf_to_tmem)
from tirx_gemm.hopper.grouped import (  # noqa: F401 (the one home of the walk)
    BOUND_ROWS, E_MAX, LAYOUTS, log2_ceil, python_walk, scan_experts, tile_at, tma_load_gate_up,
    tma_load_unit, weight_shape)


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


@T.inline
def store_unit_bounded(tmem, col, D, at, tid_in_wg, dtype, COLS: int, READ: int, N, swap: bool,
                       masked: bool):
    """One epilogue thread: its accumulator row of unit ``at`` (COLS TMEM columns from ``col``,
    READ per tcgen05.ld) to D, bounded by the unit's expert: D's row at[1] + tid_in_wg from
    column at[3] (``swap``: the row is D's column at[3] + tid_in_wg, tokens from at[1])."""
    for c in T.unroll(COLS // READ):
        Dreg = T.alloc_local((READ,), dtype)
        tmem_to_registers(tmem, col + c * READ, READ, Dreg)
        if swap:
            store_column_bounded(Dreg, D, at[0], at[1] + c * READ, at[3] + tid_in_wg, READ,
                                 at[2], N, masked)
        else:
            store_row_bounded(Dreg, D, at[0], at[1] + tid_in_wg, at[3] + c * READ, READ, at[2],
                              N, masked)


# --- v14's fused epilogue (ROW_SCALE, BIAS, SWIGLU) on plain tiles: where each step runs ---
# TMEM --tcgen05.ld--> fp32 registers (one D row per thread) --bias, row scale or
# silu(gate) * up, in fp32--> one rounding to D's dtype --> store_row_bounded (below the
# expert's row end). The keywords, operands and reference are sm_90a's v14
# (hopper.grouped.grouped_epilogue_np, the host model).
@T.inline
def store_unit_epilogue(tmem, col, D, at, tid_in_wg, scale, bias, COLS: int, READ: int, N,
                        swiglu, masked: bool):
    """One epilogue thread, a plain tile: its accumulator row of unit ``at`` (COLS TMEM
    columns from ``col``, READ fp32 columns per tcgen05.ld) through the epilogue in fp32, one
    rounding, and the bounded store of D's row m = at[1] + tid_in_wg (N: D's width).
    ``swiglu`` None: (acc + bias[e, n]) * scale[m], ``bias`` (E, N) in D's dtype and
      ``scale`` (M,) float32 (masked (E, M)), either None (not applied); the reads are clamped
      below N and the expert's row end (rows and columns past them are never stored).
    "halves": gate columns [0, COLS/2), up [COLS/2, COLS) (tma_load_gate_up's two boxes) ->
      silu(gate) * up at D's columns at[3]..; "interleaved": SWIGLU_GROUP gate columns, then
      as many up columns, ... -> D's columns at[3]/2..."""
    if scale is not None:
        f = T.alloc_local((1,), ACC_DTYPE)  # this row's routing weight
        if masked:
            f[0] = scale[at[0], T.min(at[1] + tid_in_wg, at[2] - 1)]
        else:
            f[0] = scale[T.min(at[1] + tid_in_wg, at[2] - 1)]
    for c in T.unroll((COLS // 2 if swiglu == "halves" else COLS) // READ):
        acc = T.alloc_local((READ,), ACC_DTYPE)
        tmem_to_fp32(tmem, col + c * READ, READ, acc)
        if swiglu == "halves":
            up = T.alloc_local((READ,), ACC_DTYPE)
            tmem_to_fp32(tmem, col + COLS // 2 + c * READ, READ, up)
            Dout = T.alloc_local((READ,), D.dtype)
            for j in T.unroll(READ):
                Dout[j] = T.cast(activation(acc[j], "silu") * up[j], D.dtype)
            store_row_bounded(Dout, D, at[0], at[1] + tid_in_wg, at[3] + c * READ, READ, at[2],
                              N, masked)
        elif swiglu == "interleaved":
            Dout = T.alloc_local((READ // 2,), D.dtype)
            for j in T.unroll(READ // 2):
                g = T.meta_var(acc[j // SWIGLU_GROUP * 2 * SWIGLU_GROUP + j % SWIGLU_GROUP])
                u = T.meta_var(acc[j // SWIGLU_GROUP * 2 * SWIGLU_GROUP + SWIGLU_GROUP
                                   + j % SWIGLU_GROUP])
                Dout[j] = T.cast(activation(g, "silu") * u, D.dtype)
            store_row_bounded(Dout, D, at[0], at[1] + tid_in_wg, at[3] // 2 + c * (READ // 2),
                              READ // 2, at[2], N, masked)
        else:
            Dout = T.alloc_local((READ,), D.dtype)
            for j in T.unroll(READ):
                if bias is not None:
                    acc[j] = acc[j] + T.cast(bias[at[0], T.min(at[3] + c * READ + j, N - 1)],
                                             ACC_DTYPE)
                if scale is not None:
                    acc[j] = acc[j] * f[0]
                Dout[j] = T.cast(acc[j], D.dtype)
            store_row_bounded(Dout, D, at[0], at[1] + tid_in_wg, at[3] + c * READ, READ, at[2],
                              N, masked)


# --- v14 SCALE="mx": the scale factors of a unit's stage ---
# A token tile starts at any row (its expert's first row + 128 t), so its 128 rows' SFs
# straddle two 128-row atoms of SFA's blocked order: no TMA box holds them. The producer
# warp gathers them instead, each lane 16 bytes of the stage's atom; a weight tile starts
# on a multiple of 128 rows (BLK_N = 128), so its SFs are one atom of SFB: a TMA box.
@T.inline
def load_sfa_atom(SFAsmem, stage, SFA, at, k, K_TILES: int, lane, masked: bool):
    """The producer warp, every lane: stage k's UE8M0 SFs of unit ``at``'s 128 token rows
    into SFAsmem[stage] ((PIPE_DEPTH, 4, 128) uint8), one atom in tcgen05.cp's order (byte
    16 l + 4 i + j: tile row 32 i + l, SF 4 k + j), lane l its 16 bytes; each row's 4 bytes
    read from SFA's blocked order (numerics.mx_block_sf_np: row r in atom (r // 128, k) at
    byte 16 (r % 32) + 4 (r % 128 // 32)) as one 32-bit word (its offset a multiple of 4 in
    128-byte rows: SFA's base must be 4-byte aligned); masked: SFA[at[0]]. Rows at or past
    the expert's row end read nothing and get e = 127 in all 4 bytes (their outputs are never
    stored), as do rows whose atom lies past SFA's rows (a short operand is never read out of
    bounds). A proxy fence on each side: the slot's last reader was tcgen05.cp (the async
    proxy; the caller waited for its commit), and the next one is too."""
    src32 = SFA.view("uint32")      # (.., rows, 32) words: word w holds bytes 4 w .. 4 w + 3
    dst32 = SFAsmem.view("uint32")  # (PIPE_DEPTH, 4, 32)
    T.ptx.fence.proxy.async_.shared__cta()  # the previous tcgen05.cp's reads, then our writes
    for i in T.unroll(4):
        r = T.meta_var(at[1] + 32 * i + lane)
        dst_w = T.meta_var(lane % 8 * 4 + i)
        src_r = T.meta_var((r // 128 * K_TILES + k) * 4 + r % 32 // 8)
        src_w = T.meta_var(r % 8 * 4 + r % 128 // 32)
        if r < at[2] and src_r < SFA.shape[len(SFA.shape) - 2]:
            if masked:
                dst32[stage, lane // 8, dst_w] = src32[at[0], src_r, src_w]
            else:
                dst32[stage, lane // 8, dst_w] = src32[src_r, src_w]
        else:
            dst32[stage, lane // 8, dst_w] = T.uint32(0x7F7F7F7F)  # 4 bytes of e = 127
    T.ptx.fence.proxy.async_.shared__cta()  # our writes, then the next tcgen05.cp's reads


@T.inline
def tma_load_mx_unit(Asmem, Bsmem, SFBsmem, A, B, SFB, at, k, bar, BLK_M: int, BLK_K: int,
                     K_TILES: int, masked: bool):
    """One thread: the stage's byte count on ``bar`` ((BLK_M + 128) x BLK_K e4m3 and one SF
    atom; boxes past A's rows, N or K zero-filled and counted), then unit ``at``'s token rows
    A[at[1].., k BLK_K..] (masked: A[at[0], ...]), its expert's 128 weight rows
    B[at[0], at[3].., ...] and their SF atom (at[3] / 128, k) of SFB[at[0]]."""
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((BLK_M + MX_SF_ROWS) * BLK_K + MX_SF_ATOM_BYTES))
    if masked:
        Tx.copy_async(Asmem, A[at[0], at[1]:at[1] + BLK_M, k * BLK_K:(k + 1) * BLK_K],
                      dispatch="tma_explicit", mbar=bar)
    else:
        Tx.copy_async(Asmem, A[at[1]:at[1] + BLK_M, k * BLK_K:(k + 1) * BLK_K],
                      dispatch="tma_explicit", mbar=bar)
    Tx.copy_async(Bsmem, B[at[0], at[3]:at[3] + MX_SF_ROWS, k * BLK_K:(k + 1) * BLK_K],
                  dispatch="tma_explicit", mbar=bar)
    r = T.meta_var((at[3] // MX_SF_ROWS * K_TILES + k) * MX_SF_BOX[0])
    Tx.copy_async(SFBsmem, SFB[at[0], r:r + MX_SF_BOX[0], :], dispatch="tma_explicit",
                  mbar=bar)
