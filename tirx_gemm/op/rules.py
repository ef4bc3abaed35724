"""What matmul runs for a shape, and why: one ordered list of rules, :data:`RULES`.

Each rule is a :class:`Rule`: a name, the study it came from (``lab/<study>/``), a condition
on the shape (and on the kernel picked so far), an effect that returns new builder keywords,
and a one-line why. :func:`choose` walks the list: the first "pick" rule that applies picks
the step and its tile; every "adjust" rule after it that applies changes the keywords.
:func:`explain` and ``tirx-gemm choose M,N,K`` print the same walk, one line per rule.
Pure Python (no TVM; torch only if imported, for the card); the predicted times come from tirx_gemm.op.cost_model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from tirx_gemm import epilogue as E
from tirx_gemm import registry, splitk
from tirx_gemm.op import cards
from tirx_gemm.op import cost_model as cm
from tirx_gemm.op.cost_model import (BLK_K, ROW_ALIGN_BYTES, SMS_H200, V9, V10, V12,  # noqa: F401
                                     WIDE_SWAP_MAX_M, WIDE_SWAP_MIN_STAGES, WIDE_SWAP_ROWS,
                                     WIDE_SWAP_STEP, _ceil_div, last_wave_fill, misaligned_rows,
                                     tail_tma, wide_swap_token_tiles, wide_swap_tokens)
from tirx_gemm.op.keywords import (CLUSTER_SIZE, DATA_PARALLEL, EPILOGUE_STEPS, MENU_ARCHES,
                                   PINGPONG, SPLIT_K, TILE_MENU, V9_CLUSTER_TILE, V11_L2_GROUP,
                                   _check_problem, _menu_split, _pool, _registered, dtype_name, epilogue_picks,
                                   epilogue_picks_why, runtime_m, step_kwargs)
from tirx_gemm.op.plan import Plan, Rule

__all__ = ["RULES", "Rule", "Plan", "Shape", "walk", "choose", "explain", "choose_epilogue_on"]

# -- the rules' thresholds and tests (each names the study whose records decided it) ---
# Swap-AB at few tokens: the weight's rows are the MMA's rows, the tokens its columns, in
# the smallest token tile (a multiple of 8) that holds M; 128-row weight tiles when they
# still fill SWAP_AB_TALL_SHARE of the SMs (lab/swap_ab_token_tiles).
SWAP_AB_TILES = tuple(range(8, 97, 8))
SWAP_AB_TALL_SHARE = 0.75
# a K split takes every token tile but 56, which ran behind 64 at S = 4 (lab/split_k_decode)
SWAP_SPLIT_TILES = tuple(t for t in SWAP_AB_TILES if t != 56)
SWAP_SPLIT_ROWS = 64      # swap-AB split and non-persistent tiles: 64 weight rows
SWAP_NP_MAX_M = 48        # the non-persistent swap-AB kernel up to this many tokens
SWAP_NP_MIN_TOKENS = 16   # its token tile at least this wide (8 packs 3 CTAs an SM, slow)
SWAP_NP_DEPTH = 8         # and its ring this deep (a card may deepen it: cards.Card)
# 128-row swap-AB splits where the 64-row grid leaves SMs idle, only with units of at least
# 48 K steps and 1.5x the CTAs (shorter units ran behind: lab/split_k_decode)
TALL_SPLIT_MIN_K_STEPS = 48
TALL_SPLIT_MIN_GAIN = 1.5
# a split must be predicted this much faster than the best data-parallel candidate (the
# split fit's error is about 8%: lab/split_k_deep_k)
SPLIT_MARGIN = 0.05
# swap-AB stored by TMA past DP_SWAP_MIN_M tokens where the swapped problem is predicted
# DP_SWAP_MARGIN faster; its token tiles step by 16 (lab/swap_ab_tma_store)
DP_SWAP_MARGIN = 0.05
DP_SWAP_TOKEN_STEP = 16
DP_SWAP_MIN_M = 128
# clusters of four along the weight share the token tile where the one-CTA grid's last wave
# is at most 2/3 full; the H200 holds 30 such clusters at once (lab/cta_clusters)
SWAP_CLUSTER = 4
SWAP_CLUSTER_MAX_FILL = 2 / 3
SWAP_CLUSTER_MAX_CLUSTERS = 30
# misaligned K rows (cost_model.misaligned_rows): a CTA pair, or clusters of SWAP_CLUSTER along M
# where they fit, share the B tile (lab/cta_clusters)
# v10's ping-pong hides each tile's epilogue; with K <= PINGPONG_MAX_K by rule, past it by
# the model (cost_model.pingpong_band: lab/v10_ping_pong_band)
PINGPONG_MAX_K = cm.PINGPONG_MAX_K
PINGPONG_BAND_MAX_K = cm.PINGPONG_BAND_MAX_K
# a fused epilogue's step: "v12" (every keyword) or "v10" (BIAS / ACT, hidden under the other
# warpgroup's mainloop); "v10" waits for a measurement that shows it ahead (lab/fused_epilogues)
EPILOGUE_STEP = "v12"
EPILOGUE_STEP_CHOICES = ("v12", "v10")
V10_KEYWORDS = ("BIAS", "ACT")    # the epilogue keywords v10's builder takes
V10_TILE = cm.V10_TILE
PINGPONG_MIN_TILES_PER_CTA = 2
# a fused epilogue's tile: BLK_N a multiple of 16 (SwiGLU's whole gate/up pairs; the odd
# multiples of 8 have run as plain kernels only)
EPILOGUE_TILE_STEP = 16
PDL_MAX_US = cm.PDL_MAX_US


def swap_ab_tile(M: int, N: int, sm_count: int = SMS_H200) -> tuple[int, int] | None:
    """(BLK_M, BLK_N) of v12's swap-AB for an M-token GEMM with N output columns (BLK_M
    walks N, BLK_N the tokens), or None when M is past the largest token tile."""
    if M > SWAP_AB_TILES[-1]:
        return None
    bn = next(t for t in SWAP_AB_TILES if t >= M)
    tall = _ceil_div(N, 128) >= SWAP_AB_TALL_SHARE * sm_count
    return (128 if tall else 64), bn


def swap_tiles(M: int, N: int, sm_count: int = SMS_H200) -> int | None:
    """The persistent swap-AB kernel's one-CTA tiles at M tokens, or None past its tiles."""
    swap = swap_ab_tile(M, N, sm_count)
    return None if swap is None else _ceil_div(N, swap[0]) * _ceil_div(M, swap[1])


