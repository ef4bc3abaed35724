"""Step 2 (sm_100a): a K-loop -- accumulate BLK_K=64 slices into one TMEM accumulator.

Lesson: the mbarrier is reused every iteration, so the phase we wait on must flip every
iteration; accum=False only on the first slice.
"""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H


def hgemm_v2(M: int, N: int, K: int, dtype: str = "float16"):
    """Step card -- v2, K-loop.

    Changes from v1: scope stays one 128x128 output tile; K is now any multiple of 64,
    walked in K_TILES slices. Layout and dispatch unchanged.
    New contract: mma_bar completes once per slice, so ``phase_mma`` flips after each
    wait (wait(0), wait(1), wait(0), ...). Forgetting the flip makes the second wait
    return at once -- the next slice overwrites SMEM while the MMA still reads it.
    Why: real K is thousands; the accumulator stays in TMEM across slices (accum=True).
    Each slice's thread stores are fenced into the async proxy before the barrier that
    hands SMEM to the MMA (v1), and after the MMA's completion a second fence orders its
    async-proxy reads before the next slice's stores (racecheck: "no async->generic
    proxy bridge" without it). Every thread waits on every phase of mma_bar, and the
    next slice's barrier bounds how far thread 0 can run ahead, so no phase is missed.
    Constraints: M = N = 128, K a multiple of 64; dtype float16 (default) or bfloat16.
    Aligned contract (v1-v3): thread copies have no edge code; edge shapes arrive in v4.
    Shapes are compile-time here, for teaching (one kernel per shape); matmul's kernels take
    M, or the whole shape, at run time (RUNTIME_M: v9-v11 on sm_90a; v12 also RUNTIME_NK).
    Run: ``tirx-gemm build v2 --mnk 128,128,1024``; executing needs an sm_100a GPU.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    K_TILES = K // BLK_K
    H.check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)
    H.check_equal("M", M, BLK_M, "step v2 computes a single 128x128 tile (no 2D grid yet)")
    H.check_equal("N", N, BLK_N, "step v2 computes a single 128x128 tile (no 2D grid yet)")

    A_layout = H.swizzled_layout((BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((BLK_N, BLK_K), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
               D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx = T.cta_id([1])  # one CTA: the grid arrives in v3
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        mma_bar = H.Barriers(pool, 1, "mma_bar")
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        pool.commit()

        # mma_bar: tcgen05.commit arrives (1 arrival) when a slice's MMA is done; all
        # threads wait on it before reusing SMEM / reading TMEM; initial phase 0, flips
        # every K slice
        if warp_id == 0:
            if lane_id == 0:
                mma_bar.init(1)
            W.tmem_alloc(tmem_addr)
        W.publish_setup()
        tmem = W.tmem_accumulator()

        phase_mma: T.int32 = 0

        for k in T.serial(K_TILES, annotations=H.ROLLED):
            # --- load: every thread copies part of slice k, then all meet ---
            Tx.cta.copy(Asmem[:, :], A[0:BLK_M, k * BLK_K:(k + 1) * BLK_K])
            Tx.cta.copy(Bsmem[:, :], B[0:BLK_N, k * BLK_K:(k + 1) * BLK_K])
            W.publish_smem_writes()

            # --- compute: the first slice overwrites the accumulator, the rest add to it
            if warp_id == 0:
                if T.cuda.elect_sync():
                    W.mma_tile(tmem, Asmem[:, :], Bsmem[:, :], BLK_N, k != 0)
                    W.mma_commit(mma_bar.ptr(0))
            mma_bar.wait(0, phase_mma, "all threads")
            phase_mma = phase_mma ^ 1  # the barrier completed one phase: wait on the next
            W.reclaim_smem()  # the next slice's stores may overwrite what the MMA read
        W.tcgen05_fence_after_sync()  # TMEM reads below are ordered after the last wait

        # --- writeback: TMEM -> registers -> GMEM, one row per thread ---
        W.epilogue_to_gmem(tmem, D, 0, 0, BLK_N, warp_id * 32 + lane_id, dtype)

        # --- free ---
        W.tcgen05_cta_sync()
        if warp_id == 0:
            W.tmem_free(tmem_addr)

    return kernel
