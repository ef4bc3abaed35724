"""Split-K (v11): the split heuristic, the workspace specs and the order of the reduction.
TVM- and torch-free (tirx_gemm.splitk, numpy), plus the builders' refusals."""
import numpy as np
import pytest

from tirx_gemm import registry, splitk
from tirx_gemm.splitk import choose_split, split_k_range, workspace_specs

ARCHES = ("sm_100a", "sm_90a")


@pytest.mark.parametrize("arch", ARCHES)
def test_tiles_that_fill_the_gpu_get_no_split(arch):
    # 4096^3: 1024 (sm_100a) / 512 (sm_90a) tiles for ~140 SMs
    assert choose_split(4096, 4096, 4096, 148, arch=arch) == 1
    # exactly as many tiles as SMs: still 1, however deep K is
    bm, bn, _ = splitk.TILES[arch]
    assert choose_split(bm * 4, bn * 37, 1 << 20, 148, arch=arch) == 1
    assert choose_split(bm * 4, bn * 38, 1 << 20, 148, arch=arch) == 1


@pytest.mark.parametrize("arch", ARCHES)
def test_few_tiles_and_deep_k_split(arch):
    s = choose_split(256, 256, 16384, 132, arch=arch)
    tiles, k_tiles = splitk.tile_counts(256, 256, 16384, arch)
    assert 1 < s <= splitk.MAX_SPLIT
    assert tiles * s <= 132                      # one wave of units
    assert k_tiles // s >= splitk.MIN_K_TILES    # every split keeps enough K steps
    # the cost model's choice: sqrt(k_tiles / reduce_cost), here below every hard cap
    assert s == int((k_tiles / splitk.reduce_cost(arch)) ** 0.5)
    # one tile, K = 65536: the cap on the serial reduction binds
    assert choose_split(128, 128, 65536, 132, arch=arch) == splitk.MAX_SPLIT


def test_the_known_shapes():
    # the bench shapes of v11 (H200: 132 SMs, sm_90a; B200: 148 SMs, sm_100a)
    assert [choose_split(*s, 132, arch="sm_90a") for s in
            ((256, 256, 16384), (128, 128, 65536), (256, 512, 192), (1024, 1024, 8192),
             (4096, 4096, 4096))] == [9, 16, 1, 4, 1]
    assert [choose_split(*s, 148, arch="sm_100a") for s in
            ((256, 256, 16384), (128, 128, 65536), (256, 512, 192), (1024, 1024, 8192),
             (4096, 4096, 4096))] == [11, 16, 1, 2, 1]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("sms", (1, 2, 7, 132, 148, 1000))
def test_never_more_splits_than_k_tiles_or_sms_allow(arch, sms):
    for M, N, K in ((1, 8, 8), (1, 264, 72), (128, 128, 64), (200, 136, 200), (256, 256, 640),
                    (128, 128, 1 << 22), (1000, 1000, 1000), (8, 8, 1 << 16)):
        s = choose_split(M, N, K, sms, arch=arch)
        tiles, k_tiles = splitk.tile_counts(M, N, K, arch)
        assert 1 <= s <= max(1, min(k_tiles, splitk.MAX_SPLIT)), (M, N, K, sms, s)
        if s > 1:
            assert tiles * s <= sms and k_tiles // s >= splitk.MIN_K_TILES


def test_bad_arguments_raise():
    for bad in ((0, 8, 8, 132), (8, 8, 8, 0), (8, 8, 8, True), (8, 8, 8.0, 132)):
        with pytest.raises(ValueError):
            choose_split(*bad)


