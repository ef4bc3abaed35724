"""Step 11 (sm_90a): split-K -- few output tiles, many SMs: cut K, reduce the partial sums.

Lesson: v7 gives each 128x256 tile to one CTA, so a GEMM with few tiles and a deep K
(256x256x16384: 2 tiles) keeps 2 of 132 SMs busy. Here each tile's K range is cut into
SPLIT_K splits; a (split, tile) pair is one work unit of the persistent scheduler. Each
consumer warpgroup writes its fp32 partial half-tile to a workspace slab and counts
itself on that half's counter; the warpgroup that completes the count sums all slabs in
split order (the same bits on every run, whatever order the units finish in) and stores
its half of D. With REDUCE="spread", every unit instead waits for all splits of its
tile and each warpgroup sums its own 1/SPLIT_K of its half, so no single unit reads every
slab.
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W
from tirx_gemm import splitk


def hgemm_v11(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 3,
              SM_COUNT: int = 132, L2_GROUP: int = 16, SPLIT_K: int | None = None,
              REDUCE: str | None = None, RUNTIME_M: bool = False, BLK_N: int = 256,
              IN_FLIGHT: int = 8, L2_PROMO: str | None = None, A_HINT: str | None = None,
              B_HINT: str | None = None):
    """Step card -- v11, split-K with a deterministic reduction.

    Changes from v7 (a warp-specialized persistent CTA, one 128xBLK_N tile per unit):
      * units: SPLIT_K x ceil(M/128) unit rows; row r is split r // TILES_M of tile row
        r % TILES_M, covering K tiles [s*K_TILES//SPLIT_K, (s+1)*K_TILES//SPLIT_K).
      * writeback, SPLIT_K > 1: each consumer warpgroup (64 rows) stores its fp32 partial
        half to slab WS[split, tile] and counts itself on CNT[2 * tile + consumer].
      * BLK_N 64, 128 or 256 (the tile width; matmul's splits take 128x64 from 128 rows:
        splitk.split_blk_n); IN_FLIGHT slab chunks a reducing thread loads at once.
    Contracts (cross-CTA, through global memory), per consumer warpgroup c:
      publish: slab half stored, named barrier 1 + c, then atom.acq_rel.gpu.add on the
        half's counter (release: the slab before the count; acquire: earlier slabs).
      "last" (default): the unit that sees old == SPLIT_K - 1 sums slab 0, 1, ... in that
        fixed order, stores the half (TMA, clipped) and zeroes the counter.
      A half wholly past M (M <= 64: the second) publishes, counts and stores nothing.
      "spread": every unit waits (splitk.wait_count) until the count reads SPLIT_K, sums
        its band of the half in split order, stores it with clipped plain stores; a second
        count lets the last unit reset both counters.
    Why: few output tiles with a deep K leave most SMs idle; splitting K fills them, and a
    fixed summation order keeps the bits the same on every run. "last" never waits (any
    SM_COUNT) but one warpgroup reads all slabs; "spread" reads ~1 slab half per unit but
    every unit must be resident: tiles x SPLIT_K <= SM_COUNT, one CTA per SM.
    Constraints: any M >= 1; N, K multiples of 8; float16 or bfloat16; 1 <= SPLIT_K <=
      ceil(K/64); ring and staging within 227 KiB; workspace (splitk.workspace_specs_sm90a)
      WS (SPLIT_K, tiles, 128*BLK_N) fp32 and CNT int32, zero at launch and at exit.
      Left out, SPLIT_K and REDUCE come from splitk.resolve_variant (matmul's rule);
      RUNTIME_M=True needs an explicit SPLIT_K and per-call workspace.
    Run: ``tirx-gemm run v11 --arch sm_90a --mnk 256,256,16384``.
    """
    BLK_M, BLK_K = 128, 64
    splitk.check_blk_n(BLK_N, "sm_90a")
    H.check_positive_ints(IN_FLIGHT=IN_FLIGHT)
    # TMA settings of the operand loads (helpers.tma_hints; None: TVM's defaults)
    A_HINTS = H.tma_hints(L2_PROMO, A_HINT)
    B_HINTS = H.tma_hints(L2_PROMO, B_HINT)
    NUM_CONSUMERS = BLK_M // W.WGMMA_M  # consumer warpgroups, 64 rows each
    PRODUCER = NUM_CONSUMERS            # the producer is the last warpgroup
    ACC_REGS = BLK_N // 2               # fp32 accumulators per consumer thread (128 at 256)
    PRODUCER_REGS, CONSUMER_REGS = 40, 232  # 128*40 + 256*232 <= 64K registers per SM
    # the 40/232 register split only for the 256-wide tile (128 accumulators per thread);
    # narrower tiles need none, and ptxas then sizes the kernel below what the split needs
    SPLIT_REGS = BLK_N > 128
    A_STAGE_BYTES = W.tile_bytes(BLK_M, BLK_K)  # 16 KiB
    B_STAGE_BYTES = W.tile_bytes(BLK_N, BLK_K)  # 32 KiB at BLK_N = 256
    K_TILES = H.ceil_div(K, BLK_K)    # the last K tile is zero-filled past K
    H.check_edge_shape(M, N, K, dtype)
    H.check_pipe_depth(PIPE_DEPTH, A_STAGE_BYTES + B_STAGE_BYTES, W.tile_bytes(BLK_M, BLK_N))
    H.check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)
    # left out: SPLIT_K and REDUCE both from splitk.choose_variant (what matmul builds)
    if RUNTIME_M and SPLIT_K is None:
        raise ValueError("RUNTIME_M=True needs an explicit SPLIT_K: the split chosen for "
                         "one M would be wrong for another")
    SPLIT_K, REDUCE = splitk.resolve_variant(M, N, K, SPLIT_K, REDUCE, SM_COUNT, "sm_90a",
                                             bn=BLK_N)
    # RUNTIME_M: M, the tile count and the workspace extents are bound from the operands
    # at each call; the caller keeps spread's residency rule (tiles x SPLIT_K <= SM_COUNT)
    # per call (splitk.runtime_ok) and passes workspace for at least that many tiles
    M = H.runtime_rows(M, RUNTIME_M)
    TILES_M, TILES_N = H.ceil_div(M, BLK_M), H.ceil_div(N, BLK_N)
    TILES = TILES_M * TILES_N
    SPREAD = splitk.check_split(SPLIT_K, K_TILES, K, 1 if RUNTIME_M else TILES, REDUCE,
                                SM_COUNT)
    # a CTA per unit at most (spread: exactly; with RUNTIME_M the spare CTAs find no unit)
    GRID = SM_COUNT if RUNTIME_M else min(SM_COUNT, TILES * SPLIT_K)
    WS_TILES = H.runtime_extent("WS_TILES") if RUNTIME_M else TILES
    CNT_LEN = (H.runtime_extent("CNT_LEN") if RUNTIME_M
               else TILES * NUM_CONSUMERS * (2 if SPREAD else 1))
    CHUNK = H.SPLITK_CHUNK  # floats per slab store / load of one thread
    # IN_FLIGHT: chunks (4 floats each) a reducing thread loads at once; "last" reads
    # ACC_REGS // CHUNK chunks per slab in rounds of IN_FLIGHT (at most that many)
    IN_FLIGHT_LAST = min(IN_FLIGHT, ACC_REGS // CHUNK)
    if (ACC_REGS // CHUNK) % IN_FLIGHT_LAST:
        raise ValueError(f"IN_FLIGHT={IN_FLIGHT} must divide {ACC_REGS // CHUNK} (the chunks "
                         f"of a thread's slab part at BLK_N={BLK_N}) or exceed it")
    HALF = W.WGMMA_M * BLK_N  # floats of one consumer's half of a slab
    # spread: a slab half is CHUNKS chunks, split s reduces [s*CHUNKS//S, (s+1)*CHUNKS//S);
    # a thread takes every 128th chunk of the band (BAND_ITERS at most) and loads GROUP
    # slabs' worth of them at once
    CHUNKS = HALF // CHUNK
    BAND_ITERS = H.ceil_div(H.ceil_div(CHUNKS, SPLIT_K), 128)
    GROUP = max(1, min(SPLIT_K, IN_FLIGHT // BAND_ITERS))

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    # each consumer's 64 rows contiguous (64 x 256 = four 64x64 swizzled blocks), so that
    # its half is one dense TMA box; the default (128, 256) layout interleaves the halves
    D_layout = H.swizzled_layout((NUM_CONSUMERS, W.WGMMA_M, BLK_N), dtype)

    # the kernel body; WS and CNT are None when SPLIT_K == 1 (no workspace operands)
    @T.inline
    def gemm(A, B, D, WS, CNT):
        T.device_entry()
        bx = T.cta_id([GRID])
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # 0, 1: consumers; 2: producer
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        # tma2mma[s]: the producer thread arrives once per load into stage s
        #   (arrive.expect_tx) and the TMA unit completes the bytes; all 256 consumer
        #   threads wait. Initial phase 0; consumers wait from phase 0.
        # mma2tma[s]: thread 0 of each consumer warpgroup arrives (NUM_CONSUMERS
        #   arrivals) once its wgmmas have finished reading stage s; the producer waits
        #   before reloading it. Initial phase 0; the producer waits from phase 1, which a
        #   fresh barrier counts as complete: every stage starts empty.
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", NUM_CONSUMERS)
        tma2mma, mma2tma = stages.full, stages.empty
        arrivals = pool.alloc((NUM_CONSUMERS,), "int32")  # a half's count before ours
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()

        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        if wg_id == PRODUCER:
            if tid_in_wg == 0:
                stages.init()
        W.publish_setup()

        # every role walks the same unit sequence with its own copy of the scheduler
        # state: SPLIT_K x TILES_M unit rows by TILES_N columns (split-major)
        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=SPLIT_K * TILES_M, num_n_tiles=TILES_N,
            num_clusters=GRID, l2_group_size=L2_GROUP)
        scheduler.init(bx)
        split = T.meta_var(scheduler.m_idx // TILES_M)
        m_st = T.meta_var(scheduler.m_idx % TILES_M * BLK_M)
        n_st = T.meta_var(scheduler.n_idx * BLK_N)
        k_first = T.meta_var(split * K_TILES // SPLIT_K)  # this split's K tiles
        k_count = T.meta_var((split + 1) * K_TILES // SPLIT_K - k_first)

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS if SPLIT_REGS else None,
                           increase=False):
            # --- load (producer): one thread, PIPE_DEPTH slices ahead, across tiles ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    for k in T.serial(k_count, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        H.tma_load_tiles(Asmem[ring.stage, :, :],
                                         Bsmem[ring.stage, :, :], A, B, m_st, n_st,
                                         (k_first + k) * BLK_K,
                                         BLK_M, BLK_N, BLK_K, tma2mma.ptr(ring.stage),
                                         A_HINTS, B_HINTS)
                        ring.advance()
                    scheduler.next_tile()

        # (a comparison, not the (start, stop) form, which 0.27.0.post1 cannot lower)
        with WarpgroupRole(wg_id < NUM_CONSUMERS, True,
                           regs=CONSUMER_REGS if SPLIT_REGS else None, increase=True):
            consumer = T.meta_var(wg_id)  # owns rows [64*consumer, 64*consumer + 64)
            acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers, not TMEM
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            W.encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))
            W.encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0  # stage of the slice whose wgmmas may still be running
            while scheduler.valid():
                for k in T.serial(k_count, annotations=H.ROLLED):
                    tma2mma.wait(ring.stage, ring.phase, "consumer")

                    # --- compute: 4 k16 slices of m64n256k16, accumulate after k=0 ---
                    W.mma_fence()  # earlier reads/writes of acc come first
                    W.wgmma_tile(acc,
                                 W.desc_advance(desc_a[0], ring.stage * A_STAGE_BYTES)
                                 + T.Cast("uint64", consumer * W.DESC_M64_STEP),
                                 W.desc_advance(desc_b[0], ring.stage * B_STAGE_BYTES),
                                 k > 0, 1, BLK_N, dtype)
                    W.mma_commit()
                    # slice k stays in flight; slice k-1 is done, so its stage goes back.
                    # One arrival per warpgroup suffices: a wgmma is one warpgroup-wide
                    # operation, done for all 128 threads once done for thread 0 (CUTLASS
                    # releases its stages the same way).
                    W.mma_wait(1)
                    if k > 0:
                        if tid_in_wg == 0:
                            mma2tma.arrive(held)
                    held = ring.stage
                    ring.advance()
                W.mma_wait(0)  # the unit's last slice is done too
                if tid_in_wg == 0:
                    mma2tma.arrive(held)
                W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the wait

                if SPLIT_K > 1:
                    tile = T.meta_var(scheduler.m_idx % TILES_M * TILES_N + scheduler.n_idx)
                    if m_st + consumer * W.WGMMA_M >= M:
                        # a half wholly past M (a decode shape's second 64 rows): its
                        # partial holds rows no one stores, so it publishes no slab, counts
                        # on no counter and stores nothing (every split of the tile agrees:
                        # they share m_st); -1 is never "last"
                        if tid_in_wg == 0:
                            arrivals[consumer] = -1
                        T.cuda.warpgroup_sync(1 + consumer)
                    else:
                        # --- publish: this split's partial half -> its slab, then count it ---
                        H.splitk_publish(WS, split, tile, consumer * HALF, acc, ACC_REGS, tid_in_wg)
                        T.cuda.warpgroup_sync(1 + consumer)  # all slab stores precede the count
                        if tid_in_wg == 0:
                            H.splitk_count_arrival(arrivals, consumer,
                                                   CNT.ptr_to([tile * NUM_CONSUMERS + consumer]))
                            if SPREAD:
                                # --- wait: for all SPLIT_K splits of the tile (all resident) ---
                                splitk.wait_count(CNT.ptr_to([tile * NUM_CONSUMERS + consumer]),
                                                  SPLIT_K, "CNT", tile * NUM_CONSUMERS + consumer,
                                                  "consumer")
                        T.cuda.warpgroup_sync(1 + consumer)  # hands the count (and acquire) to all
                        if SPREAD:
                            # --- reduce (spread): this split's band of the half, in split order ---
                            q0 = T.meta_var(split * CHUNKS // SPLIT_K)
                            q1 = T.meta_var((split + 1) * CHUNKS // SPLIT_K)
                            band = T.alloc_local((BAND_ITERS * CHUNK,), H.ACC_DTYPE)
                            H.splitk_reduce_band(WS, tile, consumer * HALF, band, q0, q1, SPLIT_K,
                                                 GROUP, tid_in_wg, BAND_ITERS)
                            H.splitk_store_band(D, band, q0, q1, m_st, n_st,
                                                consumer * W.WGMMA_M, M, N, BAND_ITERS,
                                                tid_in_wg)
                            # --- reset: the last unit past its band zeroes both counters ---
                            T.cuda.warpgroup_sync(1 + consumer)  # the half's threads are done
                            if tid_in_wg == 0:
                                H.splitk_retire_spread(CNT, tile * NUM_CONSUMERS + consumer,
                                                       (TILES + tile) * NUM_CONSUMERS + consumer,
                                                       SPLIT_K)
                        elif H.splitk_is_last(arrivals, consumer, SPLIT_K):
                            # --- reduce: every split has published; sum in split order ---
                            H.splitk_reduce_slabs(WS, tile, consumer * HALF, acc, ACC_REGS, SPLIT_K,
                                                  IN_FLIGHT_LAST, tid_in_wg)
                # SPLIT_K = 1: every unit stores its half; else only the reducing one
                # (spread: none, each stored its band above)
                if SPLIT_K == 1 or (not SPREAD and H.splitk_is_last(arrivals, consumer, SPLIT_K)):
                    # --- writeback: this warpgroup's 64x256 half -> Dsmem -> TMA store (clipped) ---
                    row0 = T.meta_var(consumer * W.WGMMA_M)
                    if tid_in_wg == 0:
                        # our previous TMA store must have finished reading these Dsmem rows
                        H.store_wait_read(0)
                    # named barrier 1 or 2 (0 is the CTA-wide one): this warpgroup's 128 threads
                    T.cuda.warpgroup_sync(1 + consumer)
                    W.store_fragment(Dsmem, acc, row0, 0, warp_id, lane_id, 1, BLK_N)
                    H.fence_proxy_async()  # generic-proxy writes -> TMA unit
                    T.cuda.warpgroup_sync(1 + consumer)
                    if tid_in_wg == 0:
                        W.tma_store_tile(D, Dsmem, row0, m_st + row0, n_st, W.WGMMA_M, BLK_N)
                    if SPLIT_K > 1:
                        if tid_in_wg == 0:  # all SPLIT_K arrivals are in: ready for next launch
                            CNT[tile * NUM_CONSUMERS + consumer] = 0
                scheduler.next_tile()

            # --- free: SMEM is released at exit, so the last store must have read it ---
            if tid_in_wg == 0:
                H.store_wait(0)

    if SPLIT_K == 1:
        @T.prim_func
        def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
                   D: T.Buffer((M, N), dtype)):
            gemm(A, B, D, None, None)
    else:
        @T.prim_func
        def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
                   D: T.Buffer((M, N), dtype),
                   WS: T.Buffer((SPLIT_K, WS_TILES, BLK_M * BLK_N), H.ACC_DTYPE),
                   CNT: T.Buffer((CNT_LEN,), "int32")):
            gemm(A, B, D, WS, CNT)

    return kernel
