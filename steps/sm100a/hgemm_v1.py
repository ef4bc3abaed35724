"""Step 1 (sm_100a): one 128x128 output tile, K = 64 -- the whole data path, once.

Lesson: GMEM -> SMEM (thread copies) -> tensor cores (tcgen05.mma, accumulator in TMEM)
-> registers -> GMEM. Every later step reuses this path and changes one contract.
"""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H


def hgemm_v1(M: int, N: int, K: int, dtype: str = "float16"):
    """Step card -- v1, single tile.

    Changes: (first step) scope = one CTA, one warpgroup, one 128x128x64 tile.
    Layout: A/B tiles in 128B-swizzled SMEM (what tcgen05 reads); fp32 accumulator in TMEM.
    Dispatch: Tx.cta.copy (all 128 threads copy), Tx.gemm_async(dispatch="tcgen05") issued
    by one elected thread, tcgen05.commit -> mbarrier, tcgen05.ld for the epilogue.
    Why: correctness baseline -- every synchronisation point exists for a reason that the
    later steps keep (cta_sync before MMA, mbarrier wait before reading TMEM, wait::ld).
    Proxy fence: the threads write SMEM with ordinary stores (the generic proxy) and
    tcgen05.mma reads it through the async proxy; a CTA barrier alone does not order the
    two, so every writer executes fence.proxy.async before the barrier
    (W.publish_smem_writes). Without it racecheck reports a data race with "no
    generic->async proxy bridge". tcgen05 fences (before/after_thread_sync) order the
    tensor-core work around each barrier and wait.
    Simulated: ``tirx-gemm sim v1`` runs it on NumSim, a CPU model of sm_100a.
    Constraints: M = N = 128 and K = 64 exactly; dtype float16 (default) or bfloat16.
    Aligned contract (v1-v3): thread copies have no edge code; edge shapes arrive in v4.
    Shapes are compile-time here, for teaching (one kernel per shape); matmul's kernels take
    M, or the whole shape, at run time (RUNTIME_M: v9-v11 on sm_90a; v12 also RUNTIME_NK).
    Run: ``tirx-gemm build v1`` (compiles here); executing needs a Blackwell (sm_100a) GPU.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    H.check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)
    H.check_equal("M", M, BLK_M, "step v1 computes a single 128x128 tile (no 2D grid yet)")
    H.check_equal("N", N, BLK_N, "step v1 computes a single 128x128 tile (no 2D grid yet)")
    H.check_equal("K", K, BLK_K, "step v1 has no K-loop: one BLK_K=64 tile")

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

        # mma_bar: tcgen05.commit arrives (1 arrival) when the MMA is done; all threads
        # wait on it before reading TMEM; initial phase 0
        if warp_id == 0:
            if lane_id == 0:
                mma_bar.init(1)
            W.tmem_alloc(tmem_addr)
        W.publish_setup()
        tmem = W.tmem_accumulator()

        phase_mma: T.int32 = 0

        # --- load: every thread copies part of the tile, then all meet ---
        Tx.cta.copy(Asmem[:, :], A[0:BLK_M, 0:BLK_K])
        Tx.cta.copy(Bsmem[:, :], B[0:BLK_N, 0:BLK_K])
        W.publish_smem_writes()

        # --- compute: one elected thread issues the tile MMA; the tensor cores do the work
        if warp_id == 0:
            if T.cuda.elect_sync():
                W.mma_tile(tmem, Asmem[:, :], Bsmem[:, :], BLK_N, False)
                W.mma_commit(mma_bar.ptr(0))
        mma_bar.wait(0, phase_mma, "all threads")
        W.tcgen05_fence_after_sync()  # TMEM reads below are ordered after the wait

        # --- writeback: TMEM -> registers -> GMEM, one row per thread ---
        W.epilogue_to_gmem(tmem, D, 0, 0, BLK_N, warp_id * 32 + lane_id, dtype)

        # --- free ---
        W.tcgen05_cta_sync()
        if warp_id == 0:
            W.tmem_free(tmem_addr)

    return kernel
