"""The per-shape chooser of tirx_gemm.matmul on sm_90a: a cost model of the H200 fitted to
recorded measurements, over v12's tile menu, v9 and v10 (v11 for the few-tile, deep-K
shapes; v10's ping-pong by an explicit rule for a short K, :func:`wants_pingpong`, and in
v9's place in its own band past it, :func:`pingpong_band`).

Why a model: one tile cannot serve every shape (v12's card). What decides is how many of
the 132 SMs get work and how long each works:

    tiles  = ceil(M / BLK_M) * ceil(N / BLK_N)            output tiles of the candidate
    waves  = ceil(tiles / slots)                          slots: 132 CTAs (v12), 66 pairs (v9)
    steps  = waves * ceil(K / 64)                         K steps on the busiest CTA
    time   = s_c * steps + e_c * waves + f_c              microseconds

``s_c`` is the candidate's time per K step of one CTA: its tensor-core work
(2 * BLK_M * BLK_N * 64 flop) or, for narrow tiles, the latency of a ring round trip and
its bytes per flop ((BLK_M + BLK_N) x 64 x 2 bytes for BLK_M x BLK_N x 64 MACs), whichever
binds; ``e_c`` the per-tile cost (ring fill and epilogue); ``f_c`` the launch and the last
store. Wave efficiency is ``tiles / (waves * slots)``: a 1.2-wave shape pays two waves.
No candidate is predicted faster than its operand bytes at the sustained HBM rate allow
(:func:`hbm_floor`, the bound of bandwidth-bound shapes such as decode).
The three figures per candidate are fitted (weighted least squares, relative error) by
``scripts/fit_chooser.py`` to the H200 records of v12's sweeps
(``results/lab/v12_sweep_h200.jsonl``: the menu of powers of two; ``v12_widths_sweep_h200``:
BLK_N 80..240 between them; ``v12_cluster_sweep_h200``: CTA pairs; every entry at the 48
suite shapes, bf16, timed against torch.mm in the same run) and v9's suite records
(``results/suites/nvidia-h200.jsonl``, scaled to the sweep's torch times by their ratio to
torch); v9 shares the per-tile and fixed costs of v12's 128x256 (the same CTA tile and
epilogue) and has its own per-step cost (TMA multicast halves its B loads). The figures
live in ``chooser_h200.json`` beside this file, written by that script; a test refits them
from the records and compares. fp16 uses bf16's figures (the tensor-core rate and the
bytes are the same; unmeasured in fp16).

Where the best data-parallel candidate would leave more than half the SMs idle on a deep
K (the shapes v12's sweep measured at 0.09-0.31x torch), splitting K is the only way to
use them: v11 with matmul's split rule. The model has no term for split-K's reduction;
that rule is splitk.choose_variant's, measured on the H200 for v11.

The same model rates the swapped problem (N x M x K) past 128 tokens: v12's swap-AB stored
by TMA (SWAP_TMA) where that is predicted faster (:func:`dp_swap_tile`).

TVM- and torch-free. ``predict`` and ``rank`` show the model's view of a shape.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tirx_gemm import spec

PARAMS_FILE = Path(__file__).with_name("chooser_h200.json")
SMS_H200 = spec.SM_COUNT["sm_90a"]
BLK_K = 64
V9 = "v9"
V12 = "v12"
# v12's menu, as measured: (BLK_M, BLK_N)
MENU = ((64, 16), (64, 32), (64, 48), (64, 64), (64, 96), (64, 128), (64, 256),
        (128, 64), (128, 96), (128, 128), (128, 192), (128, 256))
IDLE_FOR_SPLIT = 0.5  # best data-parallel pick busy on fewer than this share of SMs: split K

# Issue 28: the step a fused BIAS / ACT epilogue runs on (matmul's choice). "v12" (the tile
# menu; every epilogue keyword) runs the epilogue between two tiles of one warpgroup, where
# nothing hides it; "v10" (ping-pong) runs it under the other warpgroup's mainloop. v10 has
# no OUT_DTYPE or SWIGLU, and hides an epilogue only when every CTA alternates tiles, so
# with EPILOGUE_STEP = "v10" a BIAS/ACT-only epilogue goes to v10 where its 128x128 tiles
# give each CTA of the pool at least two (PINGPONG_MIN_TILES_PER_CTA); everything else
# stays on v12. Off ("v12") until the H200 comparison (scripts/lab/epilogue_h200.py --v10)
# shows v10 ahead; the lead turns it on then.
EPILOGUE_STEP = "v12"
EPILOGUE_STEP_CHOICES = ("v12", "v10")
V10 = "v10"
V10_KEYWORDS = ("BIAS", "ACT")    # the epilogue keywords v10's builder takes
V10_TILE = (128, 128)             # a consumer warpgroup's tile (v10's default BLK_M = 128)
PINGPONG_MIN_TILES_PER_CTA = 2


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
    """{candidate: (s, e, f)} from chooser_h200.json (candidate "v9" or "BMxBN"); read
    once (matmul.variants asks for it thousands of times per layer). Do not modify."""
    return {k: tuple(float(x) for x in v) for k, v in _document()["candidates"].items()}


_params_cache_clear = params.cache_clear


def _clear() -> None:
    _document.cache_clear()
    _params_cache_clear()
    rank.cache_clear()  # (defined below: a pure function of the figures and the shape)


params.cache_clear = _clear  # scripts/fit_chooser.py after a refit


# Programmatic dependent launch (v12's PDL=True, tirx_gemm/pdl.py): a kernel launched with
# it starts its prologue while the one ahead of it drains. Measured on the H200
# (results/lab/v12_pdl_sweep_h200.jsonl: 7 menu entries with and without it at the 48
# suite shapes, bf16, CUDA graphs of 20 launches): it saved 0.56-0.72 us (median) per
# call on every kernel under 10 us and 89% of those of 10-16 us, while on longer ones the
# saving was lost in their spread and past 200 us they ran slower (median -4 us). So a
# one-CTA v12 candidate predicted at most PDL_MAX_US is built with PDL and predicted
# faster by the fitted saving (chooser_h200.json "pdl_saving_us"), which is what lets a
# short v12 kernel beat v9 or v10 where without PDL it would not.
# Rechecked past it (results/lab/v12_dpswap_h200.jsonl, three passes, the same kernels with
# and without PDL): 1500x3840x1280 128x192 0.94 against 0.91-0.92 and 3152x768x3072 128x160
# 0.92-0.93 against 0.90-0.92, but 128x6144x4096 64x96 0.84-0.86 against 0.95-0.97 and
# 2304^3 128x176 0.82-0.84 against 0.85-0.86: no higher threshold is safe without a model
# of which kernels PDL slows. Past it matmul gives a one-CTA kernel PDL with the exit
# trigger instead (v12's PDL_TRIGGER="exit", matmul_choice's PDL_EXIT_NOTE: at most 2.1%
# slower at a case, 0.7-1.1% faster in geomean); the prediction takes no saving for it.
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


# The HBM floor (issue 32): no kernel streams its operands faster than HBM delivers them.
# The per-candidate fit above counts K steps and waves, so on a bandwidth-bound shape (few
# tokens, a wide weight) it predicts the tensor-core time and runs low: 128x28672x8192 at
# 128x224 predicted 78 us, measured 119 us (results/lab/matmul_graph_h200_issue32_s6.jsonl).
# A data-parallel candidate is predicted at least
#
#     floor = f + (M*K + N*K + M*N) * 2 bytes / hbm_tb_s                   microseconds
#
# every operand byte read once and D written once at the sustained rate, after the fixed
# cost, both as the split model fits them (chooser_h200.json "split": the same GPU, the
# same bytes; its f is a launch and a ramp). The floor is one for every candidate: where it
# binds, they are all bound by the same bytes, and the ranking breaks the tie by the time
# without the floor (the most slack).
# Over the sweeps' 2264 kernels the floor brings the model's RMS error from 15.8% to
# 15.0% (`scripts/fit_chooser.py` prints both) and changes no data-parallel pick.


def hbm_floor(M: int, N: int, K: int, elem_bytes: int = 2) -> float:
    """The least time in microseconds of a data-parallel kernel at MxNxK: the fixed cost
    plus every operand byte once at the sustained HBM rate (0 without a split fit)."""
    fit = _document().get("split")
    if not fit:
        return 0.0
    return fit["f"] + (M * K + N * K + M * N) * elem_bytes / 1e6 / fit["hbm_tb_s"]


# A v12 CTA pair takes PDL the same way (TVM 0.27's runtime launches with the cluster
# dimension and PDL in one cuLaunchKernelEx; the pair waits after its cluster-wide set-up).
# Measured on the H200 (results/lab/v12_pairpdl_h200.jsonl: 8 pair tiles with and without
# PDL and the one-CTA tile with it, 10 shapes, fp16 and bf16, four passes, all checked): at
# 1000^3, where the misaligned-row rule picks 64x128c2, the pair ran 0.94-0.96 (bf16) and
# 0.88-0.91 (fp16) with PDL against 0.88 and 0.81-0.83 without; at the other short shapes
# PDL added 0.06-0.18 to the pairs too.


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


def busy_share(cand: str, M: int, N: int, sm_count: int = SMS_H200) -> float:
    """The share of SMs that get a tile in the first wave."""
    bm, bn, slots = geometry(cand, sm_count)
    tiles = _ceil_div(M, bm) * _ceil_div(N, bn)
    return min(tiles, slots) / slots


def clustered(cand: str) -> bool:
    """Whether a candidate runs CTA pairs (v9, v10, v12's CLUSTER=2): only on an even SM
    pool."""
    return cand in (V9, V10) or tile(cand)[2] > 1


@lru_cache(maxsize=1 << 16)
def rank(M: int, N: int, K: int, sm_count: int = SMS_H200,
         pdl: bool = True) -> tuple[tuple[float, str], ...]:
    """Every candidate but v12's CTA pairs with its predicted time, fastest first (v9 and
    v10 only on an even number of SMs; in :func:`pingpong_band` v10, elsewhere v9). The
    pairs enter by :func:`best`'s row rule alone."""
    ranked = sorted((predict(c, M, N, K, sm_count, pdl), _predict_plain(c, M, N, K, sm_count), c)
                    for c in params()
                    if (c == V9 or c == V10) and (c == V10) == pingpong_band(M, N, K, sm_count)
                    and sm_count % 2 == 0 or not clustered(c))
    return tuple((t, c) for t, _, c in ranked)  # ties on the floor: least time without it


