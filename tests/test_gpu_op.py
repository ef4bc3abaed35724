"""tirx_gemm in PyTorch on a GPU (marked `gpu`): the custom op and tirx_gemm.nn against torch's
numbers, CUDA-graph capture and replay, torch.compile(fullgraph=True) with inductor, Linear
with a bias, and patch on a small model.

Skipped without a CUDA GPU of arch sm_90a, and when the kernels cannot be had: no bundle in
TIRX_GEMM_BUNDLE and no TVM here, or a bundle without a shape a test needs (the test says
which). The shapes are the (N, K) pairs of scripts/bench_model.py's Llama-3-8B block, mostly
at its token counts (M = 1, 8, 64, 128, 256, 1000; M = 7, 77, 333 besides), so the bundle
exported for that benchmark serves them:

    python scripts/bench_model.py --print-shapes > llama8b_block.json
    tirx-gemm export --suite llama8b_block.json --arch sm_90a --num-sms 132 --out DIR
    TIRX_GEMM_BUNDLE=DIR python -m pytest -m gpu tests/test_gpu_op.py

Every wait goes through tirx_gemm.matmul.synchronize (the project's hang guard).
"""
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

CAP = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
BF16, FP16 = torch.bfloat16, torch.float16
TOL = 2e-2  # max relative error against torch, bf16 and fp16 (fp32 accumulation both sides)


@pytest.fixture(autouse=True)
def _gpu():
    if CAP is None:
        pytest.skip("no CUDA GPU visible")
    if CAP != (9, 0):
        pytest.skip(f"needs an sm_90a GPU (compute capability 9.0); this one is "
                    f"{CAP[0]}.{CAP[1]}")
    if not os.environ.get("TIRX_GEMM_BUNDLE") and importlib.util.find_spec("tvm") is None:
        pytest.skip("no kernels: set TIRX_GEMM_BUNDLE to a bundle (see the module docstring) "
                    "or install TVM")


def _sync():
    import tirx_gemm.matmul as mm
    mm.synchronize()


def _serve(fn):
    """fn(), skipping the test when the bundle lacks the kernel it needs."""
    try:
        out = fn()
        _sync()
        return out
    except ValueError as exc:
        if "in bundle" in str(exc) or "no kernel" in str(exc):
            pytest.skip(f"the bundle lacks a kernel: {str(exc).splitlines()[0]}")
        raise


def rel_err(got, want) -> float:
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


def _operands(M, N, K, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(N, K, device="cuda", dtype=dtype, generator=g) / K ** 0.5
    return a, b


NK = [(1024, 4096), (4096, 4096), (14336, 4096), (4096, 14336)]
MS = [1, 8, 64, 128, 256, 1000, 7, 77, 333]


@pytest.mark.parametrize("N,K", NK, ids=[f"{n}x{k}" for n, k in NK])
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_every_token_count_matches_torch(N, K, dtype):
    from tirx_gemm import torch_op
    for M in MS:
        a, b = _operands(M, N, K, dtype, seed=M)
        want = F.linear(a, b)
        for name, call in (("direct", lambda: torch_op.matmul(a, b)),
                           ("op", lambda: torch_op.OP(a, b))):
            got = _serve(call)
            assert got.shape == (M, N) and got.dtype == dtype
            assert rel_err(got, want) < TOL, f"{name} M={M}: {rel_err(got, want):.3g}"


def test_opcheck():
    from tirx_gemm import torch_op
    a, b = _operands(77, 1024, 4096, BF16)
    _serve(lambda: torch_op.OP(a, b))
    torch.library.opcheck(torch_op.OP, (a, b),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_cuda_graph_capture_and_replay():
    from tirx_gemm import torch_op
    a, b = _operands(64, 4096, 4096, BF16)
    _serve(lambda: torch_op.matmul(a, b))  # loaded before capture
    static_a = a.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch_op.matmul(static_a, b)
        torch_op.OP(static_a, b)
    torch.cuda.current_stream().wait_stream(s)
    _sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y1 = torch_op.matmul(static_a, b)
        y2 = torch_op.OP(static_a, b)
    for seed in (1, 2):
        new, _ = _operands(64, 4096, 4096, BF16, seed=seed)
        static_a.copy_(new)
        g.replay()
        _sync()
        want = F.linear(new, b)
        assert rel_err(y1, want) < TOL and rel_err(y2, want) < TOL


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from tirx_gemm.nn import Linear
        self.up = Linear(4096, 4096, bias=True, device="cuda", dtype=BF16)
        self.down = Linear(4096, 1024, bias=True, device="cuda", dtype=BF16)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def _torch_mlp(m):
    return lambda x: F.linear(F.gelu(F.linear(x, m.up.weight, m.up.bias)), m.down.weight,
                              m.down.bias)


def test_linear_with_bias_matches_torch_and_never_falls_back():
    torch.manual_seed(0)
    m = _Mlp().eval()
    ref = _torch_mlp(m)
    with torch.inference_mode():
        for shape in ((1, 4096), (2, 4, 4096), (128, 4096)):
            x = torch.randn(shape, device="cuda", dtype=BF16)
            got = _serve(lambda: m(x))
            assert got.shape == (*shape[:-1], 1024)
            assert rel_err(got, ref(x)) < TOL
    assert m.up.fallbacks == 0 and m.down.fallbacks == 0


def test_torch_compile_fullgraph_with_inductor():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("inductor needs triton")
    torch.manual_seed(1)
    m = _Mlp().eval()
    ref = _torch_mlp(m)
    compiled = torch.compile(m, fullgraph=True)
    with torch.inference_mode():
        for M in (8, 64, 256):
            x = torch.randn(M, 4096, device="cuda", dtype=BF16)
            got = _serve(lambda: compiled(x))
            assert rel_err(got, ref(x)) < TOL


def test_patch_on_a_small_model():
    torch.manual_seed(2)
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 4096, bias=False), torch.nn.SiLU(),
        torch.nn.Linear(4096, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1020),  # out-features not a multiple of 8: kept on torch
    ).to("cuda", BF16).eval()
    x = torch.randn(2, 32, 4096, device="cuda", dtype=BF16)
    with torch.inference_mode():
        want = model(x)
        import tirx_gemm
        report = tirx_gemm.patch(model)
        assert [n for n, _ in report.replaced] == ["0", "2"]
        assert [n for n, _ in report.kept] == ["4"] and "1020" in report.kept[0][1]
        got = _serve(lambda: model(x))
    assert rel_err(got, want) < TOL
    assert sum(getattr(m, "fallbacks", 0) for m in model.modules()) == 0


