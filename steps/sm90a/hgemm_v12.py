"""Step 12 (sm_90a): one tile cannot serve every shape -- a tile menu in one builder.

Lesson: the tile is a parameter. BLK_M in {64, 128} and BLK_N any multiple of 16 up to
256 come out of the same kernel; wave efficiency (how many of the SMs get a tile) and the
bytes each tile moves per flop decide which one a shape should get.
"""
import tvm
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import epilogue as E
from tirx_gemm import helpers as H
from tirx_gemm import hopper as W

BLK_MS = (64, 128)            # one or two consumer warpgroups of 64 rows
BLK_N_STEP, BLK_N_MAX = 16, 256
# the default ring: as many stages as fit, at most this many. A decode tile's stage holds
# little of B (64x16: 2 KB of its 10 KB; A's rows past M are zero-filled), so it takes many
# stages to keep enough HBM reads in flight (cuBLAS runs 64x16 tiles with 16 stages)
AUTO_DEPTH_MAX = 16


def hgemm_v12(M: int, N: int, K: int, dtype: str = "float16", BLK_M: int = 128,
              BLK_N: int = 128, PIPE_DEPTH: int | None = None, SM_COUNT: int = 132,
              RUNTIME_M: bool = False, RUNTIME_NK: bool = False, L2_GROUP: int = 8,
              PRODUCER_REGS: int = 40, CONSUMER_REGS: int = 232, BIAS=False, ACT=None,
              OUT_DTYPE=None, SWIGLU: bool = False):
    """Step card -- v12, a tile menu.

    Changes from v9/v10: no cluster; the CTA tile BLK_M x BLK_N is a tunable: BLK_M 64 (one
      consumer warpgroup) or 128 (two), BLK_N any multiple of 16 in [16, 256] (one
      m64nBLK_Nk16 wgmma per consumer and k16; BLK_N/2 fp32 accumulators per thread). One
      producer thread TMA-loads the CTA's own A and B tiles into a full/empty ring of
      PIPE_DEPTH stages (default: as many as fit, at most 16; a 64x16 stage is 10 KB, and
      decode shapes need many loads in flight). v9's overlapped epilogue stays (pack, then
      stmatrix + TMA store per 64-column chunk under the next tile's first wgmmas); the
      last BLK_N % 64 columns go from the packed registers to D by guarded 4-byte stores.
      Persistent: min(tiles, SM_COUNT) CTAs walk the tiles in v9's L2-grouped order, so
      the ring and the overlapped epilogue run on across tiles (a decode shape gives each
      CTA ~7 small tiles; a grid of one CTA per tile would refill the ring for each).
      RUNTIME_M=True: M is a run-time variable (A, D and the tile count take it from A's
      shape at each call): one compiled kernel serves every M >= 1. RUNTIME_NK=True does
      the same for N and K. Either launches SM_COUNT CTAs; those without a tile exit.
    Why: v9's 256x256 cluster tile gives 1024^3 16 clusters, 32 of 132 SMs busy (24%);
      128x64 tiles give 128 tiles, 128 SMs (97%). A decode shape 16x14336x4096 has one
      row of tiles: 64x16 gives 896 tiles (6.8 per SM, 7 waves: 97%), 128x256 gives 56
      (42%), and rows 16..127 of each are zero-filled work. Smaller tiles cost bytes:
      per K step a tile loads (BLK_M + BLK_N) x 64 elements for BLK_M x BLK_N x 64 MACs,
      2 x (1/BLK_M + 1/BLK_N) bytes per MAC: 128x256 0.023, 128x64 0.047, 64x16 0.156.
      Large shapes want the big tile (tensor-core bound), small and decode shapes the
      tile that fills the SMs (decode is HBM-bound on B anyway: B is read once).
    Contracts/Barriers: tma2mma counts 1 (the producer's expect_tx), mma2tma counts
      BLK_M // 64 (one arrival per consumer warpgroup); see the comments at the inits.
    Constraints: any M >= 1; N, K multiples of 8 (also at run time; SWIGLU: N is D's
      columns, B has 2N rows); dtype float16 or bfloat16; BLK_M 64 or 128; BLK_N a multiple of 16 in [16, 256]; 2 <= PIPE_DEPTH,
      stages plus staging within 227 KB; SM_COUNT, L2_GROUP >= 1; PRODUCER_REGS /
      CONSUMER_REGS as v9's (setmaxnreg only for BLK_M=128 with BLK_N > 128).
    Epilogue (issue 28; keywords, references, tolerances: tirx_gemm/epilogue.py): BIAS
      (False | "float16" | "bfloat16" | "float32"), ACT (None | "relu" | "gelu" |
      "gelu_tanh" | "silu"), OUT_DTYPE (None | "float32"), SWIGLU (False | True). Operand
      order A, B, D, bias (bias only with BIAS: shape (N,)). Where the tile is when each
      operation runs: in the consumer warpgroups' registers, as the fp32 wgmma accumulators
      (acc[4j+2h+e] holds row 16w + l//4 + 8h, column 8j + 2(l%4) + e of the 64-row half),
      right after the tile's last wgmma_wait and before anything is packed or stored: bias
      (each thread loads the BLK_N/4 bias values of its columns once, shared by its two
      rows; columns past N read 0; the loads are issued before that last wait and fenced
      there, so all of them are in flight under the last wgmmas: before, ptxas spread them
      through the math after the wait), then the activation (one device function per value), then the usual
      cast and stores. Both store paths see the finished values: the stmatrix + TMA-store
      chunks and the guarded register tail. No shared memory, no shuffles, no extra
      barrier. Cost: the math sits between the tile's last wgmma and the next tile's first
      (the accumulators are needed back), while the producer keeps loading. SASS per
      accumulator value (128x256 bf16, bias bf16; scripts/lab/epilogue_sass.py): bias 1
      FADD + 1/2 LDG.U16; relu + 1 FMNMX; silu 2 FADD, 2 FMUL, MUFU.EX2, MUFU.RCP; gelu
      (erff) 5 FADD, 7 FFMA, 4 FMUL, 9 FSEL, FSETP, LOP3, MUFU.EX2 (~28 instructions: erff
      picks the coefficients of its two polynomial pieces with FSELs); gelu_tanh 2 FADD,
      FFMA, 6 FMUL, 2 MUFU. 128 values x 8 warps of that per tile run while the tensor
      cores wait, which is why gelu costs the most and shrinks with K (a longer mainloop
      per tile). A cheaper erf (a one-piece fit, ~1e-7 absolute) would pass the compare but
      not epilogue.py's 16-ulp derivation of f's error, so erff stays; hiding the epilogue
      under the other warpgroup's mainloop (v10's ping-pong) did not beat v12 for gelu
      (v10's card). Measured on the H200 (NVIDIA H200, call 2, bf16, bias bf16, median ms;
      results/lab/epilogue_h200_call2.jsonl, 37/37 checks correct; plain: v12, same tile,
      no epilogue, for SwiGLU the 2N-column GEMM; torch: F.linear + activation, for SwiGLU
      two F.linear, silu, mul; torch.compile is in the records):
        | shape           | epilogue  | fused | plain | torch | fused/plain | fused/torch |
        | 4096x14336x4096 | bias+gelu | 0.705 | 0.609 | 0.689 | 1.16        | 1.02        |
        | 1000x14336x4096 | bias+gelu | 0.189 | 0.163 | 0.173 | 1.16        | 1.09        |
        | 8192^3          | bias+gelu | 1.482 | 1.482 | 1.466 | 1.00        | 1.01        |
        | 4096x14336x4096 | swiglu    | 1.218 | 1.353 | 1.457 | 0.90        | 0.84        |
        | 1000x14336x4096 | swiglu    | 0.302 | 0.304 | 0.341 | 0.99        | 0.89        |
      gelu's cost is the math above, run after the mainloop while the tensor cores wait;
      8192^3's 1.00 is within drift (its plain ran 1.368 in call 1; fused/plain was 1.06).
      Issuing the bias loads before the last wait (call 2) left gelu's cost as call 1 had
      it (1.16 / 1.14 at the MLP shapes). SwiGLU beats its plain GEMM by writing half of D.
      SWIGLU: B is the fused gate/up weight (2N rows, groups of 8: gate 0-7, up 0-7, gate
      8-15, ...; tirx_gemm.matmul.fuse_gate_up). Eight rows of B are one 8-column block j of
      the accumulator, so block 2t holds gate and block 2t+1 up values of the same 8
      outputs, at the same places in the same thread: acc[4t+2h+e] <- silu(acc[8t+2h+e]) *
      acc[8t+4+2h+e], in place. A tile of BLK_N accumulator columns yields BLK_N/2 output
      columns already in the register layout of a BLK_N/2-wide accumulator, so packing,
      stmatrix and the TMA store run unchanged at width BLK_N/2 (the tiles walk B's 2N rows;
      D's tile column is n_idx * BLK_N/2). Groups of 8 are the smallest that pair in
      registers; any BLK_N (a multiple of 16) holds whole pairs. Measured on the H200:
      the table above.
      OUT_DTYPE "float32": the register path, not a TMA store of fp32 tiles: a 64 x 64 fp32
      staging tile is 16 KB per chunk (twice the 16-bit one) and the packed copy that lets
      v9's epilogue overlap the next tile would be as large as the accumulators (BLK_N/2
      more registers: 256 at 128x256, over the 232 of a consumer). Each thread stores its
      fp32 pairs with guarded 8-byte stores (a quad of lanes fills a 32-byte sector); a
      store reads its registers at issue, so the accumulators are free at once and the
      writes drain while the next tile runs. No staging tile is allocated. On the H200
      (call 2): correct at 1024^3 and 777x1000x2056 (fp16, bf16); its speed is not timed.
      gelu is erf's (erff, 2 ulp); the build's --use_fast_math turns tanhf into
      tanh.approx.f32 (2**-11 relative error, as large as fp16's rounding), so gelu_tanh is
      computed as x / (1 + exp(-2y)) (exactly 0.5x(1 + tanh(y))) with __expf; silu as
      x / (1 + exp(-x)). With no epilogue keyword the generated CUDA is that of the plain
      kernel (checked by diffing the CUDA source).
    Run: ``tirx-gemm run v12 --arch sm_90a --mnk 1024,1024,1024``.
    """
    BLK_K = W.SWIZZLE_ROW_ELEMS          # 64: one 128-byte swizzle row of K per stage
    H.check_edge_shape(M, N, K, dtype)
    epi = E.validate({"BIAS": BIAS, "ACT": ACT, "OUT_DTYPE": OUT_DTYPE, "SWIGLU": SWIGLU})
    if epi["SWIGLU"]:
        E.check_swiglu_n(N)
    OUT_F32 = epi["OUT_DTYPE"] == "float32"  # fp32 D: stored from the registers
    D_DTYPE = epi["OUT_DTYPE"] or dtype
    HAS_EPI = not E.is_plain(epi)
    SWIGLU_ON = epi["SWIGLU"]
    BIAS_ACT = bool(epi["BIAS"]) or epi["ACT"] is not None
    HAS_BIAS = bool(epi["BIAS"])  # a Python bool: the kernel body branches on it
    if isinstance(BLK_M, bool) or not isinstance(BLK_M, int) or BLK_M not in BLK_MS:
        raise ValueError(f"BLK_M={BLK_M!r} must be 64 or 128 (one or two consumer "
                         f"warpgroups of 64 rows)")
    if isinstance(BLK_N, bool) or not isinstance(BLK_N, int) or BLK_N % BLK_N_STEP \
            or not BLK_N_STEP <= BLK_N <= BLK_N_MAX:
        raise ValueError(f"BLK_N={BLK_N!r} must be a multiple of {BLK_N_STEP} in "
                         f"[{BLK_N_STEP}, {BLK_N_MAX}] (wgmma m64nNk16: N <= 256)")
    for name, flag in (("RUNTIME_M", RUNTIME_M), ("RUNTIME_NK", RUNTIME_NK)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r} must be True or False")
    H.check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)
    NUM_CONSUMERS = BLK_M // W.WGMMA_M    # consumer warpgroups, 64 rows each
    PRODUCER = NUM_CONSUMERS              # the producer is the last warpgroup
    ACC_REGS = BLK_N // 2                 # fp32 accumulators per consumer thread
    # SwiGLU: a tile of BLK_N columns of the fused gate/up weight gives BLK_N/2 outputs
    OUT_N = BLK_N // 2 if epi["SWIGLU"] else BLK_N
    PACKED_REGS = OUT_N // 4              # 2 x 16-bit registers of a packed tile
    # full 64-column chunks: stmatrix + TMA store (none for an fp32 D: register stores)
    TMA_CHUNKS = 0 if OUT_F32 else OUT_N // W.EPI_COLS
    TAIL_J = 0 if OUT_F32 else (OUT_N % W.EPI_COLS) // 8  # 8-column blocks left: guarded
    # a staging tile is reused every EPI_BUFS chunks, also across tiles: EPI_BUFS divides
    EPI_BUFS = 2 if TMA_CHUNKS % 2 == 0 else 1
    STAGING = NUM_CONSUMERS * EPI_BUFS * W.tile_bytes(W.WGMMA_M, W.EPI_COLS) \
        if TMA_CHUNKS else 0          # 8 KB per staging tile, none for a narrow tile
    A_STAGE_BYTES = W.tile_bytes(BLK_M, BLK_K)
    B_STAGE_BYTES = W.tile_bytes(BLK_N, BLK_K)
    STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES
    if PIPE_DEPTH is None:
        # barriers and alignment take < 1 KB; check_pipe_depth keeps 1 KB for them
        PIPE_DEPTH = min(AUTO_DEPTH_MAX,
                         (H.SMEM_BYTES_MAX - 1024 - STAGING) // STAGE_BYTES)
    W.check_ring_for_wait_one(PIPE_DEPTH)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, STAGING)
    # the cap is 168 registers at 384 threads; a consumer of a tile wider than 128 columns
    # holds over 96 accumulator and packed values, so setmaxnreg moves the producer's
    # spare registers to the consumers. Narrower tiles need no split (and ptxas then
    # sizes the kernel below the cap at entry, too little for a 40/232 split)
    SPLIT_REGS = NUM_CONSUMERS > 1 and BLK_N > 128
    if SPLIT_REGS:
        W.check_reg_split(PRODUCER_REGS, CONSUMER_REGS, NUM_CONSUMERS)
    # RUNTIME_M / RUNTIME_NK: the sizes (and the tile and K-step counts) are read from the
    # operands at each call (TVM's host code binds them and makes the TMA maps); nothing
    # else in the kernel depends on them
    M_DIM = tvm.tirx.Var("M", "int32") if RUNTIME_M else M
    N_DIM = tvm.tirx.Var("N", "int32") if RUNTIME_NK else N
    # SwiGLU: B has the fused weight's 2N rows (the tiles walk them), D and bias N columns
    if epi["SWIGLU"]:
        NB_DIM = tvm.tirx.Var("N2", "int32") if RUNTIME_NK else E.fused_rows(N)
        N_DIM = NB_DIM // 2
    else:
        NB_DIM = N_DIM
    K_DIM = tvm.tirx.Var("K", "int32") if RUNTIME_NK else K
    M_TILES = (M_DIM + BLK_M - 1) // BLK_M
    N_TILES = (NB_DIM + BLK_N - 1) // BLK_N
    K_TILES = (K_DIM + BLK_K - 1) // BLK_K  # the last K tile is zero-filled past K
    # the previous tile's epilogue runs once this many + 1 K steps of wgmmas are queued
    EPI_AT = T.min(1, K_TILES - 1) if RUNTIME_NK else min(1, K_TILES - 1)
    NUM_CTAS = SM_COUNT if RUNTIME_M or RUNTIME_NK else min(SM_COUNT, M_TILES * N_TILES)

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS), dtype)

    # the kernel body; bias is None without BIAS (no bias operand)
    @T.inline
    def gemm(A, B, D, bias):
        T.device_entry()
        bx = T.cta_id([NUM_CTAS])
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # consumers first, producer last
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tma2mma = H.Barriers(pool, PIPE_DEPTH, "tma2mma")
        mma2tma = H.Barriers(pool, PIPE_DEPTH, "mma2tma")
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        if TMA_CHUNKS > 0:
            Dstage = T.meta_var(pool.alloc((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS),
                                           dtype, layout=D_layout))
        pool.commit()

        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        # tma2mma[s]: the producer thread arrives once per load into stage s
        #   (arrive.expect_tx for the whole (BLK_M + BLK_N) x 64 box pair, zero-filled edges
        #   included) and the TMA unit completes the bytes; every consumer thread waits.
        #   Initial phase 0; consumers wait from phase 0.
        # mma2tma[s]: thread 0 of each consumer warpgroup arrives (NUM_CONSUMERS arrivals)
        #   once its wgmmas have finished reading stage s; the producer waits before
        #   reloading it. Initial phase 0; the producer waits from phase 1, which a fresh
        #   barrier counts as complete: every stage starts empty.
        if wg_id == PRODUCER:
            if tid_in_wg == 0:
                tma2mma.init(1)
                mma2tma.init(NUM_CONSUMERS)
        W.publish_setup()

        # every role walks the same tile sequence with its own copy of the scheduler state
        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=M_TILES, num_n_tiles=N_TILES, num_clusters=NUM_CTAS,
            l2_group_size=L2_GROUP)
        scheduler.init(bx)

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS if SPLIT_REGS else None,
                           increase=False):
            # --- load (producer): one thread, PIPE_DEPTH slices ahead, across tiles ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var(scheduler.m_idx * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        H.tma_load_tiles(Asmem[ring.stage, :, :], Bsmem[ring.stage, :, :],
                                         A, B, m_st, n_st, k * BLK_K, BLK_M, BLK_N, BLK_K,
                                         tma2mma.ptr(ring.stage))
                        ring.advance()
                    scheduler.next_tile()

        # (a comparison, not the (start, stop) form, which 0.27.0.post1 cannot lower)
        with WarpgroupRole(wg_id < NUM_CONSUMERS, True,
                           regs=CONSUMER_REGS if SPLIT_REGS else None, increase=True):
            consumer = T.meta_var(wg_id)  # owns rows [64*consumer, 64*consumer + 64)
            row0 = T.meta_var(consumer * W.WGMMA_M)
            acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers
            packed = T.alloc_local((PACKED_REGS,), "uint32")  # the previous tile, 2 x 16-bit
            if HAS_BIAS:  # this tile's bias values, fp32: 2 per 8-column block
                bvals = T.meta_var(T.alloc_local((BLK_N // 4,), H.ACC_DTYPE))
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            W.encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))
            W.encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0      # stage of the slice whose wgmmas may still be running
            pending: T.int32 = 0   # 1 while `packed` holds a tile not yet stored
            prev_m: T.int32 = 0    # where that tile goes
            prev_n: T.int32 = 0
            while scheduler.valid():
                m_st = T.meta_var(scheduler.m_idx * BLK_M)
                n_st = T.meta_var(scheduler.n_idx * OUT_N)  # D's columns of this tile
                for k in T.serial(K_TILES, annotations=H.ROLLED):
                    tma2mma.wait(ring.stage, ring.phase, "consumer")

                    # --- compute: 4 k16 slices of m64nBLK_Nk16; k=0 overwrites (scale-d 0) ---
                    W.mma_fence()
                    W.wgmma_tile(acc,
                                 W.desc_advance(desc_a[0], ring.stage * A_STAGE_BYTES)
                                 + T.Cast("uint64", consumer * W.DESC_M64_STEP),
                                 W.desc_advance(desc_b[0], ring.stage * B_STAGE_BYTES),
                                 k > 0, 1, BLK_N, dtype)
                    W.mma_commit()
                    if k == EPI_AT:
                        if pending == 1:
                            # --- writeback of the previous tile, behind the queued wgmmas
                            # (they write acc; the epilogue reads only `packed`) ---
                            if TMA_CHUNKS > 0:
                                W.store_packed_tile(D, Dstage, consumer, packed,
                                                    prev_m + row0, prev_n,
                                                    TMA_CHUNKS * W.EPI_COLS, EPI_BUFS,
                                                    warp_id, lane_id, tid_in_wg,
                                                    1 + consumer)
                            if TAIL_J > 0:
                                W.store_packed_guarded(D, packed, prev_m + row0, prev_n,
                                                       TMA_CHUNKS * 8, OUT_N // 8, M_DIM, N_DIM,
                                                       warp_id, lane_id)
                            pending = 0
                    # slice k-1 is done: its stage goes back to the producer
                    W.mma_wait(1)
                    if k > 0:
                        if tid_in_wg == 0:
                            mma2tma.arrive(held)
                    held = ring.stage
                    ring.advance()
                if HAS_BIAS:
                    # the bias loads go out before the last wait, in flight under the last
                    # wgmmas (when they followed it, ptxas spread them through the math
                    # after the wait); the fence (an asm reading and writing each value)
                    # keeps them on this side of it
                    W.load_bias_fragment(bvals, BLK_N, bias, n_st, N_DIM, lane_id)
                    W.fence_operands(bvals, BLK_N // 4)
                W.mma_wait(0)  # the tile's last slice is done too
                if tid_in_wg == 0:
                    mma2tma.arrive(held)
                W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the wait
                if HAS_EPI:
                    # --- the fused epilogue, on the fp32 accumulators, before the cast ---
                    if SWIGLU_ON:
                        W.epilogue_swiglu(acc, BLK_N)
                    if BIAS_ACT:
                        W.epilogue_bias_act(acc, BLK_N, bvals if HAS_BIAS else None,
                                            epi["ACT"])
                if OUT_F32:
                    # fp32 D: stored straight from the registers (read at issue)
                    W.store_fragment_f32_guarded(D, acc, m_st + row0, n_st, OUT_N, M_DIM,
                                                 N_DIM, warp_id, lane_id)
                else:
                    # free the accumulators for the next tile's wgmmas: fp32 -> 2 x dtype
                    W.pack_fragment(packed, acc, PACKED_REGS, dtype)
                    pending = 1
                    prev_m = m_st
                    prev_n = n_st
                scheduler.next_tile()

            # --- writeback of the last tile, then every store must have completed ---
            if pending == 1:
                if TMA_CHUNKS > 0:
                    W.store_packed_tile(D, Dstage, consumer, packed, prev_m + row0, prev_n,
                                        TMA_CHUNKS * W.EPI_COLS, EPI_BUFS, warp_id, lane_id,
                                        tid_in_wg, 1 + consumer)
                if TAIL_J > 0:
                    W.store_packed_guarded(D, packed, prev_m + row0, prev_n, TMA_CHUNKS * 8,
                                           OUT_N // 8, M_DIM, N_DIM, warp_id, lane_id)
            # --- free: SMEM is released at exit, so the last TMA store must have read it ---
            if tid_in_wg == 0:
                H.store_wait(0)

    if BIAS:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), dtype), B: T.Buffer((NB_DIM, K_DIM), dtype),
                   D: T.Buffer((M_DIM, N_DIM), D_DTYPE), bias: T.Buffer((N_DIM,), BIAS)):
            gemm(A, B, D, bias)
    elif HAS_EPI:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), dtype), B: T.Buffer((NB_DIM, K_DIM), dtype),
                   D: T.Buffer((M_DIM, N_DIM), D_DTYPE)):
            gemm(A, B, D, None)
    else:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), dtype), B: T.Buffer((N_DIM, K_DIM), dtype),
                   D: T.Buffer((M_DIM, N_DIM), dtype)):
            gemm(A, B, D, None)

    return kernel