# v12's CTA pairs (CLUSTER=2: the pair's B tile loaded once, half by each CTA, multicast).
# Measured on the H200 (results/lab/v12_cluster_sweep_h200.jsonl, bf16, same-run ratios
# to torch.mm, GPU time): on shapes whose K is a multiple of 64 a pair is level with or
# slower than the same one-CTA tile (1024^3 64x128: 0.79 against 0.89; 2304^3 128x192:
# 0.89 against 0.90), while where K is not, it is faster (1000^3 64x128: 0.91 against
# 0.81; 4095x4096x4104 128x256: 0.90 against 0.78). A row of K elements whose byte length
# is not a multiple of 128 starts every row of a TMA box off a 128-byte line, so each
# 128-byte box row reads two lines: the L2-to-SM traffic doubles and the loads bind;
# the pair halves B's share of it. The per-candidate fit has no term for that (two such
# shapes in the suite), so the rule is explicit: a misaligned K runs the model's one-CTA
# tile as a pair, when the GPU has an even number of SMs and M spans two row tiles.
ROW_ALIGN_BYTES = 128
# v10's ping-pong (in its band, pingpong_band) is kept unless another candidate is
# predicted faster by more than this share: the fit's typical error is a few percent. (It
# was v9's margin, PREFER_V9_WITHIN, until v9 took a handicap of its own, below.)
PREFER_PAIR_WITHIN = 0.03
# v9 against v12's 128-row tiles as matmul builds them (issue 32, stop 52): v9's figures
# were fitted beside v12 sweeps of kernels that read N and K at run time, without
# PREFETCH_MAPS, TAIL_TMA or PDL's exit trigger, all of which matmul's v12 picks have since
# taken; v9 kept its place within 3% of the fastest. Through matmul against the package
# before (H200, bf16, CUDA graphs interleaved with torch, two passes; one bundle, so the
# same kernels; results/lab/matmul_graph_h200_v9handicap.jsonl), v12's pick in v9's place:
# call 1, 12 prefill layers where the model ranked a v12 width ahead of v9 by up to 3%
# (scripts/lab/issue32_pre.json; a variant without the 3%, which picks there the kernels
# this rule picks), 12 cases 1.019-1.115x (geomean 1.059, behind at 0);
# call 2, every models, held-out and fresh51 shape where matmul picked v9, and 4096^3 and
# 8192^3 (scripts/lab/issue32_v9chg.json, fp16 too: the 128x256 tile at v9's tile count
# where no width fits better), 43 cases 0.989-1.086x (geomean 1.010, behind at 8);
# call 3, 18 prefill layers drawn at random where matmul picked v9, none in another set
# (scripts/lab/issue32_pre2.json), 18 cases 0.986-1.039x (geomean 1.015, behind at 3).
# cuBLAS runs those shapes on widths of its own too (256x152, 256x160, 128x232, 320x128:
# results/lab/cublas_kernels_pre_h200.jsonl). So v9's predicted time counts this much more
# when it is ranked against v12 (only in best(): the split and swap-AB rules still see
# its fitted figure), enough that a v12 tile within 5% of it takes its place.
V9_HANDICAP = 0.05


def misaligned_rows(K: int, elem_bytes: int = 2) -> bool:
    """Whether rows of K elements are not whole 128-byte lines (TMA boxes straddle)."""
    return (K * elem_bytes) % ROW_ALIGN_BYTES != 0


def best(M: int, N: int, K: int, sm_count: int = SMS_H200) -> str:
    """The candidate the model predicts fastest ("v9", "BMxBN" of v12, or its pair
    "BMxBNc2" by the misaligned-row rule above)."""
    # v9 with its handicap (V9_HANDICAP, above); a stable sort on the time alone, so that
    # ties keep rank's order (on the HBM floor: the least time without it first)
    ranked = [(t * (1 + V9_HANDICAP) if c == V9 else t, c) for t, c in rank(M, N, K, sm_count)]
    ranked.sort(key=lambda tc: tc[0])
    top, pick = ranked[0]
    # v10's ping-pong, ranked in its band, keeps its place within PREFER_PAIR_WITHIN of the
    # fastest
    pair = next(((t, c) for t, c in ranked if c == V10), None)
    if pair is not None and pair[0] <= top * (1 + PREFER_PAIR_WITHIN):
        pick = pair[1]
    if pick not in (V9, V10) and misaligned_rows(K) and sm_count % 2 == 0:
        bm, bn, _ = tile(pick)
        pair = name(bm, bn, 2)
        if pair in params() and M > bm:
            return pair
    return pick


