"""Step 3 (sm_100a): a 2D grid -- one CTA per 128x128 output tile.

Lesson: scope grows from one CTA to a grid; CTA (bx, by) reads A's row band bx and B's
row band by (B's rows are D's columns: D = A @ B.T) and writes D's tile (bx, by).
"""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H


def hgemm_v3(M: int, N: int, K: int, dtype: str = "float16"):
    """Step card -- v3, 2D grid.

    Changes from v2: scope = a grid of (M/128) x (N/128) CTAs, each the v2 kernel on its
    own output tile (m_st = bx*128, n_st = by*128). Layout and dispatch unchanged.
    Why: a 4096x4096 output is 1024 tiles; one CTA per tile fills all SMs. Each CTA still
    loads synchronously and waits for every MMA: load and compute do not overlap yet,
    and neighbouring CTAs re-read the same A/B bands from GMEM (L2 catches some).
    Constraints: M, N multiples of 128; K a multiple of 64; dtype float16 or bfloat16.
    Aligned contract (v1-v3): thread copies have no edge code; edge shapes arrive in v4.
    Shapes are compile-time here, for teaching (one kernel per shape); matmul's kernels take
    M, or the whole shape, at run time (RUNTIME_M: v9-v11 on sm_90a; v12 also RUNTIME_NK).
    Run: ``tirx-gemm build v3 --mnk 4096,4096,4096``; executing needs an sm_100a GPU.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    K_TILES = K // BLK_K
    H.check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)

    A_layout = H.swizzled_layout((BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((BLK_N, BLK_K), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
               D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx, by = T.cta_id([M // BLK_M, N // BLK_N])
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

        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        phase_mma: T.int32 = 0

        for k in T.serial(K_TILES, annotations=H.ROLLED):
            # --- load: every thread copies part of slice k, then all meet ---
            Tx.cta.copy(Asmem[:, :], A[m_st:m_st + BLK_M, k * BLK_K:(k + 1) * BLK_K])
            Tx.cta.copy(Bsmem[:, :], B[n_st:n_st + BLK_N, k * BLK_K:(k + 1) * BLK_K])
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
        W.epilogue_to_gmem(tmem, D, m_st, n_st, BLK_N, warp_id * 32 + lane_id, dtype)

        # --- free ---
        W.tcgen05_cta_sync()
        if warp_id == 0:
            W.tmem_free(tmem_addr)

    return kernel
