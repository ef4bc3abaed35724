"""Step 1 (sm_90a): one 128x128 output tile, K = 64 -- the whole data path, once.

Lesson: GMEM -> SMEM (thread copies) -> tensor cores (wgmma, accumulator in registers)
-> GMEM. Every later step reuses this path and changes one contract.
"""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W


def hgemm_v1(M: int, N: int, K: int, dtype: str = "float16"):
    """Step card -- v1, single tile.

    Changes: (first step) scope = one CTA = one warpgroup (128 threads), one 128x128x64
    tile; the warpgroup issues every wgmma together.
    Layout: A/B tiles (128, 64) of dtype (float16 or bfloat16), K-major, in 128B-swizzled
    SMEM (what wgmma reads through 64-bit matrix descriptors); fp32 accumulator = the
    wgmma register fragment (64 fp32 per thread per 64x128 block, two blocks).
    Dispatch: Tx.cta.copy (all 128 threads copy: LDG.128/STS.128), wgmma.mma_async
    m64n128k16 (HGMMA; its .f16 or .bf16 variant) issued by the whole warpgroup,
    commit_group + wait_group(0), then the fragment is cast to dtype and stored to GMEM by
    every thread.
    Why: correctness baseline -- fixes the contracts every later step reuses: SMEM writes
    by threads must be made visible to the async proxy (fence.proxy.async) and to the whole
    CTA (bar.sync) before wgmma reads them; wgmma is asynchronous, so the registers it
    writes may be read only after commit_group + wait_group(0), and an operand fence keeps
    the compiler from hoisting those reads above the wait. Performance is not the point:
    1 CTA, one tile.
    Constraints: M = N = 128 and K = 64 exactly; dtype float16 or bfloat16.
    (v1-v3 keep an aligned contract: thread copies have no edge code; v4's TMA lifts it.)
    Shapes are compile-time here, for teaching (one kernel per shape); matmul's kernels take
    M, or the whole shape, at run time (RUNTIME_M: v9-v11 on sm_90a; v12 also RUNTIME_NK).
    Run: ``tirx-gemm run v1 --arch sm_90a`` (compile only: ``tirx-gemm build v1 --arch sm_90a``).
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64            # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)
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
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        pool.commit()
        acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers, not TMEM
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        # --- load: every thread copies part of the tile, then all meet ---
        Tx.cta.copy(Asmem[:, :], A[0:BLK_M, 0:BLK_K])
        Tx.cta.copy(Bsmem[:, :], B[0:BLK_N, 0:BLK_K])
        W.publish_smem_writes()

        # --- compute: the warpgroup issues 4 k16 slices x 2 row blocks = 8 wgmmas
        W.encode_desc(desc_a, Asmem.ptr_to([0, 0]))
        W.encode_desc(desc_b, Bsmem.ptr_to([0, 0]))
        W.mma_fence()  # accumulator registers are about to be written
        W.wgmma_tile(acc, desc_a[0], desc_b[0], False, M_BLOCKS, BLK_N, dtype)
        W.mma_commit()
        W.mma_wait(0)  # all 8 wgmmas done: acc is final
        W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the wait

        # --- writeback: registers -> dtype -> GMEM, the wgmma fragment of each thread ---
        W.store_fragment(D, acc, 0, 0, warp_id, lane_id, M_BLOCKS, BLK_N)

        # --- free: nothing to release (no TMEM: the accumulator is registers) ---

    return kernel