# v10's ping-pong for plain GEMMs with a short K (issue 32: "v10 takes part where it
# wins"). Its two consumer warpgroups take turns, so one tile's epilogue runs under the
# other's mainloop; with a short K the epilogue is a large share of a tile's time, and
# hiding it pays. Measured on the H200 (results/lab/v10_suite_graph_h200.jsonl, bf16, CUDA
# graphs, same-run ratios to torch.mm): 4096x4096x512 1.16 (v9 1.00 in the sweep's scale),
# 2048x2048x256 1.03 (v9 0.92), 4096x4096x64 1.13 (v12 128x128 1.13); where its 128x128
# tiles do not give every SM one (512^3: 16 tiles, 0.62; 256x512x192 0.62) or K is deep
# (4096^3-class shapes 0.89-0.97) it loses. The fitted model (one s, e, f per candidate)
# cannot see the hidden epilogue (it predicts 4096x4096x512 at 32.8 us against 26.9
# measured), so the rule is explicit: K of at most PINGPONG_MAX_K and at least as many
# 128x128 tiles as SMs.
PINGPONG_MAX_K = 512


def v10_tiles(M: int, N: int) -> int:
    """How many of v10's V10_TILE output tiles an MxN result has (each a warpgroup's turn)."""
    bm, bn = V10_TILE
    return _ceil_div(M, bm) * _ceil_div(N, bn)


def wants_pingpong(M: int, N: int, K: int, sm_count: int = SMS_H200) -> bool:
    """Whether a plain GEMM goes to v10's ping-pong: a short K and every SM a tile, unless
    the model's best kernel is short enough for PDL, which saves more there (v12 with PDL,
    CUDA graphs: 2048x2048x256 1.08 and 4096x4096x64 1.23 against v10's 1.03 and 1.13;
    v10's builder takes no PDL)."""
    if K > PINGPONG_MAX_K or v10_tiles(M, N) < sm_count:
        return False
    return rank(M, N, K, sm_count)[0][0] > PDL_MAX_US


# Past that band v10 is a candidate of the model, within a band of its own: K past
# PINGPONG_MAX_K up to PINGPONG_BAND_MAX_K and at least as many 128x128 tiles as SMs
# (:func:`pingpong_band`); elsewhere only the rule above runs it. Its
# three figures are fitted to its measurements there only (scripts/fit_chooser.py): fitted
# to every shape it was timed at (decode widths, deep K, where it is never a contender and
# the GPU runs power-limited) they over-predicted it by 3-8% at every short-K shape and the
# model ranked it behind v9 or a 128-row tile where it ran 5-15% ahead. Measured on the H200
# (results/lab/v12_shortk_h200.jsonl and v12_midk_h200.jsonl: a thousand tokens or more on
# a K of 640-2560, v9, v10, v12's 128-row tiles and swap-AB tiles in one interleaved run,
# fp16 and bf16, two passes, every kernel checked): where v10 was the fastest kernel it ran
# 0.91-1.19 (8192x2304x768 1.17-1.18 against v9's 0.93-0.96 and 128x192's 1.06-1.08), and
# it was behind where a larger tile fills whole waves (3152x2304x768: 128x144 swapped, three
# waves, 0.98 against 0.92-0.94), where K is deeper with few tokens (6000x640x2560:
# 0.92-0.94 against 0.97-0.98 swapped) and at 2304^3.
# In the band v10 takes v9's place: it ran ahead of v9 at every shape of the band in those
# sweeps and through matmul (results/lab/matmul_graph_h200_pingband.jsonl: 3000x4096x1024
# 1.12 against 1.02, 8192x1024x1024 1.06 against 0.97), where v9's figures (its K step
# fitted to the large shapes, its wave and fixed costs 128x256's) miss its exposed epilogue
# and predicted it 5-10% fast.
PINGPONG_BAND_MAX_K = 2560


def pingpong_band(M: int, N: int, K: int, sm_count: int = SMS_H200) -> bool:
    """Whether v10's ping-pong is a candidate of the model at MxNxK: K past the short-K
    rule's band (:func:`wants_pingpong`) up to PINGPONG_BAND_MAX_K, and at least as many of
    its 128x128 tiles as SMs."""
    return PINGPONG_MAX_K < K <= PINGPONG_BAND_MAX_K and v10_tiles(M, N) >= sm_count


def wants_split(M: int, N: int, K: int, sm_count: int = SMS_H200,
                min_k_tiles: int = 32) -> bool:
    """Whether K should be split: the best data-parallel candidate keeps more than half the
    SMs idle and K has at least ``min_k_tiles`` steps to share out."""
    if _ceil_div(K, BLK_K) < min_k_tiles:
        return False
    return busy_share(best(M, N, K, sm_count), M, N, sm_count) < IDLE_FOR_SPLIT


# Swap-AB (v12's SWAP_AB, issue 32): for few tokens the MMA's rows walk N (the weight's
# rows, all data) and its columns the tokens, so no stage carries 64 rows of zero-filled A
# (a stage's fixed cost, not its bytes, paced the narrow tiles: v12's sweep). Measured on
# the H200 (bf16, results/lab/issue32_swapab_h200.jsonl, same-run ratios to torch): 1x8192x8192
# 0.68 -> 1.01, 8x14336x4096 0.82 -> 0.99, 16x14336x4096 0.88 -> 0.98, 77x7168x2048 0.83 ->
# 0.96, 64x8192x28672 1.06 -> 1.09, 64x6144x4096 and 48x14336x4096 level. The token tile is
# the smallest of SWAP_AB_TILES that holds M (each a kernel that serves every M up to it;
# in the suite run 77 rows in a 96-wide tile ran 0.85-0.87 against 0.96 in an 80-wide one);
# the weight tile is 128 rows when those tiles still fill SWAP_AB_TALL_SHARE of the SMs
# (8x14336x4096: 112 tiles, 0.99 against 0.96 at 64 rows), else 64 (1x8192x8192: 64 tiles
# of 128 ran 0.94, 128 of 64 1.01). A deep K with few weight tiles is split
# (:func:`split_plan`; v11's split had run 32x4096x14336 at 0.89, swap-AB alone 0.82).
# The token tiles are every multiple of 8 (wgmma's N step), as cuBLAS sizes them (128x40 at
# 37 tokens, 128x24 at 24): a zero-filled token row costs a load its time (lesson v12, "The
# last token tile, moved back"). Beside the sizes 48, 32, 64, 80 and 96 before, matmul's
# keywords, one run (results/lab/v12_tok8_h200.jsonl, v12_tok8b_h200.jsonl): 40 at 33-37
# tokens 0.95-0.99 against 0.91-0.97, 72 at 65-70 1.00-1.01 against 0.98-0.99, 88 at 81-88
# 0.93-0.98 against 0.91-0.95; 24 and 56 level.
SWAP_AB_TILES = tuple(range(8, 97, 8))
# A K split (S >= 2) takes them too, but for 56, which takes 64. Through matmul against the
# package that split only at 8-48, 64, 80 and 96 (results/lab/matmul_graph_h200_splitw.jsonl,
# 15 decode shapes that split, both dtypes, two passes, CUDA graphs interleaved with torch):
# 72 and 88 ran level or ahead (68x3584x18944 in 72 0.99-1.00 against 0.95-0.96,
# 85x4096x14336 in 88 1.05-1.07 against 1.02-1.04, 71x2048x5632 +0.02); 56 ran level at
# S = 2 (four shapes) and behind at S = 4 (54x2048x8192 1.03-1.05 against 1.07-1.08).
SWAP_SPLIT_TILES = tuple(t for t in SWAP_AB_TILES if t != 56)
SWAP_AB_TALL_SHARE = 0.75


