"""Step 5 (sm_90a): a PIPE_DEPTH-stage SMEM ring -- load slice k+PIPE_DEPTH while slice k computes.

Lesson: with one A/B buffer the next TMA load must wait for the current wgmmas. A ring of
PIPE_DEPTH buffers, each with its own TMA barrier, lets loads run ahead. Each stage's
barrier completes once per trip around the ring, so its phase flips on wrap-around.
"""
from tvm.script import tirx as T

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W


def hgemm_v5(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 2):
    """Step card -- v5, software pipeline (SMEM ring).

    Changes from v4: layout: A/B SMEM gain a PIPE_DEPTH stage dimension (PIPE_DEPTH copies
    of the 128x64 slices), tma_bar becomes one barrier per stage; the wgmma descriptors
    move by a whole stage (16 KiB of A, 16 KiB of B) per stage index. Dispatch changes only
    in *when* thread 0 issues the TMA: it prefetches the first PIPE_DEPTH slices before the
    K-loop; slice k is read from stage k % PIPE_DEPTH, and as soon as every warp is past
    slice k's wait_group the stage is refilled with slice k + PIPE_DEPTH. Scope is v4's.
    Contracts: tma_bar[s] completes once per ring trip -> ``phase`` flips when the
    consumer wraps from stage PIPE_DEPTH-1 to 0, not every slice as in v4. As in v4, the
    CTA barrier after each slice's wait_group hands the drained stage back to thread 0.
    Why: in v4 every slice pays the whole GMEM->SMEM latency (~1 us, several slices of
    tensor-core work) before its wgmmas start; only the other CTAs on the SM (three fit in
    65 KiB each) hide it. Here the next slice is already in flight while slice k computes,
    so the wait on tma_bar[stage] normally finds the data there. What stays serial inside
    a CTA is wgmma issue -> wait_group(0) -> CTA sync -> refill: each slice drains the
    tensor-core pipe before the next starts (v7 removes that). The default PIPE_DEPTH=2
    (97 KiB) keeps two CTAs per SM, so one CTA's drain is covered by the other's wgmmas;
    PIPE_DEPTH=3 or 4 ran slower on an H200, because 130+ KiB leaves one CTA per SM and
    deeper prefetch cannot cover the drain.
    Constraints: any M >= 1; N, K multiples of 8 (v4's TMA edges: zero-filled loads,
    clipped stores; K_TILES = ceil(K/64), which may be fewer than PIPE_DEPTH); PIPE_DEPTH
    >= 1 and the ring (32 KiB per stage plus 32 KiB Dsmem) must fit in 227 KiB
    (PIPE_DEPTH <= 6); dtype float16 or bfloat16.
    Run: ``tirx-gemm run v5 --arch sm_90a --mnk 4096,4096,4096``.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64            # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)
    A_STAGE_BYTES = W.tile_bytes(BLK_M, BLK_K)  # 16 KiB: one stage of A; descriptors step by it
    B_STAGE_BYTES = W.tile_bytes(BLK_N, BLK_K)
    K_TILES = H.ceil_div(K, BLK_K)    # the last K tile is zero-filled past K
    H.check_edge_shape(M, N, K, dtype)
    H.check_pipe_depth(PIPE_DEPTH, A_STAGE_BYTES + B_STAGE_BYTES, W.tile_bytes(BLK_M, BLK_N))

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
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
        tma_bar = H.Barriers(pool, PIPE_DEPTH, "tma_bar")
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers, not TMEM
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        # tma_bar[s]: thread 0's expect_tx arrival (1) + the TMA bytes complete it; all
        #   threads wait on it before their wgmma reads stage s; initial phase 0, flips each
        #   time the ring wraps (stage s holds slices s, s + PIPE_DEPTH, s + 2*PIPE_DEPTH, ...)
        if tid_in_wg == 0:
            tma_bar.init(1)
        W.publish_setup()

        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        W.encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))  # stage 0; desc_advance reaches stage s
        W.encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))

        # --- load (prologue): fill the ring ---
        if tid_in_wg == 0:
            for s in T.unroll(min(PIPE_DEPTH, K_TILES)):
                H.tma_load_tiles(Asmem[s, :, :], Bsmem[s, :, :], A, B, m_st, n_st,
                                 s * BLK_K, BLK_M, BLK_N, BLK_K, tma_bar.ptr(s))

        phase: T.int32 = 0  # phase_tma: parity of the tma_bar[stage] phase we wait for
        for k in T.serial(K_TILES, annotations=H.ROLLED):
            stage = T.meta_var(k % PIPE_DEPTH)
            tma_bar.wait(stage, phase, "all threads")

            # --- compute: the first slice overwrites the accumulator, the rest add to it
            W.mma_fence()  # accumulator registers are about to be written
            W.wgmma_tile(acc, W.desc_advance(desc_a[0], stage * A_STAGE_BYTES),
                         W.desc_advance(desc_b[0], stage * B_STAGE_BYTES), k > 0, M_BLOCKS,
                         BLK_N, dtype)
            W.mma_commit()
            W.mma_wait(0)  # this slice's wgmmas are done
            # WAR on the stage: thread 0 refills it only after every warp has passed its
            # wait_group, i.e. no wgmma still reads the old slice
            T.cuda.cta_sync()

            # --- load: the wgmmas are done with this stage, refill it PIPE_DEPTH slices ahead
            if tid_in_wg == 0:
                if k + PIPE_DEPTH < K_TILES:
                    H.tma_load_tiles(Asmem[stage, :, :], Bsmem[stage, :, :], A, B, m_st,
                                     n_st, (k + PIPE_DEPTH) * BLK_K, BLK_M, BLK_N, BLK_K,
                                     tma_bar.ptr(stage))
            if stage == PIPE_DEPTH - 1:
                phase = phase ^ 1  # wrapping around: every stage starts a new phase
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
