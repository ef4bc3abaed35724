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
    # SPLIT_K absent: the builder's choice at SM_COUNT (default: the arch's GPU)
    assert workspace_specs(256, 256, 16384, {"SM_COUNT": 148})[0][1][0] == 11
    assert workspace_specs(256, 256, 16384, {})[0][1][0] == 11
    assert splitk.workspace_specs_sm90a(256, 256, 16384, {})[0][1][0] == 9


def test_registry_rows_carry_the_workspace():
    for arch, fn in (("sm_100a", workspace_specs), ("sm_90a", splitk.workspace_specs_sm90a)):
        step = registry.get("v11", arch)
        assert step.sm_count_kwarg == "SM_COUNT"
        for kw in ({"SPLIT_K": 3, "SM_COUNT": 12}, {"SPLIT_K": 1}, {}):
            assert step.workspace_specs(256, 256, 640, kw) == fn(256, 256, 640, kw)
    sim_kwargs = [dict(kw) for _, kw in registry.get("v11").sim_cases]
    assert {kw.get("SPLIT_K") for kw in sim_kwargs} >= {1, 2, 3, 4}
    assert any(kw.get("dtype") == "bfloat16" for kw in sim_kwargs)


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