def swap_ab_tile(M: int, N: int, sm_count: int = SMS_H200) -> tuple[int, int] | None:
    """(BLK_M, BLK_N) of v12's swap-AB for an M-token GEMM with N output columns (BLK_M
    walks N, BLK_N the tokens), or None when M is past the largest token tile."""
    if M > SWAP_AB_TILES[-1]:
        return None
    bn = next(t for t in SWAP_AB_TILES if t >= M)
    tall = _ceil_div(N, 128) >= SWAP_AB_TALL_SHARE * sm_count
    return (128 if tall else 64), bn



# v12's SPLIT_K (a CTA per unit; S > 1 sums the units' slabs with v11's "spread"
# reduction, each unit its 1/S of the tile, in split order). Measured on the H200 (bf16,
# CUDA graphs, same-run ratios to torch.mm: results/lab/v12_split_h200.jsonl, bash
# scripts/lab/h200_issue32_split.sh), against the picks before it:
# - few tiles, deep K (the split model below against the data-parallel one), 64x128 tiles
#   and S = SMs // tiles:
#   128x128x65536 0.92 (v11 0.88), 128x256x32768 0.98 (0.96), 256x256x16384 1.04 (1.01),
#   384x128x12288 1.14 (1.06). 64x64 was level or behind except at 128x128x65536 (0.96),
#   64x32 and 128x64 behind everywhere: the narrow tile moves more bytes per MAC, the
#   taller one puts two consumer warpgroups on each unit's short K loop.
# - decode with a weight of few 64-row tiles (N / 64 <= SMs / 2), swap-AB split in S =
#   SMs // tiles: 32x4096x14336 1.02 (v11 0.85), 48x4096x14336 1.00 (0.87), 1x4096x4096
#   1.10 (swap-AB alone 1.00). With N / 64 near the SM count a split costs (1x8192x8192:
#   128x8 split 2 0.93, 64x8 unsplit 1.00).
# - decode at M <= 48 otherwise: the non-persistent swap-AB kernel (SPLIT_K=1, 64-row
#   tiles, a token tile of at least 16, an 8-stage ring: about 80 KB, two CTAs per SM):
#   8x14336x4096 0.95 (persistent 128x8 0.92), 16x14336x4096 0.95 (0.91), 48x14336x4096
#   0.93 (0.90), 1x8192x8192 1.01 (0.96). An 8-wide token tile fits three CTAs per SM and
#   ran 0.74 at 8x14336x4096: the hardware then packs 224 CTAs onto 75 SMs, so the token
#   tile is never narrower than 16. At 64 tokens it lost (64x6144x4096 0.87 against 0.92).
# The short-K non-persistent kernel (SPLIT_K=1 without swap-AB) never beat the persistent
# one with PDL (2048x2048x256 0.90 against 1.09; 128x256x192 1.19 against 1.19): matmul
# keeps the persistent kernel there.
SPLIT_MIN_K_STEPS = 8     # K steps per unit at least (a unit's ring fill and slab)
SPLIT_MAX = 64            # SPLIT_K at most: splitk.MAX_SPLIT_SPREAD (a test keeps them equal)
SWAP_SPLIT_ROWS = 64      # swap-AB split and non-persistent tiles: 64 weight rows
SWAP_NP_MAX_M = 48        # the non-persistent swap-AB kernel up to this many tokens
SWAP_NP_MIN_TOKENS = 16   # its token tile at least this wide (occupancy: see above)
SWAP_NP_DEPTH = 8         # and its ring this deep
# Decode on a weight of more 64-row tiles than half the SMs (N of about 4300-5600: 67-88
# tiles) takes no 64-row split (two units a tile would not fit the SMs), so its kernel ran
# 67-88 CTAs, one a tile, for 132 SMs. A swap-AB split of 128-row tiles in S >= 3 units puts
# 1.5 times as many CTAs to work (4608 rows: 36 tiles x 3 = 108 CTAs against 72), where
# each unit keeps at least TALL_SPLIT_MIN_K_STEPS K steps. Through matmul against the
# package before, a lab variant with no floor on the K steps (two H200 calls, CUDA graphs
# interleaved with torch, two passes, 1-96 tokens, bf16 and some fp16,
# results/lab/matmul_graph_h200_tallsplit.jsonl): call 1 at six real weights
# (scripts/lab/issue32_tallsplit.json: down projections of Gemma-2-27B, Qwen2.5-14B and
# -32B, Falcon-7B's, GPT-2 XL's c_attn), call 2 at depths between them
# (scripts/lab/issue32_tallgap.json). The split ran, per case (the mean of its passes' log
# ratios), with at least 48 K steps a unit 44 cases 1.026-1.328x (geomean 1.110, behind at
# 0; 64x4608x36864 bf16 0.79-0.80 -> 0.98 x torch); with 32 steps 8 cases 0.959-1.034x
# (geomean 0.995, behind at 5); with 24 or fewer 28 cases 0.750-1.074x (geomean 0.959,
# behind at 16; GPT-2 XL's 4800x1600, 8 steps a unit, 0.75-0.89: the split's counts and
# slab reduction, not the weight's stream,
# are most of a short unit's time). Call 3, this rule against the package before at the
# three real weights' token counts the first two did not run (24, 40, 56, 72, 88 tokens:
# other token tiles; scripts/lab/issue32_tallcheck.json, both dtypes): 30 cases
# 1.071-1.368x (geomean 1.172, behind at 0).
TALL_SPLIT_MIN_K_STEPS = 48
TALL_SPLIT_MIN_GAIN = 1.5  # CTAs of the 128-row split over the 64-row grid's, at least


# The split model (v12's SPLIT_K > 1: one wave of units, each a K range of a tile, then the
# spread reduction). Fitted by scripts/fit_chooser.py to every split kernel of
# results/lab/v12_split_h200.jsonl (chooser_h200.json "split"):
#
#     time = f + r * slab_kb + max(hbm_mb / hbm_tb_s, u * unit_kb)      microseconds
#
# f: the launch, the counts and the wait for the slowest unit; r: per KB of a tile's fp32
# slab (each unit writes one and reads one's worth); hbm_mb / hbm_tb_s: every operand
# byte from HBM once at the sustained rate (MB / (TB/s) = us); u * unit_kb: a unit's own
# operand bytes ((BLK_M + BLK_N) x 64 x 2 per K step) at one SM's streaming rate. Whichever
# of the last two binds: the split exists to put every SM on a shape the data-parallel
# tile leaves idle, until HBM is the limit. Its fit's error is about 8% RMS; 64x32 tiles
# ran 16-19% slower than it predicts (their stage is mostly fixed cost), so they are not
# split candidates.
SPLIT_TILES = ((64, 64), (64, 128), (128, 64), (128, 128))
# 128x256 was tried as a fifth (issue 32, after a held-out check): at 200x3584x18944 it ran
# 0.76-0.77x torch split in 4 against 0.64-0.67x for the pick then (128x128 in 2), as the
# model ranks them (60.9 us against 72.1; measured 65 and 76,
# results/lab/v12_swapsk_h200.jsonl). At the four shapes it would have taken next, off the
# fit, it lost in the same run (results/lab/v12_swapsk_check_h200.jsonl, two passes):
# 256x4096x14336 0.85-0.98 against 0.91-1.05, 1024x1024x8192 0.77-0.78 against 0.89-0.90,
# 200x8192x28672 0.72-0.73 against 0.82-0.86, 2000x512x8192 0.84-0.87 against 1.00-1.03;
# and 256x5120x13824 0.75 against 1.00 in the held-out run. Not adopted: the split model
# fitted on 64- and 128-wide tiles does not see what a 128x256 unit costs.
# a split is taken where predicted faster than the best data-parallel candidate by more
# than this share (the split fit's RMS error is about 8%; 128x8192x28672, where the two
# are predicted within 2%, ran 1.17x torch data-parallel)
SPLIT_MARGIN = 0.05


