"""Step 11 (sm_100a): split-K -- few output tiles, many SMs: cut K, reduce the partial sums.

Lesson: v7 gives each output tile to one CTA, so a GEMM with few tiles and a deep K
(256x256x16384: 4 tiles of 128x128) keeps 4 of 148 SMs busy. Here each tile's K range is
cut into SPLIT_K splits; a (split, tile) pair is one work unit of the persistent
scheduler. Every unit writes its fp32 partial tile to a workspace slab and counts itself
on the tile's counter; the unit that completes the count sums all slabs in split order
(the same bits on every run, whatever order the units finish in) and stores D. With
REDUCE="spread", every unit instead waits for all splits of its tile and sums its own
1/SPLIT_K of the tile, so no single unit reads every slab.
"""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H
from tirx_gemm import splitk


def hgemm_v11(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 4,
              SM_COUNT: int = 148, SPLIT_K: int | None = None, REDUCE: str | None = None,
              RUNTIME_M: bool = False, L2_GROUP: int = 8):
    """Step card -- v11, split-K with a deterministic reduction.

    Changes from v7 (one 128x128 tile per unit, warp-specialized persistent CTA; the 2-CTA
      v8/v9 pay off on large grids, split-K on few tiles):
      * work units: SPLIT_K x ceil(M/128) unit rows; unit row r is split r // TILES_M of
        tile row r % TILES_M, covering K tiles [s*K_TILES//SPLIT_K, (s+1)*K_TILES//SPLIT_K).
      * epilogue, SPLIT_K > 1: TMEM -> fp32 registers -> slab WS[split, tile] (thread-major
        chunks of 4 floats) -> count -> if last: reduce -> D.
    Contracts (cross-CTA, through global memory; the lesson has the memory-model detail):
      publish: the 128 epilogue threads store their slab, meet at the warpgroup barrier,
        then one thread does atom.acq_rel.gpu.add on CNT[tile].
      decide: the old count reaches all through SMEM; old == SPLIT_K - 1: this unit reduces.
      reduce: WS[0, tile] + WS[1, tile] + ... in that fixed order, cast, swizzled Dsmem,
        TMA store (clipped at D's edges), then CNT[tile] = 0.
      REDUCE="spread": thread 0 waits (ld.acquire.gpu, splitk.wait_count) until CNT[tile]
        reads SPLIT_K; split s sums its band of the slab in split order and stores it; a
        second count DONE = CNT[TILES + tile] lets the last unit reset both counters.
    Why: with "last" no CTA waits for another (no spin, no co-residency, any SM_COUNT) and
      the sum's order is fixed; one unit reads SPLIT_K slabs of 64 KiB alone, so SPLIT_K
      stays moderate (splitk.choose_split). "spread" reads ~1 slab per unit, but a waiting
      unit holds its SM, so every unit must be resident: GRID = TILES x SPLIT_K <=
      SM_COUNT, one CTA per SM (all of TMEM; the lesson has the SMEM figure).
    Workspace (splitk.workspace_specs; none when SPLIT_K = 1): WS (SPLIT_K, tiles, 128*128)
      float32 and CNT (tiles,) int32 ((2 * tiles,) with spread), zero at launch and at exit.
      Left out, SPLIT_K and REDUCE come from splitk.resolve_variant (matmul's rule).
    Constraints: any M >= 1; N, K multiples of 8; dtype float16 or bfloat16; 1 <= SPLIT_K
      <= ceil(K/64); PIPE_DEPTH >= 1; SM_COUNT >= 1 (spread: tiles x SPLIT_K <= SM_COUNT, no
      more than the GPU's SMs); REDUCE "last" or "spread"; SPLIT_K=1 is v7's kernel.
      RUNTIME_M=True: an explicit SPLIT_K, not a multiple of L2_GROUP (see the lesson).
    Run: ``tirx-gemm build v11 --mnk 256,256,16384``; ``tirx-gemm sim v11`` (NumSim).
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    ACC_STAGES = 2  # 2 x 128 fp32 columns of the 512 in TMEM
    PRODUCER_REGS, EPILOGUE_REGS = 56, 224
    K_TILES = H.ceil_div(K, BLK_K)  # the last K tile is zero-filled past K
    H.check_edge_shape(M, N, K, dtype)
    H.check_pipe_depth(PIPE_DEPTH, (BLK_M + BLK_N) * BLK_K * H.ELEM_BYTES,
                       BLK_M * BLK_N * H.ELEM_BYTES)
    H.check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)
    if RUNTIME_M and SPLIT_K is None:
        raise ValueError("RUNTIME_M=True needs an explicit SPLIT_K: the split chosen for "
                         "one M would be wrong for another")
    # left out: SPLIT_K and REDUCE both from splitk.choose_variant (what matmul builds)
    SPLIT_K, REDUCE = splitk.resolve_variant(M, N, K, SPLIT_K, REDUCE, SM_COUNT, "sm_100a")
    if RUNTIME_M and SPLIT_K > 1 and SPLIT_K % L2_GROUP == 0:
        # unit rows SPLIT_K * ceil(M/128): TVM proves the scheduler's tail group empty and
        # folds its (unreachable) `% tail` into a division by zero at compile time
        raise ValueError(f"RUNTIME_M=True with SPLIT_K={SPLIT_K}, a multiple of "
                         f"L2_GROUP={L2_GROUP}: pick a split that is not")
    # RUNTIME_M: M, the tile count and the workspace extents are bound from the operands
    # at each call (helpers.runtime_rows); the caller keeps spread's residency rule per call
    M = H.runtime_rows(M, RUNTIME_M)
    TILES_M, TILES_N = H.ceil_div(M, BLK_M), H.ceil_div(N, BLK_N)
    TILES = TILES_M * TILES_N
    SPREAD = splitk.check_split(SPLIT_K, K_TILES, K, 1 if RUNTIME_M else TILES, REDUCE,
                                SM_COUNT)
    # a CTA per unit at most (spread: exactly; with RUNTIME_M the spare CTAs find no unit)
    GRID = SM_COUNT if RUNTIME_M else min(SM_COUNT, TILES * SPLIT_K)
    WS_TILES = H.runtime_extent("WS_TILES") if RUNTIME_M else TILES
    CNT_LEN = H.runtime_extent("CNT_LEN") if RUNTIME_M else TILES * (2 if SPREAD else 1)
    CHUNK = H.SPLITK_CHUNK  # floats per slab store / load of one thread
    IN_FLIGHT = 8  # chunks a reducing thread loads at once (32 registers)
    # spread: a slab is CHUNKS chunks, split s reduces [s*CHUNKS//S, (s+1)*CHUNKS//S);
    # a thread takes every 128th chunk of the band (BAND_ITERS at most) and loads GROUP
    # slabs' worth of them at once
    CHUNKS = BLK_M * BLK_N // CHUNK
    BAND_ITERS = H.ceil_div(H.ceil_div(CHUNKS, SPLIT_K), 128)
    GROUP = max(1, min(SPLIT_K, IN_FLIGHT // BAND_ITERS))

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((BLK_M, BLK_N), dtype)

    # the kernel body; WS and CNT are None when SPLIT_K == 1 (no workspace operands)
    @T.inline
    def gemm(A, B, D, WS, CNT):
        T.device_entry()
        bx = T.cta_id([GRID])
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        arrivals = pool.alloc((1,), "int32")  # the tile's count before this unit's
        # arrival counts: tma2mma 1 (expect_tx) + bytes; mma2tma, mma2ld 1 (commit);
        # ld2mma 128 (every epilogue thread)
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", 1)
        accs = H.Ring(pool, ACC_STAGES, "mma2ld", 1, "ld2mma", 128)
        tma2mma, mma2tma = stages.full, stages.empty
        mma2ld, ld2mma = accs.full, accs.empty
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        pool.commit()

        if wg_id == 0:
            if warp_id == 0:
                if lane_id == 0:
                    stages.init()
                    accs.init()
                W.tmem_alloc(tmem_addr)
        W.publish_setup()
        tmem = W.tmem_accumulator()

        # work units: SPLIT_K x TILES_M unit rows by TILES_N columns (split-major)
        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=SPLIT_K * TILES_M, num_n_tiles=TILES_N,
            num_clusters=GRID, l2_group_size=L2_GROUP)
        scheduler.init(bx)
        split = T.meta_var(scheduler.m_idx // TILES_M)
        m_st = T.meta_var(scheduler.m_idx % TILES_M * BLK_M)
        n_st = T.meta_var(scheduler.n_idx * BLK_N)
        k_first = T.meta_var(split * K_TILES // SPLIT_K)  # this split's K tiles
        k_count = T.meta_var((split + 1) * K_TILES // SPLIT_K - k_first)

        with WarpgroupRole(wg_id, 1, regs=PRODUCER_REGS, increase=False):
            if warp_id == 3:
                # --- load (producer): keep the ring full, PIPE_DEPTH slices ahead ---
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    for k in T.serial(k_count, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                        if T.cuda.elect_sync():
                            H.tma_load_tiles(Asmem[ring.stage, :, :], Bsmem[ring.stage, :, :],
                                             A, B, m_st, n_st, (k_first + k) * BLK_K, BLK_M,
                                             BLK_N, BLK_K, tma2mma.ptr(ring.stage))
                        ring.advance()
                    scheduler.next_tile()
            elif warp_id == 0:
                # --- compute (MMA issuer): one elected lane issues, commits free stages ---
                ring = PipelineState(PIPE_DEPTH, 0)
                acc = PipelineState(ACC_STAGES, 1)
                while scheduler.valid():
                    # the epilogue must have drained this accumulator (unit i - 2)
                    ld2mma.wait(acc.stage, acc.phase, "MMA issuer")
                    W.tcgen05_fence_after_sync()
                    for k in T.serial(k_count, annotations=H.ROLLED):
                        tma2mma.wait(ring.stage, ring.phase, "MMA issuer")
                        W.tcgen05_fence_after_sync()
                        if T.cuda.elect_sync():
                            W.mma_tile_at(tmem, acc.stage * BLK_N, Asmem[ring.stage, :, :],
                                          Bsmem[ring.stage, :, :], BLK_N, k != 0)
                            # stage is free once these MMAs have read it
                            W.mma_commit(mma2tma.ptr(ring.stage))
                        ring.advance()
                    if T.cuda.elect_sync():
                        # the accumulator is final once every MMA of the unit completed
                        W.mma_commit(mma2ld.ptr(acc.stage))
                    acc.advance()
                    scheduler.next_tile()

        with WarpgroupRole(wg_id, 0, regs=EPILOGUE_REGS, increase=True):
            # --- writeback (epilogue): TMEM -> registers, free TMEM, then D or a slab ---
            acc = PipelineState(ACC_STAGES, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            while scheduler.valid():
                mma2ld.wait(acc.stage, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                if SPLIT_K == 1:
                    Dreg_out = T.alloc_local((BLK_N,), dtype)
                    W.tmem_to_registers(tmem, acc.stage * BLK_N, BLK_N, Dreg_out)
                    W.tcgen05_fence_before_sync()
                    ld2mma.arrive(acc.stage)
                    W.store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st, BLK_M, BLK_N, tid_in_wg, 1)
                else:
                    tile = T.meta_var(scheduler.m_idx % TILES_M * TILES_N + scheduler.n_idx)
                    part = T.alloc_local((BLK_N,), H.ACC_DTYPE)  # fp32: not narrowed yet
                    W.tmem_to_registers(tmem, acc.stage * BLK_N, BLK_N, part)
                    W.tcgen05_fence_before_sync()
                    ld2mma.arrive(acc.stage)
                    # --- publish: this split's partial tile -> its slab, then count it ---
                    H.splitk_publish(WS, split, tile, 0, part, BLK_N, tid_in_wg)
                    T.cuda.warpgroup_sync(1)  # every thread's slab stores precede the count
                    if tid_in_wg == 0:
                        H.splitk_count_arrival(arrivals, 0, CNT.ptr_to([tile]))
                        if SPREAD:
                            # --- wait: for all SPLIT_K splits of the tile (all resident) ---
                            splitk.wait_count(CNT.ptr_to([tile]), SPLIT_K, "CNT", tile,
                                              "epilogue")
                    T.cuda.warpgroup_sync(1)  # hands the count (and its acquire) to all
                    if SPREAD:
                        # --- reduce (spread): this split's band of chunks, in split order ---
                        q0 = T.meta_var(split * CHUNKS // SPLIT_K)
                        q1 = T.meta_var((split + 1) * CHUNKS // SPLIT_K)
                        band = T.alloc_local((BAND_ITERS * CHUNK,), H.ACC_DTYPE)
                        H.splitk_reduce_band(WS, tile, 0, band, q0, q1, SPLIT_K, GROUP, tid_in_wg,
                                             BAND_ITERS)
                        for i in T.unroll(BAND_ITERS):
                            q = T.meta_var(q0 + i * 128 + tid_in_wg)
                            if q < q1:
                                # chunk q: row q % 128, columns 4 * (q // 128) + 0..3
                                r = T.meta_var(q % 128)
                                c0 = T.meta_var(q // 128 * CHUNK)
                                if m_st + r < M:
                                    if n_st + c0 < N:  # N % 8 == 0: a chunk is all in or out
                                        out = T.alloc_local((CHUNK,), dtype)
                                        Tx.cast(out[:], band[i * CHUNK:(i + 1) * CHUNK])
                                        Tx.copy(D[m_st + r, n_st + c0:n_st + c0 + CHUNK], out[:])
                        # --- reset: the last unit past its band zeroes both counters ---
                        T.cuda.warpgroup_sync(1)  # all threads of the unit are done with CNT
                        if tid_in_wg == 0:
                            H.splitk_retire_spread(CNT, tile, TILES + tile, SPLIT_K)
                    elif H.splitk_is_last(arrivals, 0, SPLIT_K):
                        # --- reduce: every split has published; sum in split order ---
                        H.splitk_reduce_slabs(WS, tile, 0, part, BLK_N, SPLIT_K, IN_FLIGHT,
                                              tid_in_wg)
                        Dreg_out = T.alloc_local((BLK_N,), dtype)
                        Tx.cast(Dreg_out[:], part[:])
                        W.store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st, BLK_M, BLK_N,
                                             tid_in_wg, 1)
                        if tid_in_wg == 0:
                            CNT[tile] = 0  # all SPLIT_K arrivals are in: ready for next launch
                acc.advance()
                scheduler.next_tile()

        # --- free: only warp 0 of warpgroup 0 allocated, so only it deallocates ---
        W.tcgen05_cta_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free(tmem_addr)

    if SPLIT_K == 1:
        @T.prim_func
        def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
                   D: T.Buffer((M, N), dtype)):
            gemm(A, B, D, None, None)
    else:
        @T.prim_func
        def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
                   D: T.Buffer((M, N), dtype),
                   WS: T.Buffer((SPLIT_K, WS_TILES, BLK_M * BLK_N), H.ACC_DTYPE),
                   CNT: T.Buffer((CNT_LEN,), "int32")):
            gemm(A, B, D, WS, CNT)

    return kernel
