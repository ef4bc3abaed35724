"""Step 6 (sm_100a): a persistent kernel -- SM_COUNT CTAs walk all tiles in L2-friendly order.

Lesson: launch a fixed pool of CTAs (one per SM) that set up TMEM and barriers once,
then take output tiles from a scheduler (ClusterPersistentScheduler2D, l2_group_size=8).
Reusing barriers across tiles means carrying their phases from tile to tile.
"""
from tvm.script import tirx as T

from tvm.backend.cuda.lang import PipelineState
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H


def hgemm_v6(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 2,
              SM_COUNT: int = 148):
    """Step card -- v6, persistent CTAs + tile scheduler.

    Changes from v5: scope: a 1D grid of SM_COUNT CTAs (148 = the B200's SMs); each walks
    output tiles given by ClusterPersistentScheduler2D (groups of l2_group_size=8 tile
    rows, visited column by column, so neighbouring work shares B tiles in L2). TMEM
    allocation, barrier init and scheduler init happen once per CTA, not once per tile.
    Contract: barriers are reused across tiles, so their phases are carried from tile to
    tile, not restarted: the ring position (stage, phase) lives in a PipelineState that
    counts slices for the life of the CTA (global slice g: stage g % PIPE_DEPTH, phase
    (g // PIPE_DEPTH) & 1), and the next tile's prologue fills the stages after the last
    one used. (The seed restarted phases at 0 per tile, which is right only when every
    barrier completes an even number of phases per tile: K/64 a multiple of
    2*PIPE_DEPTH. Carrying them removes that constraint.) As in v4/v5 only warp 0 watches
    the barriers; two CTA barriers per tile hand the accumulator to the epilogue and
    hand TMEM back to the next tile's MMA.
    Why: amortises setup and improves L2 reuse; still no load/MMA/epilogue overlap
    inside a CTA (v7).
    Constraints: any M >= 1; N, K multiples of 8 (edges as in v4: the scheduler walks
    ceil(M/128) x ceil(N/128) tiles); dtype float16 (default) or bfloat16.
    Run: ``tirx-gemm build v6 --mnk 4096,4096,4096``; executing needs an sm_100a GPU.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
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
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        tma_bar = H.Barriers(pool, PIPE_DEPTH, "tma_bar")
        mma_bar = H.Barriers(pool, 1, "mma_bar")
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()

        # tma_bar[s]: the issuing lane's expect_tx arrival (1) + the TMA bytes complete it;
        #   warp 0 waits on it before the MMA reads stage s; initial phase 0, flips each
        #   time the ring wraps
        # mma_bar: tcgen05.commit arrives (1 arrival) when a slice's MMA is done; warp 0
        #   waits on it before refilling the stage; initial phase 0, flips every K slice
        if warp_id == 0:
            if lane_id == 0:
                tma_bar.init(1)
                mma_bar.init(1)
            W.tmem_alloc(tmem_addr)
        W.publish_setup()
        tmem = W.tmem_accumulator()
        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)

        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, BLK_M), num_n_tiles=H.ceil_div(N, BLK_N),
            num_clusters=SM_COUNT, l2_group_size=8)
        scheduler.init(bx)
        # stage and phase of the next slice to consume, carried from tile to tile: global
        # slice g lives in stage g % PIPE_DEPTH and completes phase (g // PIPE_DEPTH) & 1 of
        # tma_bar[stage]; mma_bar completes one phase per slice
        ring = PipelineState(PIPE_DEPTH, 0)
        phase_mma: T.int32 = 0
        while scheduler.valid():
            m_st = T.meta_var(scheduler.m_idx * BLK_M)
            n_st = T.meta_var(scheduler.n_idx * BLK_N)

            # warp 0 alone runs the pipeline (one elected lane issues, the whole warp
            # waits): a barrier phase is watched only by the warp that produces the next one
            if warp_id == 0:
                # --- load (prologue): the ring is empty, fill it from the current stage on
                if T.cuda.elect_sync():
                    for s in T.unroll(min(PIPE_DEPTH, K_TILES)):
                        stage = T.meta_var((ring.stage + s) % PIPE_DEPTH)
                        H.tma_load_tiles(Asmem[stage, :, :], Bsmem[stage, :, :], A, B, m_st,
                                         n_st, s * BLK_K, BLK_M, BLK_N, BLK_K,
                                         tma_bar.ptr(stage))

                for k in T.serial(K_TILES, annotations=H.ROLLED):
                    tma_bar.wait(ring.stage, ring.phase, "warp 0")
                    W.tcgen05_fence_after_sync()  # the MMA below is ordered after the wait

                    # --- compute: the first slice overwrites the accumulator, the rest add
                    if T.cuda.elect_sync():
                        W.mma_tile(tmem, Asmem[ring.stage, :, :], Bsmem[ring.stage, :, :],
                                   BLK_N, k != 0)
                        W.mma_commit(mma_bar.ptr(0))
                    mma_bar.wait(0, phase_mma, "warp 0")
                    phase_mma = phase_mma ^ 1  # the barrier completed one phase: wait on the next

                    # --- load: the MMA is done with this stage, refill it PIPE_DEPTH ahead
                    if T.cuda.elect_sync():
                        if k + PIPE_DEPTH < K_TILES:
                            H.tma_load_tiles(Asmem[ring.stage, :, :], Bsmem[ring.stage, :, :],
                                             A, B, m_st, n_st, (k + PIPE_DEPTH) * BLK_K, BLK_M,
                                             BLK_N, BLK_K, tma_bar.ptr(ring.stage))
                    ring.advance()  # flips the phase when the ring wraps
            # warp 0 has seen the tile's last MMA complete: this barrier hands the
            # accumulator to all
            W.tcgen05_cta_sync()

            # --- writeback: TMEM -> registers -> Dsmem -> one TMA store -> GMEM ---
            W.epilogue_to_tma_store(tmem, Dsmem, D, m_st, n_st, BLK_M, BLK_N, tid_in_wg, 1, dtype)

            # every thread has read TMEM before the next tile's MMA may overwrite it
            W.tcgen05_cta_sync()
            scheduler.next_tile()

        # --- free ---
        W.tcgen05_cta_sync()
        if warp_id == 0:
            W.tmem_free(tmem_addr)

    return kernel
