"""v12's tile menu builder: keywords that change its pipeline (issue 32), on the CPU."""
import json
import math
import re
from pathlib import Path

import pytest

from tirx_gemm import registry

ROOT = Path(__file__).parents[1]


# The helpers of the tests below that recompute quoted figures from H200 A/B records.
def _lab_records(name: str) -> list[dict]:
    """results/lab/<name>, one dict per JSON line."""
    text = (ROOT / "results" / "lab" / name).read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def _mean_log_ratio(records) -> float:
    """The mean of the records' log ratios to torch (a case's passes)."""
    return sum(math.log(r["ratio"]) for r in records) / len(records)


def _source_text(rel: str) -> str:
    """A module's text with its comment lines joined, so a quoted sentence reads as one."""
    return re.sub(r"\s*#\s*", " ", (ROOT / rel).read_text())


def _readme_text(code: bool = True) -> str:
    """README's prose with the rec markers removed and whitespace collapsed (code=False:
    backticks removed too)."""
    text = re.sub(r"\s+", " ", re.sub(r"<!-- /?rec[^>]*-->", "", (ROOT / "README.md").read_text()))
    return text if code else text.replace("`", "")


def _ab_summary(gains) -> str:
    """How README and the chooser notes quote an A/B's cases: "N cases lo-hix (geomean g,
    behind at b" (gains: the variant over the package before, per case)."""
    return (f"{len(gains)} cases {min(gains):.3f}-{max(gains):.3f}x (geomean "
            f"{math.exp(sum(map(math.log, gains)) / len(gains)):.3f}, behind at "
            f"{sum(g < 1 for g in gains)}")


def test_mma_lag_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="MMA_LAG=4 needs PIPE_DEPTH > 4"):
        step.build_primfunc(64, 256, 512, BLK_M=64, BLK_N=64, PIPE_DEPTH=4, MMA_LAG=4)
    with pytest.raises(ValueError, match="MMA_LAG=0"):
        step.build_primfunc(64, 256, 512, BLK_M=64, BLK_N=64, MMA_LAG=0)


@pytest.mark.parametrize("lag", [1, 3])
def test_mma_lag_sets_the_wait_and_releases_every_stage(lag):
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    text = step.build_primfunc(64, 256, 512, BLK_M=64, BLK_N=64, PIPE_DEPTH=8,
                               MMA_LAG=lag).script()
    # the K loop waits with MMA_LAG groups pending; the tile's end drains to 0
    waits = [ln.strip() for ln in text.splitlines() if "wgmma" in ln and "wait_group" in ln]
    assert waits == [f'T.ptx.wgmma({lag}, "wait_group", "sync", "aligned", "")',
                     'T.ptx.wgmma(0, "wait_group", "sync", "aligned", "")']


def test_swap_ab_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="SWAP_AB=True takes no fused epilogue"):
        step.build_primfunc(8, 256, 512, BLK_M=64, BLK_N=8, SWAP_AB=True, ACT="relu")
    with pytest.raises(ValueError, match="BLK_N=12 must be a multiple of 8"):
        step.build_primfunc(8, 256, 512, BLK_M=64, BLK_N=12, SWAP_AB=True)
    with pytest.raises(ValueError, match="BLK_N=20 must be a multiple of 8"):
        step.build_primfunc(8, 256, 512, BLK_M=64, BLK_N=20)


def test_the_width_rules_are_written_as_the_builder_and_the_lab_have_them():
    """v12@sm_90a's registry constraint names the builder's width steps, and the README's
    range of the 128-row widths of 8 is the lab sweep's menu (results/lab/v12_widths8_*)."""
    pytest.importorskip("tvm")
    import importlib.util
    import re
    from pathlib import Path
    from tirx_gemm import epilogue
    from tirx_gemm.steps.sm90a import hgemm_v12 as v12
    root = Path(__file__).resolve().parents[1]
    text = registry.get("v12", "sm_90a").constraints
    assert (f"BLK_N a multiple of {v12.BLK_N_STEP} in [{v12.BLK_N_STEP}, {v12.BLK_N_MAX}] "
            f"({v12.PAIR_N_STEP} for CLUSTER=2 and SWIGLU)") in text
    assert v12.PAIR_N_STEP == epilogue.SWIGLU_TILE_STEP
    spec = importlib.util.spec_from_file_location("v12_sweep", root / "scripts/lab/v12_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    wide = [bn for bm, bn in sweep.WIDTHS8_MENU if bm == 128]
    assert wide == list(range(wide[0], wide[-1] + 1, 2 * v12.BLK_N_STEP))
    readme = re.sub(r"\s+", " ", (root / "README.md").read_text())
    assert f"128 the odd multiples of {v12.BLK_N_STEP} from {wide[0]} to {wide[-1]}" in readme


def test_one_cta_tiles_take_any_multiple_of_8_columns():
    """BLK_N of an odd multiple of 8 (2304 = 14 x 164.6: 168-column tiles): one
    m64n168k16 wgmma per consumer and k16, and the columns past the 64-column TMA chunks
    by guarded stores."""
    pytest.importorskip("tvm")
    import re
    text = registry.get("v12", "sm_90a").build_primfunc(
        256, 2304, 512, BLK_M=128, BLK_N=168).script()
    assert set(re.findall(r"m64n\d+k16", text)) == {"m64n168k16"}
    assert "tirx_gemm_st_global_b32" in text


def test_swiglu_tiles_hold_whole_gate_up_group_pairs():
    """SWIGLU's outputs are BLK_N / 2 columns in groups of 8: BLK_N a multiple of 16 (one
    line from the builder). matmul gives every fused epilogue such a tile, also where the
    model's best plain tile is an odd multiple of 8 (2304^3: 128x168), since those widths
    have not run with an epilogue on a GPU."""
    from tirx_gemm import epilogue
    from tirx_gemm.op import chooser
    from tirx_gemm.op import choice as mc
    assert chooser.EPILOGUE_TILE_STEP % epilogue.SWIGLU_TILE_STEP == 0
    assert chooser.best_tile(2304, 2304, 2304) == "128x168"
    for epi, n in (({"SWIGLU": True}, 1152), ({"ACT": "relu"}, 2304),
                   ({"OUT_DTYPE": "float32"}, 2304)):
        step, kw = mc.choose(2304, n, 2304, "bfloat16", "sm_90a", 132, epilogue=epi)
        assert step == "v12" and kw["BLK_N"] % chooser.EPILOGUE_TILE_STEP == 0, (epi, kw)
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="SWIGLU=True needs BLK_N a multiple of 16") as e:
        step.build_primfunc(256, 2304, 512, BLK_M=128, BLK_N=168, SWIGLU=True)
    assert "\n" not in str(e.value)


def test_swap_ab_tiles_walk_n_with_the_mma_rows():
    pytest.importorskip("tvm")
    text = registry.get("v12", "sm_90a").build_primfunc(
        5, 1000, 512, BLK_M=64, BLK_N=8, SWAP_AB=True).script()
    # the producer loads B's rows into the MMA's A tile and A's rows into its B tile
    loads = [ln.strip() for ln in text.splitlines() if "copy_async(Asmem" in ln
             or "copy_async(Bsmem" in ln]
    assert any("copy_async(Asmem" in ln and ", B[" in ln for ln in loads), loads
    assert any("copy_async(Bsmem" in ln and ", A[" in ln for ln in loads), loads


def test_cluster_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="CLUSTER=3 must be 1, 2 or 4"):
        step.build_primfunc(256, 256, 512, BLK_M=64, BLK_N=64, CLUSTER=3)
    with pytest.raises(ValueError, match="CLUSTER=2 needs BLK_N a multiple of 16"):
        step.build_primfunc(8, 256, 512, BLK_M=64, BLK_N=8, SWAP_AB=True, CLUSTER=2)
    with pytest.raises(ValueError, match="CLUSTER=2 needs BLK_N a multiple of 16"):
        step.build_primfunc(256, 2304, 512, BLK_M=128, BLK_N=168, CLUSTER=2)
    # swap-AB pairs share the token tile: each CTA loads its weight rows and half the
    # tokens, multicast into both (the kernel's B operand is A, its A operand B)
    s = step.build_primfunc(48, 4096, 512, BLK_M=64, BLK_N=48, SWAP_AB=True,
                            CLUSTER=2).script()
    loads = [ln for ln in s.splitlines() if "copy_async(" in ln]
    assert any("copy_async(Asmem" in ln and ", B[" in ln for ln in loads), loads
    assert any("cta_mask" in ln and ", A[" in ln for ln in loads), loads
    with pytest.raises(ValueError, match="CLUSTER=2 takes no fused epilogue"):
        step.build_primfunc(256, 256, 512, BLK_M=64, BLK_N=64, CLUSTER=2, ACT="relu")
    with pytest.raises(ValueError, match="CLUSTER=2 runs with MMA_LAG=1"):
        step.build_primfunc(256, 256, 512, BLK_M=64, BLK_N=64, CLUSTER=2, MMA_LAG=2,
                            PIPE_DEPTH=6)


def test_cluster_pairs_share_b_by_multicast():
    """CLUSTER=2: each CTA loads half of B's tile for both (a multicast mask), the empty
    barrier counts both CTAs' consumers, and the kernel ends on a cluster barrier."""
    pytest.importorskip("tvm")
    text = registry.get("v12", "sm_90a").build_primfunc(
        1000, 1000, 1000, BLK_M=64, BLK_N=128, CLUSTER=2).script()
    assert "cta_mask" in text and "cluster_sync" in text
    assert "mapa.shared::cluster" in text  # the remote release of a stage
    one = registry.get("v12", "sm_90a").build_primfunc(1000, 1000, 1000, BLK_M=64,
                                                       BLK_N=128).script()
    assert "cta_mask" not in one and "cluster_sync" not in one


@pytest.mark.parametrize("tokens,shares", [(64, (16, 16, 16, 16)), (72, (24, 24, 24, 0)),
                                           (88, (24, 24, 24, 16)), (56, (16, 16, 16, 8))])
def test_clusters_of_four_share_the_token_tile_in_whole_atoms(tokens, shares):
    """CLUSTER=4 (swap-AB along the weight): each CTA loads its own weight tile and a share
    of the token tile of whole 8-row swizzle atoms, multicast to all four (mask 0b1111);
    the last nonempty share is what is left, a CTA past it loads its own tile only; the
    empty barrier counts the four CTAs' consumers and every consumer releases a stage in
    all four."""
    pytest.importorskip("tvm")
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    func = hgemm_v12(tokens, 4608, 4096, BLK_M=64, BLK_N=tokens, SWAP_AB=True, CLUSTER=4,
                     SM_COUNT=132, RUNTIME_M=True, PDL=True)
    text = func.script()
    shared = [ln for ln in text.splitlines() if "copy_async(" in ln and ", A[" in ln]
    assert all("cta_mask=15" in ln for ln in shared) and shared
    share = shares[0]
    sizes = sorted({int(m) for ln in shared
                    for m in re.findall(rf"rank \* {share}:rank \* {share} \+ (\d+)", ln)})
    assert sizes == sorted({x for x in shares if x}), (sizes, shares)
    assert sum(shares) == tokens and all(x % 8 == 0 for x in shares)
    own = [ln for ln in text.splitlines() if "copy_async(" in ln and ", B[" in ln]
    # one own-tile load per branch: one for even shares, one per kind of share otherwise
    assert len(own) == (1 if len(set(shares)) == 1 else 3), own
    assert "cta_id_in_cluster([4, 1])" in text and "cluster_sync" in text
    assert "warp_id * 32 + lane_id < 4" in text  # a release in each of the four CTAs
    from tirx_gemm import pdl
    assert list(func.attrs["tirx.kernel_launch_params"]) == list(pdl.PAIR_LAUNCH_PARAMS)


def test_cluster_of_four_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    for kw, msg in (({"SM_COUNT": 130}, "SM_COUNT=130 is not a multiple of the cluster size 4"),
                    ({"ACT": "relu"}, "CLUSTER=4 takes no fused epilogue"),
                    ({"MMA_LAG": 2, "PIPE_DEPTH": 6}, "CLUSTER=4 runs with MMA_LAG=1"),
                    ({"STREAM_K": True}, "STREAM_K=True takes no CLUSTER > 1")):
        with pytest.raises(ValueError, match=msg) as e:
            step.build_primfunc(72, 4608, 4096, BLK_M=64, BLK_N=72, CLUSTER=4, **kw)
        assert "\n" not in str(e.value)


def test_pairs_along_n_share_the_mma_a_tile_by_multicast():
    """PAIR_ALONG="N": the pair's CTAs take consecutive column blocks (rank picks the
    block), each loads its own B tile and half of the MMA's A tile multicast to both (the
    tokens; with SWAP_AB the weight's rows); the default pair is along M. Refused without
    CLUSTER=2 or with another axis."""
    pytest.importorskip("tvm")
    import re
    step = registry.get("v12", "sm_90a")
    for kw, own, shared, half, rows in (
            (dict(BLK_M=128, BLK_N=80), "B", "A", 64, 80),
            (dict(BLK_M=64, BLK_N=32, SWAP_AB=True), "A", "B", 32, 32)):
        text = step.build_primfunc(256, 1024, 512, CLUSTER=2, PAIR_ALONG="N",
                                   **kw).script()
        loads = [ln for ln in text.splitlines() if "copy_async(" in ln and "smem[" in ln]
        own_load = [ln for ln in loads if f"], {own}[" in ln]
        shared_load = [ln for ln in loads if f"], {shared}[" in ln]
        assert len(own_load) == 1 and "cta_mask" not in own_load[0]
        assert f"Bsmem[ring_stage, 0:{rows}, 0:64]" in own_load[0]
        assert re.search(rf"\(\w+ \* 2 \+ rank\) \* {rows}", own_load[0])  # its own column block
        assert len(shared_load) == 1 and "cta_mask=3" in shared_load[0]
        assert f"Asmem[ring_stage, rank * {half}:rank * {half} + {half}, 0:64]" in shared_load[0]
        assert "cluster_sync" in text and "mapa.shared::cluster" in text
    with pytest.raises(ValueError, match="PAIR_ALONG='N' places the CTAs of a cluster"):
        step.build_primfunc(256, 1024, 512, BLK_M=64, BLK_N=64, PAIR_ALONG="N")
    with pytest.raises(ValueError, match="PAIR_ALONG='K' must be 'M'"):
        step.build_primfunc(256, 1024, 512, BLK_M=64, BLK_N=64, CLUSTER=2, PAIR_ALONG="K")
    # matmul never asks for it (behind its picks on the H200: README)
    from tirx_gemm.op import choice as mc
    for N, K in ((4096, 4096), (5120, 13824), (1000, 1000)):
        assert all("PAIR_ALONG" not in kw for _, kw, _, _ in
                   mc.variants(N, K, "bfloat16", "sm_90a", 132, max_m=1024))


