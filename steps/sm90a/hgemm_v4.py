"""Step 4 (sm_90a): TMA -- one thread moves whole tiles; an mbarrier counts the bytes.

Lesson: loads become asynchronous copies by the Tensor Memory Accelerator. cta_sync
cannot tell when the TMA engine is done, so an mbarrier (tma_bar) is armed with the
expected byte count (expect_tx). The epilogue also goes through TMA: registers ->
swizzled SMEM -> one TMA store.
"""
from tvm.script import tirx as T

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W


def hgemm_v4(M: int, N: int, K: int, dtype: str = "float16"):
    """Step card -- v4, TMA loads and TMA store.

    Changes from v3: dispatch of the loads: Tx.cta.copy (128 threads computing addresses)
    -> Tx.copy_async(dispatch="tma_explicit", 2D tensor maps with 128B swizzle) issued by
    thread 0, completing on tma_bar after 2 x 128x64 x 2 B = 32 KiB (expect_tx). Dispatch of
    the stores: registers -> fp16/bf16 -> swizzled Dsmem, fence.proxy.async, then one thread
    TMA-stores the 128x128 tile, one box per 64-column half (commit_group / wait_group).
    Layout: a Dsmem staging tile (128x128, 128B swizzle, two 64-column halves). Scope
    unchanged (one warpgroup per 128x128 tile).
    Contracts: tma_bar completes once per K slice, its phase flips per slice; every thread
    waits on it (its acquire makes the TMA-written tiles visible to that thread's wgmma).
    The CTA barrier after each slice's wait_group bounds thread 0: it issues the next TMA
    only when every warp is past the previous phase, so no waiter falls a whole phase
    behind. The TMA store drains (wait_group 0) before Dsmem could be reused.
    Why: the copy no longer costs 32 load/store instructions per thread and slice plus
    address math; the TMA unit moves whole 128-byte rows, swizzled in flight, and writes
    output rows as full lines. Loads and wgmma are still serial inside a CTA; the overlap
    comes from the ~3 CTAs resident per SM (128 threads each; the lesson has their SMEM);
    a ring of stages is v5.
    Edges: each tensor map carries the true extents of A, B and D, so a load box past the
    edge is zero-filled (and still counts in full on tma_bar: expect_tx stays 32 KiB) and a
    store box writes only the part inside D. Zeros add nothing: the grid is ceil(M/128) x
    ceil(N/128), K_TILES = ceil(K/64), and edge tiles need no code of their own (they cost a
    full tile of work: ~5% at M = N = 1000). TMA cannot address a row whose stride is not a
    multiple of 16 bytes, hence N, K multiples of 8.
    Constraints: any M >= 1; N, K multiples of 8 (TMA's 16-byte row stride); dtype float16
    or bfloat16.
    Run: ``tirx-gemm run v4 --arch sm_90a --mnk 4096,4096,4096``.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64            # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)
    K_TILES = H.ceil_div(K, BLK_K)    # the last K tile is zero-filled past K
    H.check_edge_shape(M, N, K, dtype)

    A_layout = H.swizzled_layout((BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((BLK_M, BLK_N), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
               D: T.Buffer((M, N), dtype)):
        T.device_entry()
        bx, by = T.cta_id([H.ceil_div(M, BLK_M), H.ceil_div(N, BLK_N)])  # edge tiles too
        wg_id = T.warpgroup_id([1])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tma_bar = H.Barriers(pool, 1, "tma_bar")
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers, not TMEM
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        # tma_bar: thread 0's expect_tx arrival (1) + the TMA bytes complete it; all
        #   threads wait on it before their wgmma reads SMEM; initial phase 0, flips per slice
        if tid_in_wg == 0:
            tma_bar.init(1)
        W.publish_setup()

        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        W.encode_desc(desc_a, Asmem.ptr_to([0, 0]))
        W.encode_desc(desc_b, Bsmem.ptr_to([0, 0]))

        phase: T.int32 = 0  # phase_tma: parity of the tma_bar phase we wait for
        for k in T.serial(K_TILES, annotations=H.ROLLED):
            # --- load: exactly one thread issues the TMA copies; all wait for the bytes
            if tid_in_wg == 0:
                H.tma_load_tiles(Asmem[:, :], Bsmem[:, :], A, B, m_st, n_st, k * BLK_K,
                                 BLK_M, BLK_N, BLK_K, tma_bar.ptr(0))
            tma_bar.wait(0, phase, "all threads")
            phase = phase ^ 1

            # --- compute: the first slice overwrites the accumulator, the rest add to it
            W.mma_fence()  # accumulator registers are about to be written
            W.wgmma_tile(acc, desc_a[0], desc_b[0], k > 0, M_BLOCKS, BLK_N, dtype)
            W.mma_commit()
            W.mma_wait(0)  # this slice's wgmmas are done
            # WAR on the single SMEM tile: thread 0 issues the next TMA only after every
            # warp has passed its wait_group
            T.cuda.cta_sync()
        W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the last wait

        # --- writeback: registers -> Dsmem -> TMA store (clipped at D's edge) -> GMEM ---
        W.store_fragment(Dsmem, acc, 0, 0, warp_id, lane_id, M_BLOCKS, BLK_N)
        H.fence_proxy_async()  # our generic-proxy writes -> the TMA unit
        T.cuda.cta_sync()                       # every thread's part of the tile is written
        if tid_in_wg == 0:
            W.tma_store_tile(D, Dsmem, 0, m_st, n_st, BLK_M, BLK_N)
            H.store_wait(0)  # Dsmem must outlive the store's reads

        # --- free: nothing to release (no TMEM: the accumulator is registers) ---

    return kernel
