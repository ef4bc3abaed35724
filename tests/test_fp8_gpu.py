"""Fp8Linear, patch_fp8 and the fp8 custom op on an sm_90a GPU (marked `gpu`): each scale kind
against the fp32 product of its own quantized operands and against the bf16 layer on
real-scale activations (outlier channels), CUDA-graph capture and replay,
torch.compile(fullgraph=True), patch_fp8 on a small model, and the errors before launch.

Skipped without a CUDA GPU of arch sm_90a, or without kernels (no TIRX_GEMM_BUNDLE and no TVM).
The kernels take the whole shape at run time, so a bundle of every kernel matmul_fp8 can pick
serves every test (a bundle of the fp8 suite alone lacks the splits this module's small layers
pick, e.g. SPLIT_K 4 at 16x512x1024):

    python lab/fp8_on_hopper/fp8_export.py --out DIR --no-run-shapes
    TIRX_GEMM_BUNDLE=DIR python -m pytest -m gpu tests/test_fp8_gpu.py
"""
import importlib.util
import os

import pytest
import torch

pytestmark = pytest.mark.gpu

CAP = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
BF16 = torch.bfloat16
# the fp8 layer against its own quantized operands' fp32 product (the kernel's contract:
# promoted fp32 accumulation, one bf16 rounding): bf16's rounding and then some
KERNEL_TOL = 1e-2
# the fp8 layer against the bf16 layer on real-scale activations: e4m3's 3 mantissa bits
# on both operands (about 2**-4 relative per element, averaging down over K)
LAYER_TOL = {"row": 0.06, "block": 0.06, "tensor": 0.12}


@pytest.fixture(autouse=True)
def _gpu():
    if CAP is None:
        pytest.skip("no CUDA GPU visible")
    if CAP != (9, 0):
        pytest.skip(f"needs an sm_90a GPU (compute capability 9.0); this one is {CAP}")
    if not os.environ.get("TIRX_GEMM_BUNDLE") and importlib.util.find_spec("tvm") is None:
        pytest.skip("no kernels: set TIRX_GEMM_BUNDLE to a bundle or install TVM")


def _sync():
    import tirx_gemm.matmul as mm
    mm.synchronize()


