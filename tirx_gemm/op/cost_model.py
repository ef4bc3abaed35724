"""matmul's cost model of the H200 (sm_90a): each candidate's predicted time at a shape, and
their ranking. Pure Python: no torch, no TVM. tirx_gemm.op.rules decides with it.

Candidates: v12's tiles ("BMxBN", or "BMxBNc2" for a CTA pair), v9 and v10. What decides
is how many of the SMs get work and how long each works:

    tiles  = ceil(M / BLK_M) * ceil(N / BLK_N)            output tiles of the candidate
    waves  = ceil(tiles / slots)                          slots: 132 CTAs (v12), 66 pairs (v9)
    steps  = waves * ceil(K / 64)                         K steps on the busiest CTA
    time   = s_c * steps + e_c * waves + f_c              microseconds

``s_c`` is the time per K step of one CTA, ``e_c`` the per-tile cost (ring fill and epilogue),
``f_c`` the launch and the last store: a 1.2-wave shape pays two waves. No candidate is
predicted faster than its operand bytes at the sustained HBM rate (:func:`hbm_floor`).
The figures are data: ``chooser_h200.json`` beside this file, fitted by
``scripts/fit_chooser.py`` to the records of lab/cost_model_fit (bf16; fp16 uses them too).
The split model (:func:`predict_split`) rates v12's K splits: a wave of units, then the
reduction of their fp32 slabs.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path

from tirx_gemm import spec

PARAMS_FILE = Path(__file__).with_name("chooser_h200.json")
SMS_H200 = spec.SM_COUNT["sm_90a"]
BLK_K = 64
V9 = "v9"
V10 = "v10"
V12 = "v12"
V10_TILE = (128, 128)  # a consumer warpgroup's tile (v10's default BLK_M = 128)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def name(bm: int, bn: int, cluster: int = 1) -> str:
    """A v12 candidate's name: "BMxBN", or "BMxBNc2" for a CTA pair (CLUSTER=2)."""
    return f"{bm}x{bn}" + ("" if cluster == 1 else f"c{cluster}")


@lru_cache(maxsize=None)
def tile(cand: str) -> tuple[int, int, int]:
    """(BLK_M, BLK_N, CLUSTER) of a v12 candidate named by :func:`name`."""
    dims, _, cluster = cand.partition("c")
    bm, bn = (int(x) for x in dims.split("x"))
    return bm, bn, int(cluster or 1)


@lru_cache(maxsize=1)
def _document() -> dict:
    return json.loads(PARAMS_FILE.read_text())


@lru_cache(maxsize=1)
def params() -> dict:
    """{candidate: (s, e, f)} from chooser_h200.json (candidate "v9", "v10" or "BMxBN"); read
    once (matmul.variants asks for it thousands of times per layer). Do not modify."""
    return {k: tuple(float(x) for x in v) for k, v in _document()["candidates"].items()}


_params_cache_clear = params.cache_clear


def _clear() -> None:
    _document.cache_clear()
    _params_cache_clear()
    _rank.cache_clear()  # (defined below: a pure function of the figures and the shape)


params.cache_clear = _clear  # scripts/fit_chooser.py after a refit

# A short kernel launched with PDL starts its prologue while the one before drains: the
# fitted saving ("pdl_saving_us") counts for a v12 kernel predicted at most this long
# (longer ones gained nothing or lost: lab/pdl_exit_trigger).
PDL_MAX_US = 16.0


def pdl_saving() -> float:
    """The fitted time PDL saves a short v12 kernel, in microseconds (0 if unfitted)."""
    return float(_document().get("pdl_saving_us", 0.0))


def geometry(cand: str, sm_count: int) -> tuple[int, int, int]:
    """(tile rows, tile columns, slots) of a candidate on a GPU of ``sm_count`` SMs: a
    CTA pair (v9, v10, v12's CLUSTER=2) is one tile of twice the rows on one of
    sm_count // 2 slots (v10: each CTA's two warpgroups take turns on 128x128 tiles)."""
    if cand == V9:
        return 256, 256, sm_count // 2
    if cand == V10:
        return 2 * V10_TILE[0], V10_TILE[1], sm_count // 2
    bm, bn, cluster = tile(cand)
    return cluster * bm, bn, sm_count // cluster


