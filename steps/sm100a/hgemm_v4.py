"""Step 4 (sm_100a): TMA -- one thread moves whole tiles; an mbarrier counts the bytes.

Lesson: loads become asynchronous copies by the Tensor Memory Accelerator. cta_sync
cannot tell when the TMA engine is done, so a second mbarrier (tma_bar) is armed with
the expected byte count (expect_tx). The epilogue also goes through TMA: registers ->
swizzled SMEM -> TMA stores (one box per 64-column swizzle atom).
"""
from tvm.script import tirx as T

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H


def hgemm_v4(M: int, N: int, K: int, dtype: str = "float16"):
    """Step card -- v4, TMA loads and TMA store.

    Changes from v3: dispatch of the loads: Tx.cta.copy (128 threads computing
    addresses) -> Tx.copy_async(dispatch="tma_explicit") issued by one elected lane of
    warp 0, completing on tma_bar after 2 x 128x64 x 2 bytes = 32 KiB (expect_tx).
    Layout: a Dsmem staging tile for the TMA-store epilogue (one TMA box per 64-column
    swizzle atom). Scope unchanged (one CTA per output tile).
    Contracts: tma_bar and mma_bar each complete once per K slice, both phases flip per
    slice; the TMA store drains (wait_group 0) before Dsmem could be reused.
    Who waits: only warp 0 runs the K-loop (one lane, picked by elect_sync, issues; the
    warp waits), and one CTA barrier after the loop hands the finished accumulator to
    all four warps. With v3's thread copies gone nothing else bounds the issuing lane:
    had warps 1-3 also polled the parity of tma_bar/mma_bar, it could complete two
    phases before a slow warp looked, and that warp would wait forever on a parity that
    had come back (synccheck: the wait on generation 0 overtaken by generation 1). A
    waiter must not fall a whole phase behind the barrier it watches.
    Why: frees the threads from address generation and copies; still load -> wait ->
    MMA -> wait per slice (no overlap yet -- that is v5). The published B200 figure for
    this step in the seed's article series is 278 TFLOP/s at 4096^3 (not measured here).
    Edges: TMA needs no edge code. Each tensor map carries the tensor's true extents
    (M x K, N x K, M x N), so a box that reaches past the edge is legal: a load fills the
    outside part of the SMEM tile with zeros, and the barrier still counts the whole
    box's bytes, so expect_tx stays the full 32 KiB on every slice; a store writes only
    the part inside D. The grid is ceil(M/128) x ceil(N/128) and K_TILES = ceil(K/64),
    the last slice zero-padded; zeros add nothing to the accumulator. The cost: an edge
    tile does a full tile of MMA work (and moves full boxes through SMEM) for the
    rows and columns it keeps, e.g. M = 129 pays for 256 rows.
    Constraints: any M >= 1; N, K multiples of 8 (TMA's 16-byte row strides); dtype
    float16 (default) or bfloat16.
    Run: ``tirx-gemm build v4 --mnk 4096,4096,4096``; executing needs an sm_100a GPU.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    K_TILES = H.ceil_div(K, BLK_K)  # the last K tile is zero-filled past K
    H.check_edge_shape(M, N, K, dtype)

    A_layout = H.swizzled_layout((BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((BLK_M, BLK_N), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
               D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx, by = T.cta_id([H.ceil_div(M, BLK_M), H.ceil_div(N, BLK_N)])
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        tma_bar = H.Barriers(pool, 1, "tma_bar")
        mma_bar = H.Barriers(pool, 1, "mma_bar")
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()

        # tma_bar: the issuing lane's expect_tx arrival (1) + the TMA bytes complete it;
        #   warp 0 waits on it before the MMA reads SMEM; initial phase 0, flips per slice
        # mma_bar: tcgen05.commit arrives (1 arrival) when a slice's MMA is done; warp 0
        #   waits on it before the next load overwrites SMEM; initial phase 0, flips every
        #   K slice
        if warp_id == 0:
            if lane_id == 0:
                tma_bar.init(1)
                mma_bar.init(1)
            W.tmem_alloc(tmem_addr)
        W.publish_setup()
        tmem = W.tmem_accumulator()

        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        phase_tma: T.int32 = 0
        phase_mma: T.int32 = 0
        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)

        # warp 0 alone runs the K-loop (one elected lane issues, the whole warp waits): a
        # barrier phase is watched only by the warp that produces the next one, so no
        # waiter can miss a phase while the issuing lane runs ahead
        if warp_id == 0:
            for k in T.serial(K_TILES, annotations=H.ROLLED):
                # --- load: one elected lane issues the TMA copies; the warp waits for the bytes
                if T.cuda.elect_sync():
                    H.tma_load_tiles(Asmem[:, :], Bsmem[:, :], A, B, m_st, n_st, k * BLK_K,
                                     BLK_M, BLK_N, BLK_K, tma_bar.ptr(0))
                tma_bar.wait(0, phase_tma, "warp 0")
                phase_tma = phase_tma ^ 1
                W.tcgen05_fence_after_sync()  # the MMA below is ordered after the wait

                # --- compute: the first slice overwrites the accumulator, the rest add to it
                if T.cuda.elect_sync():
                    W.mma_tile(tmem, Asmem[:, :], Bsmem[:, :], BLK_N, k != 0)
                    W.mma_commit(mma_bar.ptr(0))
                mma_bar.wait(0, phase_mma, "warp 0")
                phase_mma = phase_mma ^ 1  # the barrier completed one phase: wait on the next
        # warp 0 has seen the last MMA complete: this barrier hands the accumulator to all
        W.tcgen05_cta_sync()

        # --- writeback: TMEM -> registers -> Dsmem -> one TMA store -> GMEM ---
        W.epilogue_to_tma_store(tmem, Dsmem, D, m_st, n_st, BLK_M, BLK_N, tid_in_wg, 1, dtype)

        # --- free ---
        W.tcgen05_cta_sync()
        if warp_id == 0:
            W.tmem_free(tmem_addr)

    return kernel
