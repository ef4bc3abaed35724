"""sm_90a step 3: 2D grid: one CTA per 128x128 output tile.

The step card is the docstring of the builder below.
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm.helpers import ACC_DTYPE, ROLLED, check_tiled_shape, swizzled_layout
from tirx_gemm.hopper import (
    encode_desc,
    fence_operands,
    SMEM_ALIGN,
    store_fragment,
    wgmma_tile,
)


def hgemm_v3(M, N, K, dtype="float16"):
    """sm_90a step 3: 2D grid: one CTA per 128x128 output tile.

    Card
    ----
    What changed from v2: the grid is (M/128) x (N/128) CTAs. CTA (bx, by) reads the row
      band A[bx*128 : +128, :] and the row band B[by*128 : +128, :] (= the column band of
      B.T) and writes D[bx*128 : +128, by*128 : +128]. The kernel body is v2's, with the
      tile offsets m_st / n_st in the slices and in the epilogue.
    Scope / layout / dispatch: scope changes (grid of CTAs instead of one); layout and
      dispatch are unchanged.
    Why: a GEMM of useful size has many output tiles and an H100/H200 has 132 SMs; at
      4096^3 the grid is 32 x 32 = 1024 CTAs, several resident per SM, so one CTA's copies
      overlap another CTA's wgmmas even though each CTA is still serial inside. Neighbouring
      CTAs re-read the same A/B bands from GMEM/L2: that waste is left for later steps.
    Recorded (NVIDIA H200, `tirx-gemm bench`, results/nvidia-h200.jsonl, git 2a459d3):
      4096^3 297 TFLOP/s (0.40x torch.matmul in the same run).
    Constraints: M, N multiples of 128, K a multiple of 64, float16.
    Run: tirx-gemm run v3 --arch sm_90a
    """
    # --- tunables (fixed by the lesson) ---
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64           # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)

    check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)
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
        bx, by = T.cta_id([M // BLK_M, N // BLK_N])  # one CTA per output tile
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

        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        encode_desc(desc_a, Asmem.ptr_to([0, 0]))
        encode_desc(desc_b, Bsmem.ptr_to([0, 0]))

        for k in T.serial(K_TILES, annotations=ROLLED):  # kept rolled: SASS size independent of K
            # --- load: every thread copies a share of the k-th A and B slices ---
            Tx.cta.copy(Asmem[:, :], A[m_st : m_st + BLK_M, k * BLK_K : (k + 1) * BLK_K])
            Tx.cta.copy(Bsmem[:, :], B[n_st : n_st + BLK_N, k * BLK_K : (k + 1) * BLK_K])
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
        store_fragment(D, acc, m_st, n_st, warp_id, lane_id, M_BLOCKS, BLK_N)

    return kernel
