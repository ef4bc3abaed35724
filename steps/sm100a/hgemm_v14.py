"""Step 14 (sm_100a): grouped GEMM -- one launch multiplies every expert's rows by its weights.

Lesson: a mixture-of-experts layer is E small GEMMs of different M over stacked weights.
The persistent scheduler walks (expert, token tile, weight tile) units whose count it
computes on the device from the routing tensor, so the launch needs no host sync, fits in a
CUDA graph, replays with new routing, and an expert without tokens costs nothing.
"""

import tvm
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole

from tirx_gemm import blackwell as W
from tirx_gemm import helpers as H

BLK_N_STEP, BLK_N_MAX = 16, 256  # tcgen05.mma cta_group::1, M = 128: N % 16 == 0, <= 256
READ_MAX = 64  # accumulator columns per tcgen05.ld


BLK_M, BLK_K = 128, 64  # the weight (or token) tile's rows; K per stage (one 128-byte row)


def stage_bytes(BLK_N: int) -> int:
    """One ring stage: the 128-row and BLK_N-row tiles, BLK_K deep."""
    return (BLK_M + BLK_N) * BLK_K * H.ELEM_BYTES


def scan_bytes(E: int) -> int:
    """The shared memory of the experts' scan: its two rows and the experts' bounds."""
    return (2 + W.BOUND_ROWS) * E * 4


def default_pipe_depth(BLK_N: int = 128, E: int = 8) -> int:
    """The ring depth hgemm_v14 takes when PIPE_DEPTH is None: as many stages as fit the
    shared memory beside the experts' scan."""
    return H.ring_stages(stage_bytes(BLK_N), scan_bytes(E))