def swap_pdl(M: int, N: int, K: int) -> bool:
    """Whether the persistent swap-AB kernel's bytes at the HBM rate take <= PDL_MAX_US."""
    return cm.hbm_floor(M, N, K) <= PDL_MAX_US


def np_swap_pdl(M: int, N: int, token_tile: int, sm_count: int = SMS_H200) -> bool:
    """Whether the non-persistent swap-AB kernel takes PDL: its CTAs fit one per SM (more
    CTAs than SMs ran up to a fifth slower with it: lab/pdl_exit_trigger)."""
    return _ceil_div(N, SWAP_SPLIT_ROWS) * _ceil_div(M, token_tile) <= sm_count


def swap_stream_k(M: int, N: int, sm_count: int = SMS_H200) -> bool:
    """Whether persistent swap-AB runs stream-K: more tiles than SMs, a last wave under half."""
    tiles = swap_tiles(M, N, sm_count)
    return tiles is not None and tiles > sm_count and 0 < tiles % sm_count < sm_count / 2


def swap_cluster_rows(M: int, N: int, sm_count: int = SMS_H200) -> int | None:
    """The weight tile (64 or 128 rows) of the persistent swap-AB kernel in clusters of
    SWAP_CLUSTER along the weight, or None where it runs one CTA per tile."""
    tiles = swap_tiles(M, N, sm_count)
    if (tiles is None or M <= SWAP_NP_MAX_M or sm_count % SWAP_CLUSTER
            or last_wave_fill(tiles, sm_count) > SWAP_CLUSTER_MAX_FILL):
        return None
    return next((rows for rows in (64, 128)
                 if _ceil_div(N, rows * SWAP_CLUSTER) <= SWAP_CLUSTER_MAX_CLUSTERS), None)


def wants_pingpong(M: int, N: int, K: int, sm_count: int = SMS_H200) -> bool:
    """Whether a plain GEMM goes to v10's ping-pong: K of at most PINGPONG_MAX_K, a 128x128
    tile per SM at least, and no kernel short enough for PDL (which saves more there)."""
    return (K <= PINGPONG_MAX_K and cm.v10_tiles(M, N) >= sm_count
            and cm.rank(M, N, K, sm_count)[0][0] > PDL_MAX_US)


def dp_swap_rows(M: int) -> int:
    """M rounded up to the data-parallel swap-AB rule's block of DP_SWAP_TOKEN_STEP rows."""
    return _ceil_div(M, DP_SWAP_TOKEN_STEP) * DP_SWAP_TOKEN_STEP


def dp_swap_tile(M: int, N: int, K: int, sm_count: int = SMS_H200) -> tuple[int, int] | None:
    """(BLK_M, BLK_N) of a data-parallel swap-AB kernel stored by TMA, past DP_SWAP_MIN_M
    tokens, where the model predicts the swapped problem (N x M x K) more than
    DP_SWAP_MARGIN faster than the best plain candidate; None otherwise."""
    if M <= DP_SWAP_MIN_M or misaligned_rows(K):
        return None
    plain = cm.rank(M, N, K, sm_count)[0][0]
    swapped = next(((t, c) for t, c in cm.rank(N, dp_swap_rows(M), K, sm_count)
                    if c not in (V9, V10) and not cm.clustered(c)
                    and cm.tile(c)[1] % DP_SWAP_TOKEN_STEP == 0), None)
    if swapped is None or swapped[0] >= plain * (1 - DP_SWAP_MARGIN):
        return None
    bm, bn, _ = cm.tile(swapped[1])
    return bm, bn


def misaligned_cluster_tile(M: int, N: int, K: int, sm_count: int = SMS_H200) -> str | None:
    """The one-CTA tile ("BMxBN") that clusters of SWAP_CLUSTER along M run at a misaligned
    K: the model's fastest with at least SWAP_CLUSTER row tiles and at most
    SWAP_CLUSTER_MAX_CLUSTERS clusters; None where none fits or the SMs are not a multiple
    of SWAP_CLUSTER."""
    if sm_count % SWAP_CLUSTER:
        return None
    fits = [(cm.predict(c, M, N, K, _pool(sm_count)), c) for c in cm.params()
            if not cm.clustered(c) and _ceil_div(M, cm.tile(c)[0]) >= SWAP_CLUSTER
            and m_clusters(M, N, c) <= SWAP_CLUSTER_MAX_CLUSTERS]
    return min(fits)[1] if fits else None


