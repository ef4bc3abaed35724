"""Step 15 (sm_100a): operands in either major order, read by TMA and the tcgen05 descriptors.

Lesson: an operand stored transposed (MN-major: A as (K, M), B as (K, N)) needs no copy: its
stage tile stays as it lies in SMEM, and the MMA's shared-memory descriptor and instruction
descriptor (the a_major / b_major bits) say which way it lies.
"""
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H
from tirx_gemm.blackwell import act_grad as AG


def hgemm_v15(M: int, N: int, K: int, dtype: str = "float16", A_MAJOR: str = "K",
              B_MAJOR: str = "K", PIPE_DEPTH: int = 4, SM_COUNT: int = 148, ACT_GRAD=None,
              BIAS=False, ACT_SAVE=None, ACT_GRAD_DBIAS: bool = False):
    """Step card -- v15, operand layouts.

    Changes from v7: the kernel reads A and B in either major order (A_MAJOR, B_MAJOR in
      {"K", "MN"}; an MN-major operand is the transposed tensor, (K, M) or (K, N)), so NN,
      NT, TN and TT run without copying an operand:
      * SMEM: an MN-major stage tile is kept as it lies, (BLK_K, rows), in the same
        128B-swizzled atoms (64 MN elements per 128-byte row; a 128-row tile is two 8 KiB
        chunks of 64 K rows);
      * TMA: one box per 64-element chunk of rows of the transposed tensor; the bytes per
        stage and the single expect_tx are v7's;
      * MMA: Tx.gemm_async(..., transA=, transB=) marks the buffer as [K, MN]; TIRx's
        tcgen05 lowering then encodes the MN-major shared-memory descriptor (LBO between MN
        chunks, SBO between 8-row K groups) and the instruction descriptor's major bits.
      Roles, barriers, the double-buffered TMEM accumulator and the epilogue are v7's.
    Training options (sm_90a's; off; A, B K-major; BIAS False or dtype, an int32 view):
      ACT_GRAD (gelu, gelu_tanh, silu, swiglu): D = DY * act'(z), operands A, B, D, DY,
      bias; ACT_SAVE (relu, gelu, gelu_tanh, silu): D = act(z), Z = z; z = A @ B.T + bias.
      Each epilogue thread reads its accumulator row from TMEM as fp32, adds the bias, frees
      the accumulator, then forms dy * act'(z) (or z, act(z)) in fp32 registers, rounds once
      and TMA-stores as v7 (blackwell/act_grad.py). ACT_GRAD_DBIAS (with BIAS): + DBP, the
      16-row column sums of the staged dz, one thread per column.
    Why: a Linear layer's backward GEMMs read the weight (dgrad) and the tokens and output
      gradient (wgrad) transposed; the sm_90a twin (hgemm_v15 there) is the one matmul's
      autograd runs, this one is its NumSim-checked Blackwell form.
    Barriers: v7's tma2mma, mma2tma, mma2ld, ld2mma, unchanged.
    Constraints: v7's, except: M a multiple of 8 when A_MAJOR="MN"; K a multiple of 8 only
      while an operand is K-major (any K when both are MN-major); dtype float16 or bfloat16.
    Run: ``tirx-gemm sim v15`` (NumSim, racecheck, synccheck); executing needs an sm_100a GPU.
    """
    BLK_M, BLK_N, BLK_K = 128, 128, 64
    ACC_STAGES = 2  # 2 x 128 fp32 columns of the 512 in TMEM
    PRODUCER_REGS, EPILOGUE_REGS = 56, 224
    K_TILES = H.ceil_div(K, BLK_K)  # the last K tile is zero-filled past K
    A_MN, B_MN = W.check_major("A_MAJOR", A_MAJOR), W.check_major("B_MAJOR", B_MAJOR)
    AG.check_training(ACT_GRAD, ACT_SAVE, BIAS, ACT_GRAD_DBIAS, dtype, N, A_MN, B_MN)
    W.check_layout_shape(M, N, K, dtype, A_MN, B_MN)  # K any when both are MN-major
    H.check_pipe_depth(PIPE_DEPTH, (BLK_M + BLK_N) * BLK_K * H.ELEM_BYTES,
                       BLK_M * BLK_N * H.ELEM_BYTES)
    H.check_positive_ints(SM_COUNT=SM_COUNT)

    A_SMEM = W.smem_shape(PIPE_DEPTH, BLK_M, BLK_K, A_MN)
    B_SMEM = W.smem_shape(PIPE_DEPTH, BLK_N, BLK_K, B_MN)
    A_layout = H.swizzled_layout(A_SMEM, dtype)
    B_layout = H.swizzled_layout(B_SMEM, dtype)
    D_layout = H.swizzled_layout((BLK_M, BLK_N), dtype)
    TRAINING = ACT_GRAD is not None or ACT_SAVE is not None
    HAS_BIAS = bool(BIAS)
    # D's columns per dy word: 2 (two dy values), 4 for SwiGLU (dy has one value per pair)
    DY_PER_WORD = 4 if ACT_GRAD == AG.SWIGLU_GRAD else 2

    @T.prim_func
    def kernel(A: T.Buffer((K, M) if A_MN else (M, K), dtype),
               B: T.Buffer((K, N) if B_MN else (N, K), dtype),
               D: T.Buffer((M, N), dtype), DY: T.Buffer((M, N // DY_PER_WORD), "int32"),
               Z: T.Buffer((M, N), dtype), bias: T.Buffer((N // 2,), "int32"),
               DBP: T.Buffer((H.ceil_div(M, AG.DBIAS_ROWS), N), H.ACC_DTYPE)):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        # two full/empty rings and their arrival counts: the SMEM stages (tma2mma: 1
        # expect_tx + the bytes; mma2tma: 1 commit) and the TMEM accumulators (mma2ld: 1
        # commit; ld2mma: 128, every epilogue thread)
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", 1)
        accs = H.Ring(pool, ACC_STAGES, "mma2ld", 1, "ld2mma", 128)
        tma2mma = stages.full
        mma2tma = stages.empty
        mma2ld = accs.full
        ld2mma = accs.empty
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc(A_SMEM, dtype, layout=A_layout)
        Bsmem = pool.alloc(B_SMEM, dtype, layout=B_layout)
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

        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=H.ceil_div(M, BLK_M), num_n_tiles=H.ceil_div(N, BLK_N),
            num_clusters=SM_COUNT, l2_group_size=8)
        scheduler.init(bx)

        with WarpgroupRole(wg_id, 1, regs=PRODUCER_REGS, increase=False):
            if warp_id == 3:
                # --- load (producer): keep the ring full, PIPE_DEPTH slices ahead ---
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var(scheduler.m_idx * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                        if T.cuda.elect_sync():
                            # each operand in its major order (blackwell/layouts.py)
                            W.expect_stage_bytes(tma2mma.ptr(ring.stage), BLK_M, BLK_N, BLK_K)
                            W.tma_load_operand(Asmem, ring.stage, A, m_st, k * BLK_K, BLK_M,
                                               BLK_K, A_MN, tma2mma.ptr(ring.stage))
                            W.tma_load_operand(Bsmem, ring.stage, B, n_st, k * BLK_K, BLK_N,
                                               BLK_K, B_MN, tma2mma.ptr(ring.stage))
                        ring.advance()
                    scheduler.next_tile()
            elif warp_id == 0:
                # --- compute (MMA issuer): one elected lane issues, commits free stages ---
                ring = PipelineState(PIPE_DEPTH, 0)
                acc = PipelineState(ACC_STAGES, 1)
                while scheduler.valid():
                    # the epilogue must have drained this accumulator (tile i - 2)
                    ld2mma.wait(acc.stage, acc.phase, "MMA issuer")
                    W.tcgen05_fence_after_sync()
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        tma2mma.wait(ring.stage, ring.phase, "MMA issuer")
                        W.tcgen05_fence_after_sync()
                        if T.cuda.elect_sync():
                            W.mma_tile_major(tmem, acc.stage * BLK_N, Asmem[ring.stage, :, :],
                                             Bsmem[ring.stage, :, :], BLK_N, k != 0, A_MN, B_MN)
                            # stage is free once these MMAs have read it
                            W.mma_commit(mma2tma.ptr(ring.stage))
                        ring.advance()
                    if T.cuda.elect_sync():
                        # the accumulator is final once every MMA of the tile completed
                        W.mma_commit(mma2ld.ptr(acc.stage))
                    acc.advance()
                    scheduler.next_tile()

        with WarpgroupRole(wg_id, 0, regs=EPILOGUE_REGS, increase=True):
            # --- writeback (epilogue): TMEM -> registers, free TMEM, then TMA store ---
            acc = PipelineState(ACC_STAGES, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            while scheduler.valid():
                m_st = T.meta_var(scheduler.m_idx * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * BLK_N)
                mma2ld.wait(acc.stage, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                Dreg_out = T.alloc_local((BLK_N,), dtype)
                if TRAINING:
                    # this thread's row: z = acc + bias in fp32 registers (act_grad.py)
                    z = T.alloc_local((BLK_N,), H.ACC_DTYPE)
                    AG.pre_activation_row(tmem, acc.stage * BLK_N, BLK_N, z, bias, HAS_BIAS,
                                          dtype, n_st, N)
                else:
                    W.tmem_to_registers(tmem, acc.stage * BLK_N, BLK_N, Dreg_out)
                W.tcgen05_fence_before_sync()
                ld2mma.arrive(acc.stage)
                if ACT_GRAD == AG.SWIGLU_GRAD:  # d gate, d up of the fused product
                    AG.swiglu_grad_row(z, BLK_N, Dreg_out, DY, dtype, m_st + tid_in_wg, n_st,
                                       M, N)
                elif ACT_GRAD is not None:  # D = dy * act'(z)
                    AG.act_grad_row(z, BLK_N, Dreg_out, DY, ACT_GRAD, dtype,
                                    m_st + tid_in_wg, n_st, M, N)
                if ACT_SAVE is not None:  # Z = z stored first, then D = act(z)
                    Tx.cast(Dreg_out[:], z[:])
                    W.store_tile_via_tma(Dreg_out, Dsmem, Z, m_st, n_st, BLK_M, BLK_N,
                                         tid_in_wg, 1)
                    AG.act_row(z, BLK_N, Dreg_out, ACT_SAVE, dtype)
                if ACT_GRAD_DBIAS:  # and each 16 rows' column sums of dz, as staged
                    AG.store_tile_and_column_sums(Dreg_out, Dsmem, D, DBP, m_st, n_st, BLK_M,
                                                  BLK_N, M, N, tid_in_wg, 1)
                else:
                    W.store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st, BLK_M, BLK_N,
                                         tid_in_wg, 1)
                acc.advance()
                scheduler.next_tile()

        # --- free: only warp 0 of warpgroup 0 allocated, so only it deallocates ---
        W.tcgen05_cta_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free(tmem_addr)

    # operands: A, B, D, then DY (ACT_GRAD) or Z (ACT_SAVE), bias (BIAS), DBP (ACT_GRAD_DBIAS):
    # sm_90a's order
    for name, used in (("DY", ACT_GRAD is not None), ("Z", ACT_SAVE is not None),
                       ("bias", HAS_BIAS), ("DBP", ACT_GRAD_DBIAS)):
        if not used:
            kernel = W.without_operand(kernel, name)
    return kernel
