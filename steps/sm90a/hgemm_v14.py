"""Step 14 (sm_90a): grouped GEMM -- one launch multiplies every expert's rows by its weights.

Lesson: a mixture-of-experts layer is E small GEMMs of different M over stacked weights.
The persistent scheduler walks (expert, token tile, weight tile) units whose count it
computes on the device from the routing tensor, so the launch needs no host sync, fits in a
CUDA graph, replays with new routing, and an expert without tokens costs nothing.
"""

import tvm
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W
from tirx_gemm import splitk, streamk

BLK_MS = (64, 128)            # one or two consumer warpgroups of 64 rows
BLK_N_STEP, BLK_N_MAX = 8, 256
AUTO_DEPTH_MAX = 16           # v12's: a decode tile's stage is small, keep many in flight
PAIR = 2                      # CLUSTER=2: CTAs of a pair sharing the weight tile (off by default)
TAIL_IN_FLIGHT = 8            # TAIL_SPLIT: slab chunks (4 floats) a reducing thread loads at once


def check_walk(E, LAYOUT, BLK_M):
    """The walk's own constraints, both kernels (16-bit and FP8_BLOCK): E, LAYOUT, BLK_M."""
    if isinstance(E, bool) or not isinstance(E, int) or not 1 <= E <= W.E_MAX:
        raise ValueError(f"E={E!r} must be an int in [1, {W.E_MAX}] (experts per launch: one "
                         f"scanning thread per expert)")
    if LAYOUT not in W.LAYOUTS:
        raise ValueError(f"LAYOUT={LAYOUT!r} must be one of {', '.join(W.LAYOUTS)}")
    if isinstance(BLK_M, bool) or BLK_M not in BLK_MS:
        raise ValueError(f"BLK_M={BLK_M!r} must be 64 or 128 (one or two consumer "
                         f"warpgroups of 64 rows)")


