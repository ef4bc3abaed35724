"""Step 7 (sm_100a): warp specialization -- TMA producer, MMA issuer and epilogue run at once.

Lesson: in v6 one thread loads, issues the MMA, waits, and then everybody runs the
epilogue: each unit idles while another works. Here each job gets its own warp(s) and
they talk only through mbarriers, so TMA, tensor cores and the epilogue overlap.
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H


def hgemm_v7(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 4,
             SM_COUNT: int = 148):
    """Step card -- v7, warp specialization.

    Changes from v6: scope: two warpgroups (256 threads) with roles --
      warpgroup 1, warp 3: TMA producer (fills the PIPE_DEPTH-stage SMEM ring);
      warpgroup 1, warp 0: MMA issuer (one elected lane issues tcgen05.mma);
      warpgroup 0: epilogue (TMEM -> registers -> Dsmem -> TMA store).
    Layout: the TMEM accumulator is double-buffered (ACC_STAGES=2 x 128 columns), so
    the MMA of tile i+1 runs while the epilogue drains tile i.
    Dispatch: setmaxnreg lowers warpgroup 1 (it needs few registers) and raises
    warpgroup 0 (128 fp32 + 128 16-bit values per thread in the epilogue).
    Barriers (stage and phase tracked by PipelineState):
      tma2mma[s] TMA -> MMA, byte-counted (expect_tx), consumer starts at phase 0;
      mma2tma[s] MMA -> TMA, tcgen05.commit frees stage s, producer starts at phase 1
                 (a fresh barrier has not completed phase "1", so the first wait on
                 every stage passes: all stages start empty);
      mma2ld[a]  MMA -> epilogue, tcgen05.commit after a tile's last MMA, phase 0;
      ld2mma[a]  epilogue -> MMA, 128 epilogue threads arrive after reading TMEM;
                 the MMA warp starts at phase 1 (both accumulators start free).
    Phases are carried across tiles, as in v6.
    Why: overlapping load, MMA and epilogue is what turns the tensor cores from mostly
    idle to mostly busy; the published B200 figure for this step is 607 TFLOP/s at
    4096^3 (not measured here).
    Constraints: any M >= 1; N, K multiples of 8 (edges as in v4); PIPE_DEPTH >= 1;
    dtype float16 (default) or bfloat16.
    Run: ``tirx-gemm build v7 --mnk 4096,4096,4096``; executing needs an sm_100a GPU.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    ACC_STAGES = 2  # 2 x 128 fp32 columns of the 512 in TMEM
    PRODUCER_REGS, EPILOGUE_REGS = 56, 224
    K_TILES = H.ceil_div(K, BLK_K)  # the last K tile is zero-filled past K
    H.check_edge_shape(M, N, K, dtype)
    H.check_pipe_depth(PIPE_DEPTH, (BLK_M + BLK_N) * BLK_K * H.ELEM_BYTES,
                       BLK_M * BLK_N * H.ELEM_BYTES)
    H.check_positive_ints(SM_COUNT=SM_COUNT)

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((BLK_M, BLK_N), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
               D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        # two full/empty rings and their arrival counts: the SMEM stages (tma2mma: 1
        # expect_tx + the bytes; mma2tma: 1 commit) and the TMEM accumulators (mma2ld: 1
        # commit; ld2mma: 128, every epilogue thread)
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", 1)
        accs = H.Ring(pool, ACC_STAGES, "mma2ld", 1, "ld2mma", 128)
        tma2mma = stages.full
        mma2tma = stages.empty
        mma2ld = accs.full
        ld2mma = accs.empty
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
                W.tmem_alloc(tmem_addr)
        W.publish_setup()
        tmem = W.tmem_accumulator()

        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, BLK_M), num_n_tiles=H.ceil_div(N, BLK_N),
            num_clusters=SM_COUNT, l2_group_size=8)
        scheduler.init(bx)

        with WarpgroupRole(wg_id, 1, regs=PRODUCER_REGS, increase=False):
            if warp_id == 3:
                # --- load (producer): keep the ring full, PIPE_DEPTH slices ahead ---
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var(scheduler.m_idx * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                        if T.cuda.elect_sync():
                            H.tma_load_tiles(Asmem[ring.stage, :, :], Bsmem[ring.stage, :, :],
                                             A, B, m_st, n_st, k * BLK_K, BLK_M, BLK_N, BLK_K,
                                             tma2mma.ptr(ring.stage))
                        ring.advance()
                    scheduler.next_tile()
            elif warp_id == 0:
                # --- compute (MMA issuer): one elected lane issues, commits free stages ---
                ring = PipelineState(PIPE_DEPTH, 0)
                acc = PipelineState(ACC_STAGES, 1)
                while scheduler.valid():
                    # the epilogue must have drained this accumulator (tile i - 2)
                    ld2mma.wait(acc.stage, acc.phase, "MMA issuer")
                    W.tcgen05_fence_after_sync()
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        tma2mma.wait(ring.stage, ring.phase, "MMA issuer")
                        W.tcgen05_fence_after_sync()
                        if T.cuda.elect_sync():
                            W.mma_tile_at(tmem, acc.stage * BLK_N, Asmem[ring.stage, :, :],
                                          Bsmem[ring.stage, :, :], BLK_N, k != 0)
                            # stage is free once these MMAs have read it
                            W.mma_commit(mma2tma.ptr(ring.stage))
                        ring.advance()
                    if T.cuda.elect_sync():
                        # the accumulator is final once every MMA of the tile completed
                        W.mma_commit(mma2ld.ptr(acc.stage))
                    acc.advance()
                    scheduler.next_tile()

        with WarpgroupRole(wg_id, 0, regs=EPILOGUE_REGS, increase=True):
            # --- writeback (epilogue): TMEM -> registers, free TMEM, then TMA store ---
            acc = PipelineState(ACC_STAGES, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            while scheduler.valid():
                m_st = T.meta_var(scheduler.m_idx * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * BLK_N)
                mma2ld.wait(acc.stage, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                Dreg_out = T.alloc_local((BLK_N,), dtype)
                W.tmem_to_registers(tmem, acc.stage * BLK_N, BLK_N, Dreg_out)
                W.tcgen05_fence_before_sync()
                ld2mma.arrive(acc.stage)
                W.store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st, BLK_M, BLK_N, tid_in_wg, 1)
                acc.advance()
                scheduler.next_tile()

        # --- free: only warp 0 of warpgroup 0 allocated, so only it deallocates ---
        W.tcgen05_cta_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free(tmem_addr)

    return kernel