@pytest.mark.parametrize("k_tiles", (1, 2, 3, 10, 64, 257))
def test_split_ranges_partition_k(k_tiles):
    for split in range(1, k_tiles + 1):
        ranges = [split_k_range(k_tiles, split, s) for s in range(split)]
        assert ranges[0][0] == 0 and ranges[-1][1] == k_tiles
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [b - a for a, b in ranges]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_workspace_specs():
    # no workspace when the split is 1 (given, or chosen)
    assert workspace_specs(256, 256, 16384, {"SPLIT_K": 1}) == ()
    assert workspace_specs(4096, 4096, 4096, {}) == ()
    # sm_100a: 128x128 tiles, one counter per tile
    assert workspace_specs(200, 136, 200, {"SPLIT_K": 2, "SM_COUNT": 8}) == (
        ("WS", (2, 4, 128 * 128), "float32"), ("CNT", (4,), "int32"))
    # sm_90a: 128x256 tiles, a counter per 64-row half
    assert splitk.workspace_specs_sm90a(200, 136, 200, {"SPLIT_K": 2}) == (
        ("WS", (2, 2, 128 * 256), "float32"), ("CNT", (4,), "int32"))
    # SPLIT_K and REDUCE absent: choose_variant's at SM_COUNT (default: the arch's GPU),
    # the spread reduction with its doubled counters
    assert workspace_specs(256, 256, 16384, {"SM_COUNT": 148}) == (
        ("WS", (32, 4, 128 * 128), "float32"), ("CNT", (8,), "int32"))
    assert workspace_specs(256, 256, 16384, {})[0][1][0] == 32
    assert splitk.workspace_specs_sm90a(256, 256, 16384, {})[0][1][0] == 32
    # SPLIT_K alone: the last-arrival reduction (one counter per reduction unit)
    assert splitk.workspace_specs_sm90a(256, 256, 16384, {"SPLIT_K": 9})[1] == (
        "CNT", (4,), "int32")
    # REDUCE alone: choose_split for it
    assert workspace_specs(256, 256, 16384, {"REDUCE": "last"})[0][1][0] == 11


def test_registry_rows_carry_the_workspace():
    for arch, fn in (("sm_100a", workspace_specs), ("sm_90a", splitk.workspace_specs_sm90a)):
        step = registry.get("v11", arch)
        assert step.sm_count_kwarg == "SM_COUNT"
        for kw in ({"SPLIT_K": 3, "SM_COUNT": 12}, {"SPLIT_K": 1}, {},
                   {"SPLIT_K": 3, "SM_COUNT": 12, "REDUCE": "spread"}, {"REDUCE": "spread"}):
            assert step.workspace_specs(256, 256, 640, kw) == fn(256, 256, 640, kw)
    sim_kwargs = [dict(kw) for _, kw in registry.get("v11").sim_cases]
    assert {kw.get("SPLIT_K") for kw in sim_kwargs} >= {1, 2, 3, 4}
    assert any(kw.get("dtype") == "bfloat16" for kw in sim_kwargs)
    spread = [kw for kw in sim_kwargs if kw.get("REDUCE") == "spread"]
    assert {kw["SPLIT_K"] for kw in spread} >= {2, 3, 4}
    assert any(kw.get("dtype") == "bfloat16" for kw in spread)
    # one case fills the SM pool exactly (every SM holds a waiting unit)
    cases = [(mnk, dict(kw)) for mnk, kw in registry.get("v11").sim_cases]
    assert any(splitk.tile_counts(*mnk)[0] * kw["SPLIT_K"] == kw["SM_COUNT"]
               for mnk, kw in cases if kw.get("REDUCE") == "spread")


def _reduce_like_the_kernel(partials_in_arrival_order, arrival_order):
    """A numpy model of v11's protocol: units publish in any order, the last to count
    sums the slabs in split order 0..S-1 (fp32, one add at a time)."""
    S = len(arrival_order)
    slabs = [None] * S
    count = 0
    out = None
    for split, part in zip(arrival_order, partials_in_arrival_order):
        slabs[split] = part
        old, count = count, count + 1
        if old == S - 1:
            acc = np.zeros_like(part)
            for s in range(S):
                acc = (acc + slabs[s]).astype(np.float32)
            out, count = acc, 0
    return out, count


def test_reduction_order_is_fixed_whatever_the_arrival_order():
    rng = np.random.default_rng(0)
    S = 7
    # partials of very different magnitudes: fp32 addition is not associative on them
    parts = [(rng.standard_normal((64, 64)) * 10.0 ** rng.integers(-4, 5)).astype(np.float32)
             for _ in range(S)]
    results = []
    for _ in range(20):
        order = rng.permutation(S)
        out, count = _reduce_like_the_kernel([parts[s] for s in order], list(order))
        assert count == 0  # the counter is back to zero for the next launch
        results.append(out)
    assert all(np.array_equal(results[0], r) for r in results[1:])
    # and summing in arrival order instead would not be deterministic
    sums = set()
    for _ in range(20):
        acc = np.zeros((64, 64), np.float32)
        for s in rng.permutation(S):
            acc = (acc + parts[s]).astype(np.float32)
        sums.add(acc.tobytes())
    assert len(sums) > 1


