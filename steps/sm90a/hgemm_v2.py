"""sm_90a step 2: K-loop: accumulate one 128x128 tile over K / 64 slices.

The step card is the docstring of the builder below.
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm.helpers import ACC_DTYPE, ROLLED, check_equal, check_tiled_shape, swizzled_layout
from tirx_gemm.hopper import (
    encode_desc,
    fence_operands,
    SMEM_ALIGN,
    store_fragment,
    wgmma_tile,
)


def hgemm_v2(M, N, K, dtype="float16"):
    """sm_90a step 2: K-loop: accumulate one 128x128 tile over K / 64 slices.

    Card
    ----
    What changed from v1: the load -> wgmma sequence runs once per 64-wide K slice and the
      accumulators stay in registers across iterations. The first slice issues wgmma with
      scale-d = 0 (D = A*B, stale registers ignored), later ones with scale-d = 1 (D += A*B).
      A second CTA barrier closes every iteration: the single SMEM tile is overwritten by the
      next slice's copy, so every warp must be past its wait_group first.
    Scope / layout / dispatch: unchanged (one warpgroup, same tiles, same wgmma); only the
      control flow gains a K-loop.
    Why: real GEMMs have K >> 64. Each slice is one SMEM tile's worth of A and B; the same
      SMEM and the same registers are reused K / 64 times. Loads and wgmma are still fully
      serialised (copy, sync, compute, wait, sync): that is what v4/v5 attack.
      (On Blackwell this step's hazard is the mbarrier phase; on Hopper with thread copies and
      wgmma.wait_group there is no mbarrier yet - it appears with TMA in v4.)
    Constraints: M = N = 128 (still a single output tile), K a multiple of 64, float16.
    Run: tirx-gemm run v2 --arch sm_90a
    """
    # --- tunables (fixed by the lesson) ---
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64           # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)

    check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)
    check_equal("M", M, BLK_M, "v2 still computes a single output tile (the grid comes in v3)")
    check_equal("N", N, BLK_N, "v2 still computes a single output tile (the grid comes in v3)")
    K_TILES = K // BLK_K

    A_layout = swizzled_layout((BLK_M, BLK_K), dtype)
    B_layout = swizzled_layout((BLK_N, BLK_K), dtype)

    @T.prim_func
    def kernel(
        A: T.Buffer((M, K), dtype),
        B: T.Buffer((N, K), dtype),
        D: T.Buffer((M, N), dtype),
    ):
        T.device_entry()
        bx = T.cta_id([1])
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        pool.move_base_to(SMEM_ALIGN)  # tiles start on a 128B-swizzle atom (1024 B) boundary
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        pool.commit()
        acc = T.alloc_local((ACC_REGS,), ACC_DTYPE)
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        encode_desc(desc_a, Asmem.ptr_to([0, 0]))
        encode_desc(desc_b, Bsmem.ptr_to([0, 0]))

        for k in T.serial(K_TILES, annotations=ROLLED):  # kept rolled: SASS size independent of K
            # --- load: every thread copies a share of the k-th A and B slices ---
            Tx.cta.copy(Asmem[:, :], A[0:BLK_M, k * BLK_K : (k + 1) * BLK_K])
            Tx.cta.copy(Bsmem[:, :], B[0:BLK_N, k * BLK_K : (k + 1) * BLK_K])
            # wgmma reads SMEM through the async proxy: order our generic-proxy writes
            # before it, then make sure every thread's share has landed.
            T.ptx.fence.proxy.async_.shared__cta()
            T.cuda.cta_sync()

            # --- compute: 4 k16 slices x 2 row blocks = 8 wgmmas, accumulate after k=0 ---
            T.ptx.wgmma.fence.sync.aligned()  # accumulator registers are about to be written
            wgmma_tile(acc, desc_a[0], desc_b[0], k > 0, M_BLOCKS, BLK_N)
            T.ptx.wgmma.commit_group.sync.aligned()
            T.ptx.wgmma.wait_group.sync.aligned(0)  # this slice's wgmmas are done
            # WAR on the single SMEM tile: nobody copies slice k+1 until every warp has
            # passed its wait_group (wait_group only covers the calling thread's wgmmas).
            T.cuda.cta_sync()
        fence_operands(acc, ACC_REGS)  # acc is final; keep its reads below the last wait

        # --- writeback: registers -> fp16 -> GMEM ---
        store_fragment(D, acc, 0, 0, warp_id, lane_id, M_BLOCKS, BLK_N)

    return kernel
