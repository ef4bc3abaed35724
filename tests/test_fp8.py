"""fp8 (v13 on sm_90a, tirx_gemm.matmul_fp8): the API's one-line errors and scale shapes,
the numerics of the reference and tolerances, the builder's refusals, and two builds
(the registry's canonical one and the block-scaled export kernel) whose SASS carries the
fp8 wgmma; the sm_100a twin's refusals and one build whose SASS carries the f8f6f4
tcgen05.mma (UTCQMMA). No GPU: correctness on the H200 is lab/fp8_on_hopper/fp8_h200.py's, on
sm_100a the simulation gate's (tests/test_sim.py, tirx-gemm sim v13)."""
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tirx_gemm import numerics, registry

torch = pytest.importorskip("torch")
fp8 = pytest.importorskip("tirx_gemm.op.fp8")

ROOT = Path(__file__).resolve().parent.parent
E4M3 = torch.float8_e4m3fn


def _ops(M=64, N=128, K=256, scale="tensor", adt=E4M3, sdt=torch.float32):
    a = torch.zeros(M, K).to(adt)
    b = torch.zeros(N, K).to(adt)
    sa_shape, sb_shape = {"tensor": ((), ()), "row": ((M, 1), (1, N)),
                          "block": ((M, -(-K // 128)), (-(-N // 128), -(-K // 128)))}[scale]
    return a, b, torch.ones(sa_shape, dtype=sdt), torch.ones(sb_shape, dtype=sdt)


def _check(*ops, out_dtype=torch.bfloat16, out=None):
    return fp8.check_fp8_operands(*ops, out_dtype, out, require_cuda=False)


# ---------------------------------------------------------------------------------------
# the API's contract (CPU tensors, device checks off)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_scale_modes_are_read_from_the_shapes(scale):
    K = 384 if scale == "block" else 400  # block scales cover whole 128-K blocks
    M, N, K, mode, odt = _check(*_ops(77, 136, K, scale))
    assert (M, N, K, mode, odt) == (77, 136, K, scale, "bfloat16")


def test_block_scales_refuse_a_partial_k_block_in_one_line():
    with pytest.raises(ValueError, match="K=400 with block scales: .*multiple of 128") as e:
        _check(*_ops(77, 136, 400, "block"))
    assert "\n" not in str(e.value)
    for scale in ("tensor", "row"):  # a partial last block is fine where no block scale exists
        assert _check(*_ops(77, 136, 400, scale))[3] == scale


def test_one_element_scales_of_any_rank_are_per_tensor():
    a, b, _, _ = _ops()
    for shape in ((), (1,), (1, 1)):
        s = torch.ones(shape)
        assert _check(a, b, s, s)[3] == "tensor"


@pytest.mark.parametrize("sa,sb,needle", [
    ((64,), (128,), "rowwise (64, 1), (1, 128)"),      # 1-D rowwise: _scaled_mm wants 2-D
    ((64, 1), (128, 1), "match no scaling"),            # scale_b as a column
    ((64, 1), (), "match no scaling"),                  # mixed modes
    ((64, 2), (2, 2), "block (64, 2), (1, 2)"),         # block with the wrong N blocks
])
def test_wrong_scale_shapes_are_one_line_valueerrors(sa, sb, needle):
    a, b, _, _ = _ops()
    with pytest.raises(ValueError, match="scale_a") as e:
        _check(a, b, torch.ones(sa), torch.ones(sb))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_wrong_dtypes_are_typeerrors_naming_the_fix():
    a, b, sa, sb = _ops()
    with pytest.raises(TypeError, match=r"float8_e4m3fn operands .*to\(torch.float8_e4m3fn\)"):
        _check(a.to(torch.bfloat16), b, sa, sb)
    with pytest.raises(TypeError, match="b has dtype torch.float8_e5m2"):
        _check(a, b.to(torch.float8_e5m2), sa, sb)
    with pytest.raises(TypeError, match=r"scales are torch.float32 \(scale_a.float\(\)\)"):
        _check(a, b, sa.double(), sb)
    with pytest.raises(TypeError, match="out_dtype"):
        _check(a, b, sa, sb, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="out has dtype"):
        _check(a, b, sa, sb, out=torch.empty(64, 128, dtype=torch.float16))


def test_shape_contract():
    with pytest.raises(ValueError, match="K=200 is not a multiple of 16.*pad K with zeros to 208"):
        _check(*_ops(K=200))
    with pytest.raises(ValueError, match="N=132 is not a multiple of 8"):
        _check(*_ops(N=132))
    a, b, sa, sb = _ops()
    with pytest.raises(ValueError, match="a is 64x256 but b is 128x128"):
        _check(a, b[:, :128].contiguous(), sa, sb)
    with pytest.raises(ValueError, match="not contiguous"):
        _check(torch.zeros(256, 64).to(E4M3).t(), b, sa, sb)
    with pytest.raises(ValueError, match=r"out has shape \(1, 1\)"):
        _check(a, b, sa, sb, out=torch.empty(1, 1, dtype=torch.bfloat16))


@pytest.mark.parametrize("name", ["a", "b", "scale_a", "scale_b"])
def test_an_operand_that_requires_grad_is_named_with_the_way_out(name):
    """The refusal said "matmul_fp8 has no backward" without naming the operand that
    requires grad."""
    ops = dict(zip(("a", "b", "scale_a", "scale_b"), _ops()))
    try:
        ops[name].requires_grad_()
    except RuntimeError:
        pytest.skip("this torch refuses requires_grad on float8 tensors itself")
    with pytest.raises(ValueError) as e:
        _check(*ops.values())
    msg = str(e.value)
    assert msg.startswith(f"{name} requires grad and matmul_fp8 has no backward: "), msg
    assert f"pass {name}.detach()" in msg and "tirx_gemm.nn.Linear" in msg and "\n" not in msg
    with torch.no_grad():  # outside grad mode the same operands pass
        assert _check(*ops.values())[3] == "tensor"
    ops[name] = ops[name].detach()
    assert _check(*ops.values())[3] == "tensor"


def test_cpu_tensors_are_refused_with_the_fix():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="no CUDA GPU.*torch._scaled_mm"):
        fp8.matmul_fp8(*_ops())


def test_choose_and_export_cover_every_mode():
    reqs = fp8.export_requests()
    kws = [kw for _, _, kw in reqs]
    # per mode and accumulation: the four small-M widths (promoted: those up to 64 also split
    # 2, 4, 8), the 128-row tile (block scales promote either way: one set) and, promoted,
    # mid_m_tile's 128 x 64; per tensor promoted, each width with thin A stages of 8 and 16;
    # per tensor and rowwise promoted, the 128 x 128 tile at deep K (PROMOTE=8)
    assert len(kws) == len({tuple(sorted(k.items())) for k in kws}) == 25 + 27 + 3 + 8 + 2
    assert f"a bundle holds {len(kws)} kernels per out dtype" in " ".join(fp8.__doc__.split())
    for mode in numerics.FP8_SCALES:
        for fast in (False, True):
            for M in (1, 9, 16, 17, 64, 65, 512, 4096):
                for N in (None, 576, 1536, 4096, 6144, 28672):
                    for K in (7168, 8192, 28672):
                        kw = fp8.choose_fp8(M, mode, fast, N=N, K=K)
                        assert kw in kws, kw
                kw = fp8.choose_fp8(M, mode, fast, N=N, K=7168)
                assert kw["PROMOTE"] == (0 if fast and mode != "block" else 4)
    with pytest.raises(TypeError, match="fast_accum"):
        fp8.choose_fp8(1, "row", 1)


def test_thin_a_stages_are_picked_per_tensor_at_m_up_to_16_only():
    """Thin A (A_ROWS) ran 1.07-1.26x the full-A pick per tensor on an H100 (lab/fp8_on_hopper);
    the kinds and the K split it was not measured with keep full A stages."""
    for M, rows in ((1, 8), (8, 8), (9, 16), (16, 16), (17, None), (64, None)):
        kw = fp8.choose_fp8(M, "tensor", False, N=8192, K=28672)
        assert kw.get("A_ROWS") == rows, (M, kw)
        for mode in ("row", "block"):
            assert "A_ROWS" not in fp8.choose_fp8(M, mode, False, N=8192, K=28672)
    assert "A_ROWS" not in fp8.choose_fp8(1, "tensor", True, N=8192, K=28672)  # fast accum
    split = fp8.choose_fp8(1, "tensor", False, N=576, K=7168)
    assert split["SPLIT_K"] > 1 and "A_ROWS" not in split
    assert "A_ROWS=8 (a stage loads 8 rows of A" in fp8.explain_fp8(1, 8192, 28672)


def test_kernel_scales_are_views_of_the_callers():
    a, b, sa, sb = _ops(scale="row")
    ka, kb = fp8.kernel_scales(sa, sb, "row")
    assert ka.shape == (64,) and kb.shape == (128,) and ka.data_ptr() == sa.data_ptr()


# ---------------------------------------------------------------------------------------
# numerics: quantization, the reference, the tolerances
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", numerics.FP8_SCALES)
def test_quantization_error_is_e4m3s_and_finer_scales_help(scale):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 384)).astype(np.float32)
    x *= np.exp2(rng.uniform(-8, 8, (200, 1))).astype(np.float32)  # rows of mixed magnitude
    q, s = numerics.quantize_fp8_np(x, scale, "a")
    assert s.shape == numerics.fp8_scale_shapes(scale, 200, 8, 384)[0]
    back = q.astype(np.float32) * numerics.expand_fp8_scale(s, scale, "a", x.shape)
    assert np.abs(q.astype(np.float32)).max() <= numerics.E4M3_MAX
    rel = np.linalg.norm(back - x) / np.linalg.norm(x)
    assert rel < 2.0 ** -4  # 3 mantissa bits: at most half an ulp (2**-4) per normal value
    # per-row error of the smallest rows: a per-tensor scale flushes them toward zero
    small = np.argsort(np.abs(x).max(axis=1))[:20]
    rel_small = np.linalg.norm(back[small] - x[small]) / np.linalg.norm(x[small])
    if scale == "tensor":  # measured here: 0.11 (rows of 2**-8 lose bits to subnormals)
        assert rel_small > 0.08
    else:
        assert rel_small < 2.0 ** -4


def test_block_reference_sums_each_block_with_its_own_scales():
    Aq, Bq, sa, sb, D = numerics.make_fp8_inputs_np(70, 264, 400, "block", seed=3)
    assert Aq.dtype.name == "float8_e4m3fn" and np.isnan(D.astype(np.float32)).all()
    assert sa.shape == (70, 4) and sb.shape == (3, 4)
    ref = numerics.reference_fp8_np(Aq, Bq, sa, sb, "block")
    want = np.zeros((70, 264), np.float64)
    A, B = Aq.astype(np.float64), Bq.astype(np.float64)
    for kb in range(4):
        ks = slice(128 * kb, 128 * kb + 128)
        part = A[:, ks] @ B[:, ks].T
        want += part * sa[:, kb:kb + 1] * np.repeat(sb[:, kb], 128)[:264][None, :]
    assert np.allclose(ref, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_row_reference_scales_rows_and_columns():
    Aq, Bq, sa, sb, _ = numerics.make_fp8_inputs_np(33, 48, 64, "row", seed=4)
    ref = numerics.reference_fp8_np(Aq, Bq, sa, sb, "row")
    raw = Aq.astype(np.float64) @ Bq.astype(np.float64).T
    want = raw * sa[:, None] * sb[None, :]
    assert np.allclose(ref, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_tolerances_add_the_accumulation_allowance():
    base = numerics.tolerances("bfloat16")
    promoted = numerics.fp8_tolerances("bfloat16", 16384, 4)
    raw = numerics.fp8_tolerances("bfloat16", 16384, 0)
    assert base.max_rel_err < promoted.max_rel_err < raw.max_rel_err
    assert promoted.max_rel_err == base.max_rel_err + 2.0 ** -14 * 128 / 32
    with pytest.raises(ValueError, match="promote"):
        numerics.fp8_accumulation_allowance(1024, -1)


def _emulator():
    path = ROOT / "lab" / "fp8_on_hopper" / "fp8_promotion_error.py"
    spec = importlib.util.spec_from_file_location("fp8_promotion_error", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_emulated_accumulation_stays_inside_the_allowance_and_promotion_helps():
    emu = _emulator()
    rng = np.random.default_rng(1)
    K = 2048
    Aq, _ = emu.quantize_e4m3(rng.standard_normal((32, K)))
    Bq, _ = emu.quantize_e4m3(rng.standard_normal((32, K)))
    ref = Aq @ Bq.T
    errs = {}
    for P in (0, 4):
        out = emu.emulate(Aq, Bq, P, numerics.FP8_ACC_BITS, "trunc").astype(np.float64)
        errs[P] = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert errs[P] < numerics.fp8_accumulation_allowance(K, P)
    assert errs[4] < errs[0] / 4
    exact = emu.emulate(Aq, Bq, 0, 53, "nearest").astype(np.float64)  # fp64-wide: fp32 only
    assert np.linalg.norm(exact - ref) / np.linalg.norm(ref) < 1e-6


# ---------------------------------------------------------------------------------------
# the builder: refusals (no compile) and two builds
# ---------------------------------------------------------------------------------------
STEP = registry.get("v13", "sm_90a")


@pytest.mark.parametrize("kw,needle", [
    ({"SCALE": "channel"}, "SCALE='channel' must be one of tensor, row, block"),
    ({"PROMOTE": 3}, "PROMOTE=3 must be 0 or a multiple of 4"),
    ({"SCALE": "block", "PROMOTE": 0}, "use PROMOTE=4"),
    ({"SCALE": "block", "BLK_N": 96}, "BLK_N=96 with SCALE='block'"),
    ({"PROMOTE": 4, "BLK_N": 256}, "use BLK_N <= 144 (PROMOTE_OVERLAP=False: <= 208) or "
                                   "PROMOTE=0"),
    ({"PROMOTE_OVERLAP": False, "BLK_N": 224}, "224 registers per thread for acc and tmp (> 216): "
                                               "use BLK_N <= 208"),
    ({"SCALE": "block", "BLK_N": 160}, "BLK_N=160 with SCALE='block'"),
    ({"SCALE": "block", "BLK_N": 192}, "BLK_N=192 with PROMOTE=4 needs 288 registers"),
    ({"dtype": "float32"}, "choose float16 or bfloat16"),
])
def test_builder_refuses_bad_keywords(kw, needle):
    pytest.importorskip("tvm")
    with pytest.raises(ValueError) as e:
        STEP.builder()(256, 256, 256, **kw)
    assert needle in str(e.value)


@pytest.mark.parametrize("mnk", STEP.invalid_shapes)
def test_builder_refuses_the_registrys_invalid_shapes(mnk):
    pytest.importorskip("tvm")
    with pytest.raises(ValueError):
        STEP.builder()(*mnk)


@pytest.fixture(scope="module")
def builds():
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build_many
    block = next(r for r in fp8.export_requests()
                 if r[2]["SCALE"] == "block" and r[2]["BLK_M"] == 128)
    return build_many([(STEP, STEP.canonical, {}), block])


def test_builds_carry_the_fp8_wgmma_and_no_16_bit_one(builds):
    for res in builds:
        if isinstance(res, Exception):
            raise res
        counts = res.sass_counts
        assert counts.get("QGMMA.64x128x32.F32.E4M3.E4M3", 0) > 0, counts
        assert not any(op.startswith("HGMMA") for op in counts)
        assert res.spill_stores == 0 and res.spill_loads == 0
        assert ".e4m3.e4m3" in res.cuda_source
    canonical, block = builds  # float16 out (every builder's default); matmul_fp8's bf16
    assert "pack_half2" in canonical.cuda_source and "pack_bfloat162" in block.cuda_source


def test_block_build_promotes_with_setmaxnreg_and_few_scale_loads(builds):
    canonical, block = builds
    # the default build promotes too (PROMOTE=4 in every mode: the accurate one), with the
    # overlapped promotion's register split
    assert numerics.fp8_promote({}) == 4
    assert any(op.startswith("USETMAXREG") for op in canonical.sass_counts)
    assert any(op.startswith("USETMAXREG") for op in block.sass_counts)
    loads = sum(n for op, n in block.sass_counts.items() if op.startswith("LDG"))
    # sa of two rows and sb of one block (3 loads) at each of the 4 load_block_scales
    # sites of the overlapped promotion: the peeled first stage pair and the loop's pair
    assert 0 < loads <= 4 * 3, loads


@pytest.mark.parametrize("mode", numerics.FP8_SCALES)
def test_torch_quantize_matches_numerics_and_the_api_shapes(mode):
    rng = np.random.default_rng(5)
    K = 384 if mode == "block" else 400  # block scales cover whole 128-K blocks
    x = rng.standard_normal((70, K)).astype(np.float32)
    w = rng.standard_normal((136, K)).astype(np.float32)
    qa, sa = fp8.quantize(torch.from_numpy(x), mode, "a")
    qb, sb = fp8.quantize(torch.from_numpy(w), mode, "b")
    assert _check(qa, qb, sa, sb)[3] == mode  # the API reads the mode back
    na, nsa = numerics.quantize_fp8_np(x, mode, "a")
    nb, nsb = numerics.quantize_fp8_np(w, mode, "b")
    assert np.array_equal(qa.view(torch.uint8).numpy(), na.view(np.uint8))
    assert np.allclose(sa.numpy().reshape(-1), nsa.reshape(-1))
    assert np.allclose(sb.numpy().reshape(-1), nsb.reshape(-1))
    ref = fp8.reference(qa, qb, sa, sb, mode).numpy()
    want = numerics.reference_fp8_np(na, nb, nsa, nsb.reshape(-1) if mode == "row" else nsb,
                                     mode)
    assert np.allclose(ref, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# ---------------------------------------------------------------------------------------
# the run side: `tirx-gemm run v13` quantizes the runner's 2-byte inputs (Fp8Operands)
# ---------------------------------------------------------------------------------------
def _v13_in_torch(ignore_scales=False):
    """What v13 computes, on CPU: dequant(A_q) @ dequant(B_q).T with its scale shapes."""
    def kernel(qa, qb, D, sa, sb, mode):
        a = qa.view(E4M3).float()
        b = qb.view(E4M3).float()
        if not ignore_scales:
            a = a * fp8.expand_scale(sa, mode, "a", *a.shape)
            b = b * fp8.expand_scale(sb, mode, "b", *b.shape)
        D.copy_((a @ b.T).to(D.dtype))
    return kernel


@pytest.mark.parametrize("mode", numerics.FP8_SCALES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_runner_quantizes_in_place_so_the_reference_is_exact(mode, dtype):
    from tirx_gemm.run.checking import check
    from tirx_gemm.run.runner import Fp8Operands
    M, N, K = 70, 136, 400
    for broken, want_ok in ((False, True), (True, False)):
        fake = _v13_in_torch(ignore_scales=broken)
        k = Fp8Operands(lambda *a: fake(*a, mode), mode)
        tol = numerics.fp8_tolerances(dtype, K, numerics.fp8_promote({"SCALE": mode}))
        rep = check(k, M, N, K, launch=lambda A, B, D: k(A, B, D), device="cpu",
                    dtype=dtype, seed=11, log=None, rtol=tol.rtol, atol_scale=tol.atol_scale,
                    max_rel_err=tol.max_rel_err)
        assert rep["ok"] is want_ok, rep
        if want_ok:  # only the output's rounding remains: exact quantization, fp32 sums
            assert rep["rel_err"] < numerics.tolerances(dtype).max_rel_err / 2


def test_runner_keeps_the_quantized_operands_per_input_set():
    from tirx_gemm.run.runner import Fp8Operands
    calls = []
    k = Fp8Operands(lambda qa, qb, D, sa, sb: calls.append((qa.data_ptr(), sa.shape)), "row")
    A = torch.randn(64, 128).to(torch.bfloat16)
    B = torch.randn(32, 128).to(torch.bfloat16)
    D = torch.empty(64, 32, dtype=torch.bfloat16)
    for _ in range(3):
        k(A, B, D)
    assert len(set(calls)) == 1 and calls[0][1] == (64,)
    again = A.clone()
    assert torch.equal(again, A)  # the in-place round trip is idempotent
    k(again, B, D)
    assert torch.equal(again, A)


def test_runner_quantizes_every_timed_set_before_the_events():
    """At small shapes the timed loop rotates among hundreds of input sets (to keep them out
    of L2): each set is quantized once, in prepare(), never inside a timed launch (the first
    H200 bench of v13 timed torch's quantization at 1024^3: 0.118 ms against 0.010)."""
    from tirx_gemm.run.runner import Fp8Operands
    quantized = []
    k = Fp8Operands(lambda *a: None, "tensor")
    real = k._quantize
    k._quantize = lambda x, op: (quantized.append(op), real(x, op))[1]
    sets = [(torch.randn(16, 32).to(torch.bfloat16), torch.randn(8, 32).to(torch.bfloat16),
             torch.empty(16, 8, dtype=torch.bfloat16)) for _ in range(40)]
    k.prepare(sets)
    assert len(quantized) == 80
    for _ in range(2):
        for A, B, D in sets:
            k(A, B, D)
    assert len(quantized) == 80  # 40 sets > the 16 it once held: no re-quantization


# ---------------------------------------------------------------------------------------
# sm_100a v13 (tcgen05 kind::f8f6f4 on v9's skeleton): refusals and one build. Its
# correctness is the simulation gate's (tirx-gemm sim v13: NumSim + synccheck + racecheck)
# ---------------------------------------------------------------------------------------
STEP100 = registry.get("v13", "sm_100a")


@pytest.mark.parametrize("kw,needle", [
    ({"SCALE": "block"}, "SCALE='block' must be one of tensor, row on sm_100a"),
    ({"dtype": "float32"}, "choose float16 or bfloat16"),
    ({"SM_COUNT": 3}, "SM_COUNT=3 is not a multiple of the cluster size 2"),
])
def test_sm100a_builder_refuses_bad_keywords(kw, needle):
    pytest.importorskip("tvm")
    with pytest.raises(ValueError) as e:
        STEP100.builder()(256, 256, 256, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("mnk", STEP100.invalid_shapes)
def test_sm100a_builder_refuses_the_registrys_invalid_shapes(mnk):
    pytest.importorskip("tvm")
    with pytest.raises(ValueError):
        STEP100.builder()(*mnk)


def test_sm100a_is_the_sm90a_twin_with_the_same_operands():
    assert STEP100.fp8 and STEP.fp8 and STEP100.one_track is None and STEP.one_track is None
    src100 = Path(STEP100.source_file).read_text()
    # the operands of both: uint8 A, B; D; fp32 SA, SB after D (run.runner.Fp8Operands)
    for src in (src100, Path(STEP.source_file).read_text()):
        assert "def kernel(A: T.Buffer((M" in src and "SA: T.Buffer(SA_SHAPE, \"float32\")" in src
    assert "kind::f8f6f4" in STEP100.lesson and "v9's skeleton" in STEP100.lesson


@pytest.fixture(scope="module")
def build100():
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build_many
    # per-row scales, bf16 out, off every tile grid, with the B200's CTA pool: the
    # registry's own builds (tests/test_build.py) cover per-tensor scales
    (res,) = build_many([(STEP100, (1000, 264, 208),
                          {"SCALE": "row", "dtype": "bfloat16", "SM_COUNT": 148})])
    if isinstance(res, Exception):
        raise res
    return res


def test_sm100a_build_issues_the_f8f6f4_mma_and_no_16_bit_one(build100):
    from tirx_gemm.compile.api import count_prefix
    counts = build100.sass_counts
    # UTCQMMA: tcgen05.mma of the fp8/f6/f4 kinds (UTCHMMA is kind::f16), pair form; one
    # rolled K loop per consumer: 4 of K = 32 per 128-K stage
    assert count_prefix(counts, "UTCQMMA.2CTA") == 4, counts
    assert count_prefix(counts, "UTCHMMA") == 0, counts
    assert "tcgen05.mma.cta_group::2.kind::f8f6f4" in build100.cuda_source
    assert build100.spill_stores == 0 and build100.spill_loads == 0
    assert build100.stack_bytes == 0
    assert "__float2bfloat16" in build100.cuda_source  # D in bf16
    # per-row scales: a chunk's 64 SB values pass around the warp by shuffles (4 chunks)
    assert count_prefix(counts, "SHFL.IDX") >= 4 * 64, counts


# ---------------------------------------------------------------------------------------
# sm_100a v13 SCALE="mx": block-scaled MXFP8 (UE8M0 scale factors per 32 of K)
# ---------------------------------------------------------------------------------------
def test_mx_reference_matches_float64():
    M, N, K = 130, 72, 400  # rows off the 128-row atom, a partial last SF block
    Aq, Bq, sfa, sfb, D = numerics.make_mx_inputs_np(M, N, K, 3, "bfloat16")
    assert sfa.shape == (M, 13) and sfb.shape == (N, 13) and sfa.dtype == np.uint8
    assert np.isnan(D).all() and len(np.unique(sfa)) > 3  # the blocks' scales differ
    ref = numerics.reference_mx_np(Aq, Bq, sfa, sfb)
    # float64, element by element: 2**(sf - 127) for the 32 elements of K of each block
    ea = np.array([[2.0 ** (int(sfa[m, k // 32]) - 127) for k in range(K)] for m in range(M)])
    eb = np.array([[2.0 ** (int(sfb[n, k // 32]) - 127) for k in range(K)] for n in range(N)])
    r64 = (Aq.astype(np.float64) * ea) @ (Bq.astype(np.float64) * eb).T
    assert np.abs(ref - r64).max() <= 1e-5 * np.abs(r64).max()
    # the quantization: every block's amax fits e4m3 and uses more than half its range
    real = Aq.astype(np.float64) * ea
    amax = np.abs(np.pad(real, ((0, 0), (0, 13 * 32 - K)))).reshape(M, 13, 32).max(axis=2)
    assert (amax <= 448 * np.exp2(sfa.astype(np.float64) - 127)).all()
    assert (amax > 224 * np.exp2(sfa.astype(np.float64) - 127) * 0.999).all()


def test_mx_blocked_order_is_the_tcgen05_atom():
    K, R = 400, 300
    sf = np.random.default_rng(0).integers(100, 150, (R, 13)).astype(np.uint8)
    blk = numerics.mx_block_sf_np(sf, K)
    assert blk.shape == (3 * 4 * 4, 128)  # 3 row blocks x 4 K stages, 512 bytes each
    atoms = blk.reshape(3, 4, 512)
    for r, j in ((0, 0), (161, 9), (299, 12), (37, 5)):
        rb, i, l, kb, jj = r // 128, (r % 128) // 32, r % 32, j // 4, j % 4
        assert atoms[rb, kb, l * 16 + i * 4 + jj] == sf[r, j]
    assert atoms[2, 3, 31 * 16 + 3 * 4 + 3] == 127  # padding: 2**0
    assert (numerics.mx_unblock_sf_np(blk, R, K) == sf).all()


@pytest.fixture(scope="module")
def build100_mx():
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build_many
    (res,) = build_many([(STEP100, (300, 264, 400),
                          {"SCALE": "mx", "dtype": "bfloat16", "SM_COUNT": 148})])
    if isinstance(res, Exception):
        raise res
    return res


def test_sm100a_mx_build_issues_block_scaled_pair_mma_and_tcgen05_cp(build100_mx):
    from tirx_gemm.compile.api import count_prefix
    src, counts = build100_mx.cuda_source, build100_mx.sass_counts
    assert "tcgen05.mma.cta_group::2.kind::mxf8f6f4.block_scale.scale_vec::1X" in src
    assert "tcgen05.cp.cta_group::2.32x128b.warpx4" in src  # both CTAs' SFs SMEM -> TMEM
    assert "cta_group::1" not in src  # the pair's forms only (alloc, MMA, cp, commit)
    assert "kind::f8f6f4" not in src  # no unscaled fp8 MMA
    assert counts.get("UTCQMMA.2CTA") == 4, counts  # 4 of K = 32 per 128-K stage
    # a cp per 128-row atom per stage: SFA's one, SFB's two (the MMA's joint N = 256)
    assert count_prefix(counts, "UTCCP") == counts.get("UTCCP.T.S.2CTA.4x32dp128bit") == 3
    assert count_prefix(counts, "UTCHMMA") == 0, counts
    # per stage, per CTA: A, B, the SFA atom and two SFB atoms, all TMA on CTA 0's barrier
    assert counts.get("UTMALDG.2D.2CTA") == 5, counts
    assert build100_mx.spill_stores == 0 and build100_mx.spill_loads == 0


def test_sm100a_mx_operands_are_blocked_sf_atoms():
    pytest.importorskip("tvm")
    from tirx_gemm import blackwell as W
    sa, sb = W.mx_sf_gmem_shape(300, 400), W.mx_sf_gmem_shape(264, 400)
    assert sa == sb == (3 * 4 * 4, 128)  # what numerics.mx_block_sf_np lays out
    assert numerics.mx_block_sf_np(np.zeros((300, 13), np.uint8), 400).shape == sa
    src = Path(STEP100.source_file).read_text()
    assert 'SFA: T.Buffer(SFA_SHAPE, W.MX_SF_STORAGE)' in src
    with pytest.raises(ValueError, match="PIPE_DEPTH=6 needs"):  # 5 stages of 33.5 KiB fit
        STEP100.builder()(256, 256, 256, SCALE="mx", PIPE_DEPTH=6)
    STEP100.builder()(256, 256, 256, SCALE="mx", PIPE_DEPTH=5)
    with pytest.raises(ValueError, match="SM_COUNT=3 is not a multiple of the cluster size"):
        STEP100.builder()(256, 256, 256, SCALE="mx", SM_COUNT=3)  # the pair's CTAs


@pytest.mark.parametrize("width", fp8.SMALL_M_WIDTHS)
def test_small_m_widths_issue_one_fp8_wgmma_of_that_width_without_spills(width):
    """Each width the small-M rule picks (BLK_M 64) is one m64nWk32 wgmma per k32 step, in
    every scale kind, with no spills (what matmul_fp8 runs at M <= 128)."""
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build_many
    reqs = [r for r in fp8.export_requests() if r[2]["BLK_M"] == 64 and r[2]["BLK_N"] == width
            and r[2]["PROMOTE"] == 4]
    assert {r[2]["SCALE"] for r in reqs} == set(numerics.FP8_SCALES)
    for res in build_many(reqs):
        if isinstance(res, Exception):
            raise res
        qg = {op: n for op, n in res.sass_counts.items() if op.startswith("QGMMA")}
        assert set(qg) == {f"QGMMA.64x{width}x32.F32.E4M3.E4M3"}, qg
        assert res.spill_stores == 0 and res.spill_loads == 0


def test_the_small_m_rule_fills_the_sms_and_explains_itself():
    assert fp8.choose_fp8(64, "block", False, N=576, K=7168)["SPLIT_K"] == 2  # 36 tiles
    assert fp8.choose_fp8(64, "row", True, N=576, K=7168).get("SPLIT_K") is None  # unpromoted
    assert "SPLIT_K" not in fp8.choose_fp8(16, "row", False, N=4096, K=14336)  # 128 tiles
    assert "SPLIT_K=2 (2 units per tile" in fp8.explain_fp8(64, 576, 7168, "row")
    assert fp8.small_m_width(1, 4096, 132) == 32     # 128 tiles: one per SM
    assert fp8.small_m_width(1, 28672, 132) == 128   # wide N: 224 tiles of 128 already
    assert fp8.small_m_width(64, 576, 132) == 16     # narrow N: the narrowest
    text = fp8.explain_fp8(16, 4096, 14336, "block")
    assert "BLK_N 32" in text and "128 tiles on 132 SMs" in text and "small_m_width" in text
    assert "BLK 128x128, the fewest waves" in fp8.explain_fp8(2048, 4096, 4096)
    assert "128-row tiles, BLK_N 256" in fp8.explain_fp8(2048, 4096, 4096, fast_accum=True)


def test_a_thin_a_kernel_is_refused_for_a_larger_m_before_launch(monkeypatch):
    """v13's A_ROWS (thin A stages, a lab keyword choose_fp8 does not pick): its rows past
    A_ROWS would be another stage's bytes, so matmul_fp8 refuses a larger M before any launch."""
    monkeypatch.setattr("tirx_gemm.op.matmul._gpu_arch", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(fp8, "check_fp8_operands",
                        lambda a, b, sa, sb, odt, out: (32, 256, 256, "row", "bfloat16"))
    kw = {**fp8.choose_fp8(8, "row", False, N=256, K=256), "A_ROWS": 8}
    assert "A_ROWS" not in fp8.choose_fp8(1, "row", False, N=8192, K=28672)
    with pytest.raises(ValueError, match="^A_ROWS=8 serves M <= 8, not M=32$"):
        fp8.matmul_fp8(*(torch.empty(1),) * 4, out=torch.empty(1), _kwargs=kw)


def test_thin_a_builder_refusals():
    pytest.importorskip("tvm")
    build = STEP.builder()
    with pytest.raises(ValueError, match="A_ROWS is 8, 16 or 32 with BLK_M=64"):
        build(128, 256, 1024, BLK_M=128, A_ROWS=16)
    with pytest.raises(ValueError, match="A_ROWS=16 loads 16 rows of A per tile: M=40"):
        build(40, 256, 1024, BLK_M=64, BLK_N=64, A_ROWS=16)
    with pytest.raises(ValueError, match="reads 56 rows past the A ring"):
        build(8, 16, 1024, BLK_M=64, BLK_N=16, A_ROWS=8, PIPE_DEPTH=2)


def test_cta_pair_builder_refusals():
    pytest.importorskip("tvm")
    build = STEP.builder()
    with pytest.raises(ValueError, match="CLUSTER=4 must be 1 or 2"):
        build(256, 256, 1024, CLUSTER=4)
    with pytest.raises(ValueError, match="CLUSTER=2 takes SPLIT_K=1 and full A stages"):
        build(256, 256, 4096, BLK_M=64, BLK_N=64, SPLIT_K=2, L2_GROUP=7, CLUSTER=2)
    with pytest.raises(ValueError, match="CLUSTER=2 takes SPLIT_K=1 and full A stages"):
        build(8, 256, 1024, BLK_M=64, BLK_N=64, A_ROWS=8, CLUSTER=2)
    with pytest.raises(ValueError, match="SM_COUNT=131 is not a multiple of the cluster size 2"):
        build(256, 256, 1024, SM_COUNT=131, CLUSTER=2)


def test_cta_pair_loads_half_of_b_each_multicast_and_releases_in_both():
    """CLUSTER=2 (the lab's pair): each CTA loads its own A tile and half of the B tile,
    multicast to both (mask 3); the empty barrier counts both CTAs' consumers (remote arrives
    through mapa), the setup is published cluster-wide and the kernel ends on a cluster
    barrier; CLUSTER=1 has none of it."""
    pytest.importorskip("tvm")
    kw = dict(BLK_M=128, BLK_N=128, RUNTIME_M=True, RUNTIME_NK=True, SCALE="block")
    text = STEP.build_primfunc(1000, 1024, 1024, CLUSTER=2, **kw).script()
    loads = [ln for ln in text.splitlines() if "copy_async(" in ln and "mbar=" in ln]
    assert len(loads) == 2, loads
    a_load, b_load = sorted(loads, key=lambda ln: "Bsmem" in ln)
    assert "cta_mask" not in a_load and " * 2 + rank) * 128" in a_load
    assert "cta_mask=3" in b_load and "rank * 64:rank * 64 + 64" in b_load
    assert "mapa.shared::cluster" in text and "cluster_sync" in text
    assert 'T.ptx.fence("mbarrier_init", "release", "cluster", "")' in text
    empty = [ln for ln in text.splitlines() if "stages_empty_buf" in ln and '"init"' in ln]
    assert len(empty) == 1 and "T.uint32(4)" in empty[0], empty  # 2 CTAs x 2 consumers
    one = STEP.build_primfunc(1000, 1024, 1024, **kw).script()
    assert "cta_mask" not in one and "cluster_sync" not in one and "mapa" not in one


def test_cta_pair_build_multicasts_without_spills():
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build_many
    kw = {**fp8.choose_fp8(4096, "tensor", False, N=4096, K=4096), "CLUSTER": 2}
    (res,) = build_many([(STEP, (256, 256, 256), kw)])
    if isinstance(res, Exception):
        raise res
    c = res.sass_counts
    assert c.get("UTMALDG.2D.MULTICAST") == 1 and c.get("UTMALDG.2D") == 1, c
    assert c.get("UCGABAR_ARV", 0) > 0 and c.get("UCGABAR_WAIT", 0) > 0, c
    assert c.get("QGMMA.64x128x32.F32.E4M3.E4M3", 0) > 0
    assert res.spill_stores == 0 and res.spill_loads == 0


def test_the_pair_candidates_are_the_128_row_pick_on_a_pair_above_small_m():
    """The A/B's candidates (lab/fp8_on_hopper/fp8_lab_variants.cluster_candidates): the pick
    plus CLUSTER=2 where the pick is a 128-row tile at M > 128; none at small M (64-row
    tiles, splits, thin A) or on an odd SM count (the pool is whole pairs)."""
    path = ROOT / "lab" / "fp8_on_hopper" / "fp8_lab_variants.py"
    spec = importlib.util.spec_from_file_location("fp8_lab_variants", path)
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    for mode in numerics.FP8_SCALES:
        pick = fp8.choose_fp8(8192, mode, False, N=8192, K=28672)
        assert lab.cluster_candidates(8192, 8192, 28672, mode) == [("pair", {**pick, "CLUSTER": 2})]
        assert lab.cluster_candidates(16, 4096, 14336, mode) == []
        assert lab.cluster_candidates(8192, 8192, 28672, mode, sm_count=131) == []
        assert lab.pair_check_kwargs(mode)[1] == {**lab.pair_check_kwargs(mode)[0], "CLUSTER": 2}
    assert lab.cluster_candidates(512, 576, 7168, "tensor") == []  # mid_m_tile: 64 x 64


def test_the_mid_m_rule_narrows_the_tile_only_where_128x128_tiles_leave_sms_idle():
    """mid_m_tile (M > 128, promoted): fewest waves x rows loaded per stage; the two shapes
    it was fit on (H200: 64 x 64 and 128 x 64 ran 1.85x and 1.37x faster than 128 x 128)
    and shapes whose 128 x 128 tiles fill the SMs, which keep it."""
    def tile(M, N, mode="tensor", fast=False):
        kw = fp8.choose_fp8(M, mode, fast, N=N, K=7168)
        return kw["BLK_M"], kw["BLK_N"]
    assert tile(512, 576) == tile(512, 576, "block") == (64, 64)   # 20 tiles of 128 x 128
    assert tile(512, 1536) == tile(512, 1536, "row") == (128, 64)  # 48
    for M, N in ((512, 4096), (2048, 1536), (512, 10240), (8192, 8192), (3000, 3072)):
        assert tile(M, N) == (128, 128), (M, N)
    assert tile(512, 576, "tensor", True) == (128, 256)  # fast accumulation: unchanged
    assert "mid_m_tile" in fp8.explain_fp8(512, 576, 7168, "row")


def test_split_k_builder_refusals():
    pytest.importorskip("tvm")
    build = STEP.builder()
    with pytest.raises(ValueError, match="needs the overlapped promotion"):
        build(256, 256, 4096, SPLIT_K=2, PROMOTE=0)
    with pytest.raises(ValueError, match="SPLIT_K=8 with L2_GROUP=8: .*must not divide"):
        build(256, 256, 4096, SPLIT_K=8, RUNTIME_M=True)
    with pytest.raises(ValueError, match="2 pairs of 128-K stages, fewer than the splits"):
        build(256, 256, 512, SPLIT_K=4, L2_GROUP=7)
    with pytest.raises(ValueError, match="SPLIT_K=0 must be a positive int"):
        build(256, 256, 512, SPLIT_K=0)


def test_split_k_build_counts_with_one_atomic_and_takes_the_workspace():
    """SPLIT_K (deep K at small M): the pick's tile with S units per tile, each publishing its
    partial sums and counting them with one acq_rel atomic; the workspace is S slabs of the
    tile per tile and a counter per 64-row half (fp8.workspace_specs)."""
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build_many
    _, kw = fp8.split_candidates(16, 4096, 14336, "block")[1]
    assert kw["SPLIT_K"] == 4 and kw["L2_GROUP"] == 8 and kw["BLK_N"] == 32
    (res,) = build_many([(STEP, (128, 256, 256), kw)])
    if isinstance(res, Exception):
        raise res
    assert res.sass_counts.get("ATOMG.E.ADD.S32.STRONG.GPU") == 1
    assert set(op for op in res.sass_counts if op.startswith("QGMMA")) == {
        "QGMMA.64x32x32.F32.E4M3.E4M3"}
    assert res.spill_stores == 0 and res.spill_loads == 0
    assert fp8.workspace_specs(16, 4096, 14336, kw) == (
        ("WS", (4, 128, 64 * 32), "float32"), ("CNT", (128,), "int32"))
    assert fp8.workspace_specs(16, 4096, 14336, {**kw, "SPLIT_K": 1}) == ()
    assert fp8.split_candidates(4096, 4096, 4096, "row") == []  # large M: no split offered


def test_quantize_refuses_a_non_tensor_or_a_non_2d_input_in_one_line():
    """fp8.quantize(None) ended in AttributeError, a 3-D x in 'too many values to unpack'."""
    torch = pytest.importorskip("torch")
    from tirx_gemm.op import fp8
    with pytest.raises(TypeError, match="^x must be a torch.Tensor, got NoneType$"):
        fp8.quantize(None, "tensor", "a")
    with pytest.raises(ValueError, match=r"^x must be 2-D \(M x K\), got shape \(2, 4, 16\)"):
        fp8.quantize(torch.randn(2, 4, 16), "row", "a")
    q, s = fp8.quantize(torch.randn(4, 16), "row", "a")
    assert q.shape == (4, 16) and s.shape == (4, 1)


def _lab_module(name):
    path = ROOT / "lab" / "fp8_on_hopper" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


def test_the_staggered_consumers_are_the_study_patch_not_a_v13_keyword():
    """STAGGER (measured no faster, not picked) left v13: its builder refuses the keyword, and
    lab/fp8_on_hopper/patches/stagger.patch puts it back (tests/test_lab.py applies it)."""
    pytest.importorskip("tvm")
    with pytest.raises(TypeError, match="STAGGER"):
        STEP.builder()(256, 256, 1024, STAGGER=True)
    lab = _lab_module("fp8_lab_variants")
    assert "STAGGER" in lab.stagger_check_kwargs("tensor")[1]


def test_the_promotion_candidates_are_the_stagger_and_the_isolating_variants():
    lab = _lab_module("fp8_lab_variants")
    for mode in numerics.FP8_SCALES:
        pick = fp8.choose_fp8(8192, mode, False, N=8192, K=28672)
        got = dict(lab.promotion_candidates(8192, 8192, 28672, mode))
        assert got["stagger"] == {**pick, "STAGGER": True}
        assert len(got) == (5 if mode == "tensor" else 1)
        assert lab.promotion_candidates(16, 4096, 14336, mode) == []
        assert lab.stagger_check_kwargs(mode)[1] == {**lab.stagger_check_kwargs(mode)[0], "STAGGER": True}
    got = dict(lab.promotion_candidates(8192, 8192, 28672, "tensor"))
    assert got["no promotion"]["PROMOTE"] == 0 and got["no promotion 128x256"]["BLK_N"] == 256
    assert got["serial every 2nd stage"]["PROMOTE"] == 8
    assert not got["serial every stage"]["PROMOTE_OVERLAP"]


@pytest.mark.parametrize("mode,width,overlap,sites", [
    ("tensor", 144, True, 16), ("row", 144, True, 16),
    ("tensor", 192, False, 4), ("row", 192, False, 4), ("block", 192, False, 4)])
def test_the_wide_promoted_tiles_issue_one_wgmma_per_k_step_without_spills(mode, width, overlap, sites):
    """The widest promoted tiles that fit the registers (lab/fp8_on_hopper, wide promoted tiles): one
    m64nWk32 wgmma per k32 step (the overlapped loop peels a stage pair: 4 stages of 4 sites; the serial
    loop one stage) and no spills, block scales across two blocks of B included."""
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build_many
    kw = {**fp8.choose_fp8(4096, mode, False, N=4096, K=4096), "BLK_N": width}
    if not overlap:
        kw["PROMOTE_OVERLAP"] = False
    (res,) = build_many([(STEP, (256, 384, 512), kw)])
    if isinstance(res, Exception):
        raise res
    wgmmas = {k: v for k, v in res.sass_counts.items() if k.startswith("QGMMA")}
    assert wgmmas == {f"QGMMA.64x{width}x32.F32.E4M3.E4M3": sites}
    assert res.spill_stores == 0 and res.spill_loads == 0


def test_only_a_serial_tile_past_160_columns_stores_the_previous_tile_before_its_mainloop():
    """128 columns keep the serial loop's store behind stage 1's wgmmas; 192 store before the loop."""
    pytest.importorskip("tvm")
    for mode in numerics.FP8_SCALES:
        kw = {**fp8.choose_fp8(4096, mode, False, N=4096, K=4096), "PROMOTE_OVERLAP": False}
        serial = STEP.build_primfunc(1000, 1024, 1024, **kw).script()
        wide = STEP.build_primfunc(1000, 1024, 1024, **{**kw, "BLK_N": 192}).script()
        # the serial loop's store sits under `if k == EPI_AT` for 128 columns only
        assert "if k == T.min(1, " in serial and "if k == T.min(1, " not in wide


def test_the_wide_candidates_and_their_checks():
    lab = _lab_module("fp8_lab_variants")
    for mode in numerics.FP8_SCALES:
        pick = fp8.choose_fp8(8192, mode, False, N=8192, K=28672)
        got = dict(lab.wide_candidates(8192, 8192, 28672, mode))
        assert got["serial 128x192"] == {**pick, "PROMOTE_OVERLAP": False, "BLK_N": 192}
        assert ("overlapped 128x144" in got) == (mode != "block")
        assert ("no promotion 128x256" in got) == (mode == "tensor")
        assert lab.wide_candidates(16, 4096, 14336, mode) == []
        assert lab.wide_check_kwargs(mode)[1]["BLK_N"] == 192
        assert (lab.wide_check_kwargs(mode, width=144) is None) == (mode == "block")


def test_the_wide_rule_needs_the_geomean_the_floor_and_every_check():
    summ = _lab_module("fp8_wide_summary")
    checks = [{"kind": "wide_check", "scale": "tensor", "ok": True},
              {"kind": "wide144_check", "scale": "tensor", "ok": True}]

    def case(g192, g144):
        return {"kind": "fp8_case", "M": 4096, "N": 4096, "K": 4096, "verified": True, "tflops": 900.0,
                "device": "NVIDIA H100", "ratio_to_torch": 0.8, "suite": {"scale": "tensor", "file": "a.json", "name": "s"},
                "candidates": {"serial 128x192": {"ms": 1.0, "ratio_to_pick": g192},
                               "overlapped 128x144": {"ms": 1.0, "ratio_to_pick": g144}}}

    def verdict(chk, cases):
        return [r for r in summ.summarize(chk, cases) if r["set"] == "all"][0]["adopt"]
    assert verdict(checks, [case(1.10, 1.05), case(1.06, 1.04)]) == "serial 128x192"
    assert verdict(checks, [case(1.10, 1.05), case(0.97, 1.04)]) == "overlapped 128x144"  # floor
    assert verdict(checks, [case(1.02, 1.01), case(1.03, 1.02)]) is None                # geomean
    bad = [checks[0], {**checks[1], "ok": False}]
    assert verdict(bad, [case(1.00, 1.10), case(1.00, 1.10)]) is None                   # its check
    assert verdict(checks[1:], [case(1.10, 1.00), case(1.10, 1.00)]) is None            # unchecked


def _case(scale, gain, file="a.json", verified=True):
    return {"kind": "fp8_case", "M": 4096, "N": 4096, "K": 4096, "verified": verified, "tflops": 900.0,
            "device": "NVIDIA H100", "ratio_to_torch": 0.8, "suite": {"scale": scale, "file": file, "name": "s"},
            "candidates": {"stagger": {"ms": 1.0, "ratio_to_pick": gain}}}


def test_the_stagger_rule_needs_the_geomean_the_floor_and_every_check():
    summ = _lab_module("fp8_stagger_summary")
    ok = [{"kind": "stagger_check", "scale": "tensor", "ok": True, "stagger_equals_pick": True}]
    verdict = lambda checks, cases: [r for r in summ.summarize(checks, cases)  # noqa: E731
                                     if r["set"] == "all"][0]["adopt"]
    assert verdict(ok, [_case("tensor", 1.05), _case("tensor", 1.04, "b.json")])
    assert not verdict(ok, [_case("tensor", 1.02), _case("tensor", 1.03)])       # geomean < 1.03
    assert not verdict(ok, [_case("tensor", 1.20), _case("tensor", 0.97)])       # a case < 0.98
    assert not verdict([{**ok[0], "stagger_equals_pick": False}], [_case("tensor", 1.1)])
    assert not verdict(ok, [_case("tensor", 1.1), _case("tensor", 1.1, verified=False)])  # untimed
    assert not verdict([], [_case("tensor", 1.1)])


def test_deep_k_promotes_every_second_stage_per_tensor_and_rowwise_only():
    """The 128 x 128 pick per tensor and rowwise at K >= fp8.PROMOTE_EVERY_SECOND_FROM_K (8192) is
    PROMOTE=8 overlapped (lab/fp8_on_hopper, "Promotion every second stage at deep K only"); below
    it, with block scales, fast accumulation, other tiles and K splits it keeps PROMOTE=4 (or 0)."""
    assert fp8.PROMOTE_EVERY_SECOND_FROM_K == 8192
    deep = {"PROMOTE": 8, "PROMOTE_OVERLAP": True}
    for mode in ("tensor", "row"):
        for K in (8192, 28672):
            kw = fp8.choose_fp8(4096, mode, False, N=4096, K=K)
            assert kw == {**fp8.choose_fp8(4096, mode, False, N=4096, K=4096), **deep}, (mode, K)
            assert "promoted every second 128-K stage, overlapped (PROMOTE=8" in \
                fp8.explain_fp8(4096, 4096, K, mode)
        for K in (4096, 8191):
            kw = fp8.choose_fp8(4096, mode, False, N=4096, K=K)
            assert kw["PROMOTE"] == 4 and "PROMOTE_OVERLAP" not in kw, (mode, K)
            assert "every second" not in fp8.explain_fp8(4096, 4096, K, mode)
        assert fp8.choose_fp8(4096, mode, True, N=4096, K=28672)["PROMOTE"] == 0   # fast accum
        for M, N in ((512, 1536), (64, 4096), (1, 576)):  # 128 x 64, 64-row tiles, a K split
            assert fp8.choose_fp8(M, mode, False, N=N, K=28672)["PROMOTE"] == 4, (M, N)
    for K in (4096, 8191, 8192, 28672):
        kw = fp8.choose_fp8(4096, "block", False, N=4096, K=K)
        assert kw["PROMOTE"] == 4 and "PROMOTE_OVERLAP" not in kw
    # the tolerance of its checks is the PROMOTE=8 one (fp8_bench.check: numerics.fp8_promote)
    kw = fp8.choose_fp8(4096, "tensor", False, N=4096, K=8192)
    assert numerics.fp8_promote(kw) == 8


def test_v13_builds_the_overlapped_promotion_every_second_stage():
    """v13 takes PROMOTE=8 overlapped per tensor and rowwise (the deep-K pick's build) and refuses it
    with block scales, a K split or a ring under 4; its four stages an iteration sum in tmp0 and tmp1,
    tmp0 promoted once both of its stages' wgmma groups are done (wait_group 2). No lab patch needed."""
    pytest.importorskip("tvm")
    interval = {"PROMOTE": 8, "PROMOTE_OVERLAP": True}
    for kw, needle in (({"SCALE": "block"}, "use PROMOTE=4"),
                       ({"BLK_M": 64, "BLK_N": 32, "SPLIT_K": 2, "L2_GROUP": 3}, "SPLIT_K=2 with PROMOTE=8"),
                       ({"PIPE_DEPTH": 3}, "use PIPE_DEPTH >= 4"),
                       ({"PROMOTE": 12}, "use PROMOTE=4 or 8")):
        with pytest.raises(ValueError, match=re.escape(needle)):
            STEP.builder()(256, 256, 256, **{**interval, **kw})
    for mode in ("tensor", "row"):
        kw = fp8.choose_fp8(4096, mode, False, N=4096, K=8192)
        assert kw["PROMOTE"] == 8
        got, pick = (STEP.build_primfunc(256, 384, 512, **k).script()
                     for k in (kw, {**kw, "PROMOTE": 4, "PROMOTE_OVERLAP": True}))
        # the peeled group and the loop: 8 stage sites (the PROMOTE=4 build's 4)
        assert [t.count("T.ptx.wgmma(tmp") for t in (got, pick)] == [8, 4], mode
        assert 'T.ptx.wgmma(2, "wait_group"' in got and 'T.ptx.wgmma(2, "wait_group"' not in pick


def test_the_interval_candidates_and_their_rule():
    lab = _lab_module("fp8_lab_variants")
    for mode in ("tensor", "row", "block"):
        pick = fp8.choose_fp8(8192, mode, False, N=8192, K=7168)
        got = dict(lab.interval_candidates(8192, 8192, 7168, mode))
        assert got["L2 group 4"] == {**pick, "L2_GROUP": 4} and got["L2 group 16"] == {**pick, "L2_GROUP": 16}
        assert ("overlapped every 2nd stage" in got) == (mode != "block")
        # at K >= 8192 the pick is PROMOTE=8 overlapped (tensor, row): the candidate is PROMOTE=4
        deep = fp8.choose_fp8(8192, mode, False, N=8192, K=28672)
        got = dict(lab.interval_candidates(8192, 8192, 28672, mode))
        assert "overlapped every 2nd stage" not in got
        if mode != "block":
            four = {k: v for k, v in deep.items() if k != "PROMOTE_OVERLAP"} | {"PROMOTE": 4}
            assert got["promoted every stage (PROMOTE=4)"] == four
            assert lab.interval_case_kwargs(8192, 8192, 28672, mode) == (deep, four)
        else:
            assert "promoted every stage (PROMOTE=4)" not in got
        assert lab.interval_candidates(16, 4096, 14336, mode) == []
        assert (lab.interval_check_kwargs(mode) is None) == (mode == "block")
    assert lab.interval_check_kwargs("tensor")[1] == {**lab.interval_check_kwargs("tensor")[0], "PROMOTE": 8,
                                                      "PROMOTE_OVERLAP": True}
    summ = _lab_module("fp8_interval_summary")

    def case(scale, g8, g4, g16, verified=True):
        c = {"L2 group 4": {"ms": 1.0, "ratio_to_pick": g4}, "L2 group 16": {"ms": 1.0, "ratio_to_pick": g16}}
        if g8 is not None:
            c["overlapped every 2nd stage"] = {"ms": 1.0, "ratio_to_pick": g8}
        return {"kind": "fp8_case", "M": 8192, "N": 8192, "K": 8192, "verified": verified, "device": "NVIDIA H100",
                "ratio_to_torch": 0.85, "suite": {"scale": scale, "file": "a.json", "name": "s"}, "candidates": c}
    ok = [{"kind": "interval_check", "scale": "tensor", "ok": True}]

    def verdict(chk, cases):
        return [r for r in summ.summarize(chk, cases) if r["set"] == "all"][0]["adopt"]
    assert verdict(ok, [case("tensor", 1.05, 1.0, 1.04), case("tensor", 1.04, 1.0, 1.05)]) == [
        "overlapped every 2nd stage", "L2 group 16"]
    assert verdict(ok, [case("tensor", 1.10, 1.0, 1.0), case("tensor", 0.97, 1.0, 1.0)]) == []   # floor
    assert verdict(ok, [case("tensor", 1.02, 1.0, 1.0), case("tensor", 1.03, 1.0, 1.0)]) == []   # geomean
    assert verdict([{**ok[0], "ok": False}], [case("tensor", 1.1, 1.0, 1.0)]) == []              # its check
    assert verdict([], [case("tensor", 1.1, 1.0, 1.0)]) == []                                    # no check
    assert verdict(ok, [case("tensor", 1.1, 1.0, 1.0), case("tensor", 1.1, 1.0, 1.0, False)]) == []
    assert verdict([], [case("block", None, 1.04, 1.06), case("block", None, 1.03, 1.05)]) == ["L2 group 16"]


def test_the_interval_readme_quotes_the_ratios_by_depth_from_the_records():
    """lab/fp8_on_hopper's section on the promotion every second stage quotes per K band the candidates'
    speed over the pick's (NVIDIA H100 80GB HBM3); fp8_interval_summary.by_depth computes them here from
    the committed A/B records."""
    import json
    summ = _lab_module("fp8_interval_summary")
    lab = ROOT / "lab" / "fp8_on_hopper"
    cases = [json.loads(line) for name in ("suite", "heldout")
             for line in (lab / "records" / f"fp8_interval_{name}_h100.jsonl").read_text().splitlines() if line.strip()]
    readme = " ".join((lab / "README.md").read_text(encoding="utf-8").split())
    for scale, name, label in (("tensor", "overlapped every 2nd stage", "Per tensor, by K band"),
                               ("row", "overlapped every 2nd stage", "Rowwise:"),
                               ("tensor", "L2 group 16", "per tensor L2 group 16 by K band:"),
                               ("row", "L2 group 4", "rowwise L2 group 4:")):
        text = summ.by_depth(cases, scale, name)
        assert text.count("cases") == 3, text
        assert text in readme, f"{label}: {text}"
