"""sm_90a step 8: a 2-CTA cluster shares the B tile through TMA multicast.

The step card is the docstring of the builder below.
"""

from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D
from tvm.script import tirx as T

from tirx_gemm.helpers import (
    ACC_DTYPE,
    ROLLED,
    check_multiple,
    check_pipe_depth,
    check_positive_ints,
    check_tiled_shape,
    swizzled_layout,
    wait_mbarrier,
)
from tirx_gemm.hopper import (
    CLUSTER_SIZE,
    check_cluster_pool,
    desc_advance,
    DESC_M64_STEP,
    encode_desc,
    fence_operands,
    init_mbarriers,
    publish_mbarrier_init_cluster,
    release_stage_in_cluster,
    SMEM_ALIGN,
    store_fragment,
    tile_bytes,
    tma_load_multicast_b,
    tma_store_tile,
    wgmma_tile,
    WGMMA_M,
)


def hgemm_v8(M, N, K, dtype="float16", PIPE_DEPTH=3, SM_COUNT=132, L2_GROUP=8):
    """sm_90a step 8: a 2-CTA cluster; each CTA loads half of the shared B tile and multicasts it.

    Card
    ----
    What changed from v7: CTAs are launched in clusters of CLUSTER_SIZE=2. The two CTAs
      of a cluster compute vertically adjacent 128x256 tiles (cluster tile 256x256), which
      need the same 256x64 slice of B at every K step. Instead of both fetching all of it,
      CTA r fetches rows [128r, 128r+128) of the slice once and the TMA unit *multicasts*
      it (cta_mask 0b11) into the same SMEM offset of both CTAs, completing bytes on the
      full barrier at the same offset in each. A stays per CTA (unicast).
      * tma2mma: still one expect_tx per stage and CTA, for everything that lands in this
        CTA (A 16 KB + both B halves 32 KB): half of the B bytes are written, and counted,
        by the peer's TMA.
      * mma2tma: a stage may be refilled only when the consumers of BOTH CTAs are done
        with it, since this CTA's multicast writes into the peer's SMEM. Each consumer
        warpgroup arrives on the stage's empty barrier in both CTAs (a remote mbarrier
        arrive through the cluster's shared-memory window, mapa), so the count is 4.
      * the scheduler walks 256x256 cluster tiles with SM_COUNT // 2 clusters; both CTAs of
        a cluster see the same sequence (they must: each waits for the other's arrivals).
        L2_GROUP=8 cluster-tile rows cover the same 2048 rows of A as v7's 16 tile rows.
      * setup and teardown are cluster-wide: a cluster barrier publishes the barrier inits
        before the peer may signal them, and another keeps each CTA's SMEM and barriers
        alive until the peer has stopped writing and arriving there.
    Scope / layout / dispatch: scope (a cluster of 2 CTAs cooperates on the loads) and
      dispatch (multicast TMA, remote arrivals, cluster scheduler); the CTA's own layout,
      roles, register split and epilogue are v7's.
    Why: per CTA and K step v7 issues 48 KB of TMA loads (A 16 KB + B 32 KB); here 32 KB
      (A 16 KB + half of B 16 KB): one third less L2->SM traffic, and each B byte leaves L2
      once per cluster instead of once per CTA. v7 is close to the tensor-core rate
      (0.98-1.02x torch), so the expected gain is small: fast.cu reports +1-3% from a
      2-CTA cluster with multicast on an H100. The cost: the pair runs in lock-step (a slow
      CTA stalls its peer through the empty barriers), and 2-CTA clusters must fit a GPC.
    Barrier contract: see the comments at tma2mma and mma2tma.
    Constraints: M a multiple of 256 (two 128-row tiles per cluster), N a multiple of 256,
      K a multiple of 64, float16; PIPE_DEPTH >= 1 with 48 KB per stage plus 64 KB Dsmem
      within 227 KB (PIPE_DEPTH <= 3); SM_COUNT even (the pool is made of CTA pairs).
    Run: tirx-gemm run v8 --arch sm_90a
    """
    # --- tunables ---
    BLK_M, BLK_N, BLK_K = 128, 256, 64   # per CTA, as v7
    NUM_CONSUMERS = BLK_M // WGMMA_M      # consumer warpgroups, 64 rows each
    PRODUCER = NUM_CONSUMERS              # the producer is the last warpgroup
    ACC_REGS = BLK_N // 2                 # fp32 accumulators per consumer thread (128)
    PRODUCER_REGS, CONSUMER_REGS = 40, 232  # 128*40 + 256*232 <= 64K registers per SM
    A_STAGE_BYTES = tile_bytes(BLK_M, BLK_K)  # 16 KB
    B_STAGE_BYTES = tile_bytes(BLK_N, BLK_K)  # 32 KB: half loaded here, half by the peer
    B_HALF = BLK_N // CLUSTER_SIZE            # B rows each CTA loads and multicasts (128)

    check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)
    # the two CTAs of a cluster take vertically adjacent tiles: M in whole cluster tiles
    check_multiple("M", M, "the cluster tile height CLUSTER_SIZE*BLK_M", CLUSTER_SIZE * BLK_M)
    check_pipe_depth(PIPE_DEPTH, A_STAGE_BYTES + B_STAGE_BYTES, tile_bytes(BLK_M, BLK_N))
    check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)
    check_cluster_pool(SM_COUNT)
    K_TILES = K // BLK_K
    NUM_CLUSTERS = SM_COUNT // CLUSTER_SIZE

    A_layout = swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = swizzled_layout((NUM_CONSUMERS, WGMMA_M, BLK_N), dtype)

    @T.prim_func
    def kernel(
        A: T.Buffer((M, K), dtype),
        B: T.Buffer((N, K), dtype),
        D: T.Buffer((M, N), dtype),
    ):
        T.device_entry()
        cta = T.cta_id([SM_COUNT])
        rank, _unused = T.cta_id_in_cluster([CLUSTER_SIZE, 1])  # this CTA's place in the pair
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # 0, 1: consumers; 2: producer
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tma2mma = pool.alloc((PIPE_DEPTH,), "uint64", align=8)
        mma2tma = pool.alloc((PIPE_DEPTH,), "uint64", align=8)
        pool.move_base_to(SMEM_ALIGN)  # tiles start on a 128B-swizzle atom (1024 B) boundary
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()

        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        # tma2mma[s]: this CTA's producer thread arrives once per load into stage s
        #   (arrive.expect_tx for all 48 KB landing here); the bytes are completed by this
        #   CTA's TMA (A, own B half) and by the PEER's multicast (the other B half). All
        #   256 consumer threads of this CTA wait. Initial phase 0; consumers wait from 0.
        # mma2tma[s]: thread 0 of each consumer warpgroup of BOTH CTAs arrives
        #   (CLUSTER_SIZE * NUM_CONSUMERS = 4 arrivals, two of them remote) once its wgmmas
        #   have finished reading stage s; this CTA's producer waits before refilling it
        #   (its multicast writes both CTAs' stage s). Initial phase 0; the producer waits
        #   from phase 1, which a fresh barrier counts as complete: every stage starts empty.
        if wg_id == PRODUCER:
            if tid_in_wg == 0:
                init_mbarriers(tma2mma, PIPE_DEPTH, 1)
                init_mbarriers(mma2tma, PIPE_DEPTH, CLUSTER_SIZE * NUM_CONSUMERS)
        # the peer signals these barriers: publish the inits cluster-wide before anyone may
        publish_mbarrier_init_cluster()

        # every role of both CTAs walks the same cluster-tile sequence
        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=M // (CLUSTER_SIZE * BLK_M), num_n_tiles=N // BLK_N,
            num_clusters=NUM_CLUSTERS, l2_group_size=L2_GROUP)
        scheduler.init(cta // CLUSTER_SIZE)

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS, increase=False):
            # --- load (producer): own A rows, own half of B multicast to both CTAs ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var((scheduler.m_idx * CLUSTER_SIZE + rank) * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(K_TILES, annotations=ROLLED):
                        wait_mbarrier(mma2tma.ptr_to([ring.stage]), ring.phase, "mma2tma",
                                      ring.stage, "producer")
                        tma_load_multicast_b(Asmem[ring.stage, :, :],
                                             Bsmem[ring.stage, rank * B_HALF:(rank + 1) * B_HALF, :],
                                             A, B, m_st, n_st + rank * B_HALF, k * BLK_K,
                                             BLK_M, B_HALF, BLK_K, BLK_N,
                                             tma2mma.ptr_to([ring.stage]))
                        ring.advance()
                    scheduler.next_tile()

        # (a comparison, not the (start, stop) form, which 0.27.0.post1 cannot lower)
        with WarpgroupRole(wg_id < NUM_CONSUMERS, True, regs=CONSUMER_REGS, increase=True):
            consumer = T.meta_var(wg_id)  # owns rows [64*consumer, 64*consumer + 64)
            acc = T.alloc_local((ACC_REGS,), ACC_DTYPE)
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))
            encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0  # stage of the slice whose wgmmas may still be running
            while scheduler.valid():
                m_st = T.meta_var((scheduler.m_idx * CLUSTER_SIZE + rank) * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * BLK_N)
                for k in T.serial(K_TILES, annotations=ROLLED):
                    wait_mbarrier(tma2mma.ptr_to([ring.stage]), ring.phase, "tma2mma",
                                  ring.stage, "consumer")

                    # --- compute: 4 k16 slices of m64n256k16, accumulate after k=0 ---
                    T.ptx.wgmma.fence.sync.aligned()
                    wgmma_tile(acc,
                               desc_advance(desc_a[0], ring.stage * A_STAGE_BYTES)
                               + T.Cast("uint64", consumer * DESC_M64_STEP),
                               desc_advance(desc_b[0], ring.stage * B_STAGE_BYTES),
                               k > 0, 1, BLK_N)
                    T.ptx.wgmma.commit_group.sync.aligned()
                    # slice k-1 is done: its stage goes back to the producers of both CTAs
                    T.ptx.wgmma.wait_group.sync.aligned(1)
                    if k > 0:
                        release_stage_in_cluster(mma2tma, held, tid_in_wg)
                    held = ring.stage
                    ring.advance()
                T.ptx.wgmma.wait_group.sync.aligned(0)  # the tile's last slice is done too
                release_stage_in_cluster(mma2tma, held, tid_in_wg)
                fence_operands(acc, ACC_REGS)  # acc is final; keep its reads below the wait

                # --- writeback: this warpgroup's 64x256 half -> Dsmem -> one TMA store ---
                row0 = T.meta_var(consumer * WGMMA_M)
                if tid_in_wg == 0:
                    # our previous TMA store must have finished reading these Dsmem rows
                    T.ptx.cp.async_.bulk.wait_group.read(0)
                T.cuda.warpgroup_sync(1 + consumer)
                store_fragment(Dsmem, acc, row0, 0, warp_id, lane_id, 1, BLK_N)
                T.ptx.fence.proxy.async_.shared__cta()  # generic-proxy writes -> TMA unit
                T.cuda.warpgroup_sync(1 + consumer)
                if tid_in_wg == 0:
                    tma_store_tile(D[m_st + row0 : m_st + row0 + WGMMA_M, n_st : n_st + BLK_N],
                                   Dsmem[row0 : row0 + WGMMA_M, :])
                scheduler.next_tile()

            if tid_in_wg == 0:
                T.ptx.cp.async_.bulk.wait_group(0)

        # --- free: the peer multicasts into this CTA's SMEM and arrives on its barriers
        # until it is done; neither CTA may exit (and release its SMEM) before both are ---
        T.cuda.cluster_sync()

    return kernel
