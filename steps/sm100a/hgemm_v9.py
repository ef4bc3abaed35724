"""Step 9 (sm_100a): multiple consumers -- two MMA warps share each staged B tile.

Lesson: in v8 each stage brings one A slice and one B slice per CTA, and each slice
feeds one 256x256 MMA. Here each stage brings two A slices (two groups of output rows)
and still one B slice; two MMA warps each issue a 256x256 MMA with the same B, into
their own half of TMEM, drained by their own epilogue warpgroup. B is loaded once for
twice the rows: a stage's bytes fall from 2x16 KiB per MMA to 1.5x16 KiB.
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import blackwell as W
from tirx_gemm import epilogue as E
from tirx_gemm import helpers as H


def hgemm_v9(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 4,
             SM_COUNT: int = 148, BIAS=False, ACT=None, OUT_DTYPE=None, SWIGLU=False,
             RUNTIME_M: bool = False):
    """Step card -- v9, multiple consumers (two MMA warps, two epilogue warpgroups).

    Changes from v8: scope: three warpgroups (384 threads) per CTA -- warpgroup 2: warp 3
      TMA producer (two A slices + one B slice per stage), warps 0 and 1 MMA consumers
      c = 0, 1 (CTA 0 issues, cta_group::2); warpgroup c: epilogue of consumer c.
      The cluster tile grows along M to 512x256: consumer c computes rows
      [m_base + 256c, m_base + 256c + 256) (128 from each CTA) against the SAME 256 B rows.
      Layout: Asmem gains a consumer axis, (PIPE_DEPTH, 2, 128, 64); consumer c accumulates
      into TMEM columns [256c, 256c + 256): all 512 are used, so v8's double-buffered
      accumulator is traded for a second consumer. Each epilogue stages its 128 rows through
      its own 128-row band of Dsmem in 64-column chunks (EPI_N). Dispatch: setmaxnreg lowers
      warpgroup 2 and raises both epilogue warpgroups.
    Barriers (PipelineState; CTA 0's copy where noted, as in v8):
      tma2mma[s] CTA 0's copy: expect_tx for both CTAs' bytes; BOTH MMA warps wait on it
                 from phase 0 (a stage is refilled only after both released it);
      mma2tma[s] count 2: each consumer's multicast commit arrives once in both CTAs; each
                 producer waits on its own copy from phase 1;
      mma2ld[c]  MMA warp c -> epilogue c, multicast commit after the tile's last MMA;
      ld2mma[c]  CTA 0's copy, count 256: epilogue c's 128 threads in BOTH CTAs arrive once
                 done with their columns; MMA warp c starts at phase 1.
      Named barriers: epilogue c syncs its 128 threads with bar.sync 1 + c.
    Why: B traffic per unit of tensor-core work halves again, and two issuers keep the
      tensor cores busy across tile boundaries (the lesson quotes the book's B200 figures).
    Edges as in v8 over ceil(M/512) x ceil(N/256) cluster tiles: a consumer or CTA whose
      rows lie past M still loads (zeros), computes, arrives and stores (dropped).
    Epilogue keywords BIAS, ACT, OUT_DTYPE, SWIGLU (tirx_gemm.epilogue) and RUNTIME_M: see
      the lesson; barriers, roles and MMA stay the plain kernel's (all off: the same PrimFunc).
    Constraints: any M >= 1; N, K multiples of 8; PIPE_DEPTH >= 1 within SMEM (48 KiB per
      stage); SM_COUNT even; dtype float16 (default) or bfloat16.
    Run: ``tirx-gemm build v9 --mnk 4096,4096,4096``; ``tirx-gemm sim v9`` (NumSim).
    """
    CTA_PAIR, NUM_CONSUMER = W.CTA_PAIR, 2
    BLK_M, BLK_N, BLK_K = 128, 128, 64  # per CTA and consumer
    MMA_N = CTA_PAIR * BLK_N  # 256: one consumer's MMA is 256 x 256
    TILE_M = NUM_CONSUMER * CTA_PAIR * BLK_M  # 512: the cluster tile is 512 x 256
    EPI_N = 64  # epilogue chunk width (columns per TMA store)
    PRODUCER_REGS, EPILOGUE_REGS = 56, 224  # 128 x 56 + 256 x 224 = 384 x 168
    K_TILES = H.ceil_div(K, BLK_K)  # the last K tile is zero-filled past K
    STAGE_BYTES = (NUM_CONSUMER * BLK_M + BLK_N) * BLK_K * H.ELEM_BYTES  # one CTA's share
    H.check_edge_shape(M, N, K, dtype)
    M = H.runtime_rows(M, RUNTIME_M)  # RUNTIME_M: one kernel for every M (A.shape[0])
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, NUM_CONSUMER * BLK_M * W.EPI_ROW_BYTES)
    W.check_even_sm_count(SM_COUNT)
    # the epilogue (card: "Epilogue"); all off: the plain kernel, unchanged
    EPI = E.validate(dict(BIAS=BIAS, ACT=ACT, OUT_DTYPE=OUT_DTYPE, SWIGLU=SWIGLU))
    PLAIN = E.is_plain(EPI)
    out_dtype = E.out_dtype(EPI, dtype)
    N_ACC = E.kernel_n(N, EPI)  # accumulator columns (B's rows): 2 * N with SWIGLU
    OUT_N, OUT_STEP, READS = W.epilogue_chunks(out_dtype, EPI["SWIGLU"])  # plain: 64, 64, 1
    OUT_TILE_N = MMA_N // 2 if EPI["SWIGLU"] else MMA_N  # output columns of a cluster tile
    ACC_STEP = READS * W.TMEM_READ_N  # accumulator columns per step
    fill_step = W.fused_epilogue_chunk(EPI["ACT"], EPI["BIAS"], EPI["SWIGLU"],
                                       E.SWIGLU_GROUP, READS, out_dtype)

    A_layout = H.swizzled_layout((PIPE_DEPTH, NUM_CONSUMER, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((NUM_CONSUMER * BLK_M, OUT_N), out_dtype)

    @T.prim_func
    def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N_ACC, K), dtype),
               D: T.Buffer((M, N), out_dtype), bias: T.Buffer((N,), EPI["BIAS"] or "float32")):
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
        Asmem = pool.alloc((PIPE_DEPTH, NUM_CONSUMER, BLK_M, BLK_K), dtype,
                           layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dsmem = pool.alloc((NUM_CONSUMER * BLK_M, OUT_N), out_dtype, layout=D_layout)
        pool.commit()

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
            "ts", num_m_tiles=H.ceil_div(M, TILE_M), num_n_tiles=H.ceil_div(N_ACC, MMA_N),
            num_clusters=SM_COUNT // CTA_PAIR, l2_group_size=8)
        scheduler.init(bx // CTA_PAIR)

        with WarpgroupRole(wg_id, 2, regs=PRODUCER_REGS, increase=False):
            if warp_id == 3:
                # --- load (producer, both CTAs): one A slice per consumer and ONE B slice
                # per stage, bytes counted on CTA 0's barrier ---
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
                    # --- compute (MMA consumer c = warp_id, CTA 0 only): its A slice and
                    # the shared B slice, into TMEM columns [256c, 256c + 256) ---
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
                                W.mma_tile_pair(tmem, c * MMA_N, Asmem[ring.stage, c, :, :],
                                                Bsmem[ring.stage, :, :], MMA_N, k != 0)
                                # one of the two releases stage s needs
                                W.mma_commit_pair(mma2tma.ptr(ring.stage))
                            ring.advance()
                        if T.cuda.elect_sync():
                            W.mma_commit_pair(mma2ld.ptr(c))
                        acc.advance()
                        scheduler.next_tile()

        with WarpgroupRole(wg_id < NUM_CONSUMER, True, regs=EPILOGUE_REGS, increase=True):
            # --- writeback (epilogue c = warpgroup id, both CTAs): this CTA's 128 rows of
            # consumer c, 256 columns in EPI_N-wide chunks, then free its TMEM columns ---
            c = T.meta_var(wg_id)
            acc = PipelineState(1, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            while scheduler.valid():
                m_st = T.meta_var(((scheduler.m_idx * NUM_CONSUMER + c) * CTA_PAIR + rank)
                                  * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * MMA_N)
                mma2ld.wait(c, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                if PLAIN:
                    for i in T.unroll(MMA_N // EPI_N):
                        Dreg_out = T.alloc_local((EPI_N,), dtype)
                        W.tmem_to_registers(tmem, c * MMA_N + i * EPI_N, EPI_N, Dreg_out)
                        W.store_rows_via_tma(Dreg_out, Dsmem, c * BLK_M, D, m_st,
                                             n_st + i * EPI_N, BLK_M, EPI_N, tid_in_wg, 1 + c)
                else:
                    # TMEM -> fp32 registers -> bias, activation or silu(gate) * up -> cast
                    # -> Dsmem -> TMA store: OUT_STEP output columns per step, stored in
                    # chunks of OUT_N
                    n_out = T.meta_var(scheduler.n_idx * OUT_TILE_N)
                    for i in T.unroll(OUT_TILE_N // OUT_STEP):
                        Dout = T.alloc_local((OUT_STEP,), out_dtype)
                        fill_step(tmem, c * MMA_N + i * ACC_STEP, Dout, bias,
                                  n_out + i * OUT_STEP, N)
                        for h in T.unroll(OUT_STEP // OUT_N):
                            W.store_rows_box_via_tma(Dout, h * OUT_N, Dsmem, c * BLK_M, D, m_st,
                                                     n_out + i * OUT_STEP + h * OUT_N, BLK_M,
                                                     OUT_N, tid_in_wg, 1 + c)
                W.tcgen05_fence_before_sync()
                ld2mma_cta0.arrive_remote(c)
                acc.advance()
                scheduler.next_tile()

        # --- free: the peer's MMA and arrivals touch this CTA until both are done ---
        W.tcgen05_cluster_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free_pair(tmem_addr)

    # operands: A, B, D, then bias only with BIAS (tirx_gemm.epilogue's order)
    return kernel if EPI["BIAS"] else W.without_operand(kernel, "bias")
