"""Grouped GEMM (v14): the device-side tile walk over (expert, token tile, weight tile) and
the per-expert guarded stores.

The walk is computed in the kernel from the routing tensor (``offs`` or ``counts``) that the
launch reads from global memory: no host sync, so one launch is CUDA-graph capturable and a
replay picks up new routing written into the same tensor.

* ``scan_experts``: every thread of the CTA (before the roles split) takes part; thread e
  reads expert e's row range, writes its bounds to shared memory and its token-tile count,
  and a Hillis-Steele scan (log2(E) rounds, a CTA barrier each) turns the counts into
  inclusive prefix sums. An expert with no rows has no tiles.
* ``tile_at``: a unit index t of the walk -> (expert, token-tile start, expert's row end,
  weight-tile start): a binary search of the prefix sums for the expert, then a grouped
  raster inside it (GROUP token tiles walk a weight column before the next column), so the
  expert's weight tile is read from HBM once per GROUP token tiles.
* ``store_packed_rows`` / ``store_transposed_rows``: the tile's rows (D's rows) are written
  only below the expert's row end, so no tile writes another expert's rows;
  ``tma_load_gate_up_swap`` / ``store_transposed_swiglu``: SwiGLU on a swap-AB tile (decode),
  gate and up rows of a feature 8 rows apart in one thread's fragment.
* ``tma_load_unit_multicast``: CLUSTER=2, a pair of CTAs on adjacent token tiles of one
  expert, each loading half of the shared weight tile and multicasting it to both.
* ``walk_stages``, ``walk_tables``, ``start_walk``, ``walk_length``: the set-up both v14
  kernels (16-bit and FP8_BLOCK) share: the ring's tiles, the scan's tables, the barrier
  init and the scan, the walk's length; ``queue_fp8_stage``: one e4m3 stage's
  wgmmas into a promotion tile (v13's pipelined mainloop issues the same).
* ``weight_shape``: the stacked weight's extents, int64 where an expert's weight needs them
  (both arches' v14).
"""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from .cluster import publish_setup_cluster
from .fp8 import wgmma_fp8_tile
from .wgmma import DESC_M64_STEP, desc_advance, mma_commit, mma_fence, publish_setup

E_MAX = 256       # experts per launch: one scanning thread per expert (256 threads at least)
LAYOUTS = ("contiguous", "masked")
BOUND_ROWS = 3    # shared-memory words per expert: row start, row end, spare (alignment)
WIDE_FROM_BITS = 1 << 31  # an expert's weight this many bits or more: int64 extents (below)


def weight_shape(E, N, K, bits):
    """B's shape (E, N, K), its extents int64 where an expert's weight holds WIDE_FROM_BITS
    or more. TVM derives a tensor map's byte strides from the extents in their own type, so
    with int32 extents the expert stride (N * K elements x bits) overflowed from 2^27 16-bit
    elements (Grok-1's down projection, 6144 x 32768: globalStrides[1] < 0, refused at compile
    time). int64 extents change the host's tensor-map encode and argument checks only: the
    device code and the TMA coordinates (int32) are the same. Smaller weights keep int32
    extents, so their kernels are the ones checked before. (A masked A's expert stride,
    T * K at run time, stays int32: the op refuses T * K past it, op/grouped_limits.py.)"""
    if N * K * bits < WIDE_FROM_BITS:
        return (E, N, K)
    return tuple(T.int64(d) for d in (E, N, K))


def log2_ceil(n: int) -> int:
    """Rounds of the scan (and steps of the binary search) for n experts."""
    return max(1, (n - 1).bit_length())


