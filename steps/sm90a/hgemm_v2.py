"""Step 2 (sm_90a): a K-loop -- accumulate BLK_K=64 slices into one register accumulator.

Lesson: the single SMEM tile is overwritten every iteration, so no thread may copy the
next slice until every warp's wgmmas are done with it; scale-d = 0 only on the first slice.
"""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W


def hgemm_v2(M: int, N: int, K: int, dtype: str = "float16"):
    """Step card -- v2, K-loop.

    Changes from v1: scope stays one 128x128 output tile; K is now any multiple of 64,
    walked in K_TILES slices: the load -> wgmma sequence runs once per slice and the
    accumulators stay in registers across iterations. Layout and dispatch unchanged.
    New contract: the first slice issues wgmma with scale-d = 0 (D = A*B, stale registers
    ignored), later ones with scale-d = 1 (D += A*B). A second CTA barrier closes every
    iteration: the single SMEM tile is overwritten by the next slice's copy, so every warp
    must be past its wait_group first (wait_group only covers the calling thread's wgmmas).
    (On sm_100a this step's hazard is the mbarrier phase; on sm_90a with thread copies and
    wgmma.wait_group there is no mbarrier yet -- it appears with TMA in v4.)
    Why: real K is thousands; each slice is one SMEM tile's worth of A and B, and the same
    SMEM and the same registers are reused K / 64 times. Loads and wgmma are still fully
    serialised (copy, sync, compute, wait, sync): that is what v4/v5 attack.
    Constraints: M = N = 128, K a multiple of 64; dtype float16 or bfloat16.
    (v1-v3 keep an aligned contract: thread copies have no edge code; v4's TMA lifts it.)
    Shapes are compile-time here, for teaching (one kernel per shape); matmul's kernels take
    M, or the whole shape, at run time (RUNTIME_M: v9-v11 on sm_90a; v12 also RUNTIME_NK).
    Run: ``tirx-gemm run v2 --arch sm_90a --mnk 128,128,1024``.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64            # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)
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
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        pool.commit()
        acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers, not TMEM
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        W.encode_desc(desc_a, Asmem.ptr_to([0, 0]))
        W.encode_desc(desc_b, Bsmem.ptr_to([0, 0]))

        for k in T.serial(K_TILES, annotations=H.ROLLED):
            # --- load: every thread copies part of slice k, then all meet ---
            Tx.cta.copy(Asmem[:, :], A[0:BLK_M, k * BLK_K:(k + 1) * BLK_K])
            Tx.cta.copy(Bsmem[:, :], B[0:BLK_N, k * BLK_K:(k + 1) * BLK_K])
            W.publish_smem_writes()

            # --- compute: the first slice overwrites the accumulator, the rest add to it
            W.mma_fence()  # accumulator registers are about to be written
            W.wgmma_tile(acc, desc_a[0], desc_b[0], k > 0, M_BLOCKS, BLK_N, dtype)
            W.mma_commit()
            W.mma_wait(0)  # this slice's wgmmas are done
            # WAR on the single SMEM tile: nobody copies slice k+1 until every warp has
            # passed its wait_group (wait_group only covers the calling thread's wgmmas)
            T.cuda.cta_sync()
        W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the last wait

        # --- writeback: registers -> dtype -> GMEM, the wgmma fragment of each thread ---
        W.store_fragment(D, acc, 0, 0, warp_id, lane_id, M_BLOCKS, BLK_N)

        # --- free: nothing to release (no TMEM: the accumulator is registers) ---

    return kernel
