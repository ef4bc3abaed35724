"""Step 3 (sm_90a): a 2D grid -- one CTA per 128x128 output tile.

Lesson: scope grows from one CTA to a grid; CTA (bx, by) reads A's row band bx and B's
row band by (B's rows are D's columns: D = A @ B.T) and writes D's tile (bx, by).
"""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W


def hgemm_v3(M: int, N: int, K: int, dtype: str = "float16"):
    """Step card -- v3, 2D grid.

    Changes from v2: scope = a grid of (M/128) x (N/128) CTAs, each the v2 kernel on its
    own output tile (m_st = bx*128, n_st = by*128): CTA (bx, by) reads the row band
    A[bx*128 : +128, :] and the row band B[by*128 : +128, :] (= the column band of B.T)
    and writes D[bx*128 : +128, by*128 : +128]. Layout and dispatch unchanged.
    Why: a GEMM of useful size has many output tiles and an H100/H200 has 132 SMs; at
    4096^3 the grid is 32 x 32 = 1024 CTAs, several resident per SM, so one CTA's copies
    overlap another CTA's wgmmas even though each CTA is still serial inside (load and
    compute do not overlap yet). Neighbouring CTAs re-read the same A/B bands from GMEM/L2:
    that waste is left for later steps.
    Constraints: M, N multiples of 128; K a multiple of 64; dtype float16 or bfloat16.
    (v1-v3 keep an aligned contract: thread copies have no edge code; v4's TMA lifts it.)
    Shapes are compile-time here, for teaching (one kernel per shape); matmul's kernels take
    M, or the whole shape, at run time (RUNTIME_M: v9-v11 on sm_90a; v12 also RUNTIME_NK).
    Run: ``tirx-gemm run v3 --arch sm_90a --mnk 4096,4096,4096``.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64            # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)
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
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        pool.commit()
        acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers, not TMEM
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        W.encode_desc(desc_a, Asmem.ptr_to([0, 0]))
        W.encode_desc(desc_b, Bsmem.ptr_to([0, 0]))

        for k in T.serial(K_TILES, annotations=H.ROLLED):
            # --- load: every thread copies part of slice k, then all meet ---
            Tx.cta.copy(Asmem[:, :], A[m_st:m_st + BLK_M, k * BLK_K:(k + 1) * BLK_K])
            Tx.cta.copy(Bsmem[:, :], B[n_st:n_st + BLK_N, k * BLK_K:(k + 1) * BLK_K])
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
        W.store_fragment(D, acc, m_st, n_st, warp_id, lane_id, M_BLOCKS, BLK_N)

        # --- free: nothing to release (no TMEM: the accumulator is registers) ---

    return kernel