def python_walk(rows, tok: int, w_tiles: int, group: int):
    """The walk as tile_at computes it, in Python (tests and the lesson): rows[e] tokens of
    expert e -> [(expert, token tile of the expert, weight tile)] in unit order."""
    mt = [(max(r, 0) + tok - 1) // tok for r in rows]
    out = []
    for e, n in enumerate(mt):
        for u in range(n * w_tiles):
            first = u // (group * w_tiles) * group
            inside = min(group, n - first)
            within = u - first * w_tiles
            out.append((e, first + within % inside, within // inside))
    return out


@T.inline
def scan_experts(scan, bounds, R, e, E: int, TOK: int, M, masked: bool):
    """One thread (e = its index in the CTA; threads with e >= E only join the barriers).
    scan (2, E) int32: round r reads row r % 2 and writes the other; the inclusive prefix
    of token tiles ends in row log2_ceil(E) % 2. bounds (E, 3): row start and end of expert e
    (contiguous: rows [offs[e-1], offs[e]) of A and D, clamped to [0, M]; masked: rows
    [0, counts[e]) of A[e] and D[e], clamped to [0, M])."""
    if e < E:
        if masked:
            bounds[e, 0] = 0
            bounds[e, 1] = T.min(T.max(R[e], 0), M)
        else:
            bounds[e, 0] = T.min(T.max(T.if_then_else(e > 0, R[T.max(e - 1, 0)], 0), 0), M)
            bounds[e, 1] = T.min(T.max(R[e], 0), M)
        scan[0, e] = (T.max(bounds[e, 1] - bounds[e, 0], 0) + TOK - 1) // TOK
    T.cuda.cta_sync()
    for r in T.unroll(log2_ceil(E)):
        if e < E:
            scan[(r + 1) % 2, e] = scan[r % 2, e] + T.if_then_else(
                e >= (1 << r), scan[r % 2, T.max(e - (1 << r), 0)], 0)
        T.cuda.cta_sync()


@T.inline
def tile_at(at, scan, bounds, t, E: int, TOK: int, W_TILES: int, W_BLK: int, GROUP: int):
    """at (4,) int32 <- (expert, first token row of the tile, the expert's row end, first
    weight row of the tile) of unit t (t < the walk's length, scan's last prefix x W_TILES).
    Every quotient is of non-negative values: truncating division, no sign fix-ups."""
    LAST = T.meta_var(log2_ceil(E) % 2)
    g: T.int32 = T.truncdiv(t, W_TILES)  # the unit's token tile, counted over all experts
    e: T.int32 = 0  # the binary search: how many experts end at or before token tile g
    for s in T.unroll(log2_ceil(E) + 1):
        step = T.meta_var(1 << (log2_ceil(E) - s))
        if e + step <= E:
            if scan[LAST, e + step - 1] <= g:
                e = e + step
    first_tile: T.int32 = T.if_then_else(e > 0, scan[LAST, T.max(e - 1, 0)], 0)
    u: T.int32 = t - first_tile * W_TILES  # the unit inside the expert
    first: T.int32 = T.truncdiv(u, GROUP * W_TILES) * GROUP  # its group's first token tile
    inside: T.int32 = T.min(GROUP, scan[LAST, e] - first_tile - first)  # token tiles in it
    within: T.int32 = u - first * W_TILES
    at[0] = e
    at[1] = bounds[e, 0] + (first + T.truncmod(within, inside)) * TOK
    at[2] = bounds[e, 1]
    at[3] = T.truncdiv(within, inside) * W_BLK


def walk_stages(pool, depth: int, blk_m: int, blk_n: int, blk_k: int, storage, a_layout,
                b_layout):
    """(Asmem, Bsmem), plain Python called in the kernel body right after the ring's
    barriers: the A (depth, blk_m, blk_k) and B (depth, blk_n, blk_k) stages from byte 1024
    (swizzled tiles need 1024-byte alignment). What the kernel adds (staging tiles, the
    scan's tables) follows in the same pool."""
    pool.move_base_to(1024)
    Asmem = pool.alloc((depth, blk_m, blk_k), storage, layout=a_layout)
    Bsmem = pool.alloc((depth, blk_n, blk_k), storage, layout=b_layout)
    return Asmem, Bsmem


def walk_tables(pool, E: int):
    """(scan, bounds), plain Python: the scan's token tiles and prefix sums (2, E) and each
    expert's row start and end (E, BOUND_ROWS), int32, the pool's last allocations (it is
    committed here)."""
    scan = pool.alloc((2, E), "int32")
    bounds = pool.alloc((E, BOUND_ROWS), "int32")
    pool.commit()
    return scan, bounds


@T.inline
def start_walk(stages, scan, bounds, R, wg_id, tid_in_wg, producer: int, E: int, TOK: int, M,
               masked: bool, cluster: bool = False):
    """Every thread, before the roles split: the producer's thread 0 inits the ring, the
    setup is published (``cluster``: cluster-wide, the peer multicasts into this CTA's
    stages and arrives on its barriers), and the CTA scans the routing tensor R
    (scan_experts)."""
    if wg_id == producer:
        if tid_in_wg == 0:
            stages.init()
    if cluster:
        publish_setup_cluster()
    else:
        publish_setup()
    scan_experts(scan, bounds, R, wg_id * 128 + tid_in_wg, E, TOK, M, masked)


def walk_length(scan, E: int, w_tiles: int):
    """The walk's length (units): the last prefix of token tiles x weight tiles."""
    return scan[log2_ceil(E) % 2, E - 1] * w_tiles


@T.inline
def queue_fp8_stage(tmp, ring, full, desc_a, desc_b, consumer, a_stage_bytes: int,
                    b_stage_bytes: int, n: int):
    """A consumer warpgroup: wait for the ring's next stage (``full``, its tma2mma), queue its
    4 k32 e4m3 wgmmas into ``tmp`` (overwritten: a promotion tile) as one commit group, and
    step the ring. ``consumer`` picks the 64-row block of A."""
    full.wait(ring.stage, ring.phase, "consumer")
    mma_fence()
    wgmma_fp8_tile(tmp, desc_advance(desc_a[0], ring.stage * a_stage_bytes)
                   + T.Cast("uint64", consumer * DESC_M64_STEP),
                   desc_advance(desc_b[0], ring.stage * b_stage_bytes), False, 1, n)
    mma_commit()
    ring.advance()


@T.inline
def tma_load_tokens(dst, A, at, rows: int, k_st, BLK_K: int, bar, masked: bool):
    """One thread: unit ``at``'s ``rows`` token rows at K k_st into ``dst`` by TMA on ``bar``:
    A[at[1]..] (masked: A[at[0], at[1]..], a 3-D box); rows past A's end are zero-filled."""
    if masked:
        Tx.copy_async(dst, A[at[0], at[1]:at[1] + rows, k_st:k_st + BLK_K],
                      dispatch="tma_explicit", mbar=bar)
    else:
        Tx.copy_async(dst, A[at[1]:at[1] + rows, k_st:k_st + BLK_K],
                      dispatch="tma_explicit", mbar=bar)


@T.inline
def tma_load_unit(Asmem, Bsmem, A, B, at, k_st, bar, MMA_M: int, MMA_N: int, BLK_K: int,
                  swap: bool, masked: bool):
    """One thread: the stage's byte count on ``bar``, then unit ``at``'s two boxes at K k_st
    into the MMA's A tile (MMA_M rows) and B tile (MMA_N rows): the token rows A[at[1]..]
    (masked: A[at[0], at[1]..], a 3-D box) and the expert's weight rows B[at[0], at[3]..] (a
    3-D box, bounded per expert); ``swap``: the weight rows are the MMA's A tile."""
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((MMA_M + MMA_N) * BLK_K * 2))
    if swap:
        Tx.copy_async(Asmem, B[at[0], at[3]:at[3] + MMA_M, k_st:k_st + BLK_K],
                      dispatch="tma_explicit", mbar=bar)
        tma_load_tokens(Bsmem, A, at, MMA_N, k_st, BLK_K, bar, masked)
    else:
        tma_load_tokens(Asmem, A, at, MMA_M, k_st, BLK_K, bar, masked)
        Tx.copy_async(Bsmem, B[at[0], at[3]:at[3] + MMA_N, k_st:k_st + BLK_K],
                      dispatch="tma_explicit", mbar=bar)


@T.inline
def tma_load_unit_multicast(Asmem, Bsmem_half, A, B, at, k_st, bar, BLK_M: int, B_ROWS: int,
                            BLK_K: int, BLK_N: int, rank, masked: bool):
    """One thread per CTA of a pair (CLUSTER=2, plain tiles): the stage's byte count on
    ``bar`` (the own A tile and the whole BLK_N-row weight tile, half of it written by the
    peer's multicast), the own token rows A[at[1]..] unicast, and the expert's weight rows
    B[at[0], at[3] + rank * B_ROWS..] multicast into the same offset of both CTAs."""
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(bar, T.uint32((BLK_M + BLK_N) * BLK_K * 2))
    tma_load_tokens(Asmem, A, at, BLK_M, k_st, BLK_K, bar, masked)
    Tx.copy_async(Bsmem_half, B[at[0], at[3] + rank * B_ROWS:at[3] + (rank + 1) * B_ROWS,
                                k_st:k_st + BLK_K],
                  dispatch="tma_explicit", mbar=bar, cta_mask=3)


@T.inline
def tma_load_fp8_unit(Asmem, Bsmem, A, B, at, k_st, bar, BLK_M: int, BLK_N: int, BLK_K: int,
                      masked: bool):
    """One thread, FP8_BLOCK (one byte per element): the stage's byte count on ``bar``
    ((BLK_M + BLK_N) x BLK_K, a box past K zero-filled and counted), then unit ``at``'s token
    rows A[at[1].., k_st..] (masked: A[at[0], at[1].., k_st..]) and its expert's weight rows
    B[at[0], at[3].., k_st..]."""
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(bar, T.uint32((BLK_M + BLK_N) * BLK_K))
    tma_load_tokens(Asmem, A, at, BLK_M, k_st, BLK_K, bar, masked)
    Tx.copy_async(Bsmem, B[at[0], at[3]:at[3] + BLK_N, k_st:k_st + BLK_K],
                  dispatch="tma_explicit", mbar=bar)


@T.inline
def tma_load_gate_up(Asmem, Bsmem, stage, A, B, at, k_st, bar, MMA_M: int, HALF: int,
                     BLK_K: int, N_HALF: int, masked: bool):
    """One thread, SWIGLU="halves": the stage's byte count on ``bar``, the token box as
    tma_load_unit loads it, and the expert's weight tile as two boxes of HALF rows: gate rows
    B[at[0], at[3]..] into Bsmem rows [0, HALF), up rows B[at[0], N_HALF + at[3]..] into
    [HALF, 2 HALF) (HALF a multiple of 8: each box starts on a swizzle atom). A gate box
    reaching past N_HALF reads up rows, and an up box past B's rows is zero-filled: columns
    of D past N_HALF, never stored."""
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((MMA_M + 2 * HALF) * BLK_K * 2))
    tma_load_tokens(Asmem[stage, :, :], A, at, MMA_M, k_st, BLK_K, bar, masked)
    Tx.copy_async(Bsmem[stage, 0:HALF, :], B[at[0], at[3]:at[3] + HALF, k_st:k_st + BLK_K],
                  dispatch="tma_explicit", mbar=bar)
    Tx.copy_async(Bsmem[stage, HALF:2 * HALF, :],
                  B[at[0], N_HALF + at[3]:N_HALF + at[3] + HALF, k_st:k_st + BLK_K],
                  dispatch="tma_explicit", mbar=bar)


@T.inline
def tma_load_gate_up_swap(Asmem, Bsmem, stage, A, B, at, k_st, bar, BLK_M: int, TOK: int,
                          BLK_K: int, N_HALF: int, masked: bool):
    """One thread, SWIGLU="halves" on a swap-AB tile: the stage's byte count on ``bar``, the
    token box into Bsmem (as tma_load_unit's swap-AB branch), and the weight tile (the MMA's
    A, BLK_M rows = BLK_M/2 features from at[3]) as 8-row boxes: 16-row group q holds gate
    rows B[at[0], at[3] + 8q ..] in its first 8 rows and the same features' up rows
    B[at[0], N_HALF + at[3] + 8q ..] in the next 8, so each accumulator thread holds a
    feature's gate (row r) and up (row r + 8) side by side (store_transposed_swiglu). A gate
    box past N_HALF reads up rows, an up box past B's rows is zero-filled: features past
    N_HALF, never stored."""
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(bar, T.uint32((BLK_M + TOK) * BLK_K * 2))
    tma_load_tokens(Bsmem[stage, :, :], A, at, TOK, k_st, BLK_K, bar, masked)
    for q in T.unroll(BLK_M // 16):
        Tx.copy_async(Asmem[stage, 16 * q:16 * q + 8, :],
                      B[at[0], at[3] + 8 * q:at[3] + 8 * q + 8, k_st:k_st + BLK_K],
                      dispatch="tma_explicit", mbar=bar)
        Tx.copy_async(Asmem[stage, 16 * q + 8:16 * q + 16, :],
                      B[at[0], N_HALF + at[3] + 8 * q:N_HALF + at[3] + 8 * q + 8,
                        k_st:k_st + BLK_K], dispatch="tma_explicit", mbar=bar)


@T.inline
def store_transposed_swiglu(D, e, acc, f_st, tok_st, n: int, row_end, N_HALF, warp_id,
                            lane_id, masked: bool):
    """Warpgroup, swap-AB with SWIGLU="halves" (tma_load_gate_up_swap's weight rows): its fp32
    64 x n fragment holds, in warp w's rows, 8 features' gate rows (h = 0) and up rows (h = 1);
    feature f_st + 8w + l//4 of token tok_st + c <- silu(gate) * up, in fp32, one rounding,
    stored as D[token, feature] (D N_HALF wide), only features below N_HALF and tokens below
    row_end."""
    val = T.alloc_local((1,), D.dtype)
    f = T.meta_var(f_st + warp_id * 8 + lane_id // 4)
    if f < N_HALF:
        for j in T.unroll(n // 8):
            for x in T.unroll(2):
                c = T.meta_var(tok_st + 8 * j + 2 * (lane_id % 4) + x)
                if c < row_end:
                    g = T.meta_var(acc[4 * j + x])
                    val[0] = T.Cast(D.dtype, g / (T.float32(1) + T.exp(-g)) * acc[4 * j + 2 + x])
                    if masked:
                        D[e, c, f] = val[0]
                    else:
                        D[c, f] = val[0]


@T.inline
def swiglu_fragment(acc, n: int, halves: bool):
    """Warpgroup: its fp32 64 x n fragment of gate and up columns -> acc[: n/2] (pack_fragment's
    layout, n/2 wide) = silu(gate) * up, in place (each write reads indices at or after it).
    8-column block j of the result pairs gate block j with up block j + n/16 ("halves": the
    tile's first n/2 columns are gate, the rest up) or gate block 2j with up block 2j + 1
    (interleaved in groups of 8)."""
    for j in T.unroll(n // 16):
        for i in T.unroll(4):
            g = T.meta_var(acc[4 * j + i] if halves else acc[8 * j + i])
            u = T.meta_var(acc[4 * (j + n // 16) + i] if halves else acc[8 * j + 4 + i])
            acc[4 * j + i] = g / (T.float32(1) + T.exp(-g)) * u


_ST_B32_SRC = """
__device__ __forceinline__ void tirx_gemm_grouped_st_b32(void* p, unsigned int v) {
  *reinterpret_cast<unsigned int*>(p) = v;
}
"""


@T.inline
def store_packed_rows(D, e, packed, m_st, n_st, n: int, row_end, N, warp_id, lane_id,
                      masked: bool, j0: int):
    """Warpgroup: 8-column blocks [j0, j0 + n/8) of its packed 64-row fragment (packed[2j+h]:
    row 16w + l//4 + 8h, columns 8j + 2(l%4) + {0, 1}) -> D rows m_st.. (masked: D[e]),
    columns n_st + 8j.., one 4-byte store per column pair, only rows below the expert's
    row_end and columns below N (j0 = 0, n the tile's width: the whole fragment)."""
    for h in T.unroll(2):
        row = T.meta_var(m_st + warp_id * 16 + lane_id // 4 + 8 * h)
        if row < row_end:
            for jj in T.unroll(n // 8):
                j = T.meta_var(j0 + jj)
                col = T.meta_var(n_st + 8 * j + 2 * (lane_id % 4))
                if col < N:
                    if masked:
                        T.cuda.func_call("tirx_gemm_grouped_st_b32", D.ptr_to([e, row, col]),
                                         packed[2 * j + h], source_code=_ST_B32_SRC)
                    else:
                        T.cuda.func_call("tirx_gemm_grouped_st_b32", D.ptr_to([row, col]),
                                         packed[2 * j + h], source_code=_ST_B32_SRC)


@T.inline
def apply_row_epilogue(acc, scale, bias, e, m_st, n_st, n: int, row_end, N, warp_id, lane_id,
                       masked: bool, swap: bool):
    """Warpgroup, before packing: its fp32 64 x n fragment (pack_fragment's layout, acc[4j+2h+x]
    at fragment row 16w + l//4 + 8h, column 8j + 2(l%4) + x) <- (acc + bias[e, D's column]) x
    scale[D's row], in fp32 (one rounding, at the pack). D's rows: m_st + fragment row, its
    columns n_st + fragment column; ``swap`` (D's transpose): D's rows n_st + fragment column
    (tokens), its columns m_st + fragment row (weight rows). ``scale``: (M,) float32 or masked
    (E, M); ``bias``: (E, N) in D's dtype; either may be None (not applied). Reads are clamped
    inside [.., row_end) and [.., N): rows and columns past them are never stored."""
    for h in T.unroll(2):
        fr = T.meta_var(m_st + warp_id * 16 + lane_id // 4 + 8 * h)
        for j in T.unroll(n // 8):
            for x in T.unroll(2):
                fc = T.meta_var(n_st + 8 * j + 2 * (lane_id % 4) + x)
                row = T.meta_var(fc if swap else fr)
                col = T.meta_var(fr if swap else fc)
                i = T.meta_var(4 * j + 2 * h + x)
                if bias is not None:
                    acc[i] = acc[i] + T.Cast("float32", bias[e, T.min(col, N - 1)])
                if scale is not None:
                    if masked:
                        acc[i] = acc[i] * scale[e, T.min(row, row_end - 1)]
                    else:
                        acc[i] = acc[i] * scale[T.min(row, row_end - 1)]


@T.inline
def store_transposed_rows(D, e, acc, w_st, tok_st, n: int, row_end, N, warp_id, lane_id,
                          masked: bool):
    """Warpgroup, swap-AB: its fp32 64 x n fragment holds D's transpose (fragment rows are
    weight rows = D's columns w_st.., fragment columns are tokens = D's rows tok_st..);
    element (r, c) -> D[tok_st + c, w_st + r] in D's dtype, only tokens below row_end."""
    val = T.alloc_local((1,), D.dtype)
    for h in T.unroll(2):
        r = T.meta_var(w_st + warp_id * 16 + lane_id // 4 + 8 * h)
        if r < N:
            for j in T.unroll(n // 8):
                for x in T.unroll(2):
                    c = T.meta_var(tok_st + 8 * j + 2 * (lane_id % 4) + x)
                    if c < row_end:
                        val[0] = T.Cast(D.dtype, acc[4 * j + 2 * h + x])
                        if masked:
                            D[e, c, r] = val[0]
                        else:
                            D[c, r] = val[0]


# --- the host-side model (numpy; no torch): routing, operands and the per-expert check that
# the simulator's cases and the CPU tests use (the GPU check does the same with torch) ---
def routing_rows(E: int, M: int, layout: str, seed: int) -> list[int]:
    """A ragged routing of E experts over M rows: expert 1 (when E > 1) empty, expert 0
    holding at least one row, the rest drawn from the seed. Contiguous: the rows sum to
    less than M when M > 1 (the last rows belong to no expert); masked: each count <= M."""
    import numpy as np
    rng = np.random.default_rng(int(seed))
    if layout == "masked":
        rows = [int(x) for x in rng.integers(0, M + 1, E)]
    else:
        cuts = sorted(int(x) for x in rng.integers(0, max(M - 1, 1), E - 1))
        ends = cuts + [max(M - 1, 1)]
        rows = [ends[0]] + [b - a for a, b in zip(ends, ends[1:])]
    if E > 1:
        rows[0] += rows[1] if layout == "contiguous" else 0
        rows[1] = 0
    rows[0] = max(rows[0], 1)
    return rows


def routing_tensor_np(rows, layout: str):
    """The kernel's routing operand: offs (cumulative ends) or counts, int32 (E,)."""
    import numpy as np
    r = np.asarray(rows, dtype=np.int32)
    return np.cumsum(r).astype(np.int32) if layout == "contiguous" else r


def grouped_inputs_np(M: int, N: int, K: int, kwargs: dict, kind: str, seed: int,
                      dtype: str):
    """(A, B, D, {"routing": routing[, "scale"][, "bias"]}) of a grouped case: numerics'
    inputs per expert (B (E, N, K), A (M, K) or (E, M, K)), D all NaN (N/2 wide with SWIGLU),
    the routing of routing_rows; ROW_SCALE: scale float32 in [0.5, 1.5), (M,) or masked
    (E, M); BIAS: bias (E, N) in D's dtype (epilogue.make_bias_np per expert).
    SCALE="mx" (sm_100a): grouped_mx_inputs_np's."""
    import numpy as np
    from tirx_gemm import numerics
    if kwargs.get("SCALE") == "mx":
        return grouped_mx_inputs_np(M, N, K, kwargs, seed, dtype)
    E, layout = int(kwargs.get("E", 8)), kwargs.get("LAYOUT", "contiguous")
    rows = routing_rows(E, M, layout, seed)
    As, Bs = [], []
    for e in range(E if layout == "masked" else 1):
        a, _, _ = numerics.make_inputs_np(M, 8, K, kind, seed * 1000 + e, dtype)
        As.append(a)
    for e in range(E):
        _, b, _ = numerics.make_inputs_np(8, N, K, kind, seed * 1000 + 500 + e, dtype)
        Bs.append(b)
    A = np.stack(As) if layout == "masked" else As[0]
    B = np.stack(Bs)
    n_d = N // 2 if kwargs.get("SWIGLU") else N
    D = np.full((E, M, n_d) if layout == "masked" else (M, n_d), np.nan,
                dtype=numerics.np_dtype(dtype))
    extra = {"routing": routing_tensor_np(rows, layout)}
    if kwargs.get("ROW_SCALE"):
        rng = np.random.default_rng(int(seed) + 104729)
        extra["scale"] = (rng.random((E, M) if layout == "masked" else (M,)) + 0.5).astype(
            np.float32)
    if kwargs.get("BIAS"):
        from tirx_gemm import epilogue as EPI
        extra["bias"] = np.stack([EPI.make_bias_np(N, dtype, seed * 1000 + e) for e in range(E)])
    return A, B, D, extra


def grouped_epilogue_np(acc, kwargs: dict, bias_e=None, scale_rows=None):
    """What v14's fused epilogue (both arches) makes of an expert's fp32 rows ``acc`` (rows,
    N), as float32 before the one rounding: SWIGLU "halves" ([gate | up] columns) or
    "interleaved" (groups of epilogue.SWIGLU_GROUP) -> silu(gate) * up, N/2 wide; otherwise
    (acc + bias_e) * scale_rows[:, None] (BIAS: bias_e (N,); ROW_SCALE: scale_rows (rows,))."""
    import numpy as np
    from tirx_gemm import epilogue as EPI
    acc = np.asarray(acc, dtype=np.float32)
    if kwargs.get("SWIGLU") == "halves":
        gate, up = np.split(acc, 2, axis=-1)
        return EPI.swiglu_np(gate, up)
    if kwargs.get("SWIGLU") == "interleaved":
        gate, up = EPI.split_gate_up_np(acc.T)
        return EPI.swiglu_np(gate.T, up.T)
    out = EPI.apply_np(acc, bias_e if kwargs.get("BIAS") else None)
    if kwargs.get("ROW_SCALE"):
        out = (out.astype(np.float64) * np.asarray(scale_rows, np.float64)[:, None]).astype(
            np.float32)
    return out


class GroupedCompare:
    """numerics.compare_np over the rows the experts own, plus the rows nobody owns: those
    must still hold D's NaN (never written)."""

    def __init__(self, inner, stray: int, owned: int):
        self.inner, self.stray, self.owned = inner, stray, owned
        self.ok = inner.ok and stray == 0
        self.rel_frobenius_error = inner.rel_frobenius_error

    def summary(self) -> str:
        extra = f"; {self.stray} element(s) written in rows no expert owns" if self.stray else ""
        return f"{self.inner.summary()} ({self.owned} owned rows){extra}"


def grouped_check_np(out, A, B, R, kwargs: dict, dtype: str, kind: str,
                     scales: dict | None = None) -> GroupedCompare:
    """Compare a grouped output with the per-expert fp32 reference (numerics' rules).
    SCALE="mx": ``scales`` holds the blocked SFA and SFB (grouped_mx_inputs_np's), the
    reference is numerics.reference_mx_np's float64 sum per expert with the decoded scale
    factors, compared under v13's fp8 tolerances. ROW_SCALE, BIAS, SWIGLU: ``scales`` holds
    grouped_inputs_np's ``scale`` / ``bias``, the reference is grouped_epilogue_np's,
    compared under epilogue.tolerance (not exact, even on integer inputs)."""
    import numpy as np
    from tirx_gemm import epilogue as EPI
    from tirx_gemm import numerics
    layout = kwargs.get("LAYOUT", "contiguous")
    mx = kwargs.get("SCALE") == "mx"
    if mx and scales is None:
        raise ValueError("grouped_check_np: SCALE='mx' needs scales={'SFA': ..., 'SFB': ...}")
    extra = scales or {}
    for key, name in (("ROW_SCALE", "scale"), ("BIAS", "bias")):
        if kwargs.get(key) and name not in extra:
            raise ValueError(f"grouped_check_np: {key}=True needs scales={{{name!r}: ...}} "
                             f"(grouped_inputs_np's)")

    def plain_of(e, lo, hi):
        return numerics.reference_np(A[e, lo:hi] if layout == "masked" else A[lo:hi], B[e])

    def fused_of(e, lo, hi):
        s = extra.get("scale")
        rows = None if s is None else (s[e, lo:hi] if layout == "masked" else s[lo:hi])
        b = extra.get("bias")
        return grouped_epilogue_np(plain_of(e, lo, hi), kwargs, None if b is None else b[e],
                                   rows)
    epi = any(kwargs.get(k) for k in ("ROW_SCALE", "BIAS", "SWIGLU"))
    ref_of = _mx_reference(A, B, scales, layout) if mx else (fused_of if epi else plain_of)
    out = np.asarray(out, dtype=np.float32)
    got, ref = [], []
    owned = np.zeros(out.shape[:-1], dtype=bool)
    start = 0
    for e in range(B.shape[0]):
        if layout == "masked":
            r = int(R[e])
            got.append(out[e, :r])
            ref.append(ref_of(e, 0, r))
            owned[e, :r] = True
        else:
            end = int(R[e])
            got.append(out[start:end])
            ref.append(ref_of(e, start, end))
            owned[start:end] = True
            start = end
    stray = int(np.count_nonzero(~np.isnan(out[~owned])))
    if mx:
        inner = numerics.compare_fp8_np(np.concatenate(got), np.concatenate(ref),
                                        out_dtype=dtype, K=A.shape[-1],
                                        promote=numerics.fp8_promote(kwargs))
    elif epi:
        inner = EPI.compare_np(np.concatenate(got), np.concatenate(ref),
                               {"SWIGLU": True} if kwargs.get("SWIGLU") else {}, dtype,
                               K=A.shape[-1])
    else:
        inner = numerics.compare_np(np.concatenate(got), np.concatenate(ref), dtype=dtype,
                                    exact=kind == "int")
    return GroupedCompare(inner, stray, int(owned.sum()))


# --- SCALE="mx" (sm_100a v14): e4m3 operands with v13's UE8M0 scale factors ---
def grouped_mx_inputs_np(M: int, N: int, K: int, kwargs: dict, seed: int, dtype: str):
    """(A, B, D, {"routing", "SFA", "SFB"}) of a grouped MXFP8 case: A (M, K) (masked
    (E, M, K)) and B (E, N, K) e4m3 as uint8 bytes, quantized per 32 of K by
    numerics.make_mx_inputs_np; SFA the blocked SFs (numerics.mx_block_sf_np) of A's rows
    (masked: one block per expert, stacked), SFB expert e's blocked SFs stacked; D all NaN;
    the routing of routing_rows."""
    import numpy as np
    from tirx_gemm import numerics
    E, layout = int(kwargs.get("E", 8)), kwargs.get("LAYOUT", "contiguous")
    rows = routing_rows(E, M, layout, seed)
    As, SFAs, Bs, SFBs = [], [], [], []
    for e in range(E if layout == "masked" else 1):
        a, _, sfa, _, _ = numerics.make_mx_inputs_np(M, 1, K, seed * 1000 + e, dtype)
        As.append(numerics.fp8_bytes_np(a))
        SFAs.append(numerics.mx_block_sf_np(sfa, K))
    for e in range(E):
        _, b, _, sfb, _ = numerics.make_mx_inputs_np(1, N, K, seed * 1000 + 500 + e, dtype)
        Bs.append(numerics.fp8_bytes_np(b))
        SFBs.append(numerics.mx_block_sf_np(sfb, K))
    masked = layout == "masked"
    A = np.stack(As) if masked else As[0]
    SFA = np.stack(SFAs) if masked else SFAs[0]
    D = np.full((E, M, N) if masked else (M, N), np.nan, dtype=numerics.np_dtype(dtype))
    return A, np.stack(Bs), D, {"routing": routing_tensor_np(rows, layout), "SFA": SFA,
                                "SFB": np.stack(SFBs)}


def _mx_reference(A, B, scales, layout: str):
    """(e, lo, hi) -> the float64 reference of expert e's rows [lo, hi) (masked: of A[e]):
    numerics.reference_mx_np on the e4m3 values and the unblocked scale factors."""
    from tirx_gemm import numerics
    K = A.shape[-1]
    masked = layout == "masked"
    rows = A.shape[-2]

    def ref(e, lo, hi):
        a = numerics.fp8_from_bytes_np(A[e] if masked else A)
        sfa = numerics.mx_unblock_sf_np(scales["SFA"][e] if masked else scales["SFA"], rows, K)
        b = numerics.fp8_from_bytes_np(B[e])
        sfb = numerics.mx_unblock_sf_np(scales["SFB"][e], B.shape[1], K)
        return numerics.reference_mx_np(a[lo:hi], b, sfa[lo:hi], sfb)
    return ref
