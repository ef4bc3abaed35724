"""Operand layouts (v15): K-major or MN-major A and B tiles, through TMA and the wgmma descriptors.

An operand is K-major when each of its rows (an A row of M, a B row of N) is contiguous along
K in global memory: A (M, K) and B (N, K) row-major, what every step before v15 reads. It is
MN-major when it is stored transposed: A as (K, M), B as (K, N) row-major, i.e. ``x.T`` of a
row-major tensor, as dgrad's ``W`` and wgrad's ``X`` and ``dY`` come.

SMEM, 128B swizzle, 16-bit elements, one K step of 64:

* K-major (v9's tile): ``rows`` rows of 128 B (64 K elements), 8-row swizzle atoms of 1 KiB;
  descriptor LBO unused (1), SBO 1 KiB between 8-row groups; a k16 slice starts 32 B on.
* MN-major: ``rows // 64`` chunks, each 64 K rows of 128 B (64 MN elements), the same 8-row
  swizzle atoms (the TMA box of one chunk is 64 MN x 64 K of the transposed tensor, so TMA
  writes exactly this). Descriptor: SBO 1 KiB between 8-K-row groups, LBO 8 KiB between
  64-element MN chunks (an m64nNk16 wgmma of N > 64 spans N / 64 chunks), and a k16 slice
  starts 16 rows = 2 KiB on. The wgmma's transpose bit (imm-trans-a / imm-trans-b = 1) tells
  the tensor core the operand is MN-major; 16-bit types only (fp8 wgmma takes K-major only).

Both layouts put a 64-row (or 64-column) block 8 KiB on, so a consumer's A block and the
m64 step of the descriptor are the same for either major order.

Global memory: an MN-major operand's rows are its MN extent, so TMA's 16-byte row rule asks
that M (A) or N (B) be a multiple of 8 instead of K; K is then the outer dimension (any K:
a box past K is zero-filled).
"""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from .. import helpers as H
from .. import timeline as TL
from .wgmma import (DESC_K16_STEP, DESC_LBO, DESC_M64_STEP, DESC_SBO, ELEM_BYTES,
                    SWIZZLE_128B, SWIZZLE_ROW_ELEMS, WGMMA_K, wgmma_name)

MAJORS = ("K", "MN")
MN_CHUNK = SWIZZLE_ROW_ELEMS            # MN elements in one 128-byte row of an MN-major tile
DESC_MN_SBO = (8 * 128) >> 4            # 1 KiB between 8-K-row groups = 64
DESC_MN_LBO = (SWIZZLE_ROW_ELEMS * 128) >> 4  # 8 KiB between 64-element MN chunks = 512
DESC_MN_K16_STEP = (WGMMA_K * 128) >> 4  # 16 K rows of 128 B = 2 KiB = 128


def check_major(name: str, value) -> bool:
    """True for "MN", False for "K"; a one-line ValueError otherwise."""
    if value not in MAJORS:
        raise ValueError(f"{name}={value!r}: an operand is 'K'-major (rows contiguous along "
                         f"K, the default) or 'MN'-major (stored transposed, (K, rows))")
    return value == "MN"


def check_layout_shape(M: int, N: int, K: int, dtype: str, a_mn: bool, b_mn: bool) -> None:
    """helpers.check_edge_shape for either major order: N a multiple of 8 (D's rows); K a
    multiple of 8 only while an operand is K-major (its rows are then K elements); M a
    multiple of 8 when A is MN-major (check_mn_rows). Any K when both are MN-major: K is
    then every operand's outer dimension, and TMA zero-fills a box past it."""
    H.check_dtype(dtype)
    H.check_positive_ints(M=M, N=N, K=K)
    for name, value, rule in (("N", N, True), ("K", K, not (a_mn and b_mn))):
        if rule and value % 8:
            raise ValueError(f"{name}={value} is not a multiple of 8: TMA needs every row of "
                             f"the K-major operands and D to start on a 16-byte boundary")
    check_mn_rows("A_MAJOR", M, a_mn, "M")


def check_mn_rows(name: str, rows, mn: bool, dim: str) -> None:
    """TMA's 16-byte row rule for an MN-major operand: its MN extent is the row length."""
    if mn and isinstance(rows, int) and rows % 8:
        raise ValueError(f"{dim}={rows} with {name}='MN': the operand's rows are its {dim} "
                         f"elements, a multiple of 8 for TMA's 16-byte row stride")


def gmem_shape(rows, K, mn: bool):
    """The global operand's shape: (rows, K) K-major, (K, rows) MN-major."""
    return (K, rows) if mn else (rows, K)