def split_count(max_split: int, k_tiles: int) -> int:
    """The split of ``k_tiles`` K steps into at most ``max_split`` units: the largest S
    that divides the K steps, when it keeps at least half of max_split, else max_split.
    Measured on the H200 (results/lab/v12_split_focus_h200.jsonl, three passes each, bf16,
    CUDA graphs): 128x128x65536 in 64x64 tiles ran 0.97-1.00x torch split in 32 (1024 K
    steps, 32 each) and 0.82-0.85x in 33, the most that fit (31-32 steps each, uneven
    range starts); 64x128 in 32 against 33 at 128x256x32768: 0.96-1.04 against 0.93-1.00.
    The split model has no term for it (its fit is on the sweep's splits)."""
    if max_split < 2:
        return max_split
    even = max(s for s in range(1, max_split + 1) if k_tiles % s == 0)
    return even if 2 * even >= max_split else max_split


def split_terms(bm: int, bn: int, split: int, M: int, N: int,
                K: int) -> tuple[float, float, float]:
    """(slab KB, HBM MB, unit KB) of a split kernel (the split model's terms)."""
    steps = _ceil_div(_ceil_div(K, BLK_K), split)
    return (bm * bn * 4 / 1e3, (M * K + N * K + M * N) * 2 / 1e6,
            steps * (bm + bn) * BLK_K * 2 / 1e3)


def predict_split(bm: int, bn: int, split: int, M: int, N: int, K: int) -> float | None:
    """The split model's time in microseconds (None when chooser_h200.json has no fit)."""
    fit = _document().get("split")
    if not fit:
        return None
    slab, hbm, unit = split_terms(bm, bn, split, M, N, K)
    return fit["f"] + fit["r"] * slab + max(hbm / fit["hbm_tb_s"], fit["u"] * unit)


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


# Swap-AB with stream-K for decode (v12's STREAM_K=True with SWAP_AB=True, persistent) was
# tried against the non-persistent swap-AB kernel, whose grid puts ceil(tiles / SMs) CTAs
# on the busiest SM (144 weight tiles: 12 SMs run two). In the sweep (bf16, CUDA graphs,
# two passes, results/lab/v12_swapsk_h200.jsonl) it won where that grid was unbalanced and
# K long: 2x10240x8192 0.98-0.99 against 0.82, 4x9216x3072 0.94 against 0.90; it lost with
# 36 K steps (1x9216x2304 0.71-0.73 against 0.76-0.77) and on balanced grids
# (16x28672x8192 0.90-0.93 against 0.97). A rule from that (balance under 75%, at least 48
# K steps) lost at the three shapes it would have taken next, checked in the same run
# (results/lab/v12_swapsk_check_h200.jsonl): 1x11008x4096 0.82-0.83 against 0.82-0.85,
# 24x12288x4096 0.80-0.81 against 0.87, 40x11008x4096 0.80-0.81 against 0.85-0.88. Two
# CTAs sharing an SM pull more bytes than one, so the SM count per CTA is not what bounds a
# bandwidth-bound grid; no rule was adopted against the non-persistent kernel (up to
# SWAP_NP_MAX_M tokens). Past it the persistent swap-AB kernel takes stream-K over a short
# last wave (swap_stream_k, below).


# PDL on the non-persistent swap-AB kernel. With PDL the next kernel's CTAs launch while
# this one runs and wait on its SMs; measured as CUDA graphs of 20 launches (bf16, three
# passes each; results/lab/v12_pdl_np_split_h200.jsonl, then the check at shapes off that
# set, v12_pdl_np_split_check_h200.jsonl), this kernel ran slower with it wherever its
# grid has more CTAs than the GPU has SMs:
#   2x10240x8192 (160 CTAs) 0.80-0.82 with PDL, 1.03-1.05 without; 1x9216x2304 (144)
#   0.77-0.79 / 0.94-0.95; 4x9216x3072 (144) 0.89-0.91 / 1.12-1.13; 8x14336x4096 (224)
#   0.94 / 0.95-0.98; 48x14336x4096 (224) 0.92-0.93 / 0.93-0.95; and in the check
#   1x11008x4096 (172) 0.82-0.86 / 0.95-0.97, 24x12288x4096 (192) 0.91-0.93 / 0.96-1.02,
#   40x11008x4096 (172) 0.84-0.86 / 0.91-0.95, 16x14336x4096 (224) 0.94-1.00 /
#   0.96-1.03, 12x37888x3584 (592) level;
# and faster with it where the grid fits one CTA per SM: 1x4608x3584 (72) 0.80-0.81 /
# 0.77-0.78, 1x8192x8192 (128) 0.98-1.00 / 0.96-0.98. (Eager launches, with events
# between them, do not overlap, and saw none of this.) So PDL only where the CTAs fit the
# SMs (why the early launch costs that much is not measured). The split kernels (S > 1,
# at most one unit per SM) keep PDL: with it they were
# level or faster at 7 of the 10 shapes measured (the three 128x128 ones with M = 200 or
# 512 ran 2-20% faster without: 200x3584x18944 0.63-0.65 / 0.76-0.79).


def swap_pdl(M: int, N: int, K: int) -> bool:
    """Whether the persistent swap-AB kernel (above SWAP_NP_MAX_M tokens) is built with PDL:
    its bytes at the HBM rate take at most PDL_MAX_US, the model's own threshold for short
    kernels (77x7168x2048 64x80: 1.01x torch with it, 0.94-0.95x without in one run,
    results/lab/v12_swapsk_h200.jsonl; in the suite's CUDA graphs 0.99-1.01 against 0.94
    the run before)."""
    return hbm_floor(M, N, K) <= PDL_MAX_US


# Stream-K over the persistent swap-AB kernel's tail (v12's STREAM_K with SWAP_AB, issue
# 32): between SWAP_NP_MAX_M and SWAP_AB_TILES[-1] tokens, a wide weight's tiles can leave a
# last wave under half full (Qwen2.5-7B's 18944-row up projection: 148 tiles of 128 rows, 16
# in the second wave), which the weight's stream then crosses on 16 SMs. There the kernel
# cuts the tail's tiles into K units over every CTA (tirx_gemm/streamk.py), as CUTLASS does
# for a tail under half full. Through matmul against the package before (9d08ce2; H200, CUDA
# graphs interleaved with torch, two passes, results/lab/matmul_graph_h200_swaptail.jsonl):
# call 2 at 56-96 tokens on six wide weights (scripts/lab/issue32_swaptail.json) 30 cases
# 0.969-1.096x (geomean 1.024, behind at 4); call 3, the rule as committed at five other
# weights, Llama-3-70B's qkv among them (64-row tiles), and other token counts
# (scripts/lab/issue32_swskcheck.json) 20 cases 0.976-1.219x (geomean 1.077, behind at 3,
# all at Llama-2-7B's 22016x4096, 64 K steps). Call 1 tried 64-row tiles instead, whose last
# wave is fuller, at call 2's shapes: 35 cases 0.933-1.070x (geomean 1.022, behind at 10),
# ahead at 148-320 tiles of 128 rows, mixed at 448-576 (59136 rows 0.933-0.993, 57344
# 0.974-1.022): not adopted.
def swap_tiles(M: int, N: int, sm_count: int = SMS_H200) -> int | None:
    """The persistent swap-AB kernel's one-CTA tiles at M tokens (weight tiles by token
    tiles, :func:`swap_ab_tile`), or None past swap-AB's token tiles."""
    swap = swap_ab_tile(M, N, sm_count)
    return None if swap is None else _ceil_div(N, swap[0]) * _ceil_div(M, swap[1])


