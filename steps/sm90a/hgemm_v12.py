"""Step 12 (sm_90a): one tile cannot serve every shape -- a tile menu in one builder.

Lesson: the tile is a parameter. BLK_M in {64, 128} and BLK_N any multiple of 8 up to
256 come out of the same kernel; wave efficiency (how many of the SMs get a tile) and the
bytes each tile moves per flop decide which one a shape should get.
"""

import tvm
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import epilogue as E
from tirx_gemm import helpers as H
from tirx_gemm import hopper as W
from tirx_gemm import pdl as P
from tirx_gemm import splitk
from tirx_gemm import streamk as SK

BLK_MS = (64, 128)            # one or two consumer warpgroups of 64 rows
# BLK_N: any multiple of wgmma's N step of 8 (a tile can end near N: 2304 = 14 x 164.6
# takes 168-column tiles, not 176); a pair (CLUSTER=2) loads half of it per CTA: 16
BLK_N_STEP, BLK_N_MAX, PAIR_N_STEP = 8, 256, 16
# the default ring: as many stages as fit, at most this many. A decode tile's stage holds
# little of B (64x16: 2 KiB of its 10 KiB; A's rows past M are zero-filled), so it takes many
# stages to keep enough HBM reads in flight (cuBLAS runs 64x16 tiles with 16 stages)
AUTO_DEPTH_MAX = 16
SK_IN_FLIGHT = 8  # STREAM_K: slab chunks (4 floats) a reducing thread loads at once
SPLIT_IN_FLIGHT = 32  # SPLIT_K: slab chunks a reducing thread loads at once (v11's narrow)