# a bias where the decode rule splits K (rule split_bias): Qwen2.5-7B-sized k/v projections
# at 1, 8 and 32 tokens, 14B-sized k/v and StarCoder2-7B's c_proj (128-row tiles; the suites
# decode_split_bias.json and decode_split_bias_check.json of lab/serving_stacks)
SPLIT_BIAS = ((1, 512, 3584), (8, 512, 3584), (32, 512, 3584), (1, 1024, 5120), (1, 4608, 18432))


@pytest.mark.parametrize("M,N,K", SPLIT_BIAS, ids=[f"{m}x{n}x{k}" for m, n, k in SPLIT_BIAS])
def test_a_bias_on_the_decode_split_matches_torch_and_repeats_its_bits(M, N, K):
    """matmul(a, w, bias) where the plain GEMM splits K runs that split with the bias (the
    kernel name says ``_split<S>_bias``): within TOL of F.linear, within the epilogue's
    tolerance of float64, the same bits on a second call (the reduction's fixed order), and
    the plain call after it unchanged (the counters back at zero)."""
    import tirx_gemm.matmul as mm
    from tirx_gemm import epilogue as E
    from tirx_gemm.op.rules import explain
    a, w = _operands(M, N, K, BF16, seed=M + N)
    b = torch.randn(N, device="cuda", dtype=BF16) * 0.5
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel = explain(M, N, K, "bfloat16", "sm_90a", sms, {"BIAS": "bfloat16"}).splitlines()[1]
    assert "_swap_split" in kernel and kernel.endswith("_bias_kernel"), kernel
    got = _serve(lambda: mm.matmul(a, w, b))
    again = _serve(lambda: mm.matmul(a, w, b))
    assert torch.equal(got, again)
    assert rel_err(got, F.linear(a, w, b)) < TOL
    ref = (a.double() @ w.double().t() + b.double()).float().cpu().numpy()
    res = E.compare_np(got.float().cpu().numpy(), ref, {"BIAS": "bfloat16"}, "bfloat16", K=K)
    assert res.ok, f"{kernel.split()[-1]}: {res.reason}"
    plain = _serve(lambda: mm.matmul(a, w))
    assert rel_err(plain, F.linear(a, w)) < TOL


# gelu_tanh's one-MUFU epilogue (v12 ACT_APPROX), matmul's pick for a bf16 gelu_tanh at 128 x 128
# and 128 x 256 tiles: 4096 x 1024 layers at 512 tokens (128 x 128), 1000 (a ragged last row
# block) and 2048 (128 x 256)
APPROX_MS = (512, 1000, 2048)


@pytest.mark.parametrize("bias", (True, False), ids=("bias", "no_bias"))
@pytest.mark.parametrize("M", APPROX_MS)
def test_gelu_tanh_runs_the_one_mufu_epilogue_within_tolerance_of_torch(M, bias):
    """matmul(a, w, bias, "gelu_tanh") in bf16 runs v12 with ACT_APPROX (the kernel name says
    ``gelutanh_approx``), and its result is within the fused epilogue's tolerance of float64
    F.gelu(approximate="tanh") (epilogue.compare_np) and within TOL of torch's own bf16 path."""
    import tirx_gemm.matmul as mm
    from tirx_gemm import epilogue as E
    from tirx_gemm.op.rules import explain
    N, K = 4096, 1024
    a, w = _operands(M, N, K, BF16, seed=M + bias)
    b = (torch.randn(N, device="cuda", dtype=BF16) * 0.5) if bias else None
    epi = {"ACT": "gelu_tanh", **({"BIAS": "bfloat16"} if bias else {})}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel = explain(M, N, K, "bfloat16", "sm_90a", sms, epi).splitlines()[1]
    assert kernel.endswith("_gelutanh_approx_kernel"), kernel
    got = _serve(lambda: mm.matmul(a, w, b, "gelu_tanh"))
    z = a.double() @ w.double().t() + (b.double() if bias else 0)
    ref = F.gelu(z, approximate="tanh")
    res = E.compare_np(got.float().cpu().numpy(), ref.float().cpu().numpy(), epi, "bfloat16", K=K)
    assert res.ok, f"{kernel.split()[-1]} M={M}: {res.reason}"
    want = F.gelu(F.linear(a, w, b), approximate="tanh")
    assert rel_err(got, want) < TOL, f"M={M}: {rel_err(got, want):.3g} against torch's bf16"