def last_wave_fill(tiles: int, sm_count: int = SMS_H200) -> float:
    """How full the last wave of ``tiles`` one-CTA tiles on ``sm_count`` SMs is (0-1]."""
    return tiles / (_ceil_div(tiles, sm_count) * sm_count)


def swap_stream_k(M: int, N: int, sm_count: int = SMS_H200) -> bool:
    """Whether the persistent swap-AB kernel (above SWAP_NP_MAX_M tokens, no split) runs
    stream-K over its last wave: more tiles than SMs, and a last wave under half full."""
    tiles = swap_tiles(M, N, sm_count)
    return tiles is not None and tiles > sm_count and 0 < tiles % sm_count < sm_count / 2


# Clusters of four along the weight for the persistent swap-AB kernel (issue 32, stop 53;
# v12's CLUSTER=4): four CTAs of consecutive weight tiles share one token tile, each
# loading a share of it multicast to all four, so the token rows leave L2 once per four
# tiles instead of once per tile. At 49-96 tokens a 64-row weight tile's stage holds as
# many token rows as weight rows: half of what the SMs pull from L2 is the same tokens
# again. cuBLAS runs these layers on 4x1 and 4x2 clusters (72x4608x4096: 64x72 tiles in
# 4x1 clusters; results/logs/ncu/h200_mdec_*). Two things bound it:
# - a cluster's CTAs share one GPC, and not every GPC holds a whole number of clusters of
#   four: the H200 holds SWAP_CLUSTER_MAX_CLUSTERS = 30 of them at once, 120 of its 132
#   SMs (the driver's count, cuOccupancyMaxActiveClusters, for both kernels' footprints:
#   results/lab/cluster_occupancy_h200.jsonl, scripts/lab/cluster_occupancy.py). The grid's
#   clusters with tiles must not outnumber them (28 ran well, 32 ran a second wave: below),
#   so the 64-row weight tile if its clusters are that few, else the 128-row one;
# - the one-CTA grid it replaces must leave SMs idle: its last wave at most
#   SWAP_CLUSTER_MAX_FILL full. Where the one-CTA tiles fill the SMs, the weight's bytes
#   bind and the lock-step of four CTAs costs more than the token re-reads save.
# Measured through matmul (H200, CUDA graphs interleaved with torch, two passes, one bundle;
# results/lab/matmul_graph_h200_c4.jsonl; README's "Clusters of four along the weight" has
# the per-layer figures): call 1, two lab variants putting every persistent swap-AB pick at
# 49-96 tokens of scripts/lab/issue32_mdec.json in clusters of four (bf16); where this rule
# picks clusters, their kernels ran 12 cases 0.946-1.253x (geomean 1.085, behind at 2), and
# the variants lost where the one-CTA grid fills the SMs and past the clusters the GPU holds.
# Call 2, the rule against 6bb7121's matmul, both dtypes at 28 layers off that set
# (scripts/lab/issue32_c4check.json): 24 cases 0.929-1.492x (geomean 1.191, behind at 4:
# 56-60 tokens on 64-row tiles); at the mdec set again 12 cases 0.933-1.349x (geomean
# 1.087, behind at 3).
SWAP_CLUSTER = 4
SWAP_CLUSTER_MAX_FILL = 2 / 3
SWAP_CLUSTER_MAX_CLUSTERS = 30


def swap_clusters(N: int, rows: int) -> int:
    """Clusters of SWAP_CLUSTER CTAs along a weight of N rows in ``rows``-row tiles."""
    return _ceil_div(N, rows * SWAP_CLUSTER)


def swap_cluster_rows(M: int, N: int, sm_count: int = SMS_H200) -> int | None:
    """The weight tile (64 or 128 rows) of the persistent swap-AB kernel run in clusters of
    SWAP_CLUSTER along the weight, or None where it runs one CTA per tile: past
    SWAP_NP_MAX_M tokens, a one-CTA grid whose last wave is at most SWAP_CLUSTER_MAX_FILL
    full, and the smallest tile whose clusters the GPU holds at once. (matmul asks only
    where it runs that kernel: no split_plan at the shape.)"""
    tiles = swap_tiles(M, N, sm_count)
    if tiles is None or M <= SWAP_NP_MAX_M or sm_count % SWAP_CLUSTER:
        return None
    if last_wave_fill(tiles, sm_count) > SWAP_CLUSTER_MAX_FILL:
        return None
    return next((rows for rows in (64, 128)
                 if swap_clusters(N, rows) <= SWAP_CLUSTER_MAX_CLUSTERS), None)


def np_swap_pdl(M: int, N: int, token_tile: int, sm_count: int = SMS_H200) -> bool:
    """Whether the non-persistent swap-AB kernel is built with PDL: its CTAs (64-row weight
    tiles by token tiles) fit one per SM."""
    return _ceil_div(N, SWAP_SPLIT_ROWS) * _ceil_div(M, token_tile) <= sm_count