@pytest.mark.parametrize("arch", ARCHES)
def test_builders_refuse_bad_splits(arch):
    pytest.importorskip("tvm")
    step = registry.get("v11", arch)
    with pytest.raises(ValueError, match="SPLIT_K=5 is more than the 4 K tiles"):
        step.build_primfunc(256, 256, 256, SPLIT_K=5)
    with pytest.raises(ValueError, match="SPLIT_K=0"):
        step.build_primfunc(256, 256, 256, SPLIT_K=0)
    # the kernel's operands follow the workspace specs: none at SPLIT_K=1
    assert [p.name for p in step.build_primfunc(256, 256, 256, SPLIT_K=1).params] == \
        ["A", "B", "D"]
    f = step.build_primfunc(200, 136, 200, SPLIT_K=2, SM_COUNT=8)
    specs = step.workspace_specs(200, 136, 200, {"SPLIT_K": 2, "SM_COUNT": 8})
    assert [p.name for p in f.params] == ["A", "B", "D"] + [n for n, _, _ in specs]
    for name, shape, dt in specs:
        buf = next(p for p in f.params if p.name == name)
        assert tuple(int(x) for x in buf.shape) == shape and str(buf.dtype) == dt


# --- REDUCE="spread": every split waits for all, then reduces its own band ---

@pytest.mark.parametrize("arch", ARCHES)
def test_spread_split_fills_the_gpu_once(arch):
    for sms in (7, 132, 148):
        for M, N, K in ((256, 256, 16384), (128, 128, 65536), (1024, 1024, 8192),
                        (1000, 1000, 1000), (200, 136, 200), (8, 8, 1 << 16)):
            s = choose_split(M, N, K, sms, arch=arch, reduce="spread")
            tiles, k_tiles = splitk.tile_counts(M, N, K, arch)
            assert 1 <= s <= k_tiles
            if s > 1:  # co-resident (one unit per SM) and enough K steps per split
                assert tiles * s <= sms and k_tiles // s >= splitk.MIN_K_TILES_SPREAD
                # as many as both limits allow: the serial-read cap of "last" is gone
                assert s == min(sms // tiles, k_tiles // splitk.MIN_K_TILES_SPREAD,
                                splitk.MAX_SPLIT_SPREAD)
    assert choose_split(4096, 4096, 4096, 132, arch=arch, reduce="spread") == 1


def test_spread_known_shapes_and_variants():
    assert [choose_split(*s, 132, arch="sm_90a", reduce="spread") for s in
            ((256, 256, 16384), (128, 128, 65536), (1024, 1024, 8192), (1000, 1000, 1000),
             (4096, 4096, 4096))] == [32, 64, 4, 2, 1]
    assert choose_split(256, 256, 16384, 148, arch="sm_100a", reduce="spread") == 32
    # choose_variant: what tirx_gemm.matmul builds; "last" (the default) is not written
    # sm_90a from 128 rows: 128x64 tiles (8 of them at 256x256), 16 splits each
    assert splitk.choose_variant(256, 256, 16384, 132, "sm_90a") == {
        "SPLIT_K": 16, "REDUCE": "spread", "BLK_N": 64, **splitk.NARROW_SPLIT_KWARGS}
    assert splitk.choose_variant(256, 256, 16384, 132, "sm_90a", bn=256) == {
        "SPLIT_K": 32, "REDUCE": "spread"}
    # below 128 rows the default 128x256 tile (a stage's useful bytes are B's)
    assert splitk.choose_variant(1, 4096, 4096, 132, "sm_90a") == {"SPLIT_K": 8,
                                                                    "REDUCE": "spread"}
    # K too shallow to split (16 K steps): data-parallel, as measured at 1000^3
    assert splitk.choose_variant(1000, 1000, 1000, 132, "sm_90a") == {"SPLIT_K": 1}
    assert splitk.choose_variant(4096, 4096, 4096, 132, "sm_90a") == {"SPLIT_K": 1}
    assert splitk.choose_variant(256, 512, 192, 148, "sm_100a") == {"SPLIT_K": 1}
    for arch in ARCHES:
        for M, N, K in ((256, 256, 16384), (1000, 1000, 1000), (128, 128, 256), (8, 8, 64)):
            kw = splitk.choose_variant(M, N, K, 132, arch)
            tiles, k_tiles = splitk.tile_counts(M, N, K, arch, kw.get("BLK_N"))
            assert set(kw) <= {"SPLIT_K", "REDUCE", "BLK_N", *splitk.NARROW_SPLIT_KWARGS} \
                and 1 <= kw["SPLIT_K"] <= k_tiles
            if kw.get("REDUCE") == "spread":
                splitk.check_spread(tiles, kw["SPLIT_K"], 132)  # never an invalid build


