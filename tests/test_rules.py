"""matmul's rules on the CPU: what tirx_gemm.op.rules picks per shape and why (the cost
model, swap-AB, K splits, ping-pong, clusters, PDL, tails), and that one list drives it."""
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tirx_gemm import registry

ROOT = Path(__file__).parents[1]


def test_swiglu_tiles_hold_whole_gate_up_group_pairs():
    """SWIGLU's outputs are BLK_N / 2 columns in groups of 8: BLK_N a multiple of 16 (one
    line from the builder). matmul gives every fused epilogue such a tile, also where the
    model's best plain tile is an odd multiple of 8 (2304^3: 128x168), since those widths
    have not run with an epilogue on a GPU."""
    from tirx_gemm import epilogue
    from tirx_gemm.op import cost_model as cm, rules
    assert rules.EPILOGUE_TILE_STEP % epilogue.SWIGLU_TILE_STEP == 0
    assert cm.best_tile(2304, 2304, 2304) == "128x168"
    for epi, n in (({"SWIGLU": True}, 1152), ({"ACT": "relu"}, 2304),
                   ({"OUT_DTYPE": "float32"}, 2304)):
        step, kw = rules.choose(2304, n, 2304, "bfloat16", "sm_90a", 132, epilogue=epi)
        assert step == "v12" and kw["BLK_N"] % rules.EPILOGUE_TILE_STEP == 0, (epi, kw)
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="SWIGLU=True needs BLK_N a multiple of 16") as e:
        step.build_primfunc(256, 2304, 512, BLK_M=128, BLK_N=168, SWIGLU=True)
    assert "\n" not in str(e.value)


def test_rule_pairs_and_widths():
    """A pair is one tile of twice the rows on half the slots; pairs enter only where K's
    rows are not whole 128-byte lines (the measured case for them); every menu width the
    sweeps measured is a candidate."""
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    assert cm.tile("64x128c2") == (64, 128, 2) and cm.name(64, 128, 2) == "64x128c2"
    assert cm.geometry("64x128c2", 132) == (128, 128, 66)
    assert rules.misaligned_rows(1000) and not rules.misaligned_rows(1024)
    assert all(not cm.clustered(c) or c in (cm.V9, cm.V10)
               for _, c in cm.rank(1024, 1024, 1024))
    assert cm.best(100, 1000, 2056) == "64x64"  # the misaligned-row rule makes it a pair
    assert mm.choose(100, 1000, 2056, "bfloat16", "sm_90a", 132)[1]["CLUSTER"] == 2
    assert "CLUSTER" not in mm.choose(1024, 1024, 1024, "bfloat16", "sm_90a", 132)[1]
    assert {"128x144", "64x208", "64x112"} <= set(cm.params())