def rel_err(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def activations(M, K, seed=0):
    """Real-scale activations: randn with every 97th channel 30x (outlier channels) and
    per-token powers of two."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=g)
    x[:, ::97] *= 30
    x *= torch.exp2(torch.randint(-3, 4, (M, 1), device="cuda", generator=g).float())
    return x.to(BF16)


def linear(K, N, bias=True, seed=1):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias, device="cuda", dtype=BF16)
    with torch.no_grad():
        lin.weight *= torch.exp2(torch.rand(N, 1, device="cuda") * 2 - 1).to(BF16)
    return lin.requires_grad_(False)


@pytest.mark.parametrize("scale", ["row", "block"])
def test_split_k_matches_the_unsplit_kernel_and_repeats_bit_for_bit(scale):
    """64x576x7168 (DeepSeek-V3's kv_a_proj at 64 tokens): 36 tiles, so matmul_fp8 splits K
    in two; the sum in split order gives the same bits every call."""
    from tirx_gemm.op import fp8
    M, N, K = 64, 576, 7168
    kw = fp8.choose_fp8(M, scale, False, N=N, K=K)
    assert kw["SPLIT_K"] == 2
    x, w = activations(M, K).float(), linear(K, N, bias=False).weight.float()
    qa, sa = fp8.quantize(x, scale, "a")
    qb, sb = fp8.quantize(w, scale, "b")
    y1, y2 = fp8.matmul_fp8(qa, qb, sa, sb), fp8.matmul_fp8(qa, qb, sa, sb)
    plain = {k: v for k, v in kw.items() if k not in ("SPLIT_K", "L2_GROUP")}
    y0 = fp8.matmul_fp8(qa, qb, sa, sb, _kwargs=plain)
    _sync()
    assert torch.equal(y1, y2)
    assert rel_err(y1, fp8.reference(qa, qb, sa, sb, scale)) < KERNEL_TOL
    assert rel_err(y1, y0) < KERNEL_TOL


def test_bad_inputs_are_refused_before_launch():
    from tirx_gemm.op import fp8
    a = torch.zeros(64, 400, device="cuda").to(torch.float8_e4m3fn)
    b = torch.zeros(128, 400, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.ones(64, 4, device="cuda"), torch.ones(1, 4, device="cuda")
    with pytest.raises(ValueError, match="multiple of 128"):
        fp8.matmul_fp8(a, b, sa, sb)
    e5 = torch.zeros(64, 256, device="cuda").to(torch.float8_e5m2)
    with pytest.raises(TypeError, match="only e4m3"):
        fp8.matmul_fp8(e5, e5, torch.ones((), device="cuda"), torch.ones((), device="cuda"))


@pytest.mark.parametrize("scale", ["row", "block", "tensor"])
@pytest.mark.parametrize("M", [1, 77, 256])
def test_fp8_linear_matches_its_quantized_product_and_the_bf16_layer(scale, M):
    from tirx_gemm.op import fp8, fp8_nn
    lin = linear(1024, 768)
    layer = fp8_nn.Fp8Linear.from_linear(lin, scale, strict=True)
    x = activations(M, 1024)
    y = layer(x)
    _sync()
    qa, sa = fp8_nn.quantize_activation(x, scale)
    ref = fp8.reference(qa, layer.weight, sa, fp8_nn._kernel_scale(layer.weight_scale, scale),
                        scale) + layer.bias.float()
    assert y.dtype == BF16 and y.shape == (M, 768)
    assert rel_err(y, ref) < KERNEL_TOL
    assert rel_err(y, lin(x)) < LAYER_TOL[scale]


def test_from_checkpoint_block_scales_equal_from_linear():
    from tirx_gemm.op import fp8_nn
    lin = linear(512, 384, bias=False)
    a = fp8_nn.Fp8Linear.from_linear(lin, "block", strict=True)
    b = fp8_nn.Fp8Linear.from_checkpoint(a.weight.clone(), a.weight_scale.clone(), strict=True)
    assert b.scale == "block"
    x = activations(64, 512)
    assert torch.equal(a(x), b(x))


def test_cuda_graph_replays_the_layer_with_new_inputs():
    from tirx_gemm.op import fp8_nn
    layer = fp8_nn.Fp8Linear.from_linear(linear(1024, 512), "block", strict=True)
    x = activations(16, 1024)
    layer(x)  # warm: loads the kernel
    _sync()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = layer(x)
    x.copy_(activations(16, 1024, seed=5))
    g.replay()
    _sync()
    assert torch.equal(y, layer(x))


def test_torch_compile_fullgraph_runs_the_custom_op():
    from tirx_gemm.op import fp8_nn
    model = torch.nn.Sequential(linear(512, 1024), torch.nn.GELU(), linear(1024, 256))
    fp8_nn.patch_fp8(model, "row")
    x = activations(33, 512)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    got = compiled(x)
    _sync()
    assert rel_err(got, eager) < KERNEL_TOL


def test_patch_fp8_replaces_every_linear_and_stays_close_to_bf16():
    from tirx_gemm.op import fp8_nn
    model = torch.nn.Sequential(linear(512, 1024), torch.nn.ReLU(), linear(1024, 512))
    x = activations(128, 512)
    want = model(x)
    rep = fp8_nn.patch_fp8(model, "block")
    assert len(rep.replaced) == 2 and not rep.kept
    assert all(isinstance(m, fp8_nn.Fp8Linear) for m in (model[0], model[2]))
    assert rel_err(model(x), want) < 2 * LAYER_TOL["block"]
