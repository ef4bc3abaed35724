"""Split-K (step v11): how many K splits a shape gets, and the workspace they need.

TVM- and torch-free: the builders, the registry (``Step.workspace``), the run side and the
tests all read this one module.

Why split K: a GEMM with few output tiles and a deep K (256x256x16384: 2 to 4 tiles) keeps
2 to 4 SMs busy for the whole K loop while the other ~130 idle. Cutting each tile's K range
into S splits makes ``tiles * S`` work units; each computes an fp32 partial tile over its K
range, and the partials are summed. The sum costs extra traffic: every unit writes its
partial (one fp32 tile) to a workspace slab, and the unit that completes a tile reads all S
slabs of it back, in the fixed order split 0, 1, .., S-1 (the same bits on every run,
whatever order the units finish in), and writes D.

The heuristic (:func:`choose_split`) balances the two costs with a small model, in units of
"one K step of one CTA" (loading and multiplying one BLK_K slice of its tile):

* the K loop of a unit takes ``k_tiles / S`` steps;
* the completing unit reads S slabs; reading one fp32 slab (BM x BN x 4 bytes) costs about
  what loading one K step (``(BM + BN) x BK x 2`` bytes) costs: ``REDUCE_COST`` steps each
  (2 for 128x128 tiles, 2.7 for 128x256);
* so the time is ``k_tiles / S + REDUCE_COST * S``, smallest at
  ``S = sqrt(k_tiles / REDUCE_COST)``.

Then three hard limits: ``tiles * S <= sm_count`` (no second wave of units: splitting
exists to fill the GPU once, and a tile count that fills it already gets S = 1), at least
``min_k_tiles`` K steps per split (a split must amortise its pipeline fill and its slab),
and ``S <= max_split`` (the completing unit's serial read of S slabs, 64-128 KiB each,
must stay short next to its K loop).
"""

from __future__ import annotations

import math

MAX_SPLIT = 16          # at most this many splits: the completing unit reads S slabs alone
MIN_K_TILES = 4         # K steps (of BLK_K = 64) every split keeps at least
ACC_BYTES = 4           # fp32 partial sums
OPERAND_BYTES = 2       # fp16 / bf16 operands

# each arch's v11 tile (BLK_M, BLK_N, BLK_K) and the threads that own one tile's
# accumulator (sm_100a: the epilogue warpgroup, one TMEM row each; sm_90a: two consumer
# warpgroups of 64 rows each, which count and reduce their halves separately)
TILES = {"sm_100a": (128, 128, 64), "sm_90a": (128, 256, 64)}
COUNTERS_PER_TILE = {"sm_100a": 1, "sm_90a": 2}
DEFAULT_SM_COUNT = {"sm_100a": 148, "sm_90a": 132}  # B200, H100/H200 SXM


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tile_counts(M: int, N: int, K: int, arch: str = "sm_100a") -> tuple[int, int]:
    """(output tiles, K tiles) of a shape on ``arch``'s v11 tile; both ceil-divided."""
    bm, bn, bk = TILES[arch]
    return _ceil_div(M, bm) * _ceil_div(N, bn), _ceil_div(K, bk)


def reduce_cost(arch: str = "sm_100a") -> float:
    """K steps that reading one fp32 partial slab costs (bytes of a slab over the bytes of
    a K step's operand tiles): 2.0 on sm_100a (128x128), 2.67 on sm_90a (128x256)."""
    bm, bn, bk = TILES[arch]
    return (bm * bn * ACC_BYTES) / ((bm + bn) * bk * OPERAND_BYTES)


def choose_split(M: int, N: int, K: int, sm_count: int, *, arch: str = "sm_100a",
                 max_split: int = MAX_SPLIT, min_k_tiles: int = MIN_K_TILES) -> int:
    """The number of K splits v11 uses for an M x N x K GEMM on ``sm_count`` SMs.

    1 (data-parallel, no workspace) whenever the output tiles alone fill the SMs, whenever
    no split would keep ``min_k_tiles`` K steps, or whenever the model above prefers it;
    else ``min(sqrt(k_tiles / reduce_cost), sm_count // tiles, k_tiles // min_k_tiles,
    max_split)``. Never more splits than K tiles."""
    for name, v in (("M", M), ("N", N), ("K", K), ("sm_count", sm_count),
                    ("max_split", max_split), ("min_k_tiles", min_k_tiles)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")
    tiles, k_tiles = tile_counts(M, N, K, arch)
    if tiles >= sm_count:
        return 1
    by_cost = math.isqrt(int(k_tiles / reduce_cost(arch)))  # floor(sqrt(...))
    split = min(by_cost, sm_count // tiles, k_tiles // min_k_tiles, max_split)
    return max(1, split)


def split_k_range(k_tiles: int, split: int, s: int) -> tuple[int, int]:
    """K tiles [k0, k1) of split ``s`` of ``split``: a balanced partition (sizes differ by at
    most one; every split has one when split <= k_tiles). The kernels compute the same."""
    return s * k_tiles // split, (s + 1) * k_tiles // split


def resolve(M: int, N: int, K: int, kwargs: dict | None, arch: str = "sm_100a") -> int:
    """The SPLIT_K a v11 build with these keywords uses (its builder resolves it the same
    way): SPLIT_K if given, else choose_split at SM_COUNT (default: the arch's GPU)."""
    kwargs = dict(kwargs or {})
    split = kwargs.get("SPLIT_K")
    if split is None:
        split = choose_split(M, N, K, kwargs.get("SM_COUNT") or DEFAULT_SM_COUNT[arch],
                             arch=arch)
    return split


def workspace_specs(M: int, N: int, K: int, kwargs: dict | None = None,
                    arch: str = "sm_100a"):
    """The extra operands of v11 after D: ((name, shape, dtype), ...); none when SPLIT_K=1.

    WS  (S, tiles, BM*BN) float32: slab [s, t] holds split s's partial sums of tile t, in
        the order of the threads that own the accumulator (thread-major chunks of 4, so
        that both the writes and the reads of a warp are contiguous). Scratch: every
        element a launch reads, the same launch wrote first, so it needs no initial value.
    CNT (tiles * counters_per_tile,) int32: arrivals per tile (sm_90a: per 64-row half).
        Must be zero when a launch starts; the unit that completes a tile sets its counter
        back to zero, so it is zero again when the launch ends."""
    split = resolve(M, N, K, kwargs, arch)
    if split == 1:
        return ()
    bm, bn, _ = TILES[arch]
    tiles, _ = tile_counts(M, N, K, arch)
    return (("WS", (split, tiles, bm * bn), "float32"),
            ("CNT", (tiles * COUNTERS_PER_TILE[arch],), "int32"))


def workspace_specs_sm90a(M: int, N: int, K: int, kwargs: dict | None = None):
    """workspace_specs for the sm_90a v11 (128x256 tiles, a counter per 64-row half)."""
    return workspace_specs(M, N, K, kwargs, arch="sm_90a")