def shape_terms(cand: str, M: int, N: int, K: int, sm_count: int) -> tuple[int, int, int]:
    """(steps, waves, tiles) of a candidate at a shape."""
    bm, bn, slots = geometry(cand, sm_count)
    tiles = _ceil_div(M, bm) * _ceil_div(N, bn)
    waves = _ceil_div(tiles, slots)
    return waves * _ceil_div(K, BLK_K), waves, tiles


def _predict_plain(cand: str, M: int, N: int, K: int, sm_count: int) -> float:
    s, e, f = params()[cand]
    steps, waves, _ = shape_terms(cand, M, N, K, sm_count)
    return s * steps + e * waves + f


# The card's HBM bandwidth over the fitted card's (tirx_gemm.op.cards): the model's one
# explicit bandwidth term, the sustained HBM rate fitted on the H200, scales by it.
_HBM_SCALE: ContextVar[float] = ContextVar("hbm_scale", default=1.0)


@contextmanager
def bandwidth_scale(scale: float):
    """Within the block, the model's HBM rate is the fitted one times ``scale``."""
    token = _HBM_SCALE.set(scale)
    try:
        yield
    finally:
        _HBM_SCALE.reset(token)


def hbm_rate(fit: dict) -> float:
    """The split fit's sustained HBM rate in TB/s on the card chosen for."""
    return fit["hbm_tb_s"] * _HBM_SCALE.get()


def hbm_floor(M: int, N: int, K: int, elem_bytes: int = 2) -> float:
    """The least time in microseconds of a data-parallel kernel at MxNxK: the split fit's
    fixed cost plus every operand byte once at its sustained HBM rate (0 without a split
    fit). One floor for every candidate; ties on it rank by the time without it."""
    fit = _document().get("split")
    if not fit:
        return 0.0
    return fit["f"] + (M * K + N * K + M * N) * elem_bytes / 1e6 / hbm_rate(fit)


def uses_pdl(cand: str, M: int, N: int, K: int, sm_count: int = SMS_H200) -> bool:
    """Whether a candidate is built with PDL at this shape: a v12 tile, one CTA or a pair,
    predicted (without it) at most PDL_MAX_US (v9 and v10 are built without it)."""
    return (cand not in (V9, V10)
            and _predict_plain(cand, M, N, K, sm_count) <= PDL_MAX_US)


def predict(cand: str, M: int, N: int, K: int, sm_count: int = SMS_H200,
            pdl: bool = True) -> float:
    """The model's time in microseconds of ``cand`` at MxNxK (with PDL where it is used,
    unless ``pdl`` is False: a kernel built without it, e.g. a fused epilogue's)."""
    t = max(_predict_plain(cand, M, N, K, sm_count), hbm_floor(M, N, K))
    return t - pdl_saving() if pdl and uses_pdl(cand, M, N, K, sm_count) else t


def clustered(cand: str) -> bool:
    """Whether a candidate runs CTA pairs (v9, v10, v12's CLUSTER=2): only on an even SM
    pool."""
    return cand in (V9, V10) or tile(cand)[2] > 1


# v10 is a candidate only in its band (K past the short-K rule's 512, up to 2560, and a
# 128x128 tile per SM at least), in v9's place: there it ran ahead of v9 at every shape
# measured, which v9's figures miss (lab/v10_ping_pong_band).
PINGPONG_MAX_K = 512
PINGPONG_BAND_MAX_K = 2560


def v10_tiles(M: int, N: int) -> int:
    """How many of v10's V10_TILE output tiles an MxN result has (each a warpgroup's turn)."""
    bm, bn = V10_TILE
    return _ceil_div(M, bm) * _ceil_div(N, bn)


def pingpong_band(M: int, N: int, K: int, sm_count: int = SMS_H200) -> bool:
    """Whether v10's ping-pong is a candidate of the model at MxNxK: K past PINGPONG_MAX_K
    up to PINGPONG_BAND_MAX_K, and at least as many of its 128x128 tiles as SMs."""
    return PINGPONG_MAX_K < K <= PINGPONG_BAND_MAX_K and v10_tiles(M, N) >= sm_count


# A K whose rows are not whole ROW_ALIGN_BYTES lines: every TMA box row straddles two L2
# lines, which the fit (K a multiple of 64) never saw. Against the model's error at an aligned
# K, one-CTA tiles ran MISALIGNED_SLOWDOWN["one_cta"] times slower and CTA pairs (B shared by
# multicast, v9 and v10 too) MISALIGNED_SLOWDOWN["pair"] (the H200's plain v12 kernels:
# lab/cost_model_error_classes, model_error.py). tirx_gemm.op.rules ranks by it at such a K.
ROW_ALIGN_BYTES = 128
MISALIGNED_SLOWDOWN = {"one_cta": 1.33, "pair": 1.07}


