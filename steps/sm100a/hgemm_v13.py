"""Step 13 (sm_100a): fp8 -- e4m3 operands on tcgen05 kind::f8f6f4, scales in the epilogue.

Lesson: v9's pipeline with one-byte operands. The bytes of a stage do not change (a
128-byte swizzle row is now 128 elements of K instead of 64), the MMA kind does
(kind::f8f6f4, K = 32 per instruction instead of 16), and the fp32 accumulator is scaled
back to real units in the epilogue. On Blackwell the tensor core accumulates fp8 products
in fp32, so there is no promotion to teach here: that is the sm_90a twin's lesson.
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H

SCALES = W.FP8_SCALES  # "tensor", "row"


def scale_shapes(scale: str, M, N, K):
    """The shapes of scale_a and scale_b of a SCALE mode (fp32; "mx": the blocked e8m0
    atoms of SFA and SFB, uint8)."""
    if scale == "mx":
        return W.mx_sf_gmem_shape(M, K), W.mx_sf_gmem_shape(N, K)
    if scale == "tensor":
        return (1,), (1,)
    if scale == "row":
        return (M,), (N,)
    raise ValueError(f"SCALE={scale!r} must be one of {', '.join(SCALES)} on sm_100a "
                     f"(or mx; 1x128 / 128x128 block scaling is sm_90a v13's)")


def hgemm_v13(M: int, N: int, K: int, dtype: str = "float16", SCALE: str = "tensor",
              PIPE_DEPTH: int = 4, SM_COUNT: int = 148):
    """Step card -- v13 (sm_100a), fp8 (e4m3) on v9's skeleton.

    Changes from v9 (diff the two files):
      operands: A (M x K) and B (N x K) are e4m3, both K-major, passed as uint8 (a torch
        float8_e4m3fn tensor as ``t.view(torch.uint8)``, tirx_gemm.op.fp8); D is ``dtype``
        (float16 default, or bfloat16); fp32 scales SA, SB follow D.
      stage: BLK_K = 128 (W.FP8_BLK_K): one 128-byte swizzle row of e4m3, so Asmem
        (PIPE_DEPTH, 2, 128, 128) and Bsmem (PIPE_DEPTH, 128, 128) are uint8 with v9's
        bytes (48 KiB a stage per CTA) and v9's TMA boxes;
      MMA: the same SMEM through a float8_e4m3fn view (``Asmem.view(...)``) makes
        Tx.gemm_async issue tcgen05.mma kind::f8f6f4 (4 of K = 32 per stage) with e4m3 in
        the instruction descriptor; the SMEM descriptors are v9's;
      epilogue: tcgen05.ld of 64 fp32 columns, times the scale in fp32, one rounding to D's
        dtype, v9's staged TMA store (W.fp8_scaled_chunk):
          "tensor": SA (1,), SB (1,): D = (SA[0] * SB[0]) * (A @ B.T);
          "row":    SA (M,), SB (N,): D[m, n] = SA[m] * SB[n] * (A @ B.T)[m, n]
                    (a chunk's 64 SB values loaded two per lane, shared by shuffles);
      dropped: v9's fused epilogue keywords (BIAS, ACT, OUT_DTYPE, SWIGLU).
    Accumulation: kind::f8f6f4 accumulates into the fp32 TMEM accumulator, taken as full
      fp32 (not measured: no sm_100a GPU), so the K loop is v9's with no promotion (contrast
      sm_90a v13's PROMOTE). What NumSim models and what it cannot see: the lesson.
    Barriers, roles, scheduler, edges: v9's (see its card): tma2mma counts 1 + both CTAs'
      bytes (expect_tx of 2 x 48 KiB), mma2tma 2, mma2ld 1, ld2mma 256.
    SCALE="mx": block-scaled MXFP8 (kind::mxf8f6f4.block_scale, UE8M0 scale factors in
      TMEM) is a separate builder on v8's one-consumer pair (hgemm_v13_mx, its card): v9's
      two accumulators fill all 512 TMEM columns, leaving none for scale factors.
    Constraints: any M >= 1; N a multiple of 8 (16-byte rows of 2-byte D); K a multiple of
      16 (16-byte rows of 1-byte A and B; TMA zero-fills the last 128-K stage); dtype
      float16 or bfloat16; SCALE tensor | row | mx; PIPE_DEPTH >= 1 within SMEM; SM_COUNT even.
    Run: ``tirx-gemm build v13 --arch sm_100a --mnk 4096,4096,4096``; ``tirx-gemm sim v13``.
    """
    CTA_PAIR, NUM_CONSUMER = W.CTA_PAIR, 2
    BLK_M, BLK_N, BLK_K = 128, 128, W.FP8_BLK_K  # per CTA and consumer; K: 128 bytes
    MMA_N = CTA_PAIR * BLK_N  # 256: one consumer's MMA is 256 x 256
    TILE_M = NUM_CONSUMER * CTA_PAIR * BLK_M  # 512: the cluster tile is 512 x 256
    EPI_N = 64  # epilogue chunk width (columns per TMA store)
    PRODUCER_REGS, EPILOGUE_REGS = 56, 224  # v9's setmaxnreg split (see its card)
    K_TILES = H.ceil_div(K, BLK_K)  # the last K tile is zero-filled past K
    STAGE_BYTES = (NUM_CONSUMER * BLK_M + BLK_N) * BLK_K  # one CTA's share, 1 byte each
    if SCALE == "mx":
        return hgemm_v13_mx(M, N, K, dtype, PIPE_DEPTH, SM_COUNT)
    dtype = H.check_fp8_contract(M, N, K, dtype)
    if SCALE not in SCALES:
        raise ValueError(f"SCALE={SCALE!r} must be one of {', '.join(SCALES)} on sm_100a "
                         f"(or mx; 1x128 / 128x128 block scaling is sm_90a v13's)")
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, NUM_CONSUMER * BLK_M * W.EPI_ROW_BYTES)
    W.check_even_sm_count(SM_COUNT)
    SA_SHAPE, SB_SHAPE = scale_shapes(SCALE, M, N, K)
    fill_chunk = W.fp8_scaled_chunk(SCALE == "row", EPI_N, dtype)

    A_layout = H.swizzled_layout((PIPE_DEPTH, NUM_CONSUMER, BLK_M, BLK_K), W.FP8_STORAGE)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), W.FP8_STORAGE)
    D_layout = H.swizzled_layout((NUM_CONSUMER * BLK_M, EPI_N), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), W.FP8_STORAGE), B: T.Buffer((N, K), W.FP8_STORAGE),
               D: T.Buffer((M, N), dtype),
               SA: T.Buffer(SA_SHAPE, "float32"), SB: T.Buffer(SB_SHAPE, "float32")):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        rank, _unused = T.cta_id_in_cluster([CTA_PAIR, 1])  # this CTA's place in the pair
        wg_id = T.warpgroup_id([3])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        # arrival counts: tma2mma 1 (CTA 0's expect_tx) + both CTAs' bytes; mma2tma 2 (one
        # commit per consumer); mma2ld 1; ld2mma 2 x 128 (epilogue c of both CTAs)
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", NUM_CONSUMER)
        accs = H.Ring(pool, NUM_CONSUMER, "mma2ld", 1, "ld2mma", CTA_PAIR * 128)
        tma2mma, mma2tma = stages.full, stages.empty
        mma2ld, ld2mma = accs.full, accs.empty
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, NUM_CONSUMER, BLK_M, BLK_K), W.FP8_STORAGE,
                           layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), W.FP8_STORAGE, layout=B_layout)
        Dsmem = pool.alloc((NUM_CONSUMER * BLK_M, EPI_N), dtype, layout=D_layout)
        pool.commit()
        # the tensor core's view of the staged bytes: e4m3 (TMA wrote them as uint8)
        Asmem8 = Asmem.view(W.FP8_MMA_DTYPE)
        Bsmem8 = Bsmem.view(W.FP8_MMA_DTYPE)

        if wg_id == 0:
            if warp_id == 0:
                if lane_id == 0:
                    stages.init()
                    accs.init()
                W.tmem_alloc_pair(tmem_addr)
        W.publish_setup_cluster()
        tmem = W.tmem_accumulator()
        # CTA 0's copies of the two barriers the whole pair signals
        tma2mma_cta0 = tma2mma.in_cta(0)
        ld2mma_cta0 = ld2mma.in_cta(0)

        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, TILE_M), num_n_tiles=H.ceil_div(N, MMA_N),
            num_clusters=SM_COUNT // CTA_PAIR, l2_group_size=8)
        scheduler.init(bx // CTA_PAIR)

        with WarpgroupRole(wg_id, 2, regs=PRODUCER_REGS, increase=False):
            if warp_id == 3:
                # --- load (producer, both CTAs): one A slice per consumer and ONE B slice
                # per stage, 128 bytes (128 e4m3) of K a row, bytes counted on CTA 0 ---
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    n_st = T.meta_var((scheduler.n_idx * CTA_PAIR + rank) * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                        if T.cuda.elect_sync():
                            if rank == 0:
                                tma2mma.arrive_expect_tx(ring.stage, CTA_PAIR * STAGE_BYTES)
                            for c in T.unroll(NUM_CONSUMER):
                                m_st = T.meta_var(
                                    ((scheduler.m_idx * NUM_CONSUMER + c) * CTA_PAIR + rank)
                                    * BLK_M)
                                W.tma_load_pair(
                                    Asmem[ring.stage, c, :, :],
                                    A[m_st:m_st + BLK_M, k * BLK_K:(k + 1) * BLK_K],
                                    tma2mma_cta0.ptr(ring.stage))
                            W.tma_load_pair(Bsmem[ring.stage, :, :],
                                            B[n_st:n_st + BLK_N, k * BLK_K:(k + 1) * BLK_K],
                                            tma2mma_cta0.ptr(ring.stage))
                        ring.advance()
                    scheduler.next_tile()
            elif warp_id < NUM_CONSUMER:
                if rank == 0:
                    # --- compute (MMA consumer c = warp_id, CTA 0 only): kind::f8f6f4 on
                    # the e4m3 view, into TMEM columns [256c, 256c + 256), fp32 ---
                    c = T.meta_var(warp_id)
                    ring = PipelineState(PIPE_DEPTH, 0)
                    acc = PipelineState(1, 1)
                    while scheduler.valid():
                        # epilogue c of both CTAs must have drained this consumer's columns
                        ld2mma.wait(c, acc.phase, "MMA consumer")
                        W.tcgen05_fence_after_sync()
                        for k in T.serial(K_TILES, annotations=H.ROLLED):
                            tma2mma.wait(ring.stage, ring.phase, "MMA consumer")
                            W.tcgen05_fence_after_sync()
                            if T.cuda.elect_sync():
                                W.mma_tile_pair(tmem, c * MMA_N, Asmem8[ring.stage, c, :, :],
                                                Bsmem8[ring.stage, :, :], MMA_N, k != 0)
                                # one of the two releases stage s needs
                                W.mma_commit_pair(mma2tma.ptr(ring.stage))
                            ring.advance()
                        if T.cuda.elect_sync():
                            W.mma_commit_pair(mma2ld.ptr(c))
                        acc.advance()
                        scheduler.next_tile()

        with WarpgroupRole(wg_id < NUM_CONSUMER, True, regs=EPILOGUE_REGS, increase=True):
            # --- writeback (epilogue c = warpgroup id, both CTAs): this CTA's 128 rows of
            # consumer c, scaled in fp32, 256 columns in EPI_N-wide chunks ---
            c = T.meta_var(wg_id)
            acc = PipelineState(1, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            while scheduler.valid():
                m_st = T.meta_var(((scheduler.m_idx * NUM_CONSUMER + c) * CTA_PAIR + rank)
                                  * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * MMA_N)
                mma2ld.wait(c, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                for i in T.unroll(MMA_N // EPI_N):
                    Dout = T.alloc_local((EPI_N,), dtype)
                    # TMEM -> fp32 registers -> x scale -> D's dtype (this thread's row)
                    fill_chunk(tmem, c * MMA_N + i * EPI_N, Dout, SA, SB, m_st + tid_in_wg,
                               n_st + i * EPI_N, M, N, lane_id)
                    W.store_rows_via_tma(Dout, Dsmem, c * BLK_M, D, m_st, n_st + i * EPI_N,
                                         BLK_M, EPI_N, tid_in_wg, 1 + c)
                W.tcgen05_fence_before_sync()
                ld2mma_cta0.arrive_remote(c)
                acc.advance()
                scheduler.next_tile()

        # --- free: the peer's MMA and arrivals touch this CTA until both are done ---
        W.tcgen05_cluster_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free_pair(tmem_addr)

    return kernel


def hgemm_v13_mx(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 4,
                 SM_COUNT: int = 148):
    """Step card -- v13 SCALE="mx" (sm_100a): block-scaled MXFP8 on v8's CTA pair.

    Contract: A (M x K), B (N x K) e4m3 as uint8, K-major; SFA, SFB: one UE8M0 byte e per
      32 elements of K per row of A / of B (value 2**(e - 127)), passed in the hardware's
      blocked order (numerics.mx_block_sf_np: 512-byte atoms of 128 rows x 4 SFs, padded
      with e = 127); D[m, n] = sum_k A[m,k] 2**(sfa[m,k//32]-127) B[n,k] 2**(sfb[n,k//32]-127)
      in fp32, rounded once to ``dtype``.
    MMA: tcgen05.mma.cta_group::2 kind::mxf8f6f4.block_scale (scale_vec::1X, one SF per
      K = 32 MMA) over v8's 256 x 256 cluster tile: CTA 0 issues it, the tensor cores
      read A and B from both CTAs' SMEM and apply the scales; no epilogue scaling.
    What the pair changes for the scale factors: each CTA's TMEM must hold the SFs of its
      own 128 rows of A (SFA: one atom a stage, 4 columns) and of B by the MMA's joint N
      (SFB: all 256 rows, the same copy in both CTAs: two atoms a stage, 8 columns). So
      each CTA's producer loads, per stage, its A and B slices, its SFA atom and both SFB
      atoms, all counted on CTA 0's tma2mma (expect_tx of both CTAs' bytes); CTA 0's MMA
      thread then issues tcgen05.cp.cta_group::2 (32x128b.warpx4 per atom), which copies
      each CTA's staged atoms at those SMEM offsets into that CTA's TMEM, before the
      stage's 4 MMAs. Its multicast commit frees the stage and the SF slot in both CTAs
      (the next cp into slot s follows the wait for stage s's new bytes, which follows
      that commit).
    TMEM: the pair's accumulator is 256 columns, the SF rings PIPE_DEPTH x (4 + 8)
      columns after it; v8's second accumulator would take the remaining 256, so this
      step has one (ACC_STAGES = 1): the MMA waits for both epilogues to drain it.
    Roles, barriers, scheduler, edges, epilogue: v8's (its card), one accumulator stage.
      A CTA whose rows lie past M, or a pair tile whose second B row block lies past N,
      loads zero-filled atoms (counted in full); their outputs lie past D and are dropped.
    Constraints: any M >= 1; N a multiple of 8; K a multiple of 16 (a partial SF block's
      missing elements are TMA zero-fill); dtype float16 or bfloat16; PIPE_DEPTH >= 1
      within SMEM; SM_COUNT even (CTAs come in pairs).
    """
    CTA_PAIR = W.CTA_PAIR
    BLK_M, BLK_N, BLK_K = 128, 128, W.FP8_BLK_K  # per CTA
    MMA_M, MMA_N = CTA_PAIR * BLK_M, CTA_PAIR * BLK_N  # the cluster tile, 256 x 256
    ACC_STAGES = 1  # one 256-column accumulator: the SF rings take the rest of TMEM
    PRODUCER_REGS, EPILOGUE_REGS = 56, 224
    K_TILES = H.ceil_div(K, BLK_K)
    SF_BOX_R = W.MX_SF_BOX[0]  # 4 rows of 128 bytes: one 512-byte SF atom
    # what one CTA loads per stage: A and B slices, its SFA atom, both SFB atoms
    STAGE_BYTES = (BLK_M + BLK_N) * BLK_K + (1 + CTA_PAIR) * W.MX_SF_ATOM_BYTES
    dtype = H.check_fp8_contract(M, N, K, dtype)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, BLK_M * BLK_N * H.ELEM_BYTES)
    W.check_even_sm_count(SM_COUNT)
    SFA_SHAPE, SFB_SHAPE = scale_shapes("mx", M, N, K)
    # the SF rings follow the accumulator in TMEM: 256 + 12 x PIPE_DEPTH columns, within the
    # 512 for any ring SMEM allows (at most 5 stages of 33.5 KiB)
    SFA_COL = ACC_STAGES * MMA_N
    SFB_COL = SFA_COL + PIPE_DEPTH * W.mx_sf_cols(BLK_M)
    SFA_SMEM_LAYOUT = W.mx_sf_layouts(PIPE_DEPTH, BLK_M)[0]
    SFB_SMEM_LAYOUT = W.mx_sf_layouts(PIPE_DEPTH, MMA_N)[0]

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), W.FP8_STORAGE)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), W.FP8_STORAGE)
    D_layout = H.swizzled_layout((BLK_M, BLK_N), dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), W.FP8_STORAGE), B: T.Buffer((N, K), W.FP8_STORAGE),
               D: T.Buffer((M, N), dtype),
               SFA: T.Buffer(SFA_SHAPE, W.MX_SF_STORAGE),
               SFB: T.Buffer(SFB_SHAPE, W.MX_SF_STORAGE)):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        rank, _unused = T.cta_id_in_cluster([CTA_PAIR, 1])  # this CTA's place in the pair
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        # v8's counts: tma2mma 1 (CTA 0's expect_tx) + both CTAs' bytes; mma2tma, mma2ld 1
        # (one multicast commit); ld2mma 2 x 128 (every epilogue thread of the pair)
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", 1)
        accs = H.Ring(pool, ACC_STAGES, "mma2ld", 1, "ld2mma", CTA_PAIR * 128)
        tma2mma, mma2tma = stages.full, stages.empty
        mma2ld, ld2mma = accs.full, accs.empty
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), W.FP8_STORAGE, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), W.FP8_STORAGE, layout=B_layout)
        Dsmem = pool.alloc((BLK_M, BLK_N), dtype, layout=D_layout)
        SFAsmem = pool.alloc((PIPE_DEPTH, SF_BOX_R, 128), W.MX_SF_STORAGE)
        SFBsmem = pool.alloc((PIPE_DEPTH, CTA_PAIR * SF_BOX_R, 128), W.MX_SF_STORAGE)
        pool.commit()
        Asmem8 = Asmem.view(W.FP8_MMA_DTYPE)
        Bsmem8 = Bsmem.view(W.FP8_MMA_DTYPE)
        # tcgen05.cp's view of the staged atoms: (stage, row, SF of K) e8m0; B's 256 rows
        SFAview = SFAsmem.view(W.MX_SF_DTYPE).view(PIPE_DEPTH, BLK_M, W.MX_SF_K,
                                                   layout=SFA_SMEM_LAYOUT)
        SFBview = SFBsmem.view(W.MX_SF_DTYPE).view(PIPE_DEPTH, MMA_N, W.MX_SF_K,
                                                   layout=SFB_SMEM_LAYOUT)

        if wg_id == 0:
            if warp_id == 0:
                if lane_id == 0:
                    stages.init()
                    accs.init()
                W.tmem_alloc_pair(tmem_addr)
        W.publish_setup_cluster()
        tmem = W.tmem_accumulator()
        sfa_t = W.mx_sf_tmem(SFA_COL, PIPE_DEPTH, BLK_M)
        sfb_t = W.mx_sf_tmem(SFB_COL, PIPE_DEPTH, MMA_N)
        # CTA 0's copies of the two barriers the whole pair signals
        tma2mma_cta0 = tma2mma.in_cta(0)
        ld2mma_cta0 = ld2mma.in_cta(0)

        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, MMA_M), num_n_tiles=H.ceil_div(N, MMA_N),
            num_clusters=SM_COUNT // CTA_PAIR, l2_group_size=8)
        scheduler.init(bx // CTA_PAIR)

        with WarpgroupRole(wg_id, 1, regs=PRODUCER_REGS, increase=False):
            if warp_id == 3:
                # --- load (producer, both CTAs): this CTA's A and B slices, its SFA atom
                # and BOTH SFB atoms of the pair's 256 B rows, bytes counted on CTA 0 ---
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var((scheduler.m_idx * CTA_PAIR + rank) * BLK_M)
                    n_st = T.meta_var((scheduler.n_idx * CTA_PAIR + rank) * BLK_N)
                    sfa_r = T.meta_var((scheduler.m_idx * CTA_PAIR + rank) * K_TILES
                                       * SF_BOX_R)
                    sfb_r = T.meta_var(scheduler.n_idx * CTA_PAIR * K_TILES * SF_BOX_R)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                        if T.cuda.elect_sync():
                            if rank == 0:
                                tma2mma.arrive_expect_tx(ring.stage, CTA_PAIR * STAGE_BYTES)
                            bar = T.meta_var(tma2mma_cta0.ptr(ring.stage))
                            W.tma_load_pair(Asmem[ring.stage, :, :],
                                            A[m_st:m_st + BLK_M, k * BLK_K:(k + 1) * BLK_K], bar)
                            W.tma_load_pair(Bsmem[ring.stage, :, :],
                                            B[n_st:n_st + BLK_N, k * BLK_K:(k + 1) * BLK_K], bar)
                            W.tma_load_pair(SFAsmem[ring.stage, :, :],
                                            SFA[sfa_r + k * SF_BOX_R:sfa_r + (k + 1) * SF_BOX_R, :],
                                            bar)
                            for h in T.unroll(CTA_PAIR):  # B row blocks 2n and 2n + 1
                                r = T.meta_var(sfb_r + (h * K_TILES + k) * SF_BOX_R)
                                W.tma_load_pair(
                                    SFBsmem[ring.stage, h * SF_BOX_R:(h + 1) * SF_BOX_R, :],
                                    SFB[r:r + SF_BOX_R, :], bar)
                        ring.advance()
                    scheduler.next_tile()
            elif warp_id == 0:
                if rank == 0:
                    # --- compute (MMA issuer, CTA 0 only): both CTAs' SFs SMEM -> TMEM
                    # (tcgen05.cp.cta_group::2), then 4 block-scaled 256 x 256 MMAs ---
                    ring = PipelineState(PIPE_DEPTH, 0)
                    acc = PipelineState(ACC_STAGES, 1)
                    while scheduler.valid():
                        # both CTAs' epilogues must have drained the accumulator
                        ld2mma.wait(acc.stage, acc.phase, "MMA issuer")
                        W.tcgen05_fence_after_sync()
                        for k in T.serial(K_TILES, annotations=H.ROLLED):
                            tma2mma.wait(ring.stage, ring.phase, "MMA issuer")
                            W.tcgen05_fence_after_sync()
                            if T.cuda.elect_sync():
                                W.mx_sf_to_tmem_pair(sfa_t[ring.stage, :, :],
                                                     SFAview[ring.stage, :, :])
                                W.mx_sf_to_tmem_pair(sfb_t[ring.stage, :, :],
                                                     SFBview[ring.stage, :, :])
                                W.mma_tile_mx_pair(tmem, acc.stage * MMA_N,
                                                   Asmem8[ring.stage, :, :],
                                                   Bsmem8[ring.stage, :, :],
                                                   sfa_t[ring.stage, :, :],
                                                   sfb_t[ring.stage, :, :], MMA_N, k != 0)
                                # stage s (SMEM and SF slot) is free in both CTAs once
                                # these copies and MMAs are done
                                W.mma_commit_pair(mma2tma.ptr(ring.stage))
                            ring.advance()
                        if T.cuda.elect_sync():
                            W.mma_commit_pair(mma2ld.ptr(acc.stage))
                        acc.advance()
                        scheduler.next_tile()

        with WarpgroupRole(wg_id, 0, regs=EPILOGUE_REGS, increase=True):
            # --- writeback (epilogue, both CTAs): v8's, this CTA's 128 rows x 256 columns
            # in two 128-column chunks (the MMA applied the scales) ---
            acc = PipelineState(ACC_STAGES, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            while scheduler.valid():
                m_st = T.meta_var((scheduler.m_idx * CTA_PAIR + rank) * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * MMA_N)
                mma2ld.wait(acc.stage, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                for c in T.unroll(MMA_N // BLK_N):
                    Dreg_out = T.alloc_local((BLK_N,), dtype)
                    W.tmem_to_registers(tmem, acc.stage * MMA_N + c * BLK_N, BLK_N, Dreg_out)
                    W.store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st + c * BLK_N, BLK_M,
                                         BLK_N, tid_in_wg, 1)
                W.tcgen05_fence_before_sync()
                ld2mma_cta0.arrive_remote(acc.stage)
                acc.advance()
                scheduler.next_tile()

        # --- free: the peer's MMA and arrivals touch this CTA until both are done ---
        W.tcgen05_cluster_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free_pair(tmem_addr)

    return kernel
