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

A second reduction, ``REDUCE="spread"``: every unit publishes and counts itself as above,
then waits until the tile's counter shows all S arrivals and reduces its own 1/S of the
tile from all S slabs (still in split order). Each unit then reads about one slab in
total, whatever S is, so the serial read no longer caps S: ``choose_split(...,
reduce="spread")`` goes up to ``sm_count // tiles`` splits with at least
``MIN_K_TILES_SPREAD`` K steps each. The wait needs every unit of a tile resident at once
(one unit per CTA, ``tiles * S <= sm_count``): :func:`check_spread` refuses the rest.
:func:`choose_variant` picks split and reduction for ``tirx_gemm.matmul``.
"""

from __future__ import annotations

import math

from tirx_gemm import spec, streamk

MAX_SPLIT = 16          # at most this many splits: the completing unit reads S slabs alone
MIN_K_TILES = 4         # K steps (of BLK_K = 64) every split keeps at least
# REDUCE="spread", retuned from the H200 (lab/steps_on_h200/records/h200.jsonl, lab/split_k_deep_k/suites/spread.json):
# 256x256x16384 ran at 0.64x / 0.79x / 0.79x torch with 16 / 32 / 66 splits (32 = 8 K steps
# each), 128x128x65536 at 0.53x / 0.46x with 64 / 132 splits: past ~8 K steps per split
# and ~64 splits per tile the partials' traffic (S slabs written and read per tile) grows
# faster than the K loop shrinks.
MIN_K_TILES_SPREAD = 8  # K steps every split keeps at least with REDUCE="spread"
MAX_SPLIT_SPREAD = 64   # and at most this many splits of one tile
# splitting pays only with a deep enough K: at 1000x1000x1000 (16 K steps) v11 ran at
# 0.53x (last, 2 splits) and 0.56x (spread, 4) against v9's 0.57x; at 128x4096x4096
# (64 K steps) spread with 8 splits ran at 0.79x against 0.61x for last with 4
MIN_K_TILES_TO_SPLIT = 32
REDUCES = ("last", "spread")  # the builders' REDUCE keyword; "last" is the default
ACC_BYTES = 4           # fp32 partial sums
OPERAND_BYTES = 2       # fp16 / bf16 operands

# each arch's v11 tile (BLK_M, BLK_N, BLK_K) and the threads that own one tile's
# accumulator (sm_100a: the epilogue warpgroup, one TMEM row each; sm_90a: two consumer
# warpgroups of 64 rows each, which count and reduce their halves separately)
TILES = {"sm_100a": (128, 128, 64), "sm_90a": (128, 256, 64)}
# the tile widths each arch's v11 builds (its BLK_N keyword; the first entry of TILES is
# the default): sm_90a's 128x64 and 128x128 tiles give few-tile, deep-K shapes more tiles
# and halve or quarter each unit's MMA work and slab
BLK_NS = {"sm_100a": (128,), "sm_90a": (64, 128, 256)}
COUNTERS_PER_TILE = {"sm_100a": 1, "sm_90a": 2}
DEFAULT_SM_COUNT = spec.SM_COUNT  # B200, H100/H200 SXM


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_blk_n(bn, arch: str) -> None:
    """v11's BLK_N keyword: one of BLK_NS[arch]."""
    if isinstance(bn, bool) or bn not in BLK_NS[arch]:
        raise ValueError(f"BLK_N={bn!r} is not one of {', '.join(map(str, BLK_NS[arch]))} "
                         f"(v11's tile widths on {arch})")


def tile(arch: str = "sm_100a", bn: int | None = None) -> tuple[int, int, int]:
    """(BLK_M, BLK_N, BLK_K) of ``arch``'s v11 at tile width ``bn`` (None: the default)."""
    bm, default_bn, bk = TILES[arch]
    if bn is None:
        return bm, default_bn, bk
    check_blk_n(bn, arch)
    return bm, bn, bk


def tile_counts(M: int, N: int, K: int, arch: str = "sm_100a",
                bn: int | None = None) -> tuple[int, int]:
    """(output tiles, K tiles) of a shape on ``arch``'s v11 tile; both ceil-divided."""
    bm, bn, bk = tile(arch, bn)
    return _ceil_div(M, bm) * _ceil_div(N, bn), _ceil_div(K, bk)


def reduce_cost(arch: str = "sm_100a", bn: int | None = None) -> float:
    """K steps that reading one fp32 partial slab costs (bytes of a slab over the bytes of
    a K step's operand tiles): 2.0 on sm_100a (128x128), 2.67 on sm_90a (128x256)."""
    bm, bn, bk = tile(arch, bn)
    return (bm * bn * ACC_BYTES) / ((bm + bn) * bk * OPERAND_BYTES)


