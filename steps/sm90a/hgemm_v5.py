"""sm_90a step 5: a PIPE_DEPTH-stage SMEM ring: load slice k+PIPE_DEPTH while slice k computes.

The step card is the docstring of the builder below.
"""

from tvm.script import tirx as T

from tirx_gemm.helpers import (
    ACC_DTYPE,
    ROLLED,
    check_pipe_depth,
    check_tiled_shape,
    swizzled_layout,
    tma_load_tiles,
    wait_mbarrier,
)
from tirx_gemm.hopper import (
    desc_advance,
    encode_desc,
    fence_operands,
    init_mbarriers,
    publish_mbarrier_init,
    SMEM_ALIGN,
    store_fragment,
    tile_bytes,
    tma_store_tile,
    wgmma_tile,
)


def hgemm_v5(M, N, K, dtype="float16", PIPE_DEPTH=2):
    """sm_90a step 5: a PIPE_DEPTH-stage SMEM ring: load slice k+PIPE_DEPTH while slice k computes.

    Card
    ----
    What changed from v4: A and B SMEM gain a stage dimension (PIPE_DEPTH copies of the
      128x64 slices) and tma_bar becomes tma_bar[PIPE_DEPTH], one barrier per stage.
      Thread 0 prefetches the first PIPE_DEPTH slices before the K-loop; slice k is read
      from stage k % PIPE_DEPTH, and as soon as every warp is past slice k's wait_group the
      stage is refilled with slice k + PIPE_DEPTH. The wgmma descriptors move by a whole
      stage (16 KB of A, 16 KB of B) per stage index.
    Scope / layout / dispatch: layout changes (stage dimension, one barrier per stage);
      dispatch changes only in *when* thread 0 issues the TMA (PIPE_DEPTH slices ahead
      instead of just before the wait); scope is v4's (one warpgroup per 128x128 tile).
    Why: in v4 every slice pays the whole GMEM->SMEM latency (~1 us, several slices of
      tensor-core work) before its wgmmas start; only the other CTAs on the SM (three fit in
      66 KB each) hide it. Here the next slice is already in flight while slice k computes,
      so the wait on tma_bar[stage] normally finds the data there. What stays serial inside
      a CTA is wgmma issue -> wait_group(0) -> CTA sync -> refill: each slice drains the
      tensor-core pipe before the next starts (v7 removes that). The default PIPE_DEPTH=2
      (96 KB) keeps two CTAs per SM, so one CTA's drain is covered by the other's wgmmas.
      Measured on an H200 at 4096^3: v4 546-548 TFLOP/s; v5 PIPE_DEPTH=2 683-713 (0.92-0.93x
      torch.matmul timed alongside); PIPE_DEPTH=3 458 and 4 475, because 130+ KB leaves one
      CTA per SM and deeper prefetch cannot cover the drain.
    Barrier contract: see the comment at tma_bar.
    Recorded (NVIDIA H200, `tirx-gemm bench`, results/nvidia-h200.jsonl, git 2a459d3):
      4096^3 636 TFLOP/s (0.97x torch), 8192^3 623 (0.99x).
    Constraints: M, N multiples of 128, K a multiple of 64, float16; PIPE_DEPTH >= 1 with
      32 KB per stage plus 32 KB Dsmem within 227 KB (PIPE_DEPTH <= 6).
    Run: tirx-gemm run v5 --arch sm_90a
    """
    # --- tunables ---
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64           # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)
    A_STAGE_BYTES = tile_bytes(BLK_M, BLK_K)  # 16 KB: one stage of A; descriptors step by it
    B_STAGE_BYTES = tile_bytes(BLK_N, BLK_K)

    check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)
    check_pipe_depth(PIPE_DEPTH, A_STAGE_BYTES + B_STAGE_BYTES, tile_bytes(BLK_M, BLK_N))
    K_TILES = K // BLK_K
    PREFETCH = min(PIPE_DEPTH, K_TILES)  # slices loaded before the K-loop starts

    A_layout = swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = swizzled_layout((BLK_M, BLK_N), dtype)

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
        tma_bar = pool.alloc((PIPE_DEPTH,), "uint64", align=8)
        pool.move_base_to(SMEM_ALIGN)  # tiles start on a 128B-swizzle atom (1024 B) boundary
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        acc = T.alloc_local((ACC_REGS,), ACC_DTYPE)
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        tid = T.meta_var(warp_id * 32 + lane_id)
        # tma_bar[s]: thread 0 arrives once per load into stage s (arrive.expect_tx) and
        # the TMA unit completes the bytes; all 128 threads wait. Initial phase 0. Stage s
        # holds slices s, s + PIPE_DEPTH, s + 2*PIPE_DEPTH, ...: the parity to wait for
        # flips each time the ring wraps, not every slice as in v4.
        if tid == 0:
            init_mbarriers(tma_bar, PIPE_DEPTH, 1)
        publish_mbarrier_init()

        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))  # stage 0; desc_advance reaches stage s
        encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))

        # --- load (prologue): fill the ring before the first wait ---
        if tid == 0:
            for s in T.unroll(PREFETCH):
                tma_load_tiles(Asmem[s, :, :], Bsmem[s, :, :], A, B,
                               m_st, n_st, s * BLK_K, BLK_M, BLK_N, BLK_K, tma_bar.ptr_to([s]))

        phase: T.int32 = 0  # parity of the phase of tma_bar[stage] that we wait for
        for k in T.serial(K_TILES, annotations=ROLLED):
            stage = T.meta_var(k % PIPE_DEPTH)
            wait_mbarrier(tma_bar.ptr_to([stage]), phase, "tma_bar", stage, "all threads")

            # --- compute: 4 k16 slices x 2 row blocks = 8 wgmmas, accumulate after k=0 ---
            T.ptx.wgmma.fence.sync.aligned()  # accumulator registers are about to be written
            wgmma_tile(acc, desc_advance(desc_a[0], stage * A_STAGE_BYTES),
                       desc_advance(desc_b[0], stage * B_STAGE_BYTES), k > 0, M_BLOCKS, BLK_N)
            T.ptx.wgmma.commit_group.sync.aligned()
            T.ptx.wgmma.wait_group.sync.aligned(0)  # this slice's wgmmas are done
            # WAR on stage: thread 0 refills it only after every warp has passed its
            # wait_group, i.e. no wgmma still reads the old slice.
            T.cuda.cta_sync()

            # --- load: refill the stage just drained, PIPE_DEPTH slices ahead ---
            if tid == 0:
                if k + PIPE_DEPTH < K_TILES:
                    tma_load_tiles(Asmem[stage, :, :],
                                   Bsmem[stage, :, :], A, B, m_st, n_st,
                                   (k + PIPE_DEPTH) * BLK_K, BLK_M, BLK_N, BLK_K, tma_bar.ptr_to([stage]))
            if stage == PIPE_DEPTH - 1:
                phase = phase ^ 1  # the ring wraps: every stage's next phase has the other parity
        fence_operands(acc, ACC_REGS)  # acc is final; keep its reads below the last wait

        # --- writeback: registers -> fp16 -> swizzled Dsmem -> TMA store ---
        store_fragment(Dsmem, acc, 0, 0, warp_id, lane_id, M_BLOCKS, BLK_N)
        T.ptx.fence.proxy.async_.shared__cta()  # our generic-proxy writes -> the TMA unit
        T.cuda.cta_sync()                       # every thread's part of the tile is written
        if tid == 0:
            tma_store_tile(D[m_st : m_st + BLK_M, n_st : n_st + BLK_N], Dsmem[:, :])
            T.ptx.cp.async_.bulk.wait_group(0)  # Dsmem must outlive the store's reads

    return kernel
