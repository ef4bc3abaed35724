"""Step 13 (sm_90a): fp8 -- e4m3 operands, scales, and the promotion of partial sums.

Lesson: halving the operand bytes doubles the tensor-core rate (m64nNk32 instead of k16),
but an fp8 GEMM is only correct with a contract for its scales and with partial sums
promoted out of the tensor core's limited-precision accumulator into fp32.
"""
import tvm
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import helpers as H
from tirx_gemm import hopper as W
from tirx_gemm import numerics

BLK_MS = (64, 128)            # one or two consumer warpgroups of 64 rows
BLK_N_STEP, BLK_N_MAX = 16, 256
AUTO_DEPTH_MAX = 16
THIN_A_DEPTH_MAX = 32         # A_ROWS < BLK_M: stages of B alone, as many as fit up to this
SCALES = ("tensor", "row", "block")
SCALE_BLOCK = 128             # block scaling: 1x128 blocks of A, 128x128 blocks of B
# block scaling reads one scale of B per 128 columns: a tile lies in one block of B, or (144,
# 192) in two, from a runtime offset (256 would cover two, but its accumulators do not fit)
BLOCK_BLK_NS = (16, 32, 64, 128, 144, 192)
# registers a consumer thread may give to the accumulators (acc, tmp0, tmp1) in the mainloop
# before the kernel spills (232 after setmaxnreg, minus addresses, indices and scales; 216:
# the overlapped 128 x 144, built without spills)
PROMOTED_REGS_MAX = 216
PIPELINED_BLK_N_MAX = 144     # PROMOTE_OVERLAP: 3 x BLK_N / 2 <= PROMOTED_REGS_MAX
SERIAL_BLK_N_MAX = 160        # serial promotion: 2 x BLK_N / 2 + BLK_N / 4
SERIAL_WIDE_BLK_N_MAX = 208   # wider: the previous tile stored before the mainloop (2 x BLK_N / 2)


