"""Step 10 (sm_100a): dynamic persistent scheduling -- Cluster Launch Control hands out tiles.

Lesson: v8's persistent pool walks a fixed tile sequence: pair p takes tiles p, p + P,
p + 2P, ... whether or not its SMs are slowed down (another kernel sharing the GPU, a
tile that waits longer on memory). Here the launch has one cluster per cluster tile, as
a non-persistent kernel would, but a cluster that finishes a tile asks the hardware
(clusterlaunchcontrol.try_cancel) to cancel a cluster that has not started yet and
takes that cluster's tile instead. Whoever is free takes the next tile; when nothing is
left to cancel, the request fails and the pair exits. The TMEM accumulator stays
double-buffered (v8's two 256-column buffers), so the epilogue of tile t runs under the
MMAs of tile t+1, whichever tile CLC hands out next.
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H

def hgemm_v10(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 4,
              SM_COUNT: int = 148, CLC: bool = True):
    """Step card -- v10, Cluster Launch Control (CLC): a dynamic tile scheduler on v8.

    Changes from v8 (not v9: its two consumers fill all 512 TMEM columns; v8's double-
      buffered accumulator is kept as it is). The scheduler is the one change:
      * launch: one 2-CTA cluster per 256x256 cluster tile (ceil(M/256) x ceil(N/256)
        clusters); cluster c starts on tile c, its next tiles come from CLC.
      * a scheduler role (warpgroup 1, warp 1, both CTAs): CTA 0's elected lane issues one
        clusterlaunchcontrol.try_cancel (.multicast::cluster::all) per round; the hardware
        cancels a cluster not yet launched and writes a 16-byte response into the slot of
        both CTAs. Every role reads it at the end of its tile (clc.next_tile): cancelled
        cluster's first CTA id x -> "next tile x / 2", W.CLC_NO_TILE -> exit. The protocol
        is W.ClusterLaunchControl's (its slot, barriers and verbs).
      * CLC=False keeps v8's static stride over SM_COUNT // 2 resident pairs; with CLC,
        SM_COUNT only sets tirx_gemm.resident_clusters (what a simulation keeps resident).
      Scope: 2 CTAs x 256 threads; warpgroup 1: warp 3 TMA producer, warp 0 MMA issuer
      (CTA 0), warp 1 scheduler; warpgroup 0: epilogue. One CTA per SM (all of TMEM).
    Why: a static stride assumes every pair is equally fast and resident from the start;
      with CLC a slowed pair takes fewer tiles (not measured: see the lesson).
    Contracts (PipelineState tracks stage and phase):
      tma2mma[s], mma2tma[s], mma2ld[a], ld2mma[a] (CTA 0's, count 256): as v8.
      clc_full   response -> readers, one per CTA, count 1 + 16 bytes: the init thread arms
                 round 0 before the setup cluster barrier, the scheduler warp arms round
                 r + 1 after reading response r; try_cancel completes the bytes in both CTAs.
      clc_empty  readers -> CTA 0's scheduler, CTA 0's copy, count 416 = 2 x (32 scheduler
                 + 32 producer + 128 epilogue) + 32 MMA threads: each reader arrives once it
                 has decoded response r; request r + 1 waits for all.
    Constraints: any M >= 1; N, K multiples of 8; PIPE_DEPTH >= 1; SM_COUNT even; CLC a
      bool; dtype float16 (default) or bfloat16. Edges as v8.
    Run: ``tirx-gemm build v10 --mnk 4096,4096,4096``; ``tirx-gemm sim v10`` (NumSim).
    """
    CTA_PAIR = W.CTA_PAIR
    BLK_M, BLK_N, BLK_K = 128, 128, 64  # per CTA
    MMA_M, MMA_N = CTA_PAIR * BLK_M, CTA_PAIR * BLK_N  # the cluster tile, 256 x 256
    ACC_STAGES = 2  # 2 x 256 fp32 columns = the whole TMEM
    PRODUCER_REGS, EPILOGUE_REGS = 56, 224
    K_TILES = H.ceil_div(K, BLK_K)  # the last K tile is zero-filled past K
    STAGE_BYTES = (BLK_M + BLK_N) * BLK_K * H.ELEM_BYTES  # what one CTA loads per stage
    H.check_edge_shape(M, N, K, dtype)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, BLK_M * BLK_N * H.ELEM_BYTES)
    W.check_even_sm_count(SM_COUNT)
    if not isinstance(CLC, bool):
        raise ValueError(f"CLC={CLC!r} must be True (Cluster Launch Control) or False "
                         f"(v8's static stride over SM_COUNT // 2 pairs)")
    TILES = H.ceil_div(M, MMA_M) * H.ceil_div(N, MMA_N)
    # CLC: one cluster per cluster tile; static: SM_COUNT // 2 persistent pairs (v8)
    CLUSTERS = TILES if CLC else SM_COUNT // CTA_PAIR
    # threads that read each CLC response: scheduler warp, producer warp and epilogue
    # warpgroup in both CTAs, CTA 0's MMA warp
    CLC_READERS = CTA_PAIR * (32 + 32 + 128) + 32

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((BLK_M, BLK_N), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
               D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx = T.cta_id([CLUSTERS * CTA_PAIR])
        rank, _unused = T.cta_id_in_cluster([CTA_PAIR, 1])  # this CTA's place in the pair
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        # arrival counts: tma2mma 1 (CTA 0's expect_tx) + both CTAs' bytes; mma2tma,
        # mma2ld 1 (one multicast commit); ld2mma 2 x 128 (every epilogue thread of the
        # pair); clc_full 1 (its scheduler's expect_tx) + 16 bytes; clc_empty CLC_READERS
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", 1)
        accs = H.Ring(pool, ACC_STAGES, "mma2ld", 1, "ld2mma", CTA_PAIR * 128)
        tma2mma, mma2tma = stages.full, stages.empty
        mma2ld, ld2mma = accs.full, accs.empty
        # clc_full, clc_empty and the 16-byte response slot (allocated also when CLC=False)
        clc = W.ClusterLaunchControl(pool, CLC_READERS, enabled=CLC)
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()

        if wg_id == 0:
            if warp_id == 0:
                if lane_id == 0:
                    stages.init()
                    accs.init()
                    clc.init()  # CLC: arms round 0 before CTA 0 can request it
                W.tmem_alloc_pair(tmem_addr)
        W.publish_setup_cluster()
        tmem = W.tmem_accumulator()
        # CTA 0's copies of the barriers the whole pair signals
        tma2mma_cta0 = tma2mma.in_cta(0)
        ld2mma_cta0 = ld2mma.in_cta(0)
        clc.connect()  # where every reader releases a response: CTA 0's clc_empty

        # the first tile is this cluster's own; with CLC the next ones come from the
        # responses (with one cluster per tile, "cluster c" and "tile c" are one index)
        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, MMA_M), num_n_tiles=H.ceil_div(N, MMA_N),
            num_clusters=CLUSTERS, l2_group_size=8)
        scheduler.init(bx // CTA_PAIR)

        with WarpgroupRole(wg_id, 1, regs=PRODUCER_REGS, increase=False):
            if warp_id == 3:
                # --- load (producer, both CTAs): this CTA's A rows and B rows of the
                # cluster tile, bytes counted on CTA 0's barrier ---
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var((scheduler.m_idx * CTA_PAIR + rank) * BLK_M)
                    n_st = T.meta_var((scheduler.n_idx * CTA_PAIR + rank) * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                        if T.cuda.elect_sync():
                            if rank == 0:
                                tma2mma.arrive_expect_tx(ring.stage, CTA_PAIR * STAGE_BYTES)
                            W.tma_load_pair(Asmem[ring.stage, :, :],
                                            A[m_st:m_st + BLK_M, k * BLK_K:(k + 1) * BLK_K],
                                            tma2mma_cta0.ptr(ring.stage))
                            W.tma_load_pair(Bsmem[ring.stage, :, :],
                                            B[n_st:n_st + BLK_N, k * BLK_K:(k + 1) * BLK_K],
                                            tma2mma_cta0.ptr(ring.stage))
                        ring.advance()
                    clc.next_tile(scheduler, "TMA producer", TILES)
            elif warp_id == 0:
                if rank == 0:
                    # --- compute (MMA issuer, CTA 0 only): one 256x256x64 MMA per stage
                    # for the pair; commits reach both CTAs ---
                    ring = PipelineState(PIPE_DEPTH, 0)
                    acc = PipelineState(ACC_STAGES, 1)
                    while scheduler.valid():
                        # "accumulator empty": both CTAs' epilogues drained this buffer
                        ld2mma.wait(acc.stage, acc.phase, "MMA issuer")
                        W.tcgen05_fence_after_sync()
                        for k in T.serial(K_TILES, annotations=H.ROLLED):
                            tma2mma.wait(ring.stage, ring.phase, "MMA issuer")
                            W.tcgen05_fence_after_sync()
                            if T.cuda.elect_sync():
                                W.mma_tile_pair(tmem, acc.stage * MMA_N, Asmem[ring.stage, :, :],
                                                Bsmem[ring.stage, :, :], MMA_N, k != 0)
                                # stage s is free in both CTAs once these MMAs read it
                                W.mma_commit_pair(mma2tma.ptr(ring.stage))
                            ring.advance()
                        if T.cuda.elect_sync():
                            # "accumulator full", in both CTAs
                            W.mma_commit_pair(mma2ld.ptr(acc.stage))
                        acc.advance()
                        clc.next_tile(scheduler, "MMA issuer", TILES)
            elif warp_id == 1:
                if CLC:
                    # --- schedule (both CTAs): CTA 0 asks the hardware for the next tile
                    # once every reader has released the previous response ---
                    while scheduler.valid():
                        if rank == 0:
                            clc.request("CLC scheduler")  # waits on clc_empty, then try_cancel
                        clc.wait_response("CLC scheduler")
                        clc.decode()
                        clc.advance()
                        if clc.cancelled():
                            # arm the next round before releasing this one: CTA 0 requests
                            # it only after every reader (this warp too) has released
                            if T.cuda.elect_sync():
                                clc.arm()
                            scheduler.init(clc.tile())
                        else:
                            scheduler.init(TILES)
                        clc.release()

        with WarpgroupRole(wg_id, 0, regs=EPILOGUE_REGS, increase=True):
            # --- writeback (epilogue, both CTAs): this CTA's 128 rows x 256 columns in
            # two 128-column chunks, then free the accumulator in CTA 0's ld2mma ---
            acc = PipelineState(ACC_STAGES, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            while scheduler.valid():
                m_st = T.meta_var((scheduler.m_idx * CTA_PAIR + rank) * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * MMA_N)
                # "accumulator full"
                mma2ld.wait(acc.stage, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                for c in T.unroll(MMA_N // BLK_N):
                    Dreg_out = T.alloc_local((BLK_N,), dtype)
                    W.tmem_to_registers(tmem, acc.stage * MMA_N + c * BLK_N, BLK_N, Dreg_out)
                    W.store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st + c * BLK_N, BLK_M,
                                         BLK_N, tid_in_wg, 1)
                # "accumulator empty", after the last tcgen05.ld of this buffer
                W.tcgen05_fence_before_sync()
                ld2mma_cta0.arrive_remote(acc.stage)
                acc.advance()
                clc.next_tile(scheduler, "epilogue", TILES)

        # --- free: the peer's MMA and arrivals touch this CTA until both are done ---
        W.tcgen05_cluster_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free_pair(tmem_addr)

    if CLC and SM_COUNT // CTA_PAIR < TILES:
        # more clusters than a GPU with SM_COUNT SMs holds at once: a simulation may keep
        # only the first SM_COUNT // 2 resident (NumSim's execution subset), so that the
        # others can only be cancelled and their tiles taken over
        kernel = kernel.with_attr("tirx_gemm.resident_clusters", SM_COUNT // CTA_PAIR)
    return kernel
