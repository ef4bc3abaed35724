"""fp8 (e4m3) verbs of v13: tile bytes, the k32 wgmma, its TMA loads, promotion and the scales."""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from .. import helpers as H
from .. import timeline as TL  # event hooks: None (nothing emitted) unless TIMELINE=True
from .wgmma import DESC_K16_STEP, DESC_M64_STEP

# --- v13: fp8 (e4m3) operands. One byte per element, so a 128-byte swizzle row holds 128
# elements of K (BLK_K = 128 per stage) and one wgmma m64nNk32 consumes 32 of them: the
# descriptor walks the row in the same 32-byte steps as the 16-bit k16 wgmma (4 per
# row), so encode_desc, desc_advance and DESC_M64_STEP are reused unchanged. The kernel
# sees A and B as uint8 buffers (the e4m3 bit patterns; TMA copies bytes and the wgmma
# mnemonic says e4m3), and the scales as fp32 buffers.
FP8_BLK_K = 128             # e4m3 elements in one 128-byte swizzle row: BLK_K of v13
FP8_WGMMA_K = 32            # K of one e4m3 wgmma
FP8_STORAGE = "uint8"       # how the kernel's signature and SMEM hold e4m3 bits
FP8_OUT_DTYPES = ("bfloat16", "float16")


def fp8_tile_bytes(rows: int) -> int:
    """Bytes of one (rows, 128) e4m3 tile: rows x one 128-byte swizzle row."""
    return rows * FP8_BLK_K


def wgmma_fp8_name(n: int) -> str:
    """PTX mnemonic of the e4m3 x e4m3 -> fp32 wgmma, both operands in SMEM, K-major."""
    return f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3"