def misaligned_rows(K: int, elem_bytes: int = 2) -> bool:
    """Whether rows of K elements are not whole 128-byte lines (TMA boxes straddle)."""
    return (K * elem_bytes) % ROW_ALIGN_BYTES != 0


def misaligned_slowdown(cand: str, K: int) -> float:
    """What the model's time of ``cand`` is multiplied by at this K (1.0 where K's rows are
    whole lines)."""
    if not misaligned_rows(K):
        return 1.0
    return MISALIGNED_SLOWDOWN["pair" if clustered(cand) else "one_cta"]


def rank(M: int, N: int, K: int, sm_count: int = SMS_H200,
         pdl: bool = True) -> tuple[tuple[float, str], ...]:
    """Every candidate but v12's CTA pairs with its predicted time, fastest first (v9 and
    v10 only on an even number of SMs; in :func:`pingpong_band` v10, elsewhere v9). The
    pairs enter by the misaligned-row rule alone (tirx_gemm.op.rules)."""
    return _rank(M, N, K, sm_count, pdl, _HBM_SCALE.get())


@lru_cache(maxsize=1 << 16)
def _rank(M, N, K, sm_count, pdl, _scale) -> tuple[tuple[float, str], ...]:
    ranked = sorted((predict(c, M, N, K, sm_count, pdl), _predict_plain(c, M, N, K, sm_count), c)
                    for c in params()
                    if (c == V9 or c == V10) and (c == V10) == pingpong_band(M, N, K, sm_count)
                    and sm_count % 2 == 0 or not clustered(c))
    return tuple((t, c) for t, _, c in ranked)  # ties on the floor: least time without it


rank.cache_clear = _rank.cache_clear  # (callers that refit or patch the figures clear it)


# v9's figures were fitted beside v12 kernels slower than matmul now builds them: v9 counts
# this much more when ranked against v12 (lab/cost_model_fit). v10 keeps its place within
# PREFER_PAIR_WITHIN of the fastest (the fit's typical error is a few percent).
V9_HANDICAP = 0.05
PREFER_PAIR_WITHIN = 0.03


def best(M: int, N: int, K: int, sm_count: int = SMS_H200) -> str:
    """The candidate the model ranks first: "v9", "v10" or a one-CTA "BMxBN" of v12, with
    v9's handicap (V9_HANDICAP) and v10's margin (PREFER_PAIR_WITHIN)."""
    # a stable sort on the time alone: ties keep rank's order (on the HBM floor)
    ranked = [(t * (1 + V9_HANDICAP) if c == V9 else t, c) for t, c in rank(M, N, K, sm_count)]
    ranked.sort(key=lambda tc: tc[0])
    top, pick = ranked[0]
    pair = next(((t, c) for t, c in ranked if c == V10), None)
    if pair is not None and pair[0] <= top * (1 + PREFER_PAIR_WITHIN):
        pick = pair[1]
    return pick


def rank_misaligned(M: int, N: int, K: int, sm_count: int = SMS_H200,
                    pairs_only: bool = False) -> list[tuple[float, str, str]]:
    """At a K whose rows are not whole lines: [(time, candidate, what runs)], fastest first,
    by the model times misaligned_slowdown, where a one-CTA tile whose CTA pair is in the menu
    is rated as that pair (the misaligned-row rules run it so: M past one tile, an even SM
    count) and v9 with V9_HANDICAP; a candidate is "v9", "v10" or a one-CTA "BMxBN".
    ``pairs_only``: the v12 tiles that run as pairs alone (where clusters of four take them)."""
    out = []
    for t, c in rank(M, N, K, sm_count):
        runs = c
        if c not in (V9, V10):
            bm, bn, _ = tile(c)
            pair = name(bm, bn, 2)
            runs = pair if pair in params() and M > bm and sm_count % 2 == 0 else c
            t = predict(runs, M, N, K, sm_count)
        t *= misaligned_slowdown(runs, K) * (1 + V9_HANDICAP if c == V9 else 1)
        if not pairs_only or (c != runs and c not in (V9, V10)):
            out.append((t, c, runs))
    return sorted(out)