def check_reduce(reduce: str) -> None:
    if reduce not in REDUCES:
        raise ValueError(f"REDUCE={reduce!r} is not one of {', '.join(map(repr, REDUCES))}")


def check_spread(tiles: int, split: int, sm_count: int) -> None:
    """REDUCE="spread" waits inside a unit for the other splits of its tile: they must all
    be resident at once, or a waiting unit holds the SM the missing one needs (no unit
    ever returns). One unit per CTA and one CTA per SM: tiles x splits <= SM_COUNT."""
    if tiles * split > sm_count:
        raise ValueError(
            f"REDUCE='spread' needs tiles x SPLIT_K <= SM_COUNT (every split of a tile "
            f"resident at once), got {tiles} x {split} = {tiles * split} > {sm_count}")


def check_split(split: int, k_tiles: int, K: int, tiles: int, reduce: str,
                sm_count: int) -> bool:
    """The builders' check of a resolved split (both arches): a positive SPLIT_K of at most
    the K tiles (every split needs one), and with REDUCE="spread" every unit of a tile
    resident at once (:func:`check_spread`). Returns whether the spread reduction is built
    (a split of 1 builds no reduction at all)."""
    _check_ints(SPLIT_K=split)
    if split > k_tiles:
        raise ValueError(f"SPLIT_K={split} is more than the {k_tiles} K tiles of K={K}: "
                         f"every split needs at least one")
    spread = reduce == "spread" and split > 1
    if spread:
        check_spread(tiles, split, sm_count)
    return spread


