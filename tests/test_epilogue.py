"""tirx_gemm/epilogue.py: keywords, numpy references, the fused-weight layout, tolerances
(CPU only, numpy; no build)."""
import math
from pathlib import Path

import numpy as np
import pytest

from tirx_gemm import epilogue as E
from tirx_gemm import numerics


def test_validate_defaults_and_plain():
    assert E.validate({}) == E.PLAIN
    assert E.is_plain({"BLK_N": 128})
    assert E.is_plain({"BIAS": None, "ACT": None})
    assert not E.is_plain({"ACT": "relu"})
    assert E.epilogue_kwargs({"BIAS": "float32", "ACT": None, "BLK_M": 64}) == \
        {"BIAS": "float32"}
    assert E.tag({"SWIGLU": True}) == "swiglu"
    assert E.tag({"BIAS": "bfloat16", "ACT": "gelu", "OUT_DTYPE": "float32"}) == \
        "bias_bfloat16+gelu+out_float32"
    assert E.tag({}) == "plain"


@pytest.mark.parametrize("kw, words", [
    ({"BIAS": True}, "name the bias dtype"),
    ({"BIAS": "int8"}, "BIAS='int8'"),
    ({"ACT": "tanh"}, "ACT='tanh'"),
    ({"OUT_DTYPE": "float16"}, "OUT_DTYPE='float16'"),
    ({"SWIGLU": True, "ACT": "relu"}, "takes no BIAS or ACT"),
    ({"SWIGLU": True, "BIAS": "float16"}, "takes no BIAS or ACT"),
])
def test_validate_refuses_in_one_line(kw, words):
    with pytest.raises(ValueError) as e:
        E.validate(kw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_validate_types():
    with pytest.raises(TypeError, match="True or False"):
        E.validate({"SWIGLU": 1})
    with pytest.raises(TypeError, match="dict"):
        E.validate(["ACT"])


def test_activations_match_their_definitions():
    x = np.array([-30.0, -3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.3994, 8.0])
    assert np.array_equal(E.act_np(x, "relu"), np.maximum(x, 0))
    gelu = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    np.testing.assert_allclose(E.act_np(x, "gelu"), gelu, rtol=1e-15, atol=1e-300)
    np.testing.assert_allclose(E.act_np(x, "silu"), x / (1 + np.exp(-x)), rtol=1e-15)
    # the tanh form stays within 1e-3 of the erf form on [-3, 3] (its known accuracy)
    t = np.linspace(-3, 3, 601)
    assert np.max(np.abs(E.act_np(t, "gelu_tanh") - E.act_np(t, "gelu"))) < 1e-3
    with pytest.raises(ValueError, match="act='elu'"):
        E.act_np(x, "elu")


def test_slope_bounds_hold():
    """SLOPE (used by tolerance) bounds each activation's derivative on a fine grid."""
    x = np.linspace(-12, 12, 240001)
    for act in E.ACTIVATIONS:
        d = np.abs(np.diff(E.act_np(x, act)) / np.diff(x))
        assert d.max() <= E.SLOPE[act], (act, d.max())


def test_apply_np_bias_then_act_in_fp32():
    acc = np.array([[1.0, -2.0, 0.5]], dtype=np.float32)
    bias = np.array([0.5, 1.0, -1.0], dtype=np.float16)
    out = E.apply_np(acc, bias, "relu")
    assert out.dtype == np.float32
    assert out.tolist() == [[1.5, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"must be \(3,\)"):
        E.apply_np(acc, np.zeros(4), None)


def test_interleave_layout_and_inverse():
    N, K = 16, 3
    g = np.arange(N * K, dtype=np.float32).reshape(N, K)
    u = -g - 1
    f = E.interleave_gate_up_np(g, u)
    assert f.shape == (2 * N, K)
    G = E.SWIGLU_GROUP
    for n in range(N):
        t, r = divmod(n, G)
        assert np.array_equal(f[2 * G * t + r], g[n])
        assert np.array_equal(f[2 * G * t + G + r], u[n])
    g2, u2 = E.split_gate_up_np(f)
    assert np.array_equal(g2, g) and np.array_equal(u2, u)
    with pytest.raises(ValueError, match="multiple of 8"):
        E.interleave_gate_up_np(g[:12], u[:12])
    with pytest.raises(ValueError, match="one shape and dtype"):
        E.interleave_gate_up_np(g, u[:8])


def test_swiglu_register_pairing():
    """The sm_90a scheme: accumulator column 8j + c of thread l holds, for j = 2t, the gate
    and for j = 2t+1 the up row of output column 8t + c (module docstring)."""
    G = E.SWIGLU_GROUP
    BLK_N = 48
    for j in range(0, BLK_N // 8, 2):
        for c in range(8):
            gate_col, up_col = 8 * j + c, 8 * (j + 1) + c
            assert (gate_col // G) % 2 == 0 and (up_col // G) % 2 == 1
            out_g = (gate_col // (2 * G)) * G + gate_col % G
            out_u = (up_col // (2 * G)) * G + up_col % G
            assert out_g == out_u == 8 * (j // 2) + c


def test_reference_np_full_cases():
    M, N, K = 5, 16, 32
    A, B, _ = numerics.make_inputs_np(M, N, K, "random", 1)
    acc = numerics.reference_np(A, B)
    bias = E.make_bias_np(N, "bfloat16", 2)
    ref = E.reference_np(A, B, {"BIAS": "bfloat16", "ACT": "gelu"}, bias=bias)
    np.testing.assert_allclose(ref, E.act_np(acc + bias.astype(np.float32), "gelu"),
                               rtol=1e-6, atol=1e-7)
    Bg, Bu = B[:8], B[8:]
    fused = E.interleave_gate_up_np(Bg, Bu)
    sw = E.reference_np(A, fused, {"SWIGLU": True})
    ag, au = numerics.reference_np(A, Bg), numerics.reference_np(A, Bu)
    np.testing.assert_allclose(sw, E.act_np(ag, "silu") * au, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="pass both or neither"):
        E.reference_np(A, B, {"BIAS": "float32"})
    with pytest.raises(ValueError, match="pass both or neither"):
        E.reference_np(A, B, {}, bias=bias)


def test_tolerance_derivation():
    plain16 = numerics.tolerances("float16")
    t = E.tolerance({}, "float16", K=4096)
    # the plain case is the plain rule plus the (small) accumulation term
    assert plain16.rtol == t.rtol and plain16.atol_scale < t.atol_scale < 1.2e-3
    # fp32 out: far tighter than any 2-byte rule, set by the accumulation error at K
    t32 = E.tolerance({"OUT_DTYPE": "float32"}, "bfloat16", K=4096)
    assert t32.max_rel_err < 1e-4 and t32.rtol < 1e-6
    assert E.tolerance({"OUT_DTYPE": "float32"}, "bfloat16", K=16384).max_rel_err > \
        t32.max_rel_err
    # an activation widens by its slope; bfloat16's rounding dominates its tolerance
    tg = E.tolerance({"ACT": "gelu"}, "bfloat16")
    assert 8e-3 <= tg.max_rel_err < 8.3e-3
    with pytest.raises(ValueError, match="K=0"):
        E.tolerance({}, "float16", K=0)
    with pytest.raises(ValueError, match="dtype='float32'"):
        E.tolerance({}, "float32")


def _kernel_like(A, B, kw, bias, in_dtype):
    """An fp32 emulation of the kernel: fp32 acc in another summation order (K reversed),
    the epilogue in fp32, one rounding to the out dtype."""
    acc = (A.astype(np.float32)[:, ::-1] @ B.astype(np.float32)[:, ::-1].T).astype(np.float32)
    v = E.validate(kw)
    if v["SWIGLU"]:
        g, u = E.split_gate_up_np(acc.T)
        g, u = g.T.astype(np.float32), u.T.astype(np.float32)
        y = (g / (np.float32(1) + np.exp(-g))) * u
    else:
        y = acc + (bias.astype(np.float32) if bias is not None else np.float32(0))
        y = E.act_np(y, v["ACT"]).astype(np.float32)
    od = E.out_dtype(kw, in_dtype)
    return y.astype(np.float32) if od == "float32" else numerics.round_to(y, od)


@pytest.mark.parametrize("kw", [{}, {"BIAS": "float32", "ACT": "silu"},
                                {"ACT": "gelu_tanh", "OUT_DTYPE": "float32"},
                                {"SWIGLU": True}, {"SWIGLU": True, "OUT_DTYPE": "float32"}])
@pytest.mark.parametrize("in_dtype", ["float16", "bfloat16"])
def test_tolerance_passes_a_correct_result_and_fails_a_wrong_one(kw, in_dtype):
    M, N, K = 64, 64, 1024
    A, B, _ = numerics.make_inputs_np(M, 2 * N if kw.get("SWIGLU") else N, K, "random", 3,
                                      in_dtype)
    bias = E.make_bias_np(N, kw["BIAS"], 4) if kw.get("BIAS") else None
    ref = E.reference_np(A, B, kw, bias=bias)
    got = _kernel_like(A, B, kw, bias, in_dtype)
    assert E.compare_np(got, ref, kw, in_dtype, K=K).ok
    # a wrong epilogue (the accumulator unactivated, or a dropped bias) fails
    wrong = got.copy()
    wrong[:, :8] *= 1.01
    assert not E.compare_np(wrong, ref, kw, in_dtype, K=K).ok


# --- v12 (sm_90a) builds every epilogue keyword: three builds, and the builder's checks ----
def _v12_builds():
    from tirx_gemm import registry
    from tirx_gemm.compile.api import build_many
    v12 = registry.get("v12", "sm_90a")
    rt = {"RUNTIME_M": True, "RUNTIME_NK": True}
    reqs = [  # BLK_N 112 and SwiGLU's 208 -> 104 outputs: a TMA chunk plus a register tail
        (v12, (128, 256, 256), {**rt, "dtype": "bfloat16", "BLK_M": 64, "BLK_N": 112,
                                "BIAS": "bfloat16", "ACT": "gelu_tanh"}),
        (v12, (128, 256, 256), {**rt, "BLK_N": 208, "SWIGLU": True}),
        (v12, (128, 256, 256), {**rt, "BLK_N": 256, "BIAS": "float32", "ACT": "silu",
                                "OUT_DTYPE": "float32"}),
    ]
    return build_many(reqs)


@pytest.fixture(scope="module")
def v12_builds():
    return _v12_builds()


def test_v12_builds_each_epilogue_without_spills(v12_builds):
    bias_act, swiglu, f32 = v12_builds
    for r in (bias_act, swiglu):
        assert r.spill_stores == 0 and r.spill_loads == 0, r.kwargs
    # 128x256 with bias + silu + fp32 D: 128 accumulators, the bias loads in flight and the
    # store addresses leave one 64-bit value on the stack (ptxas: STL.64 once at set-up,
    # one LDL.64 per tile); anything more is a regression
    assert f32.spill_stores <= 8 and f32.spill_loads <= 8, (f32.spill_stores, f32.spill_loads)
    # bias + gelu_tanh, bf16: the bias read as 16-bit loads, no tanh.approx (MUFU.TANH)
    # anywhere (gelu_tanh is written as x / (1 + exp(-2y))), stmatrix chunk + register tail
    s = bias_act.sass_counts
    assert not any(op.startswith("MUFU.TANH") for op in s)
    assert any(op.startswith("LDG.E.U16") for op in s) and "STSM.16.M88.4" in s
    assert any(op.startswith("STG.E") for op in s) and "UTMASTG.2D" in s
    cu = bias_act.cuda_path.read_text()
    assert "tirx_gemm_act_gelu_tanh" in cu and "__expf(-2.0f * y)" in cu
    # the bias loads are issued before the tile's last wgmma wait (in flight under the last
    # wgmmas): every 16-bit global load precedes the final wait_group 0 in SASS
    lines = Path(bias_act.sass_path).read_text().splitlines()
    ldg = [i for i, x in enumerate(lines) if "LDG.E.U16" in x]
    final = [i for i, x in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in x]
    assert ldg and len(final) == 1 and ldg[-1] < final[0], (ldg[-1:], final)
    # SwiGLU: 208 accumulator columns -> 104 outputs (one 64-column TMA chunk + 5 blocks)
    s = swiglu.sass_counts
    assert "HGMMA.64x208x16.F32" in s and "UTMASTG.2D" in s and "STSM.16.M88.4" in s
    cu = swiglu.cuda_path.read_text()
    assert "tirx_gemm_act_silu" in cu
    # the guarded tail covers the 5 output blocks past the chunk, not BLK_N/8 - 8 = 18
    # accumulator blocks: 2 call sites (in the loop, after it) x 5 blocks x 2 rows
    assert cu.count("tirx_gemm_st_global_b32(") - 1 == 2 * 5 * 2
    assert s.get("STG.E") == 2 * 5 * 2
    # fp32 D: 8-byte register stores, no staging tile, no TMA store
    s = f32.sass_counts
    assert "STG.E.64" in s and "UTMASTG.2D" not in s and "STSM.16.M88.4" not in s
    assert any(op.startswith("LDG.E") for op in s)  # the fp32 bias


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_v12_emits_the_other_activations(act):
    """relu and gelu (erf) without a build: the builder's TIR calls their device function."""
    from steps.sm90a.hgemm_v12 import hgemm_v12
    text = hgemm_v12(128, 256, 256, BLK_N=64, ACT=act, RUNTIME_M=True).script()
    assert f"tirx_gemm_act_{act}" in text


@pytest.mark.parametrize("kw, words", [
    ({"SWIGLU": True, "ACT": "gelu"}, "takes no BIAS or ACT"),
    ({"ACT": "softplus"}, "ACT='softplus'"),
    ({"OUT_DTYPE": "bfloat16"}, "OUT_DTYPE='bfloat16'"),
    ({"BIAS": True}, "name the bias dtype"),
])
def test_v12_refuses_bad_epilogue_keywords_in_one_line(kw, words):
    from steps.sm90a.hgemm_v12 import hgemm_v12
    with pytest.raises(ValueError) as e:
        hgemm_v12(128, 256, 256, **kw)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw, words", [
    ({"BIAS_SMEM": True}, "it needs BIAS"),
    ({"BIAS_SMEM": True, "ACT": "gelu"}, "it needs BIAS"),
    ({"BIAS_SMEM": 1, "BIAS": "bfloat16"}, "BIAS_SMEM=1 must be True or False"),
])
def test_v12_bias_smem_refuses_without_a_bias_in_one_line(kw, words):
    from steps.sm90a.hgemm_v12 import hgemm_v12
    with pytest.raises(ValueError) as e:
        hgemm_v12(128, 256, 256, **kw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_v12_bias_smem_stages_the_bias_in_shared_memory():
    """BIAS_SMEM=True at matmul's 128x256 bias + gelu tile: no spills, the ring as deep as
    without it (the two fp32 bias buffers fit beside it), the consumers read the bias with one
    LDS.64 per 8-column block (BLK_N/8 = 32 per thread and tile) instead of 64 16-bit global
    loads, and the only 16-bit global loads left are the producer warp's (BLK_N/32 = 8 per
    lane and tile)."""
    from tirx_gemm import registry
    from tirx_gemm.compile.api import build_many
    v12 = registry.get("v12", "sm_90a")
    kw = {"dtype": "bfloat16", "RUNTIME_M": True, "RUNTIME_NK": True, "PREFETCH_MAPS": True,
          "BLK_M": 128, "BLK_N": 256, "BIAS": "bfloat16", "ACT": "gelu"}
    regs, smem = build_many([(v12, (128, 256, 256), kw),
                             (v12, (128, 256, 256), {**kw, "BIAS_SMEM": True})])
    for r in (regs, smem):
        assert r.spill_stores == 0 and r.spill_loads == 0, r.kwargs
    s = smem.sass_counts
    assert s.get("LDS.64") == 256 // 8 and not any(op.startswith("LDS.") and op != "LDS.64"
                                                    for op in s), s
    ldg = sum(n for op, n in s.items() if op.startswith("LDG.E.U16"))
    ldg_regs = sum(n for op, n in regs.sass_counts.items() if op.startswith("LDG.E.U16"))
    assert (ldg, ldg_regs) == (256 // 32, 256 // 4)
    # each consumer warp: its reads, a __syncwarp, then lane 0 frees the buffer
    assert "tvm_builtin_cuda_warp_sync();" in smem.cuda_path.read_text()
    # the same ring: the two bias buffers (2 x 256 fp32) take what the default depth leaves
    assert smem.smem_bytes - regs.smem_bytes == 2 * 256 * 4


BF = {"dtype": "bfloat16"}


@pytest.mark.parametrize("kw, words", [
    ({"ACT_APPROX": True, "BIAS": "bfloat16", "ACT": "gelu", **BF}, "the erf gelu stays exact"),
    ({"ACT_APPROX": True, "ACT": "gelu_tanh"}, "a bfloat16 D"),
    ({"ACT_APPROX": True, "ACT": "gelu_tanh", "OUT_DTYPE": "float32", **BF}, "D float32"),
    ({"ACT_APPROX": True, "BIAS": "bfloat16", **BF}, "ACT=None"),
    ({"ACT_APPROX": 1, "ACT": "gelu_tanh", **BF}, "ACT_APPROX=1 must be True or False"),
])
def test_v12_act_approx_refuses_in_one_line(kw, words):
    from steps.sm90a.hgemm_v12 import hgemm_v12
    with pytest.raises(ValueError) as e:
        hgemm_v12(128, 256, 256, **kw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_v12_act_approx_computes_gelu_tanh_with_one_mufu():
    """ACT_APPROX=True at matmul's 128x256 bias + gelu_tanh tile, with and without BIAS_SMEM:
    no spills; per value one MUFU.TANH (and no MUFU.EX2 / MUFU.RCP), where the exact form
    takes an ex2 and a reciprocal; the device function is tanh.approx.f32 of x(A + Bx^2)."""
    from tirx_gemm import registry
    from tirx_gemm.compile.api import build_many
    v12 = registry.get("v12", "sm_90a")
    kw = {"dtype": "bfloat16", "RUNTIME_M": True, "RUNTIME_NK": True, "PREFETCH_MAPS": True,
          "BLK_M": 128, "BLK_N": 256, "BIAS": "bfloat16", "ACT": "gelu_tanh"}
    exact, approx, smem = build_many([(v12, (128, 256, 256), kw),
                                      (v12, (128, 256, 256), {**kw, "ACT_APPROX": True}),
                                      (v12, (128, 256, 256), {**kw, "ACT_APPROX": True,
                                                              "BIAS_SMEM": True})])
    values = 256 // 2  # fp32 accumulators per consumer thread
    ex = exact.sass_counts
    assert ex.get("MUFU.EX2") == values and ex.get("MUFU.RCP", 0) >= values
    assert not ex.get("MUFU.TANH")
    for r in (approx, smem):
        assert r.spill_stores == 0 and r.spill_loads == 0, r.kwargs
        s = r.sass_counts  # (the reciprocals left are the set-up's, not the epilogue's)
        assert s.get("MUFU.TANH") == values and not s.get("MUFU.EX2"), s
        assert s.get("MUFU.RCP", 0) <= ex["MUFU.RCP"] - values + 2, s  # BIAS_SMEM's warp: 2
        assert "tanh.approx.f32" in r.cuda_path.read_text()


def test_act_approx_is_picked_for_bf16_gelu_tanh_at_the_timed_tiles_only():
    from tirx_gemm.op import keywords as KW
    bias, bare = {"BIAS": "bfloat16", "ACT": "gelu_tanh"}, {"ACT": "gelu_tanh"}
    for epi in (bias, bare):
        assert KW.act_approx(epi, 128, "bfloat16") == {"ACT_APPROX": True}
        assert KW.act_approx(epi, 256, "bfloat16") == {"ACT_APPROX": True}
        assert KW.act_approx(epi, 64, "bfloat16") == {}  # decode tiles: not timed
        assert KW.act_approx(epi, 256, "float16") == {}  # 2**-11 is fp16's rounding
        assert KW.act_approx({**epi, "OUT_DTYPE": "float32"}, 256, "bfloat16") == {}
    for act in ("gelu", "relu", "silu", None):  # the erf gelu stays exact
        assert KW.act_approx({"BIAS": "bfloat16", "ACT": act}, 256, "bfloat16") == {}
    assert KW.epilogue_picks(bias, 256, "bfloat16") == {"BIAS_SMEM": True, "ACT_APPROX": True}
    assert KW.epilogue_picks(bare, 256, "bfloat16") == {"ACT_APPROX": True}
    line = KW.epilogue_picks_why({**bias, "BIAS_SMEM": True, "ACT_APPROX": True})
    assert "BIAS_SMEM" in line and "gelu_tanh with one MUFU (ACT_APPROX)" in line
    assert KW.epilogue_picks_why(bias) == ""
    from tirx_gemm.compile.names import kernel_name
    assert kernel_name("v12", {"BLK_M": 128, "BLK_N": 256, "dtype": "bfloat16", **bias,
                               "BIAS_SMEM": True, "ACT_APPROX": True}) \
        == "tirx_v12_bf16_m128n256_smembias_gelutanh_approx"


def _apply_lab_patch(tmp_path, rel_patch: str) -> None:
    """Copy the files a lab patch changes into ``tmp_path`` and ``git apply`` it there; fails
    with git's message when it no longer applies to this checkout."""
    import re
    import subprocess
    root = Path(__file__).resolve().parents[1]
    patch = root / rel_patch
    for rel in re.findall(r"^--- a/(\S+)", patch.read_text(encoding="utf-8"), re.M):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((root / rel).read_bytes())
    out = subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, f"{rel_patch} no longer applies: {out.stderr}"


def test_the_erf_form_patch_applies_and_adds_gelu_to_the_approx_forms(tmp_path):
    """lab/fused_epilogues/patches/act_approx.patch (the erf form, opt-in) still applies and
    puts gelu beside gelu_tanh in epilogue.APPROX_ACTS, with its device function."""
    _apply_lab_patch(tmp_path, "lab/fused_epilogues/patches/act_approx.patch")
    assert 'APPROX_ACTS = ("gelu_tanh", "gelu")' in (tmp_path / "tirx_gemm/epilogue.py").read_text()
    assert '_ACT_FN["gelu_approx"]' in (tmp_path / "tirx_gemm/hopper/fused.py").read_text()
    assert E.APPROX_ACTS == ("gelu_tanh",)


def test_v12_swiglu_needs_n_a_multiple_of_the_group():
    from steps.sm90a.hgemm_v12 import hgemm_v12
    with pytest.raises(ValueError, match="multiple of 8"):
        hgemm_v12(128, 260, 256, SWIGLU=True)


def test_v10_takes_bias_and_act_in_its_writeback():
    """v10 (ping-pong): BIAS and ACT before each block's pack (TIR only, no build); the
    plain build's CUDA is unchanged (checked by diffing when it was written)."""
    from steps.sm90a.hgemm_v10 import hgemm_v10
    f = hgemm_v10(1024, 1024, 1024, BIAS="float32", ACT="silu", RUNTIME_M=True)
    assert [p.name for p in f.params] == ["A", "B", "D", "bias"]
    assert "tirx_gemm_act_silu" in f.script()
    assert [p.name for p in hgemm_v10(1024, 1024, 1024).params] == ["A", "B", "D"]
    with pytest.raises(ValueError, match="ACT='tanh'"):
        hgemm_v10(1024, 1024, 1024, ACT="tanh")


def test_the_kernels_gelu_erf_is_within_its_stated_bound_of_float64():
    """hopper/fused.py's gelu (Abramowitz-Stegun 7.1.26 erf, branch-free) as its float32 twin
    against float64 F.gelu over [-10, 10]: at most E.GELU_ABS_ERR absolute, 1.7e-4 relative
    where |gelu| > 1e-3 (under float16's 4.9e-4 rounding), +inf to +inf, and the CUDA source
    uses the constants the twin does (no erff left)."""
    import math
    x = np.linspace(-10, 10, 200001)
    ref = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    err = np.abs(E.gelu_erf_np(x).astype(np.float64) - ref)
    assert err.max() <= E.GELU_ABS_ERR
    big = np.abs(ref) > 1e-3
    assert (err[big] / np.abs(ref[big])).max() < 1.7e-4
    with np.errstate(all="ignore"):
        assert E.gelu_erf_np(np.array([np.inf]))[0] == np.inf
    pytest.importorskip("tvm")
    from tirx_gemm.hopper.fused import _ACT_FN
    src = _ACT_FN["gelu"][1]
    assert "erff" not in src and all(f"{c:.9e}f" in src for c in E.gelu_constants())


def _lab_script(name):
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "lab" / "fused_epilogues" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_gelu_error_sweep_covers_every_bf16_input_and_rounding_is_its_floor():
    """lab/fused_epilogues/gelu_error_sweep.py: every finite bfloat16 value in [-10, 10] once,
    and the exact result rounded to bfloat16 errs by at most one half-ulp (the floor a path is
    read against); a result one ulp off reads as two."""
    import torch
    sweep = _lab_script("gelu_error_sweep")
    v = sweep.bf16_values()
    assert len(v) == len(torch.unique(v)) and v.min() == -10 and v.max() == 10
    assert torch.equal(v.to(torch.bfloat16).double(), v)  # each one a bfloat16 value
    for form in ("erf", "tanh"):
        want = sweep.gelu64(v, form)
        _, _, half_ulps, _ = sweep.errors(want.to(torch.bfloat16).double(), want)
        assert 0.99 < half_ulps <= 1.0
        y = torch.tensor([3.0], dtype=torch.float64)  # [2, 4): ulp 2^-6
        assert sweep.errors(y + 2.0 ** -6, y)[2] == 2.0

def test_the_form_gap_is_the_tanh_forms_distance_from_the_erf_gelu():
    """gelu_error_sweep.py --form-gap: the tanh form against the erf form's float64 gelu, the
    record the study's README reads (records/gelu_form_gap_cpu.jsonl) as the script gives it."""
    import json
    sweep = _lab_script("gelu_error_sweep")
    recs = sweep.form_gap_records()
    assert [r["path"] for r in recs] == ["tanh form vs erf", "bf16 tanh form vs erf"]
    exact, rounded = recs
    assert exact["max_err_half_ulps_gelu_1e-3"] > 50 and exact["max_abs_err"] < 1e-3
    assert rounded["max_abs_err"] > exact["max_abs_err"]  # bf16's rounding near |gelu| 2.7 on top
    path = Path(__file__).resolve().parents[1] / "lab/fused_epilogues/records/gelu_form_gap_cpu.jsonl"
    stored = [json.loads(line) for line in path.read_text().splitlines()]
    keep = ("path", "max_abs_err", "x_at_max_abs", "max_err_half_ulps_gelu_1e-3", "x_at_max_half_ulps")
    assert [{k: r[k] for k in keep} for r in stored] == [{k: r[k] for k in keep} for r in recs]



def test_clock_windows_takes_each_windows_samples_after_it_settles():
    """lab/fused_epilogues/clock_windows.py: nvidia-smi samples (host local time) inside a
    clock-probe window, its first 20% left out, give the window's median SM clock and power."""
    clocks = _lab_script("clock_windows")
    lines = ["timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], t",
             "2026/12/06 04:55:00.950, 1980 MHz, 2619 MHz, 300.00 W, 40",
             "2026/12/06 04:55:01.010, 1900 MHz, 2619 MHz, 500.00 W, 40",
             "2026/12/06 04:55:01.100, 1755 MHz, 2619 MHz, 690.00 W, 45",
             "2026/12/06 04:55:01.200, 1745 MHz, 2619 MHz, 700.00 W, 46",
             "2026/12/06 04:55:01.300, 1980 MHz, 2619 MHz, 310.00 W, 46"]
    probe = {"card": "c", "kind": "clock_probe", "M": 8192, "N": 4096, "K": 1024, "path": "p",
             "t_start": 100.0, "t_end": 100.25, "calls": 10, "us": 130.0,
             "local_start": "2026/12/06 04:55:01.000"}
    (row,) = clocks.windows([probe, {"kind": "summary"}], clocks.parse_samples(lines))
    assert row["samples"] == 2 and row["sm_mhz"] == 1750 and row["power_w"] == 695


def test_v12_adds_a_swap_ab_tiles_bias_along_the_fragment_rows():
    """A swap-AB tile holds D's transpose: a fragment row is a column of D (a weight row), so
    its bias is loaded by the fragment's row (m_st + 16 warp + lane/4 + 8h: two values per
    thread) and added to both of the row's accumulators in every 8-column block; the non-swap
    tile's bias goes by the fragment's column (8j + 2(lane % 4) + e)."""
    import re
    from steps.sm90a.hgemm_v12 import hgemm_v12

    def bias_code(**kw):
        text = hgemm_v12(8, 896, 896, BLK_M=64, BLK_N=16, dtype="bfloat16", BIAS="bfloat16",
                         **kw).script()
        loads = [ln.strip() for ln in text.splitlines() if "bias[" in ln]
        adds = re.findall(r"acc\[4 \* j \+ 2 \* h \+ e\] \+ \w+\[([^\]]+)\]", text)
        return loads, adds
    loads, adds = bias_code(SWAP_AB=True, SPLIT_K=1, PIPE_DEPTH=8)
    assert len(loads) == 1 and "warp_id * 16 + lane_id // 4 + 8 * h" in loads[0], loads
    assert "lane_id % 4" not in loads[0] and adds == ["h"], adds
    loads, adds = bias_code()
    assert loads and all("lane_id % 4" in ln and "warp_id" not in ln for ln in loads), loads
    assert adds == ["2 * j + e"], adds