def best_tile(M: int, N: int, K: int, sm_count: int = SMS_H200, n_step: int = 1) -> str:
    """The fastest one-CTA v12 tile ("BMxBN") the model predicts without PDL, v9 and v10
    left out, its BLK_N a multiple of ``n_step``: a fused epilogue's tile (M, N, K are the
    kernel's GEMM; the model has no term for the epilogue's own cost)."""
    return next(c for _, c in rank(M, N, K, sm_count, pdl=False)
                if not clustered(c) and tile(c)[1] % n_step == 0)


def last_wave_fill(tiles: int, sm_count: int = SMS_H200) -> float:
    """How full the last wave of ``tiles`` one-CTA tiles on ``sm_count`` SMs is (0-1]."""
    return tiles / (_ceil_div(tiles, sm_count) * sm_count)


def ring_stages(bm: int, bn: int) -> int:
    """Operand stages (BLK_K deep) of a bm x bn tile that fit a CTA's shared memory."""
    return spec.ring_stages((bm + bn) * BLK_K * 2)


EPI_COLS = 64  # v12's TMA-store chunk: one 128-byte swizzle row of 16-bit D (W.EPI_COLS)
RING_DEPTH_MAX = 16  # v12's default ring, at most this many stages (its AUTO_DEPTH_MAX)


def staging_bytes(bm: int, bn: int, tail_tma: bool = False) -> int:
    """Shared memory of v12's epilogue staging for a plain one-CTA bm x bn tile of 16-bit
    D: per consumer warpgroup (bm / 64 of them) a 64x64 tile, two when the tile's whole
    64-column chunks are even in number, none below 64 columns; ``tail_tma`` adds a 64 x
    (bn % 64) tile per warpgroup unless that would cost the ring a stage and there is a
    chunk's tile to lie over (the builder's TAIL_SHARED)."""
    consumers, chunks = bm // 64, bn // EPI_COLS
    out = consumers * (2 if chunks % 2 == 0 else 1) * 64 * EPI_COLS * 2 if chunks else 0
    tail = consumers * 64 * (bn % EPI_COLS) * 2 if tail_tma else 0
    stage = (bm + bn) * BLK_K * 2
    if tail and chunks and _depth(stage, out + tail) < _depth(stage, out):
        tail = 0  # over the last chunk's staging tile
    return out + tail


def _depth(stage_bytes: int, staging: int) -> int:
    return min(RING_DEPTH_MAX, spec.ring_stages(stage_bytes, staging))


def ring_depth(bm: int, bn: int, tail_tma: bool = False) -> int:
    """v12's default ring depth of a plain one-CTA bm x bn tile (sm_90a)."""
    return _depth((bm + bn) * BLK_K * 2, staging_bytes(bm, bn, tail_tma))


# The split model: time = f + r * slab_kb + max(hbm_mb / hbm_tb_s, u * unit_kb), fitted to
# v12's split kernels ("split" in chooser_h200.json; about 8% RMS: lab/split_k_deep_k).
# 64x32 units ran well behind it and 128x256 units did not fit it: neither is a candidate.
SPLIT_TILES = ((64, 64), (64, 128), (128, 64), (128, 128))
SPLIT_MIN_K_STEPS = 8     # K steps per unit at least (a unit's ring fill and slab)
SPLIT_MAX = 64            # SPLIT_K at most: splitk.MAX_SPLIT_SPREAD (a test keeps them equal)


def split_count(max_split: int, k_tiles: int) -> int:
    """The split of ``k_tiles`` K steps into at most ``max_split`` units: the largest S
    that divides the K steps, when it keeps at least half of max_split, else max_split
    (uneven unit ranges ran up to a sixth slower: lab/split_k_deep_k)."""
    if max_split < 2:
        return max_split
    even = max(s for s in range(1, max_split + 1) if k_tiles % s == 0)
    return even if 2 * even >= max_split else max_split


def split_terms(bm: int, bn: int, split: int, M: int, N: int,
                K: int) -> tuple[float, float, float]:
    """(slab kB, HBM MB, unit kB) of a split kernel: the split model's terms, in thousands
    and millions of bytes."""
    steps = _ceil_div(_ceil_div(K, BLK_K), split)
    return (bm * bn * 4 / 1e3, (M * K + N * K + M * N) * 2 / 1e6,
            steps * (bm + bn) * BLK_K * 2 / 1e3)


