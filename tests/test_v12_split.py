"""sm_90a v12's SPLIT_K: a CTA per unit; S > 1 with v11's spread reduction."""
import pytest

from tirx_gemm import registry, splitk


def _v12():
    pytest.importorskip("tvm")
    return registry.get("v12", "sm_90a")


def test_l2_group_never_divides_the_split():
    for s in range(2, 257):
        g = splitk.l2_group_for(s)
        assert s % g != 0 and g in (8, 7, 5, 3)
    assert splitk.l2_group_for(3) == 8 and splitk.l2_group_for(16) == 7


def test_workspace_follows_the_mma_tiles():
    """WS (S, tiles, BLK_M*BLK_N) and two counters per 64-row half; swap-AB counts D's
    transpose's tiles (BLK_M over N, BLK_N over the tokens); S = 1 takes none; STREAM_K
    keeps its own."""
    ws = dict((n, s) for n, s, _ in splitk.workspace_specs_v12(
        128, 128, 65536, {"BLK_M": 64, "BLK_N": 32, "SPLIT_K": 16}))
    assert ws == {"WS": (16, 8, 2048), "CNT": (16,)}
    ws = dict((n, s) for n, s, _ in splitk.workspace_specs_v12(
        32, 4096, 14336, {"BLK_M": 128, "BLK_N": 32, "SWAP_AB": True, "SPLIT_K": 4}))
    assert ws == {"WS": (4, 32, 4096), "CNT": (128,)}
    assert splitk.workspace_specs_v12(2048, 2048, 256, {"SPLIT_K": 1}) == ()
    assert splitk.workspace_specs_v12(1024, 1024, 1024, {"STREAM_K": True}) == \
        registry.get("v12", "sm_90a").workspace_specs(1024, 1024, 1024, {"STREAM_K": True})


def test_split_kernel_grid_and_operands():
    """A CTA per unit: S x tiles CTAs (a run-time M: the grid from M); WS, CNT after D
    exactly as workspace_specs_v12 sizes them; S = 1 has no workspace and no counting."""
    step = _v12()
    s = step.build_primfunc(128, 128, 65536, BLK_M=64, BLK_N=32, SPLIT_K=16).script()
    assert 'WS: T.Buffer((16, 8, 2048), "float32")' in s and 'CNT: T.Buffer((16,), "int32")' in s
    assert "T.cta_id([128])" in s
    assert '"acq_rel", "gpu", "global", "add"' in s  # the arrival count
    one = step.build_primfunc(2048, 2048, 256, BLK_M=64, BLK_N=32, SPLIT_K=1,
                              RUNTIME_M=True).script()
    assert "WS" not in one and "acq_rel" not in one
    assert "T.cta_id([(M + 64 - 1) // 64 * 64])" in one
    rt = step.build_primfunc(32, 4096, 14336, BLK_M=128, BLK_N=32, SWAP_AB=True, SPLIT_K=4,
                             RUNTIME_M=True, L2_GROUP=7).script()
    assert 'WS: T.Buffer((4, "WS_TILES", 4096), "float32")' in rt
    assert "T.cta_id([128 * ((M + 32 - 1) // 32)])" in rt


def test_a_split_kernel_takes_the_bias_after_its_reduction():
    """SPLIT_K > 1 with a BIAS: the bias is an operand between D and the workspace,
    read only by the reduction (the units publish plain partial sums), and the swap-AB split
    reads it along D's columns, the tile's rows."""
    step = _v12()
    s = step.build_primfunc(1, 512, 3584, BLK_M=64, BLK_N=8, SWAP_AB=True, SPLIT_K=7,
                            RUNTIME_M=True, BIAS="bfloat16").script()
    params = s[s.index("def kernel("):s.index("):", s.index("def kernel("))]
    assert params.index("D: T.Buffer") < params.index("bias: T.Buffer") < params.index("WS:")
    assert params.index("WS:") < params.index("CNT:")
    assert s.count("bias[") >= 1
    plain = step.build_primfunc(1, 512, 3584, BLK_M=64, BLK_N=8, SWAP_AB=True, SPLIT_K=7,
                                RUNTIME_M=True).script()
    assert "bias" not in plain


def test_a_short_unit_gets_a_short_ring():
    """SPLIT_K with a static K: the default ring holds no more stages than a unit's K steps
    (two at least), so that several CTAs fit on an SM; the persistent kernel's fills SMEM."""
    step = _v12()
    import re
    depths = {}
    for name, kw in (("one", {"SPLIT_K": 1}), ("two", {"SPLIT_K": 2}), ("walk", {})):
        s = step.build_primfunc(2048, 2048, 256, BLK_M=64, BLK_N=64, SM_COUNT=4096,
                                **kw).script()
        depths[name] = int(re.search(r"Asmem = T.decl_buffer\(\((\d+), 64, 64\)", s)[1])
    assert depths["one"] == 4 and depths["two"] == 2 and depths["walk"] > 4, depths


