"""Step 8 (sm_90a): a 2-CTA cluster shares the B tile through TMA multicast.

Lesson: the two CTAs of a cluster compute vertically adjacent tiles and need the same B slice;
each loads half of it and the TMA unit multicasts that half into both CTAs' shared memory.
A stage is refilled only when the consumers of both CTAs released it (remote arrivals).
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W


def hgemm_v8(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 3,
             SM_COUNT: int = 132, L2_GROUP: int = 8):
    """Step card -- v8, 2-CTA cluster with TMA multicast.

    Changes from v7: CTAs run in clusters of CLUSTER_SIZE=2 on vertically adjacent 128x256
      tiles (cluster tile 256x256), which need the same 256x64 slice of B at every K step.
      CTA r fetches rows [128r, 128r+128) of it once and the TMA unit *multicasts* it
      (cta_mask 0b11) into both CTAs' SMEM, completing bytes on the full barrier at the same
      offset in each. A stays per CTA.
      * tma2mma: one expect_tx per stage and CTA for everything that lands in this CTA
        (A 16 KiB + both B halves 32 KiB): half of the B bytes are written by the peer's TMA.
      * mma2tma: a stage is refilled only when the consumers of BOTH CTAs are done with it
        (this CTA's multicast writes the peer's SMEM): each consumer warpgroup arrives in
        both CTAs (remote arrive through mapa), so the count is 4.
      * the scheduler walks 256x256 cluster tiles with SM_COUNT // 2 clusters; both CTAs see
        the same sequence. A CTA whose 128 rows lie past M still runs the whole protocol
        (its B half feeds the peer; its A loads are zeros, its stores write nothing).
      * setup and teardown are cluster-wide: a cluster barrier publishes the inits before
        the peer may signal them, another keeps each CTA alive until the peer is done.
    Why: per CTA and K step 32 KiB of TMA loads instead of 48 KiB, and each B byte leaves L2
      once per cluster. v7 is already near the tensor-core rate, so the gain is small
      (fast.cu reports +1-3% on an H100); the cost is lock-step (a slow CTA stalls its peer)
      and clusters that must fit a GPC. The lesson has what the H200 measured.
    Contracts/Barriers: see the comments at tma2mma and mma2tma.
    Constraints: any M >= 1; N, K multiples of 8; dtype float16 or bfloat16;
      2 <= PIPE_DEPTH with 48 KiB per stage plus 64 KiB Dsmem within 227 KiB
      (PIPE_DEPTH <= 3); SM_COUNT even (the pool is made of CTA pairs).
    Run: ``tirx-gemm run v8 --arch sm_90a --mnk 4096,4096,4096``.
    """
    BLK_M, BLK_N, BLK_K = 128, 256, 64   # per CTA, as v7
    NUM_CONSUMERS = BLK_M // W.WGMMA_M      # consumer warpgroups, 64 rows each
    PRODUCER = NUM_CONSUMERS              # the producer is the last warpgroup
    ACC_REGS = BLK_N // 2                 # fp32 accumulators per consumer thread (128)
    PRODUCER_REGS, CONSUMER_REGS = 40, 232  # 128*40 + 256*232 <= 64K registers per SM
    A_STAGE_BYTES = W.tile_bytes(BLK_M, BLK_K)  # 16 KiB
    B_STAGE_BYTES = W.tile_bytes(BLK_N, BLK_K)  # 32 KiB: half loaded here, half by the peer
    B_HALF = BLK_N // W.CLUSTER_SIZE            # B rows each CTA loads and multicasts (128)

    H.check_edge_shape(M, N, K, dtype)
    W.check_ring_for_wait_one(PIPE_DEPTH)
    H.check_pipe_depth(PIPE_DEPTH, A_STAGE_BYTES + B_STAGE_BYTES, W.tile_bytes(BLK_M, BLK_N))
    H.check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)
    W.check_cluster_pool(SM_COUNT)
    K_TILES = H.ceil_div(K, BLK_K)    # the last K tile is zero-filled past K
    NUM_CLUSTERS = SM_COUNT // W.CLUSTER_SIZE

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((NUM_CONSUMERS, W.WGMMA_M, BLK_N), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
               D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        rank, _unused = T.cta_id_in_cluster([W.CLUSTER_SIZE, 1])  # this CTA's place in the pair
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # 0, 1: consumers; 2: producer
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        # tma2mma[s]: this CTA's producer thread arrives once per load into stage s
        #   (arrive.expect_tx for all 48 KiB landing here); the bytes are completed by this
        #   CTA's TMA (A, own B half) and by the PEER's multicast (the other B half). All
        #   256 consumer threads of this CTA wait. Initial phase 0; consumers wait from 0.
        # mma2tma[s]: thread 0 of each consumer warpgroup of BOTH CTAs arrives
        #   (W.CLUSTER_SIZE * NUM_CONSUMERS = 4 arrivals, two of them remote) once its wgmmas
        #   have finished reading stage s; this CTA's producer waits before refilling it
        #   (its multicast writes both CTAs' stage s). Initial phase 0; the producer waits
        #   from phase 1, which a fresh barrier counts as complete: every stage starts empty.
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1,
                        "mma2tma", W.CLUSTER_SIZE * NUM_CONSUMERS)
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
        # the peer signals these barriers: publish the inits cluster-wide before anyone may
        W.publish_setup_cluster()

        # every role of both CTAs walks the same cluster-tile sequence (the last row of
        # cluster tiles may reach past M: both CTAs still take part in it)
        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, W.CLUSTER_SIZE * BLK_M),
            num_n_tiles=H.ceil_div(N, BLK_N), num_clusters=NUM_CLUSTERS,
            l2_group_size=L2_GROUP)
        scheduler.init(bx // W.CLUSTER_SIZE)

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS, increase=False):
            # --- load (producer): own A rows, own half of B multicast to both CTAs ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var((scheduler.m_idx * W.CLUSTER_SIZE + rank) * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        W.tma_load_multicast_b(Asmem[ring.stage, :, :],
                                               Bsmem[ring.stage, rank * B_HALF:(rank + 1) * B_HALF, :],
                                               A, B, m_st, n_st + rank * B_HALF, k * BLK_K,
                                               BLK_M, B_HALF, BLK_K, BLK_N,
                                               tma2mma.ptr(ring.stage))
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
                m_st = T.meta_var((scheduler.m_idx * W.CLUSTER_SIZE + rank) * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * BLK_N)
                for k in T.serial(K_TILES, annotations=H.ROLLED):
                    tma2mma.wait(ring.stage, ring.phase, "consumer")

                    # --- compute: 4 k16 slices of m64n256k16, accumulate after k=0 ---
                    W.mma_fence()
                    W.wgmma_tile(acc,
                                 W.desc_advance(desc_a[0], ring.stage * A_STAGE_BYTES)
                                 + T.Cast("uint64", consumer * W.DESC_M64_STEP),
                                 W.desc_advance(desc_b[0], ring.stage * B_STAGE_BYTES),
                                 k > 0, 1, BLK_N, dtype)
                    W.mma_commit()
                    # slice k-1 is done: its stage goes back to the producers of both CTAs
                    W.mma_wait(1)
                    if k > 0:
                        W.release_stage_in_cluster(mma2tma, held, tid_in_wg)
                    held = ring.stage
                    ring.advance()
                W.mma_wait(0)  # the tile's last slice is done too
                W.release_stage_in_cluster(mma2tma, held, tid_in_wg)
                W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the wait

                # --- writeback: this warpgroup's 64x256 half -> Dsmem -> TMA store (clipped) ---
                row0 = T.meta_var(consumer * W.WGMMA_M)
                if tid_in_wg == 0:
                    # our previous TMA store must have finished reading these Dsmem rows
                    H.store_wait_read(0)
                T.cuda.warpgroup_sync(1 + consumer)
                W.store_fragment(Dsmem, acc, row0, 0, warp_id, lane_id, 1, BLK_N)
                H.fence_proxy_async()  # generic-proxy writes -> TMA unit
                T.cuda.warpgroup_sync(1 + consumer)
                if tid_in_wg == 0:
                    W.tma_store_tile(D, Dsmem, row0, m_st + row0, n_st, W.WGMMA_M, BLK_N)
                scheduler.next_tile()

            if tid_in_wg == 0:
                H.store_wait(0)

        # --- free: the peer multicasts into this CTA's SMEM and arrives on its barriers
        # until it is done; neither CTA may exit (and release its SMEM) before both are ---
        T.cuda.cluster_sync()

    return kernel
