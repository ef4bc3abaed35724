"""sm_90a step 1: one 128x128 output tile, K = 64, thread copies + wgmma.

The step card is the docstring of the builder below.
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm.helpers import ACC_DTYPE, check_equal, check_tiled_shape, swizzled_layout
from tirx_gemm.hopper import (
    encode_desc,
    fence_operands,
    SMEM_ALIGN,
    store_fragment,
    wgmma_tile,
)


def hgemm_v1(M, N, K, dtype="float16"):
    """sm_90a step 1: one 128x128 output tile, K = 64, thread copies + wgmma.

    Card
    ----
    What changed: first step. The whole Hopper data path in its simplest form:
      GMEM --(all 128 threads, Tx.cta.copy)--> 128B-swizzled SMEM --(wgmma, descriptors)-->
      fp32 accumulators in registers --(cast)--> fp16 --(per-thread stores)--> GMEM.
    Scope / layout / dispatch:
      scope    one CTA = one warpgroup (128 threads); the warpgroup issues every wgmma together
      layout   A and B tiles are (128, 64) fp16, K-major, 128B swizzle; the accumulator is the
               wgmma register fragment (64 fp32 per thread per 64x128 block, two blocks)
      dispatch thread copy (LDG.128/STS.128) + wgmma.mma_async m64n128k16 (HGMMA)
    Why: fixes the contracts every later step reuses: SMEM writes by threads must be made
      visible to the async proxy (fence.proxy.async) and to the whole CTA (bar.sync) before
      wgmma reads them; wgmma is asynchronous, so the registers it writes may be read only
      after commit_group + wait_group(0) (and an operand fence so the compiler cannot hoist
      the reads). Performance is not the point: 1 CTA, one tile.
    Constraints: M = N = 128, K = 64, dtype float16.
    Run: tirx-gemm run v1 --arch sm_90a  (compile only: tirx-gemm build v1 --arch sm_90a)
    """
    # --- tunables (fixed by the lesson) ---
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64           # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)

    check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)
    check_equal("M", M, BLK_M, "v1 computes exactly one output tile")
    check_equal("N", N, BLK_N, "v1 computes exactly one output tile")
    check_equal("K", K, BLK_K, "v1 has no K-loop: one K tile only")

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

        # --- load: every thread copies a share of A and B into the swizzled tiles ---
        Tx.cta.copy(Asmem[:, :], A[0:BLK_M, 0:BLK_K])
        Tx.cta.copy(Bsmem[:, :], B[0:BLK_N, 0:BLK_K])
        # wgmma reads SMEM through the async proxy: order our generic-proxy writes
        # before it, then make sure every thread's share has landed.
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()

        # --- compute: the warpgroup issues 4 k16 slices x 2 row blocks = 8 wgmmas ---
        encode_desc(desc_a, Asmem.ptr_to([0, 0]))
        encode_desc(desc_b, Bsmem.ptr_to([0, 0]))
        T.ptx.wgmma.fence.sync.aligned()  # accumulator registers are about to be written
        wgmma_tile(acc, desc_a[0], desc_b[0], False, M_BLOCKS, BLK_N)
        T.ptx.wgmma.commit_group.sync.aligned()
        T.ptx.wgmma.wait_group.sync.aligned(0)  # all 8 wgmmas done: acc is final
        fence_operands(acc, ACC_REGS)

        # --- writeback: registers -> fp16 -> GMEM ---
        store_fragment(D, acc, 0, 0, warp_id, lane_id, M_BLOCKS, BLK_N)

    return kernel