@pytest.mark.parametrize("kw,match", [
    ({"SPLIT_K": 2, "STREAM_K": True}, "SPLIT_K takes no STREAM_K or CLUSTER > 1"),
    ({"SPLIT_K": 2, "CLUSTER": 2}, "SPLIT_K takes no STREAM_K or CLUSTER > 1"),
    ({"SPLIT_K": 2, "ACT": "relu"}, "takes a BIAS alone as its epilogue"),
    ({"SPLIT_K": 2, "BIAS": "bfloat16", "ACT": "silu"}, "takes a BIAS alone as its epilogue"),
    ({"SPLIT_K": 2, "BIAS": "float32", "OUT_DTYPE": "float32"}, "takes a BIAS alone"),
    ({"SPLIT_K": 2, "BIAS": "float32", "BIAS_SMEM": True}, "takes a BIAS alone"),
    ({"SPLIT_K": 2, "RUNTIME_NK": True}, r"takes a BIAS alone as its epilogue \(plain\) and no RUNTIME_NK"),
    ({"SPLIT_K": 0}, "SPLIT_K=0 must be positive"),
    ({"SPLIT_K": 16, "RUNTIME_M": True}, "needs an L2_GROUP that does not divide it"),
    ({"SPLIT_K": 64}, "needs tiles x SPLIT_K <= SM_COUNT"),
    ({"SPLIT_K": 2000}, "more than the 1024 K tiles"),
])
def test_refusals_in_one_line(kw, match):
    step = _v12()
    with pytest.raises(ValueError, match=match) as exc:
        step.build_primfunc(256, 256, 65536, BLK_M=64, BLK_N=64, **kw)
    assert "\n" not in str(exc.value)


def test_band_partition_covers_each_chunk_once():
    """Split s of S sums chunks [s*C//S, (s+1)*C//S) of each half: together every chunk of
    the half once, whatever S (the kernel's q0, q1)."""
    for chunks in (64 * 8 // 4, 64 * 256 // 4, 64 * 48 // 4):
        for S in (2, 3, 4, 5, 11, 16, 22, 64, 128):
            got = [q for s in range(S) for q in range(s * chunks // S, (s + 1) * chunks // S)]
            assert got == list(range(chunks))


def test_the_split_model_keeps_its_plans_resident_and_rates_what_was_fitted():
    """cm.best_split: one wave of units (tiles x S <= SMs) of at least
    SPLIT_MIN_K_STEPS K steps; chooser_h200.json's fit is no worse than it says on the
    sweep it came from (lab/cost_model_fit/records/v12_split_h200.jsonl), which scripts/fit_chooser.py
    --check recomputes."""
    import json
    import math
    from pathlib import Path

    from tirx_gemm.op import cost_model as cm, rules
    for mnk in ((128, 128, 65536), (256, 256, 16384), (128, 4096, 14336), (96, 512, 65536)):
        t, bm, bn, s = cm.best_split(*mnk)
        tiles = -(-mnk[0] // bm) * -(-mnk[1] // bn)
        assert tiles * s <= 132 and -(-mnk[2] // 64) // s >= cm.SPLIT_MIN_K_STEPS
    assert cm.best_split(4096, 4096, 4096) is None  # tiles fill the SMs: no split
    fit = json.loads(cm.PARAMS_FILE.read_text())["split"]
    errs = []
    root = Path(__file__).resolve().parents[1]
    for line in (root / "lab/cost_model_fit/records/v12_split_h200.jsonl").read_text().splitlines():
        r = json.loads(line)
        for name, c in r["candidates"].items():
            if name.startswith("np") or not c.get("ok"):
                continue
            tile, s = name.rsplit("s", 1)
            bm, bn, _ = cm.tile(tile.rstrip("w"))
            if int(s) > 1:
                p = cm.predict_split(bm, bn, int(s), r["M"], r["N"], r["K"])
                errs.append(p / (c["ms"] * 1e3) - 1)
    assert len(errs) == fit["kernels"]
    assert math.isclose(math.sqrt(sum(e * e for e in errs) / len(errs)), fit["rms_rel_err"],
                        abs_tol=1e-3)


def test_split_count_prefers_a_divisor_of_the_k_steps():
    from tirx_gemm.op import cost_model as cm, rules
    assert cm.split_count(33, 1024) == 32      # 1024 K steps: 32 units of 32
    assert cm.split_count(66, 1024) == 64
    assert cm.split_count(22, 192) == 16       # 12 each; 16 >= 22 / 2
    assert cm.split_count(13, 224) == 8        # 224 = 28 x 8; 8 >= 13 / 2
    assert cm.split_count(11, 13) == 11        # 13 is prime: no divisor >= 5.5
    assert cm.split_count(1, 64) == 1


def test_the_split_cap_is_the_spread_reductions():
    """cost_model (a shared layer) may not import splitk (authoring): the cap is written in
    both, and this keeps them one fact."""
    from tirx_gemm.op import cost_model as cm, rules
    assert cm.SPLIT_MAX == splitk.MAX_SPLIT_SPREAD


def test_a_split_kernel_met_at_an_m_whose_units_cannot_all_be_resident_is_refused():
    # built with M at run time, a K-split kernel sized for few tokens meets 333 of them:
    # 6 x 32 tiles x 4 splits cannot all be resident on 132 SMs, and the spread reduction
    # would wait forever (it hung on an H200); sizing its workspace refuses it instead
    kw = {"BLK_M": 64, "BLK_N": 128, "SPLIT_K": 4, "SM_COUNT": 132, "RUNTIME_M": True}
    with pytest.raises(ValueError, match=r"768 units, more than its 132 resident CTAs"):
        splitk.workspace_specs_v12(333, 4096, 14336, kw)
    assert splitk.workspace_specs_v12(32, 4096, 14336, kw)[1] == ("CNT", (2 * 32,), "int32")