def _check_ints(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")


def choose_split(M: int, N: int, K: int, sm_count: int, *, arch: str = "sm_100a",
                 reduce: str = "last", max_split: int = MAX_SPLIT,
                 min_k_tiles: int | None = None, bn: int | None = None) -> int:
    """The number of K splits v11 uses for an M x N x K GEMM on ``sm_count`` SMs.

    1 (data-parallel, no workspace) whenever the output tiles alone fill the SMs, or
    whenever no split would keep ``min_k_tiles`` K steps. Else, with ``reduce="last"``
    (one unit reads all S slabs): ``min(sqrt(k_tiles / reduce_cost), sm_count // tiles,
    k_tiles // min_k_tiles, max_split)`` (min_k_tiles: MIN_K_TILES); with
    ``reduce="spread"`` (each unit reads ~1 slab, whatever S): ``min(sm_count // tiles,
    k_tiles // min_k_tiles)`` (min_k_tiles: MIN_K_TILES_SPREAD; max_split does not apply).
    Never more splits than K tiles."""
    check_reduce(reduce)
    if min_k_tiles is None:
        min_k_tiles = MIN_K_TILES if reduce == "last" else MIN_K_TILES_SPREAD
    _check_ints(M=M, N=N, K=K, sm_count=sm_count, max_split=max_split,
                min_k_tiles=min_k_tiles)
    tiles, k_tiles = tile_counts(M, N, K, arch, bn)
    if tiles >= sm_count:
        return 1
    if reduce == "spread":
        return max(1, min(sm_count // tiles, k_tiles // min_k_tiles, MAX_SPLIT_SPREAD))
    by_cost = math.isqrt(int(k_tiles / reduce_cost(arch, bn)))  # floor(sqrt(...))
    split = min(by_cost, sm_count // tiles, k_tiles // min_k_tiles, max_split)
    return max(1, split)


def model_steps(k_tiles: int, split: int, reduce: str, arch: str = "sm_100a") -> float:
    """The cost model's time of one tile, in K steps of one CTA: the K loop of a split, the
    write of its slab, then the reduction's reads (the completing unit reads S slabs with
    "last", every unit ~1 slab with "spread"). No split: the K loop alone."""
    if split == 1:
        return float(k_tiles)
    rc = reduce_cost(arch)
    return k_tiles / split + rc + rc * (split if reduce == "last" else 1)


# sm_90a v11's tile width for a split (H200, bf16, lab/split_k_deep_k/suites/splitk_depths.json,
# lab/split_k_deep_k/records/splitk_h200.jsonl): a unit's time is its K loop at a per-stage cost
# that barely depends on the stage's size, plus its slab (128 x BLK_N fp32, written and
# read). With M >= 128 the A tile is all data and the split units are short (8-16 K steps),
# so the slab traffic decides: 128x64 tiles ran 128x128x65536 at 0.91x torch (128x256:
# 0.54x, 128x128: 0.67x), 256x256x16384 0.94x, 128x256x32768 0.94x, 384x128x12288 1.01x.
# Below 128 rows A is mostly zero fill and a stage's useful bytes are B's, so the widest
# stage wins: 128x256 ran 1x4096x4096 at 0.78x (128x128 0.70x, 128x64 0.58x) and
# 32x4096x14336 at 0.89x (0.73x, 0.50x).
NARROW_SPLIT_MIN_M = 128
NARROW_SPLIT_BLK_N = 64
# the rest of the measured narrow configuration: 32 slab chunks in flight per reducing
# thread (8 ran 128x128x65536 at 0.61x against 0.67x, 128x128 tiles), a 6-stage ring, and
# an L2 group of 7 tile rows (few tiles: grouping barely matters; 7 leaves splits of 16, 32
# and 64 usable with M at run time, see matmul_choice.SPLIT_MENU)
NARROW_SPLIT_KWARGS = {"IN_FLIGHT": 32, "PIPE_DEPTH": 6, "L2_GROUP": 7}


def split_blk_n(M: int, arch: str) -> int | None:
    """The BLK_N a split of an M-row GEMM builds on ``arch`` (None: the arch's default)."""
    if arch == "sm_90a" and M >= NARROW_SPLIT_MIN_M:
        return NARROW_SPLIT_BLK_N
    return None


def choose_variant(M: int, N: int, K: int, sm_count: int, arch: str = "sm_100a",
                   bn: int | None = None) -> dict:
    """The v11 builder keywords for this shape on ``sm_count`` SMs (what tirx_gemm.matmul
    builds), by measurement on the H200: no split below MIN_K_TILES_TO_SPLIT K steps;
    else {"SPLIT_K": s, "REDUCE": "spread"} whenever the spread reduction can split (all
    units resident), since it beat the last-arriver's at every shape both ran; else the
    last-arriver's split. "last" is the builders' default and is not written (cache keys
    of existing builds stay valid). SPLIT_K is always explicit, so the kernel does not
    depend on the builder's SM_COUNT default. sm_100a follows the same rule, unmeasured.
    The tile width: ``bn`` if given (a builder's BLK_N), else :func:`split_blk_n` (sm_90a:
    128x64 tiles from 128 rows up), written as "BLK_N" when it is not the default."""
    _, k_tiles = tile_counts(M, N, K, arch, bn)
    if k_tiles < MIN_K_TILES_TO_SPLIT:
        return {"SPLIT_K": 1}
    pick = split_blk_n(M, arch) if bn is None else bn
    width = {} if pick is None or pick == TILES[arch][1] else {"BLK_N": pick}
    if pick == NARROW_SPLIT_BLK_N and arch == "sm_90a" and bn is None:
        width.update(NARROW_SPLIT_KWARGS)
    spread = choose_split(M, N, K, sm_count, arch=arch, reduce="spread", bn=pick)
    if spread > 1:  # measured faster than "last" at every shape both ran (H200)
        return {"SPLIT_K": spread, "REDUCE": "spread", **width}
    last = choose_split(M, N, K, sm_count, arch=arch, reduce="last", bn=pick)
    return {"SPLIT_K": last, **width} if last > 1 else {"SPLIT_K": 1}


def split_k_range(k_tiles: int, split: int, s: int) -> tuple[int, int]:
    """K tiles [k0, k1) of split ``s`` of ``split``: a balanced partition (sizes differ by at
    most one; every split has one when split <= k_tiles). The kernels compute the same."""
    return s * k_tiles // split, (s + 1) * k_tiles // split


def resolve_variant(M: int, N: int, K: int, split, reduce, sm_count: int,
                    arch: str = "sm_100a", bn: int | None = None) -> tuple[int, str]:
    """(SPLIT_K, REDUCE) of a v11 build, as its builder resolves them: neither given, both
    from :func:`choose_variant` (what tirx_gemm.matmul builds); REDUCE alone, the split
    :func:`choose_split` gives for it; SPLIT_K alone, the "last" reduction."""
    if split is None and reduce is None:
        v = choose_variant(M, N, K, sm_count, arch, bn)
        return v["SPLIT_K"], v.get("REDUCE", "last")
    reduce = "last" if reduce is None else reduce
    check_reduce(reduce)
    if split is None:
        split = choose_split(M, N, K, sm_count, arch=arch, reduce=reduce, bn=bn)
    return split, reduce


def resolve(M: int, N: int, K: int, kwargs: dict | None, arch: str = "sm_100a") -> int:
    """The SPLIT_K a v11 build with these keywords uses (:func:`resolve_variant` at
    SM_COUNT, default the arch's GPU)."""
    return _resolved(M, N, K, kwargs, arch)[0]


def _resolved(M, N, K, kwargs, arch):
    kwargs = dict(kwargs or {})
    return resolve_variant(M, N, K, kwargs.get("SPLIT_K"), kwargs.get("REDUCE"),
                           kwargs.get("SM_COUNT") or DEFAULT_SM_COUNT[arch], arch,
                           kwargs.get("BLK_N") or TILES[arch][1])  # the builder's default


def workspace_specs(M: int, N: int, K: int, kwargs: dict | None = None,
                    arch: str = "sm_100a"):
    """The extra operands of v11 after D: ((name, shape, dtype), ...); none when SPLIT_K=1.

    WS  (S, tiles, BM*BN) float32: slab [s, t] holds split s's partial sums of tile t, in
        the order of the threads that own the accumulator (thread-major chunks of 4, so
        that both the writes and the reads of a warp are contiguous). Scratch: every
        element a launch reads, the same launch wrote first, so it needs no initial value.
    CNT (tiles * counters_per_tile,) int32: arrivals per tile (sm_90a: per 64-row half);
        with REDUCE="spread" twice that: the arrivals, then as many "reduced" counts (the
        last unit to finish its band resets both). Must be zero when a launch starts; the
        kernel sets every counter back to zero, so it is zero again when the launch ends."""
    split, reduce = _resolved(M, N, K, kwargs, arch)
    if split == 1:
        return ()
    bm, bn, _ = tile(arch, (kwargs or {}).get("BLK_N"))
    tiles, _ = tile_counts(M, N, K, arch, bn)
    counters = tiles * COUNTERS_PER_TILE[arch]
    if reduce == "spread":
        counters *= 2
    return (("WS", (split, tiles, bm * bn), "float32"), ("CNT", (counters,), "int32"))


def workspace_specs_sm90a(M: int, N: int, K: int, kwargs: dict | None = None):
    """workspace_specs for the sm_90a v11 (128x256 tiles, a counter per 64-row half)."""
    return workspace_specs(M, N, K, kwargs, arch="sm_90a")


TAIL_MIN_GAIN = 50  # v14 TAIL_SPLIT cuts the last wave only where it saves 1/50 of the walk
TAIL_MIN_STEPS = 4  # and builds only where a piece has at least this many K steps of 64


def tail_split_plan(total, pool: int, split: int, ops=streamk.PY):
    """(data-parallel units, all units) of v14's walk of ``total`` tiles over ``pool`` CTAs
    with TAIL_SPLIT=``split``: the ``tail = total % pool`` tiles of the last wave are each cut
    into ``split`` K ranges where they fit the pool (``tail * split <= pool``) and the cut is
    predicted to save at least 1/TAIL_MIN_GAIN of the walk: the wave's idle share ``(pool -
    tail) / pool`` times the share of a tile the pieces save, ``(split - 1) / split``, over
    the walk's waves. Else (total, total). ``ops``: Python's (the tests, the bench) or TIR's
    (the kernel, where ``total`` is read on the device)."""
    tail = total % pool
    waves = (total + pool - 1) // pool
    on = ops.and_(ops.and_(tail > 0, tail * split <= pool),
                  TAIL_MIN_GAIN * (pool - tail) * (split - 1) >= pool * split * waves)
    return ops.select(on, total - tail, total), ops.select(on, total - tail + tail * split, total)


def workspace_specs_v14(M: int, N: int, K: int, kwargs: dict | None = None):
    """The extra operands of sm_90a v14 after routing (and its epilogue's operands):
    TAIL_SPLIT=S > 1 cuts each tile of the walk's last wave into S K ranges when the tail
    times S fits the pool of SM_COUNT CTAs, so at most SM_COUNT // S tiles are ever split:
    WS (S, SM_COUNT // S, BLK_M * BLK_N) float32 (slab [p, j]: piece p of tail tile j, v11's
    thread-major chunks) and CNT (SM_COUNT // S * BLK_M // 64,) int32, zero at launch and
    at exit. M does not enter: the walk's length is read on the device. Else none."""
    kwargs = dict(kwargs or {})
    split = kwargs.get("TAIL_SPLIT") or 1
    if split == 1:
        return ()
    bm, bn = kwargs.get("BLK_M") or 128, kwargs.get("BLK_N") or 128  # the builder's defaults
    tiles = (kwargs.get("SM_COUNT") or 132) // split
    return (("WS", (split, tiles, bm * bn), "float32"), ("CNT", (tiles * (bm // 64),), "int32"))


def l2_group_for(split: int, preferred: int = 8) -> int:
    """An L2 group size for a SPLIT_K > 1 build with M at run time: ``preferred`` unless it
    divides the split (the scheduler's tail rows would fold to a division by zero), else
    the first of 7, 5, 3 that does not (v11's 7 for the same reason)."""
    return next(g for g in (preferred, 7, 5, 3) if split % g)


def v12_tiles(M: int, N: int, kwargs: dict) -> int:
    """The MMA's output tiles of an sm_90a v12 build (SWAP_AB: of D's transpose, BLK_M
    walking N and BLK_N the tokens)."""
    bm, bn = kwargs.get("BLK_M") or 128, kwargs.get("BLK_N") or 128  # the builder's defaults
    rows, cols = (N, M) if kwargs.get("SWAP_AB") else (M, N)
    return _ceil_div(rows, bm) * _ceil_div(cols, bn)


def workspace_specs_v12(M: int, N: int, K: int, kwargs: dict | None = None):
    """The extra operands of sm_90a v12 after D. SPLIT_K > 1 (a CTA per unit, v11's spread
    reduction): WS (S, tiles, BLK_M * BLK_N) fp32 and CNT (2 * tiles * BLK_M // 64,) int32,
    v11's layouts (:func:`workspace_specs`); CNT zero at launch and at exit. STREAM_K: its
    own (tirx_gemm.streamk.workspace_specs). Else none."""
    kwargs = dict(kwargs or {})
    split = kwargs.get("SPLIT_K") or 1
    if split == 1:
        return streamk.workspace_specs(M, N, K, kwargs)
    bm, bn = kwargs.get("BLK_M") or 128, kwargs.get("BLK_N") or 128
    tiles = v12_tiles(M, N, kwargs)
    sm_count = kwargs.get("SM_COUNT")
    if sm_count and tiles * split > sm_count:  # a kernel with M at run time meets other Ms
        raise ValueError(
            f"v12 SPLIT_K={split} at {M}x{N}x{K}: {tiles} tiles x {split} splits = "
            f"{tiles * split} units, more than its {sm_count} resident CTAs, so a unit would "
            "wait forever for a split that never starts (check_spread); at this M use a smaller "
            "split, or let tirx_gemm.matmul pick")
    return (("WS", (split, tiles, bm * bn), "float32"),
            ("CNT", (2 * tiles * (bm // 64),), "int32"))


# --------------------------------------------------------------------------------------
# kernel piece (imported by the v11 builders; TVM is imported here only when called, so
# this module stays TVM-free for the registry and the run side)
# --------------------------------------------------------------------------------------
# the twin of helpers.wait_mbarrier's watchdog for a global counter: acquire loads in a
# loop plus a %globaltimer deadline. No backslash escapes (TVM unescapes the source).
_WATCHDOG_COUNT_SRC = """
__device__ __forceinline__ void tirx_gemm_watchdog_count(int* counter, int target,
    long long budget_ns, const char* name, int index, const char* role) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (true) {
    int seen;
    asm volatile("ld.acquire.gpu.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (seen >= target) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if ((long long)(now - start) > budget_ns) {
      printf("tirx-gemm watchdog: %s[%d] saw %d of %d arrivals: %s waited %lld ms "
             "(block %d, thread %d; are all splits of the tile resident?); trapping%c",
             name, index, seen, target, role, budget_ns / 1000000, (int)blockIdx.x,
             (int)threadIdx.x, 10);
      asm volatile("trap;");
    }
  }
}
"""


def wait_count(counter_ptr, target, name: str = "CNT", index=0, role: str = "a thread"):
    """One thread waits until the global int32 at ``counter_ptr`` is >= ``target``, then
    acquires it (``T.cuda.wait_until``: relaxed polls and a closing ``ld.acquire.gpu``), so
    every release that the count it saw includes (each arrival's atomic) happens-before
    what this thread does next. In a watchdog build
    (helpers.set_watchdog) the wait is bounded and traps naming the counter. Called in a
    kernel body (it emits the loop through TVM's IR builder)."""
    from tvm.script import tirx as T
    from tirx_gemm import helpers as H

    budget_ms = H.watchdog_ms()
    if budget_ms is not None:
        T.evaluate(T.cuda.func_call("tirx_gemm_watchdog_count", counter_ptr, target,
                                    T.int64(budget_ms * 1_000_000), name, index, role,
                                    source_code=_WATCHDOG_COUNT_SRC))
        return
    # TVM's declared wait: relaxed polls, closed by one ld.acquire; it also tells NumSim's
    # racecheck that this word is a synchronization counter, not data
    seen = T.alloc_local((1,), "int32")
    T.evaluate(T.cuda.wait_until(seen, counter_ptr, lambda v: v >= target, scope="gpu",
                                 space="global"))
