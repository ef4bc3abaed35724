"""Step 7 (sm_90a): warp specialization -- a TMA producer and two wgmma consumer warpgroups.

Lesson: in v6 one warpgroup loads, issues the wgmmas, waits, and then runs the
epilogue: each unit idles while another works. Here each job gets its own warpgroup(s) and
they talk only through mbarriers (full/empty per stage), so TMA and tensor cores overlap.
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W


def hgemm_v7(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 3,
             SM_COUNT: int = 132, L2_GROUP: int = 16):
    """Step card -- v7, warp specialization.

    Changes from v6: the CTA has three warpgroups with fixed roles instead of one
      warpgroup doing everything in turn.
      * warpgroup 2, the producer: one thread keeps the SMEM ring full, PIPE_DEPTH slices
        ahead, across tile boundaries; setmaxnreg lowers the warpgroup to PRODUCER_REGS.
      * warpgroups 0 and 1, the consumers: each owns 64 rows of a 128x256 CTA tile and issues
        m64n256k16 wgmmas (128 fp32 accumulators per thread); setmaxnreg raises them to
        CONSUMER_REGS. They keep one wgmma group in flight across K steps: issue slice k,
        commit, wait_group(1) (= slice k-1 is done), then hand slice k-1's stage back.
      * every stage has a full/empty mbarrier pair, so producer and consumers never meet at
        a CTA-wide barrier; each consumer stores its own 64x256 half through SMEM with one
        TMA bulk group (named barrier per warpgroup).
      The tile grows from 128x128 to 128x256 (BLK_N=256): each A slice feeds 256 columns,
      so a K step moves 48 KiB for 2 M multiply-adds instead of 32 KiB for 1 M, and one
      m64n256k16 does the work of two m64n128k16.
    Why: in v6 the tensor cores idle at every K step while a warpgroup drains its wgmmas
      (wait_group(0)), syncs the CTA and refills a stage; only the second CTA on the SM
      covers that. Here the producer never stalls a consumer, a consumer's next wgmmas are
      queued before the previous ones finish, and the two consumers share the tensor cores
      (CUTLASS's sm90 warp-specialized structure; the lesson has what the H200 showed).
    Contracts/Barriers: see the comments at tma2mma and mma2tma.
    Constraints: any M >= 1; N, K multiples of 8 (v4's TMA edges; the scheduler walks
      ceil(M/128) x ceil(N/256) tiles); dtype float16 or bfloat16;
      2 <= PIPE_DEPTH (one stage stays with the wgmmas in flight) with 48 KiB per stage plus 64 KiB Dsmem within 227 KiB (PIPE_DEPTH <= 3);
      SM_COUNT >= 1 (the runner passes the device's SM count).
    Run: ``tirx-gemm run v7 --arch sm_90a --mnk 4096,4096,4096``.
    """
    BLK_M, BLK_N, BLK_K = 128, 256, 64
    NUM_CONSUMERS = BLK_M // W.WGMMA_M  # consumer warpgroups, 64 rows each
    PRODUCER = NUM_CONSUMERS            # the producer is the last warpgroup
    ACC_REGS = BLK_N // 2               # fp32 accumulators per consumer thread (128)
    PRODUCER_REGS, CONSUMER_REGS = 40, 232  # 128*40 + 256*232 <= 64K registers per SM
    A_STAGE_BYTES = W.tile_bytes(BLK_M, BLK_K)  # 16 KiB
    B_STAGE_BYTES = W.tile_bytes(BLK_N, BLK_K)  # 32 KiB
    K_TILES = H.ceil_div(K, BLK_K)    # the last K tile is zero-filled past K
    H.check_edge_shape(M, N, K, dtype)
    W.check_ring_for_wait_one(PIPE_DEPTH)
    H.check_pipe_depth(PIPE_DEPTH, A_STAGE_BYTES + B_STAGE_BYTES, W.tile_bytes(BLK_M, BLK_N))
    H.check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    # each consumer's 64 rows contiguous (64 x 256 = four 64x64 swizzled blocks), so that
    # its half is one dense TMA box; the default (128, 256) layout interleaves the halves
    D_layout = H.swizzled_layout((NUM_CONSUMERS, W.WGMMA_M, BLK_N), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
               D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
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

        # every role walks the same tile sequence with its own copy of the scheduler state
        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, BLK_M), num_n_tiles=H.ceil_div(N, BLK_N),
            num_clusters=SM_COUNT, l2_group_size=L2_GROUP)
        scheduler.init(bx)

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS, increase=False):
            # --- load (producer): one thread, PIPE_DEPTH slices ahead, across tiles ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var(scheduler.m_idx * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        H.tma_load_tiles(Asmem[ring.stage, :, :],
                                         Bsmem[ring.stage, :, :], A, B, m_st, n_st, k * BLK_K,
                                         BLK_M, BLK_N, BLK_K, tma2mma.ptr(ring.stage))
                        ring.advance()
                    scheduler.next_tile()

        # (a comparison, not the (start, stop) form, which 0.27.0.post1 cannot lower)
        with WarpgroupRole(wg_id < NUM_CONSUMERS, True, regs=CONSUMER_REGS, increase=True):
            consumer = T.meta_var(wg_id)  # owns rows [64*consumer, 64*consumer + 64)
            acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers, not TMEM
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            W.encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))
            W.encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0  # stage of the slice whose wgmmas may still be running
            while scheduler.valid():
                m_st = T.meta_var(scheduler.m_idx * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * BLK_N)
                for k in T.serial(K_TILES, annotations=H.ROLLED):
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
                W.mma_wait(0)  # the tile's last slice is done too
                if tid_in_wg == 0:
                    mma2tma.arrive(held)
                W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the wait

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
                scheduler.next_tile()

            # --- free: SMEM is released at exit, so the last store must have read it ---
            if tid_in_wg == 0:
                H.store_wait(0)

    return kernel
