"""Experts past 2^27 elements each -- Grok-1's down projection (E=8 of N x K = 6144 x 32768),
Jamba-1.5-Large's (E=16 of 24576 x 8192) -- on v14, both arches: TVM derives a tensor map's
byte strides from the operand's extents in their type, so int32 extents overflowed an expert's
weight stride (N*K elements x 16 bits: globalStrides[1] < 0, refused at compile time). v14
declares the weight's extents int64 where its stride needs it (tirx_gemm/hopper/grouped.py:
weight_shape): the strides are 64-bit, the device code is unchanged, and smaller weights keep
the kernels built before. What is still limited is refused before any build or launch, one
line each: the result's int32 store offsets (more than 2^31-1 elements) and a masked a's
expert stride (T*K bytes, computed in int32 on the host).

On the CPU: the op's checks (meta tensors, no memory), the tensor maps TVM lowers to (no nvcc),
and (nvcc) full builds of the kernels the op picks for Grok-1. Correctness on silicon: the
gpu-marked test below, with the kernels of

    python lab/moe_grouped_gemm/export_bundle.py --suite \
        lab/moe_grouped_gemm/suites/large_experts_gpu.json --own-tokens --out DIR
    TIRX_GEMM_BUNDLE=DIR python -m pytest -m gpu tests/test_grouped_large_experts.py

and tests/test_gpu_grouped.py; sm_100a's twin with wide extents on NumSim: lab/moe_grouped_gemm."""
import importlib
import importlib.util
import re

import pytest

torch = pytest.importorskip("torch")

from tirx_gemm.op import grouped as G  # noqa: E402
from tirx_gemm.op import grouped_fp8 as GF  # noqa: E402
from tirx_gemm.op.keywords import INT32_MAX  # noqa: E402

HAVE_TVM = importlib.util.find_spec("tvm") is not None
needs_tvm = pytest.mark.skipif(not HAVE_TVM, reason="the builders need TVM")

BF16 = torch.bfloat16
GROK = (8, 6144, 32768)        # E, N, K: the down projection, N*K = 3 * 2^26 > 2^27
JAMBA_UP = (16, 2 * 24576, 8192)  # the fused gate/up weight: N*K = 3 * 2^28


def meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


def one_line(exc_type, match, fn, *args, **kw):
    with pytest.raises(exc_type, match=match) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


# -- the op: Grok-1's experts pass the checks and the pick, in both orientations of b ----------
@pytest.mark.parametrize("orient", ["torch (E, K, N) view", "linear (E, N, K)"])
def test_grok_weights_pass_the_call_checks(orient):
    E, N, K = GROK
    w = meta(E, N, K)
    b = w.transpose(1, 2) if orient.startswith("torch") else w
    offs = meta(E, dtype=torch.int32)
    p = G.check_grouped_shapes(meta(4096, K), b, offs)
    assert (p.E, p.N, p.K, p.copy, p.out_shape) == (E, N, K, False, (4096, N))
    T = (2 ** 31 - 1) // (2 * K)  # the most rows per expert a masked a may have at this K
    p = G.check_grouped_shapes(meta(E, T, K), b, counts=offs)
    assert p.layout == "masked" and p.out_shape == (E, T, N)
    one_line(ValueError, rf"a masked a's T\*K = {T + 1}\*{K} .* past the grouped kernel's int32 "
             rf"expert stride \(2\^31 bytes\); use at most {T} rows per expert",
             G.check_grouped_shapes, meta(E, T + 1, K), b, counts=offs)