# Swap-AB splits past decode (issue 32, the held-out check): between SWAP_AB_TILES[-1] and
# WIDE_SWAP_MAX_M tokens, a split can also run swapped tiles whose token tile holds the
# tokens in one or a few pieces of a multiple of 16 (wgmma's N up to 256): 200 tokens in
# one tile of 208 rather than 64- or 128-row tiles padded to 256 rows. Fewer output tiles
# leave room for a deeper split, and the split model (symmetric in the tile's two sides)
# rates them as it rates the others. cuBLAS runs these shapes the same way (200x3584x18944:
# a 128x200 tile over the weight's rows and the tokens, split-K;
# results/lab/cublas_kernels_heldout_h200.jsonl). Measured on the H200 (bf16, CUDA graphs,
# two passes; results/lab/v12_wideswap_h200.jsonl, then a check at nine shapes the rule
# would change, v12_wideswap_check_h200.jsonl), the split model's pick against the pick
# before it, x torch:
#   200x3584x18944  128x208 swap split 4  1.00-1.02 (predicted 53.3 us, measured 51.1);
#                   128x128 split 2 0.67 (the best data-parallel tile, 64x112: 0.67-0.71)
#   333x4096x14336  128x176 swap split 2  0.93-1.04 against 64x208 0.83-0.96
#   160x4096x14336  128x160 swap split 4  0.98-0.99 against 64x96 0.72-0.75
#   200x4096x11008 0.99 against 0.72-0.73; 200x3584x14336 0.99 against 0.68-0.69;
#   200x8192x28672 0.92-1.00 against 0.80; 400x4096x14336 1.05-1.10 against 0.87-0.92;
#   97x4096x14336 0.98-1.01 against 0.94-0.97.
# After the ring rule below, at nine more shapes where it changes the pick, few weight rows
# and a deep K among them (v12_wideswap_check2_h200.jsonl, three passes): ahead or level at
# all nine, e.g. 200x256x32768 0.99-1.03 against 0.91-0.93, 300x256x16384 1.02-1.04
# against 0.96-0.97, 100x256x32768 0.92-1.00 against 0.85-0.91, 200x8192x8192 0.85-0.86
# against 0.82; 330x128x12288 and 400x128x65536 level.
# A unit whose ring holds fewer than WIDE_SWAP_MIN_STAGES stages is no candidate: 128x256
# (48 KB a stage, 4 fit) ran slower than the model says wherever it was tried, swapped
# (256x5120x13824 split 3: 0.79-0.81 against 1.04-1.05 for 64x160 data-parallel;
# 256x4096x14336: 0.90-1.13 against 0.95-1.14 for 128x128 in two token pieces) or not
# (SPLIT_TILES' note above). The same tiles data-parallel (no split) were level or behind
# (150x11008x4096 128x160: 0.87-0.90 against 0.92-0.93; 100x16384x3072 level;
# 200x4096x4096 0.75-0.86 against 0.92-0.97), so only splits take them. (Those data-parallel
# swapped tiles stored D element by element; stored by TMA they run past DP_SWAP_MIN_M
# tokens when the model prefers them, below.)
# Data-parallel swap-AB past decode (no split: the plain candidates' figures with the
# shape's two sides swapped, taken where predicted more than 5% faster) was tried at eight
# shapes with few weight rows and many tokens, where the model predicted 6-17% (bf16, CUDA
# graphs, three passes, results/lab/v12_dpswap_h200.jsonl, swapped against the pick):
# 3000x512x3072 0.88-0.89 against 0.83-0.85 and 3152x768x3072 0.93-0.94 against 0.90-0.92,
# but 1500x768x3072 0.85-0.86 against 0.94-0.96 and 6000x768x768 0.80-0.83 against
# 0.87-0.90. At the same tile a swapped 128x192 ran 0.92-0.95 against 0.99-1.02 (4096x768x3072):
# the swapped kernel stores D's transpose element by element (no TMA store), which costs
# what the better wave fill gains. Not adopted.
# Data-parallel swap-AB past decode, stored by TMA (v12's SWAP_TMA, issue 32): the swapped
# kernel's packed fragment goes through stmatrix .trans to a staging tile as D's own rows
# and out by TMA, as the plain tiles store, which the element stores above could not match.
# Measured on the H200 (results/lab/v12_swaptma_h200.jsonl: swap-AB tiles with and without
# SWAP_TMA and the plain tiles, each alternated with torch.mm alone, 13 shapes, fp16 and
# bf16, every kernel checked): 3152x768x3072 128x144 swapped 0.91 with element stores,
# 0.99 with SWAP_TMA, against 0.90 for the plain pick (128x160); 6000x768x768 128x144
# 0.75 and 0.96 against 0.85-0.87; 4096x768x3072 128x192 0.91 and 1.00 against 1.01 for the
# same tile plain; 2304^3 128x176 0.78-0.81 and 0.94 against 0.92-0.93 (128x168). At decode
# widths it lost (1x4096x4096 64x16: 0.87-0.88 against 0.96-1.01; 8x14336x4096 0.92-0.93
# against 0.96-0.98): a few tokens are a small D tile, whose element stores cost less than
# the TMA store's barriers, so decode keeps them. The rule: past DP_SWAP_MIN_M tokens (first
# past WIDE_SWAP_MAX_M, see DP_SWAP_MIN_M; the splits are asked first below it), the
# model's best one-CTA tile of the swapped problem (N x M x K: rows over the weight, the
# tokens as columns) where it is predicted more than DP_SWAP_MARGIN faster than the best
# plain candidate. Its token tiles are multiples of 16 (SWAP_TMA's stmatrix step), so their
# count, ceil(M / BLK_N), changes only where M crosses a multiple of 16: one M per 16-row
# block decides the kernel (matmul_choice.variants starts a block every DP_SWAP_TOKEN_STEP
# rows past DP_SWAP_MIN_M). Not with a misaligned K (the pair rule's case, which the
# model does not see).
# Through matmul (CUDA graphs, interleaved with torch, both dtypes, the package before the
# rule beside it; scripts/lab/h200_dpswap.sh): 12 narrow-weight shapes 1.026 against 0.92-0.93
# (geomean; results/lab/matmul_graph_h200_dpswap.jsonl), 8 at M not a multiple of 64
# 0.99 against 0.88 (..._dpswap16.jsonl), 8 wide-weight ones 1.02 against 0.96
# (..._dpswapw.jsonl); one loss, 4400x2304x768, where it displaced v10's ping-pong (1.01
# against 1.08; the model does not see v10's hidden epilogue; v10 runs there again since,
# in its band, pingpong_band).
DP_SWAP_MARGIN = 0.05
DP_SWAP_TOKEN_STEP = 16  # SWAP_TMA's token tiles: one x4 stmatrix .trans per 16 tokens
WIDE_SWAP_MAX_M = 512
# the data-parallel swap-AB rule applies past this many tokens (one 128-row tile; decode's
# swap-AB tiles end at 96, and the splits, asked first, run to WIDE_SWAP_MAX_M): it was
# first taken past WIDE_SWAP_MAX_M only, since
# swapped tiles had been measured level or behind below it while they stored D element by
# element; with SWAP_TMA they were ahead at every one of 23 shapes of 129-448 tokens where
# the lower bound changes the pick (results/lab/matmul_graph_h200_dpswaplow.jsonl)
DP_SWAP_MIN_M = 128
WIDE_SWAP_STEP = 16         # the token tile: a multiple of this
WIDE_SWAP_ROWS = (64, 128)  # weight rows per tile: one or two consumer warpgroups
WIDE_SWAP_MIN_STAGES = 5    # ring stages a unit's tile must leave room for


def dp_swap_rows(M: int) -> int:
    """M rounded up to the data-parallel swap-AB rule's block (the tiles it rates count the
    tokens in steps of DP_SWAP_TOKEN_STEP: the same count for every M of a block)."""
    return _ceil_div(M, DP_SWAP_TOKEN_STEP) * DP_SWAP_TOKEN_STEP


def dp_swap_tile(M: int, N: int, K: int, sm_count: int = SMS_H200) -> tuple[int, int] | None:
    """(BLK_M, BLK_N) of a data-parallel swap-AB kernel with SWAP_TMA (BLK_M walks the
    weight's rows, BLK_N the tokens) where the model prefers it past DP_SWAP_MIN_M tokens
    (see above), else None."""
    if M <= DP_SWAP_MIN_M or misaligned_rows(K):
        return None
    plain = rank(M, N, K, sm_count)[0][0]
    swapped = next(((t, c) for t, c in rank(N, dp_swap_rows(M), K, sm_count)
                    if c not in (V9, V10) and not clustered(c)
                    and tile(c)[1] % DP_SWAP_TOKEN_STEP == 0), None)
    if swapped is None or swapped[0] >= plain * (1 - DP_SWAP_MARGIN):
        return None
    bm, bn, _ = tile(swapped[1])
    return bm, bn


def wide_swap_tokens(M: int, extra_pieces: int = 0) -> int:
    """The token tile of a swap-AB split at M tokens: M cut into the fewest pieces of at
    most 256 (plus ``extra_pieces``), each rounded up to WIDE_SWAP_STEP."""
    pieces = _ceil_div(M, 256) + extra_pieces
    return _ceil_div(_ceil_div(M, pieces), WIDE_SWAP_STEP) * WIDE_SWAP_STEP


def wide_swap_token_tiles(M: int) -> tuple[int, ...]:
    """The token tiles a swap-AB split past decode may take at M tokens: the fewest pieces
    of at most 256, or one more (what :func:`best_wide_swap_split` rates)."""
    return tuple(wide_swap_tokens(M, extra) for extra in (0, 1))


def ring_stages(bm: int, bn: int) -> int:
    """Operand stages (BLK_K deep) of a bm x bn tile that fit a CTA's shared memory."""
    return spec.ring_stages((bm + bn) * BLK_K * 2)