def test_rule_swap_ab_rule():
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    assert rules.swap_ab_tile(1, 8192, 132) == (64, 8)       # 64 tiles of 128: too few
    assert rules.swap_ab_tile(16, 14336, 132) == (128, 16)   # 112 tiles of 128
    assert rules.swap_ab_tile(77, 7168, 132) == (64, 80)
    assert rules.swap_ab_tile(97, 7168, 132) is None
    # few 64-row weight tiles (N / 64 <= SMs / 2): swap-AB split in SMs // tiles
    step, kw = mm.choose(1, 4096, 4096, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["SWAP_AB"] and (kw["BLK_M"], kw["BLK_N"]) == (64, 8)
    assert kw["SPLIT_K"] == 2 and "RUNTIME_NK" not in kw
    step, kw = mm.choose(32, 4096, 14336, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["SWAP_AB"] and kw["BLK_N"] == 32 and kw["SPLIT_K"] == 2
    # many weight tiles, at most 48 tokens: the non-persistent kernel, token tile >= 16
    step, kw = mm.choose(8, 14336, 4096, "bfloat16", "sm_90a", 132)
    assert (kw["BLK_M"], kw["BLK_N"], kw["SPLIT_K"], kw["PIPE_DEPTH"]) == (64, 16, 1, 8)
    assert kw["SWAP_AB"] and kw["RUNTIME_NK"]  # N and K at run time (rules.RULES' static_n_k)
    # more tokens: the persistent swap-AB kernel of swap_ab_tile, with PDL when its bytes
    # at the HBM rate are short (cm.hbm_floor <= PDL_MAX_US)
    step, kw = mm.choose(77, 7168, 2048, "bfloat16", "sm_90a", 132)
    assert (kw["BLK_M"], kw["BLK_N"]) == (64, 80) and "SPLIT_K" not in kw
    assert kw["PDL"] is True and rules.swap_pdl(77, 7168, 2048)
    assert cm.hbm_floor(77, 7168, 2048) <= cm.PDL_MAX_US
    step, kw = mm.choose(64, 6144, 4096, "bfloat16", "sm_90a", 132)
    assert kw["SWAP_AB"] and not rules.swap_pdl(64, 6144, 4096)
    assert kw["PDL"] and kw["PDL_TRIGGER"] == "exit"  # no start trigger (rules.RULES' pdl_exit)
    # persistent swap-AB tiles, swap-AB stored by TMA and pairs: built for N and K
    assert "RUNTIME_NK" not in kw and kw["RUNTIME_M"]
    assert "RUNTIME_NK" not in mm.choose(77, 7168, 2048, "bfloat16", "sm_90a", 132)[1]
    kw = mm.choose(3152, 768, 3072, "bfloat16", "sm_90a", 132)[1]
    assert kw["SWAP_TMA"] and "RUNTIME_NK" not in kw and kw["RUNTIME_M"]
    kw = mm.choose(100, 1000, 2056, "bfloat16", "sm_90a", 132)[1]
    assert kw["CLUSTER"] == 2 and "RUNTIME_NK" not in kw and kw["RUNTIME_M"]
    kw = mm.choose(1000, 1000, 1000, "bfloat16", "sm_90a", 132)[1]  # clusters along M
    assert kw["CLUSTER"] == 4 and "RUNTIME_NK" not in kw and kw["RUNTIME_M"]
    assert cm.hbm_floor(64, 6144, 4096) > cm.PDL_MAX_US
    # token tiles of every multiple of 8, as cuBLAS's: 37 tokens in 40, 70 in 72, 85 in 88
    assert rules.SWAP_AB_TILES == tuple(range(8, 97, 8))
    assert rules.swap_ab_tile(37, 14336, 132) == (128, 40)
    assert rules.swap_ab_tile(70, 7168, 132) == (64, 72)
    assert rules.swap_ab_tile(85, 7168, 132) == (64, 88)
    assert mm.choose(37, 14336, 4096, "bfloat16", "sm_90a", 132)[1]["BLK_N"] == 40
    # variants: one kernel per token tile below 97 rows, each named for its M range; a K
    # split (4096x4096's decode) takes every one of them but 56 (behind 64 at S = 4 on the
    # H200: lab/split_k_decode)
    v = mm.variants(4096, 4096, "bfloat16", "sm_90a", 132, max_m=128)
    swaps = [(kw["BLK_N"], lo, hi) for _, kw, lo, hi in v if kw.get("SWAP_AB")]
    tiles = rules.SWAP_SPLIT_TILES
    assert all(kw["SPLIT_K"] == 2 for _, kw, _, _ in v if kw.get("SWAP_AB"))
    assert swaps == [(t, lo + 1, t) for lo, t in zip((0,) + tiles, tiles)]
    assert tiles == tuple(t for t in rules.SWAP_AB_TILES if t != 56)
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
    """rules.np_swap_pdl: with more CTAs than SMs PDL's early launch of the next kernel
    cost up to a fifth of the time in CUDA graphs (lab/split_k_decode)."""
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    for mnk, pdl in (((8, 14336, 4096), False), ((2, 10240, 8192), False),
                     ((1, 8192, 8192), True), ((1, 4608, 3584), True)):
        step, kw = mm.choose(*mnk, "bfloat16", "sm_90a", 132)
        assert kw["SPLIT_K"] == 1 and kw["SWAP_AB"], mnk
        # PDL's early launch only where the CTAs fit; elsewhere the next kernel launches
        # as these CTAs exit (PDL_TRIGGER="exit", rules.RULES' pdl_exit)
        assert kw["PDL"] is True and kw.get("PDL_TRIGGER", "start") == (
            "start" if pdl else "exit"), mnk
        assert rules.np_swap_pdl(mnk[0], mnk[1], kw["BLK_N"]) is pdl
    # the split kernels keep PDL
    assert mm.choose(1, 4096, 4096, "bfloat16", "sm_90a", 132)[1]["PDL"] is True
    assert mm.choose(256, 256, 16384, "bfloat16", "sm_90a", 132)[1]["PDL"] is True


def test_decode_keeps_the_non_persistent_kernel_on_an_unbalanced_grid():
    """Swap-AB with stream-K lost out of sample (lab/stream_k_tail): decode at up to 48
    tokens with many weight tiles keeps the non-persistent swap-AB kernel, balanced or not."""
    from tirx_gemm import matmul as mm
    for mnk in ((2, 10240, 8192), (40, 11008, 4096), (1, 9216, 2304)):
        step, kw = mm.choose(*mnk, "bfloat16", "sm_90a", 132)
        assert kw["SWAP_AB"] and kw["SPLIT_K"] == 1 and "STREAM_K" not in kw, mnk


def test_split_plans_keep_every_unit_resident_and_a_usable_l2_group():
    from tirx_gemm.op import cost_model as cm, rules
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
        assert -(-mnk[2] // 64) // kw["SPLIT_K"] >= cm.SPLIT_MIN_K_STEPS


def test_swap_ab_splits_past_decode():
    """cost_model.best_wide_swap_split as the rules call it: between the decode token tiles
    and WIDE_SWAP_MAX_M tokens a split may run swapped tiles holding the tokens in few pieces of a multiple of
    8 (56 taken as 64); the measured picks (lab/split_k_decode) and the ring rule that keeps 128x256
    units out."""
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    assert [rules.wide_swap_tokens(m) for m in (97, 200, 208, 209, 256, 257, 333, 512)] \
        == [104, 200, 208, 216, 256, 136, 168, 256]
    assert rules.wide_swap_tokens(256, 1) == 128
    assert rules.wide_swap_tokens(110, 1) == 64  # 55 a piece: 56 taken as 64
    assert rules.wide_swap_token_tiles(256) == (256, 128)
    assert cm.ring_stages(128, 208) == 5 and cm.ring_stages(128, 256) == 4
    for mnk, tile in (((200, 3584, 18944), (128, 200, 4)), ((333, 4096, 14336), (128, 168, 2)),
                      ((160, 4096, 14336), (128, 160, 4))):
        step, kw = mm.choose(*mnk, "bfloat16", "sm_90a", 132)
        assert step == "v12" and kw["SWAP_AB"] and kw["PDL"], (mnk, kw)
        assert (kw["BLK_M"], kw["BLK_N"], kw["SPLIT_K"]) == tile, (mnk, kw)
        assert "RUNTIME_NK" not in kw and kw["RUNTIME_M"]
    # a 128x256 unit is no candidate (4 stages): 256x5120x13824 stays data-parallel
    assert cm.best_wide_swap_split(256, 5120, 13824, 132, rules.SWAP_AB_TILES[-1]) is None
    assert "SPLIT_K" not in mm.choose(256, 5120, 13824, "bfloat16", "sm_90a", 132)[1]
    # outside the range: decode's own rules, and no swapped split past 512 tokens
    assert cm.best_wide_swap_split(96, 4096, 14336, 132, rules.SWAP_AB_TILES[-1]) is None
    assert cm.best_wide_swap_split(513, 4096, 14336, 132, rules.SWAP_AB_TILES[-1]) is None


def test_ring_stages_is_the_depth_check_pipe_depth_allows():
    """spec.ring_stages (the builders' default depth and rules.WIDE_SWAP_MIN_STAGES
    test) is the deepest ring helpers.check_pipe_depth accepts."""
    pytest.importorskip("tvm")
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import helpers as H
    for stage, other in ((24576, 0), (43008, 0), (49152, 0), (38912, 32768), (40960, 16384)):
        depth = H.ring_stages(stage, other)
        H.check_pipe_depth(depth, stage, other)
        with pytest.raises(ValueError):
            H.check_pipe_depth(depth + 1, stage, other)
    assert cm.ring_stages(128, 208) == H.ring_stages((128 + 208) * 64 * 2)


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


def test_rule_pingpong_rule():
    """v10 takes plain GEMMs with a short K whose 128x128 tiles give every SM one (the
    hidden epilogue the fitted model cannot see); mid squares, deep K and few tiles stay
    off it, and its fitted figures are a candidate of the model."""
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    assert mm.choose(4096, 4096, 512, "bfloat16", "sm_90a", 132) == (
        "v10", {"dtype": "bfloat16", "SM_COUNT": 132, "RUNTIME_M": True})
    assert rules.wants_pingpong(4096, 4096, 512)
    # short enough for PDL, which saves more than the ping-pong there: v12 with PDL
    assert not rules.wants_pingpong(2048, 2048, 256)
    step, kw = mm.choose(2048, 2048, 256, "float16", "sm_90a", 132)
    assert step == "v12" and kw["PDL"] is True
    assert mm.choose(512, 512, 512, "bfloat16", "sm_90a", 132)[0] != "v10"      # 16 tiles
    # past 512 the rule is off: v10 is the model's candidate in its band (below)
    assert not rules.wants_pingpong(4096, 4096, 1024)
    assert cm.rank(4096, 1024, 512)[0][0] <= cm.PDL_MAX_US
    assert not rules.wants_pingpong(4096, 1024, 512)        # short: v12 with PDL
    assert not rules.wants_pingpong(4096, 1024, 512, 264)   # 256 tiles on 264 SMs
    assert rules.wants_pingpong(4096, 4096 + 128, 512)
    assert cm.V10 in cm.params() and cm.clustered(cm.V10)


def test_v10_is_the_models_candidate_in_its_band_in_v9s_place():
    """Past the short-K rule, v10 is ranked by the model where K is at most
    PINGPONG_BAND_MAX_K and its 128x128 tiles are at least as many as the SMs, and v9 is
    not ranked there; outside the band it is the other way round. Its figures are fitted
    to its measurements in the band only."""
    import json
    from pathlib import Path
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    top = cm.PINGPONG_BAND_MAX_K
    assert cm.PINGPONG_MAX_K < top
    ranked = lambda *s: {c for _, c in cm.rank(*s)}  # noqa: E731
    for shape in ((8192, 2304, 768), (4096, 4096, top), (4096, 4096, cm.PINGPONG_MAX_K + 8)):
        assert cm.pingpong_band(*shape)
        assert cm.V10 in ranked(*shape) and cm.V9 not in ranked(*shape)
    for shape in ((4096, 4096, top + 8), (4096, 4096, 4096), (4096, 4096, cm.PINGPONG_MAX_K),
                  (1024, 2048, 1024)):  # past the band, deep, the rule's K, 128 tiles
        assert not cm.pingpong_band(*shape)
        assert cm.V10 not in ranked(*shape) and cm.V9 in ranked(*shape)
    assert cm.pingpong_band(1024, 2048, 1024, 128)  # 128 tiles on 128 SMs
    # matmul follows the ranking there (measured: lab/cost_model_fit/records/v12_shortk_h200.jsonl)
    assert mm.choose(8192, 2304, 768, "bfloat16", "sm_90a", 132)[0] == "v10"
    assert mm.choose(4096, 4096, top + 64, "bfloat16", "sm_90a", 132)[0] != "v10"
    # the fit reads v10's times in the band only: a refit from the records gives its figures
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "fit_chooser", Path(__file__).parents[1] / "scripts" / "fit_chooser.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    samples, _ = fit.load()
    v10 = [s for s in samples if s[0] == cm.V10]
    inside = [s for s in v10 if cm.pingpong_band(*s[1:4])]
    assert 15 <= len(inside) < len(v10)
    assert fit.fit(inside)[cm.V10] == fit.fit(v10)[cm.V10] == \
        json.loads(cm.PARAMS_FILE.read_text())["candidates"][cm.V10]
    # with a fused epilogue matmul's v10 rule stays rules.epilogue_step's (EPILOGUE_STEP)
    assert mm.choose(4096, 4096, 512, "bfloat16", "sm_90a", 132,
                     epilogue={"BIAS": "float16"})[0] == "v12"


def test_rule_pdl_rule():
    """PDL=True goes to a v12 kernel (one CTA or a pair) the model predicts under
    PDL_MAX_US, with the fitted saving taken off its prediction; never to v9, v10 or a fused
    epilogue."""
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    assert 0.3 < cm.pdl_saving() < 1.5  # fitted: the median saving, microseconds
    step, kw = mm.choose(512, 512, 512, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["PDL"] is True
    pick = cm.best(512, 512, 512)
    assert cm.uses_pdl(pick, 512, 512, 512)
    assert cm.predict(pick, 512, 512, 512) == pytest.approx(
        cm.predict(pick, 512, 512, 512, pdl=False) - cm.pdl_saving())
    # a long one-CTA tile: no start trigger by this rule; pdl_exit's exit trigger
    step, kw = mm.choose(8192, 8192, 8192, "bfloat16", "sm_90a", 132)
    assert step == "v12" and not cm.uses_pdl(cm.best(8192, 8192, 8192), 8192, 8192,
                                                     8192)
    assert (kw["PDL"], kw["PDL_TRIGGER"]) == (True, "exit")
    step, kw = mm.choose(4096, 4096, 512, "bfloat16", "sm_90a", 132)  # v10's short-K rule
    assert step == "v10" and "PDL" not in kw
    step, kw = mm.choose(100, 1000, 2056, "bfloat16", "sm_90a", 132)  # a short pair
    assert step == "v12" and kw["CLUSTER"] == 2 and kw["PDL"] is True
    assert cm.uses_pdl("64x64c2", 100, 1000, 2056)
    step, kw = mm.choose(1000, 1000, 1000, "bfloat16", "sm_90a", 132)  # clusters along M:
    assert kw["CLUSTER"] == 4 and kw["PDL"] is True  # as their one-CTA tile
    assert cm.uses_pdl("64x144", 1000, 1000, 1000)
    assert not cm.uses_pdl("128x256c2", 4095, 4096, 4104)  # a long pair: predicted past
    assert "PDL" not in mm.choose(512, 512, 512, "bfloat16", "sm_90a", 132,
                                  epilogue={"BIAS": "float16"})[1]
    assert not cm.uses_pdl(cm.V9, 512, 512, 512)


def test_matmul_prefetches_descriptors_on_one_cta_kernels_only():
    """matmul builds every one-CTA v12 kernel with PREFETCH_MAPS=True (measured on the H200:
    lab/static_n_k_builds/records/v12_prefetch_h200.jsonl), its CTA pairs and clusters
    without (the builder refuses both)."""
    from tirx_gemm.op import rules
    from tirx_gemm import matmul as mm
    seen = set()
    for mnk in ((1, 4096, 4096), (77, 7168, 2048), (128, 256, 32768), (1024, 1024, 1024),
                (2304, 2304, 2304), (1000, 1000, 1000), (100, 1000, 2056)):
        step, kw = rules.choose(*mnk, "bfloat16", "sm_90a", 132)
        if step != "v12":
            continue
        pair = kw.get("CLUSTER", 1) > 1
        seen.add(pair)
        assert kw.get("PREFETCH_MAPS", False) is (not pair), (mnk, kw)
    assert seen == {True, False}  # both kinds were picked above


def test_rule_tail_tma_rule():
    """matmul asks for TAIL_TMA on a one-CTA tile wider than 64 whose tail's staging tile
    leaves the ring as deep (rules.tail_tma); never on pairs, swap-AB or splits."""
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    assert rules.tail_tma(128, 240) and rules.tail_tma(64, 96)
    assert rules.tail_tma(128, 168) and rules.tail_tma(128, 176)
    # a shared tail over the only staging tile of an odd chunk count: measured level or
    # behind (lab/tail_tma_store/records/v12_tailshare_h200.jsonl), so element stores
    assert not rules.tail_tma(64, 224) and not rules.tail_tma(128, 208)
    assert not rules.tail_tma(128, 256) and not rules.tail_tma(64, 48)
    # 128x168: 5 stages with element stores; a 40-column tail tile of its own per
    # warpgroup would leave 4, so it lies over the last chunk's staging tile: 5
    assert cm.ring_depth(128, 168) == cm.ring_depth(128, 168, True) == 5
    assert cm.staging_bytes(128, 168, True) == cm.staging_bytes(128, 168)
    assert cm.staging_bytes(128, 240, True) == cm.staging_bytes(128, 240) + 2 * 64 * 48 * 2
    step, kw = mm.choose(2049, 3584, 3584, "bfloat16", "sm_90a", 132)
    assert step == "v12" and (kw["BLK_M"], kw["BLK_N"]) == (128, 240) and kw["TAIL_TMA"]
    step, kw = mm.choose(2304, 2304, 2304, "bfloat16", "sm_90a", 132)
    assert (kw["BLK_M"], kw["BLK_N"]) == (128, 168) and kw["TAIL_TMA"]
    for mnk in ((1, 4096, 4096), (1000, 1000, 1000), (6000, 768, 768), (128, 256, 32768)):
        assert "TAIL_TMA" not in mm.choose(*mnk, "bfloat16", "sm_90a", 132)[1], mnk
    # the builder's constants, as the cost model has them
    pytest.importorskip("tvm")
    from tirx_gemm import hopper as W
    from tirx_gemm.steps.sm90a import hgemm_v12 as v12
    assert (cm.RING_DEPTH_MAX, cm.EPI_COLS) == (v12.AUTO_DEPTH_MAX, W.EPI_COLS)


def test_rule_dp_swap_rule():
    """Many tokens on a narrow weight: swap-AB with SWAP_TMA where the model predicts the
    swapped problem more than DP_SWAP_MARGIN faster; never at decode widths or a misaligned
    K; M counts in 16-row blocks (the token tiles' step), so variants serve every M with
    choose's pick."""
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    assert rules.dp_swap_tile(6000, 768, 768) == (128, 144)
    # 3152 = 22 x 143.3: 6 x 22 = 132 swapped tiles; counted in 64-row blocks (3200) the
    # same tile would take 23 token tiles, two waves
    assert rules.dp_swap_rows(3152) == 3152 and rules.dp_swap_rows(3153) == 3168
    assert rules.dp_swap_tile(3152, 768, 768) == (128, 144)
    assert rules.dp_swap_tile(96, 768, 768) is None
    assert rules.dp_swap_tile(6000, 768, 1000) is None  # 2000-byte rows: the pair rule's
    assert rules.dp_swap_tile(4096, 4096, 4096) is None
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
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    assert rules.DP_SWAP_MIN_M == 128
    assert rules.dp_swap_tile(300, 8192, 8192) == (128, 160)
    assert rules.dp_swap_tile(129, 15360, 5120) == (128, 144)
    assert rules.dp_swap_tile(128, 15360, 5120) is None
    step, kw = mm.choose(300, 8192, 8192, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["SWAP_AB"] and kw["SWAP_TMA"] and kw["BLK_N"] == 160
    vs = mm.variants(15360, 5120, "bfloat16", "sm_90a", 132, max_m=640)
    assert any(kw.get("SWAP_TMA") and lo <= 200 for _, kw, lo, _ in vs)
    for step_id, kw, lo, hi in vs:
        for M in range(lo, hi + 1):
            assert mm.choose(M, 15360, 5120, "bfloat16", "sm_90a", 132) == (step_id, kw), M


def test_matmul_asks_for_shift_last_on_every_data_parallel_one_cta_tile():
    """matmul's v12 picks with one CTA per tile and no K split (the plain tiles, swap-AB at
    decode, swap-AB stored by TMA, SPLIT_K=1) take SHIFT_LAST; pairs, K splits, v9 and
    v10 do not have it, nor does a fused epilogue."""
    from tirx_gemm.op import rules
    from tirx_gemm import matmul as mm
    seen = set()
    for N, K in ((4096, 4096), (1000, 1000), (14336, 4096), (256, 32768), (3584, 3584)):
        for step, kw, lo, hi in mm.variants(N, K, "bfloat16", "sm_90a", 132, max_m=4096):
            one = (step == "v12" and kw.get("CLUSTER", 1) == 1
                   and kw.get("SPLIT_K", 1) == 1)
            assert kw.get("SHIFT_LAST", False) == one, (N, K, lo, hi, step, kw)
            seen.add((step, kw.get("CLUSTER", 1), kw.get("SPLIT_K", 1) > 1,
                      kw.get("SWAP_AB", False), one))
    assert {("v12", 1, False, False, True), ("v12", 1, False, True, True),
            ("v12", 2, False, False, False), ("v12", 1, True, True, False)} <= seen, seen
    step, kw = rules.choose(129, 4096, 4096, "bfloat16", "sm_90a", 132)
    assert step == "v12" and kw["SWAP_TMA"] and kw["SHIFT_LAST"]
    for step_id in ("v12", "v10"):
        kw = rules.choose_epilogue_on(step_id, 1000, 4096, 4096, "bfloat16", "sm_90a", 132,
                                   {"BIAS": "float32"})[1]
        assert "SHIFT_LAST" not in kw, (step_id, kw)
    for mnk in ((129, 4096, 4096), (1000, 4096, 4096), (37, 14336, 4096)):
        kw = rules.choose(*mnk, "bfloat16", "sm_90a", 132, epilogue={"BIAS": "float32"})[1]
        assert "SHIFT_LAST" not in kw and kw["BIAS"] == "float32", (mnk, kw)


def test_a_bias_alone_at_decode_rides_the_plain_swap_ab_kernel():
    """Rule swap_ab_bias: a bias alone where the plain GEMM runs the decode rule's
    non-persistent swap-AB kernel (SPLIT_K=1) runs that kernel with the bias in v12's epilogue
    (no SHIFT_LAST): at the decode bias layers lab/serving_stacks timed on an H100 it is the
    kernel timed there (records/swap_bias_between_h100.jsonl, swap_bias_kwargs). Not with an
    activation, nor where the plain GEMM splits K or runs the persistent swap-AB kernel; and
    matmul(..., step="v12") keeps the model-best one-CTA tile, the comparison's other side."""
    from tirx_gemm.op import rules
    bias = {"BIAS": "bfloat16"}
    path = ROOT / "lab/serving_stacks/records/swap_bias_between_h100.jsonl"
    timed = [r for r in map(json.loads, path.read_text().splitlines()) if "swap_bias_kwargs" in r]
    assert {(r["M"], r["N"], r["K"]) for r in timed} == {(M, N, 896) for M in (1, 8, 32)
                                                         for N in (896, 128)}
    for r in timed:
        for card in ("h100", None):
            why = []
            step, kw = rules.choose(r["M"], r["N"], r["K"], "bfloat16", "sm_90a", 132, bias,
                                    why=why, card=card)
            assert (step, kw) == ("v12", r["swap_bias_kwargs"]), (r["M"], r["N"], card, kw)
            _, plain = rules.choose(r["M"], r["N"], r["K"], "bfloat16", "sm_90a", 132, card=card)
            assert kw == {**{k: v for k, v in plain.items() if k != "SHIFT_LAST"}, **bias}
            assert len(why) == 1 and "[swap_ab_bias: lab/serving_stacks]" in why[0], why
        forced = rules.choose_epilogue_on("v12", r["M"], r["N"], r["K"], "bfloat16", "sm_90a",
                                          132, bias)[1]
        assert (forced["BLK_M"], forced["BLK_N"]) == (64, 16) and "SWAP_AB" not in forced
    for mnk, epi, plain_split in (((8, 896, 896), {**bias, "ACT": "silu"}, 1),  # with ACT
                                  ((64, 896, 896), bias, None),   # the persistent swap-AB kernel
                                  ((8, 896, 4864), {**bias, "ACT": "gelu"}, 9)):  # split + ACT
        _, plain = rules.choose(*mnk, "bfloat16", "sm_90a", 132, card="h100")
        assert plain["SWAP_AB"] and plain.get("SPLIT_K") == plain_split, (mnk, plain)
        kw = rules.choose(*mnk, "bfloat16", "sm_90a", 132, epi, card="h100")[1]
        assert "SWAP_AB" not in kw and kw["BIAS"] == "bfloat16", (mnk, kw)


def test_a_bias_alone_where_decode_splits_k_rides_the_split():
    """Rule split_bias: a bias alone where the plain GEMM runs the decode rule's swap-AB K
    split runs that split, the bias added by its reduction (both cards, every K; the plain
    keywords unchanged but the bias). The records' verdicts: the first run (captured splits
    with a fill) fails as a whole and passes at K >= 3072, its held-out check passes; the run
    with the capture arena passes at every K, and so does its held-out short-K check
    (lab/serving_stacks/split_bias_verdict.py)."""
    from tirx_gemm.op import rules
    bias = {"BIAS": "bfloat16"}
    for mnk in ((1, 512, 3584), (32, 512, 3584), (8, 896, 4864), (1, 4608, 18432), (1, 256, 2048),
                (1, 1600, 1600)):
        for card in ("h100", "h200"):
            _, plain = rules.choose(*mnk, "bfloat16", "sm_90a", 132, card=card)
            assert plain["SWAP_AB"] and plain["SPLIT_K"] > 1, (mnk, card, plain)
            why = []
            step, kw = rules.choose(*mnk, "bfloat16", "sm_90a", 132, bias, why=why, card=card)
            assert (step, kw) == ("v12", {**plain, **bias}), (mnk, card, kw)
            assert len(why) == 1 and "[split_bias: lab/serving_stacks]" in why[0], why
    sys.path.insert(0, str(ROOT / "lab" / "serving_stacks"))
    import split_bias_verdict as v
    rec = ROOT / "lab/serving_stacks/records"

    def load(name):
        return [json.loads(x) for x in (rec / name).read_text().splitlines()]
    first, check = load("split_bias_h100.jsonl"), load("split_bias_check_h100.jsonl")
    assert not v.passes(v.tally(first))
    assert v.passes(v.tally([r for r in first if r["K"] >= 3072]))
    assert not v.passes(v.tally(check))  # a check run holds the held-out class alone
    t = v.tally(check)
    assert v.passes(t, ("held_out",)) and min(r["K"] for r in check) >= 3072
    every_k, short_k = load("split_bias_every_k_h100.jsonl"), load("split_bias_short_k_h100.jsonl")
    assert v.passes(v.tally(every_k)) and v.passes(v.tally(short_k), ("held_out",))
    assert max(r["K"] for r in short_k) < 3072
    c = t["held_out"]  # the README quotes the check run's figures as computed here
    text = " ".join((ROOT / "lab/serving_stacks/README.md").read_text().split())
    e, h = v.tally(every_k), v.tally(short_k)["held_out"]  # and the every-K run's
    gm = v.geomean
    assert (f"a geomean of {gm(e['suite']['tile']):.2f} (Qwen2.5-7B's k/v, worst {min(e['suite']['tile']):.2f}) "
            f"and {gm(e['held_out']['tile']):.2f} over the other sizes (worst {min(e['held_out']['tile']):.2f}, "
            f"Qwen2.5-1.5B's q at 32 tokens), the split then an add {gm(e['suite']['add']):.2f} and "
            f"{gm(e['held_out']['add']):.2f} over it; at the eight held-out short-K layers {gm(h['tile']):.2f} "
            f"(worst {min(h['tile']):.2f}), the split then an add {gm(h['add']):.2f}") in text
    quoted = (f"all {len(c['tile'])} held-out cases within two bf16 steps; the bias tile's time over "
              f"the split's at a geomean of {v.geomean(c['tile']):.2f}, worst {min(c['tile']):.2f}")
    assert quoted in text and f"over the split then an add {v.geomean(c['add']):.2f}" in text, quoted


def test_tall_swap_split_plans():
    """Where the 128-row swap-AB split applies: a decode weight of more 64-row tiles than
    half the SMs, S >= 3 units of at least TALL_SPLIT_MIN_K_STEPS K steps; elsewhere the
    plans before it."""
    from tirx_gemm.op import cost_model as cm, rules
    assert rules.split_plan(64, 4608, 36864) == (128, 64, True, 3, None)
    assert rules.split_plan(1, 5120, 13824) == (128, 8, True, 3, None)
    assert rules.split_plan(96, 5120, 27648) == (128, 96, True, 3, None)
    assert rules.split_plan(64, 4608, 4608) is None          # 24 K steps a unit: persistent
    assert rules.split_plan(16, 4800, 1600) == (64, 16, True, 1, 8)   # the unit kernel
    assert rules.split_plan(1, 5120, 17920) == (64, 16, True, 1, 8)   # S would be 2
    assert rules.split_plan(1, 8192, 8192) == (64, 16, True, 1, 8)    # 64 tall tiles: S 2
    assert rules.split_plan(1, 4096, 4096) == (64, 8, True, 2, None)  # the 64-row split


def test_swap_cluster_rule_follows_the_fill_and_the_residency():
    """rules.swap_cluster_rows: clusters of four only past SWAP_NP_MAX_M tokens and within
    the token tiles, on a pool of whole clusters, where the one-CTA grid's last wave is at
    most SWAP_CLUSTER_MAX_FILL full, with the smallest weight tile whose clusters the GPU
    holds at once; matmul then builds that kernel (CLUSTER=4, no SHIFT_LAST, PREFETCH_MAPS
    or STREAM_K, PDL with the start trigger only where a swap-AB kernel is short)."""
    pytest.importorskip("tvm")
    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm import matmul as mm
    cdiv = cm._ceil_div
    assert rules.swap_cluster_rows(48, 4608) is None
    assert rules.swap_cluster_rows(97, 4608) is None
    assert rules.swap_cluster_rows(72, 4608, 130) is None
    seen = set()
    for M in (49, 64, 72, 88, 96):
        for N in range(1024, 32769, 256):
            rows = rules.swap_cluster_rows(M, N)
            bm, bn = rules.swap_ab_tile(M, N)
            tiles = cdiv(N, bm) * cdiv(M, bn)
            full = tiles / (cdiv(tiles, 132) * 132) <= rules.SWAP_CLUSTER_MAX_FILL
            fits = [r for r in (64, 128)
                    if cdiv(N, r * rules.SWAP_CLUSTER) <= rules.SWAP_CLUSTER_MAX_CLUSTERS]
            assert rows == (fits[0] if full and fits else None), (M, N)
            seen.add(rows)
    assert seen == {None, 64, 128}
    step = registry.get("v12", "sm_90a")
    for M, N, K in ((72, 4608, 4096), (88, 10240, 8192), (56, 5632, 2048)):
        kind, kw = mm.choose(M, N, K, "bfloat16", "sm_90a", 132)
        assert kind == "v12" and kw["CLUSTER"] == 4 and kw["SWAP_AB"] and kw["PDL"]
        assert kw["BLK_M"] == rules.swap_cluster_rows(M, N)
        assert not {"SHIFT_LAST", "PREFETCH_MAPS", "STREAM_K"} & set(kw)
        assert ("PDL_TRIGGER" in kw) != rules.swap_pdl(M, N, K)
        step.build_primfunc(M, N, K, **kw)
        assert any(v[1].get("CLUSTER") == 4 and v[2] <= M <= v[3]
                   for v in mm.variants(N, K, "bfloat16", max_m=128))



def test_choose_explain_and_the_cli_all_walk_the_one_rule_list(monkeypatch, capsys):
    """tirx_gemm.op.rules.RULES is the one list: a marker rule put first changes what
    choose returns, what explain prints and what `tirx-gemm choose` prints."""
    from tirx_gemm.cli import main
    from tirx_gemm.op import rules
    from tirx_gemm import matmul as mm
    marker = rules.Rule("marker", rules.PICK, "cost_model_fit",
                        lambda s, p: s.M == 4096,
                        lambda s, p: rules.Plan("v9", {"MARKER": True}, "marker"),
                        lambda s, p: "the marker rule picked it")
    before = mm.choose(4096, 4096, 4096, "bfloat16")
    monkeypatch.setattr(rules, "RULES", (marker,) + rules.RULES)
    assert mm.choose(4096, 4096, 4096, "bfloat16") == ("v9", {"MARKER": True}) != before
    text = mm.explain(4096, 4096, 4096, "bfloat16")
    assert text.splitlines()[3] == "  - the marker rule picked it [marker: lab/cost_model_fit]"
    assert main(["choose", "4096,4096,4096", "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.strip() == text


def test_every_rule_names_its_study_and_is_reachable():
    """Each rule has a unique name, a kind, and a study folder that exists under lab/; a
    walk over the suites and the decode / prefill range applies every rule at least once."""
    import json
    from tirx_gemm.op import rules
    names = [r.name for r in rules.RULES]
    assert len(set(names)) == len(names)
    assert {r.kind for r in rules.RULES} == {rules.PICK, rules.ADJUST}
    for r in rules.RULES:
        assert (ROOT / "lab" / r.study).is_dir(), (r.name, r.study)
    seen = set()
    shapes = {(e["M"], e["N"], e["K"]) for name in ("models", "heldout")
              for e in json.loads((ROOT / f"tirx_gemm/op/suites/{name}.json").read_text())["shapes"]}
    shapes |= {(m, n, k) for m in (1, 8, 64, 72, 90, 200, 1000, 6000, 8192)
               for n, k in ((4096, 4096), (768, 768), (2304, 768), (4096, 512), (22016, 4096),
                            (1000, 1000), (128, 65536), (2304, 2304))}
    for M, N, K in shapes:
        for arch in ("sm_90a", "sm_100a"):
            shape = rules.Shape(M, N, K, "bfloat16", arch, 132 if arch == "sm_90a" else 148, {})
            seen |= {r.name for r, _ in rules.walk(shape)[1]}
    for mnk in ((1000, 4096, 4096), (8, 896, 896), (1, 512, 3584)):  # a bias; on the decode
        # swap-AB kernel; on its K split
        epi = rules.Shape(*mnk, "bfloat16", "sm_90a", 132, {"BIAS": "float16"})
        seen |= {r.name for r, _ in rules.walk(epi)[1]}
    assert seen == set(names) - {"epilogue_on_v10"}  # EPILOGUE_STEP is "v12" (not measured)


C4MIS = [(s["M"], s["N"], s["K"]) for s in json.loads(
    (ROOT / "lab/cta_clusters/suites/c4mis.json").read_text())["shapes"]]


def test_misaligned_rows_run_clusters_of_four_along_m_where_they_fit():
    """At a misaligned K, where the pair rule would pair CTAs, clusters of four along M share
    the B tile instead (lab/cta_clusters, measured on an H100): the model's fastest one-CTA
    tile with at least four row tiles whose clusters number at most the H200's 30, without
    PREFETCH_MAPS, TAIL_TMA or SHIFT_LAST; the pairs stay where none fits or the SMs are not
    a multiple of four; explain says why, with the figure and the card."""
    from tirx_gemm.op import cost_model as cm, rules
    for M, N, K in C4MIS:
        for dtype in ("float16", "bfloat16"):
            step, kw = rules.choose(M, N, K, dtype, "sm_90a", 132, card="h200")
            cand = rules.misaligned_cluster_tile(M, N, K, 132)
            bm, bn, _ = cm.tile(cand)
            assert step == "v12" and (kw["BLK_M"], kw["BLK_N"], kw["CLUSTER"]) == (bm, bn, 4)
            assert not {"PREFETCH_MAPS", "TAIL_TMA", "SHIFT_LAST", "RUNTIME_NK"} & set(kw)
            assert -(-M // bm) >= 4 and rules.m_clusters(M, N, cand) <= 30
            fits = [(cm.predict(c, M, N, K), c) for c in cm.params() if not cm.clustered(c)
                    and -(-M // cm.tile(c)[0]) >= 4 and rules.m_clusters(M, N, c) <= 30]
            assert min(fits)[1] == cand
    assert rules.choose(1000, 1000, 1000, "float16", "sm_90a", 132)[1]["BLK_N"] == 144
    # fewer than four row tiles of every fitting tile: the pair; 114 SMs: no clusters of four
    assert rules.misaligned_cluster_tile(100, 1000, 2056, 132) is None
    assert rules.choose(100, 1000, 2056, "float16", "sm_90a", 132)[1]["CLUSTER"] == 2
    assert rules.misaligned_cluster_tile(1000, 1000, 1000, 114) is None
    assert rules.choose(1000, 1024, 776, "float16", "sm_90a", 114)[1].get("CLUSTER") != 4
    assert "CLUSTER" not in rules.choose(1024, 1024, 1024, "float16", "sm_90a", 132)[1]
    text = rules.explain(1000, 1000, 1000, "bfloat16", card="h200")
    line = next(x for x in text.splitlines() if "misaligned_rows_clusters" in x)
    assert "clusters of 4 along M share the B tile, on 64x144" in line
    assert "1.13x" in line and "on an H100" in line and "lab/cta_clusters]" in line


def test_the_chooser_takes_the_cards_bandwidth_and_sms():
    """tirx_gemm.op.cards: the H200 (the fitted card) scales the model's HBM rate by exactly
    1, so its picks are the fitted model's; the H100's 3.35 TB/s against 4.8 raises every HBM
    floor; explain says which card it assumed and where from; names are checked."""
    from tirx_gemm.op import cards, cost_model as cm, rules
    h100, h200 = cards.CARDS["h100"], cards.CARDS["h200"]
    assert (h200.sms, h200.l2_bytes, h200.hbm_tb_s) == (132, 60 << 20, 4.8)
    assert (h100.sms, h100.l2_bytes, h100.hbm_tb_s) == (132, 50 << 20, 3.35)
    assert cards.bandwidth_scale(h200) == 1.0 and cards.resolve("H100") is h100
    assert cards.for_arch("h100", "sm_90a", None) == (h100, 132)
    assert cards.for_arch("h200", "sm_100a", None)[1] == 148
    with pytest.raises(ValueError, match="card=.a100.: choose one of h200, h100, auto"):
        rules.choose(64, 4096, 4096, card="a100")
    floor = cm.hbm_floor(4096, 4096, 4096)
    with cm.bandwidth_scale(cards.bandwidth_scale(h100)):
        slower = cm.hbm_floor(4096, 4096, 4096)
    fit = cm._document()["split"]
    assert (slower - fit["f"]) == pytest.approx((floor - fit["f"]) * 4.8 / 3.35)
    assert cm.hbm_floor(4096, 4096, 4096) == floor  # back to the fitted card's
    grid = [(m, n, k) for m in (1, 7, 16, 33, 64, 100, 128, 300, 777, 1000, 2048, 6000)
            for n, k in ((4096, 4096), (1000, 3000), (14336, 4096), (512, 24576), (2304, 768))]
    changed = 0
    for M, N, K in grid:
        fitted = rules.choose(M, N, K, "bfloat16", "sm_90a", 132, card="h200")
        assert fitted == rules.choose(M, N, K, "bfloat16", "sm_90a", 132, card=h200)
        with cm.bandwidth_scale(1.0):  # the model as fitted, no card asked
            assert rules.walk(rules.Shape(M, N, K, "bfloat16", "sm_90a", 132, {}))[0].kw \
                == fitted[1]
        changed += rules.choose(M, N, K, "bfloat16", "sm_90a", 132, card="h100") != fitted
    assert changed  # the H100's slower HBM moves some memory-bound picks
    text = rules.explain(64, 4096, 4096, "bfloat16", card="h100")
    assert text.splitlines()[2] == ("  card: NVIDIA H100 80GB HBM3: 132 SMs, 50 MiB L2, "
                                    "3.35 TB/s HBM (table)")
    assert "card: NVIDIA H200: 132 SMs, 60 MiB L2, 4.8 TB/s" in rules.explain(64, 64, 64,
                                                                             card="h200")


def test_choose_and_explain_take_torch_dtypes_and_their_names():
    """A torch dtype is taken by its name (one place: keywords.dtype_name), a string without
    torch; anything else is still refused."""
    from tirx_gemm.op import keywords, rules
    assert rules.choose(1000, 1000, 1000, torch.bfloat16) \
        == rules.choose(1000, 1000, 1000, "bfloat16")
    assert rules.explain(64, 4096, 4096, torch.float16).startswith("64x4096x4096 float16 on")
    assert keywords.dtype_name("bfloat16") == "bfloat16"
    assert keywords.dtype_name(torch.float16) == "float16"
    with pytest.raises(ValueError, match="float32"):
        rules.choose(64, 64, 64, torch.float32)


def test_the_default_card_is_the_fitted_one_even_with_a_gpu(monkeypatch):
    """matmul asks for the kernels an exported bundle holds: with no card named, the chooser
    takes the fitted card (the H200) whatever GPU torch sees; "auto" reads the GPU."""
    import sys
    import types

    from tirx_gemm.op import cards
    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132,
                                  L2_cache_size=50 << 20)
    cuda = types.SimpleNamespace(is_available=lambda: True, current_device=lambda: 0,
                                 get_device_properties=lambda i: props)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert cards.resolve(None) is cards.CARDS["h200"]
    auto = cards.resolve("auto")
    assert (auto.name, auto.hbm_tb_s, auto.source) == (
        "NVIDIA H100 80GB HBM3", 3.35, "device properties; bandwidth from the table")


def test_every_rule_is_named_in_its_studys_readme():
    """A rule's study (``Rule.study``) and the study's README say the same thing: the README
    names every rule that came from it, so its decision cannot drift from RULES."""
    from tirx_gemm.op.rules import RULES
    missing = [f"{r.name} (lab/{r.study}/README.md)" for r in RULES
               if f"`{r.name}`" not in (ROOT / "lab" / r.study / "README.md").read_text()]
    assert not missing, "rules their study's README does not name: " + ", ".join(missing)


def test_misaligned_slowdowns_are_the_studys_figures():
    """cost_model.MISALIGNED_SLOWDOWN is what lab/cost_model_error_classes/model_error.py
    gives from the H200's records (the model / measured of aligned one-CTA kernels over that
    of misaligned ones), to two places; the H100's records show the same order, one-CTA
    tiles slowed far more than pairs."""
    from tirx_gemm.op import cost_model as cm
    study = ROOT / "lab" / "cost_model_error_classes" / "records"
    for card in ("h200", "h100"):
        groups = {(g["rows"], g["kind"]): g for g in map(json.loads, (
            study / f"model_error_{card}.jsonl").read_text().splitlines())}
        one, pair = (groups[("misaligned", k)]["slowdown"] for k in ("one_cta", "pair"))
        assert one > pair > 1.0, card
        if card == "h200":
            assert cm.MISALIGNED_SLOWDOWN == {"one_cta": round(one, 2), "pair": round(pair, 2)}
    for card in ("h200", "h100"):
        out = subprocess.run([sys.executable, "lab/cost_model_error_classes/model_error.py",
                              "--card", card, "--check"], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def test_a_misaligned_k_ranks_tiles_as_the_rules_run_them():
    """At a K whose rows are not whole 128-byte lines, the pick rule misaligned_rows_model
    ranks one-CTA tiles by the model times the one-CTA slowdown and tiles whose pair is in
    the menu as that pair (times the pair slowdown), v9 with its handicap: 6000x1000x3000
    runs 64x256 as a pair where the plain model took the one-CTA 128x200 (85.2 us on an
    H100 against torch's 62.3); 5000^3 runs 128x192 as a pair, not the one-CTA 128x224; an
    aligned K keeps the plain model's pick; where clusters of four fit, a pair's tile is
    picked so that they run."""
    from tirx_gemm.op import cost_model as cm, rules
    step, kw = rules.choose(6000, 1000, 3000, "float16")
    assert step == "v12" and (kw["BLK_M"], kw["BLK_N"], kw["CLUSTER"]) == (64, 256, 2)
    step, kw = rules.choose(5000, 5000, 5000, "bfloat16")
    assert (kw["BLK_M"], kw["BLK_N"], kw["CLUSTER"]) == (128, 192, 2)
    step, kw = rules.choose(6000, 1000, 3072, "float16")
    assert (kw["BLK_M"], kw["BLK_N"], kw.get("CLUSTER", 1)) == (128, 200, 1)
    ranked = cm.rank_misaligned(6000, 1000, 3000)
    t, cand, runs = ranked[0]
    assert (cand, runs) == ("64x256", "64x256c2")
    assert t == pytest.approx(cm.predict("64x256c2", 6000, 1000, 3000)
                              * cm.MISALIGNED_SLOWDOWN["pair"])
    one = next(r for r in ranked if r[1] == "128x200")
    assert one[2] == "128x200" and one[0] == pytest.approx(
        cm.predict("128x200", 6000, 1000, 3000) * cm.MISALIGNED_SLOWDOWN["one_cta"])
    assert all(cm.clustered(r) and c != r for _, c, r in
               cm.rank_misaligned(1500, 1000, 1000, 132, pairs_only=True))
    step, kw = rules.choose(1500, 1000, 1000, "float16")
    assert kw["CLUSTER"] == 4  # the one-CTA 64x208 it ran before, as clusters of four
    text = rules.explain(6000, 1000, 3000)
    line = next(x for x in text.splitlines() if "misaligned_rows_model" in x)
    slow = cm.MISALIGNED_SLOWDOWN
    assert f"{slow['one_cta']:.2f}x" in line and f"{slow['pair']:.2f}x" in line and "64x256c2" in line
    assert "lab/cost_model_error_classes]" in line
    assert "misaligned_rows_model" not in rules.explain(6000, 1000, 3072)
    out = subprocess.run([sys.executable, "lab/cost_model_error_classes/error_classes.py",
                          "readme", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr  # the study's tables are its records'


def test_the_h100_card_runs_short_two_way_decode_splits_unsplit():
    """On the H100 a split in two at up to 48 tokens keeps units of at least 48 K steps, else
    the non-persistent swap-AB kernel runs (lab/split_k_decode); the H200's picks stay."""
    from tirx_gemm.op import cards, rules
    pair = cards.CARDS["h100"].decode_pair_min_k_steps
    assert rules.split_plan(5, 4096, 4096, 132, pair) == (64, 16, True, 1, rules.SWAP_NP_DEPTH)
    assert rules.split_plan(5, 4096, 4096, 132, pair, 12) == (64, 16, True, 1, 12)
    assert rules.split_plan(5, 4096, 4096) == (64, 8, True, 2, None)           # the H200: 32 steps
    assert rules.split_plan(2, 4096, 14336, 132, pair) == (64, 8, True, 2, None)  # 112 steps
    assert rules.split_plan(5, 1024, 4096, 132, pair)[3] == 8                  # k/v: stays
    assert rules.split_plan(53, 4096, 3584, 132, pair)[3] == 2                 # past 48 tokens
    _, kw = rules.choose(5, 4096, 4096, "bfloat16", card="h100")
    assert kw["SPLIT_K"] == 1 and kw["PIPE_DEPTH"] == cards.CARDS["h100"].decode_np_deep_ring
    for mnk in ((5, 4096, 4096), (45, 2816, 2048), (2, 4096, 14336), (5, 1024, 4096)):
        assert rules.choose(*mnk, "bfloat16") == rules.choose(*mnk, "bfloat16", card="h200")


def test_the_h100_card_deepens_the_decode_ring_where_its_runs_gained():
    """The H100 card's non-persistent swap-AB kernel takes a 12-stage ring at weights of
    36-64 tiles of 64 rows (lab/decode_ring_depth: both runs' verdicts pass there), keeps 8
    at 80 tiles (slower there) and under 36 (not timed); the H200 card keeps 8 throughout.
    The verdicts are computed from the records: the second rule's scope passes, the first
    rule (every size) does not."""
    from tirx_gemm.op import cards, rules
    assert cards.CARDS["h100"].decode_np_deep_ring == 12 and cards.CARDS["h200"].decode_np_deep_ring is None
    for (M, N, K), depth in (((1, 3584, 3584), 12), ((8, 2304, 2048), 12), ((40, 4096, 3072), 12),
                             ((1, 5120, 5120), 8), ((1, 896, 896), 8), ((1, 2048, 2304), None)):
        kw = rules.choose(M, N, K, "bfloat16", card="h100")[1]
        assert kw.get("PIPE_DEPTH") == depth, (M, N, K, kw)
        assert rules.choose(M, N, K, "bfloat16", card="h200")[1].get("PIPE_DEPTH") in (8, None)
    sys.path.insert(0, str(ROOT / "lab" / "decode_fixed_cost"))
    import verdict
    rec = ROOT / "lab/decode_ring_depth/records"
    counts = {}
    for timing in ("between", "b2b"):
        first = [json.loads(x) for x in (rec / f"ring_depth_{timing}_h100.jsonl").read_text().splitlines()]
        check = [json.loads(x) for x in (rec / f"ring_depth_check_{timing}_h100.jsonl").read_text().splitlines()]
        assert not verdict.passes(verdict.tally(first)[0]["PIPE_DEPTH=12"])
        assert verdict.passes(verdict.tally([r for r in first if r["N"] <= 4096])[0]["PIPE_DEPTH=12"])
        held = verdict.tally(check)[0]["PIPE_DEPTH=12"]
        assert not verdict.passes(held) and verdict.passes(held, ("held_out",))
        counts[timing] = (held["held_out"][:2], verdict.tally(first)[0]["PIPE_DEPTH=12"]["suite"][:2])
    # the README quotes the counts as computed here
    text = " ".join((ROOT / "lab/decode_ring_depth/README.md").read_text().split())
    (n, between), (n2, b2b) = counts["between"][0], counts["b2b"][0]
    assert f"at {between} of {n} with a kernel between and {b2b} of {n2} back to back" in text
    (n_suite, faster), other = counts["between"][1], counts["b2b"][1]
    assert other == (n_suite, faster) and f"at {faster} of {n_suite} suite cases in both timings" in text


def test_the_h100_decode_split_verdict_is_computed_from_its_records():
    """decode_cards.py verdict gives the per-case record the README quotes, and the H100's
    rule moves exactly the cases marked pair_short, each of which ran faster without the split."""
    from tirx_gemm.op import rules
    sys.path.insert(0, str(ROOT / "lab" / "split_k_decode"))
    import decode_cards
    rows = decode_cards.verdict_rows([ROOT / "lab/split_k_decode/records/decode_cards_h100.jsonl"])
    kept = [json.loads(x) for x in (ROOT / "lab/split_k_decode/records/"
                                    "decode_cards_verdict_h100.jsonl").read_text().splitlines()]
    assert rows == kept
    moved = {(r["M"], r["N"], r["K"]) for r in rows
             if rules.choose(r["M"], r["N"], r["K"], r["dtype"], card="h100")
             != rules.choose(r["M"], r["N"], r["K"], r["dtype"])}
    short = {(r["M"], r["N"], r["K"]) for r in rows if r["pair_short"]}
    assert moved == short and len(short) == 7
    assert all(r["fallback_gain"] < 1 for r in rows if r["pair_short"])


def test_the_cards_decode_split_floors_are_the_rules_own_constants():
    """cards.py writes its decode-split floors as numbers (it imports no chooser module): the
    default (the H200, whose picks the per-card rule must leave as they were) is the cost
    model's floor for any split, and the H100's is the 128-row split's floor it was set to."""
    from tirx_gemm.op import cards, cost_model as cm, rules
    assert cards.Card.decode_pair_min_k_steps == cm.SPLIT_MIN_K_STEPS
    assert cards.CARDS["h200"].decode_pair_min_k_steps == cm.SPLIT_MIN_K_STEPS
    assert cards.CARDS["h100"].decode_pair_min_k_steps == rules.TALL_SPLIT_MIN_K_STEPS


def test_the_studies_state_the_decode_bounds_the_code_holds():
    """One home per fact: the READMEs that decided split_bias (no K bound) and the H100 card's
    deeper ring quote what the code holds (a change of one fails here)."""
    from tirx_gemm.op import cards, rules
    assert not hasattr(rules, "SPLIT_BIAS_MIN_K")  # the bound went: the study says so
    serving = " ".join((ROOT / "lab/serving_stacks/README.md").read_text().split())
    assert "split_bias` at every K" in serving
    ring = (ROOT / "lab/decode_ring_depth/README.md").read_text()
    tiles = cards.DEEP_RING_TILES
    assert f"decode_np_deep_ring={cards.CARDS['h100'].decode_np_deep_ring}" in ring
    assert f"{tiles.start}-{tiles.stop - 1} tiles" in ring and "cards.DEEP_RING_TILES" in ring
