"""Step 8 (sm_100a): 2-CTA MMA -- a pair of CTAs shares one 256x256 tcgen05.mma.

Lesson: in v7 every CTA loads a 128-row slice of A and of B to compute a 128x128 tile:
each staged byte feeds 128 output columns or rows. Here two CTAs of a cluster pool
their slices and CTA 0 issues one MMA with cta_group::2 over the 256x256 cluster tile,
so each staged slice feeds 256 outputs: twice the work per byte of SMEM traffic.
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H


def hgemm_v8(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 4,
             SM_COUNT: int = 148):
    """Step card -- v8, 2-CTA MMA (cta_group::2).

    Changes from v7: scope: a cluster of CTA_PAIR=2 CTAs cooperates on a 256x256 cluster
      tile. Each CTA loads one 128x64 slice of A (its rows) and of B (half the columns) per
      stage; CTA 0's MMA warp issues tcgen05.mma.cta_group::2 (M=256, N=256), which reads
      both CTAs' SMEM and writes each CTA's 128 rows into that CTA's TMEM; CTA 1's MMA warp
      idles. Layout: 256 fp32 columns per tile, still double-buffered (ACC_STAGES=2 x 256 =
      all 512 TMEM columns), allocated and freed with the 2-CTA forms; the epilogue drains
      them in two 128-column chunks. Dispatch: 256x256 cluster tiles over SM_COUNT // 2
      clusters, both CTAs of a pair on one tile sequence.
    Barriers (PipelineState as in v7; "peer" = the other CTA):
      tma2mma[s] only CTA 0's copy: CTA 0's producer arrives with expect_tx for BOTH CTAs'
                 bytes, both CTAs' TMA complete_tx on it; CTA 0's MMA warp waits from phase 0;
      mma2tma[s] one multicast tcgen05.commit arrives in both CTAs; each producer waits on
                 its own copy from phase 1;
      mma2ld[a]  multicast commit after a tile's last MMA; each epilogue waits on its own;
      ld2mma[a]  only CTA 0's copy, count 256: all epilogue threads of BOTH CTAs arrive
                 once done with TMEM stage a; CTA 0's MMA warp starts at phase 1.
      Setup and teardown are cluster-wide: a cluster barrier publishes the inits before the
      peer may signal them, another keeps each CTA (SMEM, TMEM) alive until the peer is done.
    Why: per unit of tensor-core work the pair stages half the A and B bytes of v7; the
      book's published B200 figure for this step is 1328 TFLOP/s at 4096^3, vs 607 for v7
      (not measured here).
    Edges: ceil(M/256) x ceil(N/256) cluster tiles; a CTA whose 128 rows lie past M still
      runs the whole pair protocol (zero loads counted in full on CTA 0's tma2mma, ld2mma
      arrivals, dropped stores), because the pair's MMA and every barrier count both CTAs.
    Constraints: any M >= 1; N, K multiples of 8; PIPE_DEPTH >= 1; SM_COUNT even (CTAs
      come in pairs); dtype float16 (default) or bfloat16.
    Run: ``tirx-gemm build v8 --mnk 4096,4096,4096``; ``tirx-gemm sim v8`` (NumSim).
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

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((BLK_M, BLK_N), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
               D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        rank, _unused = T.cta_id_in_cluster([CTA_PAIR, 1])  # this CTA's place in the pair
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        # arrival counts: tma2mma 1 (CTA 0's expect_tx) + both CTAs' bytes; mma2tma,
        # mma2ld 1 (one multicast commit); ld2mma 2 x 128 (every epilogue thread of the pair)
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", 1)
        accs = H.Ring(pool, ACC_STAGES, "mma2ld", 1, "ld2mma", CTA_PAIR * 128)
        tma2mma, mma2tma = stages.full, stages.empty
        mma2ld, ld2mma = accs.full, accs.empty
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
                W.tmem_alloc_pair(tmem_addr)
        W.publish_setup_cluster()
        tmem = W.tmem_accumulator()
        # CTA 0's copies of the two barriers the whole pair signals
        tma2mma_cta0 = tma2mma.in_cta(0)
        ld2mma_cta0 = ld2mma.in_cta(0)

        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, MMA_M), num_n_tiles=H.ceil_div(N, MMA_N),
            num_clusters=SM_COUNT // CTA_PAIR, l2_group_size=8)
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
                    scheduler.next_tile()
            elif warp_id == 0:
                if rank == 0:
                    # --- compute (MMA issuer, CTA 0 only): one 256x256x64 MMA per stage
                    # for the pair; commits reach both CTAs ---
                    ring = PipelineState(PIPE_DEPTH, 0)
                    acc = PipelineState(ACC_STAGES, 1)
                    while scheduler.valid():
                        # both CTAs' epilogues must have drained this accumulator
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
                            W.mma_commit_pair(mma2ld.ptr(acc.stage))
                        acc.advance()
                        scheduler.next_tile()

        with WarpgroupRole(wg_id, 0, regs=EPILOGUE_REGS, increase=True):
            # --- writeback (epilogue, both CTAs): this CTA's 128 rows x 256 columns in
            # two 128-column chunks, then free the accumulator in CTA 0's ld2mma ---
            acc = PipelineState(ACC_STAGES, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            while scheduler.valid():
                m_st = T.meta_var((scheduler.m_idx * CTA_PAIR + rank) * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * MMA_N)
                mma2ld.wait(acc.stage, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                for c in T.unroll(MMA_N // BLK_N):
                    Dreg_out = T.alloc_local((BLK_N,), dtype)
                    W.tmem_to_registers(tmem, acc.stage * MMA_N + c * BLK_N, BLK_N, Dreg_out)
                    W.store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st + c * BLK_N, BLK_M,
                                         BLK_N, tid_in_wg, 1)
                W.tcgen05_fence_before_sync()
                ld2mma_cta0.arrive_remote(acc.stage)
                acc.advance()
                scheduler.next_tile()

        # --- free: the peer's MMA and arrivals touch this CTA until both are done ---
        W.tcgen05_cluster_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free_pair(tmem_addr)

    return kernel