def hgemm_v12(M: int, N: int, K: int, dtype: str = "float16", BLK_M: int = 128,
              BLK_N: int = 128, PIPE_DEPTH: int | None = None, SM_COUNT: int = 132,
              RUNTIME_M: bool = False, RUNTIME_NK: bool = False, L2_GROUP: int = 8,
              PRODUCER_REGS: int = 40, CONSUMER_REGS: int = 232, BIAS=False, ACT=None,
              ACT_APPROX: bool = False,
              BIAS_SMEM: bool = False,
              OUT_DTYPE=None, SWIGLU: bool = False, SWAP_AB: bool = False, CLUSTER: int = 1,
              STREAM_K: bool = False, PDL: bool = False, PDL_TRIGGER: str = "start",
              PDL_ATTR: bool = True,
              SPLIT_K: int | None = None, PREFETCH_MAPS: bool = False,
              SWAP_TMA: bool = False, TAIL_TMA: bool = False, SHIFT_LAST: bool = False):
    """Step card -- v12, a tile menu.

    Changes from v9: the CTA tile BLK_M x BLK_N is a tunable: BLK_M 64 (one consumer
      warpgroup) or 128 (two), BLK_N a multiple of 8 in [8, 256] (one m64nBLK_Nk16 wgmma per
      consumer and k16); one producer thread TMA-loads A and B into a ring of PIPE_DEPTH
      stages (default: as many as fit, at most 16). v9's overlapped epilogue; the last
      BLK_N % 64 columns by guarded 4-byte stores (TAIL_TMA: one TMA store of their width).
      min(tiles, SM_COUNT) persistent CTAs walk the tiles in v9's L2-grouped order.
      RUNTIME_M / RUNTIME_NK: M (N, K) at run time. CLUSTER=2 (4): v9's CTA pair (four CTAs)
      along M, each loading 8-row atoms of the shared B. SWAP_AB: the MMA's rows walk N and
      its columns the tokens, D's transpose (SWAP_TMA: stmatrix .trans + TMA stores).
    SPLIT_K=S: a CTA per unit (unit s = K range s of a tile); S>1: v11's "spread" sum.
      STREAM_K (tirx_gemm/streamk.py): a tail wave under half full cut in K units of >= 8.
    PDL (tirx_gemm/pdl.py): waits after the prologue, then lets the next launch (PDL_TRIGGER=
      "exit": as CTAs exit; PDL_ATTR=False: launched without the attribute, trigger kept).
      PREFETCH_MAPS: prefetch.tensormap of A's and B's maps. SHIFT_LAST: a token tile reaching past M starts at M - its width.
    Why: the tile count decides how many SMs work (1024^3: 32 of 132 with v9's 256x256
      pairs, 128 with 128x64); smaller tiles cost bytes per MAC, 2 x (1/BLK_M + 1/BLK_N).
      The tile menu, swap-AB and the K split answer that count, picked per shape by matmul
      from this one body: one step. Keywords it never picked are patches in their lab/ study.
    Barriers: tma2mma and mma2tma, one H.Ring. Epilogue (tirx_gemm/epilogue.py): BIAS, ACT,
      OUT_DTYPE "float32", SWIGLU on the fp32 accumulators in registers before the pack.
    Constraints: any M >= 1; N, K multiples of 8 (SWIGLU: B has 2N rows); float16 or
      bfloat16; CLUSTER 1, 2 or 4 (SM_COUNT a multiple; no epilogue or PREFETCH_MAPS; 2:
      BLK_N a multiple of 16); STREAM_K: no CLUSTER > 1 or epilogue; SPLIT_K: no STREAM_K or
      CLUSTER (S>1: a BIAS alone, on the sums; no RUNTIME_NK; tiles x S <= SMs); SWAP_TMA:
      BLK_N % 16 == 0, S = 1; ring plus staging within 227 KiB; setmaxnreg only for BLK_M=128, BLK_N > 128.
    Run: ``tirx-gemm run v12 --arch sm_90a --mnk 1024,1024,1024``.
    BIAS_SMEM: a producer warp stages each tile's bias in smem (ring bias_full / bias_empty).
    ACT_APPROX: gelu_tanh with one MUFU (tanh.approx), bfloat16 D only (lab/fused_epilogues).
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
    if not isinstance(BIAS_SMEM, bool):
        raise ValueError(f"BIAS_SMEM={BIAS_SMEM!r} must be True or False")
    if BIAS_SMEM and not HAS_BIAS:
        raise ValueError("BIAS_SMEM=True stages the bias in shared memory: it needs BIAS (the "
                         "bias dtype)")
    # BIAS_SMEM: its own epilogue reads the bias from shared memory (the consumers' code
    # below), so the register path's bias loads and bias + activation are off
    HAS_BIAS, BIAS_ACT = HAS_BIAS and not BIAS_SMEM, BIAS_ACT and not BIAS_SMEM
    if not isinstance(ACT_APPROX, bool):
        raise ValueError(f"ACT_APPROX={ACT_APPROX!r} must be True or False")
    if ACT_APPROX and (epi["ACT"] not in E.APPROX_ACTS or D_DTYPE != "bfloat16"):
        raise ValueError(f"ACT_APPROX=True takes ACT {' or '.join(map(repr, E.APPROX_ACTS))} "
                         f"and a bfloat16 D, got ACT={epi['ACT']!r}, D {D_DTYPE} (tanh.approx's "
                         f"2**-11 is under bfloat16's rounding only; the erf gelu stays exact)")
    # the activation's device function: ACT_APPROX's one-MUFU form (hopper/fused.py)
    ACT_FN = E.approx_act(epi["ACT"]) if ACT_APPROX else epi["ACT"]
    if SWAP_AB and HAS_EPI and (not HAS_BIAS or SWIGLU_ON or OUT_F32 or SWAP_TMA):
        raise ValueError(f"SWAP_AB=True takes no fused epilogue but BIAS, with or without ACT "
                         f"({E.tag(epi)}{', BIAS_SMEM' if BIAS_SMEM else ''}"
                         f"{', SWAP_TMA' if SWAP_TMA else ''}): its tiles hold D's transpose, "
                         "stored element by element, the bias along the fragment's rows")
    SWAP_BIAS = SWAP_AB and HAS_BIAS  # the bias along the fragment's rows (D's columns)
    if isinstance(BLK_M, bool) or not isinstance(BLK_M, int) or BLK_M not in BLK_MS:
        raise ValueError(f"BLK_M={BLK_M!r} must be 64 or 128 (one or two consumer "
                         f"warpgroups of 64 rows)")
    if not isinstance(SWAP_AB, bool):
        raise ValueError(f"SWAP_AB={SWAP_AB!r} must be True or False")
    if not isinstance(SWAP_TMA, bool):
        raise ValueError(f"SWAP_TMA={SWAP_TMA!r} must be True or False")
    if not isinstance(TAIL_TMA, bool):
        raise ValueError(f"TAIL_TMA={TAIL_TMA!r} must be True or False")
    if not isinstance(SHIFT_LAST, bool):
        raise ValueError(f"SHIFT_LAST={SHIFT_LAST!r} must be True or False")
    if SWAP_TMA and (not SWAP_AB or STREAM_K or (SPLIT_K or 1) > 1 or BLK_N % 16):
        raise ValueError("SWAP_TMA=True stores a swap-AB tile (SWAP_AB=True) by TMA: BLK_N a "
                         "multiple of 16 (an x4 stmatrix per 16 tokens), no STREAM_K or "
                         "SPLIT_K > 1")
    # swap-AB: the MMA's rows walk N (B's rows) and its columns M (the tokens): D's
    # transpose, tile by tile. The token tile may be as narrow as wgmma's N of 8.
    if isinstance(BLK_N, bool) or not isinstance(BLK_N, int) or BLK_N % BLK_N_STEP \
            or not BLK_N_STEP <= BLK_N <= BLK_N_MAX:
        raise ValueError(f"BLK_N={BLK_N!r} must be a multiple of {BLK_N_STEP} in "
                         f"[{BLK_N_STEP}, {BLK_N_MAX}] (wgmma m64nNk16: N <= 256)")
    if SWIGLU_ON and BLK_N % E.SWIGLU_TILE_STEP:
        raise ValueError(f"SWIGLU=True needs BLK_N a multiple of {E.SWIGLU_TILE_STEP} (whole "
                         f"gate/up group pairs), got BLK_N={BLK_N}")
    for name, flag in (("RUNTIME_M", RUNTIME_M), ("RUNTIME_NK", RUNTIME_NK),
                       ("PREFETCH_MAPS", PREFETCH_MAPS)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}={flag!r} must be True or False")
    H.check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)
    # CLUSTER=2: two CTAs of consecutive BLK_M row blocks share the MMA's B tile (rows
    # n_st.. of B), each TMA-loading half of it multicast to both (v9's pair).
    # CLUSTER=4 (cuBLAS's 4x1 decode clusters): four CTAs share the tile, each loading
    # SHARE rows of it (a multiple of 8: whole 1024-byte swizzle atoms), the last
    # nonempty share what is left, and a CTA past it none (72 tokens: 24, 24, 24, 0)
    if isinstance(CLUSTER, bool) or CLUSTER not in (1, 2, 4):
        raise ValueError(f"CLUSTER={CLUSTER!r} must be 1, 2 or 4 (CTAs along M sharing B)")
    if CLUSTER == 2 and BLK_N % PAIR_N_STEP:
        raise ValueError(f"CLUSTER=2 needs BLK_N a multiple of {PAIR_N_STEP} (each CTA "
                         f"loads half of the shared tile, 8 rows at least), got "
                         f"BLK_N={BLK_N}")
    if CLUSTER > 1:
        if HAS_EPI:
            raise ValueError(f"CLUSTER={CLUSTER} takes no fused epilogue ({E.tag(epi)}): "
                             "clusters have been checked on a GPU with plain stores only")
        if PREFETCH_MAPS:
            raise ValueError(f"CLUSTER={CLUSTER} runs with TVM's TMA defaults (no "
                             "PREFETCH_MAPS)")
        W.check_cluster_pool(SM_COUNT, CLUSTER)
    P.check(PDL, CLUSTER, pairs=True)
    if PDL_TRIGGER not in ("start", "exit") or (PDL_TRIGGER != "start" and not PDL):
        raise ValueError(f"PDL_TRIGGER={PDL_TRIGGER!r}: 'start' (the default) or 'exit', the "
                         f"latter with PDL=True only")
    if PDL_ATTR is not True and (PDL_ATTR is not False or not PDL):
        raise ValueError(f"PDL_ATTR={PDL_ATTR!r}: True (the default), or False with PDL=True "
                         f"(launched without the attribute, the body's trigger kept)")
    if not isinstance(STREAM_K, bool):
        raise ValueError(f"STREAM_K={STREAM_K!r} must be True or False")
    if STREAM_K and (CLUSTER != 1 or HAS_EPI):
        raise ValueError("STREAM_K=True takes no CLUSTER > 1 or fused epilogue (its pieces "
                         "are plain one-CTA tiles)")
    if SPLIT_K is not None:
        H.check_positive_ints(SPLIT_K=SPLIT_K)
        if STREAM_K or CLUSTER != 1:
            raise ValueError("SPLIT_K takes no STREAM_K or CLUSTER > 1 (one CTA per unit)")
        if SPLIT_K > 1 and RUNTIME_M and SPLIT_K % L2_GROUP == 0:
            # TVM 0.27's scheduler divides by its tail rows, S x tiles mod L2_GROUP, which
            # its simplifier then proves zero at a run-time M (a build error)
            raise ValueError(f"SPLIT_K={SPLIT_K} with RUNTIME_M needs an L2_GROUP that does "
                             f"not divide it, got {L2_GROUP} (splitk.l2_group_for)")
        if SPLIT_K > 1 and ((HAS_EPI and not (HAS_BIAS and E.is_plain({**epi, "BIAS": None})))
                            or BIAS_SMEM or RUNTIME_NK):
            raise ValueError(f"SPLIT_K={SPLIT_K} takes a BIAS alone as its epilogue ({E.tag(epi)}"
                             f"{', BIAS_SMEM' if BIAS_SMEM else ''}) and no RUNTIME_NK (its "
                             "reduction adds the bias to the summed bands; its split of K is "
                             "fixed at build)")
    S = SPLIT_K or 1                       # K splits per tile (1: none)
    NUM_CONSUMERS = BLK_M // W.WGMMA_M    # consumer warpgroups, 64 rows each
    PRODUCER = NUM_CONSUMERS              # the producer is the last warpgroup
    ACC_REGS = BLK_N // 2                 # fp32 accumulators per consumer thread
    # SwiGLU: a tile of BLK_N columns of the fused gate/up weight gives BLK_N/2 outputs
    OUT_N = BLK_N // 2 if epi["SWIGLU"] else BLK_N
    PACKED_REGS = OUT_N // 4              # 2 x 16-bit registers of a packed tile
    # full 64-column chunks: stmatrix + TMA store (none for an fp32 D: register stores)
    # (none with SPLIT_K > 1 either: its reduction stores D from the summed bands)
    PLAIN_STORE = not (OUT_F32 or SWAP_AB or S > 1)
    TMA_CHUNKS = OUT_N // W.EPI_COLS if PLAIN_STORE else 0
    TAIL_J = (OUT_N % W.EPI_COLS) // 8 if PLAIN_STORE else 0  # 8-column blocks: guarded
    # stores, or (TAIL_TMA) stmatrix into a tail staging tile and one TMA box
    if TAIL_TMA and (not TAIL_J or STREAM_K or HAS_EPI or CLUSTER != 1):
        raise ValueError(f"TAIL_TMA=True stores a plain tile's last BLK_N % 64 columns by TMA: "
                         f"it needs such a tail (16-bit D, no SWAP_AB or SPLIT_K > 1; "
                         f"{OUT_N} output columns here) and no STREAM_K, fused epilogue or "
                         f"CLUSTER=2 (checked on a GPU with plain one-CTA tiles)")
    if SHIFT_LAST and (CLUSTER != 1 or STREAM_K or S > 1 or HAS_EPI):
        raise ValueError("SHIFT_LAST=True moves a data-parallel one-CTA tile's token rows: no "
                         "CLUSTER=2, STREAM_K, SPLIT_K > 1 or fused epilogue")
    # SWAP_TMA: TMA stores of 64 tokens each, the last BLK_N % 64 tokens in one more
    T_STORES = H.ceil_div(BLK_N, W.EPI_COLS) if SWAP_TMA else 0
    # a staging tile is reused every EPI_BUFS chunks, also across tiles: EPI_BUFS divides
    EPI_BUFS = 2 if (T_STORES if SWAP_TMA else TMA_CHUNKS) % 2 == 0 else 1
    STAGING = NUM_CONSUMERS * EPI_BUFS * W.tile_bytes(W.WGMMA_M, W.EPI_COLS) \
        if TMA_CHUNKS or SWAP_TMA else 0  # 8 KiB per staging tile, none for a narrow tile
    A_STAGE_BYTES = W.tile_bytes(BLK_M, BLK_K)
    B_STAGE_BYTES = W.tile_bytes(BLK_N, BLK_K)
    STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES
    # BIAS_SMEM: BIAS_BUFS tiles' bias values, fp32, after the staging tiles
    BIAS_BUFS = 2
    BIAS_BYTES = BIAS_BUFS * BLK_N * 4 if BIAS_SMEM else 0
    # TAIL_TMA: a 64 x TAIL_COLS staging tile per consumer, of its own unless that would
    # cost the default ring a stage; then (TAIL_SHARED) it lies over the consumer's staging
    # tile of the last chunk, written once that chunk's store has read it
    TAIL_COLS = TAIL_J * 8 if TAIL_TMA else 0
    TAIL_BYTES = NUM_CONSUMERS * W.tile_bytes(W.WGMMA_M, TAIL_COLS)
    TAIL_SHARED = TAIL_TMA and TMA_CHUNKS > 0 and (
        min(AUTO_DEPTH_MAX, H.ring_stages(STAGE_BYTES, STAGING + TAIL_BYTES))
        < min(AUTO_DEPTH_MAX, H.ring_stages(STAGE_BYTES, STAGING)))
    STAGING += TAIL_BYTES if TAIL_TMA and not TAIL_SHARED else 0
    TAIL_SINCE = 0 if TAIL_SHARED else TMA_CHUNKS  # bulk groups that may still read then
    if PIPE_DEPTH is None:
        # barriers and alignment take < 1 KiB; check_pipe_depth keeps 1 KiB for them
        PIPE_DEPTH = min(AUTO_DEPTH_MAX, H.ring_stages(STAGE_BYTES, STAGING + BIAS_BYTES))
        if SPLIT_K is not None and not RUNTIME_NK:
            # a CTA per unit loads no more than its K steps: a short unit's smaller ring
            # lets several CTAs share an SM (one's epilogue under another's loads)
            PIPE_DEPTH = max(2, min(PIPE_DEPTH, H.ceil_div(H.ceil_div(K, BLK_K), S)))
    W.check_ring_for_wait_one(PIPE_DEPTH)
    H.check_pipe_depth(PIPE_DEPTH, STAGE_BYTES, STAGING + BIAS_BYTES)
    # TAIL_SHARED: the byte offsets of Dstage[c, (TMA_CHUNKS - 1) % EPI_BUFS] (the ring from
    # byte 1024, A's stages then B's, the staging tiles after it)
    TAIL_AT = [1024 + PIPE_DEPTH * STAGE_BYTES + (c * EPI_BUFS + (TMA_CHUNKS - 1) % EPI_BUFS)
               * W.tile_bytes(W.WGMMA_M, W.EPI_COLS) for c in range(NUM_CONSUMERS)]
    # TMA settings of both operands' loads (helpers.tma_hints): TVM's defaults, or with
    # PREFETCH_MAPS a prefetch of their descriptors at entry
    HINTS = H.tma_hints(prefetch_map=PREFETCH_MAPS)
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
    ROWS_DIM, COLS_DIM = (NB_DIM, M_DIM) if SWAP_AB else (M_DIM, NB_DIM)  # the MMA's M, N
    M_TILES = (ROWS_DIM + BLK_M - 1) // BLK_M
    # the scheduler walks cluster tiles: CLUSTER row blocks (the last pair may reach past M:
    # both CTAs still take part, the second's loads zero-filled and its stores clipped)
    M_CTILES = (ROWS_DIM + CLUSTER * BLK_M - 1) // (CLUSTER * BLK_M)
    # the MMA's B tile's rows each CTA of a cluster loads (a multiple of 8); a pair: half
    # each. SHARES CTAs load some, the last of them LAST_SHARE rows (CLUSTER=4 at 72 rows:
    # 24, 24, 24, none)
    SHARE = H.ceil_div(BLK_N, BLK_N_STEP * CLUSTER) * BLK_N_STEP
    SHARES = H.ceil_div(BLK_N, SHARE)
    LAST_SHARE = BLK_N - (SHARES - 1) * SHARE
    CLUSTER_MASK = (1 << CLUSTER) - 1  # a multicast reaches every CTA of the cluster
    TOK_BLK = BLK_N if SWAP_AB else BLK_M  # the token tile: D's rows (SWAP_AB: MMA columns)

    def tok_start(st):
        # SHIFT_LAST: a token tile reaching past M starts at M - TOK_BLK (when M allows),
        # so that its TMA loads stay within A and no row is zero-filled
        return T.min(st, T.max(M_DIM - TOK_BLK, 0)) if SHIFT_LAST else st
    N_TILES = (COLS_DIM + BLK_N - 1) // BLK_N
    K_TILES = (K_DIM + BLK_K - 1) // BLK_K  # the last K tile is zero-filled past K
    # the previous tile's writeback runs once this many + 1 K steps of wgmmas are queued
    EPI_AT = T.min(1, K_TILES - 1) if RUNTIME_NK else min(1, K_TILES - 1)
    NUM_CTAS = SM_COUNT if RUNTIME_M or RUNTIME_NK else \
        min(SM_COUNT, M_CTILES * N_TILES * CLUSTER)
    if SPLIT_K is not None:  # a CTA per unit: the grid follows the shape, also at run time
        NUM_CTAS = S * M_TILES * N_TILES
    SPREAD = False
    if S > 1:
        SPREAD = splitk.check_split(S, K_TILES, K, 1 if RUNTIME_M else M_TILES * N_TILES,
                                    "spread", SM_COUNT)
    # the scheduler's rows: S x M_CTILES unit rows, split-major (v11's order)
    SPLIT_ROWS = S * M_CTILES if S > 1 else M_CTILES

    def unit(scheduler):
        # (tile row, first K step, K steps) of the scheduler's unit: SPLIT_K > 1 walks
        # S x M_CTILES unit rows, row r is split r // M_CTILES of tile row r % M_CTILES
        if S == 1:
            return scheduler.m_idx, 0, K_TILES
        split = scheduler.m_idx // M_CTILES
        k0 = split * K_TILES // S
        return scheduler.m_idx % M_CTILES, k0, (split + 1) * K_TILES // S - k0

    def k_at(k_first, k):
        # the K step of the unit's k-th load (no split: k itself, the kernel's text as is)
        return k if S == 1 else k_first + k
    # STREAM_K (tirx_gemm/streamk.py): the plan from the shape, at build time or, with
    # RUNTIME_M / RUNTIME_NK, on the device; off at a static shape: v12's kernel as is
    RUNTIME = RUNTIME_M or RUNTIME_NK
    OPS = SK.tir_ops(T)
    PLAN = SK.plan(M_TILES * N_TILES, K_TILES, SM_COUNT, OPS if RUNTIME else SK.PY) \
        if STREAM_K else None
    SK_CODE = STREAM_K and PLAN.on is not False
    if SK_CODE:
        NUM_CTAS = SM_COUNT  # G: every CTA of the pool, each holds a unit
    HALF = W.WGMMA_M * BLK_N  # floats of one consumer's half of a slab
    CHUNK = H.SPLITK_CHUNK    # floats per slab store / load of one thread
    # SPLIT_K > 1 (v11's "spread"): a slab half is CHUNKS chunks, split s reduces
    # [s*CHUNKS//S, (s+1)*CHUNKS//S); a thread takes every 128th chunk of that band
    # (BAND_ITERS at most), GROUP slabs' worth of loads in flight at once
    CHUNKS = HALF // CHUNK
    BAND_ITERS = H.ceil_div(H.ceil_div(CHUNKS, S), 128)
    GROUP = max(1, min(S, SPLIT_IN_FLIGHT // BAND_ITERS))
    TILES = M_TILES * N_TILES  # the MMA's output tiles (SWAP_AB: of D's transpose)
    WS_TILES = H.runtime_extent("WS_TILES") if RUNTIME_M else TILES
    CNT_LEN = H.runtime_extent("CNT_LEN") if RUNTIME_M else 2 * TILES * NUM_CONSUMERS

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS), dtype)

    def walking(scheduler):
        # the data-parallel walk: every tile, or (STREAM_K) the full waves before the tail
        return scheduler.linear_idx < PLAN.dp_tiles if SK_CODE else scheduler.valid()

    # STREAM_K, unit u = bx (tirx_gemm/streamk.py): iterations [it0, it1), stream-K tiles
    # t0 .. t0 + count - 1 (1 or 2), K steps [k0, k0 + steps) of tile j; tile j's pieces
    # come from units first(j) .. first(j) + pieces(j) - 1. `iters`, `units`: the plan's
    # counts, read from local variables (run-time values are computed once)
    def sk_walk():
        # the walk's order, to find a stream-K tile's place (a scheduler of its own: the
        # data-parallel one's state stays as short-lived as without STREAM_K)
        return ClusterPersistentScheduler2D("sk", num_m_tiles=M_CTILES, num_n_tiles=N_TILES,
                                            num_clusters=NUM_CTAS, l2_group_size=L2_GROUP)

    # the unit's range, its pieces and a tile's pieces as expressions of the run-time
    # plan's counts (tirx_gemm/streamk.py: one text for both arches)
    (sk_it0, sk_it1, sk_t0, sk_tiles, sk_k0, sk_steps, sk_first,
     sk_pieces) = SK.walk(PLAN, OPS)

    @T.inline
    def publish_slab(WS, s, base, acc, tid):
        # this thread's fp32 partial -> slab s, chunk c at base + (c * 128 + tid) * 4 (v11's
        # order); a warpgroup barrier must follow before the count
        for c in T.unroll(ACC_REGS // CHUNK):
            slot = T.meta_var(base + (c * 128 + tid) * CHUNK)
            Tx.copy(WS[s, slot:slot + CHUNK], acc[c * CHUNK:(c + 1) * CHUNK])

    @T.inline
    def reduce_slabs(WS, s0, count, base, acc, tid):
        # acc = slab s0 + slab s0 + 1 + ... (count slabs), in that fixed order: the same bits
        # whatever order the units finished in; SK_IN_FLIGHT chunks loaded per round
        for c in T.unroll(ACC_REGS):
            acc[c] = T.float32(0)
        chunk = T.alloc_local((SK_IN_FLIGHT * CHUNK,), H.ACC_DTYPE)
        for b in T.unroll(ACC_REGS // CHUNK // SK_IN_FLIGHT):
            for s in T.serial(count, annotations=H.ROLLED):
                for i in T.unroll(SK_IN_FLIGHT):
                    slot = T.meta_var(base + ((b * SK_IN_FLIGHT + i) * 128 + tid) * CHUNK)
                    Tx.copy(chunk[i * CHUNK:(i + 1) * CHUNK], WS[s0 + s, slot:slot + CHUNK])
                for i in T.unroll(SK_IN_FLIGHT * CHUNK):
                    acc[b * SK_IN_FLIGHT * CHUNK + i] = (acc[b * SK_IN_FLIGHT * CHUNK + i]
                                                         + chunk[i])
        if ACC_REGS // CHUNK % SK_IN_FLIGHT > 0:  # the last, partial round
            for s in T.serial(count, annotations=H.ROLLED):
                for i in T.unroll(ACC_REGS // CHUNK % SK_IN_FLIGHT):
                    slot = T.meta_var(base + ((ACC_REGS // CHUNK // SK_IN_FLIGHT * SK_IN_FLIGHT
                                               + i) * 128 + tid) * CHUNK)
                    Tx.copy(chunk[i * CHUNK:(i + 1) * CHUNK], WS[s0 + s, slot:slot + CHUNK])
                for i in T.unroll(ACC_REGS // CHUNK % SK_IN_FLIGHT * CHUNK):
                    acc[ACC_REGS // CHUNK // SK_IN_FLIGHT * SK_IN_FLIGHT * CHUNK + i] = (
                        acc[ACC_REGS // CHUNK // SK_IN_FLIGHT * SK_IN_FLIGHT * CHUNK + i]
                        + chunk[i])

    @T.inline
    def split_fixup(D, bias, WS, CNT, arrivals, acc, scheduler, m_tile, m_st, n_st, consumer,
                    tid_in_wg):
        # SPLIT_K > 1, a consumer warpgroup after its unit's K range (v11's "spread"):
        # publish the partial half, count it, wait for all S, sum its band in split order,
        # store it, then a second count; the last unit past its band zeroes both counters
        tile = T.meta_var(m_tile * N_TILES + scheduler.n_idx)
        split = T.meta_var(scheduler.m_idx // M_CTILES)
        count_i = T.meta_var(tile * NUM_CONSUMERS + consumer)
        if m_st + consumer * W.WGMMA_M < ROWS_DIM:  # a half wholly past the rows: none
            H.splitk_publish(WS, split, tile, consumer * HALF, acc, ACC_REGS, tid_in_wg)
            T.cuda.warpgroup_sync(1 + consumer)  # all slab stores precede the count
            if tid_in_wg == 0:
                H.splitk_count_arrival(arrivals, consumer, CNT.ptr_to([count_i]))
                splitk.wait_count(CNT.ptr_to([count_i]), S, "CNT", count_i, "consumer")
            T.cuda.warpgroup_sync(1 + consumer)  # hands the count (and acquire) to all
            q0 = T.meta_var(split * CHUNKS // S)
            q1 = T.meta_var((split + 1) * CHUNKS // S)
            band = T.alloc_local((BAND_ITERS * CHUNK,), H.ACC_DTYPE)
            H.splitk_reduce_band(WS, tile, consumer * HALF, band, q0, q1, S, GROUP,
                                 tid_in_wg, BAND_ITERS)
            if HAS_BIAS:  # the bias on the sums, before the cast
                W.epilogue_bias_band(band, bias, q0, q1, m_st, n_st, consumer * W.WGMMA_M,
                                     ROWS_DIM, COLS_DIM, BAND_ITERS, tid_in_wg, SWAP_AB)
            H.splitk_store_band(D, band, q0, q1, m_st, n_st, consumer * W.WGMMA_M,
                                ROWS_DIM, COLS_DIM, BAND_ITERS, tid_in_wg, SWAP_AB)
            T.cuda.warpgroup_sync(1 + consumer)  # the half's threads are past their band
            if tid_in_wg == 0:
                H.splitk_retire_spread(CNT, count_i, (TILES + tile) * NUM_CONSUMERS + consumer,
                                       S)

    @T.inline
    def store_tail(D, Dtail0, Dtail1, packed, m_st, n_st, consumer, warp_id, lane_id,
                   tid_in_wg):
        # a packed tile's last OUT_N % 64 columns: TAIL_TMA, one TMA box through the
        # consumer's tail staging tile (free once the last chunk's store has read it,
        # TAIL_SHARED, or once the previous tail's has, the chunks' stores since then may
        # still be reading); else guarded 4-byte stores from the registers
        if TAIL_TMA:
            if NUM_CONSUMERS == 1:
                W.store_packed_tail(D, Dtail0, packed, m_st, n_st, TMA_CHUNKS * 8, OUT_N // 8,
                                    TAIL_SINCE, warp_id, lane_id, tid_in_wg, 1 + consumer)
            else:
                if consumer == 0:
                    W.store_packed_tail(D, Dtail0, packed, m_st, n_st, TMA_CHUNKS * 8,
                                        OUT_N // 8, TAIL_SINCE, warp_id, lane_id, tid_in_wg,
                                        1 + consumer)
                else:
                    W.store_packed_tail(D, Dtail1, packed, m_st, n_st, TMA_CHUNKS * 8,
                                        OUT_N // 8, TAIL_SINCE, warp_id, lane_id, tid_in_wg,
                                        1 + consumer)
        else:
            W.store_packed_guarded(D, packed, m_st, n_st, TMA_CHUNKS * 8, OUT_N // 8, M_DIM,
                                   N_DIM, warp_id, lane_id)

    @T.inline
    def release(mma2tma, stage, tid_in_wg):
        # a consumer warpgroup's wgmmas are done reading `stage`: its empty barrier
        # (a cluster: in every CTA of it, whose multicasts write it)
        if CLUSTER > 1:
            W.release_stage_in_cluster(mma2tma, stage, tid_in_wg, CLUSTER)
        else:
            if tid_in_wg == 0:
                mma2tma.arrive(stage)

    # the kernel body; bias is None without BIAS (no bias operand)
    @T.inline
    def gemm(A, B, D, bias, WS, CNT):
        T.device_entry()
        bx = T.cta_id([NUM_CTAS])
        if CLUSTER > 1:
            rank, _unused = T.cta_id_in_cluster([CLUSTER, 1])  # this CTA's place in the cluster
        else:
            rank = T.meta_var(0)
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # consumers first, producer last
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        # tma2mma[s]: the producer thread arrives once per load into stage s
        #   (arrive.expect_tx for the whole (BLK_M + BLK_N) x 64 box pair, zero-filled edges
        #   included) and the TMA unit completes the bytes; every consumer thread waits.
        #   Initial phase 0; consumers wait from phase 0. CLUSTER=2: the bytes of the
        #   peer's B half complete on this CTA's barrier too (its multicast).
        # mma2tma[s]: thread 0 of each consumer warpgroup arrives (NUM_CONSUMERS arrivals;
        #   CLUSTER=2: of both CTAs, CLUSTER * NUM_CONSUMERS, half of them remote) once its
        #   wgmmas have finished reading stage s; the producer waits before reloading it.
        #   Initial phase 0; the producer waits from phase 1, which a fresh barrier counts
        #   as complete: every stage starts empty.
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", CLUSTER * NUM_CONSUMERS)
        tma2mma, mma2tma = stages.full, stages.empty
        if SK_CODE or S > 1:  # a half's count before ours
            arrivals = T.meta_var(pool.alloc((NUM_CONSUMERS,), "int32"))
        if BIAS_SMEM:
            # bias_full[b]: the producer's second warp, all 32 lanes, once buffer b holds the
            #   tile's bias; bias_empty[b]: lane 0 of each consumer warp once it has read it
            #   (initial phases as tma2mma / mma2tma: every buffer starts empty)
            bias_ring = T.meta_var(H.Ring(pool, BIAS_BUFS, "bias_full", 32, "bias_empty",
                                          NUM_CONSUMERS * 4))
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        if TMA_CHUNKS > 0 or SWAP_TMA:
            Dstage = T.meta_var(pool.alloc((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS),
                                           dtype, layout=D_layout))
        # TAIL_TMA: consumer c's tail staging tile (64 x TAIL_COLS, row-major, unswizzled)
        # after the staging tiles or, TAIL_SHARED, over Dstage[c, (TMA_CHUNKS - 1) % EPI_BUFS]
        if TAIL_SHARED:
            pool.move_base_to(TAIL_AT[0])
        if TAIL_TMA:
            Dtail0 = T.meta_var(pool.alloc((W.WGMMA_M, TAIL_COLS), dtype))
        else:
            Dtail0 = T.meta_var(None)
        if TAIL_SHARED and NUM_CONSUMERS > 1:
            pool.move_base_to(TAIL_AT[1])
        if TAIL_TMA and NUM_CONSUMERS > 1:
            Dtail1 = T.meta_var(pool.alloc((W.WGMMA_M, TAIL_COLS), dtype))
        else:
            Dtail1 = T.meta_var(None)
        if BIAS_SMEM:  # (no TAIL_TMA with an epilogue: nothing above moved the base back)
            Bias_s = T.meta_var(pool.alloc((BIAS_BUFS, BLK_N), H.ACC_DTYPE))
        pool.commit()

        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        if wg_id == PRODUCER:
            if tid_in_wg == 0:
                stages.init()
                if BIAS_SMEM:
                    bias_ring.init()
        if CLUSTER > 1:  # the peers signal these barriers: publish the inits cluster-wide
            W.publish_setup_cluster()
        else:
            W.publish_setup()
        if PDL:  # nothing above touched global memory: it overlapped the previous kernel
            # (a pair: after the cluster_sync, so the peer's barrier inits are published)
            P.wait()
            if PDL_TRIGGER == "start":  # "exit": the next grid launches as this one's exit
                P.launch_dependents()

        # every role walks the same tile sequence with its own copy of the scheduler state
        scheduler = ClusterPersistentScheduler2D(
            "ts", num_m_tiles=SPLIT_ROWS, num_n_tiles=N_TILES,
            num_clusters=NUM_CTAS // CLUSTER, l2_group_size=L2_GROUP)
        scheduler.init(bx // CLUSTER)


        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS if SPLIT_REGS else None,
                           increase=False):
            if BIAS_SMEM:
                # --- bias (producer's second warp): each tile's bias into a shared buffer,
                # one tile ahead at most, the tiles in the consumers' order ---
                if warp_id == 1:
                    bring = PipelineState(BIAS_BUFS, 1)
                    while walking(scheduler):
                        bias_ring.empty.wait(bring.stage, bring.phase, "producer")
                        W.load_bias_tile_smem(Bias_s, bring.stage, BLK_N, bias,
                                              scheduler.n_idx * BLK_N, N_DIM, lane_id)
                        bias_ring.full.arrive(bring.stage)  # each lane: its stores before
                        bring.advance()
                        scheduler.next_tile()

            # --- load (producer): one thread, PIPE_DEPTH slices ahead, across tiles ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                while walking(scheduler):
                    m_tile, k_first, k_count = T.meta_var(unit(scheduler))
                    m_st = T.meta_var((m_tile * CLUSTER + rank) * BLK_M if SWAP_AB
                                      else tok_start((m_tile * CLUSTER + rank) * BLK_M))
                    n_blk = T.meta_var(scheduler.n_idx * BLK_N)
                    n_st = T.meta_var(tok_start(n_blk) if SWAP_AB else n_blk)
                    for k in T.serial(k_count, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        if CLUSTER > 1:  # own tile; own share of the shared one
                            # (rows rank x SHARE.. of the MMA's B tile), multicast to every
                            # CTA of the cluster; SWAP_AB: the MMA's A operand is B's rows,
                            # its B operand A's
                            own_smem = T.meta_var(Asmem[ring.stage, :, :])
                            shared = T.meta_var(Bsmem)
                            at = T.meta_var(rank * SHARE)
                            srcs = T.meta_var((B, A) if SWAP_AB else (A, B))
                            own_st = T.meta_var(m_st)
                            share_st = T.meta_var(n_st + at)
                            k_st = T.meta_var(k_at(k_first, k) * BLK_K)
                            # even shares (a pair): no branch on the rank
                            if (SHARES == CLUSTER and LAST_SHARE == SHARE) or rank < SHARES - 1:
                                W.tma_load_multicast_b(
                                    own_smem, shared[ring.stage, at:at + SHARE, :], srcs[0],
                                    srcs[1], own_st, share_st, k_st, BLK_M, SHARE, BLK_K,
                                    BLK_N, tma2mma.ptr(ring.stage), CLUSTER_MASK)
                            elif rank == SHARES - 1:  # the last nonempty share
                                W.tma_load_multicast_b(
                                    own_smem, shared[ring.stage, at:at + LAST_SHARE, :], srcs[0],
                                    srcs[1], own_st, share_st, k_st, BLK_M, LAST_SHARE, BLK_K,
                                    BLK_N, tma2mma.ptr(ring.stage), CLUSTER_MASK)
                            else:  # past the shares: its own tile only (B_ROWS 0)
                                W.tma_load_multicast_b(
                                    own_smem, shared[ring.stage, 0:BLK_N_STEP, :], srcs[0],
                                    srcs[1], own_st, share_st, k_st, BLK_M, 0, BLK_K,
                                    BLK_N, tma2mma.ptr(ring.stage), CLUSTER_MASK)
                        elif SWAP_AB:  # the MMA's A operand is B's rows, its B operand A's
                            H.tma_load_tiles(Asmem[ring.stage, :, :],
                                             Bsmem[ring.stage, :, :], B, A, m_st, n_st,
                                             k_at(k_first, k) * BLK_K, BLK_M, BLK_N, BLK_K,
                                             tma2mma.ptr(ring.stage), HINTS, HINTS)
                        else:
                            H.tma_load_tiles(Asmem[ring.stage, :, :],
                                             Bsmem[ring.stage, :, :], A, B, m_st, n_st,
                                             k_at(k_first, k) * BLK_K, BLK_M, BLK_N, BLK_K,
                                             tma2mma.ptr(ring.stage), HINTS, HINTS)
                        ring.advance()
                    scheduler.next_tile()
                if SK_CODE:
                    # --- load (stream-K): this unit's pieces, the consumers' sequence ---
                    if RUNTIME:  # run-time counts: computed once
                        iters: T.int32 = PLAN.iters
                    else:
                        iters = T.meta_var(PLAN.iters)
                    if RUNTIME:  # run-time counts: computed once
                        units: T.int32 = PLAN.units
                    else:
                        units = T.meta_var(PLAN.units)
                    if bx < units:
                        it0 = T.meta_var(sk_it0(iters, units, bx))
                        it1 = T.meta_var(sk_it1(iters, units, bx))
                        tile = T.meta_var(sk_walk())  # the pieces' tile coordinates
                        for q in T.serial(sk_tiles(it0, it1), annotations=H.ROLLED):
                            j = T.meta_var(sk_t0(it0, it1) + q)
                            tile.init(PLAN.dp_tiles + j)  # the piece's tile
                            for k in T.serial(sk_steps(it0, it1, j), annotations=H.ROLLED):
                                mma2tma.wait(ring.stage, ring.phase, "producer")
                                # (SWAP_AB: the MMA's A operand is B's rows, its B A's)
                                H.tma_load_tiles(Asmem[ring.stage, :, :],
                                                 Bsmem[ring.stage, :, :],
                                                 B if SWAP_AB else A, A if SWAP_AB else B,
                                                 tile.m_idx * BLK_M, tile.n_idx * BLK_N,
                                                 (sk_k0(it0, it1, j) + k) * BLK_K, BLK_M,
                                                 BLK_N, BLK_K, tma2mma.ptr(ring.stage),
                                                 HINTS, HINTS)
                                ring.advance()

        # (a comparison, not the (start, stop) form, which 0.27.0.post1 cannot lower)
        with WarpgroupRole(wg_id < NUM_CONSUMERS, True,
                           regs=CONSUMER_REGS if SPLIT_REGS else None, increase=True):
            consumer = T.meta_var(wg_id)  # owns rows [64*consumer, 64*consumer + 64)
            row0 = T.meta_var(consumer * W.WGMMA_M)
            acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)  # the accumulator: registers
            packed = T.alloc_local((PACKED_REGS,), "uint32")  # the previous tile, 2 x 16-bit
            if HAS_BIAS:  # this tile's bias values, fp32: 2 per 8-column block
                # (SWAP_AB: one per fragment row of the thread, 2)
                bvals = T.meta_var(T.alloc_local((2 if SWAP_BIAS else BLK_N // 4,),
                                                 H.ACC_DTYPE))
            if BIAS_SMEM:
                bring = PipelineState(BIAS_BUFS, 0)
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            W.encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))
            W.encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0      # stage of the slice whose wgmmas may still be running
            pending: T.int32 = 0   # 1 while `packed` holds a tile not yet stored
            prev_m: T.int32 = 0    # where that tile goes
            prev_n: T.int32 = 0
            while walking(scheduler):
                m_tile, k_first, k_count = T.meta_var(unit(scheduler))
                m_st = T.meta_var((m_tile * CLUSTER + rank) * BLK_M if SWAP_AB
                                  else tok_start((m_tile * CLUSTER + rank) * BLK_M))
                # D's columns of this tile (SWAP_AB: its tokens, D's rows)
                n_out = T.meta_var(scheduler.n_idx * OUT_N)
                n_st = T.meta_var(tok_start(n_out) if SWAP_AB else n_out)
                for k in T.serial(k_count, annotations=H.ROLLED):
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
                                store_tail(D, Dtail0, Dtail1, packed, prev_m + row0, prev_n,
                                           consumer, warp_id, lane_id, tid_in_wg)
                            if SWAP_TMA:  # D's transpose: weight rows prev_m.., tokens prev_n..
                                W.store_packed_tile_transposed(D, Dstage, consumer, packed,
                                                               prev_m + row0, prev_n, BLK_N,
                                                               EPI_BUFS, warp_id, lane_id,
                                                               tid_in_wg, 1 + consumer)
                            pending = 0
                    # slice k-1 is done: its stage goes back to the producer
                    W.mma_wait(1)
                    if k > 0:
                        release(mma2tma, held, tid_in_wg)
                    held = ring.stage
                    ring.advance()
                if HAS_BIAS and S == 1:  # (S > 1: the reduction adds it)
                    # the bias loads go out before the last wait, in flight under the last
                    # wgmmas (when they followed it, ptxas spread them through the math
                    # after the wait); the fence (an asm reading and writing each value)
                    # keeps them on this side of it
                    if SWAP_BIAS:
                        W.load_bias_rows(bvals, bias, m_st + row0, N_DIM, warp_id, lane_id)
                        W.fence_operands(bvals, 2)
                    else:
                        W.load_bias_fragment(bvals, BLK_N, bias, n_st, N_DIM, lane_id)
                        W.fence_operands(bvals, BLK_N // 4)
                W.mma_wait(0)  # the tile's last slice is done too
                release(mma2tma, held, tid_in_wg)
                W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the wait
                if S > 1:
                    split_fixup(D, bias, WS, CNT, arrivals, acc, scheduler, m_tile, m_st, n_st,
                                consumer, tid_in_wg)
                if BIAS_SMEM:
                    # --- the fused epilogue, the tile's bias from its shared buffer; then
                    # the buffer goes back to the producer's bias warp ---
                    bias_ring.full.wait(bring.stage, bring.phase, "consumer")
                    W.epilogue_bias_act_smem(acc, BLK_N, Bias_s, bring.stage, lane_id,
                                             ACT_FN)
                    T.cuda.warp_sync()  # the warp's reads are done before lane 0 says so
                    if lane_id == 0:
                        bias_ring.empty.arrive(bring.stage)
                    bring.advance()
                if HAS_EPI and S == 1:
                    # --- the fused epilogue, on the fp32 accumulators, before the cast ---
                    if SWIGLU_ON:
                        W.epilogue_swiglu(acc, BLK_N)
                    if SWAP_BIAS:
                        W.epilogue_bias_act_rows(acc, BLK_N, bvals, ACT_FN)
                    elif BIAS_ACT:
                        W.epilogue_bias_act(acc, BLK_N, bvals if HAS_BIAS else None,
                                            ACT_FN)
                if S > 1:
                    pass  # D was stored by the reduction
                elif SWAP_TMA:
                    # D's transpose, packed; stored behind the next tile's wgmmas
                    W.pack_fragment(packed, acc, PACKED_REGS, dtype)
                    pending = 1
                    prev_m = m_st
                    prev_n = n_st
                elif SWAP_AB:
                    # D's transpose: fragment rows are columns n_st.. of D (B's rows),
                    # fragment columns rows m_st.. of D (the tokens); element stores
                    W.store_fragment_transposed_guarded(D, acc, m_st + row0, n_st, BLK_N,
                                                        M_DIM, N_DIM, warp_id, lane_id)
                elif OUT_F32:
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
                    store_tail(D, Dtail0, Dtail1, packed, prev_m + row0, prev_n, consumer,
                               warp_id, lane_id, tid_in_wg)
                if SWAP_TMA:
                    W.store_packed_tile_transposed(D, Dstage, consumer, packed, prev_m + row0,
                                                   prev_n, BLK_N, EPI_BUFS, warp_id, lane_id,
                                                   tid_in_wg, 1 + consumer)
            if SK_CODE:
                # --- stream-K: this unit's pieces, after the data-parallel tiles ---
                if RUNTIME:  # run-time counts: computed once
                    iters: T.int32 = PLAN.iters
                else:
                    iters = T.meta_var(PLAN.iters)
                if RUNTIME:  # run-time counts: computed once
                    units: T.int32 = PLAN.units
                else:
                    units = T.meta_var(PLAN.units)
                if bx < units:
                    it0 = T.meta_var(sk_it0(iters, units, bx))
                    it1 = T.meta_var(sk_it1(iters, units, bx))
                    tile = T.meta_var(sk_walk())  # the pieces' tile coordinates
                    for q in T.serial(sk_tiles(it0, it1), annotations=H.ROLLED):
                        j = T.meta_var(sk_t0(it0, it1) + q)  # the piece's stream-K tile
                        tile.init(PLAN.dp_tiles + j)
                        sk_m = T.meta_var(tile.m_idx * BLK_M)
                        sk_n = T.meta_var(tile.n_idx * BLK_N)
                        for k in T.serial(sk_steps(it0, it1, j), annotations=H.ROLLED):
                            tma2mma.wait(ring.stage, ring.phase, "consumer")
                            # --- compute: the piece's K steps; its first overwrites ---
                            W.mma_fence()
                            W.wgmma_tile(acc,
                                         W.desc_advance(desc_a[0], ring.stage * A_STAGE_BYTES)
                                         + T.Cast("uint64", consumer * W.DESC_M64_STEP),
                                         W.desc_advance(desc_b[0], ring.stage * B_STAGE_BYTES),
                                         k > 0, 1, BLK_N, dtype)
                            W.mma_commit()
                            W.mma_wait(1)
                            if k > 0:
                                release(mma2tma, held, tid_in_wg)
                            held = ring.stage
                            ring.advance()
                        W.mma_wait(0)
                        release(mma2tma, held, tid_in_wg)
                        W.fence_operands(acc, ACC_REGS)
                        # --- publish: the partial half -> slab bx + j, then count it (v11's
                        # "last" protocol: a counter per 64-row half of the tile) ---
                        publish_slab(WS, SK.slab(bx, j), consumer * HALF, acc, tid_in_wg)
                        T.cuda.warpgroup_sync(1 + consumer)  # slab stores before the count
                        if tid_in_wg == 0:
                            H.splitk_count_arrival(
                                arrivals, consumer,
                                CNT.ptr_to([SK.counter(j, consumer, NUM_CONSUMERS)]))
                        T.cuda.warpgroup_sync(1 + consumer)  # the count (and acquire) to all
                        pieces = T.meta_var(sk_pieces(iters, units, j))
                        if H.splitk_is_last(arrivals, consumer, pieces):
                            # --- reduce: every piece is in; their slabs in K order ---
                            reduce_slabs(WS, SK.slab(sk_first(iters, units, j), j), pieces,
                                         consumer * HALF, acc, tid_in_wg)
                            if SWAP_AB:  # D's transpose, as the data-parallel tiles store it
                                W.store_fragment_transposed_guarded(D, acc, sk_m + row0, sk_n,
                                                                    BLK_N, M_DIM, N_DIM,
                                                                    warp_id, lane_id)
                            else:
                                W.pack_fragment(packed, acc, PACKED_REGS, dtype)
                            if TMA_CHUNKS > 0:
                                W.store_packed_tile(D, Dstage, consumer, packed, sk_m + row0,
                                                    sk_n, TMA_CHUNKS * W.EPI_COLS, EPI_BUFS,
                                                    warp_id, lane_id, tid_in_wg, 1 + consumer)
                            if TAIL_J > 0:
                                W.store_packed_guarded(D, packed, sk_m + row0, sk_n,
                                                       TMA_CHUNKS * 8, OUT_N // 8, M_DIM,
                                                       N_DIM, warp_id, lane_id)
                            if tid_in_wg == 0:  # every piece counted: zero for the next launch
                                CNT[SK.counter(j, consumer, NUM_CONSUMERS)] = 0
            # --- free: SMEM is released at exit, so the last TMA store must have read it ---
            if tid_in_wg == 0:
                H.store_wait(0)

        if CLUSTER > 1:
            # the peers multicast into this CTA's SMEM and arrive on its barriers until they
            # are done: no CTA may exit (releasing its SMEM) before all are
            T.cuda.cluster_sync()

    if S > 1 and BIAS:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), dtype), B: T.Buffer((N_DIM, K_DIM), dtype),
                   D: T.Buffer((M_DIM, N_DIM), dtype), bias: T.Buffer((N_DIM,), BIAS),
                   WS: T.Buffer((S, WS_TILES, BLK_M * BLK_N), H.ACC_DTYPE),
                   CNT: T.Buffer((CNT_LEN,), "int32")):
            gemm(A, B, D, bias, WS, CNT)
    elif S > 1:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), dtype), B: T.Buffer((N_DIM, K_DIM), dtype),
                   D: T.Buffer((M_DIM, N_DIM), dtype),
                   WS: T.Buffer((S, WS_TILES, BLK_M * BLK_N), H.ACC_DTYPE),
                   CNT: T.Buffer((CNT_LEN,), "int32")):
            gemm(A, B, D, None, WS, CNT)
    elif STREAM_K:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), dtype), B: T.Buffer((N_DIM, K_DIM), dtype),
                   D: T.Buffer((M_DIM, N_DIM), dtype),
                   WS: T.Buffer((SK.workspace_slabs(SM_COUNT), BLK_M * BLK_N), H.ACC_DTYPE),
                   CNT: T.Buffer((SK.counters(SM_COUNT),), "int32")):
            gemm(A, B, D, None, WS, CNT)
    elif BIAS:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), dtype), B: T.Buffer((NB_DIM, K_DIM), dtype),
                   D: T.Buffer((M_DIM, N_DIM), D_DTYPE), bias: T.Buffer((N_DIM,), BIAS)):
            gemm(A, B, D, bias, None, None)
    elif HAS_EPI:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), dtype), B: T.Buffer((NB_DIM, K_DIM), dtype),
                   D: T.Buffer((M_DIM, N_DIM), D_DTYPE)):
            gemm(A, B, D, None, None, None)
    else:
        @T.prim_func
        def kernel(A: T.Buffer((M_DIM, K_DIM), dtype), B: T.Buffer((N_DIM, K_DIM), dtype),
                   D: T.Buffer((M_DIM, N_DIM), dtype)):
            gemm(A, B, D, None, None, None)

    return P.with_launch(kernel, PDL and PDL_ATTR, CLUSTER)
