"""Stream-K (sm_90a v12, ``STREAM_K=True``): the decomposition, its one home.

TVM- and torch-free: the builder calls these functions with TIR expressions (the plan is
computed on the device from M, N, K when they are run-time values), the tests and the
registry with Python ints. Every function that chooses takes the choosing operations as
``ops`` (:data:`PY` here; the builder passes TIR's Select / min / max / And), so one text
serves both.

The plan, for ``tiles`` output tiles, ``k_tiles`` K steps of 64 and a pool of ``G`` CTAs
(every CTA launched):

* ``tail = tiles % G``: the tiles of the last wave. Stream-K is used iff ``tail > 0``,
  ``2 * tail < G`` (the tail wave would run less than half full) and ``k_tiles >=
  2 * MIN_UNIT_K_TILES``. Off, the kernel is v12's data-parallel walk.
* The first ``dp_tiles = tiles - tail`` tiles of the walk order are data-parallel: whole
  waves, CTA b takes b, b + G, ... . The last ``sk_tiles = tail`` are cut into
  ``I = sk_tiles * k_tiles`` iterations (tile-major, K-minor) shared by ``U = min(G, I //
  MIN_UNIT_K_TILES)`` units: unit u covers iterations ``[u*I//U, (u+1)*I//U)``, at least
  MIN_UNIT_K_TILES of them, and (``U >= 2 * sk_tiles``) at most ``ceil(k_tiles / 2)``, so
  it touches at most 2 tiles and every stream-K tile has at least 2 pieces.
* Tile j's pieces come from units ``first(j) .. last(j)`` in ascending K order. Unit u's
  piece of tile j goes to workspace slab ``u + j``: one slab per (unit, tile) pair (a
  later unit never covers an earlier tile), and a tile's pieces lie in consecutive
  slabs ``first(j) + j ..``, which the unit that counts last sums in that order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from tirx_gemm import spec

MIN_UNIT_K_TILES = 8    # K steps (of 64) every stream-K unit covers at least
BLK_K = 64
# the builder's defaults (tests/test_streamk.py checks them against its signature)
DEFAULT_TILE = (128, 128)
WGMMA_M = 64            # rows per consumer warpgroup: a counter per 64-row half


@dataclass(frozen=True)
class Ops:
    """The choosing operations: ``select(c, a, b)`` is ``a if c else b``."""
    select: Callable
    min: Callable
    max: Callable
    and_: Callable


PY = Ops(select=lambda c, a, b: a if c else b, min=min, max=max,
         and_=lambda a, b: a and b)


def tir_ops(T) -> Ops:
    """The choosing operations as TIR expressions (``T``: ``tvm.script.tirx``, passed in so
    that this module stays TVM-free): what both arches' v12 builders plan with when a size
    is a run-time value."""
    return Ops(select=T.Select, min=T.min, max=T.max, and_=T.And)


@dataclass(frozen=True)
class Plan:
    on: object          # a bool, or a TIR boolean when it depends on run-time values
    tiles: object
    dp_tiles: object    # tiles walked data-parallel (a multiple of G when on)
    sk_tiles: object    # the last tiles of the walk order, shared by the units
    iters: object       # I = sk_tiles * k_tiles
    units: object       # U (0 when off)
    k_tiles: object


def ceil_div(a, b):
    return (a + b - 1) // b


def plan(tiles, k_tiles, G, ops: Ops = PY) -> Plan:
    """The stream-K plan of ``tiles`` tiles of ``k_tiles`` K steps on ``G`` CTAs."""
    tail = tiles % G
    short = 2 * tail < G
    conds = (tail > 0, short, k_tiles >= 2 * MIN_UNIT_K_TILES)
    if any(c is False for c in conds):  # off whatever the run-time values: plain ints
        return Plan(False, tiles, tiles, 0, 0, 0, k_tiles)
    dynamic = [c for c in conds if c is not True]  # the conditions known on the device only
    on = True
    for c in dynamic:
        on = c if on is True else ops.and_(on, c)
    sk = tail if on is True else ops.select(on, tail, 0)
    iters = sk * k_tiles
    units = ops.min(G, iters // MIN_UNIT_K_TILES)
    units = units if on is True else ops.select(on, units, 0)
    return Plan(on, tiles, tiles - sk, sk, iters, units, k_tiles)


def unit_range(p: Plan, u):
    """Iterations [it0, it1) of unit u (0 <= u < U)."""
    return u * p.iters // p.units, (u + 1) * p.iters // p.units


def unit_of(p: Plan, x):
    """The unit whose range holds iteration x (0 <= x < I)."""
    return ((x + 1) * p.units + p.iters - 1) // p.iters - 1


def unit_tiles(p: Plan, it0, it1):
    """(t0, count): the stream-K tiles (local index, 0..sk_tiles-1) of the unit whose
    iterations are [it0, it1) (unit_range) are t0 .. t0 + count - 1, count 1 or 2."""
    t0 = it0 // p.k_tiles
    return t0, (it1 - 1) // p.k_tiles - t0 + 1


def piece_k_range(p: Plan, it0, it1, j, ops: Ops = PY):
    """K steps [k0, k1) of tile j (local) that the unit of iterations [it0, it1) covers."""
    return (ops.max(it0, j * p.k_tiles) - j * p.k_tiles,
            ops.min(it1, (j + 1) * p.k_tiles) - j * p.k_tiles)


def tile_units(p: Plan, j):
    """(first, count): tile j's pieces come from units first .. first + count - 1, in
    ascending K order."""
    first = unit_of(p, j * p.k_tiles)
    return first, unit_of(p, (j + 1) * p.k_tiles - 1) - first + 1


def slab(u, j):
    """The workspace slab of unit u's piece of tile j (tile j's pieces: consecutive)."""
    return u + j


def workspace_slabs(G: int) -> int:
    """Slabs the workspace holds: slab(u, j) <= (U - 1) + (sk_tiles - 1) < G + G // 2."""
    return G + G // 2