def test_chooser_pairs_and_widths():
    """A pair is one tile of twice the rows on half the slots; pairs enter only where K's
    rows are not whole 128-byte lines (the measured case for them); every menu width the
    sweeps measured is a candidate."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    assert chooser.tile("64x128c2") == (64, 128, 2) and chooser.name(64, 128, 2) == "64x128c2"
    assert chooser.geometry("64x128c2", 132) == (128, 128, 66)
    assert chooser.misaligned_rows(1000) and not chooser.misaligned_rows(1024)
    assert all(not chooser.clustered(c) or c in (chooser.V9, chooser.V10)
               for _, c in chooser.rank(1024, 1024, 1024))
    assert chooser.best(1000, 1000, 1000) == "64x128c2"
    assert mm.choose(1000, 1000, 1000, "bfloat16", "sm_90a", 132)[1]["CLUSTER"] == 2
    assert "CLUSTER" not in mm.choose(1024, 1024, 1024, "bfloat16", "sm_90a", 132)[1]
    assert not chooser.clustered(chooser.best(1000, 1000, 1000, 131))  # odd SM count
    assert {"128x144", "64x208", "64x112"} <= set(chooser.params())


def test_chooser_swap_ab_rule():
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    assert chooser.swap_ab_tile(1, 8192, 132) == (64, 8)       # 64 tiles of 128: too few
    assert chooser.swap_ab_tile(16, 14336, 132) == (128, 16)   # 112 tiles of 128
    assert chooser.swap_ab_tile(77, 7168, 132) == (64, 80)
    assert chooser.swap_ab_tile(97, 7168, 132) is None
    # few 64-row weight tiles (N / 64 <= SMs / 2): swap-AB split in SMs // tiles
    step, kw = mm.choose(1, 4096, 4096, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["SWAP_AB"] and (kw["BLK_M"], kw["BLK_N"]) == (64, 8)
    assert kw["SPLIT_K"] == 2 and "RUNTIME_NK" not in kw
    step, kw = mm.choose(32, 4096, 14336, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["SWAP_AB"] and kw["BLK_N"] == 32 and kw["SPLIT_K"] == 2
    # many weight tiles, at most 48 tokens: the non-persistent kernel, token tile >= 16
    step, kw = mm.choose(8, 14336, 4096, "bfloat16", "sm_90a", 132)
    assert (kw["BLK_M"], kw["BLK_N"], kw["SPLIT_K"], kw["PIPE_DEPTH"]) == (64, 16, 1, 8)
    assert kw["SWAP_AB"] and kw["RUNTIME_NK"]  # N and K at run time (matmul_choice)
    # more tokens: the persistent swap-AB kernel of swap_ab_tile, with PDL when its bytes
    # at the HBM rate are short (chooser.hbm_floor <= PDL_MAX_US)
    step, kw = mm.choose(77, 7168, 2048, "bfloat16", "sm_90a", 132)
    assert (kw["BLK_M"], kw["BLK_N"]) == (64, 80) and "SPLIT_K" not in kw
    assert kw["PDL"] is True and chooser.swap_pdl(77, 7168, 2048)
    assert chooser.hbm_floor(77, 7168, 2048) <= chooser.PDL_MAX_US
    step, kw = mm.choose(64, 6144, 4096, "bfloat16", "sm_90a", 132)
    assert kw["SWAP_AB"] and not chooser.swap_pdl(64, 6144, 4096)
    assert kw["PDL"] and kw["PDL_TRIGGER"] == "exit"  # no start trigger (PDL_EXIT_NOTE)
    # persistent swap-AB tiles, swap-AB stored by TMA and pairs: built for N and K
    assert "RUNTIME_NK" not in kw and kw["RUNTIME_M"]
    assert "RUNTIME_NK" not in mm.choose(77, 7168, 2048, "bfloat16", "sm_90a", 132)[1]
    kw = mm.choose(3152, 768, 3072, "bfloat16", "sm_90a", 132)[1]
    assert kw["SWAP_TMA"] and "RUNTIME_NK" not in kw and kw["RUNTIME_M"]
    kw = mm.choose(1000, 1000, 1000, "bfloat16", "sm_90a", 132)[1]
    assert kw["CLUSTER"] == 2 and "RUNTIME_NK" not in kw and kw["RUNTIME_M"]
    assert chooser.hbm_floor(64, 6144, 4096) > chooser.PDL_MAX_US
    # token tiles of every multiple of 8, as cuBLAS's: 37 tokens in 40, 70 in 72, 85 in 88
    assert chooser.SWAP_AB_TILES == tuple(range(8, 97, 8))
    assert chooser.swap_ab_tile(37, 14336, 132) == (128, 40)
    assert chooser.swap_ab_tile(70, 7168, 132) == (64, 72)
    assert chooser.swap_ab_tile(85, 7168, 132) == (64, 88)
    assert mm.choose(37, 14336, 4096, "bfloat16", "sm_90a", 132)[1]["BLK_N"] == 40
    # variants: one kernel per token tile below 97 rows, each named for its M range; a K
    # split (4096x4096's decode) takes every one of them but 56 (behind 64 at S = 4 on the
    # H200: chooser.py's figures)
    v = mm.variants(4096, 4096, "bfloat16", "sm_90a", 132, max_m=128)
    swaps = [(kw["BLK_N"], lo, hi) for _, kw, lo, hi in v if kw.get("SWAP_AB")]
    tiles = chooser.SWAP_SPLIT_TILES
    assert all(kw["SPLIT_K"] == 2 for _, kw, _, _ in v if kw.get("SWAP_AB"))
    assert swaps == [(t, lo + 1, t) for lo, t in zip((0,) + tiles, tiles)]
    assert tiles == tuple(t for t in chooser.SWAP_AB_TILES if t != 56)
    assert mm.choose(50, 4096, 4096, "bfloat16", "sm_90a", 132)[1]["BLK_N"] == 64
    for m, width, split in ((70, 72, 2), (85, 88, 2), (87, 88, 4), (54, 64, 4)):
        kw = mm.choose(m, 2048 if split == 4 else 4096, 8192 if split == 4 else 14336,
                       "bfloat16", "sm_90a", 132)[1]
        assert (kw["BLK_N"], kw["SPLIT_K"], kw["SWAP_AB"]) == (width, split, True), m
    v = mm.variants(14336, 4096, "bfloat16", "sm_90a", 132, max_m=128)  # no K split
    swaps = [(kw["BLK_N"], lo, hi) for _, kw, lo, hi in v if kw.get("SWAP_AB")]
    assert swaps == [(16, 1, 16)] + [(t, t - 7, t) for t in range(24, 97, 8)]
    assert all(kw.get("SPLIT_K", 1) == 1 for _, kw, _, _ in v)


def test_non_persistent_swap_ab_takes_pdl_only_where_its_ctas_fit_the_sms():
    """chooser.np_swap_pdl: with more CTAs than SMs PDL's early launch of the next kernel
    cost up to a fifth of the time in CUDA graphs (chooser.py's figures)."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    for mnk, pdl in (((8, 14336, 4096), False), ((2, 10240, 8192), False),
                     ((1, 8192, 8192), True), ((1, 4608, 3584), True)):
        step, kw = mm.choose(*mnk, "bfloat16", "sm_90a", 132)
        assert kw["SPLIT_K"] == 1 and kw["SWAP_AB"], mnk
        # PDL's early launch only where the CTAs fit; elsewhere the next kernel launches
        # as these CTAs exit (PDL_TRIGGER="exit", matmul_choice's PDL_EXIT_NOTE)
        assert kw["PDL"] is True and kw.get("PDL_TRIGGER", "start") == (
            "start" if pdl else "exit"), mnk
        assert chooser.np_swap_pdl(mnk[0], mnk[1], kw["BLK_N"]) is pdl
    # the split kernels keep PDL
    assert mm.choose(1, 4096, 4096, "bfloat16", "sm_90a", 132)[1]["PDL"] is True
    assert mm.choose(256, 256, 16384, "bfloat16", "sm_90a", 132)[1]["PDL"] is True


def test_decode_keeps_the_non_persistent_kernel_on_an_unbalanced_grid():
    """Swap-AB with stream-K lost out of sample (chooser.py's note): decode at up to 48
    tokens with many weight tiles keeps the non-persistent swap-AB kernel, balanced or not."""
    from tirx_gemm import matmul as mm
    for mnk in ((2, 10240, 8192), (40, 11008, 4096), (1, 9216, 2304)):
        step, kw = mm.choose(*mnk, "bfloat16", "sm_90a", 132)
        assert kw["SWAP_AB"] and kw["SPLIT_K"] == 1 and "STREAM_K" not in kw, mnk