def m_clusters(M: int, N: int, cand: str) -> int:
    """Clusters of SWAP_CLUSTER CTAs along M of a one-CTA tile ``cand`` at MxN."""
    bm, bn, _ = cm.tile(cand)
    return _ceil_div(_ceil_div(M, bm), SWAP_CLUSTER) * _ceil_div(N, bn)


def split_plan(M: int, N: int, K: int, sm_count: int = SMS_H200, pair_min_steps: int = 8,
               deep_ring: int | None = None):
    """v12's SPLIT_K plan, or None: ``(BLK_M, BLK_N, SWAP_AB, S, PIPE_DEPTH or None)``, S = 1 the
    non-persistent swap-AB kernel (ring ``deep_ring`` deep, the card's, at cards.DEEP_RING_TILES
    tiles). tiles x S <= sm_count; a split in two at <= SWAP_NP_MAX_M tokens: units >= pair_min_steps."""
    k_tiles = _ceil_div(K, BLK_K)
    swap = swap_ab_tile(M, N, sm_count)
    if swap is not None:  # decode: swap-AB splits, or the non-persistent kernel
        tiles = _ceil_div(N, SWAP_SPLIT_ROWS)
        tokens = next(t for t in SWAP_SPLIT_TILES if t >= swap[1])
        split = cm.split_count(min(sm_count // tiles, k_tiles // cm.SPLIT_MIN_K_STEPS,
                                   cm.SPLIT_MAX), k_tiles)
        short = split == 2 and M <= SWAP_NP_MAX_M and _ceil_div(k_tiles, 2) < pair_min_steps
        if 2 * tiles <= sm_count and split >= 2 and not short:
            return SWAP_SPLIT_ROWS, tokens, True, split, None
        if 2 * tiles > sm_count:  # the 64-row grid leaves SMs idle: 128-row tiles split
            tall = _ceil_div(N, 2 * SWAP_SPLIT_ROWS)
            split = cm.split_count(min(sm_count // tall, k_tiles // TALL_SPLIT_MIN_K_STEPS,
                                       cm.SPLIT_MAX), k_tiles)
            if split >= 2 and tall * split >= TALL_SPLIT_MIN_GAIN * min(tiles, sm_count):
                return 2 * SWAP_SPLIT_ROWS, tokens, True, split, None
        if M <= SWAP_NP_MAX_M:
            deep = deep_ring is not None and tiles in cards.DEEP_RING_TILES
            return (SWAP_SPLIT_ROWS, max(SWAP_NP_MIN_TOKENS, swap[1]), True, 1,
                    deep_ring if deep else SWAP_NP_DEPTH)
        return None
    # the split model against the data-parallel one (what the rest of the rules go by)
    wide = cm.best_wide_swap_split(M, N, K, sm_count, SWAP_AB_TILES[-1])  # past decode's tiles
    picks = [(p, swapped) for p, swapped in ((cm.best_split(M, N, K, sm_count), False),
                                             (wide, True)) if p is not None]
    if not picks:
        return None
    best, swapped = min(picks, key=lambda ps: ps[0])
    if best[0] >= cm.rank(M, N, K, sm_count)[0][0] * (1 - SPLIT_MARGIN):
        return None
    _, bm, bn, split = best
    return bm, bn, swapped, split, None


def epilogue_step(M: int, N: int, K: int, epi: dict, sm_count: int = SMS_H200,
                  setting: str | None = None) -> str:
    """The step ("v12" or "v10") of a fused epilogue ``epi`` (N the kernel's columns) under
    ``setting`` (default EPILOGUE_STEP): "v10" only when set so, for BIAS / ACT alone, where
    its tiles give every CTA at least PINGPONG_MIN_TILES_PER_CTA."""
    setting = EPILOGUE_STEP if setting is None else setting
    if setting not in EPILOGUE_STEP_CHOICES:
        raise ValueError(f"EPILOGUE_STEP={setting!r} must be one of "
                         f"{', '.join(map(repr, EPILOGUE_STEP_CHOICES))}")
    if setting != V10 or not epi or not set(epi) <= set(V10_KEYWORDS):
        return V12
    return V10 if cm.v10_tiles(M, N) >= PINGPONG_MIN_TILES_PER_CTA * sm_count else V12