def predict_split(bm: int, bn: int, split: int, M: int, N: int, K: int) -> float | None:
    """The split model's time in microseconds (None when chooser_h200.json has no fit)."""
    fit = _document().get("split")
    if not fit:
        return None
    slab, hbm, unit = split_terms(bm, bn, split, M, N, K)
    return fit["f"] + fit["r"] * slab + max(hbm / hbm_rate(fit), fit["u"] * unit)


def best_split(M: int, N: int, K: int, sm_count: int = SMS_H200):
    """(predicted us, BLK_M, BLK_N, S) of the fastest SPLIT_TILES split the model sees at
    this shape (S = split_count(min(SMs // tiles, K steps // SPLIT_MIN_K_STEPS,
    SPLIT_MAX)), at least 2: one wave of units, all resident), or None."""
    k_tiles = _ceil_div(K, BLK_K)
    out = []
    for bm, bn in SPLIT_TILES:
        tiles = _ceil_div(M, bm) * _ceil_div(N, bn)
        split = split_count(min(sm_count // tiles, k_tiles // SPLIT_MIN_K_STEPS, SPLIT_MAX),
                            k_tiles)
        if split >= 2:
            t = predict_split(bm, bn, split, M, N, K)
            if t is not None:
                out.append((t, bm, bn, split))
    return min(out) if out else None


# swap-AB splits past decode (tirx_gemm.op.rules' K-split rule): the tokens in the fewest
# pieces (of at most 256, a multiple of 8, 56 taken as 64: it ran behind 64, lab/split_k_decode)
# up to WIDE_SWAP_MAX_M; a unit needs a ring of WIDE_SWAP_MIN_STAGES (lab/split_k_decode). The
# step of 8 (not 16): lab/cost_model_error_classes, suites/token_step_ab.json (H100 A/B)
WIDE_SWAP_MAX_M = 512
WIDE_SWAP_STEP = 8
WIDE_SWAP_ROWS = (64, 128)
WIDE_SWAP_MIN_STAGES = 5


def wide_swap_tokens(M: int, extra_pieces: int = 0) -> int:
    """The token tile of a swap-AB split at M tokens: M cut into the fewest pieces of at
    most 256 (plus ``extra_pieces``), each rounded up to WIDE_SWAP_STEP (56 to 64)."""
    pieces = _ceil_div(M, 256) + extra_pieces
    tokens = _ceil_div(_ceil_div(M, pieces), WIDE_SWAP_STEP) * WIDE_SWAP_STEP
    return 64 if tokens == 56 else tokens


def wide_swap_token_tiles(M: int) -> tuple[int, ...]:
    """The token tiles a swap-AB split past decode may take: the fewest pieces, or one more."""
    return tuple(wide_swap_tokens(M, extra) for extra in (0, 1))


def best_wide_swap_split(M: int, N: int, K: int, sm_count: int, decode_max_m: int):
    """(predicted us, BLK_M, token tile, S) of the fastest swap-AB split the split model
    sees past decode (``decode_max_m`` < M <= WIDE_SWAP_MAX_M tokens), or None outside."""
    if not decode_max_m < M <= WIDE_SWAP_MAX_M:
        return None
    k_tiles = _ceil_div(K, BLK_K)
    out = []
    for tokens in wide_swap_token_tiles(M):
        for bm in WIDE_SWAP_ROWS:
            if ring_stages(bm, tokens) < WIDE_SWAP_MIN_STAGES:
                continue
            tiles = _ceil_div(N, bm) * _ceil_div(M, tokens)
            split = split_count(min(sm_count // tiles, k_tiles // SPLIT_MIN_K_STEPS,
                                    SPLIT_MAX), k_tiles)
            if split >= 2:
                t = predict_split(bm, tokens, split, M, N, K)
                if t is not None:
                    out.append((t, bm, tokens, split))
    return min(out) if out else None


def tail_tma(bm: int, bn: int) -> bool:
    """Whether a plain one-CTA tile stores its last bn % 64 columns by TMA (TAIL_TMA): wider
    than one chunk, and its tail has a staging tile of its own or lies over one of two the
    chunks alternate (over an odd chunk's only tile it ran behind: lab/tail_tma_store)."""
    if bn <= EPI_COLS or bn % EPI_COLS == 0:
        return False
    own = staging_bytes(bm, bn, True) > staging_bytes(bm, bn)
    return own or (bn // EPI_COLS) % 2 == 0
