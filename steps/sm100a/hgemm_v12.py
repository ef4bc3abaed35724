"""Step 12 (sm_100a): one tile cannot serve every shape -- a tile menu in one builder.

Lesson: the tile is a parameter. v7's kernel with BLK_N any multiple of 16 up to 256
(tcgen05.mma's N at M = 128): wave efficiency (how many of the SMs get a tile) and the
bytes each tile moves per flop decide which one a shape should get.
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H
from tirx_gemm import streamk as SK

BLK_N_STEP, BLK_N_MAX = 16, 256  # tcgen05.mma cta_group::1, M = 128: N % 16 == 0, <= 256
READ_MAX = 64  # SWAP_AB, STREAM_K's slabs: accumulator columns per tcgen05.ld
SK_IN_FLIGHT = 8  # STREAM_K: slab chunks (4 floats) a reducing thread loads at once


@T.inline
def publish_slab(WS, s, col0, part, n, tid):
    # STREAM_K: this thread's n fp32 values of columns col0.. of its row -> slab s, the
    # 4-column chunk c at float (c * 128 + tid) * 4 (v11's thread-major order)
    for c in T.unroll(n // H.SPLITK_CHUNK):
        slot = T.meta_var(((col0 // H.SPLITK_CHUNK + c) * 128 + tid) * H.SPLITK_CHUNK)
        Tx.copy(WS[s, slot:slot + H.SPLITK_CHUNK],
                part[c * H.SPLITK_CHUNK:(c + 1) * H.SPLITK_CHUNK])


@T.inline
def reduce_slabs(WS, s0, count, col0, acc, n, R, tid):
    # STREAM_K: acc[0:n] = slab s0 + slab s0 + 1 + ... (count slabs) at this thread's
    # columns col0..col0 + n, in that fixed order (the same bits whatever order the units
    # finished in); R floats (R divides n) loaded together before their adds
    for c in T.unroll(n):
        acc[c] = T.float32(0)
    chunk = T.alloc_local((R,), H.ACC_DTYPE)
    for b in T.unroll(n // R):
        for s in T.serial(count, annotations=H.ROLLED):
            for i in T.unroll(R // H.SPLITK_CHUNK):
                slot = T.meta_var(((col0 + b * R) // H.SPLITK_CHUNK + i) * 128 + tid)
                Tx.copy(chunk[i * H.SPLITK_CHUNK:(i + 1) * H.SPLITK_CHUNK],
                        WS[s0 + s, slot * H.SPLITK_CHUNK:(slot + 1) * H.SPLITK_CHUNK])
            for i in T.unroll(R):
                acc[b * R + i] = acc[b * R + i] + chunk[i]


@T.inline
def store_column_guarded(Dreg_out, D, m0, n, ROWS, M, N):
    # SWAP_AB (a verb of this step): one thread's accumulator row is column n of D; it
    # stores its ROWS values to D[m0:m0 + ROWS, n], a 2-byte store each, skipping a column
    # past N and rows past M. At each j a warp writes 32 neighbouring columns (64 bytes)
    if n < N:
        for j in T.unroll(ROWS):
            if m0 + j < M:
                D[m0 + j, n] = Dreg_out[j]


def default_pipe_depth(BLK_N: int, BLK_M: int = 128, BLK_K: int = 64, EPI_N: int = 64) -> int:
    """PIPE_DEPTH=None: as many stages of (BLK_M + BLK_N) x BLK_K 16-bit values as fit
    beside the BLK_M x EPI_N staging chunk (check_pipe_depth keeps 1 KiB for barriers)."""
    staging = BLK_M * EPI_N * H.ELEM_BYTES
    return H.ring_stages((BLK_M + BLK_N) * BLK_K * H.ELEM_BYTES, staging)


def hgemm_v12(M: int, N: int, K: int, dtype: str = "float16", BLK_N: int = 128,
              PIPE_DEPTH: int | None = None, SM_COUNT: int = 148, RUNTIME_M: bool = False,
              SWAP_AB: bool = False, STREAM_K: bool = False):
    """Step card -- v12, a tile menu.

    Changes from v7: the CTA tile is 128 x BLK_N, BLK_N any multiple of 16 in [16, 256]
      (one 128 x BLK_N x 16 tcgen05.mma per k16, BLK_N fp32 TMEM columns per accumulator,
      the two at TMEM columns 0 and 256). The ring is as deep as fits (PIPE_DEPTH None).
      Epilogue: BLK_N // 64 chunks of 64 columns go TMEM -> registers -> Dsmem -> TMA
      store; the last BLK_N % 64 (16, 32 or 48) are read 16 at a time by tcgen05.ld (its
      widths are powers of two) and stored from the registers in guarded 16-byte pieces.
      No setmaxnreg (an epilogue thread holds 64 columns); min(tiles, SM_COUNT) CTAs walk.
      RUNTIME_M (helpers.runtime_rows): M a run-time variable, SM_COUNT CTAs, one kernel.
      SWAP_AB: the MMA's 128 rows walk N (B's rows), its BLK_N columns M (the tokens); D's
      transpose goes TMEM -> registers -> D by guarded 2-byte stores (no Dsmem).
      STREAM_K (tirx_gemm/streamk.py, sm_90a's plan): with the tail wave under half full
      and >= 16 K steps, full waves run data-parallel, the tail tiles' K steps in units of
      >= 8 (1-2 pieces); a piece's fp32 partial goes to a slab of WS, counted on CNT (v11's
      last arriver), who sums the tile's slabs in K order (the same bits every run).
    Why: the number of tiles decides how many SMs work. 1024^3 in v7's 128x128 tiles is
      64 tiles, 64 of 148 SMs busy; 128x48 makes 176 (148 busy, then 28). Smaller tiles
      cost bytes per multiply-add, 2 (1/128 + 1/BLK_N): large shapes want BLK_N 256 (the
      tensor cores bound), small ones the BLK_N that fills the SMs.
    Barriers (as v7; stage and phase by PipelineState):
      tma2mma[s] TMA -> MMA, expect_tx of (128 + BLK_N) x 64 x 2 bytes, MMA waits phase 0;
      mma2tma[s] MMA -> TMA, tcgen05.commit frees stage s, producer waits from phase 1;
      mma2ld[a]  MMA -> epilogue, tcgen05.commit after a tile's (piece's) last MMA, phase 0;
      ld2mma[a]  epilogue -> MMA, 128 arrivals once every column was read; the MMA warp
                 waits from phase 1. Named barrier 1: the epilogue warpgroup.
    Constraints: any M >= 1; N, K multiples of 8; BLK_N a multiple of 16 in [16, 256];
      PIPE_DEPTH >= 1 within SMEM; SM_COUNT >= 1; float16 or bfloat16; STREAM_K: no SWAP_AB.
    Run: ``tirx-gemm build v12 --mnk 1024,1024,1024``; ``tirx-gemm sim v12`` (NumSim).
    """
    BLK_M, BLK_K = 128, 64
    EPI_N = 64  # epilogue chunk width (columns per TMA store: one 128-byte swizzle row)
    TAIL_N = 16  # tail columns per tcgen05.ld and guarded store
    ACC_STAGES, ACC_COLS = 2, W.TMEM_COLS // 2  # accumulator a at TMEM column 256 * a
    H.check_edge_shape(M, N, K, dtype)
    if isinstance(BLK_N, bool) or not isinstance(BLK_N, int) or BLK_N % BLK_N_STEP \
            or not BLK_N_STEP <= BLK_N <= BLK_N_MAX:
        raise ValueError(f"BLK_N={BLK_N!r} must be a multiple of {BLK_N_STEP} in "
                         f"[{BLK_N_STEP}, {BLK_N_MAX}] (tcgen05.mma at M=128)")
    H.check_positive_ints(SM_COUNT=SM_COUNT)
    if not isinstance(SWAP_AB, bool):
        raise ValueError(f"SWAP_AB={SWAP_AB!r} must be True or False")
    if not isinstance(STREAM_K, bool):
        raise ValueError(f"STREAM_K={STREAM_K!r} must be True or False")
    if STREAM_K and SWAP_AB:
        raise ValueError("STREAM_K=True takes no SWAP_AB (its slabs and reduction store "
                         "D's tiles untransposed)")
    CHUNKS, TAIL = BLK_N // EPI_N, BLK_N % EPI_N  # TMA-stored chunks, guarded tail columns
    # SWAP_AB: D's transpose tile by tile, stored from the registers (no staging tile)
    READ = min(READ_MAX, BLK_N & -BLK_N)  # 16, 32 or 64 columns: divides BLK_N
    STAGING = 0 if SWAP_AB else EPI_N
    STAGE_BYTES = (BLK_M + BLK_N) * BLK_K * H.ELEM_BYTES
    if PIPE_DEPTH is None:
        PIPE_DEPTH = default_pipe_depth(BLK_N, BLK_M, BLK_K, STAGING)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, BLK_M * STAGING * H.ELEM_BYTES)
    K_TILES = H.ceil_div(K, BLK_K)  # the last K tile is zero-filled past K
    # swap-AB: the MMA's 128 rows walk N (B's rows), its BLK_N columns M (the tokens)
    N_TILES = H.ceil_div(M if SWAP_AB else N, BLK_N)
    ROW_TILES = H.ceil_div(N if SWAP_AB else M, BLK_M)
    # RUNTIME_M: M and the tile count are bound at each call; every CTA of the pool runs
    NUM_CTAS = SM_COUNT if RUNTIME_M else min(SM_COUNT, ROW_TILES * N_TILES)
    M = H.runtime_rows(M, RUNTIME_M)
    if SWAP_AB:
        N_TILES = H.ceil_div(M, BLK_N)
    else:
        ROW_TILES = H.ceil_div(M, BLK_M)
    # STREAM_K (tirx_gemm/streamk.py): the plan from the tile and K-step counts, at build
    # time or (RUNTIME_M) on the device; off at a static shape: v12's kernel as is
    OPS = SK.tir_ops(T)
    PLAN = SK.plan(ROW_TILES * N_TILES, K_TILES, SM_COUNT, OPS if RUNTIME_M else SK.PY) \
        if STREAM_K else None
    SK_CODE = STREAM_K and PLAN.on is not False
    if SK_CODE:
        NUM_CTAS = SM_COUNT  # every CTA of the pool holds a unit (or none: u >= units)
    # floats of a slab a reducing thread loads at once: of a 64-column chunk, of a tail
    SK_R, SK_R_TAIL = min(EPI_N, SK_IN_FLIGHT * H.SPLITK_CHUNK), TAIL_N

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((BLK_M, EPI_N), dtype)

    def walking(scheduler):
        # the data-parallel walk: every tile, or (STREAM_K) the full waves before the tail
        return scheduler.linear_idx < PLAN.dp_tiles if SK_CODE else scheduler.valid()

    # STREAM_K, unit u = bx (tirx_gemm/streamk.py): iterations [it0, it1), stream-K tiles
    # t0 .. t0 + count - 1 (1 or 2), K steps [k0, k0 + steps) of tile j; tile j's pieces
    # come from units first(j) .. first(j) + pieces(j) - 1. `iters`, `units`: the plan's
    # counts, read from local variables (run-time values are computed once)
    # the unit's range, its pieces and a tile's pieces as expressions of the run-time
    # plan's counts (tirx_gemm/streamk.py: one text for both arches)
    (sk_it0, sk_it1, sk_t0, sk_tiles, sk_k0, sk_steps, sk_first,
     sk_pieces) = SK.walk(PLAN, OPS)

    # the kernel body; WS and CNT are None without STREAM_K (no workspace operands)
    @T.inline
    def gemm(A, B, D, WS, CNT):
        T.device_entry()
        bx = T.cta_id([NUM_CTAS])
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        # v7's two full/empty rings and their arrival counts: the SMEM stages (tma2mma: 1
        # expect_tx + the bytes; mma2tma: 1 commit) and the TMEM accumulators (mma2ld: 1
        # commit; ld2mma: 128, every epilogue thread)
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", 1)
        accs = H.Ring(pool, ACC_STAGES, "mma2ld", 1, "ld2mma", 128)
        tma2mma, mma2tma = stages.full, stages.empty
        mma2ld, ld2mma = accs.full, accs.empty
        if SK_CODE:  # the stream-K tile's count before this unit's
            arrivals = T.meta_var(pool.alloc((1,), "int32"))
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        if not SWAP_AB:
            Dsmem = T.meta_var(pool.alloc((BLK_M, EPI_N), dtype, layout=D_layout))
        pool.commit()

        if wg_id == 0:
            if warp_id == 0:
                if lane_id == 0:
                    stages.init()
                    accs.init()
                W.tmem_alloc(tmem_addr)
        W.publish_setup()
        tmem = W.tmem_accumulator()

        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=ROW_TILES, num_n_tiles=N_TILES,
            num_clusters=NUM_CTAS, l2_group_size=8)
        scheduler.init(bx)

        with WarpgroupRole(wg_id, 1):
            if warp_id == 3:
                # --- load (producer): keep the ring full, PIPE_DEPTH slices ahead ---
                ring = PipelineState(PIPE_DEPTH, 1)
                while walking(scheduler):
                    m_st = T.meta_var(scheduler.m_idx * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                        if T.cuda.elect_sync():
                            if SWAP_AB:  # the MMA's A tile is B's rows, its B tile A's
                                H.tma_load_tiles(Asmem[ring.stage, :, :],
                                                 Bsmem[ring.stage, :, :], B, A, m_st, n_st,
                                                 k * BLK_K, BLK_M, BLK_N, BLK_K,
                                                 tma2mma.ptr(ring.stage))
                            else:
                                H.tma_load_tiles(Asmem[ring.stage, :, :],
                                                 Bsmem[ring.stage, :, :], A, B, m_st, n_st,
                                                 k * BLK_K, BLK_M, BLK_N, BLK_K,
                                                 tma2mma.ptr(ring.stage))
                        ring.advance()
                    scheduler.next_tile()
                if SK_CODE:
                    # --- load (stream-K): this unit's pieces, in the MMA warp's order ---
                    iters: T.int32 = PLAN.iters
                    units: T.int32 = PLAN.units
                    if bx < units:
                        it0: T.int32 = sk_it0(iters, units, bx)
                        it1: T.int32 = sk_it1(iters, units, bx)
                        for q in T.serial(sk_tiles(it0, it1), annotations=H.ROLLED):
                            j = T.meta_var(sk_t0(it0, it1) + q)
                            # the piece's tile: its place in the walk (the walk is done)
                            scheduler.init(PLAN.dp_tiles + j)
                            for k in T.serial(sk_steps(it0, it1, j), annotations=H.ROLLED):
                                mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                                if T.cuda.elect_sync():
                                    H.tma_load_tiles(Asmem[ring.stage, :, :],
                                                     Bsmem[ring.stage, :, :], A, B,
                                                     scheduler.m_idx * BLK_M,
                                                     scheduler.n_idx * BLK_N,
                                                     (sk_k0(it0, it1, j) + k) * BLK_K, BLK_M,
                                                     BLK_N, BLK_K, tma2mma.ptr(ring.stage))
                                ring.advance()
            elif warp_id == 0:
                # --- compute (MMA issuer): one elected lane issues, commits free stages ---
                ring = PipelineState(PIPE_DEPTH, 0)
                acc = PipelineState(ACC_STAGES, 1)
                while walking(scheduler):
                    # the epilogue must have drained this accumulator (tile i - 2)
                    ld2mma.wait(acc.stage, acc.phase, "MMA issuer")
                    W.tcgen05_fence_after_sync()
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        tma2mma.wait(ring.stage, ring.phase, "MMA issuer")
                        W.tcgen05_fence_after_sync()
                        if T.cuda.elect_sync():
                            W.mma_tile_at(tmem, acc.stage * ACC_COLS, Asmem[ring.stage, :, :],
                                          Bsmem[ring.stage, :, :], BLK_N, k != 0)
                            # stage is free once these MMAs have read it
                            W.mma_commit(mma2tma.ptr(ring.stage))
                        ring.advance()
                    if T.cuda.elect_sync():
                        # the accumulator is final once every MMA of the tile completed
                        W.mma_commit(mma2ld.ptr(acc.stage))
                    acc.advance()
                    scheduler.next_tile()
                if SK_CODE:
                    # --- compute (stream-K): a piece per accumulator, its first K step
                    # overwrites; the epilogue publishes it ---
                    iters: T.int32 = PLAN.iters
                    units: T.int32 = PLAN.units
                    if bx < units:
                        it0: T.int32 = sk_it0(iters, units, bx)
                        it1: T.int32 = sk_it1(iters, units, bx)
                        for q in T.serial(sk_tiles(it0, it1), annotations=H.ROLLED):
                            j = T.meta_var(sk_t0(it0, it1) + q)
                            ld2mma.wait(acc.stage, acc.phase, "MMA issuer")
                            W.tcgen05_fence_after_sync()
                            for k in T.serial(sk_steps(it0, it1, j), annotations=H.ROLLED):
                                tma2mma.wait(ring.stage, ring.phase, "MMA issuer")
                                W.tcgen05_fence_after_sync()
                                if T.cuda.elect_sync():
                                    W.mma_tile_at(tmem, acc.stage * ACC_COLS,
                                                  Asmem[ring.stage, :, :],
                                                  Bsmem[ring.stage, :, :], BLK_N, k != 0)
                                    W.mma_commit(mma2tma.ptr(ring.stage))
                                ring.advance()
                            if T.cuda.elect_sync():
                                W.mma_commit(mma2ld.ptr(acc.stage))
                            acc.advance()

        with WarpgroupRole(wg_id, 0):
            # --- writeback (epilogue): 64-column chunks by TMA store, the tail guarded ---
            acc = PipelineState(ACC_STAGES, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            while walking(scheduler):
                m_st = T.meta_var(scheduler.m_idx * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * BLK_N)
                mma2ld.wait(acc.stage, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                if SWAP_AB:
                    # D's transpose: accumulator row tid_in_wg is D's column m_st + tid_in_wg
                    # (B's row), its columns D's rows n_st.. (the tokens)
                    for c in T.unroll(BLK_N // READ):
                        Dcol = T.alloc_local((READ,), dtype)
                        W.tmem_to_registers(tmem, acc.stage * ACC_COLS + c * READ,
                                            READ, Dcol)
                        store_column_guarded(Dcol, D, n_st + c * READ, m_st + tid_in_wg,
                                             READ, M, N)
                else:
                    for i in T.unroll(CHUNKS):
                        Dreg_out = T.alloc_local((EPI_N,), dtype)
                        W.tmem_to_registers(tmem, acc.stage * ACC_COLS + i * EPI_N, EPI_N,
                                            Dreg_out)
                        W.store_rows_via_tma(Dreg_out, Dsmem, 0, D, m_st, n_st + i * EPI_N,
                                             BLK_M, EPI_N, tid_in_wg, 1)
                    for t in T.unroll(TAIL // TAIL_N):
                        # the tail, 16 columns per tcgen05.ld (its widths are powers of two)
                        col = T.meta_var(CHUNKS * EPI_N + t * TAIL_N)
                        Dtail = T.alloc_local((TAIL_N,), dtype)
                        W.tmem_to_registers(tmem, acc.stage * ACC_COLS + col, TAIL_N, Dtail)
                        W.store_row_guarded(Dtail, D, m_st + tid_in_wg, n_st + col, TAIL_N, M, N)
                # every tcgen05.ld of this accumulator has completed: hand it back
                W.tcgen05_fence_before_sync()
                ld2mma.arrive(acc.stage)
                acc.advance()
                scheduler.next_tile()
            if SK_CODE:
                # --- writeback (stream-K): each piece's fp32 partial -> slab bx + j ---
                iters: T.int32 = PLAN.iters
                units: T.int32 = PLAN.units
                if bx < units:
                    it0: T.int32 = sk_it0(iters, units, bx)
                    it1: T.int32 = sk_it1(iters, units, bx)
                    for q in T.serial(sk_tiles(it0, it1), annotations=H.ROLLED):
                        j: T.int32 = sk_t0(it0, it1) + q  # the piece's stream-K tile
                        scheduler.init(PLAN.dp_tiles + j)  # its place in the walk
                        sk_m = T.meta_var(scheduler.m_idx * BLK_M)
                        sk_n = T.meta_var(scheduler.n_idx * BLK_N)
                        mma2ld.wait(acc.stage, acc.phase, "epilogue")
                        W.tcgen05_fence_after_sync()
                        for c in T.unroll(BLK_N // READ):
                            part = T.alloc_local((READ,), H.ACC_DTYPE)  # fp32: not narrowed
                            W.tmem_to_registers(tmem, acc.stage * ACC_COLS + c * READ, READ,
                                                part)
                            publish_slab(WS, SK.slab(bx, j), c * READ, part, READ, tid_in_wg)
                        W.tcgen05_fence_before_sync()
                        ld2mma.arrive(acc.stage)
                        acc.advance()
                        # --- count: v11's "last" protocol, one counter per tile ---
                        T.cuda.warpgroup_sync(1)  # every thread's slab stores precede it
                        if tid_in_wg == 0:
                            H.splitk_count_arrival(arrivals, 0,
                                                   CNT.ptr_to([SK.counter(j, 0, 1)]))
                        T.cuda.warpgroup_sync(1)  # hands the count (and its acquire) to all
                        pieces: T.int32 = sk_pieces(iters, units, j)
                        if H.splitk_is_last(arrivals, 0, pieces):
                            # --- reduce: every piece is in; the tile's slabs in K order ---
                            s0 = T.meta_var(SK.slab(sk_first(iters, units, j), j))
                            for i in T.unroll(CHUNKS):
                                sums = T.alloc_local((EPI_N,), H.ACC_DTYPE)
                                reduce_slabs(WS, s0, pieces, i * EPI_N, sums, EPI_N, SK_R,
                                             tid_in_wg)
                                Dreg_out = T.alloc_local((EPI_N,), dtype)
                                Tx.cast(Dreg_out[:], sums[:])
                                W.store_rows_via_tma(Dreg_out, Dsmem, 0, D, sk_m,
                                                     sk_n + i * EPI_N, BLK_M, EPI_N,
                                                     tid_in_wg, 1)
                            for t in T.unroll(TAIL // TAIL_N):
                                col = T.meta_var(CHUNKS * EPI_N + t * TAIL_N)
                                tsums = T.alloc_local((TAIL_N,), H.ACC_DTYPE)
                                reduce_slabs(WS, s0, pieces, col, tsums, TAIL_N, SK_R_TAIL,
                                             tid_in_wg)
                                Dtail = T.alloc_local((TAIL_N,), dtype)
                                Tx.cast(Dtail[:], tsums[:])
                                W.store_row_guarded(Dtail, D, sk_m + tid_in_wg, sk_n + col,
                                                    TAIL_N, M, N)
                            if tid_in_wg == 0:  # every piece counted: zero for the next launch
                                CNT[SK.counter(j, 0, 1)] = 0

        # --- free: only warp 0 of warpgroup 0 allocated, so only it deallocates ---
        W.tcgen05_cta_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free(tmem_addr)

    if STREAM_K:
        @T.prim_func
        def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
                   D: T.Buffer((M, N), dtype),
                   WS: T.Buffer((SK.workspace_slabs(SM_COUNT), BLK_M * BLK_N), H.ACC_DTYPE),
                   CNT: T.Buffer((SK.counters(SM_COUNT),), "int32")):
            gemm(A, B, D, WS, CNT)
    else:
        @T.prim_func
        def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
                   D: T.Buffer((M, N), dtype)):
            gemm(A, B, D, None, None)

    return kernel