# -- the shape, the kernel picked so far, a rule ---------------------------------------
@dataclass(frozen=True, eq=False)
class Shape:
    """A GEMM call the rules look at; the tests they share are computed once."""
    M: int
    N: int
    K: int
    dtype: str
    arch: str
    sm_count: int
    epi: dict  # fused-epilogue builder keywords (tirx_gemm.epilogue), {} for a plain GEMM
    card: cards.Card = cards.CARDS[cards.FITTED_ON]

    @cached_property
    def pool(self) -> int:
        return _pool(self.sm_count)

    @cached_property
    def menu(self) -> registry.Step | None:  # v12, where the cost model chooses its tile
        return _registered(TILE_MENU, self.arch) if self.arch in MENU_ARCHES else None

    @cached_property
    def swap(self):
        return swap_ab_tile(self.M, self.N, self.pool)

    @cached_property
    def split(self):
        c = self.card
        return (split_plan(self.M, self.N, self.K, self.pool, c.decode_pair_min_k_steps,
                           c.decode_np_deep_ring) if self.menu else None)

    @cached_property
    def m_cluster_tile(self) -> str | None:  # the misaligned-K clusters' tile (or None)
        return misaligned_cluster_tile(self.M, self.N, self.K, self.sm_count)

    @cached_property
    def plain(self) -> Plan:  # the kernel the same GEMM gets without an epilogue
        return walk(replace(self, epi={}))[0]

    @cached_property
    def kernel_n(self) -> int:  # the kernel's GEMM columns (SwiGLU: gate and up)
        return E.kernel_n(self.N, self.epi)

    def base(self, step_id: str) -> dict:
        return step_kwargs(registry.get(step_id, self.arch), self.dtype, self.sm_count)

    @cached_property
    def v9_tiles(self) -> tuple[int, int]:  # (v9's cluster tiles, the GPU's clusters)
        tile_m, tile_n = V9_CLUSTER_TILE[self.arch]
        return (_ceil_div(self.M, tile_m) * _ceil_div(self.N, tile_n),
                max(1, self.sm_count // CLUSTER_SIZE))

    @cached_property
    def v11_variant(self) -> dict | None:  # v11's split where v9's tiles leave clusters idle
        tiles, clusters = self.v9_tiles
        if tiles >= clusters or _registered(SPLIT_K, self.arch) is None:
            return None
        variant = splitk.choose_variant(self.M, self.N, self.K, self.pool, self.arch)
        if runtime_m(SPLIT_K, self.arch) and variant["SPLIT_K"] > 1:
            variant["SPLIT_K"] = _menu_split(variant["SPLIT_K"],
                                             variant.get("L2_GROUP", V11_L2_GROUP[self.arch]))
        return variant if variant["SPLIT_K"] > 1 else None


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _v12(s: Shape, by: str, bm: int, bn: int, **kw) -> Plan:
    return Plan(TILE_MENU, {**s.base(TILE_MENU), "BLK_M": bm, "BLK_N": bn, **kw}, by)


def _plain_v12(s: Shape, p: Plan) -> bool:  # a v12 kernel of a plain GEMM (no epilogue)
    return not s.epi and p.step == TILE_MENU


# -- the picks -------------------------------------------------------------------------
def _decode_bias(s: Shape, split: bool) -> bool:
    """A bias alone rides the plain GEMM's decode swap-AB kernel: the non-persistent one
    (``split`` False; the bias along D's columns) or the K split (added to the summed bands;
    at every K, with split-K counters kept by captured graphs: lab/serving_stacks)."""
    return (set(s.epi) == {"BIAS"} and s.plain.by == "k_split"  # (epi first: plain's walk asks)
            and s.plain.kw.get("SWAP_AB", False) and (s.plain.kw["SPLIT_K"] > 1) == split)


def _epilogue_tile(s: Shape, by: str) -> Plan:
    pick = cm.best_tile(s.M, s.kernel_n, s.K, s.pool, EPILOGUE_TILE_STEP)
    bm, bn, _ = cm.tile(pick)
    return _v12(s, by, bm, bn, **s.epi, **epilogue_picks(s.epi, bn, s.dtype))


def _split(s: Shape, p) -> Plan:
    bm, bn, swap, split, depth = s.split
    kw = {"SWAP_AB": True} if swap else {}
    kw.update({"SPLIT_K": split, "L2_GROUP": splitk.l2_group_for(split)} if split > 1
              else {"SPLIT_K": 1})
    return _v12(s, "k_split", bm, bn, **kw, **({"PIPE_DEPTH": depth} if depth else {}))


def _split_why(s: Shape, p: Plan) -> str:
    bm, bn, swap, split, depth = s.split
    M, N, K, pool = s.M, s.N, s.K, s.pool
    tiles = _ceil_div(N, bm) * _ceil_div(M, bn) if swap else _ceil_div(M, bm) * _ceil_div(N, bn)
    if split == 1:
        return (f"{_count(M, 'token')} <= {SWAP_NP_MAX_M}: the non-persistent swap-AB kernel, "
                f"one CTA per {bm}-row weight tile and {bn}-token tile ({_count(tiles, 'CTA')}), "
                f"a {depth}-stage ring")
    what = (f"swap-AB {bm}-row weight {'tile' if tiles == 1 else 'tiles'} by {bn} tokens"
            if swap else f"{bm}x{bn} {'tile' if tiles == 1 else 'tiles'}")
    t = cm.predict_split(bm, bn, split, M, N, K)
    model = (f": predicted {t:.1f} us against {cm.rank(M, N, K, pool)[0][0]:.1f} us "
             "data-parallel" if t is not None and not (swap and M <= SWAP_AB_TILES[-1]) else "")
    return (f"K split in {split} (units of {_ceil_div(_ceil_div(K, BLK_K), split)} or fewer K "
            f"steps) over {tiles} {what}, {_count(tiles * split, 'CTA')} on {pool} SMs{model}")


def _swap_why(s: Shape, p: Plan) -> str:
    return (f"{_count(s.M, 'token')} <= {SWAP_AB_TILES[-1]}: swap-AB, the weight's {s.N} rows "
            f"are the MMA's M in {p.kw['BLK_M']}-row tiles and the tokens its N in a tile "
            f"{p.kw['BLK_N']} wide; {_count(swap_tiles(s.M, s.N, s.pool), 'tile')} on "
            f"{s.pool} SMs")


def _model(s: Shape, p, pick: str | None = None) -> Plan:
    pick = pick or cm.best(s.M, s.N, s.K, s.pool)
    if pick == V9 or (pick == V10 and _registered(PINGPONG, s.arch) is not None):
        return Plan(pick, s.base(pick), "cost_model")
    bm, bn, _ = cm.tile(pick)
    return _v12(s, "cost_model", bm, bn)


def _model_why(s: Shape, p: Plan) -> str:
    M, N, K, pool = s.M, s.N, s.K, s.pool
    top = cm.rank(M, N, K, pool)[:3]
    line = "the cost model's fastest (us): " + ", ".join(f"{c} {t:.1f}" for t, c in top)
    pick = cm.best(M, N, K, pool)
    if pick == V9 or V9 in [c for _, c in top]:
        line += f" (v9 counts {cm.V9_HANDICAP:.0%} more against v12)"
    if pick == V10:
        line += (f" (K in v10's band, {PINGPONG_MAX_K + 1}-{PINGPONG_BAND_MAX_K}, where v10 "
                 f"keeps its place within {cm.PREFER_PAIR_WITHIN:.0%} of the fastest)")
    return line + f"; picked {pick}"


def _misaligned_ranks(s: Shape):  # where clusters of four fit, they take a pair's place
    return cm.rank_misaligned(s.M, s.N, s.K, s.pool, s.m_cluster_tile is not None)


def _misaligned_why(s: Shape, p: Plan) -> str:
    top, (a, b), c4 = _misaligned_ranks(s)[:3], cm.MISALIGNED_SLOWDOWN.values(), s.m_cluster_tile
    return (f"K={s.K}: rows of {s.K * 2} bytes are not whole {ROW_ALIGN_BYTES}-byte lines, unseen "
            f"by the model's fit: one-CTA tiles count {a:g}x, CTA pairs and v9 {b:g}x"
            f"{' (pairs only: clusters of four fit)' if c4 else ''} (us): "
            + ", ".join(f"{r} {t:.1f}" for t, _, r in top) + f"; picked {top[0][1]}")


def _v9_why(s: Shape, p: Plan) -> str:
    tiles, clusters = s.v9_tiles
    (tm, tn), head = V9_CLUSTER_TILE[s.arch], f"{s.arch} has no cost model yet"
    line = (f"{head}: v9's {tm}x{tn} cluster tiles give {_count(tiles, 'tile')} for "
            f"{_count(clusters, 'cluster')} of {CLUSTER_SIZE} CTAs")
    if p.step == SPLIT_K:
        return line + (f", fewer: v11 splits K in {p.kw['SPLIT_K']} (splitk.choose_variant) "
                       "to put the idle SMs to work")
    if tiles < clusters:
        return line + ", fewer, but v11 does not split this K (splitk.choose_variant): v9"
    return line + ": every cluster gets a tile, v9 data-parallel"


# -- the adjustments -------------------------------------------------------------------
def _pair_applies(s: Shape, p: Plan) -> bool:
    if p.by != "cost_model" or p.step != TILE_MENU or not misaligned_rows(s.K):
        return False
    bm, bn = p.kw["BLK_M"], p.kw["BLK_N"]
    return s.pool % 2 == 0 and cm.name(bm, bn, 2) in cm.params() and s.M > bm


def _short_for_pdl(s: Shape, p: Plan) -> bool:
    """Whether a v12 kernel takes PDL's start trigger, by the kind of kernel it is."""
    kw, (M, N, K, pool) = p.kw, (s.M, s.N, s.K, s.pool)
    if p.by == "k_split":
        return kw["SPLIT_K"] > 1 or np_swap_pdl(M, N, kw["BLK_N"], pool)
    if p.by == "swap_ab":
        return swap_pdl(M, N, K)
    if p.by == "swap_ab_tma_store":
        return cm.uses_pdl(cm.name(kw["BLK_M"], kw["BLK_N"]), N, dp_swap_rows(M), K, pool)
    cluster = kw.get("CLUSTER", 1)  # clusters along M: as their one-CTA tile
    return cm.uses_pdl(cm.name(kw["BLK_M"], kw["BLK_N"], cluster if cluster == 2 else 1),
                       M, N, K, pool)


def _pdl_why(s: Shape, p: Plan) -> str:
    if p.kw.get("SPLIT_K", 1) > 1:
        return "PDL with the start trigger: K splits keep it"
    if p.kw.get("SPLIT_K") == 1:
        return "PDL with the start trigger: the non-persistent kernel's CTAs fit one per SM"
    return (f"PDL with the start trigger: a short kernel (at most PDL_MAX_US = {PDL_MAX_US:g} "
            "us by the model, or for swap-AB by its bytes at the HBM rate), whose prologue "
            "overlaps the kernel before")


def _cluster_why(s: Shape, p: Plan) -> str:
    tiles = swap_tiles(s.M, s.N, s.pool)
    return (f"one CTA per {swap_ab_tile(s.M, s.N, s.pool)[0]}-row tile would make "
            f"{_count(tiles, 'tile')}, the last wave on {s.pool} SMs "
            f"{last_wave_fill(tiles, s.pool):.0%} full (at most {SWAP_CLUSTER_MAX_FILL:.0%}): "
            f"clusters of {SWAP_CLUSTER} along the weight share the token tile "
            f"({_count(_ceil_div(s.N, p.kw['BLK_M'] * SWAP_CLUSTER), 'cluster')}, at most the "
            f"{SWAP_CLUSTER_MAX_CLUSTERS} the H200 holds at once)")


def _m_cluster_why(s: Shape, p: Plan) -> str:
    cand = s.m_cluster_tile
    return (f"K={s.K}: rows of {s.K * 2} bytes are not whole {ROW_ALIGN_BYTES}-byte lines: "
            f"clusters of {SWAP_CLUSTER} along M share the B tile, on {cand} "
            f"({cm.predict(cand, s.M, s.N, s.K, s.pool):.1f} us by the model, the fastest one-CTA"
            f" tile with {_count(m_clusters(s.M, s.N, cand), 'cluster')}, at most the "
            f"{SWAP_CLUSTER_MAX_CLUSTERS} the H200 holds); in place of CTA pairs they ran "
            "1.13x faster (geomean, fp16 and bf16, on an H100)")


def _dp_swap_why(s: Shape, p: Plan) -> str:
    rows, cand = dp_swap_rows(s.M), cm.name(p.kw["BLK_M"], p.kw["BLK_N"])
    t_plain, plain = cm.rank(s.M, s.N, s.K, s.pool)[0]
    return (f"the swapped problem ({s.N}x{rows}x{s.K}) on {cand} tiles is predicted "
            f"{cm.predict(cand, s.N, rows, s.K, s.pool):.1f} us against {t_plain:.1f} us for "
            f"the best unswapped candidate, {plain} (more than {DP_SWAP_MARGIN:.0%} faster): "
            "swap-AB stored by TMA")


def _one_cta(p: Plan) -> bool:
    return p.kw.get("CLUSTER", 1) == 1


PICK, ADJUST = "pick", "adjust"
RULES: tuple[Rule, ...] = (
    Rule("epilogue_on_v10", PICK, "fused_epilogues",
         lambda s, p: bool(s.epi) and epilogue_step(s.M, s.kernel_n, s.K, s.epi, s.pool) == V10,
         lambda s, p: Plan(PINGPONG, {**s.base(PINGPONG), **s.epi}, "epilogue_on_v10"),
         lambda s, p: f"a fused epilogue ({E.tag(s.epi)}) on v10's ping-pong (epilogue_step)"),
    Rule("swap_ab_bias", PICK, "serving_stacks", lambda s, p: _decode_bias(s, False),
         lambda s, p: Plan(TILE_MENU, {**s.plain.but(drop=("SHIFT_LAST",)).kw, **s.epi},
                           "swap_ab_bias"),
         lambda s, p: (f"a bias alone ({E.tag(s.epi)}) where the plain GEMM runs the "
                       "non-persistent swap-AB kernel: that kernel (no SHIFT_LAST), the bias "
                       "along its fragment's rows, D's columns")),
    Rule("split_bias", PICK, "serving_stacks", lambda s, p: _decode_bias(s, True),
         lambda s, p: Plan(TILE_MENU, {**s.plain.kw, **s.epi}, "split_bias"),
         lambda s, p: (f"a bias alone ({E.tag(s.epi)}) where the plain GEMM splits K={s.K} "
                       f"in {s.plain.kw['SPLIT_K']} with swap-AB tiles: that "
                       "split, the bias added to the summed bands before the cast")),
    Rule("epilogue_on_v12", PICK, "fused_epilogues",
         lambda s, p: bool(s.epi),
         lambda s, p: _epilogue_tile(s, "epilogue_on_v12"),
         lambda s, p: (f"a fused epilogue ({E.tag(s.epi)}): only v12 builds it, on the model's "
                       f"fastest one-CTA tile whose width is a multiple of "
                       f"{EPILOGUE_TILE_STEP}, {p.kw['BLK_M']}x{p.kw['BLK_N']}{epilogue_picks_why(p.kw)}")),
    Rule("k_split_decode", PICK, "split_k_decode",
         lambda s, p: s.split is not None and s.split[2], _split, _split_why),
    Rule("k_split_deep_k", PICK, "split_k_deep_k",
         lambda s, p: s.split is not None and not s.split[2], _split, _split_why),
    Rule("swap_ab", PICK, "swap_ab_token_tiles",
         lambda s, p: s.menu is not None and s.swap is not None,
         lambda s, p: _v12(s, "swap_ab", *s.swap, SWAP_AB=True), _swap_why),
    Rule("pingpong_short_k", PICK, "v10_ping_pong_band",
         lambda s, p: (s.menu is not None and _registered(PINGPONG, s.arch) is not None
                       and wants_pingpong(s.M, s.N, s.K, s.pool)),
         lambda s, p: Plan(PINGPONG, s.base(PINGPONG), "pingpong_short_k"),
         lambda s, p: (f"K={s.K} <= {PINGPONG_MAX_K} with at least one 128x128 tile per SM and "
                       "no kernel short enough for PDL: v10's ping-pong hides each tile's "
                       "epilogue under the other's mainloop")),
    Rule("swap_ab_tma_store", PICK, "swap_ab_tma_store",
         lambda s, p: s.menu is not None and dp_swap_tile(s.M, s.N, s.K, s.pool) is not None,
         lambda s, p: _v12(s, "swap_ab_tma_store", *dp_swap_tile(s.M, s.N, s.K, s.pool),
                           SWAP_AB=True, SWAP_TMA=True), _dp_swap_why),
    Rule("misaligned_rows_model", PICK, "cost_model_error_classes",
         lambda s, p: s.menu is not None and misaligned_rows(s.K) and s.pool % 2 == 0,
         lambda s, p: _model(s, p, _misaligned_ranks(s)[0][1]), _misaligned_why),
    Rule("cost_model", PICK, "cost_model_fit",
         lambda s, p: s.menu is not None, _model, _model_why),
    Rule("split_k_v11", PICK, "steps_on_h200", lambda s, p: s.v11_variant is not None,
         lambda s, p: Plan(SPLIT_K, {**s.base(SPLIT_K), **s.v11_variant}, "split_k_v11"),
         _v9_why),
    Rule("data_parallel_v9", PICK, "steps_on_h200", lambda s, p: True,
         lambda s, p: Plan(DATA_PARALLEL, s.base(DATA_PARALLEL), "data_parallel_v9"), _v9_why),
    Rule("misaligned_rows_clusters", ADJUST, "cta_clusters",
         lambda s, p: _pair_applies(s, p) and s.m_cluster_tile is not None,
         lambda s, p: p.but(drop=("PREFETCH_MAPS",), BLK_M=cm.tile(s.m_cluster_tile)[0],
                            BLK_N=cm.tile(s.m_cluster_tile)[1], CLUSTER=SWAP_CLUSTER),
         _m_cluster_why),
    Rule("misaligned_rows_pair", ADJUST, "cta_clusters",
         lambda s, p: _one_cta(p) and _pair_applies(s, p),
         lambda s, p: p.but(drop=("PREFETCH_MAPS",), CLUSTER=2),
         lambda s, p: (f"K={s.K}: rows of {s.K * 2} bytes are not whole {ROW_ALIGN_BYTES}-byte "
                       f"lines, so the tile runs as a CTA pair (the misaligned-row rule)")),
    Rule("swap_ab_clusters", ADJUST, "cta_clusters",
         lambda s, p: p.by == "swap_ab" and swap_cluster_rows(s.M, s.N, s.pool) is not None,
         lambda s, p: p.but(drop=("PREFETCH_MAPS",), BLK_M=swap_cluster_rows(s.M, s.N, s.pool),
                            CLUSTER=SWAP_CLUSTER), _cluster_why),
    Rule("swap_ab_stream_k", ADJUST, "stream_k_tail",
         lambda s, p: p.by == "swap_ab" and _one_cta(p) and swap_stream_k(s.M, s.N, s.pool),
         lambda s, p: p.but(STREAM_K=True),
         lambda s, p: (f"{_count(swap_tiles(s.M, s.N, s.pool), 'tile')} on {s.pool} SMs leave "
                       f"the last wave {swap_tiles(s.M, s.N, s.pool) % s.pool} of {s.pool}, "
                       "under half: stream-K over it")),
    Rule("tail_tma", ADJUST, "tail_tma_store",
         lambda s, p: (p.by == "cost_model" and p.step == TILE_MENU and _one_cta(p)
                       and tail_tma(p.kw["BLK_M"], p.kw["BLK_N"])),
         lambda s, p: p.but(TAIL_TMA=True),
         lambda s, p: (f"the tile's last {p.kw['BLK_N'] % cm.EPI_COLS} columns stored by TMA "
                       "too, the ring as deep")),
    Rule("shift_last", ADJUST, "shift_last_token_tile",
         lambda s, p: (_plain_v12(s, p) and _one_cta(p) and p.kw.get("SPLIT_K", 1) == 1
                       and not p.kw.get("STREAM_K")),
         lambda s, p: p.but(SHIFT_LAST=True),
         lambda s, p: "the last token tile ends at M (no zero-filled token rows)"),
    Rule("pdl_start", ADJUST, "pdl_exit_trigger",
         lambda s, p: _plain_v12(s, p) and _short_for_pdl(s, p),
         lambda s, p: p.but(PDL=True), _pdl_why),
    Rule("static_n_k", ADJUST, "static_n_k_builds",
         lambda s, p: _plain_v12(s, p) and p.kw.get("SPLIT_K") != 1 and "RUNTIME_NK" in p.kw,
         lambda s, p: p.but(drop=("RUNTIME_NK",)),
         lambda s, p: "built for the layer's N and K (M still at run time)"),
    Rule("pdl_exit", ADJUST, "pdl_exit_trigger",
         lambda s, p: (_plain_v12(s, p) and not p.kw.get("PDL")
                       and (_one_cta(p) or p.by == "swap_ab")),
         lambda s, p: p.but(PDL=True, PDL_TRIGGER="exit"),
         lambda s, p: ("PDL with the exit trigger: the rules leave this kernel without the start "
                       "trigger (a long kernel, or more CTAs than fit at once), so the next "
                       "kernel launches as its CTAs exit")),
)


# -- walking the rules -----------------------------------------------------------------
def walk(shape: Shape) -> tuple[Plan, list[tuple[Rule, Plan]]]:
    """The kernel RULES give ``shape`` and each rule that applied with the plan it returned."""
    plan, applied = None, []
    for rule in RULES:
        if (rule.kind == PICK) == (plan is None) and rule.applies(shape, plan):
            plan = rule.apply(shape, plan)
            applied.append((rule, plan))
    return plan, applied


def choose(M: int, N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
           sm_count: int | None = None, epilogue: dict | None = None, *,
           why: list | None = None, card=None) -> tuple[str, dict]:
    """The step and builder keywords that matmul uses for an MxNxK GEMM of ``dtype`` (a name
    or a torch dtype) on a GPU of ``arch`` with ``sm_count`` SMs: ``(step_id, kwargs)``, by
    walking :data:`RULES`. ``card``: "h100", "h200", "auto" (the GPU an imported torch sees)
    or a tirx_gemm.op.cards.Card, default the H200 the model was fitted on; its HBM bandwidth
    scales the model's; ``sm_count`` defaults to its SMs (sm_90a).

    On sm_90a the cost model (tirx_gemm.op.cost_model) ranks v12's tile menu, v9 and v10,
    after rules for K splits, swap-AB, v10's ping-pong at a short K and swap-AB stored by TMA,
    and (at a K of misaligned rows) with their slowdowns there; then rules adjust the kernel
    picked (CTA pairs and clusters, stream-K, TMA-stored tails, the last token tile, PDL). On
    sm_100a (no model yet): v9, or v11's K split where v9's cluster tiles leave clusters idle.
    bfloat16 adds ``{"dtype": "bfloat16"}``. A ValueError for a shape no step takes (N or K
    not a multiple of 8), an unknown dtype or arch. ``epilogue``: a fused epilogue's builder
    keywords (tirx_gemm.epilogue; N is the output's columns): v12's fastest one-CTA tile for
    the kernel's GEMM (SwiGLU: M x 2N x K), never v9 or v11, with the keywords added; a bias
    alone where the plain GEMM runs the non-persistent swap-AB kernel: that kernel.
    ``why``: a list that gets each applied rule's line (what :func:`explain` prints).
    """
    dtype, (card, sm_count) = dtype_name(dtype), cards.for_arch(card, arch, sm_count)
    _check_problem(M, N, K, dtype, arch, sm_count)
    epi = E.epilogue_kwargs(E.check_epilogue_arg(epilogue)) if epilogue is not None else {}
    if epi and (TILE_MENU not in EPILOGUE_STEPS.get(arch, ())
                or _registered(TILE_MENU, arch) is None):
        raise ValueError(f"a fused epilogue ({E.tag(epi)}) runs on sm_90a only (v12's tile "
                         f"menu); on {arch} call matmul without bias/activation/out_dtype and "
                         f"apply them with torch")
    shape = Shape(M, N, K, dtype, arch, sm_count, epi, card)
    with cm.bandwidth_scale(cards.bandwidth_scale(card)):
        plan, applied = walk(shape)
        if why is not None:
            why.extend(f"{rule.why(shape, p)} [{rule.name}: lab/{rule.study}]"
                       for rule, p in applied)
    return plan.step, dict(plan.kw)


def explain(M: int, N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
            sm_count: int | None = None, epilogue: dict | None = None, *, card=None) -> str:
    """:func:`choose`'s pick for MxNxK and why, as text: step and keywords, the kernel's name as
    profilers show it, the card assumed, then each rule of RULES that applied, in order, with
    the figures that decided and its study (``tirx-gemm choose`` prints it)."""
    dtype, (card, sm_count) = dtype_name(dtype), cards.for_arch(card, arch, sm_count)
    why: list[str] = []
    step, kw = choose(M, N, K, dtype, arch, sm_count, epilogue, why=why, card=card)
    keys = " ".join(f"{k}={v}" for k, v in kw.items() if k not in ("dtype", "SM_COUNT"))
    used = _pool(sm_count)
    sms = f"{sm_count} SMs" + ("" if used == sm_count else f", {used} used")
    head = f"{M}x{N}x{K} {dtype} on {arch} ({sms}): {step} {keys}".rstrip()
    from tirx_gemm.compile.names import kernel_symbol  # pure Python: no TVM
    return "\n".join([head, f"  kernel: {kernel_symbol(registry.get(step, arch), kw)}",
                      f"  card: {card.line()}"] + [f"  - {w}" for w in why])


def choose_epilogue_on(step_id: str, M: int, N: int, K: int, dtype: str, arch: str,
                       sm_count: int, epilogue: dict, *, card=None) -> tuple[str, dict]:
    """``(step_id, kwargs)`` of a fused epilogue forced onto ``step_id`` ("v12": its
    model-best one-CTA tile, the epilogue_on_v12 rule's, never the swap_ab_bias rule's kernel;
    "v10": its default 128x128 ping-pong tiles, BIAS / ACT only): what
    ``matmul(..., step=...)`` runs."""
    dtype, (card, sm_count) = dtype_name(dtype), cards.for_arch(card, arch, sm_count)
    _check_problem(M, N, K, dtype, arch, sm_count)
    epi = E.epilogue_kwargs(epilogue or {})
    if arch not in EPILOGUE_STEPS or step_id not in EPILOGUE_STEPS[arch]:
        raise ValueError(f"step={step_id!r} has no fused epilogue on {arch}: use step='v12' "
                         f"(every epilogue) or step='v10' (bias and activation), on sm_90a")
    shape = Shape(M, N, K, dtype, arch, sm_count, epi, card)
    if step_id == TILE_MENU:
        with cm.bandwidth_scale(cards.bandwidth_scale(card)):
            plan = _epilogue_tile(shape, "forced")
        return plan.step, dict(plan.kw)
    extra = sorted(set(epi) - set(V10_KEYWORDS))
    if extra:
        raise ValueError(f"step='v10' takes bias and activation only, not {', '.join(extra)} "
                         f"({E.tag(epi)}): use step='v12'")
    return PINGPONG, {**shape.base(PINGPONG), **epi}
