"""Step 6 (sm_100a): a persistent kernel -- SM_COUNT CTAs walk all tiles in L2-friendly order.

Lesson: launch a fixed pool of CTAs (one per SM) that set up TMEM and barriers once,
then take output tiles from a scheduler (ClusterPersistentScheduler2D, l2_group_size=8).
Reusing barriers across tiles is only correct if every barrier ends a tile in the
parity the next tile assumes -- the K-tile parity contract below.
"""
from tvm.script import tirx as T

from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import helpers as H


def hgemm_v6(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 2,
              SM_COUNT: int = 148):
    """Step card -- v6, persistent CTAs + tile scheduler.

    Changes from v5: scope: a 1D grid of SM_COUNT CTAs (148 = the B200's SMs); each walks
    output tiles given by ClusterPersistentScheduler2D (groups of l2_group_size=8 tile
    rows, visited column by column, so neighbouring work shares B tiles in L2). TMEM
    allocation, barrier init and scheduler init happen once per CTA, not once per tile.
    Contract: barriers are reused across tiles and the phases restart at 0 for each
    tile, so each barrier must complete an even number of phases per tile: mma_bar
    completes K_TILES times, each tma_bar[s] K_TILES / PIPE_DEPTH times -> K_TILES must
    be a multiple of 2 * PIPE_DEPTH (4096 / 64 = 64 slices, PIPE_DEPTH=2: fine).
    Why: amortises setup and improves L2 reuse; still no load/MMA/epilogue overlap
    inside a CTA (v7).
    Constraints: M, N multiples of 128; K a multiple of 64 with K/64 a multiple of
    2*PIPE_DEPTH; fp16.
    Run: ``tirx-gemm build v6 --mnk 4096,4096,4096``; executing needs an sm_100a GPU.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    K_TILES = K // BLK_K
    H.check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)
    H.check_pipe_depth(PIPE_DEPTH, (BLK_M + BLK_N) * BLK_K * H.F16_BYTES,
                       BLK_M * BLK_N * H.F16_BYTES)
    H.check_positive_ints(SM_COUNT=SM_COUNT)
    H.check_phase_parity(K // BLK_K, PIPE_DEPTH)

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K))
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K))
    D_layout = H.swizzled_layout((BLK_M, BLK_N))

    @T.prim_func
    def kernel(A: T.Buffer((M, K), "float16"), B: T.Buffer((N, K), "float16"),
               D: T.Buffer((M, N), "float16")):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        tma_bar = pool.alloc((PIPE_DEPTH,), "uint64", align=8)
        mma_bar = pool.alloc((1,), "uint64", align=8)
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), "float16", layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), "float16", layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), "float16", layout=D_layout)
        pool.commit()

        # tma_bar[s]: thread 0's expect_tx arrival (1) + the TMA bytes complete it; all
        #   threads wait on it before the MMA reads stage s; initial phase 0, flips each
        #   time the ring wraps
        # mma_bar: tcgen05.commit arrives (1 arrival) when a slice's MMA is done; all
        #   threads wait on it before reusing SMEM / reading TMEM; initial phase 0, flips
        #   every K slice
        if warp_id == 0:
            if lane_id == 0:
                for s in T.unroll(PIPE_DEPTH):
                    H.init_mbarrier(tma_bar.ptr_to([s]), 1)
                H.init_mbarrier(mma_bar.ptr_to([0]), 1)
            H.tmem_alloc(tmem_addr)
        H.publish_setup()
        tmem = H.tmem_accumulator()
        tid = T.meta_var(warp_id * 32 + lane_id)

        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=M // BLK_M, num_n_tiles=N // BLK_N, num_clusters=SM_COUNT,
            l2_group_size=8)
        scheduler.init(bx)
        while scheduler.valid():
            m_st = T.meta_var(scheduler.m_idx * BLK_M)
            n_st = T.meta_var(scheduler.n_idx * BLK_N)
            # safe only because of the K-tile parity contract (see the step card)
            phase_tma: T.int32 = 0
            phase_mma: T.int32 = 0

            # --- load (prologue): fill the ring ---
            if tid == 0:
                for s in T.unroll(min(PIPE_DEPTH, K_TILES)):
                    H.tma_load_tiles(Asmem[s, :, :], Bsmem[s, :, :], A, B, m_st, n_st, s * BLK_K,
                                     BLK_M, BLK_N, BLK_K, tma_bar.ptr_to([s]))

            for k in T.serial(K_TILES, annotations=H.ROLLED):
                stage = T.meta_var(k % PIPE_DEPTH)
                H.wait_mbarrier(tma_bar.ptr_to([stage]), phase_tma)

                # --- compute: the first slice overwrites the accumulator, the rest add to it
                if tid == 0:
                    H.mma_tile(tmem, Asmem[stage, :, :], Bsmem[stage, :, :], BLK_N, k != 0)
                    H.mma_commit(mma_bar.ptr_to([0]))
                H.wait_mbarrier(mma_bar.ptr_to([0]), phase_mma)
                phase_mma = phase_mma ^ 1  # the barrier completed one phase: wait on the next

                # --- load: the MMA is done with this stage, refill it PIPE_DEPTH slices ahead
                if tid == 0:
                    if k + PIPE_DEPTH < K_TILES:
                        H.tma_load_tiles(Asmem[stage, :, :], Bsmem[stage, :, :], A, B, m_st, n_st,
                                         (k + PIPE_DEPTH) * BLK_K, BLK_M, BLK_N, BLK_K,
                                         tma_bar.ptr_to([stage]))
                if stage == PIPE_DEPTH - 1:
                    phase_tma = phase_tma ^ 1  # wrapping around: every stage starts a new phase

            # --- writeback: TMEM -> registers -> Dsmem -> one TMA store -> GMEM ---
            H.epilogue_to_tma_store(tmem, Dsmem, D, m_st, n_st, BLK_M, BLK_N, tid, tid == 0, 1)

            # every thread is past the epilogue before the next tile's MMA may overwrite TMEM
            T.cuda.cta_sync()
            scheduler.next_tile()

        # --- free ---
        T.cuda.cta_sync()
        if warp_id == 0:
            H.tmem_free(tmem_addr)

    return kernel