def smem_shape(depth: int, rows: int, blk_k: int, mn: bool):
    """The ring's SMEM shape of one operand: (depth, rows, blk_k) K-major; (depth, rows // 64,
    blk_k, 64) MN-major (chunks of 64 MN elements, blk_k K rows each)."""
    if not mn:
        return (depth, rows, blk_k)
    if rows % MN_CHUNK:
        raise ValueError(f"an MN-major tile of {rows} rows is not a multiple of {MN_CHUNK} "
                         f"(one 128-byte swizzle row of MN elements)")
    return (depth, rows // MN_CHUNK, blk_k, MN_CHUNK)


def desc_steps(mn: bool) -> tuple[int, int, int]:
    """(LBO, SBO, k16 step) of a 128B-swizzled operand, in 16-byte units."""
    return (DESC_MN_LBO, DESC_MN_SBO, DESC_MN_K16_STEP) if mn else \
        (DESC_LBO, DESC_SBO, DESC_K16_STEP)


@T.inline
def encode_desc_major(desc, tile_ptr, lbo: int, sbo: int):
    """desc[0] <- descriptor of a 1024-aligned, 128B-swizzled 16-bit tile (desc_steps)."""
    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[0]), tile_ptr, lbo, sbo,
                                          SWIZZLE_128B)


@T.inline
def wgmma_tile_major(acc, desc_a, desc_b, accumulate, m_blocks: int, n: int, dtype: str,
                     k_step_a: int, k_step_b: int, trans_a: int, trans_b: int):
    """wgmma.wgmma_tile for either major order: the k16 slices of one 64-wide K step.
    ``k_step_a`` / ``k_step_b``: desc_steps' k16 step of each operand; ``trans_a`` /
    ``trans_b``: 1 for an MN-major operand (the wgmma's transpose bits), else 0."""
    TL.begin(TL.WGMMA, accumulate)
    for kk in T.unroll(SWIZZLE_ROW_ELEMS // WGMMA_K):
        for h in T.unroll(m_blocks):
            T.ptx[wgmma_name(n, dtype)](
                *[acc[h * (n // 2) + i] for i in range(n // 2)],
                desc_a + T.Cast("uint64", h * DESC_M64_STEP + kk * k_step_a),
                desc_b + T.Cast("uint64", kk * k_step_b),
                T.ptx.pred(T.Or(accumulate, kk > 0)),
                1, 1, trans_a, trans_b,  # scale-a, scale-b, trans-a, trans-b (1 = MN-major)
            )


@T.inline
def tma_load_operand(Xsmem, stage, first, X, r_st, k_st, ROWS: int, BLK_K: int, mn: bool, bar,
                     mask: int):
    # one thread: ROWS rows of the operand from row r_st, K from k_st, into rows [first,
    # first + ROWS) of stage `stage` of the ring Xsmem, completing on `bar` (the caller's
    # expect_tx counts the bytes). K-major: one box X[r_st:, k_st:]; MN-major: one box per
    # 64-row chunk, X[k_st:, r_st + 64c:] (the transposed tensor's rows are K) into chunk
    # first / 64 + c. mask 0: unicast; else multicast to those CTAs of the cluster
    if mn:
        for c in T.unroll(ROWS // MN_CHUNK):
            if mask == 0:
                Tx.copy_async(Xsmem[stage, first // MN_CHUNK + c, :, :],
                              X[k_st:k_st + BLK_K, r_st + c * MN_CHUNK:r_st + (c + 1) * MN_CHUNK],
                              dispatch=H.TMA, mbar=bar)
            else:
                Tx.copy_async(Xsmem[stage, first // MN_CHUNK + c, :, :],
                              X[k_st:k_st + BLK_K, r_st + c * MN_CHUNK:r_st + (c + 1) * MN_CHUNK],
                              dispatch=H.TMA, mbar=bar, cta_mask=mask)
    else:
        if mask == 0:
            Tx.copy_async(Xsmem[stage, first:first + ROWS, :],
                          X[r_st:r_st + ROWS, k_st:k_st + BLK_K], dispatch=H.TMA, mbar=bar)
        else:
            Tx.copy_async(Xsmem[stage, first:first + ROWS, :],
                          X[r_st:r_st + ROWS, k_st:k_st + BLK_K], dispatch=H.TMA, mbar=bar,
                          cta_mask=mask)


@T.inline
def expect_stage_bytes(bar, ROWS_A: int, ROWS_B: int, BLK_K: int):
    # the bytes landing in this CTA's stage: the A tile and the whole B tile (TMA counts a
    # zero-filled box's bytes too), whichever the major order
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((ROWS_A + ROWS_B) * BLK_K * ELEM_BYTES))
