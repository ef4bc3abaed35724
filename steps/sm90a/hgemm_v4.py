"""sm_90a step 4: TMA loads completing on an mbarrier; TMA store epilogue.

The step card is the docstring of the builder below.
"""

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm.helpers import ACC_DTYPE, ROLLED, check_tiled_shape, swizzled_layout, wait_mbarrier
from tirx_gemm.hopper import (
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


def hgemm_v4(M, N, K, dtype="float16"):
    """sm_90a step 4: TMA loads completing on an mbarrier; TMA store epilogue.

    Card
    ----
    What changed from v3: the 128 threads no longer copy. Thread 0 announces the byte count
      on an mbarrier (arrive.expect_tx) and asks the TMA unit for the A and B slices
      (Tx.copy_async dispatch="tma_auto", 2D tensor maps with 128B swizzle); every thread
      waits on the mbarrier, whose phase flips once per K slice. The epilogue goes
      registers -> fp16 -> swizzled Dsmem, fence.proxy.async, then one thread issues a TMA
      store of the whole 128x128 tile (commit_group / wait_group).
    Scope / layout / dispatch: dispatch changes (thread copy -> TMA, per-thread GMEM
      stores -> TMA store); layout gains Dsmem (128x128 fp16, 128B swizzle, stored as two
      64-column halves); scope is v3's (one warpgroup per 128x128 tile, 2D grid).
    Why: the copy no longer costs the warpgroup 32 load/store instructions per thread and
      slice plus address math, and the TMA unit moves whole 128-byte rows with the swizzle
      applied in flight. Output rows are written as full lines by the TMA instead of 4-byte
      pieces. Loads and wgmma are still serial inside a CTA (load, wait, compute, wait):
      the overlap comes from the ~3 CTAs resident per SM (66 KB SMEM, 128 threads each).
      Reference: a single-stage TMA + wgmma kernel ran at 450 TFLOP/s on an H200 at 4096^3.
    Barrier contract: see the comment at tma_bar.
    Recorded (NVIDIA H200, `tirx-gemm bench`, results/nvidia-h200.jsonl, git 2a459d3):
      4096^3 495 TFLOP/s (0.74x torch), 8192^3 551 (0.82x).
    Constraints: M, N multiples of 128, K a multiple of 64, float16.
    Run: tirx-gemm run v4 --arch sm_90a
    """
    # --- tunables (fixed by the lesson) ---
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    M_BLOCKS = BLK_M // 64           # wgmma is m64: the warpgroup issues 2 per k16 slice
    ACC_REGS = M_BLOCKS * BLK_N // 2  # fp32 accumulators per thread (128)
    LOAD_BYTES = tile_bytes(BLK_M, BLK_K) + tile_bytes(BLK_N, BLK_K)  # per K slice: 32 KB

    check_tiled_shape(M, N, K, BLK_M, BLK_N, BLK_K, dtype)
    K_TILES = K // BLK_K

    A_layout = swizzled_layout((BLK_M, BLK_K), dtype)
    B_layout = swizzled_layout((BLK_N, BLK_K), dtype)
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
        tma_bar = pool.alloc((1,), "uint64", align=8)
        pool.move_base_to(SMEM_ALIGN)  # tiles start on a 128B-swizzle atom (1024 B) boundary
        Asmem = pool.alloc((BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()
        acc = T.alloc_local((ACC_REGS,), ACC_DTYPE)
        desc_a = T.alloc_local((1,), "uint64")
        desc_b = T.alloc_local((1,), "uint64")

        tid = T.meta_var(warp_id * 32 + lane_id)
        # tma_bar: thread 0 arrives once per K slice (arrive.expect_tx LOAD_BYTES) and the
        # TMA unit completes those bytes; all 128 threads wait. Initial phase 0.
        if tid == 0:
            init_mbarriers(tma_bar, 1, 1)
        publish_mbarrier_init()

        m_st = T.meta_var(bx * BLK_M)
        n_st = T.meta_var(by * BLK_N)
        encode_desc(desc_a, Asmem.ptr_to([0, 0]))
        encode_desc(desc_b, Bsmem.ptr_to([0, 0]))

        phase: T.int32 = 0  # parity of the tma_bar phase we wait for: flips every slice
        for k in T.serial(K_TILES, annotations=ROLLED):  # kept rolled: SASS size independent of K
            # --- load: one thread announces the bytes and asks the TMA unit for both slices ---
            if tid == 0:
                T.ptx.mbarrier.arrive.expect_tx.shared.b64(tma_bar.ptr_to([0]), T.uint32(LOAD_BYTES))
                Tx.copy_async(Asmem[:, :], A[m_st : m_st + BLK_M, k * BLK_K : (k + 1) * BLK_K],
                              dispatch="tma_auto", mbar=tma_bar.ptr_to([0]))
                Tx.copy_async(Bsmem[:, :], B[n_st : n_st + BLK_N, k * BLK_K : (k + 1) * BLK_K],
                              dispatch="tma_auto", mbar=tma_bar.ptr_to([0]))
            # the phase completes when thread 0 has arrived and all LOAD_BYTES have landed;
            # its acquire makes the TMA-written tiles visible to this thread's wgmma
            wait_mbarrier(tma_bar.ptr_to([0]), phase, "tma_bar", 0, "all threads")
            phase = phase ^ 1

            # --- compute: 4 k16 slices x 2 row blocks = 8 wgmmas, accumulate after k=0 ---
            T.ptx.wgmma.fence.sync.aligned()  # accumulator registers are about to be written
            wgmma_tile(acc, desc_a[0], desc_b[0], k > 0, M_BLOCKS, BLK_N)
            T.ptx.wgmma.commit_group.sync.aligned()
            T.ptx.wgmma.wait_group.sync.aligned(0)  # this slice's wgmmas are done
            # WAR on the single SMEM tile: thread 0 issues the next TMA only after every
            # warp has passed its wait_group.
            T.cuda.cta_sync()
        fence_operands(acc, ACC_REGS)  # acc is final; keep its reads below the last wait

        # --- writeback: registers -> fp16 -> swizzled Dsmem -> TMA store ---
        store_fragment(Dsmem, acc, 0, 0, warp_id, lane_id, M_BLOCKS, BLK_N)
        T.ptx.fence.proxy.async_.shared__cta()  # our generic-proxy writes -> the TMA unit
        T.cuda.cta_sync()                       # every thread's part of the tile is written
        if tid == 0:
            tma_store_tile(D[m_st : m_st + BLK_M, n_st : n_st + BLK_N], Dsmem[:, :])
            T.ptx.cp.async_.bulk.wait_group(0)  # Dsmem must outlive the store's reads

    return kernel