def scale_shapes(scale: str, M, N, K):
    """The shapes of scale_a and scale_b of a SCALE mode (fp32, row-major)."""
    if scale == "tensor":
        return (1,), (1,)
    if scale == "row":
        return (M,), (N,)
    if scale == "block":
        kb = (K + SCALE_BLOCK - 1) // SCALE_BLOCK
        return (M, kb), ((N + SCALE_BLOCK - 1) // SCALE_BLOCK, kb)
    raise ValueError(f"SCALE={scale!r} must be one of {', '.join(SCALES)}")


def hgemm_v13(M: int, N: int, K: int, dtype: str = "float16", SCALE: str = "tensor",
              PROMOTE: int | None = None, BLK_M: int = 128, BLK_N: int = 128,
              PIPE_DEPTH: int | None = None, SM_COUNT: int = 132, RUNTIME_M: bool = False,
              RUNTIME_NK: bool = False, L2_GROUP: int = 8, PRODUCER_REGS: int = 40,
              CONSUMER_REGS: int = 232, PROMOTE_OVERLAP: bool | None = None,
              SPLIT_K: int = 1, EARLY_SCALES: bool | None = None, A_ROWS: int | None = None,
              CLUSTER: int = 1):
    """Step card -- v13, fp8 (e4m3) with scales and promotion.

    Changes from v12: A (M x K) and B (N x K) are e4m3, both K-major, passed as uint8 (a
      float8_e4m3fn tensor as ``t.view(torch.uint8)``; tirx_gemm.op.fp8). One wgmma is
      m64nBLK_Nk32, a stage is BLK_K = 128 (4 wgmmas per consumer). Ring, producer, tile
      walk and overlapped epilogue are v12's; D is ``dtype`` (float16, bfloat16), fp32 acc.
    Scale contract (SCALE; fp32 scale_a, scale_b after D):
      "tensor": (1,), (1,): D = (sa * sb) * (A @ B.T), in the epilogue;
      "row": (M,), (N,): D[m, n] = sa[m] * sb[n] * (A @ B.T)[m, n], in the epilogue;
      "block": (M, ceil(K/128)) per 1x128 of A, (ceil(N/128), ceil(K/128)) per 128x128 of
        B, applied in the mainloop: acc += tmp * sa * sb per 128-K stage.
    Promotion (fp8 wgmma keeps ~14 bits of its sum): PROMOTE k32 wgmmas sum into ``tmp``, then
      acc += tmp * factor in fp32 (default 4; 0: fast). PROMOTE_OVERLAP (default at 4): stages
      2j, 2j+1 into tmp0, tmp1, one promoted while the other's wgmmas run (zero stages pad K);
      PROMOTE=8: 4j, 4j+1 into tmp0, 4j+2, 4j+3 into tmp1, a drain per 4 stages (deep K: op.fp8).
    SPLIT_K=S > 1: S units per tile; each publishes its fp32 tile to WS[s, tile] (WS: (S,
      tiles, BLK_M * BLK_N) fp32 after SB) and counts it on CNT ((tiles * BLK_M / 64,) int32,
      zero at launch); the last sums them in split order, scales, stores D. EARLY_SCALES.
    A_ROWS (BLK_M 64; 8|16|32), M <= A_ROWS: thin A stages (the lesson; picked at M <= 16).
    CLUSTER=2: v12's CTA pair along M, B's halves multicast; not picked (H100).
    Barriers: v12's; tma2mma counts 1 (expect_tx (A_ROWS + BLK_N) x 128 bytes, a stage past K
      included), mma2tma BLK_M // 64; overlapped: released after wait_group 1 / 0 (8: 2 / 0).
    Constraints: any M >= 1; N a multiple of 8; K a multiple of 16; dtype float16 or bfloat16;
      PROMOTE 0 or a multiple of 4 ("block": 4); BLK_M 64 or 128; BLK_N a multiple of 16 in
      [16, 256] ("block": 16-128, 144, 192); accumulators within the register budget
      (overlapped: BLK_N <= 144; serial: <= 208, past 160 the previous tile stored first);
      PROMOTE_OVERLAP: PROMOTE 4 or 8 (8: SPLIT_K 1, PIPE_DEPTH >= 4); PIPE_DEPTH >= 2 within 227
      KiB; RUNTIME_M / RUNTIME_NK as v12; SPLIT_K > 1: PROMOTE_OVERLAP, an L2_GROUP not dividing
      it, ceil(K_TILES / 2) >= SPLIT_K; CLUSTER=2: SPLIT_K 1, full A stages, even SM_COUNT.
    Run: ``tirx-gemm run v13 --arch sm_90a --mnk 1024,1024,1024``; every SCALE: matmul_fp8.
    """
    BLK_K = W.FP8_BLK_K                  # 128: one 128-byte swizzle row of e4m3 per stage
    dtype = H.check_fp8_contract(M, N, K, dtype)
    if SCALE not in SCALES:
        raise ValueError(f"SCALE={SCALE!r} must be one of {', '.join(SCALES)}")
    if PROMOTE is None:  # the default lives in numerics (the run side reads it too)
        PROMOTE = numerics.fp8_promote({"SCALE": SCALE})
    if isinstance(PROMOTE, bool) or not isinstance(PROMOTE, int) or PROMOTE < 0 \
            or PROMOTE % 4:
        raise ValueError(f"PROMOTE={PROMOTE!r} must be 0 or a multiple of 4 (k32 wgmmas "
                         f"per promotion; a stage holds 4)")
    if SCALE == "block" and PROMOTE != 4:
        raise ValueError(f"PROMOTE={PROMOTE} with SCALE='block': each 128-K block has its "
                         f"own scales, so it must be promoted alone: use PROMOTE=4")
    if isinstance(BLK_M, bool) or not isinstance(BLK_M, int) or BLK_M not in BLK_MS:
        raise ValueError(f"BLK_M={BLK_M!r} must be 64 or 128 (one or two consumer "
                         f"warpgroups of 64 rows)")
    if isinstance(BLK_N, bool) or not isinstance(BLK_N, int) or BLK_N % BLK_N_STEP \
            or not BLK_N_STEP <= BLK_N <= BLK_N_MAX:
        raise ValueError(f"BLK_N={BLK_N!r} must be a multiple of {BLK_N_STEP} in "
                         f"[{BLK_N_STEP}, {BLK_N_MAX}] (wgmma m64nNk32: N <= 256)")
    if SCALE == "block" and BLK_N not in BLOCK_BLK_NS:
        raise ValueError(f"BLK_N={BLK_N} with SCALE='block': a tile must lie in one 128-row "
                         f"block of B; use one of {BLOCK_BLK_NS}")
    for name, flag in (("RUNTIME_M", RUNTIME_M), ("RUNTIME_NK", RUNTIME_NK)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r} must be True or False")
    H.check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)
    PROMOTED = PROMOTE > 0
    if PROMOTE_OVERLAP is None:
        PROMOTE_OVERLAP = PROMOTE == 4
    if not isinstance(PROMOTE_OVERLAP, bool):
        raise ValueError(f"PROMOTE_OVERLAP={PROMOTE_OVERLAP!r} must be True or False")
    if PROMOTE_OVERLAP and PROMOTE not in (4, 8):
        raise ValueError(f"PROMOTE_OVERLAP=True with PROMOTE={PROMOTE}: the overlapped "
                         f"promotion promotes every stage or every second one; use PROMOTE=4 "
                         f"or 8, or PROMOTE_OVERLAP=False")
    PIPELINED = PROMOTE_OVERLAP
    if EARLY_SCALES is None:
        EARLY_SCALES = False
    if not isinstance(EARLY_SCALES, bool):
        raise ValueError(f"EARLY_SCALES={EARLY_SCALES!r} must be True or False")
    if EARLY_SCALES and not (SCALE == "block" and PIPELINED):
        raise ValueError("EARLY_SCALES=True is for SCALE='block' with the overlapped promotion")
    EARLY = EARLY_SCALES
    if A_ROWS is None:
        A_ROWS = BLK_M
    if A_ROWS != BLK_M and (BLK_M != 64 or A_ROWS not in (8, 16, 32)):
        raise ValueError(f"A_ROWS={A_ROWS!r} with BLK_M={BLK_M}: A_ROWS is 8, 16 or 32 with "
                         f"BLK_M=64 (one consumer), or BLK_M")
    if A_ROWS < BLK_M and not RUNTIME_M and M > A_ROWS:
        raise ValueError(f"A_ROWS={A_ROWS} loads {A_ROWS} rows of A per tile: M={M} needs "
                         f"M <= A_ROWS")
    if isinstance(SPLIT_K, bool) or not isinstance(SPLIT_K, int) or SPLIT_K < 1:
        raise ValueError(f"SPLIT_K={SPLIT_K!r} must be a positive int")
    if isinstance(CLUSTER, bool) or CLUSTER not in (1, 2):
        raise ValueError(f"CLUSTER={CLUSTER!r} must be 1 or 2 (a CTA pair along M sharing B)")
    if CLUSTER > 1:
        if SPLIT_K > 1 or A_ROWS < BLK_M:
            raise ValueError(f"CLUSTER={CLUSTER} takes SPLIT_K=1 and full A stages (A_ROWS = "
                             f"BLK_M): a pair shares whole tiles of B")
        W.check_cluster_pool(SM_COUNT, CLUSTER)
    if SPLIT_K > 1 and not PIPELINED:
        raise ValueError(f"SPLIT_K={SPLIT_K} needs the overlapped promotion (PROMOTE=4, "
                         f"PROMOTE_OVERLAP): a unit is whole pairs of 128-K stages")
    if SPLIT_K > 1 and SPLIT_K % L2_GROUP == 0:
        raise ValueError(f"SPLIT_K={SPLIT_K} with L2_GROUP={L2_GROUP}: the scheduler's rows "
                         f"fold by the group, which must not divide the split "
                         f"(splitk.l2_group_for)")
    P_STAGES = PROMOTE // 4               # stages summed in tmp per promotion
    GROUP = 2 * P_STAGES                  # overlapped: stages per iteration (tmp0's, tmp1's)
    if PIPELINED and P_STAGES > 1:
        if SPLIT_K > 1:
            raise ValueError(f"SPLIT_K={SPLIT_K} with PROMOTE={PROMOTE}: a split unit is whole "
                             f"pairs of 128-K stages; use PROMOTE=4")
    NUM_CONSUMERS = BLK_M // W.WGMMA_M
    PRODUCER = NUM_CONSUMERS
    ACC_REGS = BLK_N // 2
    PACKED_REGS = ACC_REGS // 2
    TMP_REGS = ACC_REGS if PROMOTED else 1  # the partial-sum accumulator (a stub if unused)
    # promoted registers per thread: pipelined, acc + tmp0 + tmp1 are live together in
    # the mainloop (the packed tile is stored before it); serial, acc + tmp + packed
    PROMOTED_LIVE = 3 * ACC_REGS if PIPELINED else 2 * ACC_REGS + PACKED_REGS
    # a serial tile wider than SERIAL_BLK_N_MAX stores the previous tile before its mainloop,
    # so packed is dead there (acc + tmp then fit: 128 x 192 holds 96 + 96 a thread)
    WB_FIRST = PROMOTED and not PIPELINED and PROMOTED_LIVE > PROMOTED_REGS_MAX
    if WB_FIRST:
        PROMOTED_LIVE = 2 * ACC_REGS
    if PROMOTED and PROMOTED_LIVE > PROMOTED_REGS_MAX:
        what, limit = ("acc, tmp0 and tmp1", f"{PIPELINED_BLK_N_MAX} (PROMOTE_OVERLAP=False: "
                       f"<= {SERIAL_WIDE_BLK_N_MAX})") if PIPELINED else \
            ("acc and tmp", SERIAL_WIDE_BLK_N_MAX)
        raise ValueError(f"BLK_N={BLK_N} with PROMOTE={PROMOTE} needs {PROMOTED_LIVE} "
                         f"registers per thread for {what} (> {PROMOTED_REGS_MAX}): use "
                         f"BLK_N <= {limit} or PROMOTE=0")
    TMA_CHUNKS = BLK_N // W.EPI_COLS
    TAIL_J = (BLK_N % W.EPI_COLS) // 8
    EPI_BUFS = 2 if TMA_CHUNKS % 2 == 0 else 1
    STAGING = NUM_CONSUMERS * EPI_BUFS * W.tile_bytes(W.WGMMA_M, W.EPI_COLS) \
        if TMA_CHUNKS else 0
    A_STAGE_BYTES = W.fp8_tile_bytes(A_ROWS)
    B_STAGE_BYTES = W.fp8_tile_bytes(BLK_N)
    STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES
    if PIPE_DEPTH is None:  # thin A stages (A_ROWS < BLK_M): a deeper ring of B
        PIPE_DEPTH = min(AUTO_DEPTH_MAX if A_ROWS == BLK_M else THIN_A_DEPTH_MAX,
                         H.ring_stages(STAGE_BYTES, STAGING))
    W.check_ring_for_wait_one(PIPE_DEPTH)
    if PIPELINED and PIPE_DEPTH < GROUP:
        raise ValueError(f"PIPE_DEPTH={PIPE_DEPTH} with PROMOTE={PROMOTE} overlapped: a consumer "
                         f"holds {GROUP} stages before it releases one; use PIPE_DEPTH >= {GROUP}")
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, STAGING)
    if A_ROWS < BLK_M and PIPE_DEPTH * B_STAGE_BYTES < W.fp8_tile_bytes(BLK_M - A_ROWS):
        raise ValueError(f"A_ROWS={A_ROWS}: the last stage's wgmma reads "
                         f"{BLK_M - A_ROWS} rows past the A ring, inside the B ring, which "
                         f"is smaller; use a deeper ring or a wider BLK_N")
    # setmaxnreg when a consumer thread holds more than 96 accumulator and packed values
    SPLIT_REGS = NUM_CONSUMERS > 1 and \
        (PROMOTED_LIVE if PROMOTED else ACC_REGS + PACKED_REGS) > 96
    if SPLIT_REGS:
        W.check_reg_split(PRODUCER_REGS, CONSUMER_REGS, NUM_CONSUMERS)
    M_DIM = tvm.tirx.Var("M", "int32") if RUNTIME_M else M
    N_DIM = tvm.tirx.Var("N", "int32") if RUNTIME_NK else N
    K_DIM = tvm.tirx.Var("K", "int32") if RUNTIME_NK else K
    M_TILES = (M_DIM + BLK_M - 1) // BLK_M
    # CLUSTER=2: the scheduler walks pairs of row blocks (the last pair may reach past M: both
    # CTAs take part, the second's A loads zero-filled and its stores clipped)
    M_CTILES = (M_DIM + CLUSTER * BLK_M - 1) // (CLUSTER * BLK_M)
    B_SHARE = BLK_N // CLUSTER             # rows of the B tile each CTA loads (a multiple of 8)
    N_TILES = (N_DIM + BLK_N - 1) // BLK_N
    K_TILES = (K_DIM + BLK_K - 1) // BLK_K  # the last K tile is zero-filled past K
    # the pipelined promotion consumes stages in pairs (PROMOTE=8: fours): an odd K_TILES loads
    # one more, wholly past K (zero-filled by TMA, its wgmmas add zeros)
    K_LOADS = (K_TILES + (GROUP - 1)) // GROUP * GROUP if PIPELINED else K_TILES
    KB_DIM = K_TILES                        # K blocks of the block scales
    EPI_AT = T.min(1, K_TILES - 1) if RUNTIME_NK else min(1, K_TILES - 1)
    NUM_CTAS = SM_COUNT if RUNTIME_M or RUNTIME_NK else \
        min(SM_COUNT, M_CTILES * N_TILES * CLUSTER)
    S = SPLIT_K
    K_PAIRS = (K_TILES + 1) // 2
    if S > 1 and not RUNTIME_NK and K_PAIRS < S:
        raise ValueError(f"SPLIT_K={S} at K={K}: {K_PAIRS} pairs of 128-K stages, fewer than "
                         f"the splits")
    if S > 1 and not (RUNTIME_M or RUNTIME_NK):
        NUM_CTAS = min(SM_COUNT, S * M_TILES * N_TILES)
    SPLIT_ROWS = S * M_TILES if S > 1 else M_CTILES
    HALF = W.WGMMA_M * BLK_N              # floats of one consumer's half of a slab
    REDUCE_IN_FLIGHT = min(4, ACC_REGS // H.SPLITK_CHUNK)
    TILES = M_TILES * N_TILES
    WS_TILES = H.runtime_extent("WS_TILES") if RUNTIME_M or RUNTIME_NK else TILES
    CNT_LEN = H.runtime_extent("CNT_LEN") if RUNTIME_M or RUNTIME_NK else TILES * NUM_CONSUMERS

    def unit(scheduler):
        # (tile row, first K stage, stages to load) of the scheduler's unit: SPLIT_K > 1
        # walks S x M_TILES unit rows, row r is split r // M_TILES of tile row r % M_TILES
        if S == 1:
            return scheduler.m_idx, 0, K_LOADS
        split = scheduler.m_idx // M_TILES
        p0 = split * K_PAIRS // S
        return scheduler.m_idx % M_TILES, 2 * p0, 2 * ((split + 1) * K_PAIRS // S - p0)
    SA_SHAPE, SB_SHAPE = scale_shapes(SCALE, M_DIM, N_DIM, K_DIM)
    IS_TENSOR, IS_ROW, IS_BLOCK = SCALE == "tensor", SCALE == "row", SCALE == "block"
    STRADDLE = IS_BLOCK and 128 % BLK_N != 0  # a tile's columns in two blocks of B

    A_layout = H.swizzled_layout((PIPE_DEPTH, A_ROWS, BLK_K), W.FP8_STORAGE)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), W.FP8_STORAGE)
    D_layout = H.swizzled_layout((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS), dtype)

    @T.inline
    def release(mma2tma, stage, tid_in_wg):
        # a consumer warpgroup's wgmmas are done reading `stage`: its empty barrier (a pair:
        # in both CTAs, whose multicasts write it)
        if CLUSTER > 1:
            W.release_stage_in_cluster(mma2tma, stage, tid_in_wg, CLUSTER)
        else:
            if tid_in_wg == 0:
                mma2tma.arrive(stage)

    @T.inline
    def promote_block(acc, tmp, first, sav, sbv, n_st):
        # block scales: a tile in one block of B, or (BLK_N 144, 192) across two from n_st % 128
        if STRADDLE:
            W.promote_fragment_block_straddle(acc, tmp, BLK_N, first, sav, sbv, n_st % 128)
        else:
            W.promote_fragment_block(acc, tmp, BLK_N, first, sav, sbv)

    @T.inline
    def wgmma_stage(tmp, desc_a, desc_b, stage, consumer, accumulate):
        # one ring stage's k32 wgmmas (m64 x BLK_N x 32 each) of this consumer into `tmp`
        W.mma_fence()
        W.wgmma_fp8_tile(tmp, W.desc_advance(desc_a[0], stage * A_STAGE_BYTES)
                         + T.Cast("uint64", consumer * W.DESC_M64_STEP),
                         W.desc_advance(desc_b[0], stage * B_STAGE_BYTES), accumulate, 1, BLK_N)
        W.mma_commit()

    @T.inline
    def wgmma_more(tmp, desc_a, desc_b, tma2mma, ring, consumer):
        # PROMOTE=8 overlapped: the interval's second stage, summed onto the first in `tmp`
        if P_STAGES > 1:
            tma2mma.wait(ring.stage, ring.phase, "consumer")
            wgmma_stage(tmp, desc_a, desc_b, ring.stage, consumer, True)
            ring.advance()

    @T.inline
    def store_tile(D, Dstage, consumer, packed, m0, n0, warp_id, lane_id, tid_in_wg):
        # a packed tile -> D: TMA stores of whole EPI_COLS chunks, guarded stores past them
        if TMA_CHUNKS > 0:
            W.store_packed_tile(D, Dstage, consumer, packed, m0, n0, TMA_CHUNKS * W.EPI_COLS,
                                EPI_BUFS, warp_id, lane_id, tid_in_wg, 1 + consumer)
        if TAIL_J > 0:
            W.store_packed_guarded(D, packed, m0, n0, TMA_CHUNKS * 8, BLK_N // 8, M_DIM, N_DIM,
                                   warp_id, lane_id)

    @T.inline
    def gemm(A, B, D, SA, SB, WS, CNT):
        T.device_entry()
        bx = T.cta_id([NUM_CTAS])
        if CLUSTER > 1:
            rank, _unused = T.cta_id_in_cluster([CLUSTER, 1])  # this CTA's place in the pair
        else:
            rank = T.meta_var(0)
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # consumers first, producer last
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        # tma2mma[s]: the producer thread arrives once per load into stage s (expect_tx
        #   of the (A_ROWS + BLK_N) x 128-byte box pair, zero-filled edges included); every
        #   consumer thread waits. Initial phase 0; consumers wait from phase 0.
        # mma2tma[s]: thread 0 of each consumer warpgroup arrives (NUM_CONSUMERS arrivals)
        #   once its wgmmas have finished reading stage s; the producer waits from
        #   phase 1 (every stage starts empty).
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", CLUSTER * NUM_CONSUMERS)
        tma2mma, mma2tma = stages.full, stages.empty
        if S > 1:  # SPLIT_K: a consumer's count before its own
            arrivals = T.meta_var(pool.alloc((NUM_CONSUMERS,), "int32"))
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, A_ROWS, BLK_K), W.FP8_STORAGE, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), W.FP8_STORAGE, layout=B_layout)
        if TMA_CHUNKS > 0:
            Dstage = T.meta_var(pool.alloc((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS),
                                           dtype, layout=D_layout))
        else:  # no TMA-stored chunk (BLK_N < EPI_COLS): store_tile never reads it
            Dstage = T.meta_var(None)
        pool.commit()

        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        if wg_id == PRODUCER:
            if tid_in_wg == 0:
                stages.init()
        if CLUSTER > 1:  # the peer signals these barriers: publish the inits cluster-wide
            W.publish_setup_cluster()
        else:
            W.publish_setup()

        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=SPLIT_ROWS, num_n_tiles=N_TILES, num_clusters=NUM_CTAS // CLUSTER,
            l2_group_size=L2_GROUP)
        scheduler.init(bx // CLUSTER)

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS if SPLIT_REGS else None,
                           increase=False):
            # --- load (producer): one thread, PIPE_DEPTH stages ahead, across tiles ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_tile, k0, n_loads = T.meta_var(unit(scheduler))
                    m_st = T.meta_var((m_tile * CLUSTER + rank) * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(n_loads, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        if CLUSTER > 1:  # own A tile; own half of the B tile, multicast
                            at = T.meta_var(rank * B_SHARE)
                            W.tma_load_fp8_multicast_b(
                                Asmem[ring.stage, :, :], Bsmem[ring.stage, at:at + B_SHARE, :],
                                A, B, m_st, n_st + at, (k0 + k) * BLK_K, A_ROWS, B_SHARE, BLK_N,
                                tma2mma.ptr(ring.stage), (1 << CLUSTER) - 1)
                        else:
                            W.tma_load_fp8_tiles(Asmem[ring.stage, :, :],
                                                 Bsmem[ring.stage, :, :], A, B, m_st, n_st,
                                                 (k0 + k) * BLK_K, A_ROWS, BLK_N,
                                                 tma2mma.ptr(ring.stage))
                        ring.advance()
                    scheduler.next_tile()

        with WarpgroupRole(wg_id < NUM_CONSUMERS, True,
                           regs=CONSUMER_REGS if SPLIT_REGS else None, increase=True):
            consumer = T.meta_var(wg_id)  # owns rows [64*consumer, 64*consumer + 64)
            row0 = T.meta_var(consumer * W.WGMMA_M)
            acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)   # fp32: the whole K
            # the tensor core's partial sums, two so that one is promoted while the
            # wgmmas of the next interval write the other
            tmp0 = T.alloc_local((TMP_REGS,), H.ACC_DTYPE)
            tmp1 = T.alloc_local((TMP_REGS if PIPELINED else 1,), H.ACC_DTYPE)
            packed = T.alloc_local((PACKED_REGS,), "uint32")
            sav = T.alloc_local((2,), H.ACC_DTYPE)   # block scales of the fragment's rows
            sbv = T.alloc_local((2,), H.ACC_DTYPE)   # ... and of its (one or two) B blocks
            sav1 = T.alloc_local((2 if EARLY else 1,), H.ACC_DTYPE)  # EARLY: the pair's
            sbv1 = T.alloc_local((2 if EARLY else 1,), H.ACC_DTYPE)  # second stage's scales
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            W.encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))
            W.encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0      # stage of the slice whose wgmmas may still be running
            holding: T.int32 = 0   # 1 while `held` names such a stage (serial promotion)
            pending: T.int32 = 0   # 1 while `packed` holds a tile not yet stored
            prev_m: T.int32 = 0
            prev_n: T.int32 = 0
            last: T.int32 = 1      # 1 when this unit stores its tile (SPLIT_K: the last one)
            while scheduler.valid():
                m_tile, k0, n_loads = T.meta_var(unit(scheduler))
                m_st = T.meta_var((m_tile * CLUSTER + rank) * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * BLK_N)
                if PIPELINED:
                    # --- promoted mainloop, two stages per iteration: stage 2j into tmp0 and 2j+1
                    # into tmp1 are queued together; tmp0 is promoted (wait_group 1) while the
                    # tensor core runs tmp1's wgmmas, then tmp1 (wait_group 0). ptxas tracks wgmma
                    # groups only within one loop iteration (a tmp read after a wait for a group
                    # of the previous iteration serializes every wgmma), and each tmp is written
                    # by straight-line wgmmas only. K_LOADS (even) stages: an odd K_TILES gets one
                    # stage past K (zero-filled by TMA). `held`: the oldest stage not released.
                    held = ring.stage
                    tma2mma.wait(ring.stage, ring.phase, "consumer")
                    wgmma_stage(tmp0, desc_a, desc_b, ring.stage, consumer, False)
                    ring.advance()
                    wgmma_more(tmp0, desc_a, desc_b, tma2mma, ring, consumer)
                    tma2mma.wait(ring.stage, ring.phase, "consumer")
                    wgmma_stage(tmp1, desc_a, desc_b, ring.stage, consumer, False)
                    ring.advance()
                    wgmma_more(tmp1, desc_a, desc_b, tma2mma, ring, consumer)
                    # the previous tile's writeback, behind the first pair's wgmmas (the pair is
                    # peeled: `packed` dies before the loop, where acc, tmp0 and tmp1 fill the
                    # registers)
                    if pending == 1:
                        store_tile(D, Dstage, consumer, packed, prev_m + row0, prev_n, warp_id,
                                   lane_id, tid_in_wg)
                        pending = 0
                    if IS_BLOCK:  # the scales of this K block
                        W.load_block_scales(sav, sbv, SA, SB, k0, KB_DIM, m_st + row0, n_st,
                                            BLK_N, M_DIM, N_DIM, warp_id, lane_id)
                    if EARLY:  # and of the next, before any wait
                        W.load_block_scales(sav1, sbv1, SA, SB, k0 + 1, KB_DIM, m_st + row0,
                                            n_st, BLK_N, M_DIM, N_DIM, warp_id, lane_id)
                    W.mma_wait(P_STAGES)  # tmp0's stages are done
                    release(mma2tma, held, tid_in_wg)
                    held = T.if_then_else(held == PIPE_DEPTH - 1, 0, held + 1)
                    if P_STAGES > 1:
                        release(mma2tma, held, tid_in_wg)
                        held = T.if_then_else(held == PIPE_DEPTH - 1, 0, held + 1)
                    W.fence_operands(tmp0, ACC_REGS)
                    if IS_BLOCK:
                        promote_block(acc, tmp0, True, sav, sbv, n_st)
                    else:
                        W.promote_fragment(acc, tmp0, ACC_REGS, True, T.float32(1))
                    if IS_BLOCK and not EARLY:  # the scales of this K block
                        W.load_block_scales(sav, sbv, SA, SB, k0 + 1, KB_DIM, m_st + row0,
                                            n_st, BLK_N, M_DIM, N_DIM, warp_id, lane_id)
                    W.mma_wait(0)
                    release(mma2tma, held, tid_in_wg)
                    held = T.if_then_else(held == PIPE_DEPTH - 1, 0, held + 1)
                    if P_STAGES > 1:
                        release(mma2tma, held, tid_in_wg)
                        held = T.if_then_else(held == PIPE_DEPTH - 1, 0, held + 1)
                    W.fence_operands(tmp1, ACC_REGS)
                    if EARLY:
                        promote_block(acc, tmp1, False, sav1, sbv1, n_st)
                    elif IS_BLOCK:
                        promote_block(acc, tmp1, False, sav, sbv, n_st)
                    else:
                        W.promote_fragment(acc, tmp1, ACC_REGS, False, T.float32(1))
                    for j in T.serial(1, n_loads // GROUP, annotations=H.ROLLED):
                        tma2mma.wait(ring.stage, ring.phase, "consumer")
                        wgmma_stage(tmp0, desc_a, desc_b, ring.stage, consumer, False)
                        ring.advance()
                        wgmma_more(tmp0, desc_a, desc_b, tma2mma, ring, consumer)
                        tma2mma.wait(ring.stage, ring.phase, "consumer")
                        wgmma_stage(tmp1, desc_a, desc_b, ring.stage, consumer, False)
                        ring.advance()
                        wgmma_more(tmp1, desc_a, desc_b, tma2mma, ring, consumer)
                        if IS_BLOCK:  # the scales of this K block
                            W.load_block_scales(sav, sbv, SA, SB, k0 + 2 * j, KB_DIM, m_st + row0,
                                                n_st, BLK_N, M_DIM, N_DIM, warp_id, lane_id)
                        if EARLY:  # and of the next, before any wait
                            W.load_block_scales(sav1, sbv1, SA, SB, k0 + 2 * j + 1, KB_DIM,
                                                m_st + row0, n_st, BLK_N, M_DIM, N_DIM, warp_id,
                                                lane_id)
                        W.mma_wait(P_STAGES)  # tmp0's stages are done
                        release(mma2tma, held, tid_in_wg)
                        held = T.if_then_else(held == PIPE_DEPTH - 1, 0, held + 1)
                        if P_STAGES > 1:
                            release(mma2tma, held, tid_in_wg)
                            held = T.if_then_else(held == PIPE_DEPTH - 1, 0, held + 1)
                        W.fence_operands(tmp0, ACC_REGS)
                        if IS_BLOCK:
                            promote_block(acc, tmp0, False, sav, sbv, n_st)
                        else:
                            W.promote_fragment(acc, tmp0, ACC_REGS, False, T.float32(1))
                        if IS_BLOCK and not EARLY:  # the scales of this K block
                            W.load_block_scales(sav, sbv, SA, SB, k0 + 2 * j + 1, KB_DIM,
                                                m_st + row0, n_st, BLK_N, M_DIM, N_DIM, warp_id,
                                                lane_id)
                        W.mma_wait(0)
                        release(mma2tma, held, tid_in_wg)
                        held = T.if_then_else(held == PIPE_DEPTH - 1, 0, held + 1)
                        if P_STAGES > 1:
                            release(mma2tma, held, tid_in_wg)
                            held = T.if_then_else(held == PIPE_DEPTH - 1, 0, held + 1)
                        W.fence_operands(tmp1, ACC_REGS)
                        if EARLY:
                            promote_block(acc, tmp1, False, sav1, sbv1, n_st)
                        elif IS_BLOCK:
                            promote_block(acc, tmp1, False, sav, sbv, n_st)
                        else:
                            W.promote_fragment(acc, tmp1, ACC_REGS, False, T.float32(1))
                elif PROMOTED:
                    # --- serial promotion (PROMOTE_OVERLAP=False, any PROMOTE): each
                    # interval's last stage waits for all its wgmmas (wait_group 0) and
                    # promotes tmp0; the tensor core idles meanwhile unless the other
                    # consumer warpgroup has wgmmas queued ---
                    if WB_FIRST:  # the previous tile's writeback, before acc and tmp0 fill
                        if pending == 1:  # the registers (in the loop, packed would stay live)
                            store_tile(D, Dstage, consumer, packed, prev_m + row0, prev_n, warp_id,
                                       lane_id, tid_in_wg)
                            pending = 0
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        tma2mma.wait(ring.stage, ring.phase, "consumer")
                        # the first stage of a promotion interval overwrites tmp0
                        wgmma_stage(tmp0, desc_a, desc_b, ring.stage, consumer, k % P_STAGES > 0)
                        if not WB_FIRST:  # (else stored before the loop)
                            if k == EPI_AT:
                                if pending == 1:
                                    # --- writeback of the previous tile, behind the wgmmas ---
                                    store_tile(D, Dstage, consumer, packed, prev_m + row0, prev_n,
                                               warp_id, lane_id, tid_in_wg)
                                    pending = 0
                        if (k + 1) % P_STAGES == 0 or k == K_TILES - 1:
                            # --- promotion: the interval's wgmmas are done, tmp0 -> acc ---
                            if IS_BLOCK:  # this K block's scales, read under the wgmmas
                                W.load_block_scales(sav, sbv, SA, SB, k, KB_DIM, m_st + row0,
                                                    n_st, BLK_N, M_DIM, N_DIM, warp_id,
                                                    lane_id)
                            W.mma_wait(0)
                            if CLUSTER > 1:
                                if holding == 1:
                                    release(mma2tma, held, tid_in_wg)
                                release(mma2tma, ring.stage, tid_in_wg)
                            elif tid_in_wg == 0:
                                if holding == 1:
                                    mma2tma.arrive(held)
                                mma2tma.arrive(ring.stage)
                            holding = 0
                            W.fence_operands(tmp0, ACC_REGS)
                            if IS_BLOCK:
                                promote_block(acc, tmp0, k == 0, sav, sbv, n_st)
                            else:
                                W.promote_fragment(acc, tmp0, ACC_REGS, k < P_STAGES,
                                                   T.float32(1))
                        else:
                            W.mma_wait(1)
                            if CLUSTER > 1:
                                if holding == 1:
                                    release(mma2tma, held, tid_in_wg)
                            elif tid_in_wg == 0:
                                if holding == 1:
                                    mma2tma.arrive(held)
                            held = ring.stage
                            holding = 1
                        ring.advance()
                else:
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        tma2mma.wait(ring.stage, ring.phase, "consumer")

                        # --- compute: 4 k32 wgmmas of m64nBLK_Nk32 per consumer ---
                        wgmma_stage(acc, desc_a, desc_b, ring.stage, consumer, k > 0)
                        if k == EPI_AT:
                            if pending == 1:
                                # --- writeback of the previous tile, behind the queued wgmmas ---
                                store_tile(D, Dstage, consumer, packed, prev_m + row0, prev_n,
                                           warp_id, lane_id, tid_in_wg)
                                pending = 0
                        # v12's release: slice k-1 is done, its stage goes back
                        W.mma_wait(1)
                        if k > 0:
                            release(mma2tma, held, tid_in_wg)
                        held = ring.stage
                        ring.advance()
                    W.mma_wait(0)  # the tile's last slice is done too
                    release(mma2tma, held, tid_in_wg)
                    W.fence_operands(acc, ACC_REGS)
                if S > 1:
                    # --- SPLIT_K: publish the unscaled partial half, count it; the unit
                    # counted last sums every slab in split order and goes on to the
                    # epilogue, the others to their next unit ---
                    tile = T.meta_var(m_tile * N_TILES + scheduler.n_idx)
                    cnt_i = T.meta_var(tile * NUM_CONSUMERS + consumer)
                    H.splitk_publish(WS, scheduler.m_idx // M_TILES, tile, consumer * HALF,
                                     acc, ACC_REGS, tid_in_wg)
                    T.cuda.warpgroup_sync(1 + consumer)  # every slab store before the count
                    if tid_in_wg == 0:
                        H.splitk_count_arrival(arrivals, consumer, CNT.ptr_to([cnt_i]))
                    T.cuda.warpgroup_sync(1 + consumer)  # the count (and acquire) to all
                    last = 0
                    if H.splitk_is_last(arrivals, consumer, S):
                        H.splitk_reduce_slabs(WS, tile, consumer * HALF, acc, ACC_REGS, S,
                                              REDUCE_IN_FLIGHT, tid_in_wg)
                        if tid_in_wg == 0:  # every unit counted: zero for the next launch
                            CNT[cnt_i] = 0
                        last = 1
                if last == 1:
                    # --- epilogue scales (tensor, row), then fp32 -> 2 x dtype ---
                    if IS_TENSOR:
                        W.scale_fragment(acc, ACC_REGS, SA[0] * SB[0])
                    if IS_ROW:
                        W.scale_fragment_rows_cols(acc, BLK_N, SA, SB, m_st + row0, n_st,
                                                   M_DIM, N_DIM, warp_id, lane_id)
                    W.pack_fragment(packed, acc, PACKED_REGS, dtype)
                    pending = 1
                    prev_m = m_st
                    prev_n = n_st
                scheduler.next_tile()

            # --- writeback of the last tile, then every store must have completed ---
            if pending == 1:
                store_tile(D, Dstage, consumer, packed, prev_m + row0, prev_n, warp_id,
                           lane_id, tid_in_wg)
            # --- free: SMEM is released at exit, so the last TMA store must have read it ---
            if tid_in_wg == 0:
                H.store_wait(0)

        if CLUSTER > 1:
            # the peer multicasts into this CTA's SMEM and arrives on its barriers until it is
            # done: neither CTA may exit (releasing its SMEM) before both are
            T.cuda.cluster_sync()

    if S > 1:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), W.FP8_STORAGE),
                   B: T.Buffer((N_DIM, K_DIM), W.FP8_STORAGE),
                   D: T.Buffer((M_DIM, N_DIM), dtype),
                   SA: T.Buffer(SA_SHAPE, "float32"), SB: T.Buffer(SB_SHAPE, "float32"),
                   WS: T.Buffer((S, WS_TILES, BLK_M * BLK_N), H.ACC_DTYPE),
                   CNT: T.Buffer((CNT_LEN,), "int32")):
            gemm(A, B, D, SA, SB, WS, CNT)
    else:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), W.FP8_STORAGE),
                   B: T.Buffer((N_DIM, K_DIM), W.FP8_STORAGE),
                   D: T.Buffer((M_DIM, N_DIM), dtype),
                   SA: T.Buffer(SA_SHAPE, "float32"), SB: T.Buffer(SB_SHAPE, "float32")):
            gemm(A, B, D, SA, SB, None, None)

    return kernel
