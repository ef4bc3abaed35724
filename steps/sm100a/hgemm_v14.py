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
              SWAP_AB: bool = False):
    """Step card -- v14, grouped GEMM (mixture of experts).

    Changes from v7: D_e = A_e @ B[e].T for every expert e in one launch (B: (E, N, K),
      K-major). The walk: every thread reads one expert's rows from the routing tensor
      (W.scan_experts), the CTA scans the token-tile counts into prefix sums in shared
      memory, and unit t = bx, bx + SM_COUNT, ... is found by binary search (W.tile_at):
      (expert, token tile, weight tile), GROUP token tiles of one expert per weight column.
      The TMA producer, the MMA issuer and the epilogue compute the same walk. B[e]'s tile:
      a 3-D TMA box (W.tma_load_unit). The epilogue stores each row from the registers only
      below its expert's row end (W.store_row_bounded; v7's TMA store goes). From v12: BLK_N,
      the ring as deep as fits, the accumulators at TMEM columns 0 and 256, swap-AB.
    Base: v7 (v12 is a superset): its diff shows the walk with the least else around it.
    Layouts: LAYOUT="contiguous": (A (M, K) rows sorted by expert, B, D (M, N), offs int32
      (E,) cumulative row ends: expert e owns rows [offs[e-1], offs[e]), offs[-1] = 0).
      LAYOUT="masked": (A (E, M, K), B, D (E, M, N), counts int32 (E,)): expert e owns rows
      [0, counts[e]). Rows no expert owns are not written. M is the runtime row count
      (RUNTIME_M=True); routing values are clamped to [0, M] in the kernel.
    Decode (SWAP_AB=True): the MMA's 128 rows walk the expert's weight rows, its BLK_N
      columns (16..64) the expert's tokens; one thread per weight row stores D's column.
    Barriers (v7's, stage and phase by PipelineState):
      tma2mma[s] TMA -> MMA, expect_tx of (128 + BLK_N) x 64 x 2 bytes, MMA waits phase 0;
      mma2tma[s] MMA -> TMA, tcgen05.commit frees stage s, producer waits from phase 1;
      mma2ld[a]  MMA -> epilogue, tcgen05.commit after a unit's last MMA, phase 0;
      ld2mma[a]  epilogue -> MMA, 128 arrivals once every column was read; the MMA warp
                 waits from phase 1. The scan's CTA barriers run before the roles split.
    Constraints: N, K multiples of 8; float16 or bfloat16; 1 <= E <= 256; LAYOUT
      contiguous or masked; BLK_N a multiple of 16 in [16, 256]; GROUP >= 1.
    FP8: no twin of sm_90a's FP8_BLOCK here (v13's MXFP8 block-scaled MMA has no grouped form).
    Run: ``tirx-gemm build v14``; NumSim: the cases of tests/test_grouped_steps.py.
    """
    ACC_STAGES, ACC_COLS = 2, W.TMEM_COLS // 2  # accumulator a at TMEM column 256 * a
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
    for name, flag in (("RUNTIME_M", RUNTIME_M), ("SWAP_AB", SWAP_AB)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r} must be True or False")
    H.check_positive_ints(SM_COUNT=SM_COUNT, GROUP=GROUP)
    MASKED = LAYOUT == "masked"
    READ = min(READ_MAX, BLK_N & -BLK_N)  # 16, 32 or 64 columns: divides BLK_N
    TOK, W_BLK = (BLK_N, BLK_M) if SWAP_AB else (BLK_M, BLK_N)  # D's rows, columns per unit
    W_TILES = H.ceil_div(N, W_BLK)
    STAGE_BYTES, SCAN_BYTES = stage_bytes(BLK_N), scan_bytes(E)
    if PIPE_DEPTH is None:
        PIPE_DEPTH = default_pipe_depth(BLK_N, E)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, SCAN_BYTES)
    K_TILES = H.ceil_div(K, BLK_K)
    M_DIM = tvm.tirx.Var("M", "int32") if RUNTIME_M else M
    A_SHAPE = (E, M_DIM, K) if MASKED else (M_DIM, K)
    D_SHAPE = (E, M_DIM, N) if MASKED else (M_DIM, N)

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)

    @T.prim_func
    def kernel(A: T.Buffer(A_SHAPE, dtype), B: T.Buffer((E, N, K), dtype),
               D: T.Buffer(D_SHAPE, dtype), routing: T.Buffer((E,), "int32")):
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
                            W.tma_load_unit(Asmem[ring.stage, :, :], Bsmem[ring.stage, :, :],
                                            A, B, at, k * BLK_K, tma2mma.ptr(ring.stage),
                                            BLK_M, BLK_N, BLK_K, SWAP_AB, MASKED)
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
                for c in T.unroll(BLK_N // READ):
                    Dreg = T.alloc_local((READ,), dtype)
                    W.tmem_to_registers(tmem, acc.stage * ACC_COLS + c * READ, READ, Dreg)
                    if SWAP_AB:
                        # D's transpose: accumulator row tid_in_wg is D's column at[3] +
                        # tid_in_wg (a weight row), its columns D's rows at[1].. (tokens)
                        W.store_column_bounded(Dreg, D, at[0], at[1] + c * READ,
                                               at[3] + tid_in_wg, READ, at[2], N, MASKED)
                    else:
                        W.store_row_bounded(Dreg, D, at[0], at[1] + tid_in_wg,
                                            at[3] + c * READ, READ, at[2], N, MASKED)
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

    return kernel