@T.inline
def wgmma_fp8_tile(acc, desc_a, desc_b, accumulate, m_blocks: int, n: int):
    """All e4m3 wgmmas that consume one 128-wide K slice (one 128-byte row) in SMEM:
    4 x m64nNk32 per 64-row block, descriptors advanced 32 B per k32 (as wgmma_tile's
    k16 steps). ``accumulate`` False: the slice's first wgmma overwrites acc (scale-d 0)."""
    TL.begin(TL.WGMMA, accumulate)
    for kk in T.unroll(FP8_BLK_K // FP8_WGMMA_K):
        for h in T.unroll(m_blocks):
            T.ptx[wgmma_fp8_name(n)](
                *[acc[h * (n // 2) + i] for i in range(n // 2)],
                desc_a + T.Cast("uint64", h * DESC_M64_STEP + kk * DESC_K16_STEP),
                desc_b + T.Cast("uint64", kk * DESC_K16_STEP),
                T.ptx.pred(T.Or(accumulate, kk > 0)),
                1, 1,  # scale-a, scale-b (fp8 forms have no transpose: K-major only)
            )


@T.inline
def tma_load_fp8_tiles(Asmem, Bsmem, A, B, m_st, n_st, k_st, BLK_M, BLK_N, bar):
    # one thread: helpers.tma_load_tiles for one-byte elements (expect_tx counts bytes:
    # (BLK_M + BLK_N) x 128, zero-filled edge bytes included)
    TL.point(TL.TMA_ISSUE, k_st // FP8_BLK_K, TL.PRODUCER)
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((BLK_M + BLK_N) * FP8_BLK_K))
    Tx.copy_async(Asmem, A[m_st:m_st + BLK_M, k_st:k_st + FP8_BLK_K], dispatch=H.TMA,
                  mbar=bar)
    Tx.copy_async(Bsmem, B[n_st:n_st + BLK_N, k_st:k_st + FP8_BLK_K], dispatch=H.TMA,
                  mbar=bar)


@T.inline
def tma_load_fp8_multicast_b(Asmem, Bsmem_half, A, B, m_st, nb_st, k_st, BLK_M, B_ROWS,
                             BLK_N, bar, mask):
    # one thread per CTA of a pair (v13's CLUSTER=2): expect every byte that lands in THIS
    # CTA's stage ((BLK_M + BLK_N) x 128: its own A tile and the whole B tile, the peer's
    # half written by its multicast), load the own A tile, and B rows [nb_st, nb_st + B_ROWS)
    # multicast into the same offset of both CTAs (cluster.tma_load_multicast_b for e4m3)
    TL.point(TL.TMA_ISSUE, k_st // FP8_BLK_K, TL.PRODUCER)
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((BLK_M + BLK_N) * FP8_BLK_K))
    Tx.copy_async(Asmem, A[m_st:m_st + BLK_M, k_st:k_st + FP8_BLK_K], dispatch=H.TMA,
                  mbar=bar)
    Tx.copy_async(Bsmem_half, B[nb_st:nb_st + B_ROWS, k_st:k_st + FP8_BLK_K], dispatch=H.TMA,
                  mbar=bar, cta_mask=mask)


@T.inline
def promote_fragment(acc, tmp, count: int, first, factor):
    """acc <- (first ? 0 : acc) + tmp * factor, per register (the promotion of a partial
    sum of the limited-precision fp8 accumulation into the fp32 accumulator). ``factor``
    is one value for the whole fragment (1.0, or a per-tensor scale)."""
    for i in T.unroll(count):
        acc[i] = T.if_then_else(first, T.float32(0), acc[i]) + tmp[i] * factor


@T.inline
def load_block_scales(sav, sbv, SA, SB, kb, KB, row0, n_st, n: int, M, N, warp_id, lane_id):
    """Block scaling: this thread's scales of K block ``kb`` into registers, issued before
    the promotion's wait_group so their latency hides under the wgmmas. sav[h] = SA[row,
    kb] for its rows row0 + 16w + l//4 + 8h (h = 0, 1); sbv[t] = SB[n_st // 128 + t, kb]
    for the ceil(n / 128) blocks of B the tile's columns lie in (n divides 128 or is 256,
    n_st is a multiple of n; or n = 192: two blocks from n_st // 128). Rows past M, blocks
    past N and a K block kb >= KB (the zero-filled stage of an odd K_TILES) read 0 (never
    stored, or multiplying zeros)."""
    for h in T.unroll(2):
        row = T.meta_var(row0 + warp_id * 16 + lane_id // 4 + 8 * h)
        sav[h] = T.if_then_else(T.And(row < M, kb < KB), SA[row, kb], T.float32(0))
    for t in T.unroll((n + 127) // 128):
        nb = T.meta_var(n_st // 128 + t)
        sbv[t] = T.if_then_else(T.And(nb * 128 < N, kb < KB), SB[nb, kb], T.float32(0))


@T.inline
def promote_fragment_block(acc, tmp, n: int, first, sav, sbv):
    """Block scaling's promotion: acc <- (first ? 0 : acc) + tmp * sa * sb with the scales
    of load_block_scales: register acc[4j + 2h + e] holds row 8h + .. (sav[h]) and column
    8j + .. (B block (8j) // 128 of the tile: sbv[8j // 128])."""
    for j in T.unroll(n // 8):
        for h in T.unroll(2):
            for e in T.unroll(2):
                acc[4 * j + 2 * h + e] = (
                    T.if_then_else(first, T.float32(0), acc[4 * j + 2 * h + e])
                    + tmp[4 * j + 2 * h + e] * (sav[h] * sbv[(8 * j) // 128]))


@T.inline
def promote_fragment_block_straddle(acc, tmp, n: int, first, sav, sbv, off):
    """promote_fragment_block for a tile that straddles two blocks of B at a runtime offset
    (n = 192: ``off`` = n_st % 128, 0 or 64): column 8j takes sbv[1] from 128 - off on."""
    for j in T.unroll(n // 8):
        sb = T.meta_var(T.if_then_else(off + 8 * j >= 128, sbv[1], sbv[0]))
        for h in T.unroll(2):
            for e in T.unroll(2):
                acc[4 * j + 2 * h + e] = (
                    T.if_then_else(first, T.float32(0), acc[4 * j + 2 * h + e])
                    + tmp[4 * j + 2 * h + e] * (sav[h] * sb))


@T.inline
def scale_fragment(acc, count: int, factor):
    """acc *= factor (the per-tensor scale product, applied once in the epilogue)."""
    for i in T.unroll(count):
        acc[i] = acc[i] * factor


@T.inline
def scale_fragment_rows_cols(acc, n: int, SA, SB, row0, col0, M, N, warp_id, lane_id):
    """Row scaling in the epilogue: acc[r, c] *= SA[r] * SB[c] over the 64 x n fragment at
    (row0, col0) (thread (w, l) holds rows 16w + l//4 + 8h, columns 8j + 2(l%4) + e);
    each scale is read once per thread; rows past M and columns past N read 0 (never
    stored)."""
    sav = T.alloc_local((2,), "float32")
    sbv = T.alloc_local((2,), "float32")
    for h in T.unroll(2):
        row = T.meta_var(row0 + warp_id * 16 + lane_id // 4 + 8 * h)
        sav[h] = T.if_then_else(row < M, SA[row], T.float32(0))
    for j in T.unroll(n // 8):
        for e in T.unroll(2):
            col = T.meta_var(col0 + 8 * j + 2 * (lane_id % 4) + e)
            sbv[e] = T.if_then_else(col < N, SB[col], T.float32(0))
        for h in T.unroll(2):
            for e in T.unroll(2):
                acc[4 * j + 2 * h + e] = acc[4 * j + 2 * h + e] * (sav[h] * sbv[e])
