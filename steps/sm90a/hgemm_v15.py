"""Step 15 (sm_90a): operands in either major order, read by TMA and the wgmma descriptors.

Lesson: an operand stored transposed (MN-major: A as (K, M), B as (K, N)) needs no copy: TMA
loads it in boxes of 64 MN elements x 64 K rows, the descriptor's LBO and SBO describe the
MN-major swizzled tile, and the wgmma's transpose bit tells the tensor core which way it lies.
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import epilogue as E
from tirx_gemm import helpers as H
from tirx_gemm import hopper as W
from tirx_gemm.hopper import layouts as HL
from tirx_gemm import pdl as P


def hgemm_v15(M: int, N: int, K: int, dtype: str = "float16", A_MAJOR: str = "K",
              B_MAJOR: str = "K", PIPE_DEPTH: int = 4, EPI_BUFS: int = 2, SM_COUNT: int = 132,
              L2_GROUP: int = 8, PRODUCER_REGS: int = 40, CONSUMER_REGS: int = 232,
              RUNTIME_M: bool = False, CLUSTER: int = W.CLUSTER_SIZE, PDL: bool = False,
              RUNTIME_K: bool = False, ACT_GRAD=None, BIAS=False,
              ACT_GRAD_PREFETCH: bool = False, ACT_SAVE=None, ACT_GRAD_DBIAS: bool = False,
              WGRAD_DBIAS: bool = False):
    """Step card -- v15, operand layouts.

    Changes from v9: the kernel reads A and B in either major order (A_MAJOR, B_MAJOR in
      {"K", "MN"}), so D = A @ B.T runs for the four layouts NN, NT, TN, TT without copying
      an operand first (a training step's dgrad reads the weight transposed, its wgrad both
      operands). An MN-major operand X is the transposed tensor, (K, rows) row-major:
      * TMA: the stage tile of ``rows`` MN elements is loaded as rows / 64 boxes of 64 K rows
        x 64 MN elements (one 128-byte swizzle row of MN elements each); the same bytes land
        per stage, so the expect_tx counts, the ring and the multicast of B's halves (two
        chunks of 64 rows each) are v9's;
      * SMEM: rows / 64 chunks of 64 K rows x 128 B, each 8 KiB, 128B-swizzled as TMA wrote them;
      * descriptor: SBO 1 KiB between 8-K-row groups (as K-major), LBO 8 KiB between the 64-
        element MN chunks of one wgmma (m64n256: four), a k16 slice 2 KiB on instead of 32 B;
      * wgmma: imm-trans-a / imm-trans-b = 1 for an MN-major operand (16-bit types only).
      Everything else (roles, barriers, the epilogue, the scheduler) is v9's.
    Speed options (v12's, off by default so the lesson is v9 + the layout): CLUSTER=1, PDL=True,
      RUNTIME_K=True (one wgrad kernel for every token count); the lesson says why.
    Why: a Linear's backward (dgrad = dY @ W, wgrad = dY.T @ X) then copies no operand first.
    Contracts/Barriers: v9's; one expect_tx covers an MN-major load's boxes.
    Constraints: v9's (CLUSTER 1 or 2; PDL with CLUSTER=1), except: M a multiple of 8 when
      A_MAJOR="MN" (A's rows are then M elements: TMA's 16-byte row stride; with RUNTIME_M
      the caller checks it); N a multiple of 8; K a multiple of 8 while an operand is
      K-major, any K >= 1 when both are MN-major (K is then the outer dimension: wgrad's
      token count needs no padding); dtype float16 or bfloat16.
    Training options (off; K-major A, B; BIAS False or dtype, an int32 view; see the lesson):
      ACT_GRAD (gelu, gelu_tanh, silu, swiglu): D = DY * act'(A @ B.T + bias), operands A, B,
      D, DY, bias; ACT_GRAD_PREFETCH; ACT_GRAD_DBIAS (with BIAS): + DBP, D's 16-row column sums.
      ACT_SAVE (relu, gelu, gelu_tanh, silu): the forward keeping z: D = act(z), Z = A @ B.T + bias.
      WGRAD_DBIAS (plain D, RUNTIME_K): + DB, A's fp32 row sums over K (wgrad's A = dz.T: dbias).
    Run: ``tirx-gemm run v15 --arch sm_90a --mnk 4096,4096,4096`` (K-major both: v9's kernel).
    """
    BLK_M, BLK_N, BLK_K = 128, 256, 64   # per CTA, as v7
    NUM_CONSUMERS = BLK_M // W.WGMMA_M      # consumer warpgroups, 64 rows each
    PRODUCER = NUM_CONSUMERS              # the producer is the last warpgroup
    ACC_REGS = BLK_N // 2                 # fp32 accumulators per consumer thread (128)
    A_STAGE_BYTES = W.tile_bytes(BLK_M, BLK_K)  # 16 KiB
    B_STAGE_BYTES = W.tile_bytes(BLK_N, BLK_K)  # 32 KiB: half loaded here, half by the peer
    if isinstance(CLUSTER, bool) or CLUSTER not in (1, 2):
        raise ValueError(f"CLUSTER={CLUSTER!r} must be 2 (v9's CTA pair sharing B) or 1 (one CTA)")
    P.check(PDL, CLUSTER)
    B_HALF = BLK_N // CLUSTER                   # B rows each CTA loads (a pair: and multicasts)
    B_MASK = W.CLUSTER_MASK if CLUSTER > 1 else 0  # multicast to both CTAs, or unicast
    PACKED_REGS = ACC_REGS // 2               # 2 x 16-bit registers of a packed tile (64)
    EPI_CHUNKS = BLK_N // W.EPI_COLS            # 64-column TMA-store chunks per tile (4)

    A_MN, B_MN = W.check_major("A_MAJOR", A_MAJOR), W.check_major("B_MAJOR", B_MAJOR)
    HL.check_act_grad(ACT_GRAD, A_MN, B_MN)
    if ACT_GRAD == HL.SWIGLU_GRAD and (BIAS or ACT_GRAD_PREFETCH or N % E.SWIGLU_TILE_STEP):
        raise ValueError(f"ACT_GRAD='swiglu' (B the fused gate/up weight, N = {N} its rows: a "
                         f"multiple of {E.SWIGLU_TILE_STEP}) takes no BIAS or ACT_GRAD_PREFETCH")
    if not isinstance(ACT_GRAD_PREFETCH, bool) or (ACT_GRAD_PREFETCH and ACT_GRAD is None):
        raise ValueError(f"ACT_GRAD_PREFETCH={ACT_GRAD_PREFETCH!r}: True or False, True only "
                         f"with ACT_GRAD")
    HL.check_act_save(ACT_SAVE, ACT_GRAD, A_MN, B_MN)
    HL.check_act_grad_dbias(ACT_GRAD_DBIAS, ACT_GRAD, BIAS)
    HL.check_wgrad_dbias(WGRAD_DBIAS, ACT_GRAD, ACT_SAVE, BIAS, RUNTIME_K)
    if BIAS and ((ACT_GRAD is None and ACT_SAVE is None) or BIAS != dtype):
        raise ValueError(f"BIAS={BIAS!r}: v15 takes a bias only with ACT_GRAD or ACT_SAVE, in "
                         f"the operands' dtype ({dtype!r})")
    W.check_layout_shape(M, N, K, dtype, A_MN, B_MN)  # K any when both are MN-major
    M = H.runtime_rows(M, RUNTIME_M)  # RUNTIME_M: one kernel for every M (A.shape[0])
    if not isinstance(RUNTIME_K, bool):
        raise ValueError(f"RUNTIME_K={RUNTIME_K!r} must be True or False")
    K = H.runtime_extent("K") if RUNTIME_K else K  # RUNTIME_K: bound from A's shape
    H.check_positive_ints(EPI_BUFS=EPI_BUFS)
    if EPI_CHUNKS % EPI_BUFS:
        # chunk c of every tile uses staging tile c % EPI_BUFS: with 3 of 4, the next tile's
        # chunk 0 would rewrite tile 0 while the store of chunk 3 may still be reading it
        raise ValueError(f"EPI_BUFS={EPI_BUFS} does not divide the {EPI_CHUNKS} 64-column "
                         f"chunks of a {BLK_N}-column tile (use 1, 2 or 4)")
    W.check_ring_for_wait_one(PIPE_DEPTH)
    H.check_pipe_depth(PIPE_DEPTH, A_STAGE_BYTES + B_STAGE_BYTES,
                       NUM_CONSUMERS * EPI_BUFS * W.tile_bytes(W.WGMMA_M, W.EPI_COLS)
                       + (HL.ONES_BYTES if WGRAD_DBIAS else 0))
    H.check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)
    if CLUSTER > 1:
        W.check_cluster_pool(SM_COUNT)
    # setmaxnreg: 128 producer threads + 256 consumer threads within the SM's 64K registers
    W.check_reg_split(PRODUCER_REGS, CONSUMER_REGS, NUM_CONSUMERS)
    K_TILES = (K + BLK_K - 1) // BLK_K  # the last K tile is zero-filled past K
    NUM_CLUSTERS = SM_COUNT // CLUSTER
    # the previous tile's epilogue runs once this many + 1 K steps of wgmmas are queued
    EPI_AT = T.min(1, K_TILES - 1) if RUNTIME_K else min(1, K_TILES - 1)

    A_SMEM = W.smem_shape(PIPE_DEPTH, BLK_M, BLK_K, A_MN)
    B_SMEM = W.smem_shape(PIPE_DEPTH, BLK_N, BLK_K, B_MN)
    A_layout = H.swizzled_layout(A_SMEM, dtype)
    B_layout = H.swizzled_layout(B_SMEM, dtype)
    A_LBO, A_SBO, A_K16 = W.desc_steps(A_MN)
    B_LBO, B_SBO, B_K16 = W.desc_steps(B_MN)
    # per consumer EPI_BUFS staging tiles of 64x64 (one TMA-store box each)
    D_layout = H.swizzled_layout((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS), dtype)

    @T.inline
    def release(mma2tma, stage, tid_in_wg):
        # a consumer warpgroup's wgmmas are done reading `stage`: its empty barrier (a pair:
        # in both CTAs, whose multicasts write it)
        if CLUSTER > 1:
            W.release_stage_in_cluster(mma2tma, stage, tid_in_wg)
        else:
            if tid_in_wg == 0:
                mma2tma.arrive(stage)

    # the kernel body; DY and bias are None without ACT_GRAD and BIAS (no such operands), Z
    # without ACT_SAVE, DBP without ACT_GRAD_DBIAS, DB without WGRAD_DBIAS
    @T.inline
    def gemm(A, B, D, DY, bias, Z=None, DBP=None, DB=None):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        if CLUSTER > 1:
            rank, _unused = T.cta_id_in_cluster([CLUSTER, 1])  # this CTA's place in the pair
        else:
            rank = T.meta_var(0)
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # 0, 1: consumers; 2: producer
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        # tma2mma[s]: this CTA's producer thread arrives once per load into stage s
        #   (arrive.expect_tx for all 48 KiB landing here); the bytes are completed by this
        #   CTA's TMA (A, own B half) and by the PEER's multicast (the other B half). All
        #   256 consumer threads of this CTA wait. Initial phase 0; consumers wait from 0.
        # mma2tma[s]: thread 0 of each consumer warpgroup of BOTH CTAs arrives
        #   (CLUSTER * NUM_CONSUMERS: a pair 4, two of them remote; one CTA 2) once its wgmmas
        #   have finished reading stage s; this CTA's producer waits before refilling it
        #   (its multicast writes both CTAs' stage s). Initial phase 0; the producer waits
        #   from phase 1, which a fresh barrier counts as complete: every stage starts empty.
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1,
                        "mma2tma", CLUSTER * NUM_CONSUMERS)
        tma2mma, mma2tma = stages.full, stages.empty
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc(A_SMEM, dtype, layout=A_layout)
        Bsmem = pool.alloc(B_SMEM, dtype, layout=B_layout)
        Dstage = pool.alloc((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS), dtype,
                            layout=D_layout)
        if WGRAD_DBIAS:  # the row-sum wgmma's B: ones (HL.fill_ones), 1 KiB on a 1 KiB boundary
            Ones = pool.alloc(HL.ONES_TILE, dtype)
        pool.commit()

        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        if wg_id == PRODUCER:
            if tid_in_wg == 0:
                stages.init()
            if WGRAD_DBIAS:
                HL.fill_ones(Ones, tid_in_wg, dtype)
        if CLUSTER > 1:  # the peer signals these barriers: publish the inits cluster-wide
            W.publish_setup_cluster()
        else:
            W.publish_setup()
        if PDL:  # nothing above touched global memory: it overlapped the previous kernel
            P.wait()

        # every role of both CTAs walks the same cluster-tile sequence (the last row of
        # cluster tiles may reach past M: both CTAs still take part in it)
        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, CLUSTER * BLK_M),
            num_n_tiles=H.ceil_div(N, BLK_N), num_clusters=NUM_CLUSTERS,
            l2_group_size=L2_GROUP)
        scheduler.init(bx // CLUSTER)

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS, increase=False):
            # --- load (producer): own A rows, own half of B multicast to both CTAs ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var((scheduler.m_idx * CLUSTER + rank) * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        # each operand in its major order (hopper/layouts.py): own A tile
                        # unicast, own B half multicast to both CTAs, one expect_tx for all
                        W.expect_stage_bytes(tma2mma.ptr(ring.stage), BLK_M, BLK_N, BLK_K)
                        W.tma_load_operand(Asmem, ring.stage, 0, A, m_st, k * BLK_K, BLK_M,
                                           BLK_K, A_MN, tma2mma.ptr(ring.stage), 0)
                        W.tma_load_operand(Bsmem, ring.stage, rank * B_HALF, B,
                                           n_st + rank * B_HALF, k * BLK_K, B_HALF, BLK_K,
                                           B_MN, tma2mma.ptr(ring.stage), B_MASK)
                        ring.advance()
                    scheduler.next_tile()

        # (a comparison, not the (start, stop) form, which 0.27.0.post1 cannot lower)
        with WarpgroupRole(wg_id < NUM_CONSUMERS, True, regs=CONSUMER_REGS, increase=True):
            consumer = T.meta_var(wg_id)  # owns rows [64*consumer, 64*consumer + 64)
            row0 = T.meta_var(consumer * W.WGMMA_M)
            acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers, not TMEM
            packed = T.alloc_local((PACKED_REGS,), "uint32")  # the previous tile, 2 x 16-bit
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            if WGRAD_DBIAS:  # A's running row sums (tiles of n_idx 0) and the ones tile
                rs = T.alloc_local((HL.ROWSUM_REGS,), H.ACC_DTYPE)
                desc_o = T.alloc_local((1,), "uint64")
                W.encode_desc_major(desc_o, Ones.ptr_to([0, 0]), W.DESC_LBO, W.DESC_SBO)
            W.encode_desc_major(desc_a, Asmem.ptr_to([0] * len(A_SMEM)), A_LBO, A_SBO)
            W.encode_desc_major(desc_b, Bsmem.ptr_to([0] * len(B_SMEM)), B_LBO, B_SBO)
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0      # stage of the slice whose wgmmas may still be running
            pending: T.int32 = 0   # 1 while `packed` holds a tile not yet stored
            prev_m: T.int32 = 0    # where that tile goes
            prev_n: T.int32 = 0
            while scheduler.valid():
                m_st = T.meta_var((scheduler.m_idx * CLUSTER + rank) * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * BLK_N)
                for k in T.serial(K_TILES, annotations=H.ROLLED):
                    tma2mma.wait(ring.stage, ring.phase, "consumer")

                    # --- compute: 4 k16 slices of m64n256k16, each operand's own k16 step
                    # and transpose bit; k=0 overwrites (scale-d 0) ---
                    W.mma_fence()
                    slice_a = T.meta_var(W.desc_advance(desc_a[0], ring.stage * A_STAGE_BYTES)
                                         + T.Cast("uint64", consumer * W.DESC_M64_STEP))
                    # WGRAD_DBIAS: the row sums first, fenced in their branch, so the group's last
                    # wgmma is D's as without them (ptxas then keeps the wgmmas in flight)
                    if WGRAD_DBIAS:
                        if scheduler.n_idx == 0:  # the same A slice against ones: row sums
                            W.mma_fence()
                            HL.wgmma_rowsum(rs, slice_a, desc_o[0], k > 0, dtype, A_K16,
                                            int(A_MN))
                    W.wgmma_tile_major(acc, slice_a,
                                       W.desc_advance(desc_b[0], ring.stage * B_STAGE_BYTES),
                                       k > 0, 1, BLK_N, dtype, A_K16, B_K16, int(A_MN),
                                       int(B_MN))
                    W.mma_commit()
                    if k == EPI_AT:
                        if pending == 1:
                            # --- writeback of the previous tile, behind the queued wgmmas
                            # (they write acc; the epilogue reads only `packed`) ---
                            W.store_packed_tile(D, Dstage, consumer, packed, prev_m + row0,
                                                prev_n, BLK_N, EPI_BUFS, warp_id, lane_id,
                                                tid_in_wg, 1 + consumer)
                            pending = 0
                    # slice k-1 is done: its stage goes back to the producers of both CTAs
                    W.mma_wait(1)
                    if k > 0:
                        release(mma2tma, held, tid_in_wg)
                    held = ring.stage
                    ring.advance()
                if ACT_GRAD_PREFETCH:  # dy's words in flight under the last wgmmas
                    HL.load_dy_words(packed, BLK_N, DY, m_st + row0, n_st, M, N, warp_id,
                                     lane_id)
                W.mma_wait(0)  # the tile's last slice is done too
                release(mma2tma, held, tid_in_wg)
                W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the wait
                if WGRAD_DBIAS:
                    if scheduler.n_idx == 0:  # A's row sums over all of K: DB, fp32
                        W.fence_operands(rs, HL.ROWSUM_REGS)
                        HL.store_rowsums(DB, rs, m_st + row0, M, warp_id, lane_id)
                # free the accumulators for the next tile's wgmmas: fp32 -> 2 x dtype
                if ACT_GRAD == HL.SWIGLU_GRAD:  # dg, du of the fused gate/up product
                    HL.epilogue_swiglu_grad(packed, acc, BLK_N, DY, dtype, m_st + row0, n_st,
                                            M, N, warp_id, lane_id)
                elif ACT_GRAD is not None:  # dz = dy * act'(acc + bias), packed as it goes
                    HL.epilogue_act_grad(packed, acc, BLK_N, DY, bias, ACT_GRAD, dtype,
                                         m_st + row0, n_st, M, N, warp_id, lane_id,
                                         ACT_GRAD_PREFETCH)
                    if ACT_GRAD_DBIAS:  # each warp's 16-row column sums of dz, as packed
                        HL.store_dbias_partials(DBP, packed, BLK_N, dtype, m_st + row0, n_st,
                                                M, N, warp_id, lane_id)
                elif ACT_SAVE is not None:  # z = acc + bias stored now, act(z) packed for D
                    HL.epilogue_act_save(Z, Dstage, consumer, packed, acc, BLK_N, bias,
                                         ACT_SAVE, dtype, m_st + row0, n_st, N, EPI_BUFS,
                                         warp_id, lane_id, tid_in_wg, 1 + consumer)
                else:
                    W.pack_fragment(packed, acc, PACKED_REGS, dtype)
                pending = 1
                prev_m = m_st
                prev_n = n_st
                scheduler.next_tile()

            # --- writeback of the last tile, then every store must have completed ---
            if pending == 1:
                W.store_packed_tile(D, Dstage, consumer, packed, prev_m + row0, prev_n, BLK_N,
                                    EPI_BUFS, warp_id, lane_id, tid_in_wg, 1 + consumer)
            if tid_in_wg == 0:
                H.store_wait(0)

        if CLUSTER > 1:
            # --- free: the peer multicasts into this CTA's SMEM and arrives on its barriers
            # until it is done; neither CTA may exit (and release its SMEM) before both are ---
            T.cuda.cluster_sync()

    if ACT_SAVE is not None and BIAS:  # Z: the pre-activation, beside D = act(Z)
        @T.prim_func
        def kernel(A: T.Buffer(W.gmem_shape(M, K, A_MN), dtype),
                   B: T.Buffer(W.gmem_shape(N, K, B_MN), dtype),
                   D: T.Buffer((M, N), dtype), Z: T.Buffer((M, N), dtype),
                   bias: T.Buffer((N // 2,), "int32")):
            gemm(A, B, D, None, bias, Z)
    elif ACT_SAVE is not None:
        @T.prim_func
        def kernel(A: T.Buffer(W.gmem_shape(M, K, A_MN), dtype),
                   B: T.Buffer(W.gmem_shape(N, K, B_MN), dtype),
                   D: T.Buffer((M, N), dtype), Z: T.Buffer((M, N), dtype)):
            gemm(A, B, D, None, None, Z)
    elif ACT_GRAD_DBIAS:  # DBP: one fp32 row of column sums per 16 rows of D
        @T.prim_func
        def kernel(A: T.Buffer(W.gmem_shape(M, K, A_MN), dtype),
                   B: T.Buffer(W.gmem_shape(N, K, B_MN), dtype),
                   D: T.Buffer((M, N), dtype), DY: T.Buffer((M, N // 2), "int32"),
                   bias: T.Buffer((N // 2,), "int32"),
                   DBP: T.Buffer(((M + HL.DBIAS_ROWS - 1) // HL.DBIAS_ROWS, N), H.ACC_DTYPE)):
            gemm(A, B, D, DY, bias, None, DBP)
    elif WGRAD_DBIAS:  # DB: A's row sums, fp32
        @T.prim_func
        def kernel(A: T.Buffer(W.gmem_shape(M, K, A_MN), dtype),
                   B: T.Buffer(W.gmem_shape(N, K, B_MN), dtype),
                   D: T.Buffer((M, N), dtype), DB: T.Buffer((M,), H.ACC_DTYPE)):
            gemm(A, B, D, None, None, None, None, DB)
    elif ACT_GRAD is not None and BIAS:
        @T.prim_func
        def kernel(A: T.Buffer(W.gmem_shape(M, K, A_MN), dtype),
                   B: T.Buffer(W.gmem_shape(N, K, B_MN), dtype),
                   D: T.Buffer((M, N), dtype), DY: T.Buffer((M, N // 2), "int32"),
                   bias: T.Buffer((N // 2,), "int32")):
            gemm(A, B, D, DY, bias)
    elif ACT_GRAD is not None:  # SwiGLU's dy has N / 2 columns: N / 4 words a row
        @T.prim_func
        def kernel(A: T.Buffer(W.gmem_shape(M, K, A_MN), dtype),
                   B: T.Buffer(W.gmem_shape(N, K, B_MN), dtype),
                   D: T.Buffer((M, N), dtype),
                   DY: T.Buffer((M, N // (4 if ACT_GRAD == HL.SWIGLU_GRAD else 2)), "int32")):
            gemm(A, B, D, DY, None)
    else:
        @T.prim_func
        def kernel(A: T.Buffer(W.gmem_shape(M, K, A_MN), dtype),
                   B: T.Buffer(W.gmem_shape(N, K, B_MN), dtype),
                   D: T.Buffer((M, N), dtype)):
            gemm(A, B, D, None, None)

    return P.with_launch(kernel, PDL, CLUSTER)