def test_spread_model_prefers_it_only_where_the_serial_read_binds():
    # same split, spread's reduction reads 1 slab instead of S: never worse in the model
    for s in (2, 4, 16):
        assert (splitk.model_steps(256, s, "spread") < splitk.model_steps(256, s, "last"))
    assert splitk.model_steps(256, 1, "spread") == splitk.model_steps(256, 1, "last") == 256


def test_spread_refusals():
    with pytest.raises(ValueError, match=r"tiles x SPLIT_K <= SM_COUNT.*4 x 3 = 12 > 11"):
        splitk.check_spread(4, 3, 11)
    splitk.check_spread(4, 3, 12)  # exactly the SMs: allowed
    with pytest.raises(ValueError, match="REDUCE='both'"):
        choose_split(256, 256, 16384, 132, reduce="both")


def test_spread_workspace_has_two_counters_per_reduction_unit():
    assert workspace_specs(256, 256, 640, {"SPLIT_K": 3, "REDUCE": "spread"}) == (
        ("WS", (3, 4, 128 * 128), "float32"), ("CNT", (8,), "int32"))
    assert splitk.workspace_specs_sm90a(256, 256, 640, {"SPLIT_K": 3, "REDUCE": "spread"}) == (
        ("WS", (3, 2, 128 * 256), "float32"), ("CNT", (8,), "int32"))  # 2 halves x 2
    # SPLIT_K absent: the spread heuristic's choice
    assert splitk.workspace_specs_sm90a(256, 256, 16384, {"REDUCE": "spread"})[0][1][0] == 32
    assert workspace_specs(256, 256, 16384, {"SPLIT_K": 1, "REDUCE": "spread"}) == ()


def _spread_like_the_kernel(parts, arrival_order, chunks):
    """A numpy model of REDUCE="spread": every unit publishes and counts itself; once the
    count is S each unit s sums chunks [s*chunks//S, (s+1)*chunks//S) of every slab in
    split order; the last unit to count on DONE resets both counters."""
    S = len(parts)
    slabs, count, done = [None] * S, 0, 0
    for s in arrival_order:
        slabs[s] = parts[s].reshape(chunks, -1)
        count += 1
    assert count == S  # the wait: nobody reduces before this
    out = np.full_like(slabs[0], np.nan)
    for s in arrival_order:
        q0, q1 = s * chunks // S, (s + 1) * chunks // S
        acc = np.zeros_like(slabs[0][q0:q1])
        for k in range(S):
            acc = (acc + slabs[k][q0:q1]).astype(np.float32)
        out[q0:q1] = acc
        old, done = done, done + 1
        if old == S - 1:
            count, done = 0, 0
    return out.reshape(parts[0].shape), count, done


