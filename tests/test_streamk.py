"""Stream-K's decomposition (tirx_gemm/streamk.py) and sm_90a v12's STREAM_K builds."""
import inspect
import itertools

import pytest

from tirx_gemm import registry, streamk as SK

# (tiles, k_tiles, G): many pools, tile counts around each wave boundary, short and deep K
CASES = [(t, kt, g) for g in (1, 2, 3, 7, 16, 33, 64, 114, 132)
         for t in sorted({1, 2, 3, g // 2 - 1, g // 2, g // 2 + 1, g - 1, g, g + 1, g + 2,
                          g + g // 3, 2 * g + 5, 3 * g + g // 2 + 1, 5 * g - 1})
         if t >= 1
         for kt in (1, 15, 16, 17, 31, 64, 100, 257, 1024)]


def _expected_on(tiles, kt, g):
    tail = tiles % g
    return tail > 0 and 2 * tail < g and kt >= 16


@pytest.mark.parametrize("tiles,kt,g", CASES)
def test_plan_covers_every_iteration_once(tiles, kt, g):
    p = SK.plan(tiles, kt, g)
    assert bool(p.on) == _expected_on(tiles, kt, g)
    if not p.on:
        assert (p.dp_tiles, p.sk_tiles, p.units) == (tiles, 0, 0)
        return
    assert p.sk_tiles == tiles % g and p.dp_tiles % g == 0
    assert p.dp_tiles + p.sk_tiles == tiles
    assert 2 * p.sk_tiles <= p.units <= g
    seen = {}      # (tile, k) -> unit
    slabs = set()
    pieces_of = {j: [] for j in range(p.sk_tiles)}
    for u in range(p.units):
        it0, it1 = SK.unit_range(p, u)
        assert it1 - it0 >= SK.MIN_UNIT_K_TILES            # units of at least 8 K steps
        assert it1 - it0 <= SK.ceil_div(kt, 2)            # so at most 2 tiles
        t0, n = SK.unit_tiles(p, it0, it1)
        assert n in (1, 2)
        for j in range(t0, t0 + n):
            k0, k1 = SK.piece_k_range(p, it0, it1, j)
            assert 0 <= k0 < k1 <= kt
            for k in range(k0, k1):
                assert (j, k) not in seen
                seen[(j, k)] = u
                assert SK.unit_of(p, j * kt + k) == u
            s = SK.slab(u, j)
            assert s not in slabs and 0 <= s < SK.workspace_slabs(g)
            slabs.add(s)
            pieces_of[j].append((k0, u, s))
            for h in range(2):
                assert 0 <= SK.counter(j, h, 2) < SK.counters(g)
    assert len(seen) == p.sk_tiles * kt                    # every iteration, exactly once
    for j, pieces in pieces_of.items():
        first, count = SK.tile_units(p, j)
        assert count == len(pieces) >= 2                  # no stream-K tile is whole
        # ascending K order = ascending unit order = consecutive slabs from first + j
        assert sorted(pieces) == pieces
        assert [u for _, u, _ in pieces] == list(range(first, first + count))
        assert [s for _, _, s in pieces] == list(range(first + j, first + j + count))


def test_plan_is_off_when_the_tail_wave_is_at_least_half_full():
    assert not SK.plan(132 + 66, 64, 132).on    # tail 66: half a wave
    assert SK.plan(132 + 65, 64, 132).on
    assert not SK.plan(264, 64, 132).on         # no tail
    assert not SK.plan(133, 15, 132).on         # units of 8 need 16 K steps per tile
    assert SK.plan(1, 1024, 132).units == 128   # one tile of 1024 K steps: 128 units of 8


def test_tir_expressions_agree_with_python_ints():
    tvm = pytest.importorskip("tvm")
    from tvm.script import tirx as T
    from tvm.sym.analyzer import Analyzer
    ops = SK.tir_ops(T)
    tv, kv, uv, jv = (tvm.tirx.Var(n, "int32") for n in ("tiles", "kt", "u", "j"))
    g = 132
    p = SK.plan(tv, kv, g, ops)
    exprs = {"on": p.on, "dp": p.dp_tiles, "sk": p.sk_tiles, "U": p.units,
             "range": SK.unit_range(p, uv),
             "tiles_of_u": SK.unit_tiles(p, *SK.unit_range(p, uv)),
             "k_range": SK.piece_k_range(p, *SK.unit_range(p, uv), jv, ops),
             "units_of_j": SK.tile_units(p, jv)}

    def ev(e, binds):
        if isinstance(e, tuple):
            return tuple(ev(x, binds) for x in e)
        a = Analyzer()
        for var, val in binds.items():
            a.bind(var, val)
        r = a.simplify(e)
        assert isinstance(r, tvm.tirx.IntImm), r
        return int(r.value)

    for tiles, kt in itertools.product((1, 5, 65, 80, 131, 133, 150, 197, 200, 264, 300),
                                       (8, 16, 77)):
        q = SK.plan(tiles, kt, g)
        b = {tv: tiles, kv: kt}
        assert ev(exprs["on"], b) == int(bool(q.on))
        assert (ev(exprs["dp"], b), ev(exprs["sk"], b), ev(exprs["U"], b)) == \
            (q.dp_tiles, q.sk_tiles, q.units)
        if not q.on:
            continue
        for u in sorted({0, 1, q.units // 2, q.units - 1}):
            bu = {**b, uv: u}
            assert ev(exprs["range"], bu) == SK.unit_range(q, u)
            r = SK.unit_range(q, u)
            assert ev(exprs["tiles_of_u"], bu) == SK.unit_tiles(q, *r)
            t0, n = SK.unit_tiles(q, *r)
            for j in range(t0, t0 + n):
                assert ev(exprs["k_range"], {**bu, jv: j}) == SK.piece_k_range(q, *r, j)
        for j in range(q.sk_tiles):
            assert ev(exprs["units_of_j"], {**b, jv: j}) == SK.tile_units(q, j)


def test_workspace_specs_and_builder_defaults():
    step = registry.get("v12", "sm_90a")
    assert step.workspace_specs(1024, 1024, 1024, {}) == ()
    assert step.workspace_specs(1024, 1024, 1024, {"STREAM_K": False}) == ()
    ws = step.workspace_specs(1024, 1024, 1024, {"STREAM_K": True, "BLK_M": 64,
                                                  "BLK_N": 176, "SM_COUNT": 132})
    assert ws == (("WS", (198, 64 * 176), "float32"), ("CNT", (132,), "int32"))
    # independent of the shape: one RUNTIME_M kernel's workspace serves every M
    assert step.workspace_specs(7, 64, 8, {"STREAM_K": True, "BLK_M": 64, "BLK_N": 176,
                                           "SM_COUNT": 132}) == ws
    assert step.workspace_specs(1, 8, 8, {"STREAM_K": True}) == (
        ("WS", (198, 128 * 128), "float32"), ("CNT", (132,), "int32"))
    pytest.importorskip("tvm")
    sig = inspect.signature(step.builder())
    assert (sig.parameters["BLK_M"].default, sig.parameters["BLK_N"].default) == \
        SK.DEFAULT_TILE
    assert sig.parameters["SM_COUNT"].default == 132
    assert sig.parameters["STREAM_K"].default is False


def test_partially_static_plans():
    """RUNTIME_M with a static K: too shallow a K is off in plain ints (the builder emits
    no stream-K code); a deep one leaves the decision to the device."""
    tvm = pytest.importorskip("tvm")
    from tvm.script import tirx as T
    ops = SK.tir_ops(T)
    tiles = tvm.tirx.Var("tiles", "int32")
    assert SK.plan(tiles, 15, 132, ops).on is False
    assert SK.plan(264, tvm.tirx.Var("kt", "int32"), 132, ops).on is False  # no tail
    assert isinstance(SK.plan(tiles, 16, 132, ops).on, tvm.ir.expr.Expr)


@pytest.mark.parametrize("tiles,kt,g", [(1, 64, 132), (30 + 132, 36, 132), (7, 40, 16),
                                        (5, 17, 12), (64, 16, 132)])
def test_the_protocol_sums_in_a_fixed_order_whatever_order_units_finish(tiles, kt, g):
    """The kernel's reduction, emulated in numpy float32: each unit computes its pieces
    (a K step's products added in K order), publishes each to slab u + j and counts it;
    the unit that counts last sums the tile's slabs in K order. Any finishing order gives
    the same bits, and the sum matches the tile's full fp32 dot product closely."""
    np = pytest.importorskip("numpy")
    p = SK.plan(tiles, kt, g)
    assert p.on
    rng = np.random.default_rng(tiles * 7 + kt)
    steps = rng.standard_normal((p.sk_tiles, kt, 4)).astype(np.float32)  # per-K-step products

    def run(order):
        ws = {}
        cnt = [0] * SK.counters(g)
        out = {}
        for u in order:
            it0, it1 = SK.unit_range(p, u)
            t0, n = SK.unit_tiles(p, it0, it1)
            for j in range(t0, t0 + n):
                k0, k1 = SK.piece_k_range(p, it0, it1, j)
                acc = np.zeros(4, np.float32)
                for k in range(k0, k1):
                    acc = acc + steps[j, k]
                ws[SK.slab(u, j)] = acc
                old, cnt[SK.counter(j, 0, 1)] = cnt[SK.counter(j, 0, 1)], \
                    cnt[SK.counter(j, 0, 1)] + 1
                first, pieces = SK.tile_units(p, j)
                if old == pieces - 1:
                    tot = np.zeros(4, np.float32)
                    for s in range(SK.slab(first, j), SK.slab(first, j) + pieces):
                        tot = tot + ws[s]
                    out[j] = tot
                    cnt[SK.counter(j, 0, 1)] = 0
        assert not any(cnt)  # every counter back to zero
        return np.stack([out[j] for j in range(p.sk_tiles)])

    units = list(range(p.units))
    first = run(units)
    for seed in range(3):
        order = list(units)
        np.random.default_rng(seed).shuffle(order)
        assert np.array_equal(run(order).view(np.int32), first.view(np.int32))
    assert np.array_equal(run(units[::-1]).view(np.int32), first.view(np.int32))
    np.testing.assert_allclose(first, steps.astype(np.float64).sum(axis=1), rtol=1e-4,
                               atol=1e-4)


def test_stream_k_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    for kw in ({"CLUSTER": 2}, {"ACT": "relu"},
               {"BIAS": "float16"}, {"OUT_DTYPE": "float32"}):
        with pytest.raises(ValueError, match="STREAM_K=True takes no") as exc:
            step.build_primfunc(1024, 1024, 1024, BLK_M=64, STREAM_K=True, **kw)
        assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="STREAM_K=1 must be True or False"):
        step.build_primfunc(1024, 1024, 1024, STREAM_K=1)


def test_stream_k_takes_swap_ab_and_stores_its_sums_transposed():
    """SWAP_AB with STREAM_K (rules.swap_stream_k's decode kernel): the pieces load B's
    rows as the MMA's A operand, and the reduced tile goes to D by the transposed stores
    (no TMA store, no packed tile), as the data-parallel swap-AB tiles do."""
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    f = step.build_primfunc(2, 10240, 8192, BLK_M=64, BLK_N=16, SWAP_AB=True, STREAM_K=True,
                            RUNTIME_M=True, SM_COUNT=132)
    import re
    names = [p.name for p in f.params]
    assert names[3:] == ["WS", "CNT"]
    plain = step.build_primfunc(2, 10240, 8192, BLK_M=64, BLK_N=16, SWAP_AB=True,
                                RUNTIME_M=True, SM_COUNT=132).script()
    stores = re.findall(r"D\[([^\]]*)\] = ", f.script())
    # the data-parallel tiles' store and the reduced tiles' one, both transposed: D's row
    # from the token tile (16 wide: fragment columns 8 * j + 2 * (lane % 4) + e), its
    # column from the weight's 64-row blocks
    assert len(stores) == 2 == len(re.findall(r"D\[([^\]]*)\] = ", plain)) + 1
    for index in stores:
        row, col = index.split(", ")
        assert "* 16 + 8 * j + 2 * (lane_id % 4) + e" in row and "* 64" in col, index


def test_stream_k_kernel_takes_the_workspace_and_counts_only_when_the_plan_is_on():
    """On at 1024^3 (64 tiles of 128x128, 128 units of 8 K steps): the last-arriver count,
    the fixed-order reduction, a counter reset; off at 4096^3 (1024 tiles, a tail of 100 on
    132): v12's walk with the workspace operands unused; RUNTIME_M: the plan on the device."""
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    on = step.build_primfunc(1024, 1024, 1024, STREAM_K=True).script()
    count = '"acq_rel", "gpu", "global", "add"'  # the arrival's atomic, as the script prints it
    assert count in on and 'WS: T.Buffer((198, 16384), "float32")' in on
    assert 'CNT: T.Buffer((132,), "int32")' in on
    off = step.build_primfunc(4096, 4096, 4096, STREAM_K=True).script()
    assert "acq_rel" not in off and 'WS: T.Buffer((198, 16384), "float32")' in off
    rt = step.build_primfunc(256, 4096, 4096, BLK_M=64, BLK_N=176, STREAM_K=True,
                             RUNTIME_M=True).script()
    assert count in rt


def test_workspace_follows_each_arch_default_pool():
    """Without SM_COUNT the workspace is sized for the arch builder's own default pool
    (sm_100a v12: 148 CTAs, sm_90a: 132), not one arch's for both."""
    from tirx_gemm import registry, spec
    for arch in ("sm_90a", "sm_100a"):
        specs = dict((n, shape) for n, shape, _ in
                     registry.get("v12", arch).workspace_specs(256, 256, 4096,
                                                               {"STREAM_K": True}))
        g = spec.SM_COUNT[arch]
        assert specs["CNT"] == (SK.counters(g),)
        assert specs["WS"][0] == SK.workspace_slabs(g)