def hgemm_v14(M: int, N: int, K: int, dtype: str = "float16", E: int = 8,
              LAYOUT: str = "contiguous", BLK_M: int = 128, BLK_N: int = 128,
              PIPE_DEPTH: int | None = None, SM_COUNT: int = 132, RUNTIME_M: bool = True,
              GROUP: int = 8, SWAP_AB: bool = False, TMA_STORE: bool = False,
              STORE_STEPS: int = 1, ROW_SCALE: bool = False, BIAS: bool = False,
              SWIGLU: str | None = None, FP8_BLOCK: bool = False, CLUSTER: int = 1,
              TAIL_SPLIT: int = 1, PRODUCER_REGS: int = 40, CONSUMER_REGS: int = 232):
    """Step card -- v14, grouped GEMM (mixture of experts).

    Changes from v7: D_e = A_e @ B[e].T for every expert e in one launch (B (E, N, K),
      K-major). Every thread reads one expert's rows from the routing tensor (W.scan_experts),
      the CTA scans the token-tile counts into prefix sums in shared memory, and unit t = bx,
      bx + SM_COUNT, ... is found by binary search (W.tile_at): (expert, token tile, weight
      tile), GROUP token tiles per weight column. B[e]'s tile: a 3-D TMA box. Stores: guarded
      4-byte stores below the expert's row end, behind the next unit's first wgmmas (v7's TMA
      store goes). From v12: the tile menu, PIPE_DEPTH None, RUNTIME_M and swap-AB.
    Layouts: "contiguous": A (M, K) rows sorted by expert, D (M, N), offs int32 (E,)
      cumulative row ends; "masked": A (E, M, K), D (E, M, N), counts int32 (E,). Rows no
      expert owns are not written; M at run time; routing clamped to [0, M] in the kernel.
    Loads: a token box may read rows past its expert's end; those rows are never stored.
    SWAP_AB=True (decode): MMA rows walk weight rows, columns tokens; D's transpose stored.
    TMA_STORE=True: 64-row blocks inside their expert by stmatrix + TMA store; STORE_STEPS=S:
      the guarded stores split by columns over the next unit's first S K steps.
    Epilogue, fp32 before the one rounding: BIAS=True adds bias (E, N) (D's dtype);
      ROW_SCALE=True multiplies D's rows by scale (M,) float32 (masked (E, M)); operands
      (A, B, D, routing[, scale][, bias]). SWIGLU="halves" | "interleaved": B[e] a fused
      gate/up weight of N rows, D (M, N/2) = silu(gate) * up ("halves": gate rows [0, N/2),
      up [N/2, N), two boxes per tile; "interleaved": 8 gate rows, 8 up rows, ...); "halves"
      on swap-AB: 8-row boxes, 8 gate then 8 up rows, a feature's pair 8 fragment rows apart.
    CLUSTER=2, TAIL_SPLIT=S (lesson): pair multicast; last-wave tiles cut along K where it pays.
    FP8_BLOCK=True (hgemm_v14_fp8_block): e4m3 A, B (uint8), DeepGEMM's block scales SA (M or
      E*M, K/128), SB (E*ceil(N/128), K/128) after routing, promoted per 128-K stage as v13.
    Barriers: v7's ring; the scan's CTA barriers first. Run: ``tirx-gemm build v14 --arch sm_90a``.
    Constraints: N, K % 8 == 0; fp16 | bf16; 1 <= E <= 256; BLK_M 64 | 128; BLK_N % 8 == 0 in
      [8, 256]; TMA_STORE, STORE_STEPS, SWIGLU on plain tiles (swap-AB: SWIGLU "halves"); SWIGLU
      without TMA_STORE, BIAS, ROW_SCALE, N and a plain BLK_N % 16 == 0; GROUP >= 1; ring <= 227
      KiB; CLUSTER: plain, BLK_N % 16 == 0; TAIL_SPLIT: plain, BLK_N % 64 == 0, K >= 256 S.
    """
    if not isinstance(FP8_BLOCK, bool):
        raise ValueError(f"FP8_BLOCK={FP8_BLOCK!r} must be True or False")
    if isinstance(CLUSTER, bool) or CLUSTER not in (1, PAIR):
        raise ValueError(f"CLUSTER={CLUSTER!r} must be 1 or {PAIR} (CTA pairs "
                         f"sharing the weight tile by multicast)")
    if CLUSTER > 1 and (FP8_BLOCK or SWAP_AB or SWIGLU or BLK_N % 16):
        raise ValueError(f"CLUSTER={CLUSTER} pairs plain tiles on one weight tile: no "
                         f"FP8_BLOCK, SWAP_AB or SWIGLU, BLK_N={BLK_N} a multiple of 16")
    if CLUSTER > 1:
        W.check_cluster_pool(SM_COUNT)
    if FP8_BLOCK:
        if SWAP_AB or TMA_STORE or STORE_STEPS != 1 or ROW_SCALE or BIAS or SWIGLU \
                or TAIL_SPLIT != 1:
            raise ValueError("FP8_BLOCK=True is built for plain tiles only: no SWAP_AB, "
                             "TMA_STORE, STORE_STEPS, ROW_SCALE, BIAS, SWIGLU or TAIL_SPLIT")
        return hgemm_v14_fp8_block(M, N, K, dtype, E, LAYOUT, BLK_M, BLK_N, PIPE_DEPTH,
                                   SM_COUNT, RUNTIME_M, GROUP, PRODUCER_REGS, CONSUMER_REGS)
    BLK_K = W.SWIZZLE_ROW_ELEMS
    H.check_edge_shape(M, N, K, dtype)
    check_walk(E, LAYOUT, BLK_M)
    if isinstance(BLK_N, bool) or not isinstance(BLK_N, int) or BLK_N % BLK_N_STEP \
            or not BLK_N_STEP <= BLK_N <= BLK_N_MAX:
        raise ValueError(f"BLK_N={BLK_N!r} must be a multiple of {BLK_N_STEP} in "
                         f"[{BLK_N_STEP}, {BLK_N_MAX}] (wgmma m64nNk16: N <= 256)")
    for name, flag in (("RUNTIME_M", RUNTIME_M), ("SWAP_AB", SWAP_AB), ("TMA_STORE", TMA_STORE),
                       ("ROW_SCALE", ROW_SCALE), ("BIAS", BIAS)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r} must be True or False")
    H.check_positive_ints(SM_COUNT=SM_COUNT, GROUP=GROUP, STORE_STEPS=STORE_STEPS)
    MASKED = LAYOUT == "masked"
    if TMA_STORE and (SWAP_AB or MASKED or BLK_N % W.EPI_COLS):
        raise ValueError(f"TMA_STORE=True stores whole 64x64 chunks of a plain contiguous tile: "
                         f"no SWAP_AB, LAYOUT contiguous, BLK_N a multiple of {W.EPI_COLS}")
    if STORE_STEPS > 1 and (TMA_STORE or SWAP_AB or (BLK_N // (16 if SWIGLU else 8))
                            % STORE_STEPS):
        raise ValueError(f"STORE_STEPS={STORE_STEPS} splits the guarded stores of a plain tile "
                         f"by 8-column blocks: no TMA_STORE, no SWAP_AB, BLK_N / 8 a multiple "
                         f"of it")
    if SWIGLU not in (None, "halves", "interleaved"):
        raise ValueError(f"SWIGLU={SWIGLU!r} must be None, 'halves' or 'interleaved'")
    if SWIGLU and (SWAP_AB and SWIGLU != "halves" or TMA_STORE or ROW_SCALE or BIAS
                   or (BLK_N % 16 and not SWAP_AB) or N % 16):
        raise ValueError(f"SWIGLU={SWIGLU!r} pairs gate and up columns of a plain tile, or "
                         f"(\"halves\" only) gate and up rows of a swap-AB tile: no TMA_STORE, "
                         f"ROW_SCALE or BIAS; N={N} (and a plain tile's BLK_N={BLK_N}) multiples "
                         f"of 16")
    NUM_CONSUMERS = BLK_M // W.WGMMA_M
    PRODUCER = NUM_CONSUMERS
    ACC_REGS = BLK_N // 2
    PACKED_REGS = BLK_N // 4
    # the token tile and the weight tile: D's rows and columns of one unit
    TOK, W_BLK = (BLK_N, BLK_M) if SWAP_AB else (BLK_M, BLK_N)
    HALVES, FUSE_SWIGLU = SWIGLU == "halves", SWIGLU is not None
    if HALVES:  # a unit's weight tile: W_BLK/2 gate rows at at[3], as many up rows at +N/2
        W_BLK = W_BLK // 2
    W_TILES = H.ceil_div(N // 2 if HALVES else N, W_BLK)
    WALK_TOK = TOK * CLUSTER     # the walk's token tile: a pair's rows with CLUSTER=2
    POOL = SM_COUNT // CLUSTER   # walkers: CTAs, or pairs
    B_HALF = BLK_N // CLUSTER
    OUT_N, N_D = (BLK_N // 2, N // 2) if SWIGLU else (BLK_N, N)  # D's tile width and columns
    A_STAGE_BYTES = W.tile_bytes(BLK_M, BLK_K)
    B_STAGE_BYTES = W.tile_bytes(BLK_N, BLK_K)
    STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES
    SCAN_BYTES = (2 + W.BOUND_ROWS) * E * 4  # the scan's two rows and the experts' bounds
    EPI_BUFS = 2 if (BLK_N // W.EPI_COLS) % 2 == 0 else 1  # TMA_STORE's staging tiles
    STAGING = NUM_CONSUMERS * EPI_BUFS * W.tile_bytes(W.WGMMA_M, W.EPI_COLS) \
        if TMA_STORE else 0
    ARRIVALS = 16 if TAIL_SPLIT > 1 else 0   # TAIL_SPLIT: the counts seen, one per consumer
    if PIPE_DEPTH is None:
        PIPE_DEPTH = min(AUTO_DEPTH_MAX, H.ring_stages(STAGE_BYTES, SCAN_BYTES + STAGING
                                                       + ARRIVALS))
    W.check_ring_for_wait_one(PIPE_DEPTH)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, SCAN_BYTES + STAGING + ARRIVALS)
    SPLIT_REGS = NUM_CONSUMERS > 1 and BLK_N > 128  # v12's rule
    if SPLIT_REGS:
        W.check_reg_split(PRODUCER_REGS, CONSUMER_REGS, NUM_CONSUMERS)
    K_TILES = H.ceil_div(K, BLK_K)
    if isinstance(TAIL_SPLIT, bool) or not isinstance(TAIL_SPLIT, int) or TAIL_SPLIT < 1:
        raise ValueError(f"TAIL_SPLIT={TAIL_SPLIT!r} must be an int >= 1 (K ranges per tile of "
                         f"the last wave; 1: none)")
    SPLIT = TAIL_SPLIT > 1
    if SPLIT and (SWAP_AB or CLUSTER > 1 or STORE_STEPS > 1 or BLK_N % 64
                  or K_TILES < TAIL_SPLIT * splitk.TAIL_MIN_STEPS):
        raise ValueError(f"TAIL_SPLIT={TAIL_SPLIT} cuts plain tiles along K: no SWAP_AB, "
                         f"CLUSTER or STORE_STEPS, BLK_N a multiple of 64, and K at least "
                         f"{TAIL_SPLIT * splitk.TAIL_MIN_STEPS * BLK_K} ({splitk.TAIL_MIN_STEPS} K steps of "
                         f"{BLK_K} a piece), got K={K}")
    TAIL_TILES = POOL // TAIL_SPLIT  # last-wave tiles that can be split (tail * S <= POOL)
    HALF = W.WGMMA_M * BLK_N         # floats of one consumer's half of a slab
    EPI_AT = min(1, K_TILES - 1)
    # part c of the previous unit's stores (8-column blocks [c*J/S, (c+1)*J/S)) at K step
    # min(EPI_AT + c, K_TILES - 1): parts past the unit's last K step share that step
    LAST_PART_AT = min(EPI_AT + STORE_STEPS - 1, K_TILES - 1)
    PART_COLS = OUT_N // STORE_STEPS
    M_DIM = tvm.tirx.Var("M", "int32") if RUNTIME_M else M
    A_SHAPE = (E, M_DIM, K) if MASKED else (M_DIM, K)
    D_SHAPE = (E, M_DIM, N_D) if MASKED else (M_DIM, N_D)

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS), dtype)

    @T.inline
    def store_part(D, packed, p, consumer, warp_id, lane_id, c: int):
        # part c of a consumer's packed 64-row block of unit p (STORE_STEPS > 1): the
        # bounded stores of its 8-column blocks [c * PART_COLS / 8, ...)
        W.store_packed_rows(D, p[0], packed, p[1] + consumer * W.WGMMA_M, p[3], PART_COLS,
                            p[2], N_D, warp_id, lane_id, MASKED, c * PART_COLS // 8)

    @T.inline
    def store_unit(D, Dstage, packed, p, consumer, warp_id, lane_id, tid_in_wg):
        # a consumer's packed 64-row block of unit p: bounded stores, or (TMA_STORE) a TMA
        # store when the block lies wholly inside its expert's rows
        row0 = T.meta_var(consumer * W.WGMMA_M)
        if TMA_STORE:
            if p[1] + row0 + W.WGMMA_M <= p[2]:
                W.store_packed_tile(D, Dstage, consumer, packed, p[1] + row0, p[3], BLK_N,
                                    EPI_BUFS, warp_id, lane_id, tid_in_wg, 1 + consumer)
            else:
                W.store_packed_rows(D, p[0], packed, p[1] + row0, p[3], BLK_N, p[2], N,
                                    warp_id, lane_id, MASKED, 0)
        else:
            W.store_packed_rows(D, p[0], packed, p[1] + row0, p[3], OUT_N, p[2], N_D, warp_id,
                                lane_id, MASKED, 0)

    @T.inline
    def release(mma2tma, stage, tid_in_wg):
        # a consumer's wgmmas have read `stage`: free it for the producer (CLUSTER=2: in
        # both CTAs, whose multicasts both write it)
        if CLUSTER > 1:
            W.release_stage_in_cluster(mma2tma, stage, tid_in_wg)
        else:
            if tid_in_wg == 0:
                mma2tma.arrive(stage)

    # TAIL_SPLIT's plan and pieces; with TAIL_SPLIT=1 the walk's unit is its tile and the K
    # range all of K (the plain functions below then give back the kernel's own expressions)
    @T.inline
    def tail_plan(plan, total):
        # plan <- (data-parallel units, all units): each tile of the walk's last wave cut
        # into TAIL_SPLIT pieces where they fit the pool and the cut is predicted to pay
        # (tirx_gemm/splitk.py: tail_split_plan, one text for the kernel and the host)
        dp, units_all = splitk.tail_split_plan(total, POOL, TAIL_SPLIT, streamk.tir_ops(T))
        plan[0] = dp
        plan[1] = units_all

    @T.inline
    def locate(piece, u, plan):
        # piece <- (walk tile, first K step, K steps, tail tile j or -1, piece index p) of
        # unit u: a data-parallel unit is its tile; unit plan[0] + j * S + p is piece p of
        # the walk's tile plan[0] + j, K steps [p * K_TILES / S, (p + 1) * K_TILES / S)
        piece[0] = u
        piece[1] = 0
        piece[2] = K_TILES
        piece[3] = -1
        piece[4] = 0
        if u >= plan[0]:
            piece[3] = T.truncdiv(u - plan[0], TAIL_SPLIT)
            piece[4] = T.truncmod(u - plan[0], TAIL_SPLIT)
            piece[0] = plan[0] + piece[3]
            piece[1] = T.truncdiv(piece[4] * K_TILES, TAIL_SPLIT)
            piece[2] = T.truncdiv((piece[4] + 1) * K_TILES, TAIL_SPLIT) - piece[1]

    def units(plan, total):
        return plan[1] if SPLIT else total

    def tile_of(piece, u):
        return piece[0] if SPLIT else u

    def steps_of(piece):
        return piece[2] if SPLIT else K_TILES

    def k_at(piece, k):
        return (piece[1] + k) * BLK_K if SPLIT else k * BLK_K

    def stores_now(last):
        return last[0] == 1 if SPLIT else True

    @T.inline
    def settle_piece(WS, CNT, arrivals, last, piece, acc, consumer, tid_in_wg):
        # a tail piece: this half's fp32 partial -> slab WS[p, j], counted on CNT (acq_rel);
        # the half that counts last sums the TAIL_SPLIT slabs in K order into acc, zeroes
        # the counter for the next launch and stores the tile (last[0] = 1)
        last[0] = 1
        if piece[3] >= 0:
            H.splitk_publish(WS, piece[4], piece[3], consumer * HALF, acc, ACC_REGS, tid_in_wg)
            T.cuda.warpgroup_sync(1 + consumer)  # every slab store before the count
            if tid_in_wg == 0:
                H.splitk_count_arrival(arrivals, consumer,
                                       CNT.ptr_to([piece[3] * NUM_CONSUMERS + consumer]))
            T.cuda.warpgroup_sync(1 + consumer)  # the count (and acquire) to all
            last[0] = 0
            if H.splitk_is_last(arrivals, consumer, TAIL_SPLIT):
                last[0] = 1
                H.splitk_reduce_slabs(WS, piece[3], consumer * HALF, acc, ACC_REGS,
                                      TAIL_SPLIT, TAIL_IN_FLIGHT, tid_in_wg)
                if tid_in_wg == 0:
                    CNT[piece[3] * NUM_CONSUMERS + consumer] = 0

    @T.inline
    def body(A, B, D, routing, S, Bias, WS, CNT):
        # the kernel; S (ROW_SCALE), Bias (BIAS), WS and CNT (TAIL_SPLIT) are None where not
        # asked for
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        if CLUSTER > 1:
            rank, _unused = T.cta_id_in_cluster([CLUSTER, 1])  # this CTA's place in the pair
        else:
            rank = T.meta_var(0)
        walker = T.meta_var(bx // CLUSTER)
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # consumers first, producer last
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        # tma2mma[s]: the producer thread arrives once per load into stage s (expect_tx for
        #   both boxes); the consumers' threads wait, from phase 0.
        # mma2tma[s]: thread 0 of each consumer warpgroup arrives once its wgmmas have read
        #   stage s; the producer waits from phase 1 (every stage starts empty).
        #   CLUSTER=2: in both CTAs of the pair (the peer's multicast writes this stage too)
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", NUM_CONSUMERS * CLUSTER)
        tma2mma, mma2tma = stages.full, stages.empty
        Asmem, Bsmem = W.walk_stages(pool, PIPE_DEPTH, BLK_M, BLK_N, BLK_K, dtype, A_layout,
                                     B_layout)
        if TMA_STORE:
            Dstage = T.meta_var(pool.alloc((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS),
                                           dtype, layout=D_layout))
        else:
            Dstage = T.meta_var(None)
        if SPLIT:  # before the walk's tables, which commit the pool
            arrivals = T.meta_var(pool.alloc((NUM_CONSUMERS,), "int32"))
        else:
            arrivals = T.meta_var(None)
        scan, bounds = W.walk_tables(pool, E)

        # --- the walk's length, on the device: thread e reads expert e's rows ---
        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        W.start_walk(stages, scan, bounds, routing, wg_id, tid_in_wg, PRODUCER, E, WALK_TOK,
                     M_DIM, MASKED, CLUSTER > 1)
        total = T.meta_var(W.walk_length(scan, E, W_TILES))
        at = T.alloc_local((4,), "int32")  # (expert, token row, expert's row end, weight row)

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS if SPLIT_REGS else None,
                           increase=False):
            # --- load (producer): one thread, PIPE_DEPTH stages ahead, across units ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                if SPLIT:
                    plan = T.alloc_local((2,), "int32")
                    piece = T.alloc_local((5,), "int32")
                    tail_plan(plan, total)
                else:
                    plan = T.meta_var(None)
                    piece = T.meta_var(None)
                t: T.int32 = walker
                while t < units(plan, total):
                    if SPLIT:
                        locate(piece, t, plan)
                    W.tile_at(at, scan, bounds, tile_of(piece, t), E, WALK_TOK, W_TILES, W_BLK,
                              GROUP)
                    at[1] = at[1] + rank * TOK  # CLUSTER=2: the pair's second token tile
                    for k in T.serial(steps_of(piece), annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        if HALVES and SWAP_AB:  # 16-row groups: 8 gate rows, their 8 up rows
                            W.tma_load_gate_up_swap(Asmem, Bsmem, ring.stage, A, B, at,
                                                    k_at(piece, k), tma2mma.ptr(ring.stage), BLK_M,
                                                    BLK_N, BLK_K, N // 2, MASKED)
                        elif CLUSTER > 1:
                            W.tma_load_unit_multicast(
                                Asmem[ring.stage, :, :],
                                Bsmem[ring.stage, rank * B_HALF:(rank + 1) * B_HALF, :], A, B,
                                at, k_at(piece, k), tma2mma.ptr(ring.stage), BLK_M, B_HALF, BLK_K,
                                BLK_N, rank, MASKED)
                        elif HALVES:
                            W.tma_load_gate_up(Asmem, Bsmem, ring.stage, A, B, at, k_at(piece, k),
                                               tma2mma.ptr(ring.stage), BLK_M, BLK_N // 2,
                                               BLK_K, N // 2, MASKED)
                        else:
                            W.tma_load_unit(Asmem[ring.stage, :, :], Bsmem[ring.stage, :, :],
                                            A, B, at, k_at(piece, k), tma2mma.ptr(ring.stage),
                                            BLK_M, BLK_N, BLK_K, SWAP_AB, MASKED)
                        ring.advance()
                    t = t + POOL

        with WarpgroupRole(wg_id < NUM_CONSUMERS, True,
                           regs=CONSUMER_REGS if SPLIT_REGS else None, increase=True):
            consumer = T.meta_var(wg_id)  # owns MMA rows [64*consumer, 64*consumer + 64)
            row0 = T.meta_var(consumer * W.WGMMA_M)
            acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)
            packed = T.alloc_local((PACKED_REGS,), "uint32")  # the previous tile, 2 x 16-bit
            prev = T.alloc_local((4,), "int32")  # where that tile goes (tile_at's fields)
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            W.encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))
            W.encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0      # stage of the slice whose wgmmas may still be running
            pending: T.int32 = 0   # 1 while `packed` holds a tile not yet stored
            if SPLIT:
                plan = T.alloc_local((2,), "int32")
                piece = T.alloc_local((5,), "int32")
                last = T.alloc_local((1,), "int32")  # 1: this unit's tile is stored now
                tail_plan(plan, total)
            else:
                plan = T.meta_var(None)
                piece = T.meta_var(None)
                last = T.meta_var(None)
            u: T.int32 = walker
            while u < units(plan, total):
                if SPLIT:
                    locate(piece, u, plan)
                W.tile_at(at, scan, bounds, tile_of(piece, u), E, WALK_TOK, W_TILES, W_BLK,
                          GROUP)
                at[1] = at[1] + rank * TOK
                for k in T.serial(steps_of(piece), annotations=H.ROLLED):
                    tma2mma.wait(ring.stage, ring.phase, "consumer")
                    W.mma_fence()
                    W.wgmma_tile(acc,
                                 W.desc_advance(desc_a[0], ring.stage * A_STAGE_BYTES)
                                 + T.Cast("uint64", consumer * W.DESC_M64_STEP),
                                 W.desc_advance(desc_b[0], ring.stage * B_STAGE_BYTES),
                                 k > 0, 1, BLK_N, dtype)
                    W.mma_commit()
                    if STORE_STEPS == 1:
                        if k == EPI_AT:
                            if pending == 1:
                                # --- writeback of the previous unit behind the queued
                                # wgmmas, its rows checked against its expert's row end ---
                                store_unit(D, Dstage, packed, prev, consumer, warp_id, lane_id,
                                           tid_in_wg)
                                pending = 0
                    else:
                        for c in T.unroll(STORE_STEPS):  # one part per K step
                            if k == T.min(EPI_AT + c, K_TILES - 1):
                                if pending == 1:
                                    store_part(D, packed, prev, consumer, warp_id, lane_id, c)
                        if k == LAST_PART_AT:
                            pending = 0
                    W.mma_wait(1)
                    if k > 0:
                        release(mma2tma, held, tid_in_wg)
                    held = ring.stage
                    ring.advance()
                W.mma_wait(0)
                release(mma2tma, held, tid_in_wg)
                W.fence_operands(acc, ACC_REGS)
                if SPLIT:
                    settle_piece(WS, CNT, arrivals, last, piece, acc, consumer, tid_in_wg)
                if stores_now(last):  # always, without TAIL_SPLIT
                    if ROW_SCALE or BIAS:  # fp32, before the one rounding
                        W.apply_row_epilogue(acc, S, Bias, at[0], at[3 if SWAP_AB else 1] + row0,
                                             at[1 if SWAP_AB else 3], BLK_N, at[2], N, warp_id,
                                             lane_id, MASKED, SWAP_AB)
                    if SWAP_AB and FUSE_SWIGLU:  # features at[3] + 32 * consumer.., in fp32
                        W.store_transposed_swiglu(D, at[0], acc, at[3] + consumer * (W.WGMMA_M // 2),
                                                  at[1], BLK_N, at[2], N // 2, warp_id, lane_id,
                                                  MASKED)
                    elif SWAP_AB:  # D's transpose: weight rows at[3].., tokens at[1]..
                        W.store_transposed_rows(D, at[0], acc, at[3] + row0, at[1], BLK_N, at[2],
                                                N, warp_id, lane_id, MASKED)
                    else:
                        if FUSE_SWIGLU:  # acc[: BLK_N / 2] <- silu(gate) * up, D's columns
                            W.swiglu_fragment(acc, BLK_N, HALVES)
                        W.pack_fragment(packed, acc, OUT_N // 4, dtype)
                        pending = 1
                        for i in T.unroll(4):
                            prev[i] = at[i]
                        if FUSE_SWIGLU and not HALVES:
                            prev[3] = at[3] // 2  # D's first column of the unit
                u = u + POOL
            if pending == 1:
                store_unit(D, Dstage, packed, prev, consumer, warp_id, lane_id, tid_in_wg)
            if TMA_STORE:
                if tid_in_wg == 0:
                    H.store_wait(0)  # every TMA store has read its staging tile
        if CLUSTER > 1:
            # the peer multicasts into this CTA's stages and arrives on its barriers until
            # it is done: neither CTA exits (and frees its shared memory) before both are
            T.cuda.cluster_sync()

    S_SHAPE = (E, M_DIM) if MASKED else (M_DIM,)

    # operands (A, B, D, routing[, scale][, bias][, WS, CNT]): one source, the operands not
    # asked for dropped (H.without_operand)
    @T.prim_func
    def kernel(A: T.Buffer(A_SHAPE, dtype), B: T.Buffer(W.weight_shape(E, N, K, 16), dtype),
               D: T.Buffer(D_SHAPE, dtype), routing: T.Buffer((E,), "int32"),
               scale: T.Buffer(S_SHAPE, "float32"), bias: T.Buffer((E, N), dtype),
               WS: T.Buffer((max(TAIL_SPLIT, 1), max(TAIL_TILES, 1), BLK_M * BLK_N), H.ACC_DTYPE),
               CNT: T.Buffer((max(TAIL_TILES, 1) * NUM_CONSUMERS,), "int32")):
        body(A, B, D, routing, scale if ROW_SCALE else None, bias if BIAS else None,
             WS if SPLIT else None, CNT if SPLIT else None)

    for name, used in (("scale", ROW_SCALE), ("bias", BIAS), ("WS", SPLIT), ("CNT", SPLIT)):
        if not used:
            kernel = H.without_operand(kernel, name)
    return kernel


# --- FP8_BLOCK=True: the same walk over e4m3 operands with DeepGEMM's block scales ---------
FP8_BLK_NS = (16, 32, 64, 128)  # a tile inside one 128-row block of B; acc, tmp0, tmp1 fit


def hgemm_v14_fp8_block(M, N, K, dtype, E, LAYOUT, BLK_M, BLK_N, PIPE_DEPTH, SM_COUNT,
                        RUNTIME_M, GROUP, PRODUCER_REGS, CONSUMER_REGS):
    """v14 with FP8_BLOCK=True (the step card's line): v14's scan, walk and bounded stores
    around v13's block-scaled mainloop. A stage is 128 e4m3 of K (one 128-byte swizzle row);
    stages go in pairs, 2j into tmp0 and 2j + 1 into tmp1, and each is promoted into the fp32
    acc as acc += tmp * SA[row, kb] * SB[e * NB + n_st / 128, kb] (W.load_block_scales,
    W.promote_fragment_block: v13's verbs) while the other's wgmmas run. An odd K / 128 loads
    one stage past K (zero-filled, its scales read 0). Operands (A, B, D, routing, SA, SB);
    masked: A (E, M, K), D (E, M, N), SA (E * M, K/128) (expert e's rows from e * M)."""
    BLK_K = W.FP8_BLK_K
    dtype = H.check_fp8_contract(M, N, K, dtype)
    if K % BLK_K:
        raise ValueError(f"K={K} is not a multiple of {BLK_K}: FP8_BLOCK scales A per 1x{BLK_K} "
                         f"and B per {BLK_K}x{BLK_K} block along K")
    check_walk(E, LAYOUT, BLK_M)
    if isinstance(BLK_N, bool) or BLK_N not in FP8_BLK_NS:
        raise ValueError(f"BLK_N={BLK_N!r} with FP8_BLOCK: one of {FP8_BLK_NS} (a tile inside "
                         f"one 128-row block of B; acc, tmp0, tmp1 within the registers)")
    if not isinstance(RUNTIME_M, bool):
        raise ValueError(f"RUNTIME_M={RUNTIME_M!r} must be True or False")
    H.check_positive_ints(SM_COUNT=SM_COUNT, GROUP=GROUP)
    NUM_CONSUMERS = BLK_M // W.WGMMA_M
    PRODUCER = NUM_CONSUMERS
    ACC_REGS = BLK_N // 2
    PACKED_REGS = BLK_N // 4
    A_STAGE_BYTES = W.fp8_tile_bytes(BLK_M)
    B_STAGE_BYTES = W.fp8_tile_bytes(BLK_N)
    STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES
    SCAN_BYTES = (2 + W.BOUND_ROWS) * E * 4
    if PIPE_DEPTH is None:
        PIPE_DEPTH = min(AUTO_DEPTH_MAX, H.ring_stages(STAGE_BYTES, SCAN_BYTES))
    W.check_ring_for_wait_one(PIPE_DEPTH)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, SCAN_BYTES)
    SPLIT_REGS = NUM_CONSUMERS > 1 and 3 * ACC_REGS > 96  # v13's rule for the promoted tiles
    if SPLIT_REGS:
        W.check_reg_split(PRODUCER_REGS, CONSUMER_REGS, NUM_CONSUMERS)
    W_TILES = H.ceil_div(N, BLK_N)
    KB = K // BLK_K                      # K blocks of the scales
    PAIRS = (KB + 1) // 2                # stage pairs per unit (odd KB: one stage past K)
    NB = H.ceil_div(N, BLK_K)            # 128-row blocks of one expert's B
    SB_ROWS = E * NB
    MASKED = LAYOUT == "masked"
    M_DIM = tvm.tirx.Var("M", "int32") if RUNTIME_M else M
    A_SHAPE = (E, M_DIM, K) if MASKED else (M_DIM, K)
    D_SHAPE = (E, M_DIM, N) if MASKED else (M_DIM, N)
    # SA's rows: masked, expert e's at e * M (the (E, M, K/128) scales flattened by the caller)
    SA_ROWS = H.runtime_extent("SA_ROWS") if MASKED else M_DIM
    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), W.FP8_STORAGE)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), W.FP8_STORAGE)

    def sa_row(at):
        # SA's row of the unit's first token row
        return at[0] * M_DIM + at[1] if MASKED else at[1]

    @T.inline
    def stage_pair(acc, tmp0, tmp1, sav, sbv, SA, SB, at, kb, first, held, ring, tma2mma,
                   mma2tma, desc_a, desc_b, consumer, row0, warp_id, lane_id, tid_in_wg):
        # the wgmmas of stages kb (tmp0) and kb + 1 (tmp1) are queued; each is promoted once
        # done (wait_group 1, then 0) and its stage released
        W.load_block_scales(sav, sbv, SA, SB, kb, KB, sa_row(at) + row0,
                            at[0] * NB * BLK_K + at[3], BLK_N, SA_ROWS, SB_ROWS * BLK_K, warp_id,
                            lane_id)
        W.mma_wait(1)
        if tid_in_wg == 0:
            mma2tma.arrive(held)
        W.fence_operands(tmp0, ACC_REGS)
        W.promote_fragment_block(acc, tmp0, BLK_N, first, sav, sbv)
        W.load_block_scales(sav, sbv, SA, SB, kb + 1, KB, sa_row(at) + row0,
                            at[0] * NB * BLK_K + at[3], BLK_N, SA_ROWS, SB_ROWS * BLK_K,
                            warp_id, lane_id)
        W.mma_wait(0)
        if tid_in_wg == 0:
            mma2tma.arrive(T.if_then_else(held == PIPE_DEPTH - 1, 0, held + 1))
        W.fence_operands(tmp1, ACC_REGS)
        W.promote_fragment_block(acc, tmp1, BLK_N, False, sav, sbv)

    @T.inline
    def queue_pair(tmp0, tmp1, ring, tma2mma, desc_a, desc_b, consumer):
        # the next two stages' wgmmas into tmp0 and tmp1, a commit group each
        W.queue_fp8_stage(tmp0, ring, tma2mma, desc_a, desc_b, consumer, A_STAGE_BYTES,
                          B_STAGE_BYTES, BLK_N)
        W.queue_fp8_stage(tmp1, ring, tma2mma, desc_a, desc_b, consumer, A_STAGE_BYTES,
                          B_STAGE_BYTES, BLK_N)

    @T.prim_func
    def kernel(A: T.Buffer(A_SHAPE, W.FP8_STORAGE),
               B: T.Buffer(W.weight_shape(E, N, K, 8), W.FP8_STORAGE),
               D: T.Buffer(D_SHAPE, dtype), routing: T.Buffer((E,), "int32"),
               SA: T.Buffer((SA_ROWS, KB), "float32"), SB: T.Buffer((SB_ROWS, KB), "float32")):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # consumers first, producer last
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        # tma2mma[s]: the producer thread arrives once per load into stage s (expect_tx of
        #   (BLK_M + BLK_N) x 128 bytes); the consumers' threads wait, from phase 0.
        # mma2tma[s]: thread 0 of each consumer warpgroup arrives once its wgmmas have read
        #   stage s and its partial sum is promoted; the producer waits from phase 1.
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", NUM_CONSUMERS)
        tma2mma, mma2tma = stages.full, stages.empty
        Asmem, Bsmem = W.walk_stages(pool, PIPE_DEPTH, BLK_M, BLK_N, BLK_K, W.FP8_STORAGE,
                                     A_layout, B_layout)
        scan, bounds = W.walk_tables(pool, E)

        # --- the walk's length, on the device (v14's) ---
        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        W.start_walk(stages, scan, bounds, routing, wg_id, tid_in_wg, PRODUCER, E, BLK_M, M_DIM,
                     MASKED)
        total = T.meta_var(W.walk_length(scan, E, W_TILES))
        at = T.alloc_local((4,), "int32")

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS if SPLIT_REGS else None,
                           increase=False):
            # --- load (producer): 2 x PAIRS stages per unit ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                t: T.int32 = bx
                while t < total:
                    W.tile_at(at, scan, bounds, t, E, BLK_M, W_TILES, BLK_N, GROUP)
                    for k in T.serial(2 * PAIRS, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        W.tma_load_fp8_unit(Asmem[ring.stage, :, :], Bsmem[ring.stage, :, :],
                                            A, B, at, k * BLK_K, tma2mma.ptr(ring.stage),
                                            BLK_M, BLK_N, BLK_K, MASKED)
                        ring.advance()
                    t = t + SM_COUNT

        with WarpgroupRole(wg_id < NUM_CONSUMERS, True,
                           regs=CONSUMER_REGS if SPLIT_REGS else None, increase=True):
            consumer = T.meta_var(wg_id)
            row0 = T.meta_var(consumer * W.WGMMA_M)
            acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)
            tmp0 = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)
            tmp1 = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)
            packed = T.alloc_local((PACKED_REGS,), "uint32")
            sav = T.alloc_local((2,), H.ACC_DTYPE)
            sbv = T.alloc_local((2,), H.ACC_DTYPE)
            prev = T.alloc_local((4,), "int32")
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            W.encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))
            W.encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0     # the oldest stage not yet released
            pending: T.int32 = 0  # 1 while `packed` holds a tile not yet stored
            u: T.int32 = bx
            while u < total:
                W.tile_at(at, scan, bounds, u, E, BLK_M, W_TILES, BLK_N, GROUP)
                # --- the first pair, peeled: the previous unit's bounded stores go behind
                # its wgmmas (`packed` dies before the loop, where acc, tmp0, tmp1 are live) ---
                held = ring.stage
                queue_pair(tmp0, tmp1, ring, tma2mma, desc_a, desc_b, consumer)
                if pending == 1:
                    W.store_packed_rows(D, prev[0], packed, prev[1] + row0, prev[3], BLK_N,
                                        prev[2], N, warp_id, lane_id, MASKED, 0)
                    pending = 0
                stage_pair(acc, tmp0, tmp1, sav, sbv, SA, SB, at, 0, True, held, ring,
                           tma2mma, mma2tma, desc_a, desc_b, consumer, row0, warp_id, lane_id,
                           tid_in_wg)
                for j in T.serial(1, PAIRS, annotations=H.ROLLED):
                    held = ring.stage
                    queue_pair(tmp0, tmp1, ring, tma2mma, desc_a, desc_b, consumer)
                    stage_pair(acc, tmp0, tmp1, sav, sbv, SA, SB, at, 2 * j, False, held,
                               ring, tma2mma, mma2tma, desc_a, desc_b, consumer, row0,
                               warp_id, lane_id, tid_in_wg)
                W.pack_fragment(packed, acc, PACKED_REGS, dtype)
                pending = 1
                for i in T.unroll(4):
                    prev[i] = at[i]
                u = u + SM_COUNT
            if pending == 1:
                W.store_packed_rows(D, prev[0], packed, prev[1] + row0, prev[3], BLK_N, prev[2],
                                    N, warp_id, lane_id, MASKED, 0)

    return kernel