# v12's plain tiles store D through 64x64 staging tiles (one TMA store per 64 columns); a
# tile whose width is not a multiple of 64 stores its last columns either element by element
# from the registers or, with TAIL_TMA, through one more staging tile of their width and
# one more TMA store. That tile is the tile's own unless it would cost the default ring a
# stage; then it lies over the last chunk's staging tile (TAIL_SHARED in the builder) and
# waits for that chunk's store to have read it. Measured on the H200, interleaved with
# torch, fp16 and bf16, two passes (results/lab/v12_tailtma_h200.jsonl, scripts/lab/
# streaming_sweep.py --set tailtma): with a tile of its own TAIL_TMA ran level or ahead
# wherever the ring kept its depth (128x160 at 4096x1280x1280 0.95-0.96 -> 1.00-1.01,
# 128x240 at 2049x3584x3584 0.92-0.95 -> 0.95-0.97) and behind where it cost a stage at a
# weight-streaming shape (128x168 at 128x10240x8192 0.73-0.78 -> 0.69-0.72, 5 stages -> 4),
# which is why the shared tile exists. Shared (results/lab/v12_tailshare_h200.jsonl, --set
# tailshare) it ran level at those shapes and ahead elsewhere where the chunks have two
# staging tiles to alternate (128x176 at 2304^3 0.88-0.89 -> 0.93-0.94), but level or
# behind where they have one, every store then waiting for the one before (128x208 at
# 4096x7680x2560 1.05-1.06 -> 1.04). Through matmul: results/lab/
# matmul_graph_h200_tailtma.jsonl, results/lab/matmul_graph_h200_tailshare.jsonl.
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


def tail_tma(bm: int, bn: int) -> bool:
    """Whether matmul stores a plain one-CTA bm x bn tile's last bn % 64 columns by TMA
    (v12's TAIL_TMA): the tile is wider than one 64-column chunk (as every tile measured
    was) and has such columns, and its tail has a staging tile of its own or lies over
    one of two the chunks alternate (see above). The ring keeps its depth either way."""
    if bn <= EPI_COLS or bn % EPI_COLS == 0:
        return False
    own = staging_bytes(bm, bn, True) > staging_bytes(bm, bn)
    return own or (bn // EPI_COLS) % 2 == 0


def best_wide_swap_split(M: int, N: int, K: int, sm_count: int = SMS_H200):
    """(predicted us, BLK_M, token tile, S) of the fastest swap-AB split the split model
    sees for M tokens past decode (see above), or None outside that range: weight tiles of
    WIDE_SWAP_ROWS by the tokens in the fewest pieces or one more."""
    if not SWAP_AB_TILES[-1] < M <= WIDE_SWAP_MAX_M:
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


def split_plan(M: int, N: int, K: int, sm_count: int = SMS_H200):
    """v12's SPLIT_K plan for an MxNxK GEMM, or None: ``(BLK_M, BLK_N, SWAP_AB, S,
    PIPE_DEPTH or None)``, S = 1 being the non-persistent swap-AB kernel (see the
    measurements above). Every plan keeps tiles x S <= sm_count (all units resident)."""
    k_tiles = _ceil_div(K, BLK_K)
    swap = swap_ab_tile(M, N, sm_count)
    if swap is not None:
        tiles = _ceil_div(N, SWAP_SPLIT_ROWS)
        tokens = next(t for t in SWAP_SPLIT_TILES if t >= swap[1])  # a split's token tile
        split = split_count(min(sm_count // tiles, k_tiles // SPLIT_MIN_K_STEPS, SPLIT_MAX),
                            k_tiles)
        if 2 * tiles <= sm_count and split >= 2:
            return SWAP_SPLIT_ROWS, tokens, True, split, None
        if 2 * tiles > sm_count:  # the 64-row grid leaves SMs idle: 128-row tiles split
            tall = _ceil_div(N, 2 * SWAP_SPLIT_ROWS)
            split = split_count(min(sm_count // tall, k_tiles // TALL_SPLIT_MIN_K_STEPS,
                                    SPLIT_MAX), k_tiles)
            if split >= 2 and tall * split >= TALL_SPLIT_MIN_GAIN * min(tiles, sm_count):
                return 2 * SWAP_SPLIT_ROWS, tokens, True, split, None
        if M <= SWAP_NP_MAX_M:
            return (SWAP_SPLIT_ROWS, max(SWAP_NP_MIN_TOKENS, swap[1]), True, 1,
                    SWAP_NP_DEPTH)
        return None
    # the split model against the data-parallel one: a split where it predicts faster
    # than the best data-parallel candidate (whose prediction is what the rest of the
    # chooser goes by)
    plain = best_split(M, N, K, sm_count)
    wide = best_wide_swap_split(M, N, K, sm_count)
    picks = [(p, swapped) for p, swapped in ((plain, False), (wide, True)) if p is not None]
    if not picks:
        return None
    pick, swapped = min(picks, key=lambda ps: ps[0])
    if pick[0] >= rank(M, N, K, sm_count)[0][0] * (1 - SPLIT_MARGIN):
        return None
    _, bm, bn, split = pick
    return bm, bn, swapped, split, None


# A fused epilogue's tile: BLK_N a multiple of 16. SWIGLU needs it (whole gate/up group
# pairs: epilogue.SWIGLU_TILE_STEP), and the odd multiples of 8 have run on the H200 as
# plain kernels only (results/lab/v12_widths8_*), never with an epilogue.
EPILOGUE_TILE_STEP = 16


def best_tile(M: int, N: int, K: int, sm_count: int = SMS_H200, n_step: int = 1) -> str:
    """The fastest v12 tile ("BMxBN") the model predicts, v9 left out: what a GEMM with a
    fused epilogue (tirx_gemm.epilogue) gets, since only v12 builds the epilogue (v9 and
    v11 have none). M, N, K are the kernel's GEMM (SwiGLU: N = 2 x the output columns).
    The model has no term for the epilogue's own cost (fitted on plain runs). One-CTA
    tiles only: v12's CTA pairs have not been checked with an epilogue on a GPU. ``n_step``:
    a BLK_N multiple of it (matmul asks for EPILOGUE_TILE_STEP)."""
    return next(c for _, c in rank(M, N, K, sm_count, pdl=False)
                if not clustered(c) and tile(c)[1] % n_step == 0)


def epilogue_step(M: int, N: int, K: int, epi: dict, sm_count: int = SMS_H200,
                  setting: str | None = None) -> str:
    """The step ("v12" or "v10") for a GEMM MxNxK with the fused epilogue ``epi`` (builder
    keywords that differ from the plain kernel; N the kernel's columns), under
    ``setting`` (default: :data:`EPILOGUE_STEP`). "v10" only when set to it, the epilogue
    is BIAS and/or ACT alone, and v10's tiles give every CTA at least
    PINGPONG_MIN_TILES_PER_CTA (its two warpgroups then alternate; with one tile a CTA has
    nothing to hide the epilogue under)."""
    setting = EPILOGUE_STEP if setting is None else setting
    if setting not in EPILOGUE_STEP_CHOICES:
        raise ValueError(f"EPILOGUE_STEP={setting!r} must be one of "
                         f"{', '.join(map(repr, EPILOGUE_STEP_CHOICES))}")
    if setting != V10 or not epi or not set(epi) <= set(V10_KEYWORDS):
        return V12
    return V10 if v10_tiles(M, N) >= PINGPONG_MIN_TILES_PER_CTA * sm_count else V12
