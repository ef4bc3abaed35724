"""v14's TAIL_SPLIT (sm_90a) on the CPU: the plan of the last wave's pieces (a Python twin of the
kernel's tail_plan and locate, checked for cover and slab use at every walk length), the
builder's refusals and operands, the build (the counter's atomic, no spills), the workspace
the registry gives, and the study's decision as its records' verdict. On silicon:
tests/test_gpu_grouped.py (TAIL_SPLIT cases), lab/moe_grouped_gemm."""
import json
from pathlib import Path

import pytest
from support import load_script

from tirx_gemm import registry, splitk

ROOT = Path(__file__).resolve().parent.parent


def pieces(total: int, pool: int, S: int, k_tiles: int):
    """The units of a walk of ``total`` tiles as the kernel computes them (its plan from
    splitk.tail_split_plan, the kernel's own text; its locate written out here):
    [(unit, tile, first K step, K steps, tail tile j or -1, piece p)]."""
    dp, units = splitk.tail_split_plan(total, pool, S)
    out = []
    for u in range(units):
        if u < dp:
            out.append((u, u, 0, k_tiles, -1, 0))
        else:
            j, p = divmod(u - dp, S)
            k0 = p * k_tiles // S
            out.append((u, dp + j, k0, (p + 1) * k_tiles // S - k0, j, p))
    return out


@pytest.mark.parametrize("S,k_tiles", [(2, 8), (3, 12), (4, 16), (4, 224)])
def test_every_tile_is_covered_once_and_the_pieces_stay_in_one_wave(S, k_tiles):
    pool = 132
    for total in range(0, 3 * pool + 7):
        units = pieces(total, pool, S, k_tiles)
        cover = {}
        for u, tile, k0, steps, j, p in units:
            assert steps >= k_tiles // S >= 4 or k_tiles < 4 * S
            cover.setdefault(tile, []).append((k0, steps))
        assert sorted(cover) == list(range(total))
        for tile, ranges in cover.items():  # K ranges in order, end to end, all of K
            ranges.sort()
            assert ranges[0][0] == 0 and sum(s for _, s in ranges) == k_tiles
            assert all(a[0] + a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        split = [x for x in units if x[4] >= 0]
        if split:  # one wave: each piece on its own CTA, slabs and counters in the workspace
            assert len(split) <= pool and len({u % pool for u, *_ in split}) == len(split)
            assert max(j for *_, j, _ in split) < pool // S
            assert len({(j, p) for *_, j, p in split}) == len(split)


def test_the_cut_engages_where_it_is_predicted_to_pay():
    """tail_split_plan: a tail that fits the pool is cut where the idle share of the last wave,
    times what the pieces save of a tile, over the walk's waves is at least 1/TAIL_MIN_GAIN."""
    pool = 132
    assert splitk.tail_split_plan(1088, pool, 4) == (1056, 1056 + 32 * 4)   # 9 waves, tail 32
    assert splitk.tail_split_plan(1056, pool, 4) == (1056, 1056)             # no tail
    assert splitk.tail_split_plan(1090, pool, 4) == (1090, 1090)             # tail 34: 136 > 132
    assert splitk.tail_split_plan(7952, pool, 4) == (7952, 7952)             # 61 waves: < 2%
    for total in range(1, 60 * pool):
        dp, units = splitk.tail_split_plan(total, pool, 4)
        tail, waves = total % pool, -(-total // pool)
        gain = (pool - tail) / pool * 3 / 4 / waves
        assert (units != total) == (0 < tail <= pool // 4 and gain >= 1 / splitk.TAIL_MIN_GAIN)


def test_workspace_specs_size_the_kernels_operands():
    assert splitk.workspace_specs_v14(0, 4096, 14336, {}) == ()
    ws = splitk.workspace_specs_v14(0, 4096, 14336, {"TAIL_SPLIT": 4, "BLK_M": 128, "BLK_N": 256})
    assert ws == (("WS", (4, 33, 128 * 256), "float32"), ("CNT", (66,), "int32"))
    step = registry.get("v14", "sm_90a")
    assert step.workspace_specs(0, 1024, 1024, {"TAIL_SPLIT": 3, "SM_COUNT": 130}) == (
        ("WS", (3, 43, 128 * 128), "float32"), ("CNT", (86,), "int32"))


def test_builder_refusals_operands_and_build():
    pytest.importorskip("tvm")
    step = registry.get("v14", "sm_90a")
    for kw, msg in ((dict(TAIL_SPLIT=0), "TAIL_SPLIT=0 must be an int >= 1"),
                    (dict(TAIL_SPLIT=True), "TAIL_SPLIT=True must be an int"),
                    (dict(TAIL_SPLIT=2, SWAP_AB=True, BLK_N=16), "cuts plain tiles along K"),
                    (dict(TAIL_SPLIT=2, BLK_N=200), "BLK_N a multiple of 64"),
                    (dict(TAIL_SPLIT=4, BLK_N=128), "K=512"),  # 8 K steps: 2 a piece
                    (dict(TAIL_SPLIT=2, FP8_BLOCK=True, dtype="bfloat16"), "TAIL_SPLIT")):
        with pytest.raises(ValueError, match=msg) as info:
            step.build_primfunc(256, 256, 512, **kw)
        assert "\n" not in str(info.value)
    f = step.build_primfunc(256, 1024, 1024, BLK_N=256, TAIL_SPLIT=4, ROW_SCALE=True)
    assert [p.name for p in f.params] == ["A", "B", "D", "routing", "scale", "WS", "CNT"]
    assert [p.name for p in step.build_primfunc(256, 1024, 1024).params] == ["A", "B", "D", "routing"]
    from tirx_gemm.compile.api import build
    r = build("v14", 1024, 1024, 1024, arch="sm_90a", BLK_N=256, TMA_STORE=True, TAIL_SPLIT=4)
    assert r.spill_stores == 0 and r.spill_loads == 0
    assert r.sass_counts.get("ATOMG.E.ADD.S32.STRONG.GPU") == 1, r.sass_counts
    plain = build("v14", 1024, 1024, 1024, arch="sm_90a", BLK_N=256, TMA_STORE=True)
    assert not any(k.startswith("ATOMG") for k in plain.sass_counts)


def test_the_decision_is_the_rule_runs_verdict():
    """lab/moe_grouped_gemm/tail_split.py on the committed runs: the two rules at K >= 4096 did
    not pass (every result checked, no case over 2% slower, the geomean short), the deep-K
    rule did (all 12 cases of its suite recorded), so choose_grouped takes the cut from
    K = TAIL_SPLIT_FROM_K = 8192 only."""
    V = load_script("lab/moe_grouped_gemm/tail_split.py")
    path = ROOT / "lab/moe_grouped_gemm/records/tail_split_rule_h100_bfloat16.jsonl"
    table = V.rows(json.loads(x) for x in path.read_text().splitlines())
    assert len(table) == 16 and {row[3] for row in table} == {0, 100}
    ok, gm, worst = V.verdict(table)
    assert not ok and gm < V.GEOMEAN and worst <= V.WORST and all(row[-1] for row in table)
    held = ROOT / "lab/moe_grouped_gemm/records/tail_split_heldout_h100_bfloat16.jsonl"
    ok, gm, worst, cut = V.heldout(json.loads(x) for x in held.read_text().splitlines())
    assert not ok and cut == 5 and gm < V.HELDOUT_GEOMEAN and worst <= V.WORST
    deep = ROOT / "lab/moe_grouped_gemm/records/tail_split_deep_k_h100_bfloat16.jsonl"
    verdict, fig, why = V.deep_k(json.loads(x) for x in deep.read_text().splitlines())
    assert verdict == "passes" and not why and fig["cases"] == 12 and fig["cut"] == 9
    assert fig["geomean"] >= V.DEEP_K_GEOMEAN and fig["worst"] >= V.DEEP_K_WORST
    from tirx_gemm.op import grouped as G
    assert (G.TAIL_SPLIT, G.TAIL_SPLIT_FROM_K) == (4, V.DEEP_K_MIN)
    for rows, E, N, K in ((1024, 8, 28672, 4096), (32768, 256, 4096, 7168)):
        assert "TAIL_SPLIT" not in G.choose_grouped(rows, E, N, K, "bfloat16")[1]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_pick_cuts_the_wide_contiguous_tile_at_deep_k_only(dtype):
    """The deep-K rule in choose_grouped: Mixtral-8x7B's down projection (K = 14336) at 4096
    tokens, top-2, takes TAIL_SPLIT=4 on its 128x256 tile (explain says so); its gate/up
    (K = 4096), the swap-AB tile at few rows, the masked layout and the 128x128 tile do not."""
    from tirx_gemm.op import grouped as G
    kw = G.choose_grouped(4096 * 2, 8, 4096, 14336, dtype)[1]
    assert (kw["BLK_M"], kw["BLK_N"], kw["LAYOUT"], kw["TAIL_SPLIT"]) == (128, 256, "contiguous", 4)
    assert "TAIL_SPLIT=4 (K=14336 >= 8192)" in G.explain_grouped(4096 * 2, 8, 4096, 14336, dtype)
    assert "TAIL_SPLIT" not in G.choose_grouped(4096 * 2, 8, 28672, 4096, dtype)[1]  # gate/up
    kw = G.choose_grouped(16, 8, 4096, 14336, dtype)[1]
    assert kw["SWAP_AB"] and "TAIL_SPLIT" not in kw                               # decode
    kw = G.choose_grouped(8 * 1024, 8, 4096, 14336, dtype, "masked")[1]
    assert (kw["BLK_M"], kw["BLK_N"]) == (128, 256) and "TAIL_SPLIT" not in kw    # masked
    kw = G.choose_grouped(4096 * 2, 8, 128, 14336, dtype)[1]
    assert kw["BLK_N"] == 128 and "TAIL_SPLIT" not in kw                          # N < 256
    assert "TAIL_SPLIT" not in G.choose_grouped(8192, 8, 4096, 8192 - 64, dtype)[1]  # K < 8192
    assert G.choose_grouped(8192, 8, 4096, 8192, dtype)[1]["TAIL_SPLIT"] == 4


def test_the_op_sizes_the_cuts_workspace():
    """What the op passes a TAIL_SPLIT pick (grouped_kernels.workspace): the registry's slabs
    and counters for the picked keywords; () for a pick without the cut. The buffers
    themselves (per stream, fresh under capture): tests/test_gpu_grouped.py."""
    import torch

    from tirx_gemm.op import grouped as G
    step, kw = G.choose_grouped(4096 * 2, 8, 4096, 14336, "bfloat16")
    specs = registry.get(step, "sm_90a").workspace_specs(0, 4096, 14336, kw)
    assert specs and specs == splitk.workspace_specs_v14(0, 4096, 14336, kw)
    G.clear_cache()
    try:  # the device named with its index: nothing touches CUDA until a launch asks (get)
        ws = G.GK.workspace(step, "sm_90a", 4096, 14336, kw, torch.device("cuda", 0))
        assert (ws.N, ws.K, ws.index) == (4096, 14336, 0)
        assert ws.owner.specs(0, 4096, 14336) == specs
        _, plain = G.choose_grouped(4096 * 2, 8, 28672, 4096, "bfloat16")
        assert G.GK.workspace(step, "sm_90a", 28672, 4096, plain, torch.device("cuda", 0)) == ()
    finally:
        G.clear_cache()


def test_the_texts_state_the_constants():
    """The gain bar and the piece floor are written out in the registry's constraints, the card
    and the lesson and study README: each as the constants in splitk say."""
    bar, k_min = f"{1 / splitk.TAIL_MIN_GAIN:.0%}", f"K >= {splitk.TAIL_MIN_STEPS * 64} S"
    assert k_min in registry.get("v14", "sm_90a").constraints
    assert k_min in (ROOT / "steps/sm90a/hgemm_v14.py").read_text()
    assert f"saves {bar} or more" in (ROOT / "steps/lessons/v14.md").read_text()
    assert f"only where that is at least {bar}" in (ROOT / "lab/moe_grouped_gemm/README.md").read_text()