@pytest.mark.parametrize("layout", G.LAYOUTS)
def test_grok_and_jamba_are_picked_and_explained_on_sm90a(layout):
    for E, N, K in (GROK, JAMBA_UP):
        for tokens in (1, 64, 4096, (2 ** 31 - 1) // (2 * K) if layout == "masked" else 16384):
            rows = tokens * 2 if layout == "contiguous" else E * tokens
            step, kw = G.choose_grouped(rows, E, N, K, "bfloat16", layout, "sm_90a")
            assert step == "v14" and kw["E"] == E and kw["LAYOUT"] == layout
        assert G.explain_grouped(rows, E, N, K, "bfloat16", layout).startswith(f"{rows} rows")


# -- what is still limited: one line each, before any build or launch ---------------------
def test_a_result_past_int32_store_offsets_is_refused():
    E, N, K = GROK
    w64, offs = meta(E, N, 64), meta(E, dtype=torch.int32)
    rows = INT32_MAX // N
    G.check_grouped_shapes(meta(rows, 64), w64, offs)  # the most rows that fit
    msg = one_line(ValueError, rf"the result \({rows + 1}, {N}\) holds .* past 2\^31-1: .*int32 "
                   rf"offsets; split a's rows into calls of at most {rows} rows",
                   G.check_grouped_shapes, meta(rows + 1, 64), w64, offs)
    assert "clamp(offs" in msg
    T = INT32_MAX // (E * N) + 1  # 8 experts do not fit, 7 do
    one_line(ValueError, rf"the result \({E}, {T}, {N}\) .* split the experts into calls of at "
             rf"most {E - 1} ", G.check_grouped_shapes, meta(E, T, 64), w64,
             counts=offs)
    T = INT32_MAX // N + 1  # not even one expert fits: split its rows
    one_line(ValueError, rf"split a's T={T} rows per expert into calls of at most {T - 1} rows",
             G.check_grouped_shapes, meta(E, T, 64), w64, counts=offs)
    # the eager call refuses it before any launch (check_grouped runs check_grouped_shapes)
    one_line(ValueError, "past 2\\^31-1", G.check_grouped, meta(rows + 1, 64), w64,
             offs, require_cuda=False)


def test_fp8_result_past_int32_store_offsets_is_refused():
    E, N, K = 8, 6144, 256
    f8 = torch.float8_e4m3fn
    rows = INT32_MAX // N + 1
    sb = meta(E, N // 128, K // 128, dtype=torch.float32)
    one_line(ValueError, rf"the result \({rows}, {N}\) holds", GF.check_grouped_fp8,
             meta(rows, K, dtype=f8), meta(E, N, K, dtype=f8), meta(E, dtype=torch.int32),
             meta(rows, K // 128, dtype=torch.float32), sb, require_cuda=False)


def test_sm100a_twin_takes_grok_and_both_arches_refuse_a_masked_stride_past_int32():
    for E, N, K in (GROK, JAMBA_UP):  # the twin's weight extents widen as sm_90a's do
        step, kw = G.choose_grouped(4096, E, N, K, "bfloat16", "contiguous", "sm_100a")
        assert step == "v14" and kw["E"] == E
    E, N, K = GROK
    for arch in ("sm_100a", "sm_90a"):  # a masked a's expert stride: every arch
        one_line(ValueError, r"a masked a's T\*K = 32768\*32768 .* int32 expert stride",
                 G.choose_grouped, E * 32768, E, 1024, K, "bfloat16", "masked", arch)
        G.choose_grouped(E * 32767, E, 1024, K, "bfloat16", "masked", arch)


# -- TVM: the tensor maps' strides, lowered without nvcc ----------------------------------
def _lower(arch, N, K, **kw):
    """The kernel through TVM's tirx lowering (no nvcc); the lowered module's script."""
    import tvm
    from tirx_gemm import registry
    func = registry.get("v14", arch).build_primfunc(1024, N, K, **kw).with_attr(
        "global_symbol", "k")
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    mod = tvm.tirx.transform.BindTarget(target)(tvm.IRModule({"main": func}))
    with target:
        return tvm.tirx.get_tir_pipeline("tirx")[0](mod).script()


def _tensor_maps(monkeypatch, arch, N, K, **kw):
    """{operand: TVM's TensorMapSpec} of every TMA the kernel issues, as TVM validates them."""
    from tvm.backend.cuda.tile_primitive.copy_async import tma
    tma = vars(tma).get("__tvm_backend_module__", tma)  # the module itself, not TVM's alias
    specs, check = {}, tma._validate_explicit

    def record(spec, stage):
        specs.setdefault(spec.descriptor_name, spec)
        return check(spec, stage)
    monkeypatch.setattr(tma, "_validate_explicit", record)
    _lower(arch, N, K, **kw)
    return specs


CASES = [("sm_90a", GROK, dict(dtype="bfloat16", BLK_N=256, TMA_STORE=True), 2),
         ("sm_90a", GROK, dict(dtype="bfloat16", LAYOUT="masked", SWAP_AB=True, BLK_M=64,
                               BLK_N=16), 2),
         ("sm_90a", JAMBA_UP, dict(dtype="bfloat16", BLK_N=256, SWIGLU="halves",
                                   LAYOUT="masked"), 2),
         ("sm_100a", GROK, dict(dtype="bfloat16", BLK_N=256), 2),
         ("sm_100a", GROK, dict(dtype="bfloat16", LAYOUT="masked", SWAP_AB=True, BLK_N=16), 2),
         ("sm_100a", JAMBA_UP, dict(SCALE="mx"), 1)]  # e4m3: wide from N*K = 2^28


@needs_tvm
@pytest.mark.parametrize("arch,shape,kw,nbytes", CASES,
                         ids=["grok-contiguous", "grok-masked-swap", "jamba-swiglu-masked",
                              "twin-grok-contiguous", "twin-grok-masked-swap", "twin-jamba-mx"])
def test_tensor_maps_take_64_bit_strides(monkeypatch, arch, shape, kw, nbytes):
    E, N, K = shape
    specs = _tensor_maps(monkeypatch, arch, N, K, E=E, **kw)
    b = specs["B"]
    assert [int(s) for s in b.global_strides] == [K * nbytes, N * K * nbytes]
    assert all(str(s.ty) == "int64" for s in b.global_strides), b.global_strides
    assert int(specs["A"].global_strides[0]) == K * nbytes


def _device_text(script: str) -> str:
    """The lowered kernel past the host's tensor-map encodes, its CSE names renumbered."""
    body = script[script.index("\n", script.rindex("tensormap_encode_tiled")):]
    names: dict = {}
    return re.sub(r"cse_v\d+", lambda m: names.setdefault(m.group(0), f"cse#{len(names)}"),
                  body)


@needs_tvm
@pytest.mark.parametrize("arch,kw", [("sm_90a", dict()),
                                     ("sm_90a", dict(LAYOUT="masked", dtype="bfloat16")),
                                     ("sm_90a", dict(FP8_BLOCK=True, LAYOUT="masked", BLK_M=64)),
                                     ("sm_90a", dict(BLK_N=256, TMA_STORE=True, TAIL_SPLIT=4,
                                                     dtype="bfloat16")),
                                     ("sm_100a", dict()),
                                     ("sm_100a", dict(LAYOUT="masked", dtype="bfloat16")),
                                     ("sm_100a", dict(SCALE="mx"))],
                         ids=["contiguous", "masked", "fp8-masked", "tail-split", "twin-contiguous",
                              "twin-masked", "twin-mx"])
def test_wide_extents_change_no_device_code(monkeypatch, arch, kw):
    """A weight under the bound keeps int32 extents (the kernels built before, host code and
    all); int64 ones, forced here at the same shape, change the host's tensor-map encodes and
    argument checks only: the kernel lowers to the same code (so the same SASS, registers)."""
    from tirx_gemm.hopper import grouped as HG
    narrow = _lower(arch, 1024, 1024, **kw)
    monkeypatch.setattr(HG, "WIDE_FROM_BITS", 0)  # every weight wide
    wide = _lower(arch, 1024, 1024, **kw)
    assert "T.int64(1024)" in wide and "T.int64(1024)" not in narrow
    assert _device_text(wide) == _device_text(narrow)


# -- nvcc: the kernels the op picks for Grok-1 build --------------------------------------
@needs_tvm
def test_grok_builds_the_picked_kernels():
    from tirx_gemm import registry
    from tirx_gemm.compile.api import build_many
    E, N, K = GROK
    step = registry.get("v14", "sm_90a")
    kws = []
    for layout in G.LAYOUTS:
        for tokens in (8, 8192):  # decode (swap-AB) and prefill (the wide tile)
            rows = tokens * 2 if layout == "contiguous" else E * tokens
            kws.append(G.choose_grouped(rows, E, N, K, "bfloat16", layout)[1])
    kws += [dict(E=E, dtype="bfloat16", FP8_BLOCK=True, LAYOUT="masked"),
            dict(E=E, dtype="bfloat16", CLUSTER=2)]
    out = build_many([(step, (1024, N, K), kw) for kw in kws])
    for kw, r in zip(kws, out):
        assert not isinstance(r, Exception), (kw, r)
        assert r.spill_stores == 0 and r.spill_loads == 0, kw
        assert any(k.startswith("UTMALDG.3D") for k in r.sass_counts), (kw, sorted(r.sass_counts))


# -- on an sm_90a GPU (marked gpu): the results of experts past 2^27 elements --------------
def _sm90a_kernels():
    """Skip unless an sm_90a GPU and v14's kernels (TVM here, or TIRX_GEMM_BUNDLE) are at hand."""
    import os
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90a GPU (compute capability 9.0)")
    if not os.environ.get("TIRX_GEMM_BUNDLE") and not HAVE_TVM:
        pytest.skip("no kernels: set TIRX_GEMM_BUNDLE or install TVM")


def _rel_err(got, want) -> float:
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 1536], ids=["decode-swap-ab", "prefill-wide"])
def test_gpu_grok_contiguous_matches_torch(rows):
    """Every expert's rows, the last expert's weight 7 * 6144 * 32768 * 2 bytes (2.8 GiB) in:
    an expert stride that int32 bytes could not hold; b as torch's (E, K, N) view."""
    _sm90a_kernels()
    from tirx_gemm.op.grouped import grouped_mm
    E, N, K = GROK
    g = torch.Generator(device="cuda").manual_seed(rows)
    w = torch.randn(E, N, K, device="cuda", dtype=BF16, generator=g) / K ** 0.5
    a = torch.randn(rows, K, device="cuda", dtype=BF16, generator=g)
    counts = torch.full((E,), rows // E, dtype=torch.int64)
    counts[0], counts[-1] = counts[0] - 1, counts[-1] + 1  # uneven, the last expert fullest
    offs = counts.cumsum(0).to(torch.int32).cuda()
    got = grouped_mm(a, w.transpose(1, 2), offs, sync=True)
    start = 0
    for e, end in enumerate(offs.tolist()):
        want = a[start:end].float() @ w[e].float().T
        assert _rel_err(got[start:end], want) < 2e-2, f"expert {e}"
        start = end


def test_the_steps_widen_where_the_op_says_int32_strides_end():
    """One bound, two homes that must agree: v14 widens a weight's extents from
    WIDE_FROM_BITS, the op's masked-a limit stops at INT32_STRIDE_BITS."""
    from tirx_gemm.hopper import grouped as HG
    from tirx_gemm.op import grouped_limits as GL
    assert HG.WIDE_FROM_BITS == GL.INT32_STRIDE_BITS