@pytest.mark.parametrize("S", (1, 2, 3, 7, 64, 100))
def test_spread_bands_cover_the_tile_and_match_last_bit_for_bit(S):
    rng = np.random.default_rng(S)
    chunks = 4096  # 4-float chunks of a slab (sm_100a) or slab half (sm_90a)
    bands = [(s * chunks // S, (s + 1) * chunks // S) for s in range(S)]
    assert bands[0][0] == 0 and bands[-1][1] == chunks
    assert all(a[1] == b[0] for a, b in zip(bands, bands[1:]))
    parts = [(rng.standard_normal(chunks * 4) * 10.0 ** rng.integers(-4, 5)).astype(np.float32)
             for _ in range(S)]
    order = list(rng.permutation(S))
    out, count, done = _spread_like_the_kernel(parts, order, chunks)
    assert (count, done) == (0, 0)
    last, _ = _reduce_like_the_kernel([parts[s] for s in order], order)
    # the same adds in the same order per element: the same bits as REDUCE="last"
    assert np.array_equal(out, last)


@pytest.mark.parametrize("arch", ARCHES)
def test_builders_refuse_bad_spread(arch):
    pytest.importorskip("tvm")
    step = registry.get("v11", arch)
    # 256x256: 4 tiles (sm_100a) / 2 tiles (sm_90a); 3 splits each, one SM short
    tiles, _ = splitk.tile_counts(256, 256, 640, arch)
    with pytest.raises(ValueError, match="tiles x SPLIT_K <= SM_COUNT"):
        step.build_primfunc(256, 256, 640, SPLIT_K=3, SM_COUNT=tiles * 3 - 1, REDUCE="spread")
    with pytest.raises(ValueError, match="REDUCE='fast'"):
        step.build_primfunc(256, 256, 640, SPLIT_K=3, REDUCE="fast")
    kw = {"SPLIT_K": 3, "SM_COUNT": tiles * 3, "REDUCE": "spread"}
    f = step.build_primfunc(256, 256, 640, **kw)
    specs = step.workspace_specs(256, 256, 640, kw)
    for name, shape, dt in specs:
        buf = next(p for p in f.params if p.name == name)
        assert tuple(int(x) for x in buf.shape) == shape and str(buf.dtype) == dt


# --- sm_90a v11's tile widths (BLK_N 64, 128, 256) ---

def test_tile_width_changes_tiles_and_workspace():
    # 256x256x16384: 2 tiles of 128x256, 4 of 128x128, 8 of 128x64
    for bn, tiles in ((None, 2), (256, 2), (128, 4), (64, 8)):
        assert splitk.tile_counts(256, 256, 16384, "sm_90a", bn) == (tiles, 256)
    kw = {"SPLIT_K": 16, "BLK_N": 128, "SM_COUNT": 132, "REDUCE": "spread"}
    assert workspace_specs(256, 256, 16384, kw, arch="sm_90a") == (
        ("WS", (16, 4, 128 * 128), "float32"), ("CNT", (4 * 2 * 2,), "int32"))
    # the spread split fills the GPU once with the narrower tile's count
    assert choose_split(256, 256, 16384, 132, arch="sm_90a", reduce="spread", bn=64) == \
        min(132 // 8, 256 // splitk.MIN_K_TILES_SPREAD)
    with pytest.raises(ValueError, match="BLK_N=96 is not one of 64, 128, 256"):
        splitk.tile_counts(256, 256, 16384, "sm_90a", 96)
    with pytest.raises(ValueError, match="BLK_N=64 is not one of 128"):
        splitk.tile_counts(256, 256, 16384, "sm_100a", 64)


def test_sm90a_v11_tile_width_builds_and_refusals():
    pytest.importorskip("tvm")
    step = registry.get("v11", "sm_90a")
    kw = {"SPLIT_K": 4, "BLK_N": 64, "SM_COUNT": 132, "REDUCE": "spread", "IN_FLIGHT": 32}
    f = step.build_primfunc(256, 256, 1024, **kw)
    for name, shape, dt in step.workspace_specs(256, 256, 1024, kw):
        buf = next(p for p in f.params if p.name == name)
        assert tuple(int(x) for x in buf.shape) == shape and str(buf.dtype) == dt
    with pytest.raises(ValueError, match="BLK_N=32 is not one of"):
        step.build_primfunc(256, 256, 1024, SPLIT_K=4, BLK_N=32)
    with pytest.raises(ValueError, match="IN_FLIGHT=3 must divide 16"):
        step.build_primfunc(256, 256, 1024, SPLIT_K=4, BLK_N=128, IN_FLIGHT=3)