def test_split_plans_keep_every_unit_resident_and_a_usable_l2_group():
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    # with M at run time no split is a multiple of the build's L2 group (TVM would fold
    # the tile order's unreachable `% tail` into a division by zero), and tiles x S fits
    for mnk in ((128, 128, 65536), (128, 256, 32768), (384, 128, 12288), (32, 4096, 14336),
                (256, 256, 16384), (1, 4096, 4096), (48, 4096, 14336), (200, 3584, 18944),
                (333, 4096, 14336), (97, 4096, 14336)):
        step, kw = mm.choose(*mnk, "float16", "sm_90a", 132)
        assert step == "v12" and kw["SPLIT_K"] > 1, mnk
        assert kw["SPLIT_K"] % kw["L2_GROUP"]
        rows, cols = (mnk[1], mnk[0]) if kw.get("SWAP_AB") else mnk[:2]
        tiles = -(-rows // kw["BLK_M"]) * -(-cols // kw["BLK_N"])
        assert tiles * kw["SPLIT_K"] <= 132, (mnk, kw)
        assert -(-mnk[2] // 64) // kw["SPLIT_K"] >= chooser.SPLIT_MIN_K_STEPS


def test_swap_ab_splits_past_decode():
    """chooser.best_wide_swap_split: between the decode token tiles and WIDE_SWAP_MAX_M
    tokens a split may run swapped tiles holding the tokens in few pieces of a multiple of
    16; the measured picks (chooser.py's figures) and the ring rule that keeps 128x256
    units out."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    assert [chooser.wide_swap_tokens(m) for m in (97, 200, 208, 209, 256, 257, 333, 512)] \
        == [112, 208, 208, 224, 256, 144, 176, 256]
    assert chooser.wide_swap_tokens(256, 1) == 128
    assert chooser.wide_swap_token_tiles(256) == (256, 128)
    assert chooser.ring_stages(128, 208) == 5 and chooser.ring_stages(128, 256) == 4
    for mnk, tile in (((200, 3584, 18944), (128, 208, 4)), ((333, 4096, 14336), (128, 176, 2)),
                      ((160, 4096, 14336), (128, 160, 4))):
        step, kw = mm.choose(*mnk, "bfloat16", "sm_90a", 132)
        assert step == "v12" and kw["SWAP_AB"] and kw["PDL"], (mnk, kw)
        assert (kw["BLK_M"], kw["BLK_N"], kw["SPLIT_K"]) == tile, (mnk, kw)
        assert "RUNTIME_NK" not in kw and kw["RUNTIME_M"]
    # a 128x256 unit is no candidate (4 stages): 256x5120x13824 stays data-parallel
    assert chooser.best_wide_swap_split(256, 5120, 13824) is None
    assert "SPLIT_K" not in mm.choose(256, 5120, 13824, "bfloat16", "sm_90a", 132)[1]
    # outside the range: decode's own rules, and no swapped split past 512 tokens
    assert chooser.best_wide_swap_split(96, 4096, 14336) is None
    assert chooser.best_wide_swap_split(513, 4096, 14336) is None


def test_ring_stages_is_the_depth_check_pipe_depth_allows():
    """spec.ring_stages (the builders' default depth and the chooser's WIDE_SWAP_MIN_STAGES
    test) is the deepest ring helpers.check_pipe_depth accepts."""
    pytest.importorskip("tvm")
    from tirx_gemm.op import chooser
    from tirx_gemm import helpers as H
    for stage, other in ((24576, 0), (43008, 0), (49152, 0), (38912, 32768), (40960, 16384)):
        depth = H.ring_stages(stage, other)
        H.check_pipe_depth(depth, stage, other)
        with pytest.raises(ValueError):
            H.check_pipe_depth(depth + 1, stage, other)
    assert chooser.ring_stages(128, 208) == H.ring_stages((128 + 208) * 64 * 2)


def test_variants_follow_the_swap_split_token_tiles():
    """matmul.variants lists a kernel per token tile of the swap-AB splits: every M of the
    range is served by the variant that choose picks for it."""
    from tirx_gemm import matmul as mm
    vs = mm.variants(4096, 14336, "bfloat16", "sm_90a", 132, max_m=640)
    assert vs[0][2] == 1 and all(a[3] + 1 == b[2] for a, b in zip(vs, vs[1:]))
    assert any(kw.get("SWAP_AB") and kw["BLK_N"] > 96 for _, kw, _, _ in vs)
    for step_id, kw, lo, hi in vs:
        for M in range(lo, hi + 1):
            assert mm.choose(M, 4096, 14336, "bfloat16", "sm_90a", 132) == (step_id, kw), M


def test_readme_states_the_rules_as_the_code_has_them():
    """The README's chooser paragraph quotes swap-AB's token tiles and the narrow split's
    configuration; the code is their one home, this test keeps the prose equal to it."""
    import re
    from pathlib import Path

    from tirx_gemm.op import chooser
    text = re.sub(r"\s+", " ", (Path(__file__).parents[1] / "README.md").read_text())
    tiles = chooser.SWAP_AB_TILES
    assert f"a token tile of {', '.join(map(str, tiles[:-1]))} or {tiles[-1]}" in text
    tiles = chooser.SWAP_SPLIT_TILES
    assert f"A K split keeps to {', '.join(map(str, tiles[:-1]))} and {tiles[-1]}" in text
    tiles = ", ".join(f"{m}x{n}" for m, n in chooser.SPLIT_TILES[:-1])
    assert f"{tiles} and {'x'.join(map(str, chooser.SPLIT_TILES[-1]))} tiles split" in text
    assert f"more than {round(chooser.SPLIT_MARGIN * 100)}% faster" in text
    assert f"decode at up to {chooser.SWAP_NP_MAX_M} tokens otherwise" in text
    assert (f"{chooser.SWAP_SPLIT_ROWS}-row tiles, an {chooser.SWAP_NP_DEPTH}-stage ring"
            in text)
    assert f"at least {chooser.SWAP_NP_MIN_TOKENS} wide" in text
    assert (f"past decode, {chooser.SWAP_AB_TILES[-1] + 1} to {chooser.WIDE_SWAP_MAX_M} "
            f"tokens") in text
    assert f"ring holds fewer than {chooser.WIDE_SWAP_MIN_STAGES} stages" in text
    assert f"each a multiple of {chooser.WIDE_SWAP_STEP}" in text
    # the rules this stop added: v9's handicap and v10's margin (both checked by
    # test_v9_handicap_is_the_only_preference_v9_has), the 128-byte row rule for pairs, the
    # count of measured candidates
    assert f"whole {chooser.ROW_ALIGN_BYTES}-byte lines" in text
    # v9 and v10 are not v12 entries
    assert f"{len(chooser.params()) - 2} entries measured" in text
    assert f"predicted at most {chooser.PDL_MAX_US:.0f} µs, `chooser.PDL_MAX_US`" in text
    assert (f"K ≤ {chooser.PINGPONG_MAX_K} and at least as many "
            f"{chooser.V10_TILE[0]}x{chooser.V10_TILE[1]} tiles as SMs") in text
    # v10's band: where the model ranks it
    assert (f"K past {chooser.PINGPONG_MAX_K} up to {chooser.PINGPONG_BAND_MAX_K} and at "
            f"least as many {chooser.V10_TILE[0]}x{chooser.V10_TILE[1]} tiles as SMs") in text
    # the data-parallel swap-AB rule: where it applies, its margin, its blocks
    assert f"past {chooser.DP_SWAP_MIN_M} tokens (`chooser.DP_SWAP_MIN_M`" in text
    assert (f"more than {round(chooser.DP_SWAP_MARGIN * 100)}% faster than the best plain "
            f"candidate (`chooser.DP_SWAP_MARGIN`)") in text
    assert (f"Token tiles are multiples of {chooser.DP_SWAP_TOKEN_STEP} and M counts in "
            f"{chooser.DP_SWAP_TOKEN_STEP}-row blocks") in text
    assert (f"every {chooser.DP_SWAP_TOKEN_STEP} rows past {chooser.DP_SWAP_MIN_M}") in text
    # the v12 lesson states the same rule
    lesson = re.sub(r"\s+", " ", (Path(__file__).parents[1] / "steps" / "lessons" /
                                  "v12.md").read_text())
    assert (f"takes it past {chooser.DP_SWAP_MIN_M} tokens (first past {chooser.WIDE_SWAP_MAX_M} "
            f"only) where the model predicts the "
            f"swapped problem more than {round(chooser.DP_SWAP_MARGIN * 100)}% faster") in lesson
    assert f"needs `BLK_N` a multiple of {chooser.DP_SWAP_TOKEN_STEP}" in lesson


# --- sm_100a v12: the menu on v7's kernel (NumSim checks its cases: `tirx-gemm sim v12`) ---
def test_sm100a_menu_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_100a")
    for bad in (8, 0, 100, 272, True):
        with pytest.raises(ValueError, match=f"BLK_N={bad!r} must be a multiple of 16"):
            step.build_primfunc(128, 256, 128, BLK_N=bad)
    with pytest.raises(ValueError, match="PIPE_DEPTH=5 needs"):
        step.build_primfunc(128, 256, 128, BLK_N=256, PIPE_DEPTH=5)


def test_sm100a_default_ring_is_as_deep_as_fits():
    pytest.importorskip("tvm")
    from steps.sm100a.hgemm_v12 import default_pipe_depth
    from tirx_gemm import helpers as H
    for blk_n, depth in ((16, 11), (128, 6), (176, 5), (256, 4)):
        assert default_pipe_depth(blk_n) == depth
        H.check_pipe_depth(depth, (128 + blk_n) * 128, 128 * 128)  # it fits, one more not
        with pytest.raises(ValueError):
            H.check_pipe_depth(depth + 1, (128 + blk_n) * 128, 128 * 128)


@pytest.mark.parametrize("blk_n,chunks,tails", [(256, 4, 0), (80, 1, 1), (176, 2, 3),
                                                (48, 0, 3)])
def test_sm100a_epilogue_chunks_by_tma_and_tail_16_columns_a_load(blk_n, chunks, tails):
    pytest.importorskip("tvm")
    text = registry.get("v12", "sm_100a").build_primfunc(
        300, 1000, 128, BLK_N=blk_n, RUNTIME_M=blk_n == 48).script()
    lines = [ln.strip() for ln in text.splitlines()]
    # 64-column chunks: tcgen05.ld of 64 columns, then a TMA store of the staged chunk;
    # the tail: 16 columns per tcgen05.ld (no 48-wide load), stored row by row, guarded
    # (a loop of 0 trips is in the script and compiles to nothing)
    assert f"for i in T.unroll({chunks}):" in lines
    assert any(ln.startswith("T.tile.copy_async(D[") for ln in lines)
    assert f"for t in T.unroll({tails}):" in lines
    assert 'Dtail = T.alloc_local((16,), "float16")' in lines
    assert any(ln.startswith("T.tile.copy(D[") for ln in lines)


def test_sm100a_swap_ab_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_100a")
    with pytest.raises(ValueError, match="SWAP_AB='yes' must be True or False"):
        step.build_primfunc(8, 256, 128, BLK_N=16, SWAP_AB="yes")
    # tcgen05.mma at M = 128 has no 8-column N: the token tile starts at 16
    with pytest.raises(ValueError, match="BLK_N=8 must be a multiple of 16"):
        step.build_primfunc(8, 256, 128, BLK_N=8, SWAP_AB=True)


@pytest.mark.parametrize("blk_n,reads", [(16, 1), (48, 3), (64, 1), (96, 3), (256, 4)])
def test_sm100a_swap_ab_loads_swapped_and_stores_transposed(blk_n, reads):
    """SWAP_AB: B's rows go to the MMA's A tile and A's rows to its B tile; the epilogue
    reads BLK_N columns 16, 32 or 64 at a time and stores D[token, n] element by element,
    guarded (no staging tile, no TMA store)."""
    pytest.importorskip("tvm")
    text = registry.get("v12", "sm_100a").build_primfunc(
        5, 1000, 128, BLK_N=blk_n, SWAP_AB=True, RUNTIME_M=blk_n == 48).script()
    lines = [ln.strip() for ln in text.splitlines()]
    assert any(ln.startswith("T.tile.copy_async(Asmem") and ", B[" in ln for ln in lines)
    assert any(ln.startswith("T.tile.copy_async(Bsmem") and ", A[" in ln for ln in lines)
    assert f"for c in T.unroll({reads}):" in lines
    assert not any(ln.startswith("T.tile.copy_async(D[") for ln in lines)
    assert "Dsmem" not in text


def test_sm100a_stream_k_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_100a")
    with pytest.raises(ValueError, match="STREAM_K=1 must be True or False"):
        step.build_primfunc(128, 256, 1024, BLK_N=32, STREAM_K=1)
    with pytest.raises(ValueError, match="STREAM_K=True takes no SWAP_AB"):
        step.build_primfunc(8, 256, 1024, BLK_N=16, SWAP_AB=True, STREAM_K=True)


def test_sm100a_stream_k_where_the_plan_is_on_and_off():
    """STREAM_K: the workspace operands (registry.Step.workspace, streamk's specs) follow
    D either way; the pieces' count and reduction appear only where the plan is on: a tail
    wave under half full (11 tiles on 8 CTAs), or RUNTIME_M (decided on the device); at half
    (12 on 8) the body is v12's walk."""
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_100a")
    for mnk, kw, on in (((128, 352, 1256), {}, True), ((128, 384, 1256), {}, False),
                        ((300, 136, 1032), {"RUNTIME_M": True}, True)):
        kw = dict(kw, SM_COUNT=8, BLK_N=32, STREAM_K=True)
        func = step.build_primfunc(*mnk, **kw)
        specs = step.workspace_specs(*mnk, kw)
        assert [(n, tuple(shape), dt) for n, shape, dt in specs] == [
            ("WS", (12, 128 * 32), "float32"), ("CNT", (8,), "int32")]
        assert [p.name for p in func.params][-2:] == ["WS", "CNT"]
        text = func.script()
        assert ("T.ptx.atom(old, T.address_of(CNT[" in text) == on, (mnk, kw)
        plain = step.build_primfunc(*mnk, **dict(kw, STREAM_K=False)).script()
        assert "T.ptx.atom" not in plain and "WS" not in plain


def test_chooser_pingpong_rule():
    """v10 takes plain GEMMs with a short K whose 128x128 tiles give every SM one (the
    hidden epilogue the fitted model cannot see); mid squares, deep K and few tiles stay
    off it, and its fitted figures are a candidate of the model."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    assert mm.choose(4096, 4096, 512, "bfloat16", "sm_90a", 132) == (
        "v10", {"dtype": "bfloat16", "SM_COUNT": 132, "RUNTIME_M": True})
    assert chooser.wants_pingpong(4096, 4096, 512)
    # short enough for PDL, which saves more than the ping-pong there: v12 with PDL
    assert not chooser.wants_pingpong(2048, 2048, 256)
    step, kw = mm.choose(2048, 2048, 256, "float16", "sm_90a", 132)
    assert step == "v12" and kw["PDL"] is True
    assert mm.choose(512, 512, 512, "bfloat16", "sm_90a", 132)[0] != "v10"      # 16 tiles
    # past 512 the rule is off: v10 is the model's candidate in its band (below)
    assert not chooser.wants_pingpong(4096, 4096, 1024)
    assert chooser.rank(4096, 1024, 512)[0][0] <= chooser.PDL_MAX_US
    assert not chooser.wants_pingpong(4096, 1024, 512)        # short: v12 with PDL
    assert not chooser.wants_pingpong(4096, 1024, 512, 264)   # 256 tiles on 264 SMs
    assert chooser.wants_pingpong(4096, 4096 + 128, 512)
    assert chooser.V10 in chooser.params() and chooser.clustered(chooser.V10)


def test_v10_is_the_models_candidate_in_its_band_in_v9s_place():
    """Past the short-K rule, v10 is ranked by the model where K is at most
    PINGPONG_BAND_MAX_K and its 128x128 tiles are at least as many as the SMs, and v9 is
    not ranked there; outside the band it is the other way round. Its figures are fitted
    to its measurements in the band only."""
    import json
    from pathlib import Path
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    top = chooser.PINGPONG_BAND_MAX_K
    assert chooser.PINGPONG_MAX_K < top
    ranked = lambda *s: {c for _, c in chooser.rank(*s)}  # noqa: E731
    for shape in ((8192, 2304, 768), (4096, 4096, top), (4096, 4096, chooser.PINGPONG_MAX_K + 8)):
        assert chooser.pingpong_band(*shape)
        assert chooser.V10 in ranked(*shape) and chooser.V9 not in ranked(*shape)
    for shape in ((4096, 4096, top + 8), (4096, 4096, 4096), (4096, 4096, chooser.PINGPONG_MAX_K),
                  (1024, 2048, 1024)):  # past the band, deep, the rule's K, 128 tiles
        assert not chooser.pingpong_band(*shape)
        assert chooser.V10 not in ranked(*shape) and chooser.V9 in ranked(*shape)
    assert chooser.pingpong_band(1024, 2048, 1024, 128)  # 128 tiles on 128 SMs
    # matmul follows the ranking there (measured: results/lab/v12_shortk_h200.jsonl)
    assert mm.choose(8192, 2304, 768, "bfloat16", "sm_90a", 132)[0] == "v10"
    assert mm.choose(4096, 4096, top + 64, "bfloat16", "sm_90a", 132)[0] != "v10"
    # the fit reads v10's times in the band only: a refit from the records gives its figures
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "fit_chooser", Path(__file__).parents[1] / "scripts" / "fit_chooser.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    samples, _ = fit.load()
    v10 = [s for s in samples if s[0] == chooser.V10]
    inside = [s for s in v10 if chooser.pingpong_band(*s[1:4])]
    assert 15 <= len(inside) < len(v10)
    assert fit.fit(inside)[chooser.V10] == fit.fit(v10)[chooser.V10] == \
        json.loads(chooser.PARAMS_FILE.read_text())["candidates"][chooser.V10]
    # with a fused epilogue matmul's v10 rule stays chooser.epilogue_step's (EPILOGUE_STEP)
    assert mm.choose(4096, 4096, 512, "bfloat16", "sm_90a", 132,
                     epilogue={"BIAS": "float16"})[0] == "v12"


def test_v12_pdl_launch_and_wait():
    """PDL=True (tirx_gemm/pdl.py): the launch attribute TVM's CUDA runtime reads, and every
    thread's griddepcontrol.wait before the scheduler touches anything global, then
    launch_dependents; PDL=False adds neither; a non-bool PDL is refused in one line."""
    pytest.importorskip("tvm")
    from tirx_gemm import pdl
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    on = hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, RUNTIME_M=True, PDL=True)
    off = hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, RUNTIME_M=True)
    assert pdl.PDL_TAG in list(on.attrs["tirx.kernel_launch_params"])
    assert "tirx.kernel_launch_params" not in off.attrs
    lines = on.script().splitlines()
    wait = next(i for i, x in enumerate(lines) if 'griddepcontrol("wait"' in x)
    launch = next(i for i, x in enumerate(lines) if 'griddepcontrol("launch_dependents"' in x)
    first_tma = next(i for i, x in enumerate(lines) if "copy_async(" in x and "A[" in x)
    assert wait < launch < first_tma
    assert "griddepcontrol" not in off.script()
    with pytest.raises(ValueError, match="True or False") as e:
        hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, PDL=1)
    assert "\n" not in str(e.value)
    # PDL_TRIGGER="exit" (a lab option): the same wait, no launch_dependents (the next grid
    # launches as this one's CTAs exit); refused without PDL and for any other value
    at_exit = hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, RUNTIME_M=True, PDL=True,
                        PDL_TRIGGER="exit").script()
    assert 'griddepcontrol("wait"' in at_exit and "launch_dependents" not in at_exit
    for bad in ({"PDL_TRIGGER": "exit"}, {"PDL": True, "PDL_TRIGGER": "end"}):
        with pytest.raises(ValueError, match="PDL_TRIGGER") as e:
            hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, **bad)
        assert "\n" not in str(e.value)


def test_pdl_with_a_cluster_only_where_the_builder_opts_in():
    """pdl.check refuses PDL with a cluster in one line unless the builder says its pairs
    wait after their cluster set-up (v12 does, for CLUSTER=2 only); v12's pair with PDL
    carries the pair's launch params (TVM keeps the clusterCtaIdx tags beside PDL's)."""
    pytest.importorskip("tvm")
    from tirx_gemm import pdl
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    for kw in ({}, {"pairs": False}):
        with pytest.raises(ValueError, match="CLUSTER=2") as e:
            pdl.check(True, 2, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="CLUSTER=4"):
        pdl.check(True, 4)
    with pytest.raises(ValueError, match="CLUSTER=8"):
        pdl.check(True, 8, pairs=True)
    pdl.check(True, 2, pairs=True)
    pdl.check(True, 4, pairs=True)
    pdl.check(False, 2)
    pair = hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, CLUSTER=2, SM_COUNT=132, PDL=True)
    assert list(pair.attrs["tirx.kernel_launch_params"]) == list(pdl.PAIR_LAUNCH_PARAMS)
    lines = pair.script().splitlines()
    sync = next(i for i, x in enumerate(lines) if "cluster_sync" in x)
    wait = next(i for i, x in enumerate(lines) if 'griddepcontrol("wait"' in x)
    first_tma = next(i for i, x in enumerate(lines) if "copy_async(" in x and "A[" in x)
    assert sync < wait < first_tma
    assert "tirx.kernel_launch_params" not in hgemm_v12(
        128, 256, 256, BLK_M=64, BLK_N=128, CLUSTER=2, SM_COUNT=132).attrs


def test_v12_pair_with_pdl_builds_with_cluster_and_pdl_launch_tags():
    """The launch tags the exported library stores, which TVM 0.27's CUDA runtime reads: a
    pair with PDL lists clusterCtaIdx.x/.y (cluster dimension at launch) AND the PDL tag
    (its cuLaunchKernelEx sets both attributes); a pair without PDL only the cluster tags;
    a one-CTA PDL kernel only the PDL tag. No compile-time __cluster_dims__ in any: the
    cluster comes from the launch. Compiled on the CPU (the session's build cache)."""
    from tirx_gemm import pdl
    from tirx_gemm.compile.api import build_many
    v12 = registry.get("v12", "sm_90a")
    common = {"dtype": "bfloat16", "RUNTIME_M": True, "RUNTIME_NK": True, "SM_COUNT": 132}
    pair = {**common, "BLK_M": 64, "BLK_N": 128, "CLUSTER": 2}
    reqs = [(v12, (1000, 1000, 1000), {**pair, "PDL": True}),
            (v12, (1000, 1000, 1000), pair),
            (v12, (1000, 1000, 1000), {**common, "BLK_M": 64, "BLK_N": 64, "PDL": True})]
    built = build_many(reqs)
    for res in built:
        assert not isinstance(res, Exception), res
    cluster_tags = (b"clusterCtaIdx.x", b"clusterCtaIdx.y")
    pdl_tag = pdl.PDL_TAG.encode()
    expect = [(True, True), (True, False), (False, True)]  # (cluster tags, PDL tag)
    for res, (cluster, with_pdl) in zip(built, expect):
        lib = res.lib_path.read_bytes()
        assert all((t in lib) == cluster for t in cluster_tags), res.kwargs
        assert (pdl_tag in lib) == with_pdl, res.kwargs
        assert "__cluster_dims__" not in res.cuda_source
        assert ("griddepcontrol.wait" in res.cuda_source) == with_pdl
    src = built[0].cuda_source  # the pair waits after publishing its barrier inits
    body = src[src.index("kernel_kernel(", src.index("__global__")):]
    assert body.index("cluster_sync();") < body.index("griddepcontrol_wait();")


def test_chooser_pdl_rule():
    """PDL=True goes to a v12 kernel (one CTA or a pair) the model predicts under
    PDL_MAX_US, with the fitted saving taken off its prediction; never to v9, v10 or a fused
    epilogue."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    assert 0.3 < chooser.pdl_saving() < 1.5  # fitted: the median saving, microseconds
    step, kw = mm.choose(512, 512, 512, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["PDL"] is True
    pick = chooser.best(512, 512, 512)
    assert chooser.uses_pdl(pick, 512, 512, 512)
    assert chooser.predict(pick, 512, 512, 512) == pytest.approx(
        chooser.predict(pick, 512, 512, 512, pdl=False) - chooser.pdl_saving())
    # a long one-CTA tile: no start trigger by this rule; PDL_EXIT_NOTE's exit trigger
    step, kw = mm.choose(8192, 8192, 8192, "bfloat16", "sm_90a", 132)
    assert step == "v12" and not chooser.uses_pdl(chooser.best(8192, 8192, 8192), 8192, 8192,
                                                     8192)
    assert (kw["PDL"], kw["PDL_TRIGGER"]) == (True, "exit")
    step, kw = mm.choose(4096, 4096, 512, "bfloat16", "sm_90a", 132)  # v10's short-K rule
    assert step == "v10" and "PDL" not in kw
    step, kw = mm.choose(1000, 1000, 1000, "bfloat16", "sm_90a", 132)  # a short pair
    assert step == "v12" and kw["CLUSTER"] == 2 and kw["PDL"] is True
    assert chooser.uses_pdl("64x128c2", 1000, 1000, 1000)
    assert not chooser.uses_pdl("128x256c2", 4095, 4096, 4104)  # a long pair: predicted past
    assert "PDL" not in mm.choose(512, 512, 512, "bfloat16", "sm_90a", 132,
                                  epilogue={"BIAS": "float16"})[1]
    assert not chooser.uses_pdl(chooser.V9, 512, 512, 512)


def test_v12_epi_spread_stores_one_piece_per_k_step():
    """EPI_SPREAD=True: the previous tile's writeback leaves the K loop one piece per step
    (piece c, a 64-column TMA chunk or the guarded tail, at step EPI_AT + c), and a unit
    of fewer K steps than pieces stores the rest after its loop; off, all pieces at once at
    step EPI_AT (the plain kernel's text)."""
    pytest.importorskip("tvm")
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    on = hgemm_v12(256, 352, 512, BLK_M=128, BLK_N=176, EPI_SPREAD=True).script()
    off = hgemm_v12(256, 352, 512, BLK_M=128, BLK_N=176).script()
    # 176 columns: chunks 0 and 1 by TMA (piece c at k == 1 + c), the 48-column tail at k == 3
    assert "if k - 1 <= c and c < k - 1 + 1:" in on
    assert "if k - 1 <= 2 and 2 < k - 1 + 1:" in on
    assert "if k == 3:" in on and "if k == 1:" in off
    assert "k - 1 <=" not in off
    for bad, why in (({"EPI_SPREAD": 1}, "EPI_SPREAD=1 must be True or False"),
                     ({"PREFETCH_MAPS": "yes"}, "PREFETCH_MAPS='yes' must be True or False"),
                     ({"PREFETCH_MAPS": True, "CLUSTER": 2, "SM_COUNT": 132}, "PREFETCH_MAPS")):
        with pytest.raises(ValueError, match=why) as e:
            hgemm_v12(256, 352, 512, BLK_M=128, BLK_N=176, **bad)
        assert "\n" not in str(e.value)


def test_v12_prefetch_maps_adds_the_descriptor_prefetch():
    """PREFETCH_MAPS=True: TVM's prefetch.tensormap of A's and B's descriptors at entry."""
    pytest.importorskip("tvm")
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    kw = dict(BLK_M=64, BLK_N=128, RUNTIME_M=True)
    for flag in (True, False):
        text = hgemm_v12(128, 256, 256, PREFETCH_MAPS=flag, **kw).script()
        loads = [ln for ln in text.splitlines() if "copy_async(Asmem" in ln
                 or "copy_async(Bsmem" in ln]
        assert len(loads) == 2
        assert all(("prefetch_tensormap=True" in ln) == flag for ln in loads), loads


def test_matmul_prefetches_descriptors_on_one_cta_kernels_only():
    """matmul builds every one-CTA v12 kernel with PREFETCH_MAPS=True (measured on the H200:
    results/lab/v12_prefetch_h200.jsonl), its CTA pairs without (the builder refuses both)."""
    from tirx_gemm.op import choice as mc
    seen = set()
    for mnk in ((1, 4096, 4096), (77, 7168, 2048), (128, 256, 32768), (1024, 1024, 1024),
                (2304, 2304, 2304), (1000, 1000, 1000)):
        step, kw = mc.choose(*mnk, "bfloat16", "sm_90a", 132)
        if step != "v12":
            continue
        pair = kw.get("CLUSTER") == 2
        seen.add(pair)
        assert kw.get("PREFETCH_MAPS", False) is (not pair), (mnk, kw)
    assert seen == {True, False}  # both kinds were picked above


def test_graph_timing_figures_in_the_docs_match_the_harness():
    """The interleaved CUDA-graph timing's warm-up and rounds (v12_sweep's constants) as
    README and matmul_graph_times.py's docstring state them."""
    import importlib.util
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("v12_sweep", root / "scripts/lab/v12_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    words = {5: "five", 7: "seven", 9: "nine"}
    readme = re.sub(r"\s+", " ", (root / "README.md").read_text())
    assert (f"warms both graphs up for {sweep.GRAPH_WARM_MS:g} ms and then replays them "
            f"alternately, {words[sweep.GRAPH_ROUNDS]} times each") in readme
    doc = re.sub(r"\s+", " ", (root / "scripts/lab/matmul_graph_times.py").read_text())
    assert (f"replays both graphs for at least {sweep.GRAPH_WARM_MS:g} ms, then each "
            f"{sweep.GRAPH_ROUNDS} times in alternating order") in doc


def test_swap_tma_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="SWAP_TMA=True stores a swap-AB tile"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=144, SWAP_TMA=True)
    with pytest.raises(ValueError, match="SWAP_TMA=True stores a swap-AB tile"):
        step.build_primfunc(8, 256, 4096, BLK_M=64, BLK_N=8, SWAP_AB=True, SWAP_TMA=True,
                            SPLIT_K=2)
    with pytest.raises(ValueError, match="SWAP_TMA=1 must be True or False"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=144, SWAP_AB=True, SWAP_TMA=1)


@pytest.mark.parametrize("blk_n", [144, 48, 128])
def test_swap_tma_stores_the_transpose_by_stmatrix_trans_and_tma(blk_n):
    """SWAP_TMA: the packed fragment goes to SMEM by stmatrix .trans and out by one TMA
    store per 64 tokens and one for the rest, D's rows (the tokens) at the tile's columns
    (its 64 weight rows); without it, no stmatrix and no TMA store of D."""
    pytest.importorskip("tvm")
    import re

    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    kw = dict(BLK_M=128, BLK_N=blk_n, SWAP_AB=True, RUNTIME_M=True, RUNTIME_NK=True)
    text = hgemm_v12(256, 768, 512, SWAP_TMA=True, **kw).script()
    plain = hgemm_v12(256, 768, 512, **kw).script()
    st = [ln for ln in text.splitlines() if "T.ptx.stmatrix(" in ln]
    assert st and all('"x4", "trans"' in ln for ln in st)
    boxes = re.findall(r"copy_async\(D\[prev_n[^:]*:prev_n [^,]*?\+ (\d+), "
                       r"prev_m \+ wg_id \* 64:prev_m \+ wg_id \* 64 \+ 64\]", text)
    # 64-token boxes (a loop over the full chunks, empty below 64) and the rest's one box
    assert set(map(int, boxes)) == {64} | ({blk_n % 64} if blk_n % 64 else set()), boxes
    assert "T.ptx.stmatrix(" not in plain and "copy_async(D[" not in plain
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="BLK_N a multiple of 16"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=136, SWAP_AB=True, SWAP_TMA=True)


def test_tail_tma_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    for kw in (dict(BLK_N=128), dict(BLK_N=144, SWAP_AB=True), dict(BLK_N=144, STREAM_K=True),
               dict(BLK_N=144, EPI_SPREAD=True), dict(BLK_N=144, OUT_DTYPE="float32"),
               dict(BLK_N=144, BIAS="float32"), dict(BLK_N=144, CLUSTER=2)):
        with pytest.raises(ValueError, match="TAIL_TMA=True stores a plain tile's last"):
            step.build_primfunc(200, 768, 512, BLK_M=128, TAIL_TMA=True, **kw)
    with pytest.raises(ValueError, match="TAIL_TMA=1 must be True or False"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=144, TAIL_TMA=1)


@pytest.mark.parametrize("bm,bn", [(128, 168), (64, 96), (128, 240), (64, 224)])
def test_tail_tma_stores_the_tail_by_one_box_of_its_width(bm, bn):
    """TAIL_TMA: the last bn % 64 columns go by stmatrix (an x4 per 16 columns, an x2 for
    an odd 8) into a staging tile of their width and out in one TMA box of that width
    beside the 64-column chunks' boxes; without it, no box narrower than 64 (guarded
    element stores). The ring is as deep as chooser.ring_depth says, with and without:
    where a tail tile of its own would cost a stage (128x168, 64x224) the tail tile lies
    over each warpgroup's staging tile of the last chunk instead."""
    pytest.importorskip("tvm")
    import re

    from tirx_gemm.op import chooser
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    kw = dict(BLK_M=bm, BLK_N=bn, RUNTIME_M=True, RUNTIME_NK=True)
    texts = {tt: hgemm_v12(256, 768, 512, TAIL_TMA=tt, **kw).script() for tt in (False, True)}
    tail = bn % 64
    for tt, text in texts.items():
        widths = {int(w) for w in re.findall(r"copy_async\(D\[prev_m[^,]*, prev_n \+ \d+:prev_n "
                                             r"\+ \d+ \+ (\d+)\]", text)}
        assert widths == ({tail} if tt else set()), (tt, widths)
        depth = re.search(r"\((\d+), %d, 64\)" % bm, text).group(1)
        assert int(depth) == chooser.ring_depth(bm, bn, tt)
    x2 = [ln for ln in texts[True].splitlines() if "T.ptx.stmatrix(" in ln and '"x2"' in ln]
    assert bool(x2) == bool(tail // 8 % 2)
    # the staging buffers: the chunks' (consumers, bufs, 64, 64), one (64, tail) per consumer
    decls = re.findall(r"decl_buffer\(\(([\d, ]+)\), \"float16\", data=pool_buf.data, "
                       r"(?:strides=[^,]*, )?elem_offset=(\d+)", texts[True])
    stage = [(tuple(map(int, d.split(","))), int(o)) for d, o in decls if d.endswith("64, 64")]
    tails = sorted(int(o) for d, o in decls if d.replace(" ", "") == f"64,{tail}")
    (consumers, bufs, _, _), at = stage[-1]
    assert consumers == bm // 64 and len(tails) == consumers
    over = [at + (c * bufs + (bn // 64 - 1) % bufs) * 4096 for c in range(consumers)]
    shared = chooser.staging_bytes(bm, bn, True) == chooser.staging_bytes(bm, bn)
    assert (tails == over) == shared, (tails, over)
    # the tail's wait: a shared tile waits for every store before it (the last chunk's), a
    # tile of its own only for the previous tail's (the chunks' stores since may pend)
    waits = {tt: {int(n) for n in re.findall(r'T\.ptx\.cp\((\d+), "async", "bulk", '
                                            r'"wait_group", "read"', text)}
             for tt, text in texts.items()}
    since = 0 if shared else bn // 64
    assert since in waits[True] and waits[True] - waits[False] <= {since}, waits
    assert shared == ((bm, bn) in ((128, 168), (64, 224)))


def test_chooser_tail_tma_rule():
    """matmul asks for TAIL_TMA on a one-CTA tile wider than 64 whose tail's staging tile
    leaves the ring as deep (chooser.tail_tma); never on pairs, swap-AB or splits."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    assert chooser.tail_tma(128, 240) and chooser.tail_tma(64, 96)
    assert chooser.tail_tma(128, 168) and chooser.tail_tma(128, 176)
    # a shared tail over the only staging tile of an odd chunk count: measured level or
    # behind (results/lab/v12_tailshare_h200.jsonl), so element stores
    assert not chooser.tail_tma(64, 224) and not chooser.tail_tma(128, 208)
    assert not chooser.tail_tma(128, 256) and not chooser.tail_tma(64, 48)
    # 128x168: 5 stages with element stores; a 40-column tail tile of its own per
    # warpgroup would leave 4, so it lies over the last chunk's staging tile: 5
    assert chooser.ring_depth(128, 168) == chooser.ring_depth(128, 168, True) == 5
    assert chooser.staging_bytes(128, 168, True) == chooser.staging_bytes(128, 168)
    assert chooser.staging_bytes(128, 240, True) == chooser.staging_bytes(128, 240) + 2 * 64 * 48 * 2
    step, kw = mm.choose(2049, 3584, 3584, "bfloat16", "sm_90a", 132)
    assert step == "v12" and (kw["BLK_M"], kw["BLK_N"]) == (128, 240) and kw["TAIL_TMA"]
    step, kw = mm.choose(2304, 2304, 2304, "bfloat16", "sm_90a", 132)
    assert (kw["BLK_M"], kw["BLK_N"]) == (128, 168) and kw["TAIL_TMA"]
    for mnk in ((1, 4096, 4096), (1000, 1000, 1000), (6000, 768, 768), (128, 256, 32768)):
        assert "TAIL_TMA" not in mm.choose(*mnk, "bfloat16", "sm_90a", 132)[1], mnk
    # the builder's constants, as the chooser has them
    pytest.importorskip("tvm")
    from tirx_gemm import hopper as W
    from tirx_gemm.steps.sm90a import hgemm_v12 as v12
    assert (chooser.RING_DEPTH_MAX, chooser.EPI_COLS) == (v12.AUTO_DEPTH_MAX, W.EPI_COLS)


def test_chooser_dp_swap_rule():
    """Many tokens on a narrow weight: swap-AB with SWAP_TMA where the model predicts the
    swapped problem more than DP_SWAP_MARGIN faster; never at decode widths or a misaligned
    K; M counts in 16-row blocks (the token tiles' step), so variants serve every M with
    choose's pick."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    assert chooser.dp_swap_tile(6000, 768, 768) == (128, 144)
    # 3152 = 22 x 143.3: 6 x 22 = 132 swapped tiles; counted in 64-row blocks (3200) the
    # same tile would take 23 token tiles, two waves
    assert chooser.dp_swap_rows(3152) == 3152 and chooser.dp_swap_rows(3153) == 3168
    assert chooser.dp_swap_tile(3152, 768, 768) == (128, 144)
    assert chooser.dp_swap_tile(96, 768, 768) is None
    assert chooser.dp_swap_tile(6000, 768, 1000) is None  # 2000-byte rows: the pair rule's
    assert chooser.dp_swap_tile(4096, 4096, 4096) is None
    step, kw = mm.choose(6000, 768, 768, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["SWAP_AB"] and kw["SWAP_TMA"]
    assert (kw["BLK_M"], kw["BLK_N"]) == (128, 144) and kw["RUNTIME_M"]
    # the decode swap-AB kernels keep their element stores
    for mnk in ((1, 4096, 4096), (8, 14336, 4096), (77, 7168, 2048)):
        assert "SWAP_TMA" not in mm.choose(*mnk, "bfloat16", "sm_90a", 132)[1]
    vs = mm.variants(768, 768, "bfloat16", "sm_90a", 132, max_m=3400)
    assert any(kw.get("SWAP_TMA") for _, kw, _, _ in vs)
    for step_id, kw, lo, hi in vs:
        for M in range(lo, hi + 1):
            assert mm.choose(M, 768, 768, "bfloat16", "sm_90a", 132) == (step_id, kw), M


def test_dp_swap_rule_past_128_tokens():
    """The data-parallel swap-AB rule applies past DP_SWAP_MIN_M (128) tokens: where the
    model rates the swapped problem more than 5% faster at a few hundred tokens, matmul runs
    the swapped tile with SWAP_TMA, and variants serves every M of its 16-row blocks."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    assert chooser.DP_SWAP_MIN_M == 128
    assert chooser.dp_swap_tile(300, 8192, 8192) == (128, 160)
    assert chooser.dp_swap_tile(129, 15360, 5120) == (128, 144)
    assert chooser.dp_swap_tile(128, 15360, 5120) is None
    step, kw = mm.choose(300, 8192, 8192, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["SWAP_AB"] and kw["SWAP_TMA"] and kw["BLK_N"] == 160
    vs = mm.variants(15360, 5120, "bfloat16", "sm_90a", 132, max_m=640)
    assert any(kw.get("SWAP_TMA") and lo <= 200 for _, kw, lo, _ in vs)
    for step_id, kw, lo, hi in vs:
        for M in range(lo, hi + 1):
            assert mm.choose(M, 15360, 5120, "bfloat16", "sm_90a", 132) == (step_id, kw), M


def test_readme_counts_for_the_tail_and_swap_rules_are_the_records():
    """README's counts for TAIL_TMA and the swap-AB rule past 128 tokens are what the checks
    through matmul recorded and what chooser.tail_tma leaves out."""
    import collections
    import json
    import re
    from pathlib import Path
    from tirx_gemm.op import chooser
    root = Path(__file__).parents[1]
    text = re.sub(r"\s+", " ", re.sub(r"<!--.*?-->", "", (root / "README.md").read_text()))

    def shapes(name, **match):
        out = collections.defaultdict(lambda: collections.defaultdict(list))
        for line in (root / "results" / "lab" / name).read_text().splitlines():
            r = json.loads(line)
            if all(r.get(k) == v for k, v in match.items()):
                out[(r["M"], r["N"], r["K"])][r["chooser"]].append(r["ratio"])
        return out
    own = shapes("matmul_graph_h200_tailtma.jsonl")
    shared = shapes("matmul_graph_h200_tailshare.jsonl")
    kept = shapes("matmul_graph_h200_tailshare.jsonl", final_rule="tma")
    low = shapes("matmul_graph_h200_dpswaplow.jsonl")
    # ahead: every new pass above every old one by at least 0.01 (the README's precision);
    # level: closer than that
    ahead = sum(min(v["new"]) >= max(v["old"]) + 0.01 for v in low.values())
    assert f"26 shapes whose kernel it changes" in text and len(own) == 26
    assert f"Shared tails, {len(shared)} shapes whose tile takes one" in text
    assert (f"at the {len(kept)} whose tile the rule keeps it on" in text
            and f"at the {len(shared) - len(kept)} whose odd-chunk tile" in text)
    words = {0: "none", 1: "one", 2: "two", 3: "three"}
    assert f"Through matmul at {len(low)} of them" in text
    assert f"ahead at {ahead} shapes, level at {words[len(low) - ahead]}" in text
    left = [(bm, bn) for bm in (64, 128) for bn in range(72, 256, 8)
            if bn % 64 and not chooser.tail_tma(bm, bn)]
    assert left == [(64, 224), (128, 80), (128, 104), (128, 112), (128, 208)]
    assert "it leaves 64x224 and 128x80, 104, 112 and 208 with element stores" in text


def test_readme_counts_for_v10s_band_are_the_records():
    """The counts README's v10-band bullet states are what the sweeps and the check through
    matmul recorded, and the v10 lesson states the band's edges as chooser has them."""
    import collections
    import json
    import re
    from pathlib import Path
    from tirx_gemm.op import chooser
    root = Path(__file__).parents[1]
    lab = root / "results" / "lab"
    text = re.sub(r"<!--.*?-->", "", (root / "README.md").read_text())
    text = re.sub(r"\s+", " ", text)
    sweeps = [json.loads(x) for f in ("v12_shortk_h200.jsonl", "v12_midk_h200.jsonl")
              for x in (lab / f).read_text().splitlines()]
    ratios = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in sweeps:
        if r["dtype"] == "bfloat16":
            for name, c in r["candidates"].items():
                ratios[(r["M"], r["N"], r["K"])][name].append(c["ratio"])
    first = sum(max(c, key=lambda n: sum(c[n])) == chooser.V10 for c in ratios.values())
    assert f"had v10 first at {first} of {len(ratios)} (bf16)" in text
    assert f"{len(ratios)} shapes of a thousand tokens or more" in text
    check = [json.loads(x) for x in
             (lab / "matmul_graph_h200_pingband.jsonl").read_text().splitlines()]
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in check:
        runs[(r["M"], r["N"], r["K"])][r["chooser"]].append(r["ratio"])
    ahead = sum(min(v["new"]) > max(v["old"]) for v in runs.values())
    behind = sum(max(v["new"]) < min(v["old"]) for v in runs.values())
    fresh = sum(s not in ratios for s in runs)
    assert (f"{len(runs)} shapes where the band changes the pick or could, {fresh} of them "
            f"in neither sweep") in text
    assert f"ahead at {ahead} (" in text and f"behind at {'two' if behind == 2 else behind} " in text
    lesson = re.sub(r"\s+", " ", (root / "steps" / "lessons" / "v10.md").read_text())
    assert (f"for a K of at most {chooser.PINGPONG_MAX_K} by a rule (`chooser.wants_pingpong`), "
            f"and from {chooser.PINGPONG_MAX_K + 1} to {chooser.PINGPONG_BAND_MAX_K}") in lesson


def test_shift_last_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    for kw in (dict(CLUSTER=2), dict(STREAM_K=True), dict(SPLIT_K=2), dict(EPI_SPREAD=True),
               dict(BIAS="float32"), dict(OUT_DTYPE="float32")):
        with pytest.raises(ValueError, match="SHIFT_LAST=True moves a data-parallel one-CTA"):
            step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=128, SHIFT_LAST=True, **kw)
    with pytest.raises(ValueError, match="SHIFT_LAST=1 must be True or False"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=128, SHIFT_LAST=1)


@pytest.mark.parametrize("kw,width", [(dict(BLK_M=64, BLK_N=96, TAIL_TMA=True), 64),
                                      (dict(BLK_M=128, BLK_N=144), 128),
                                      (dict(BLK_M=64, BLK_N=80, SWAP_AB=True, SWAP_TMA=True), 80),
                                      (dict(BLK_M=64, BLK_N=16, SWAP_AB=True), 16)])
def test_shift_last_ends_the_last_token_tile_at_m(kw, width):
    """SHIFT_LAST: the token tile (A's rows: the MMA's rows, or with SWAP_AB its columns)
    starts at min(tile * width, max(M - width, 0)), in the producer's TMA loads and in
    the consumer's stores alike, so a last tile that would reach past M is loaded from
    rows that exist (TMA zero-fills rows past M slowly: results/lab/v12_m129_h200.jsonl)
    and stored where it was loaded from; the weight's tiles do not move."""
    pytest.importorskip("tvm")
    import re

    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    texts = {s: hgemm_v12(256, 768, 512, RUNTIME_M=True, RUNTIME_NK=True, SHIFT_LAST=s,
                          **kw).script() for s in (False, True)}
    shift = r"T\.min\((\w+) \* (\d+), T\.max\(M - (\d+), 0\)\)"
    loads = re.findall(r"A\[" + shift, texts[True])
    assert loads and {(int(a), int(b)) for _, a, b in loads} == {(width, width)}, loads
    assert not re.search(r"B\[T\.min\(", texts[True])  # the weight's rows stay
    # the consumer stores the tile where the producer loaded it from
    side = "prev_n" if kw.get("SWAP_AB") else "prev_m"
    if kw.get("SWAP_TMA") or not kw.get("SWAP_AB"):
        assert re.search(side + r" = " + shift, texts[True]), side
    else:  # element stores straight from the fragment: D's row is the shifted token
        assert re.search(r"D\[" + shift + r" \+", texts[True])
    assert "T.max(M - " not in texts[False]


def test_shift_last_with_m_fixed_at_build_folds_the_start():
    """With M fixed at build (no RUNTIME_M) the shifted start folds to a constant bound:
    200 rows in 64-row tiles start the last at 136, in the loads and the stores."""
    pytest.importorskip("tvm")
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    text = hgemm_v12(200, 768, 512, BLK_M=64, BLK_N=96, SHIFT_LAST=True).script()
    assert "A[T.min(buffer_1 * 64, 136):" in text and "prev_m = T.min(buffer_1 * 64, 136)" in text
    assert "T.min(buffer_1 * 64, 136)" not in hgemm_v12(200, 768, 512, BLK_M=64,
                                                       BLK_N=96).script()


def test_matmul_asks_for_shift_last_on_every_data_parallel_one_cta_tile():
    """matmul's v12 picks with one CTA per tile and no K split (the plain tiles, swap-AB at
    decode, swap-AB stored by TMA, SPLIT_K=1) take SHIFT_LAST; pairs, K splits, v9 and
    v10 do not have it, nor does a fused epilogue."""
    from tirx_gemm.op import choice as mc
    seen = set()
    for N, K in ((4096, 4096), (1000, 1000), (14336, 4096), (256, 32768), (3584, 3584)):
        for step, kw, lo, hi in mc.variants(N, K, "bfloat16", "sm_90a", 132, max_m=4096):
            one = (step == "v12" and kw.get("CLUSTER", 1) == 1
                   and kw.get("SPLIT_K", 1) == 1)
            assert kw.get("SHIFT_LAST", False) == one, (N, K, lo, hi, step, kw)
            seen.add((step, kw.get("CLUSTER", 1), kw.get("SPLIT_K", 1) > 1,
                      kw.get("SWAP_AB", False), one))
    assert {("v12", 1, False, False, True), ("v12", 1, False, True, True),
            ("v12", 2, False, False, False), ("v12", 1, True, True, False)} <= seen, seen
    step, kw = mc.choose(129, 4096, 4096, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["SWAP_TMA"] and kw["SHIFT_LAST"]
    for step_id in ("v12", "v10"):
        kw = mc.choose_epilogue_on(step_id, 1000, 4096, 4096, "bfloat16", "sm_90a", 132,
                                   {"BIAS": "float32"})[1]
        assert "SHIFT_LAST" not in kw, (step_id, kw)
    for mnk in ((129, 4096, 4096), (1000, 4096, 4096), (37, 14336, 4096)):
        kw = mc.choose(*mnk, "bfloat16", "sm_90a", 132, epilogue={"BIAS": "float32"})[1]
        assert "SHIFT_LAST" not in kw and kw["BIAS"] == "float32", (mnk, kw)


def test_readme_counts_for_shift_last_are_the_records():
    """README's and lesson v12's counts for SHIFT_LAST are what the sweeps and the check
    through matmul recorded: the oob sweep's ahead / level / behind pairs, every shifted
    kernel bit-identical to its twin, the oobpick twins' two-pass means within 0.02, and
    the shapes of the check where the shift moves a token tile."""
    import collections
    import json
    import re
    from pathlib import Path
    root = Path(__file__).parents[1]
    lab = root / "results" / "lab"

    def prose(path):
        return re.sub(r"\s+", " ", re.sub(r"<!--.*?-->", "", (root / path).read_text()))
    readme, lesson = prose("README.md"), prose("steps/lessons/v12.md")

    def twins(name):
        runs = collections.defaultdict(list)  # (shape, dtype, kernel) -> (shifted, twin)
        for line in (lab / name).read_text().splitlines():
            r = json.loads(line)
            for k, c in r["candidates"].items():
                if "same_bits_as" in c:
                    assert c["same_bits_as"] == [k[:-1], True], (name, r["M"], k)
                    runs[(r["M"], r["N"], r["K"], r["dtype"], k)].append(
                        (c["ratio"], r["candidates"][k[:-1]]["ratio"]))
        return runs
    oob = twins("v12_oob_h200.jsonl")
    # ahead / behind: every pass of one above every pass of the other by at least 0.01
    ahead = sum(min(s for s, _ in v) >= max(t for _, t in v) + 0.01 for v in oob.values())
    behind = sum(max(s for s, _ in v) + 0.01 <= min(t for _, t in v) for v in oob.values())
    level = len(oob) - ahead - behind
    for text in (readme, lesson):
        assert f"ahead at {ahead} of the {len(oob)} pairs" in text
        assert f"level at {level}" in text or f"level at the other {level}" in text
    assert behind == 0 and "behind at none" in readme and "behind at none" in lesson
    pick = twins("v12_oobpick_h200.jsonl")
    means = [abs(sum(s - t for s, t in v) / len(v)) for v in pick.values()]
    assert max(means) < 0.02
    for text in (readme, lesson):
        assert f"within 0.02 of its twin's at all {len(pick)} pairs" in text
    moved, shapes = set(), set()
    for line in (lab / "matmul_graph_h200_shift.jsonl").read_text().splitlines():
        r = json.loads(line)
        shapes.add((r["M"], r["N"], r["K"]))
        kw = r["kwargs"]
        tok = kw.get("BLK_N") if kw.get("SWAP_AB") else kw.get("BLK_M")
        if r["chooser"] == "new" and kw.get("SHIFT_LAST") and r["M"] > tok and r["M"] % tok:
            moved.add((r["M"], r["N"], r["K"]))
    assert f"at {len(shapes)} real-model and suite shapes of odd token counts, the shift " \
           f"moving a token tile at {len(moved)} of them" in readme
    assert f"{len(shapes)} shapes of odd token counts, the shift moving a token tile at " \
           f"{len(moved)}" in lesson


def test_this_stops_rule_figures_are_computed_from_their_records():
    """The geomeans README and matmul_choice quote for the split token tiles and the plain
    tiles built for N and K, recomputed here from the H200 records with the committed
    rules: each splitw shape's record of the package whose token tile matmul now picks
    (the one before where both ran it), and each static-N/K suite's records."""
    import json
    import math
    import re
    from pathlib import Path

    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    root = Path(__file__).parents[1]
    lab = root / "results" / "lab"

    def rows(name):
        return [json.loads(x) for x in (lab / name).read_text().splitlines() if x.strip()]

    def split_rule_geomean(name, key, dtype):
        per = {}
        for r in rows(name):
            if r["dtype"] == dtype:
                kw = r.get("kwargs") or r.get("build_kwargs")
                per.setdefault((r["M"], r["N"], r["K"]), {}).setdefault(
                    r["chooser"], (kw["BLK_N"], []))[1].append(math.log(r[key]))
        logs = []
        for (M, N, K), by in per.items():
            want = mm.choose(M, N, K, dtype, "sm_90a", 132)[1]["BLK_N"]
            who = next(w for w in ("old", "new") if w in by and by[w][0] == want)
            logs.append(sum(by[who][1]) / len(by[who][1]))
        return math.exp(sum(logs) / len(logs))

    readme = _readme_text()
    assert 56 not in chooser.SWAP_SPLIT_TILES
    for dt, short in (("bfloat16", "bf16"), ("float16", "fp16")):
        g = split_rule_geomean("matmul_graph_h200_splitw.jsonl", "ratio", dt)
        assert f"→ {g:.3f} ({short}) " in readme, (dt, g)
    g = split_rule_geomean("matmul_eager_h200_splitw.jsonl", "ratio_to_torch", "bfloat16")
    assert f"→ {g:.3f}: level" in readme, g

    def geo(suite, who, dtype):
        xs = [math.log(r["ratio"]) for r in rows("matmul_graph_h200_staticnk.jsonl")
              if (r["suite"], r["chooser"], r["dtype"]) == (suite, who, dtype)]
        return math.exp(sum(xs) / len(xs))

    src = _source_text("tirx_gemm/op/choice.py")
    for suite in ("models", "heldout"):
        old, new = ((" / ".join(f"{geo(suite, w, d):.3f}" for d in ("float16", "bfloat16")))
                    for w in ("old", "new"))
        assert f"{old} -> {new}" in src, (suite, old, new)


def test_static_nk_swap_and_pair_figures_are_computed_from_their_records():
    """The figures matmul_choice quotes for building persistent swap-AB tiles, swap-AB
    stored by TMA and pairs for their N and K (and not swap-AB's SPLIT_K=1 units),
    recomputed from the two H200 calls' records: per call, the cases whose kernel the rule
    changes (new against old in the same call, the mean of each one's passes), and the
    suites' geomeans. Every case's kernels are the committed rule's (call 2) or the rule
    tried first (call 1: SPLIT_K=1 units built for N and K too)."""
    import json
    import math
    import re
    from pathlib import Path

    from tirx_gemm import matmul as mm
    from tirx_gemm.op import suite as S
    root = Path(__file__).parents[1]
    rows = _lab_records("matmul_graph_h200_nkswap.jsonl")

    def changed(call, who):
        per: dict = {}
        for r in rows:
            if r["call"] == call and (call == 2 or r["shapes"] == "changed"):  # A/B pairs
                per.setdefault((r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
                    r["chooser"], []).append(r)
        out = []
        for key, by in per.items():
            if who in by and "old" in by and by[who][0]["kwargs"] != by["old"][0]["kwargs"]:
                d = (sum(math.log(r["ratio"]) for r in by[who]) / len(by[who])
                     - sum(math.log(r["ratio"]) for r in by["old"]) / len(by["old"]))
                out.append((key, by[who][0]["path"], d))
                if call == 2:  # the committed rule picks the new kernel (since given
                    # PDL with the exit trigger where it had no PDL: matmul_graph_h200_pdl)
                    M, N, K, dt = key
                    kw = mm.choose(M, N, K, dt, "sm_90a", 132)[1]
                    if kw.pop("PDL_TRIGGER", "start") == "exit":
                        del kw["PDL"]
                    assert kw == by[who][0]["kwargs"]
        return out

    def summary(cs):
        return len(cs), sum(d < 0 for _, _, d in cs), math.exp(sum(d for *_, d in cs) / len(cs))

    src = _source_text("tirx_gemm/op/choice.py")
    one = changed(1, "tried")
    units = [c for c in one if c[1] == "swap_unit"]
    n, behind, g = summary(units)
    assert f"ran behind at {behind} of {n} cases (geomean {g:.3f};" in src, (n, behind, g)
    rest1 = summary([c for c in one if c[1] != "swap_unit"])
    rest2 = summary(changed(2, "new"))
    assert rest1[:2] == rest2[:2]
    assert (f"at the {rest2[0]} cases whose kernel this changes, geomean {rest1[2]:.3f} and "
            f"{rest2[2]:.3f}, behind at {rest2[1]} of {rest2[0]} in each call") in src
    readme = _readme_text()
    assert (f"At the {rest2[0]} cases whose kernel the kept rule changes (persistent swap-AB "
            f"tiles, swap-AB stored by TMA, the 1000³ pair) the geomean of new over old is "
            f"{rest1[2]:.3f} and {rest2[2]:.3f} in the two calls, behind at {rest2[1]} of "
            f"{rest2[0]} in each") in readme
    assert f"behind at {behind} of {n} cases (geomean {g:.3f};" in readme

    def geo(suite, who, dtype):
        xs = [math.log(r["ratio"]) for r in rows if r["call"] == 2 and r["shapes"] == "all"
              and (r["suite"], r["chooser"], r["dtype"]) == (suite, who, dtype)]
        return math.exp(sum(xs) / len(xs))
    for suite, name in (("models", "models"), ("heldout", "held-out")):
        old, new = (" / ".join(f"{geo(suite, w, d):.3f}" for d in ("float16", "bfloat16"))
                    for w in ("old", "new"))
        assert f"{name} {old} -> {new}" in src, (suite, old, new)
    # the bundle count quoted: every M of the models suite's layers, one dtype
    models = S.load_suite(root / "tirx_gemm" / "op" / "suites" / "models.json")
    count = sum(1 for _, _, kw in S.export_requests(models, "matmul", "sm_90a", 132)
                if kw.get("dtype", "float16") == "float16")
    assert f"bundle for every M holds {count} kernels per dtype" in src, count
    assert f"over every M take {count} kernels per dtype" in readme, count


def test_pdl_exit_trigger_figures_are_computed_from_their_records():
    """The figures matmul_choice's PDL_EXIT_NOTE and README quote, recomputed from the two
    H200 calls' records: call 1 (the package before, PDL's start trigger on every kernel
    built for N and K without PDL, the exit trigger on every v12 kernel), call 2 (the kept
    rule against the package before); each case the mean of its passes' log ratios."""
    import json
    import math
    import re
    from pathlib import Path

    from tirx_gemm import matmul as mm
    root = Path(__file__).parents[1]
    rows = _lab_records("matmul_graph_h200_pdl.jsonl")

    def cases(call):
        per: dict = {}
        for r in rows:
            if r["call"] == call:
                per.setdefault((r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
                    r["chooser"], []).append(r)
        return per

    def lm(rs):
        return sum(math.log(r["ratio"]) for r in rs) / len(rs)

    def stats(xs):
        return (len(xs), f"{min(xs):.3f}-{max(xs):.3f}",
                f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f}", sum(x < 1 for x in xs))

    one = cases(1)
    before = {k: v["before"][0]["kwargs"] for k, v in one.items()}
    a = stats([math.exp(lm(v["start_all"]) - lm(v["before"])) for k, v in one.items()
               if not before[k].get("PDL") and v["start_all"][0]["kwargs"] != before[k]])
    b_off = stats([math.exp(lm(v["exit_all"]) - lm(v["before"])) for k, v in one.items()
                   if not before[k].get("PDL") and "BLK_M" in before[k]
                   and before[k].get("CLUSTER", 1) == 1])
    b_on = stats([math.exp(lm(v["exit_all"]) - lm(v["before"])) for k, v in one.items()
                  if before[k].get("PDL")])
    two = cases(2)
    for (M, N, K, dt), v in two.items():  # the kept rule's kernels are what this commits
        assert mm.choose(M, N, K, dt, "sm_90a", 132)[1] == v["kept"][0]["kwargs"]
    kept = [math.exp(lm(v["kept"]) - lm(v["before"])) for v in two.values()]
    c = stats(kept)
    src = _source_text("tirx_gemm/op/choice.py")
    readme = _readme_text()
    for text in (src, readme):
        assert f"start trigger on the {a[0]} cases of kernels built for N and K without PDL " \
               f"ran {a[1]}x" in text, a
        assert f"exit trigger on the {b_off[0]} cases without PDL {b_off[1]}x (geomean " \
               f"{b_off[2]})" in text, b_off
        assert f"on the {b_on[0]} with PDL {b_on[1]}x (geomean {b_on[2]}" in text, b_on
        assert f"at its {c[0]} cases: geomean {c[2]}, behind at {c[3]}" in text, c
    # lesson v12's summary of the same cases: the exit trigger on kernels without PDL over
    # both calls, and the start trigger's loss where it was replaced
    lesson = re.sub(r"\s+", " ", re.sub(r"<!-- /?rec[^>]*-->", "", (
        root / "steps" / "lessons" / "v12.md").read_text()))
    off = [math.exp(lm(v["exit_all"]) - lm(v["before"])) for k, v in one.items()
           if not before[k].get("PDL") and "BLK_M" in before[k]
           and before[k].get("CLUSTER", 1) == 1] + kept
    g1, g2 = (float(b_off[2]) - 1) * 100, (float(c[2]) - 1) * 100
    assert (f"moved each between {(min(off) - 1) * 100:.1f}% and +{(max(off) - 1) * 100:.1f}% "
            f"(geomean +{g1:.1f}% and +{g2:.1f}% in two calls)") in lesson
    assert f"it lost up to {round((1 - float(b_on[1].split('-')[0])) * 100)}%" in lesson


def test_split_pdl_trigger_figures_are_computed_from_their_records():
    """The figures matmul_choice's PDL_EXIT_NOTE and README quote for the K splits' PDL
    trigger, recomputed from the H200 call's records (each case the mean of its passes' log
    ratios, exit over start); the start side's kernels are what matmul picks today, the exit
    side's the same kernels with PDL_TRIGGER="exit"."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    per: dict = {}
    for r in _lab_records("matmul_graph_h200_splitpdl.jsonl"):
        per.setdefault((r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
            r["chooser"], []).append(r)
    shapes = json.loads((ROOT / "scripts" / "lab" / "issue32_splitfam.json").read_text())
    assert len(shapes["shapes"]) == 42 == len({k[:3] for k in per})
    groups: dict = {"swap": [], "short": [], "long": []}
    for (M, N, K, dt), v in per.items():
        kw = v["start"][0]["kwargs"]
        assert mm.choose(M, N, K, dt, "sm_90a", 132)[1] == kw and kw["SPLIT_K"] > 1
        assert all(r["kwargs"] == {**kw, "PDL_TRIGGER": "exit"} for r in v["exit"])
        assert len(v["start"]) == len(v["exit"]) == 2
        gain = math.exp(_mean_log_ratio(v["exit"]) - _mean_log_ratio(v["start"]))
        if kw.get("SWAP_AB"):
            groups["swap"].append(gain)
        else:
            t = chooser.predict_split(kw["BLK_M"], kw["BLK_N"], kw["SPLIT_K"], M, N, K)
            groups["short" if t <= chooser.PDL_MAX_US else "long"].append(gain)
    for text in (_source_text("tirx_gemm/op/choice.py"), _readme_text(code=False)):
        swap, short, long = (_ab_summary(groups[g]) for g in ("swap", "short", "long"))
        assert f"swap-AB splits {swap}" in text, swap
        assert f"PDL_MAX_US {short}" in text, short
        assert f"the longer ones {long}" in text, long


def test_cublas_fp16_kernels_quoted_in_readme_are_the_recorded_ones():
    """README's stop-51 paragraph names the kernels cuBLAS ran per dtype at 128x256x32768
    and 1000^3: they must be the ones results/lab/cublas_kernels_dtypes_h200.jsonl holds."""
    first = {(r["M"], r["N"], r["K"], r["dtype"]): r["kernels"][0].split(" x")[0]
             for r in _lab_records("cublas_kernels_dtypes_h200.jsonl")}
    readme = (ROOT / "README.md").read_text()
    para = readme[readme.index("**Why the fp16 misses remain"):]
    para = para[:para.index("\n")]
    for mnk in ((128, 256, 32768), (1000, 1000, 1000)):
        fp16, bf16 = first[(*mnk, "float16")], first[(*mnk, "bfloat16")]
        assert fp16 != bf16
        assert f"`{fp16}`" in para and f"bf16's `{bf16}`" in para, (mnk, fp16, bf16)
    assert first[(128, 128, 65536, "float16")].replace("hsh", "tst") == \
        first[(128, 128, 65536, "bfloat16")]


def test_tall_swap_split_rule_and_its_figures_follow_the_records():
    """chooser's TALL_SPLIT note: each case of the three H200 calls (the package before
    against a variant with no floor on a unit's K steps, then the committed rule's check) is
    recomputed, grouped by the K steps a unit keeps, and matched against the quoted figures;
    the committed rule picks the variant's kernel exactly where a unit keeps
    TALL_SPLIT_MIN_K_STEPS or more, else the kernel before."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    per: dict = {}
    for r in _lab_records("matmul_graph_h200_tallsplit.jsonl"):
        per.setdefault((r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
            r["chooser"], []).append(r)
    groups: dict = {"deep": [], "32": [], "short": [], "check": []}
    for (M, N, K, dt), v in per.items():
        tall, before = v["tall"][0]["kwargs"], v["before"][0]["kwargs"]
        assert tall["BLK_M"] == 128 and tall["SWAP_AB"] and tall["SPLIT_K"] >= 3
        steps = -(-K // chooser.BLK_K) // tall["SPLIT_K"]
        now = mm.choose(M, N, K, dt, "sm_90a", 132)[1]
        want = tall if steps >= chooser.TALL_SPLIT_MIN_K_STEPS else before
        assert now == want or _clustered_now(M, N, now, want), (M, N, K)
        gain = math.exp(_mean_log_ratio(v["tall"]) - _mean_log_ratio(v["before"]))
        if v["tall"][0]["call"] == 3:  # the committed rule's check at token counts not run
            groups["check"].append(gain)
        else:
            groups["deep" if steps >= 48 else "32" if steps >= 32 else "short"].append(gain)
    deep, mid, short, check = (_ab_summary(groups[g]) for g in ("deep", "32", "short", "check"))
    for text in (_source_text("tirx_gemm/op/chooser.py"), _readme_text(code=False)):
        assert f"at least 48 K steps a unit {deep}" in text, deep
        assert f"with 32 steps {mid}" in text, mid
        assert f"with 24 or fewer {short}" in text, short
        assert f"both dtypes): {check}" in text, check
    assert chooser.TALL_SPLIT_MIN_K_STEPS == 48


def test_tall_swap_split_plans():
    """Where the 128-row swap-AB split applies: a decode weight of more 64-row tiles than
    half the SMs, S >= 3 units of at least TALL_SPLIT_MIN_K_STEPS K steps; elsewhere the
    plans before it."""
    from tirx_gemm.op import chooser
    assert chooser.split_plan(64, 4608, 36864) == (128, 64, True, 3, None)
    assert chooser.split_plan(1, 5120, 13824) == (128, 8, True, 3, None)
    assert chooser.split_plan(96, 5120, 27648) == (128, 96, True, 3, None)
    assert chooser.split_plan(64, 4608, 4608) is None          # 24 K steps a unit: persistent
    assert chooser.split_plan(16, 4800, 1600) == (64, 16, True, 1, 8)   # the unit kernel
    assert chooser.split_plan(1, 5120, 17920) == (64, 16, True, 1, 8)   # S would be 2
    assert chooser.split_plan(1, 8192, 8192) == (64, 16, True, 1, 8)    # 64 tall tiles: S 2
    assert chooser.split_plan(1, 4096, 4096) == (64, 8, True, 2, None)  # the 64-row split


def _ab_cases(name: str) -> dict:
    """{(call, M, N, K, dtype): {chooser label: [records]}} of an A/B records file."""
    per: dict = {}
    for r in _lab_records(name):
        per.setdefault((r["call"], r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
            r["chooser"], []).append(r)
    return per


def _ab_gains(per: dict, call: int, base: str, label: str,
              changed: bool = False) -> list[float]:
    """Per case of ``call``: the variant ``label`` over ``base`` (the mean of each side's
    passes' log ratios); ``changed``: only the cases whose kernel the variant changed."""
    return [math.exp(_mean_log_ratio(v[label]) - _mean_log_ratio(v[base]))
            for k, v in per.items() if k[0] == call
            and not (changed and v[label][0]["kwargs"] == v[base][0]["kwargs"])]


def test_swap_stream_k_tail_rule_and_its_figures_follow_the_records():
    """chooser's swap-AB stream-K note: the three H200 calls' cases recomputed (the mean of
    each case's passes' log ratios, the variant over the package before, where the kernel
    changed) and matched against the quoted figures; the committed rule picks the kernels
    call 2's variant and call 3 ran, and the kernel before where its tail is not short."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    per = _ab_cases("matmul_graph_h200_swaptail.jsonl")

    def summary(call, label):
        return _ab_summary(_ab_gains(per, call, "before", label, changed=True))

    for (call, M, N, K, dt), v in per.items():
        if call == 1:
            continue
        now = mm.choose(M, N, K, dt, "sm_90a", 132)[1]
        if _clustered_now(M, N, now, v["stream_k"][0]["kwargs"]):
            continue  # the swap-AB cluster rule's since (stop 53)
        assert now == v["stream_k"][0]["kwargs"], (call, M, N, K)
        assert now.get("STREAM_K", False) == chooser.swap_stream_k(M, N)
        if call == 3:  # the committed package was "new" there: the kernel before had none
            assert now["STREAM_K"] and not v["before"][0]["kwargs"].get("STREAM_K")
    for text in (_source_text("tirx_gemm/op/chooser.py"), _readme_text(code=False)):
        for call, label in ((1, "rows64"), (2, "stream_k"), (3, "stream_k")):
            assert summary(call, label) in text, (call, summary(call, label))


def test_v9_handicap_rule_and_its_figures_follow_the_records():
    """chooser.V9_HANDICAP (issue 32, stop 52): the three H200 calls' cases recomputed and
    matched against the figures chooser.py and README quote; the committed rule picks, at
    every case, the v12 kernel that ran in v9's place, where the package before ran v9."""
    from tirx_gemm import matmul as mm
    per = _ab_cases("matmul_graph_h200_v9handicap.jsonl")
    assert {k[0] for k in per} == {1, 2, 3}
    for (call, M, N, K, dt), v in per.items():
        label = "within0" if call == 1 else "handicap"
        assert v["before"][0]["step"] == "v9", (call, M, N, K, dt)
        assert len(v["before"]) == len(v[label]) == 2  # two passes each
        now = mm.choose(M, N, K, dt, "sm_90a", 132)
        assert now == ("v12", v[label][0]["kwargs"]), (call, M, N, K, dt)
    chooser_text, readme = _source_text("tirx_gemm/op/chooser.py"), _readme_text(code=False)
    for call, label in ((1, "within0"), (2, "handicap"), (3, "handicap")):
        summary = _ab_summary(_ab_gains(per, call, "before", label))
        assert summary in chooser_text and summary in readme, (call, summary)
    slowest = min((math.exp(_mean_log_ratio(v["handicap"]) - _mean_log_ratio(v["before"])), k)
                  for k, v in per.items() if k[0] == 2)
    _, (_, M, N, K, dt) = slowest
    assert f"the slowest {M}x{N}x{K} ({'bf16' if dt == 'bfloat16' else 'fp16'}) at " \
           f"{slowest[0]:.3f}" in readme


def test_v9_handicap_is_the_only_preference_v9_has():
    """v9 is picked only where it is predicted more than V9_HANDICAP faster than every v12
    tile; v10 (in its band) keeps PREFER_PAIR_WITHIN. Both as README states them."""
    from tirx_gemm.op import chooser
    readme = _readme_text()
    assert (f"predicted more than {round(chooser.V9_HANDICAP * 100)}% faster than every v12 "
            f"tile (`chooser.V9_HANDICAP`") in readme
    assert (f"predicted more than {round(chooser.PREFER_PAIR_WITHIN * 100)}% faster "
            f"(`chooser.PREFER_PAIR_WITHIN`") in readme
    # a shape where v9's fitted figure is the fastest, but by less than the handicap
    found = 0
    for M in (4096, 6144, 8192):
        for N, K in ((4096, 4096), (6144, 4096), (28672, 4096), (8192, 28672)):
            ranked = chooser.rank(M, N, K)
            v9 = next(t for t, c in ranked if c == chooser.V9)
            v12 = next(t for t, c in ranked if c not in (chooser.V9, chooser.V10))
            pick = chooser.best(M, N, K)
            assert (pick == chooser.V9) == (v9 * (1 + chooser.V9_HANDICAP) < v12), (M, N, K)
            found += v9 < v12 and pick != chooser.V9
    assert found  # the handicap changed a pick the fitted figures alone would give v9


def test_v9_handicap_as_the_bullet_and_the_lesson_state_it():
    """The handicap's size and the lesson's wave arithmetic (6144x5120x3072), from the code."""
    from tirx_gemm.op import chooser
    pct = round(chooser.V9_HANDICAP * 100)
    assert (f"v9's predicted time counts {pct}% more when `chooser.best` ranks it against "
            f"v12's tiles, and a v12 tile within {pct}% takes its place") in _readme_text()
    lesson = re.sub(r"\s+", " ", re.sub(r"<!-- /?rec[^>]*-->", "",
                                        (ROOT / "steps/lessons/v12.md").read_text()))
    assert f"counts v9's predicted time {pct}% higher" in lesson
    M, N, K = 6144, 5120, 3072
    _, v9_waves, v9_tiles = chooser.shape_terms(chooser.V9, M, N, K, 132)
    _, waves, tiles = chooser.shape_terms("128x240", M, N, K, 132)
    pairs = 132 // 2
    assert v9_waves == 8 and waves == 8 and tiles == 8 * 132  # every wave of 128x240 full
    assert (f"v9's {v9_tiles} tiles make {v9_tiles / pairs:.1f} waves on {pairs} pairs, the "
            f"eighth a quarter full; 128x240 tiles make {tiles}, eight waves on 132 CTAs") in lesson
    assert round(4 * (v9_tiles - 7 * pairs) / pairs) == 1  # "a quarter full"


def test_v10_band_keeps_its_place_as_measured():
    """The v10 band A/B (stop 52, not adopted): its figures as README quotes them, and
    matmul still picks v10 at every case the variant moved to a v12 tile."""
    from tirx_gemm import matmul as mm
    per = _ab_cases("matmul_graph_h200_v10band.jsonl")
    for (call, M, N, K, dt), v in per.items():
        assert mm.choose(M, N, K, dt, "sm_90a", 132)[0] == "v10" == v["v10"][0]["step"]
        assert v["v10handicap"][0]["step"] == "v12"
    gains = _ab_gains(per, 4, "v10", "v10handicap")
    assert _ab_summary(gains) in _readme_text(code=False)
    assert f"ahead at {sum(g > 1 for g in gains)} cases only" in _readme_text(code=False)


def test_stream_k_all_figures_follow_the_records_and_matmul_never_takes_it():
    """v12's STREAM_K_ALL at 49-96 tokens (stop 52, not adopted): the two variants' figures
    as README quotes them; matmul's picks at those shapes are the package's, without it."""
    per = _ab_cases("matmul_graph_h200_skall.jsonl")
    readme = _readme_text(code=False)
    for label in ("stream_k_all", "stream_k_all_128"):
        assert _ab_summary(_ab_gains(per, 1, "before", label)) in readme, label
    for (call, M, N, K, dt), v in per.items():
        now = _stop52_pick(M, N, K, dt, v["before"][0])
        assert "STREAM_K_ALL" not in now[1]
        assert any(r["kwargs"].get("STREAM_K_ALL") for r in v["stream_k_all_128"])


def test_v9_handicap_kernel_count_as_quoted():
    """README's count of what serves the models suite's layers over every M (bf16)."""
    import json
    from tirx_gemm import matmul as mm
    suite = json.loads((ROOT / "tirx_gemm" / "op" / "suites" / "models.json").read_text())
    layers = sorted({(s["N"], s["K"]) for s in suite["shapes"]})
    ranges, kernels = 0, set()
    for N, K in layers:
        vs = mm.variants(N, K, "bfloat16")
        ranges += len(vs)
        kernels |= {(N, K, step, tuple(sorted(kw.items()))) for step, kw, _, _ in vs}
    assert len(layers) == 27
    assert (f"the models suite's {len(layers)} layers, bf16) matmul now serves {ranges} M "
            f"ranges with {len(kernels)} kernels") in _readme_text()


def _clustered_now(M, N, now: dict, before: dict) -> bool:
    """Whether matmul's kernel ``now`` at an earlier A/B's case is the swap-AB cluster
    rule's (stop 53) in place of ``before``, the persistent swap-AB kernel that A/B ran:
    clusters of four along the weight where chooser.swap_cluster_rows says so."""
    from tirx_gemm.op import chooser
    if now.get("CLUSTER") != chooser.SWAP_CLUSTER:
        return False
    assert now["BLK_M"] == chooser.swap_cluster_rows(M, N), (M, N, now)
    assert before.get("SWAP_AB") and "SPLIT_K" not in before, (M, N, before)
    return True


def _stop52_pick(M, N, K, dt, before: dict) -> tuple:
    """matmul's pick at a case of stop 52's decode A/Bs: the kernel those calls ran as the
    package's ("before"), or the swap-AB cluster rule's (:func:`_clustered_now`)."""
    from tirx_gemm import matmul as mm
    now = mm.choose(M, N, K, dt, "sm_90a", 132)
    if not _clustered_now(M, N, now[1], before["kwargs"]):
        assert now == (before["step"], before["kwargs"]), (M, N, K, dt)
    return now


def test_mma_lag_at_49_96_tokens_figures_follow_the_records():
    """The MMA_LAG 2 / 4 A/B at the mdec shapes (stop 52, not adopted): its figures as
    README quotes them, over the cases whose kernel the variant changed; matmul's picks
    there keep MMA_LAG at its default."""
    per = _ab_cases("matmul_graph_h200_mdeclag.jsonl")
    readme = _readme_text(code=False)
    for label in ("mma_lag2", "mma_lag4"):
        assert all("MMA_LAG" in v[label][0]["kwargs"]
                   for v in per.values() if v[label][0]["kwargs"] != v["before"][0]["kwargs"])
        gains = _ab_gains(per, 1, "before", label, changed=True)
        assert len(gains) == 21 and _ab_summary(gains) in readme, label
    for (call, M, N, K, dt), v in per.items():
        assert "MMA_LAG" not in _stop52_pick(M, N, K, dt, v["before"][0])[1]


def test_misaligned_pair_rule_recheck_figures_follow_the_records():
    """The pair rule re-checked (stop 52): README's figures over the cases where the rule
    makes a pair, and matmul still makes it there."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    per = _ab_cases("matmul_graph_h200_misk.jsonl")
    for (call, M, N, K, dt), v in per.items():
        now = mm.choose(M, N, K, dt, "sm_90a", 132)
        assert now == (v["pair"][0]["step"], v["pair"][0]["kwargs"])
        if v["pair"][0]["kwargs"] != v["one_cta"][0]["kwargs"]:
            assert chooser.misaligned_rows(K) and now[1]["CLUSTER"] == 2
            assert "CLUSTER" not in v["one_cta"][0]["kwargs"]
    gains = _ab_gains(per, 1, "pair", "one_cta", changed=True)
    assert len(gains) == 10 and _ab_summary(gains) in _readme_text(code=False)


def test_swap_pairs_at_49_96_tokens_figures_follow_the_records():
    """Swap-AB pairs at the mdec shapes (stop 52, not adopted): README's figure over the
    cases the variant changed; matmul's picks there stay one-CTA."""
    per = _ab_cases("matmul_graph_h200_mdecpair.jsonl")
    for (call, M, N, K, dt), v in per.items():
        now = _stop52_pick(M, N, K, dt, v["before"][0])
        assert now[1].get("CLUSTER", 1) != 2
        if v["pairs"][0]["kwargs"] != v["before"][0]["kwargs"]:
            assert v["pairs"][0]["kwargs"]["CLUSTER"] == 2
    gains = _ab_gains(per, 1, "before", "pairs", changed=True)
    assert len(gains) == 21 and _ab_summary(gains) in _readme_text(code=False)


def test_swap_cluster_rule_follows_the_fill_and_the_residency():
    """chooser.swap_cluster_rows: clusters of four only past SWAP_NP_MAX_M tokens and within
    the token tiles, on a pool of whole clusters, where the one-CTA grid's last wave is at
    most SWAP_CLUSTER_MAX_FILL full, with the smallest weight tile whose clusters the GPU
    holds at once; matmul then builds that kernel (CLUSTER=4, no SHIFT_LAST, PREFETCH_MAPS
    or STREAM_K, PDL with the start trigger only where a swap-AB kernel is short)."""
    pytest.importorskip("tvm")
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    cdiv = chooser._ceil_div
    assert chooser.swap_cluster_rows(48, 4608) is None
    assert chooser.swap_cluster_rows(97, 4608) is None
    assert chooser.swap_cluster_rows(72, 4608, 130) is None
    seen = set()
    for M in (49, 64, 72, 88, 96):
        for N in range(1024, 32769, 256):
            rows = chooser.swap_cluster_rows(M, N)
            bm, bn = chooser.swap_ab_tile(M, N)
            tiles = cdiv(N, bm) * cdiv(M, bn)
            full = tiles / (cdiv(tiles, 132) * 132) <= chooser.SWAP_CLUSTER_MAX_FILL
            fits = [r for r in (64, 128)
                    if cdiv(N, r * chooser.SWAP_CLUSTER) <= chooser.SWAP_CLUSTER_MAX_CLUSTERS]
            assert rows == (fits[0] if full and fits else None), (M, N)
            seen.add(rows)
    assert seen == {None, 64, 128}
    step = registry.get("v12", "sm_90a")
    for M, N, K in ((72, 4608, 4096), (88, 10240, 8192), (56, 5632, 2048)):
        kind, kw = mm.choose(M, N, K, "bfloat16", "sm_90a", 132)
        assert kind == "v12" and kw["CLUSTER"] == 4 and kw["SWAP_AB"] and kw["PDL"]
        assert kw["BLK_M"] == chooser.swap_cluster_rows(M, N)
        assert not {"SHIFT_LAST", "PREFETCH_MAPS", "STREAM_K"} & set(kw)
        assert ("PDL_TRIGGER" in kw) != chooser.swap_pdl(M, N, K)
        step.build_primfunc(M, N, K, **kw)
        assert any(v[1].get("CLUSTER") == 4 and v[2] <= M <= v[3]
                   for v in mm.variants(N, K, "bfloat16", max_m=128))


def test_swap_cluster_rule_figures_follow_the_records():
    """The clusters-of-four A/B (stop 53): both variants' figures over the 24 decode layers
    and the rule's over the layers where it picks clusters, recomputed and matched against
    README and chooser.py; at those layers matmul now picks the kernel the variant ran."""
    from tirx_gemm.op import chooser
    from tirx_gemm import matmul as mm
    per = _ab_cases("matmul_graph_h200_c4.jsonl")
    readme, chooser_text = _readme_text(code=False), _source_text("tirx_gemm/op/chooser.py")
    for label in ("c4_rows64", "c4_rows128"):
        gains = _ab_gains(per, 1, "before", label)
        assert len(gains) == 24 and _ab_summary(gains) in readme, label
    rule, mixed = [], []
    for (call, M, N, K, dt), v in per.items():
        if call != 1:
            continue
        rows = chooser.swap_cluster_rows(M, N)
        label = {None: "before", 64: "c4_rows64", 128: "c4_rows128"}[rows]
        mixed.append(_mean_log_ratio(v[label]))
        now = mm.choose(M, N, K, dt, "sm_90a", 132)
        assert now == (v[label][0]["step"], v[label][0]["kwargs"]), (M, N, K)
        if rows is not None:
            rule.append(math.exp(_mean_log_ratio(v[label]) - _mean_log_ratio(v["before"])))
    assert len(rule) == 12
    assert _ab_summary(rule) in readme and _ab_summary(rule) in chooser_text
    assert f"the set's geomean goes from {_geomean_of(per, 'before'):.3f} to " \
           f"{math.exp(sum(mixed) / len(mixed)):.3f}" in readme
    # call 2: the rule as committed against the package before, at the mdec set again and
    # at the check set of other models' layers (both dtypes), where the kernel changed
    for name, count in (("issue32_c4check.json", 24), ("issue32_mdec.json", 12)):
        sub = {k: v for k, v in per.items() if k[0] == 2
               and v["cluster_rule"][0]["set"].endswith(name)}
        gains = _ab_gains(sub, 2, "before", "cluster_rule", changed=True)
        assert len(gains) == count and _ab_summary(gains) in readme, name
        assert _ab_summary(gains) in chooser_text, name
        for (_, M, N, K, dt), v in sub.items():
            assert mm.choose(M, N, K, dt, "sm_90a", 132) == (v["cluster_rule"][0]["step"],
                                                             v["cluster_rule"][0]["kwargs"])
    import json
    check = json.loads((ROOT / "scripts/lab/issue32_c4check.json").read_text())["shapes"]
    changed = sum(mm.choose(e["M"], e["N"], e["K"], "bfloat16", "sm_90a", 132)[1].get("CLUSTER")
                  == chooser.SWAP_CLUSTER for e in check)
    assert (f"at {len(check)} decode layers of other models" in readme
            and f"the rule changes {changed} of them" in readme)


def test_swap_cluster_cap_is_the_drivers_count():
    """chooser.SWAP_CLUSTER_MAX_CLUSTERS is what the driver said the H200 holds at once of
    clusters of four of both swap-AB cluster kernels (results/lab/cluster_occupancy_h200.jsonl),
    and README and the lesson quote it with the SMs it covers."""
    from tirx_gemm.op import chooser
    rows = [r for r in _lab_records("cluster_occupancy_h200.jsonl")
            if r["cluster"] == chooser.SWAP_CLUSTER]
    assert len(rows) == 2 and {r["threads"] for r in rows} == {256, 384}
    assert {r["max_active_clusters"] for r in rows} == {chooser.SWAP_CLUSTER_MAX_CLUSTERS}
    ctas = chooser.SWAP_CLUSTER_MAX_CLUSTERS * chooser.SWAP_CLUSTER
    assert all(r["device"] == "NVIDIA H200" and r["ctas"] == ctas for r in rows)
    text = (f"holds {chooser.SWAP_CLUSTER_MAX_CLUSTERS} clusters of four at once, {ctas} of "
            f"its 132 SMs")
    assert text in _readme_text(code=False)
    lesson = re.sub(r"\s+", " ", (ROOT / "steps/lessons/v12.md").read_text())
    assert f"the H200 holds {chooser.SWAP_CLUSTER_MAX_CLUSTERS} at once, {ctas} of its 132 SMs" in lesson
    assert chooser.SWAP_CLUSTER_MAX_FILL == 2 / 3
    assert "the one-CTA grid's last wave is at most two-thirds full" in _readme_text()


def _geomean_of(per: dict, label: str, call: int = 1) -> float:
    logs = [math.log(r["ratio"]) for k, v in per.items() if k[0] == call for r in v[label]]
    return math.exp(sum(logs) / len(logs))


def test_swap_clusters_change_no_suite_kernel_at_its_own_token_count():
    """README: the clusters of four change no kernel of the models or held-out suites at
    their own token counts, and of the fresh sample only 80x4608x4096."""
    import json
    from tirx_gemm import matmul as mm
    changed = []
    for path in ("tirx_gemm/op/suites/models.json", "tirx_gemm/op/suites/heldout.json",
                 "scripts/lab/issue32_fresh.json"):
        for e in json.loads((ROOT / path).read_text())["shapes"]:
            for dt in ("float16", "bfloat16"):
                if mm.choose(e["M"], e["N"], e["K"], dt, "sm_90a", 132)[1].get("CLUSTER") == 4:
                    changed.append((path, e["M"], e["N"], e["K"]))
    assert {c[1:] for c in changed} == {(80, 4608, 4096)}
    assert all(c[0].endswith("issue32_fresh.json") for c in changed)
    assert "Stop 53's clusters of four change no kernel of the models or held-out suites" \
           in _readme_text()


def test_the_prepared_lab_sets_meet_the_rules_they_test():
    """The sets prepared for the next H200 call (stop 54) test what their descriptions say:
    issue32_c4next.json, 64-row clusters of four at every layer, the 56-token tile at 52 and
    56 tokens and the 64-token one at 62, on weights outside the two sets the cluster rule
    was built and checked on (mdec, c4check);
    issue32_m128.json, one-CTA 64-row token tiles (no swap-AB, no split) at 97-128 tokens;
    issue32_c4mis.json, CTA pairs by the misaligned-row rule at every shape."""
    import json
    from tirx_gemm import matmul as mm
    from tirx_gemm.op.suite import load_suite
    lab = ROOT / "scripts/lab"
    for name in ("c4next", "m128", "c4mis"):  # what the H200 scripts load them with
        assert "Decided before the run" in load_suite(str(lab / f"issue32_{name}.json")).description
    nxt = json.loads((lab / "issue32_c4next.json").read_text())["shapes"]
    earlier = {(e["N"], e["K"]) for name in ("mdec", "c4check")
               for e in json.loads((lab / f"issue32_{name}.json").read_text())["shapes"]}
    for e in nxt:
        assert (e["N"], e["K"]) not in earlier, e
        for dt in ("float16", "bfloat16"):
            step, kw = mm.choose(e["M"], e["N"], e["K"], dt, "sm_90a", 132)
            assert (step, kw["BLK_M"], kw.get("CLUSTER"), kw["SWAP_AB"]) == ("v12", 64, 4, True)
            assert kw["BLK_N"] == (56 if e["M"] <= 56 else 64), e
    assert {e["M"] for e in nxt} == {52, 56, 62}
    for e in json.loads((lab / "issue32_m128.json").read_text())["shapes"]:
        assert 96 < e["M"] <= 128
        for dt in ("float16", "bfloat16"):
            step, kw = mm.choose(e["M"], e["N"], e["K"], dt, "sm_90a", 132)
            assert step == "v12" and kw["BLK_M"] == 64, e
            assert not any(kw.get(k) for k in ("SWAP_AB", "SPLIT_K", "CLUSTER", "STREAM_K")), e
    from tirx_gemm.op import chooser
    for e in json.loads((lab / "issue32_c4mis.json").read_text())["shapes"]:
        assert chooser.misaligned_rows(e["K"]), e
        for dt in ("float16", "bfloat16"):
            step, kw = mm.choose(e["M"], e["N"], e["K"], dt, "sm_90a", 132)
            assert step == "v12" and kw.get("CLUSTER") == 2, e