def counters(G: int) -> int:
    """Counters the workspace holds: one per 64-row half of a stream-K tile, sk_tiles * 2 <
    G (BLK_M=64 uses the even ones' count, sk_tiles < G / 2)."""
    return G


def counter(j, half, halves):
    return j * halves + half


def k_tiles_of(K: int) -> int:
    return ceil_div(K, BLK_K)


def shape_plan(M: int, N: int, K: int, blk_m: int, blk_n: int, G: int) -> Plan:
    """The plan of an M x N x K GEMM on BLK_M x BLK_N tiles (Python ints)."""
    return plan(ceil_div(M, blk_m) * ceil_div(N, blk_n), k_tiles_of(K), G)


def _kw_tile(kwargs: dict, arch: str = "sm_90a") -> tuple[int, int, int]:
    bm = kwargs.get("BLK_M") or DEFAULT_TILE[0]
    bn = kwargs.get("BLK_N") or DEFAULT_TILE[1]
    g = kwargs.get("SM_COUNT") or spec.SM_COUNT[arch]  # the arch's builder default
    return bm, bn, g


def workspace_specs(M: int, N: int, K: int, kwargs: dict | None = None,
                    arch: str = "sm_90a"):
    """The extra operands of sm_90a v12 after D: none unless STREAM_K.

    WS  (G + G // 2, BLK_M * BLK_N) float32: slab u + j holds
        unit u's fp32 partial of stream-K tile j, each consumer warpgroup's 64 rows at
        64 * BLK_N * consumer, in thread-major chunks of 4 (v11's order). Scratch: read
        only after written.
    CNT (G,) int32: arrivals per 64-row half of stream-K tile j (index
        j * BLK_M / 64 + half). Zero at launch; the unit that counts last sets it back to
        zero.
    Neither depends on M, N or K: one RUNTIME_M / RUNTIME_NK kernel's workspace serves
    every shape (G is SM_COUNT)."""
    kwargs = dict(kwargs or {})
    if not kwargs.get("STREAM_K"):
        return ()
    bm, bn, g = _kw_tile(kwargs, arch)
    return (("WS", (workspace_slabs(g), bm * bn), "float32"),
            ("CNT", (counters(g),), "int32"))


def workspace_specs_sm100a(M: int, N: int, K: int, kwargs: dict | None = None):
    """workspace_specs for sm_100a v12 (BLK_M 128; a pool of 148 CTAs unless SM_COUNT)."""
    return workspace_specs(M, N, K, kwargs, arch="sm_100a")


def walk(p: Plan, ops: Ops = PY):
    """A kernel's walk of its stream-K unit, as eight functions of the plan ``p`` (whose
    ``iters`` / ``units`` a kernel passes back in from its own locals, computed once):
    ``(it0(iters, units, u), it1(iters, units, u), t0(it0, it1), tiles(it0, it1),
    k0(it0, it1, j), steps(it0, it1, j), first(iters, units, j), pieces(iters, units, j))``:
    the unit's iteration range, its first local tile and tile count, a piece's first K
    step and K-step count, and the first unit and piece count of tile j. Both arches'
    v12 builders call these inside their kernel bodies."""
    def bound(iters, units):
        return replace(p, iters=iters, units=units)

    def it0(iters, units, u):
        return unit_range(bound(iters, units), u)[0]

    def it1(iters, units, u):
        return unit_range(bound(iters, units), u)[1]

    def t0(a, b):
        return unit_tiles(p, a, b)[0]

    def tiles(a, b):
        return unit_tiles(p, a, b)[1]

    def k0(a, b, j):
        return piece_k_range(p, a, b, j, ops)[0]

    def steps(a, b, j):
        lo, hi = piece_k_range(p, a, b, j, ops)
        return hi - lo

    def first(iters, units, j):
        return tile_units(bound(iters, units), j)[0]

    def pieces(iters, units, j):
        return tile_units(bound(iters, units), j)[1]

    return it0, it1, t0, tiles, k0, steps, first, pieces


def describe(M: int, N: int, K: int, blk_m: int, blk_n: int, G: int) -> str:
    """One line: the plan of a shape (the lab script and the card's examples)."""
    p = shape_plan(M, N, K, blk_m, blk_n, G)
    if not p.on:
        return f"{M}x{N}x{K} @ {blk_m}x{blk_n}: {p.tiles} tiles, off"
    return (f"{M}x{N}x{K} @ {blk_m}x{blk_n}: {p.tiles} tiles = {p.dp_tiles} data-parallel "
            f"+ {p.sk_tiles} stream-K ({p.iters} K steps on {p.units} units of "
            f"{p.iters // p.units}-{ceil_div(p.iters, p.units)})")