def hgemm_v14(M: int, N: int, K: int, dtype: str = "float16", E: int = 8,
              LAYOUT: str = "contiguous", BLK_N: int = 128, PIPE_DEPTH: int | None = None,
              SM_COUNT: int = 148, RUNTIME_M: bool = True, GROUP: int = 8,
              SWAP_AB: bool = False, SCALE: str | None = None, ROW_SCALE: bool = False,
              BIAS: bool = False, SWIGLU: str | None = None):
    """Step card -- v14, grouped GEMM (mixture of experts).

    Changes from v7: D_e = A_e @ B[e].T for every expert e in one launch (B (E, N, K),
      K-major). Every thread reads one expert's rows from the routing tensor (W.scan_experts),
      the CTA scans the token-tile counts into prefix sums in shared memory, and unit t = bx,
      bx + SM_COUNT, ... is found by binary search (W.tile_at): (expert, token tile, weight
      tile), GROUP token tiles per weight column; the TMA producer, the MMA issuer and the
      epilogue walk alike. B[e]'s tile: a 3-D TMA box. Each row is stored from the registers
      only below its expert's row end (W.store_row_bounded; v7's TMA store goes). From v12:
      BLK_N, the ring as deep as fits, the accumulators at TMEM columns 0 and 256, swap-AB.
    Base: v7 (v12 is a superset): its diff shows the walk with the least else around it.
    Layouts: "contiguous": A (M, K) rows sorted by expert, D (M, N), offs int32 (E,)
      cumulative row ends; "masked": A (E, M, K), D (E, M, N), counts int32 (E,). Rows no
      expert owns are not written; M at run time; routing clamped to [0, M] in the kernel.
    Decode (SWAP_AB=True): the MMA's 128 rows walk the expert's weight rows, its BLK_N
      columns (16..64) the expert's tokens; one thread per weight row stores D's column.
    Epilogue, sm_90a's keywords and operands (A, B, D, routing[, scale][, bias]), plain tiles:
      TMEM -> fp32 registers -> BIAS=True + bias (E, N), ROW_SCALE=True x scale (M,) float32
      (masked (E, M)), or SWIGLU="halves" | "interleaved" silu(gate) * up (D N/2 wide) -> one
      cast -> the bounded store (W.store_unit_epilogue). Not with SWAP_AB or SCALE="mx".
    Barriers (v7's, stage and phase by PipelineState):
      tma2mma[s] TMA -> MMA, expect_tx of (128 + BLK_N) x 64 x 2 bytes, MMA waits phase 0;
      mma2tma[s] MMA -> TMA, tcgen05.commit frees stage s, producer waits from phase 1;
      mma2ld[a]  MMA -> epilogue, tcgen05.commit after a unit's last MMA, phase 0;
      ld2mma[a]  epilogue -> MMA, 128 arrivals once every column was read; the MMA warp
                 waits from phase 1. The scan's CTA barriers run before the roles split.
    Constraints: N, K multiples of 8; float16 or bfloat16; 1 <= E <= 256; LAYOUT contiguous
      or masked; BLK_N a multiple of 16 in [16, 256]; GROUP >= 1; SWIGLU: N % 16 == 0.
    FP8: SCALE="mx" (hgemm_v14_mx): e4m3 A, B, v13's UE8M0 SFs SFA, SFB after routing (v13's
      keyword on this arch). Run: ``tirx-gemm build v14``; NumSim: tests/test_grouped_steps.py.
    """
    ACC_STAGES, ACC_COLS = 2, W.TMEM_COLS // 2  # accumulator a at TMEM column 256 * a
    if SCALE is not None:
        if SCALE != "mx":
            raise ValueError(f"SCALE={SCALE!r} must be None (16-bit operands) or 'mx' (MXFP8)")
        if SWAP_AB is not False or ROW_SCALE is not False or BIAS is not False \
                or SWIGLU is not None:
            raise ValueError("SCALE='mx' is built for plain tiles only: no SWAP_AB, ROW_SCALE, "
                             "BIAS or SWIGLU")
        return hgemm_v14_mx(M, N, K, dtype, E, LAYOUT, BLK_N, PIPE_DEPTH, SM_COUNT,
                            RUNTIME_M, GROUP)
    H.check_edge_shape(M, N, K, dtype)
    if isinstance(E, bool) or not isinstance(E, int) or not 1 <= E <= W.E_MAX:
        raise ValueError(f"E={E!r} must be an int in [1, {W.E_MAX}] (experts per launch: one "
                         f"scanning thread per expert)")
    if LAYOUT not in W.LAYOUTS:
        raise ValueError(f"LAYOUT={LAYOUT!r} must be one of {', '.join(W.LAYOUTS)}")
    if isinstance(BLK_N, bool) or not isinstance(BLK_N, int) or BLK_N % BLK_N_STEP \
            or not BLK_N_STEP <= BLK_N <= BLK_N_MAX:
        raise ValueError(f"BLK_N={BLK_N!r} must be a multiple of {BLK_N_STEP} in "
                         f"[{BLK_N_STEP}, {BLK_N_MAX}] (tcgen05.mma at M=128)")
    for name, flag in (("RUNTIME_M", RUNTIME_M), ("SWAP_AB", SWAP_AB), ("ROW_SCALE", ROW_SCALE),
                       ("BIAS", BIAS)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r} must be True or False")
    if SWIGLU not in (None, "halves", "interleaved"):
        raise ValueError(f"SWIGLU={SWIGLU!r} must be None, 'halves' or 'interleaved'")
    if SWIGLU and (SWAP_AB or ROW_SCALE or BIAS or N % 16):
        raise ValueError(f"SWIGLU={SWIGLU!r} pairs gate and up columns of a plain tile: no "
                         f"SWAP_AB, ROW_SCALE or BIAS; N={N} a multiple of 16")
    if SWAP_AB and (ROW_SCALE or BIAS):
        raise ValueError("ROW_SCALE and BIAS are built for plain tiles on sm_100a (one D row per "
                         "epilogue thread): no SWAP_AB")
    H.check_positive_ints(SM_COUNT=SM_COUNT, GROUP=GROUP)
    MASKED = LAYOUT == "masked"
    HALVES, EPILOGUE = SWIGLU == "halves", bool(ROW_SCALE or BIAS or SWIGLU)
    TOK, W_BLK = (BLK_N, BLK_M) if SWAP_AB else (BLK_M, BLK_N)  # D's rows, columns per unit
    if HALVES:  # a unit's weight tile: W_BLK/2 gate rows at at[3], as many up rows at +N/2
        W_BLK = W_BLK // 2
    READ_OF = BLK_N // 2 if HALVES else BLK_N  # accumulator columns read per ld chunk walk
    READ = min(READ_MAX, READ_OF & -READ_OF)  # 8 (halves), 16, 32 or 64 columns: divides it
    W_TILES = H.ceil_div(N // 2 if HALVES else N, W_BLK)
    N_D = N // 2 if SWIGLU else N  # D's columns
    STAGE_BYTES, SCAN_BYTES = stage_bytes(BLK_N), scan_bytes(E)
    if PIPE_DEPTH is None:
        PIPE_DEPTH = default_pipe_depth(BLK_N, E)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, SCAN_BYTES)
    K_TILES = H.ceil_div(K, BLK_K)
    M_DIM = tvm.tirx.Var("M", "int32") if RUNTIME_M else M
    A_SHAPE = (E, M_DIM, K) if MASKED else (M_DIM, K)
    D_SHAPE = (E, M_DIM, N_D) if MASKED else (M_DIM, N_D)
    S_SHAPE = (E, M_DIM) if MASKED else (M_DIM,)

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)

    @T.inline
    def body(A, B, D, routing, S, Bias):
        # the kernel; S (ROW_SCALE) and Bias (BIAS) are None where not asked for
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        # v7's two full/empty rings: the SMEM stages (tma2mma: 1 expect_tx + the bytes;
        # mma2tma: 1 commit) and the TMEM accumulators (mma2ld: 1 commit; ld2mma: 128)
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", 1)
        accs = H.Ring(pool, ACC_STAGES, "mma2ld", 1, "ld2mma", 128)
        tma2mma, mma2tma = stages.full, stages.empty
        mma2ld, ld2mma = accs.full, accs.empty
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        scan = pool.alloc((2, E), "int32")                  # token tiles, prefix sums
        bounds = pool.alloc((E, W.BOUND_ROWS), "int32")     # each expert's row start, end
        pool.commit()

        if wg_id == 0:
            if warp_id == 0:
                if lane_id == 0:
                    stages.init()
                    accs.init()
                W.tmem_alloc(tmem_addr)
        W.publish_setup()
        tmem = W.tmem_accumulator()

        # --- the walk's length, on the device: thread e reads expert e's rows ---
        tid = T.meta_var(wg_id * 128 + warp_id * 32 + lane_id)
        W.scan_experts(scan, bounds, routing, tid, E, TOK, M_DIM, MASKED)
        total = T.meta_var(scan[W.log2_ceil(E) % 2, E - 1] * W_TILES)
        at = T.alloc_local((4,), "int32")  # (expert, token row, expert's row end, weight row)

        with WarpgroupRole(wg_id, 1):
            if warp_id == 3:
                # --- load (producer): keep the ring full, PIPE_DEPTH slices ahead ---
                ring = PipelineState(PIPE_DEPTH, 1)
                t: T.int32 = bx
                while t < total:
                    W.tile_at(at, scan, bounds, t, E, TOK, W_TILES, W_BLK, GROUP)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                        if T.cuda.elect_sync():
                            if HALVES:  # gate rows at[3].., up rows N/2 + at[3].. (2 boxes)
                                W.tma_load_gate_up(Asmem, Bsmem, ring.stage, A, B, at,
                                                   k * BLK_K, tma2mma.ptr(ring.stage), BLK_M,
                                                   W_BLK, BLK_K, N // 2, MASKED)
                            else:
                                W.tma_load_unit(Asmem[ring.stage, :, :],
                                                Bsmem[ring.stage, :, :], A, B, at, k * BLK_K,
                                                tma2mma.ptr(ring.stage), BLK_M, BLK_N, BLK_K,
                                                SWAP_AB, MASKED)
                        ring.advance()
                    t = t + SM_COUNT
            elif warp_id == 0:
                # --- compute (MMA issuer): one elected lane issues, commits free stages ---
                ring = PipelineState(PIPE_DEPTH, 0)
                acc = PipelineState(ACC_STAGES, 1)
                t: T.int32 = bx
                while t < total:
                    # the epilogue must have drained this accumulator (unit i - 2)
                    ld2mma.wait(acc.stage, acc.phase, "MMA issuer")
                    W.tcgen05_fence_after_sync()
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        tma2mma.wait(ring.stage, ring.phase, "MMA issuer")
                        W.tcgen05_fence_after_sync()
                        if T.cuda.elect_sync():
                            W.mma_tile_at(tmem, acc.stage * ACC_COLS, Asmem[ring.stage, :, :],
                                          Bsmem[ring.stage, :, :], BLK_N, k != 0)
                            W.mma_commit(mma2tma.ptr(ring.stage))
                        ring.advance()
                    if T.cuda.elect_sync():
                        W.mma_commit(mma2ld.ptr(acc.stage))
                    acc.advance()
                    t = t + SM_COUNT

        with WarpgroupRole(wg_id, 0):
            # --- writeback (epilogue): each thread its accumulator row, bounded per expert ---
            acc = PipelineState(ACC_STAGES, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            t: T.int32 = bx
            while t < total:
                W.tile_at(at, scan, bounds, t, E, TOK, W_TILES, W_BLK, GROUP)
                mma2ld.wait(acc.stage, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                if EPILOGUE:  # TMEM -> fp32 registers -> bias, scale or SwiGLU -> cast -> D
                    W.store_unit_epilogue(tmem, acc.stage * ACC_COLS, D, at, tid_in_wg, S, Bias,
                                          BLK_N, READ, N_D, SWIGLU, MASKED)
                else:
                    # SWAP_AB: D's transpose, accumulator row tid_in_wg is D's column at[3] +
                    # tid_in_wg (a weight row), its columns D's rows at[1].. (tokens)
                    W.store_unit_bounded(tmem, acc.stage * ACC_COLS, D, at, tid_in_wg, dtype,
                                         BLK_N, READ, N, SWAP_AB, MASKED)
                # every tcgen05.ld of this accumulator has completed: hand it back
                W.tcgen05_fence_before_sync()
                ld2mma.arrive(acc.stage)
                acc.advance()
                t = t + SM_COUNT

        # --- free: only warp 0 of warpgroup 0 allocated, so only it deallocates ---
        W.tcgen05_cta_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free(tmem_addr)

    # operands (A, B, D, routing[, scale][, bias]): sm_90a's v14 order; one source, the
    # operands not asked for dropped (W.without_operand, as v9 and v15 do)
    @T.prim_func
    def kernel(A: T.Buffer(A_SHAPE, dtype), B: T.Buffer(W.weight_shape(E, N, K, 16), dtype),
               D: T.Buffer(D_SHAPE, dtype), routing: T.Buffer((E,), "int32"),
               scale: T.Buffer(S_SHAPE, "float32"), bias: T.Buffer((E, N), dtype)):
        body(A, B, D, routing, scale if ROW_SCALE else None, bias if BIAS else None)

    for name, used in (("scale", ROW_SCALE), ("bias", BIAS)):
        if not used:
            kernel = W.without_operand(kernel, name)
    return kernel


# --- SCALE="mx": the same walk over e4m3 operands with MXFP8 block scales ---------------
def hgemm_v14_mx(M, N, K, dtype, E, LAYOUT, BLK_N, PIPE_DEPTH, SM_COUNT, RUNTIME_M, GROUP):
    """v14 with SCALE="mx" (the step card's line): v14's scan, walk and bounded stores around
    v13's block-scaled MMA, on one CTA (tcgen05.mma.cta_group::1 kind::mxf8f6f4.block_scale,
    M = 128, N = BLK_N = 128, one UE8M0 SF per K = 32 MMA, applied by the tensor core).
    Operands (A, B, D, routing, SFA, SFB): A, B e4m3 as uint8; SFA the blocked SFs
      (numerics.mx_block_sf_np) of A's rows (M, K/32) (masked: (E, ..., 128), expert e's M
      rows), SFB (E, ..., 128) expert e's blocked (N, K/32); D = sum over k of A 2**(sfa - 127)
      B 2**(sfb - 127) in fp32, rounded once to ``dtype``.
    A stage is 128 of K (one 128-byte swizzle row of e4m3) plus its SFs: SFB's atom of the
      weight tile by TMA (a weight tile starts on a multiple of 128 rows), SFA's gathered by
      the producer warp once its elected lane issued that TMA (W.load_sfa_atom: a token tile
      starts at any row, its rows straddle two atoms; one 32-bit load a row; a proxy fence on
      each side of its writes), each lane arrives: tma2mma 1 + 32.
    TMEM: accumulators at columns 0 and 128, SF rings from 256 (4 + 4 columns a stage); the
      MMA warp copies a stage's SFs into TMEM (tcgen05.cp) before its 4 MMAs; the commit that
      frees the stage also frees its SF slot.
    Constraints: K a multiple of 32 (one SF per 32 of K, no partial block); N a multiple of 8;
      dtype float16 | bfloat16 (D); BLK_N 128; plain tiles (no SWAP_AB); v14's E, LAYOUT, GROUP.
    SFA must hold numerics.mx_block_sf_np's rows for every token row (masked: per expert): a row
      past SFA's end reads as scale 1 (e = 127), not as an error; the caller sizes it.
    """
    BLK_K = W.FP8_BLK_K
    dtype = H.check_fp8_contract(M, N, K, dtype)
    if K % W.MX_SF_VEC:
        raise ValueError(f"K={K} is not a multiple of {W.MX_SF_VEC}: SCALE='mx' has one scale "
                         f"factor per {W.MX_SF_VEC} elements of K")
    if isinstance(E, bool) or not isinstance(E, int) or not 1 <= E <= W.E_MAX:
        raise ValueError(f"E={E!r} must be an int in [1, {W.E_MAX}] (experts per launch: one "
                         f"scanning thread per expert)")
    if LAYOUT not in W.LAYOUTS:
        raise ValueError(f"LAYOUT={LAYOUT!r} must be one of {', '.join(W.LAYOUTS)}")
    if BLK_N != W.MX_SF_ROWS or isinstance(BLK_N, bool):
        raise ValueError(f"BLK_N={BLK_N!r} with SCALE='mx' must be {W.MX_SF_ROWS} (a weight "
                         f"tile is one scale-factor atom of 128 rows)")
    if not isinstance(RUNTIME_M, bool):
        raise ValueError(f"RUNTIME_M={RUNTIME_M!r} must be True or False")
    H.check_positive_ints(SM_COUNT=SM_COUNT, GROUP=GROUP)
    ACC_STAGES, ACC_COLS = 2, BLK_N  # accumulator a at TMEM column 128 * a
    MASKED = LAYOUT == "masked"
    READ = READ_MAX
    W_TILES = H.ceil_div(N, BLK_N)
    K_TILES = H.ceil_div(K, BLK_K)  # the last stage zero-filled past K (its SFs e = 127)
    SF_ROWS = W.MX_SF_BOX[0]  # 4 rows of 128 bytes: one 512-byte SF atom
    STAGE_BYTES = (BLK_M + BLK_N) * BLK_K + 2 * W.MX_SF_ATOM_BYTES
    SCAN_BYTES = scan_bytes(E)
    if PIPE_DEPTH is None:
        PIPE_DEPTH = H.ring_stages(STAGE_BYTES, SCAN_BYTES)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, SCAN_BYTES)
    SFA_COL = ACC_STAGES * ACC_COLS
    SFB_COL = SFA_COL + PIPE_DEPTH * W.mx_sf_cols(BLK_M)
    SF_SMEM_LAYOUT = W.mx_sf_layouts(PIPE_DEPTH, BLK_M)[0]
    M_DIM = tvm.tirx.Var("M", "int32") if RUNTIME_M else M
    A_SHAPE = (E, M_DIM, K) if MASKED else (M_DIM, K)
    D_SHAPE = (E, M_DIM, N) if MASKED else (M_DIM, N)
    SFA_ROWS = H.runtime_extent("SFA_ROWS") if RUNTIME_M else W.mx_sf_gmem_shape(M, K)[0]
    SFA_SHAPE = (E, SFA_ROWS, W.MX_SF_BOX[1]) if MASKED else (SFA_ROWS, W.MX_SF_BOX[1])
    SFB_SHAPE = (E,) + W.mx_sf_gmem_shape(N, K)

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), W.FP8_STORAGE)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), W.FP8_STORAGE)

    @T.prim_func
    def kernel(A: T.Buffer(A_SHAPE, W.FP8_STORAGE),
               B: T.Buffer(W.weight_shape(E, N, K, 8), W.FP8_STORAGE),
               D: T.Buffer(D_SHAPE, dtype), routing: T.Buffer((E,), "int32"),
               SFA: T.Buffer(SFA_SHAPE, W.MX_SF_STORAGE),
               SFB: T.Buffer(SFB_SHAPE, W.MX_SF_STORAGE)):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        wg_id = T.warpgroup_id([2])
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        tmem_addr = pool.alloc((1,), "uint32")
        # tma2mma: 1 expect_tx (A, B, SFB's atom) + 32 (each producer lane once its SFA
        # bytes are written and fenced); mma2tma: 1 commit; mma2ld: 1 commit; ld2mma: 128
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1 + 32, "mma2tma", 1)
        accs = H.Ring(pool, ACC_STAGES, "mma2ld", 1, "ld2mma", 128)
        tma2mma, mma2tma = stages.full, stages.empty
        mma2ld, ld2mma = accs.full, accs.empty
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), W.FP8_STORAGE, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), W.FP8_STORAGE, layout=B_layout)
        SFAsmem = pool.alloc((PIPE_DEPTH, SF_ROWS, 128), W.MX_SF_STORAGE)
        SFBsmem = pool.alloc((PIPE_DEPTH, SF_ROWS, 128), W.MX_SF_STORAGE)
        scan = pool.alloc((2, E), "int32")                  # token tiles, prefix sums
        bounds = pool.alloc((E, W.BOUND_ROWS), "int32")     # each expert's row start, end
        pool.commit()
        # the tensor core's views: e4m3 operands, e8m0 SF atoms (stage, row, SF of K)
        Asmem8 = Asmem.view(W.FP8_MMA_DTYPE)
        Bsmem8 = Bsmem.view(W.FP8_MMA_DTYPE)
        SFAview = SFAsmem.view(W.MX_SF_DTYPE).view(PIPE_DEPTH, BLK_M, W.MX_SF_K,
                                                   layout=SF_SMEM_LAYOUT)
        SFBview = SFBsmem.view(W.MX_SF_DTYPE).view(PIPE_DEPTH, BLK_N, W.MX_SF_K,
                                                   layout=SF_SMEM_LAYOUT)

        if wg_id == 0:
            if warp_id == 0:
                if lane_id == 0:
                    stages.init()
                    accs.init()
                W.tmem_alloc(tmem_addr)
        W.publish_setup()
        tmem = W.tmem_accumulator()
        sfa_t = W.mx_sf_tmem(SFA_COL, PIPE_DEPTH, BLK_M)
        sfb_t = W.mx_sf_tmem(SFB_COL, PIPE_DEPTH, BLK_N)

        # --- the walk's length, on the device: thread e reads expert e's rows ---
        tid = T.meta_var(wg_id * 128 + warp_id * 32 + lane_id)
        W.scan_experts(scan, bounds, routing, tid, E, BLK_M, M_DIM, MASKED)
        total = T.meta_var(scan[W.log2_ceil(E) % 2, E - 1] * W_TILES)
        at = T.alloc_local((4,), "int32")  # (expert, token row, expert's row end, weight row)

        with WarpgroupRole(wg_id, 1):
            if warp_id == 3:
                # --- load (producer): A, B and SFB's atom by TMA, SFA's atom by the warp ---
                ring = PipelineState(PIPE_DEPTH, 1)
                t: T.int32 = bx
                while t < total:
                    W.tile_at(at, scan, bounds, t, E, BLK_M, W_TILES, BLK_N, GROUP)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "TMA producer")
                        # the TMA first (its bytes in flight), then the lanes gather SFA
                        # into a disjoint buffer while they land
                        if T.cuda.elect_sync():
                            W.tma_load_mx_unit(Asmem[ring.stage, :, :], Bsmem[ring.stage, :, :],
                                                SFBsmem[ring.stage, :, :], A, B, SFB, at, k,
                                                tma2mma.ptr(ring.stage), BLK_M, BLK_K, K_TILES,
                                                MASKED)
                        W.load_sfa_atom(SFAsmem, ring.stage, SFA, at, k, K_TILES, lane_id,
                                         MASKED)
                        tma2mma.arrive(ring.stage)
                        ring.advance()
                    t = t + SM_COUNT
            elif warp_id == 0:
                # --- compute (MMA issuer): SFs SMEM -> TMEM, then 4 block-scaled MMAs ---
                ring = PipelineState(PIPE_DEPTH, 0)
                acc = PipelineState(ACC_STAGES, 1)
                t: T.int32 = bx
                while t < total:
                    # the epilogue must have drained this accumulator (unit i - 2)
                    ld2mma.wait(acc.stage, acc.phase, "MMA issuer")
                    W.tcgen05_fence_after_sync()
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        tma2mma.wait(ring.stage, ring.phase, "MMA issuer")
                        W.tcgen05_fence_after_sync()
                        if T.cuda.elect_sync():
                            W.mx_sf_to_tmem(sfa_t[ring.stage, :, :], SFAview[ring.stage, :, :])
                            W.mx_sf_to_tmem(sfb_t[ring.stage, :, :], SFBview[ring.stage, :, :])
                            W.mma_tile_mx(tmem, acc.stage * ACC_COLS, Asmem8[ring.stage, :, :],
                                           Bsmem8[ring.stage, :, :], sfa_t[ring.stage, :, :],
                                           sfb_t[ring.stage, :, :], BLK_N, k != 0)
                            # stage s (SMEM and SF slot) is free once these are done
                            W.mma_commit(mma2tma.ptr(ring.stage))
                        ring.advance()
                    if T.cuda.elect_sync():
                        W.mma_commit(mma2ld.ptr(acc.stage))
                    acc.advance()
                    t = t + SM_COUNT

        with WarpgroupRole(wg_id, 0):
            # --- writeback (epilogue): v14's, each thread its row, bounded per expert ---
            acc = PipelineState(ACC_STAGES, 0)
            tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
            t: T.int32 = bx
            while t < total:
                W.tile_at(at, scan, bounds, t, E, BLK_M, W_TILES, BLK_N, GROUP)
                mma2ld.wait(acc.stage, acc.phase, "epilogue")
                W.tcgen05_fence_after_sync()
                W.store_unit_bounded(tmem, acc.stage * ACC_COLS, D, at, tid_in_wg, dtype, BLK_N,
                                     READ, N, False, MASKED)
                W.tcgen05_fence_before_sync()
                ld2mma.arrive(acc.stage)
                acc.advance()
                t = t + SM_COUNT

        # --- free: only warp 0 of warpgroup 0 allocated, so only it deallocates ---
        W.tcgen05_cta_sync()
        if wg_id == 0:
            if warp_id == 0:
                W.tmem_free(tmem_addr)

    return kernel
