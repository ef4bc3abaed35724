"""Epilogue stores of the accumulator fragment: to GMEM or swizzled SMEM, TMA stores, packed stmatrix tiles, guarded tails."""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from .. import helpers as H
from .. import timeline as TL  # event hooks: None (nothing emitted) unless TIMELINE=True
from .wgmma import SWIZZLE_ROW_ELEMS, WGMMA_M

@T.inline
def store_fragment(dst, acc, row0, col0, warp_id, lane_id, m_blocks: int, n: int):
    """Accumulators -> dst's dtype (fp16 or bf16) -> dst[row0 : row0 + 64*m_blocks,
    col0 : col0 + n], straight from registers; each thread writes pairs of neighbouring
    columns (one packed 2 x 16-bit word).
    dst = D (GMEM, v1-v3): a warp covers 8 rows x 8 columns per store, so the stores are
    only sector-sized -- fine for a first step, fixed by the SMEM + TMA store of v4.
    dst = Dsmem (a 128B-swizzled tile, the source of a TMA store, v4+): the swizzle makes
    these stores bank-conflict free (the 8 rows a warp writes land in 8 16-byte chunks)."""
    TL.begin(TL.EPILOGUE, TL.UNNAMED)  # ended by tma_store_tile, which knows the tile
    pair = T.alloc_local((2,), dst.dtype)
    for h in T.unroll(m_blocks):
        for j in T.unroll(n // 8):
            for hh in T.unroll(2):
                base = T.meta_var(h * (n // 2) + 4 * j + 2 * hh)
                row = T.meta_var(row0 + h * WGMMA_M + warp_id * 16 + lane_id // 4 + 8 * hh)
                col = T.meta_var(col0 + 8 * j + 2 * (lane_id % 4))
                pair[0] = T.Cast(dst.dtype, acc[base])
                pair[1] = T.Cast(dst.dtype, acc[base + 1])
                Tx.copy(dst[row, col : col + 2], pair[:])


@T.inline
def tma_store_tile(D, Dsmem, r0, m_st, n_st, rows: int, cols: int):
    """One thread: TMA-store rows [r0, r0 + rows) of the swizzled SMEM tile Dsmem to
    D[m_st : m_st + rows, n_st : n_st + cols] and commit it as one bulk group. One box per
    64-column swizzle atom (helpers.tma_store_swizzled); the tensor map has D's true
    extents, so rows and columns past D's edge are not written (an edge tile is clipped,
    no special code). The caller must have fenced the generic-proxy writes
    (``fence.proxy.async``) and synchronised the writers first, and must wait on the group
    before reusing Dsmem."""
    H.tma_store_swizzled(D, Dsmem, r0, m_st, n_st, rows, cols)
    T.ptx.cp.async_.bulk.commit_group()
    TL.end(TL.EPILOGUE, TL.tile_code(m_st, n_st))
    TL.begin(TL.STORE)


# The overlapped epilogue of v9: the finished fp32 accumulators are packed to 16-bit
# pairs (fp16x2 or bf16x2, 64 registers) so that the next tile's wgmmas may overwrite the
# accumulators at once; the packed tile is then written to SMEM with stmatrix (which moves
# b16 pairs, whatever they encode) and TMA-stored while those wgmmas run.
# dtype -> (device function, its source): round-to-nearest conversion of two fp32 values
_PACK_FN = {
    "float16": ("tirx_gemm_pack_half2", """
__device__ __forceinline__ unsigned int tirx_gemm_pack_half2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned int*>(&v);
}
"""),
    "bfloat16": ("tirx_gemm_pack_bfloat162", """
__device__ __forceinline__ unsigned int tirx_gemm_pack_bfloat162(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned int*>(&v);
}
"""),
}

EPI_COLS = SWIZZLE_ROW_ELEMS  # columns of one TMA-store chunk: one 128-byte swizzle row


@T.inline
def pack_fragment(packed, acc, count: int, dtype: str):
    """packed[i] <- dtype x2 (acc[2i], acc[2i+1]) for i < count (dtype float16 or
    bfloat16, the output's). In the wgmma fragment,
    acc[4j+2h+e] is D[16w + l//4 + 8h, 8j + 2(l%4) + e], so packed[2j+h] holds the two
    neighbouring columns of row 8h + l//4 of 8x8 block j: the register of one stmatrix
    m8n8 matrix (thread l holds row l//4, columns 2(l%4), 2(l%4)+1)."""
    for i in T.unroll(count):
        packed[i] = T.cuda.func_call(_PACK_FN[dtype][0], acc[2 * i], acc[2 * i + 1],
                                     source_code=_PACK_FN[dtype][1], return_type="uint32")


@T.inline
def stmatrix_chunk(Dstage, wg, buf, packed, c, warp_id, lane_id):
    """Warpgroup ``wg`` writes columns [64c, 64c + 64) of its packed 64-row fragment into
    the staging tile Dstage[wg, buf] (64x64, 128B-swizzled) with four stmatrix.x4 per
    thread. Each x4 stores a 16x16 block: matrices (rows +0, cols j), (rows +8, cols j),
    (+0, j+1), (+8, j+1); lane L gives the address of row L % 8 of matrix L // 8. A matrix
    row is one 16-byte swizzle chunk, so the 8 rows of a matrix land in 8 different
    16-byte bank groups (no bank conflicts); ptr_to applies the swizzle."""
    q = T.meta_var(lane_id // 8)
    for i in T.unroll(EPI_COLS // 16):
        j = T.meta_var(c * (EPI_COLS // 8) + 2 * i)  # first 8-column block of this x4
        T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(
            Dstage.ptr_to([wg, buf, warp_id * 16 + (q % 2) * 8 + lane_id % 8,
                           8 * (2 * i + q // 2)]),
            packed[2 * j], packed[2 * j + 1], packed[2 * j + 2], packed[2 * j + 3])


@T.inline
def store_packed_chunk(D, Dstage, wg, packed, m_st, n_st, c: int, bufs: int, warp_id,
                       lane_id, tid_in_wg, bar_id):
    """Warpgroup ``wg``: chunk ``c`` (columns [64c, 64c + 64)) of its packed fragment ->
    D[m_st:+64, n_st + 64c:+64] through staging tile Dstage[wg, c % bufs], one TMA store
    (store_packed_tile's step)."""
    if tid_in_wg == 0:
        T.ptx.cp.async_.bulk.wait_group.read(bufs - 1)
        TL.drain(TL.STORE, bufs - 1)
    T.cuda.warpgroup_sync(bar_id)  # the staging tile is free for all 128 writers
    stmatrix_chunk(Dstage, wg, c % bufs, packed, c, warp_id, lane_id)
    T.ptx.fence.proxy.async_.shared__cta()  # generic-proxy writes -> TMA unit
    T.cuda.warpgroup_sync(bar_id)
    if tid_in_wg == 0:
        Tx.copy_async(
            D[m_st:m_st + WGMMA_M, n_st + c * EPI_COLS:n_st + (c + 1) * EPI_COLS],
            Dstage[wg, c % bufs, :, :], dispatch=H.TMA)
        T.ptx.cp.async_.bulk.commit_group()
        TL.begin(TL.STORE)


@T.inline
def store_packed_tile(D, Dstage, wg, packed, m_st, n_st, n: int, bufs: int, warp_id,
                      lane_id, tid_in_wg, bar_id):
    """Warpgroup ``wg``: its packed 64 x n 16-bit fragment -> GMEM D[m_st:+64, n_st:+n], in
    64-column chunks through its ``bufs`` staging tiles Dstage[wg, b] (64x64, swizzled),
    one TMA store per chunk (one box, one swizzle atom wide; rows and columns past D's
    edge are not written, a chunk wholly past N writes nothing). Nothing waits for a
    store to reach GMEM: a staging tile is reused only once the store that last read it
    is done reading (wait_group.read(bufs-1): at most the bufs - 1 younger stores may
    still be pending), which has usually happened long before. The caller waits for all
    its stores (wait_group 0) before exiting."""
    TL.begin(TL.EPILOGUE, TL.tile_code(m_st, n_st))
    for c in T.unroll(n // EPI_COLS):
        store_packed_chunk(D, Dstage, wg, packed, m_st, n_st, c, bufs, warp_id, lane_id,
                           tid_in_wg, bar_id)
    TL.end(TL.EPILOGUE, TL.tile_code(m_st, n_st))


# --- v12's swap-AB (SWAP_TMA): the fragment holds D's transpose (rows: D's columns, the
# weight's rows; columns: D's rows, the tokens). stmatrix's .trans writes each 8x8 matrix's
# columns as rows, so the packed fragment lands in a staging tile as D's own rows (tokens
# by 64 weight rows, 128-byte rows, swizzled) and goes out by TMA like the plain chunks.
@T.inline
def stmatrix_chunk_transposed(Dstage, wg, buf, packed, c, rows: int, warp_id, lane_id):
    """Swap-AB: warpgroup ``wg`` writes fragment columns [64c, 64c + rows) of its packed
    64-row fragment, transposed, into rows [0, rows) of the staging tile Dstage[wg, buf]
    (64x64, 128B-swizzled): fragment column 64c + t (a token) becomes staging row t, the
    fragment's 64 rows its 64 columns. Matrix (h, j) of packed[2j+h] (fragment rows
    16w + 8h .., columns 8j ..) lands, transposed, at staging rows 8(j - 8c) .., columns
    16w + 8h ..; lane L gives the address of row L % 8 of matrix L // 8, the matrices in
    stmatrix_chunk's order ((h, j) = (q % 2, 2i + q // 2)). ``rows``: a multiple of 16 (one
    x4 per 16 tokens; v12 takes SWAP_TMA with BLK_N a multiple of 16)."""
    q = T.meta_var(lane_id // 8)
    for i in T.unroll(rows // 16):
        j = T.meta_var(c * (EPI_COLS // 8) + 2 * i)  # first 8-token block of this x4
        T.ptx.stmatrix.sync.aligned.m8n8.x4.trans.shared.b16(
            Dstage.ptr_to([wg, buf, 8 * (2 * i + q // 2) + lane_id % 8,
                           warp_id * 16 + (q % 2) * 8]),
            packed[2 * j], packed[2 * j + 1], packed[2 * j + 2], packed[2 * j + 3])


@T.inline
def store_packed_chunk_transposed(D, Dstage, wg, packed, r_st, c_st, c: int, rows: int,
                                  bufs: int, warp_id, lane_id, tid_in_wg, bar_id):
    """Swap-AB, warpgroup ``wg``: tokens [64c, 64c + rows) of its packed fragment (D's
    transpose at weight rows r_st.., tokens c_st..) -> D[c_st + 64c : +rows, r_st : +64]
    through staging tile Dstage[wg, c % bufs], one TMA store (rows past M and columns past
    N are clipped by the tensor map). The staging tile's reuse as store_packed_chunk's."""
    if tid_in_wg == 0:
        T.ptx.cp.async_.bulk.wait_group.read(bufs - 1)
        TL.drain(TL.STORE, bufs - 1)
    T.cuda.warpgroup_sync(bar_id)  # the staging tile is free for all 128 writers
    stmatrix_chunk_transposed(Dstage, wg, c % bufs, packed, c, rows, warp_id, lane_id)
    T.ptx.fence.proxy.async_.shared__cta()  # generic-proxy writes -> TMA unit
    T.cuda.warpgroup_sync(bar_id)
    if tid_in_wg == 0:
        Tx.copy_async(
            D[c_st + c * EPI_COLS:c_st + c * EPI_COLS + rows, r_st:r_st + WGMMA_M],
            Dstage[wg, c % bufs, 0:rows, :], dispatch=H.TMA)
        T.ptx.cp.async_.bulk.commit_group()
        TL.begin(TL.STORE)


@T.inline
def store_packed_tile_transposed(D, Dstage, wg, packed, r_st, c_st, n: int, bufs: int,
                                 warp_id, lane_id, tid_in_wg, bar_id):
    """Swap-AB, warpgroup ``wg``: its packed 64 x n fragment (D's transpose: n tokens by
    64 weight rows) -> D[c_st : c_st + n, r_st : r_st + 64], 64 tokens per TMA store and
    the last n % 64 in one more (``bufs`` staging tiles, used in turn: bufs divides the
    store count, so the next tile's first store takes the tile the oldest one read)."""
    TL.begin(TL.EPILOGUE, TL.tile_code(r_st, c_st))
    for c in T.unroll(n // EPI_COLS):
        store_packed_chunk_transposed(D, Dstage, wg, packed, r_st, c_st, c, EPI_COLS, bufs,
                                      warp_id, lane_id, tid_in_wg, bar_id)
    if n % EPI_COLS != 0:
        store_packed_chunk_transposed(D, Dstage, wg, packed, r_st, c_st, n // EPI_COLS,
                                      n % EPI_COLS, bufs, warp_id, lane_id, tid_in_wg,
                                      bar_id)
    TL.end(TL.EPILOGUE, TL.tile_code(r_st, c_st))


# --- v12: narrow tiles. A tile whose width is not a multiple of the 64-column TMA-store
# chunk stores its last columns straight from the packed registers, one guarded 4-byte
# store per pair of columns (rows past M and columns past N are skipped).
_ST_GLOBAL_B32_SRC = """
__device__ __forceinline__ void tirx_gemm_st_global_b32(void* p, unsigned int v) {
  *reinterpret_cast<unsigned int*>(p) = v;
}
"""


@T.inline
def store_packed_guarded(D, packed, m_st, n_st, j_first: int, j_end: int, M, N, warp_id,
                         lane_id):
    """Warpgroup: 8-column blocks [j_first, j_end) of its packed 64-row fragment (see
    pack_fragment: packed[2j+h] holds row 16w + l//4 + 8h, columns 8j + 2(l%4) + {0, 1})
    -> D[m_st + row, n_st + col] with plain guarded stores. N is a multiple of 8 and
    n_st of 8, so a pair whose first column lies inside D lies inside it wholly. M may
    be a run-time variable. Nothing to fence: generic-proxy writes to GMEM."""
    for jj in T.unroll(j_end - j_first):
        for h in T.unroll(2):
            row = T.meta_var(m_st + warp_id * 16 + lane_id // 4 + 8 * h)
            col = T.meta_var(n_st + 8 * (j_first + jj) + 2 * (lane_id % 4))
            if row < M:
                if col < N:
                    T.cuda.func_call("tirx_gemm_st_global_b32", D.ptr_to([row, col]),
                                     packed[2 * (j_first + jj) + h],
                                     source_code=_ST_GLOBAL_B32_SRC)


# --- v12's TAIL_TMA: the tail by TMA too. The last BLK_N % 64 columns are stmatrix'd into
# a small unswizzled staging tile of exactly their width (64 x 8t, rows of 16t bytes) and
# stored as one box: a 64-column box would write into the next tile's columns, and a
# swizzled box narrower than its 128-byte swizzle span is not what stmatrix_chunk writes.
# Rows of 16t bytes cost stmatrix some bank conflicts (a 96-byte row: 2-way), on 1/8 .. 7/8
# of a chunk.
@T.inline
def stmatrix_tail(Dtail, packed, j_first: int, j_end: int, warp_id, lane_id):
    """A warpgroup writes 8-column blocks [j_first, j_end) of its packed 64-row fragment
    into its tail staging tile Dtail (64 x 8 (j_end - j_first), row-major, not swizzled): one
    stmatrix.x4 per two blocks (stmatrix_chunk's matrix order), an .x2 for an odd last
    block (matrices (rows +0, j), (rows +8, j): lanes 0-15 give the addresses)."""
    q = T.meta_var(lane_id // 8)
    for i in T.unroll((j_end - j_first) // 2):
        j = T.meta_var(j_first + 2 * i)  # first 8-column block of this x4
        T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(
            Dtail.ptr_to([warp_id * 16 + (q % 2) * 8 + lane_id % 8, 8 * (2 * i + q // 2)]),
            packed[2 * j], packed[2 * j + 1], packed[2 * j + 2], packed[2 * j + 3])
    if (j_end - j_first) % 2 != 0:
        T.ptx.stmatrix.sync.aligned.m8n8.x2.shared.b16(
            Dtail.ptr_to([warp_id * 16 + (q % 2) * 8 + lane_id % 8, 8 * (j_end - 1 - j_first)]),
            packed[2 * (j_end - 1)], packed[2 * (j_end - 1) + 1])


@T.inline
def store_packed_tail(D, Dtail, packed, m_st, n_st, j_first: int, j_end: int, since: int,
                      warp_id, lane_id, tid_in_wg, bar_id):
    """A warpgroup: 8-column blocks [j_first, j_end) of its packed fragment ->
    D[m_st:+64, n_st + 8 j_first : n_st + 8 j_end] through its tail staging tile Dtail
    (64 x 8 (j_end - j_first)), one TMA store (rows past M and columns past N are clipped
    by the tensor map). ``since``: how many of the warpgroup's bulk groups may still be
    reading when Dtail is free again: the 64-column chunks it commits between two tail
    stores for a tile of its own, 0 for one lying over the last chunk's staging tile."""
    if tid_in_wg == 0:
        T.ptx.cp.async_.bulk.wait_group.read(since)
        TL.drain(TL.STORE, since)
    T.cuda.warpgroup_sync(bar_id)  # the tail staging tile is free for all 128 writers
    stmatrix_tail(Dtail, packed, j_first, j_end, warp_id, lane_id)
    T.ptx.fence.proxy.async_.shared__cta()  # generic-proxy writes -> TMA unit
    T.cuda.warpgroup_sync(bar_id)
    if tid_in_wg == 0:
        Tx.copy_async(D[m_st:m_st + WGMMA_M, n_st + 8 * j_first:n_st + 8 * j_end],
                      Dtail[:, :], dispatch=H.TMA)
        T.ptx.cp.async_.bulk.commit_group()
        TL.begin(TL.STORE)




_ST_GLOBAL_F32X2_SRC = """
__device__ __forceinline__ void tirx_gemm_st_global_f32x2(void* row, int col, float lo,
                                                          float hi) {
  *reinterpret_cast<float2*>(reinterpret_cast<float*>(row) + col) = make_float2(lo, hi);
}
"""


@T.inline
def store_fragment_f32_guarded(D, acc, m_st, n_st, n: int, M, N, warp_id, lane_id):
    """Warpgroup: its fp32 64 x n fragment -> fp32 D[m_st + row, n_st + col] with one
    guarded 8-byte store per pair of columns (acc[4j+2h], acc[4j+2h+1] are neighbours; a
    quad of lanes writes one 32-byte sector of a row). N is a multiple of 8 and n_st of
    8, so a pair starting inside D lies inside it wholly and is 8-byte aligned. The
    registers are read at issue: the accumulators are free for the next wgmmas at once."""
    for h in T.unroll(2):  # one row per h: its guard and base once, then the columns
        row = T.meta_var(m_st + warp_id * 16 + lane_id // 4 + 8 * h)
        if row < M:
            for j in T.unroll(n // 8):
                col = T.meta_var(n_st + 8 * j + 2 * (lane_id % 4))
                if col < N:
                    # the row's address once, the column an offset (immediates in SASS)
                    T.cuda.func_call("tirx_gemm_st_global_f32x2", D.ptr_to([row, 0]), col,
                                     acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1],
                                     source_code=_ST_GLOBAL_F32X2_SRC)


@T.inline
def store_fragment_transposed_guarded(D, acc, r_st, c_st, n: int, M, N, warp_id, lane_id):
    """Warpgroup, swap-AB (v12's SWAP_AB): its fp32 64 x n fragment holds D's transpose
    (fragment rows are D's columns, fragment columns D's rows), so element (row, col) goes
    to D[c_st + col, r_st + row], cast to D's dtype, one guarded 2-byte store each. The 8
    lanes with the same lane % 4 write 8 neighbouring columns of one row of D (16 bytes).
    A decode tile is small (n <= 64 rows of D), so the scattered stores cost little."""
    val = T.alloc_local((1,), D.dtype)
    for h in T.unroll(2):
        r = T.meta_var(r_st + warp_id * 16 + lane_id // 4 + 8 * h)
        if r < N:
            for j in T.unroll(n // 8):
                for e in T.unroll(2):
                    c = T.meta_var(c_st + 8 * j + 2 * (lane_id % 4) + e)
                    if c < M:
                        val[0] = T.Cast(D.dtype, acc[4 * j + 2 * h + e])
                        D[c, r] = val[0]
