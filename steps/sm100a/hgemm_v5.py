"""Step 5 (sm_100a): a PIPE_DEPTH-stage SMEM ring -- load slice k+PIPE_DEPTH while slice k computes.

Lesson: with one A/B buffer the next TMA load must wait for the current MMA. A ring of
PIPE_DEPTH buffers, each with its own TMA barrier, lets loads run ahead. Each stage's
barrier completes once per trip around the ring, so its phase flips on wrap-around,
while mma_bar still flips every slice.
"""
from tvm.script import tirx as T

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H


def hgemm_v5(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 2):
    """Step card -- v5, software pipeline (SMEM ring).

    Changes from v4: layout: A/B SMEM gain a PIPE_DEPTH stage dimension, tma_bar becomes
    one barrier per stage. Dispatch: the issuing lane prefetches the first PIPE_DEPTH slices;
    after slice k's MMA completes, its stage is refilled with slice k + PIPE_DEPTH.
    Contracts: tma_bar[s] completes once per ring trip -> ``phase_tma`` flips when the
    consumer wraps from stage PIPE_DEPTH-1 to 0; mma_bar flips every slice. As in v4,
    only warp 0 watches the barriers inside the loop; a CTA barrier after it hands the
    accumulator to the epilogue.
    Why: the TMA for future slices is in flight while the tensor cores work, hiding
    load latency. Warp 0 still waits for each MMA before refilling (true
    producer/consumer concurrency is v7).
    Constraints: any M >= 1; N, K multiples of 8 (edges as in v4); PIPE_DEPTH >= 1 and
    the ring must fit in shared memory; dtype float16 (default) or bfloat16.
    Run: ``tirx-gemm build v5 --mnk 4096,4096,4096``; executing needs an sm_100a GPU.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    K_TILES = H.ceil_div(K, BLK_K)  # the last K tile is zero-filled past K
    H.check_edge_shape(M, N, K, dtype)
    H.check_pipe_depth(PIPE_DEPTH, (BLK_M + BLK_N) * BLK_K * H.ELEM_BYTES,
                       BLK_M * BLK_N * H.ELEM_BYTES)

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
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
        tma_bar = H.Barriers(pool, PIPE_DEPTH, "tma_bar")
        mma_bar = H.Barriers(pool, 1, "mma_bar")
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()

        # tma_bar[s]: the issuing lane's expect_tx arrival (1) + the TMA bytes complete it;
        #   warp 0 waits on it before the MMA reads stage s; initial phase 0, flips each
        #   time the ring wraps
        # mma_bar: tcgen05.commit arrives (1 arrival) when a slice's MMA is done; warp 0
        #   waits on it before refilling the stage; initial phase 0, flips every K slice
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

        # warp 0 alone runs the pipeline (one elected lane issues, the whole warp waits): a
        # barrier phase is watched only by the warp that produces the next one, so no
        # waiter can miss a phase while the issuing lane runs ahead
        if warp_id == 0:
            # --- load (prologue): fill the ring ---
            if T.cuda.elect_sync():
                for s in T.unroll(min(PIPE_DEPTH, K_TILES)):
                    H.tma_load_tiles(Asmem[s, :, :], Bsmem[s, :, :], A, B, m_st, n_st,
                                     s * BLK_K, BLK_M, BLK_N, BLK_K, tma_bar.ptr(s))

            for k in T.serial(K_TILES, annotations=H.ROLLED):
                stage = T.meta_var(k % PIPE_DEPTH)
                tma_bar.wait(stage, phase_tma, "warp 0")
                W.tcgen05_fence_after_sync()  # the MMA below is ordered after the wait

                # --- compute: the first slice overwrites the accumulator, the rest add to it
                if T.cuda.elect_sync():
                    W.mma_tile(tmem, Asmem[stage, :, :], Bsmem[stage, :, :], BLK_N, k != 0)
                    W.mma_commit(mma_bar.ptr(0))
                mma_bar.wait(0, phase_mma, "warp 0")
                phase_mma = phase_mma ^ 1  # the barrier completed one phase: wait on the next

                # --- load: the MMA is done with this stage, refill it PIPE_DEPTH slices ahead
                if T.cuda.elect_sync():
                    if k + PIPE_DEPTH < K_TILES:
                        H.tma_load_tiles(Asmem[stage, :, :], Bsmem[stage, :, :], A, B, m_st,
                                         n_st, (k + PIPE_DEPTH) * BLK_K, BLK_M, BLK_N, BLK_K,
                                         tma_bar.ptr(stage))
                if stage == PIPE_DEPTH - 1:
                    phase_tma = phase_tma ^ 1  # wrapping around: every stage starts a new phase
        # warp 0 has seen the last MMA complete: this barrier hands the accumulator to all
        W.tcgen05_cta_sync()

        # --- writeback: TMEM -> registers -> Dsmem -> one TMA store -> GMEM ---
        W.epilogue_to_tma_store(tmem, Dsmem, D, m_st, n_st, BLK_M, BLK_N, tid_in_wg, 1, dtype)

        # --- free ---
        W.tcgen05_cta_sync()
        if warp_id == 0:
            W.tmem_free(tmem_addr)

    return kernel
