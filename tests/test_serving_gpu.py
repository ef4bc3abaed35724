"""The op inside serving stacks, on a GPU (marked `gpu`): a small decoder block patched with
tirx_gemm.patch under torch.compile(mode="reduce-overhead") and mode="max-autotune-no-cudagraphs"
at decode and prefill, two torch.cuda graphs sharing one memory pool, two streams overlapping,
eight threads calling at once, two processes loading one bundle, and the kernel names
torch.profiler shows.

The block (hidden 1024, 8 query and 2 key/value heads of 128, a fused q/k/v projection with a
bias, a SwiGLU MLP of 2816) runs its split-K kernels at decode (workspace operands: what
reduce-overhead refused before, "Detected 4 tensor(s) in the cudagraph pool not tracked as
outputs"). Its GEMMs at 1, 4 and 128 tokens are lab/serving_stacks/suites/serving_block.json:

    tirx-gemm export --suite lab/serving_stacks/suites/serving_block.json --arch sm_90a \\
        --num-sms 132 --out DIR
    TIRX_GEMM_BUNDLE=DIR python -m pytest -m gpu tests/test_serving_gpu.py

Skipped without an sm_90a GPU or without kernels (no bundle and no TVM); a test whose kernel the
bundle lacks says so and skips.
"""
import copy
import importlib.util
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

CAP = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
BF16 = torch.bfloat16
TOL = 2e-2  # max relative error against torch (bf16 both sides, fp32 accumulation)
H, HEADS, KV_HEADS, HEAD, INTER = 1024, 8, 2, 128, 2816
DECODE, PREFILL = (1, 1), (1, 128)  # (batch, tokens)


@pytest.fixture(autouse=True)
def _gpu():
    if CAP is None:
        pytest.skip("no CUDA GPU visible")
    if CAP != (9, 0):
        pytest.skip(f"needs an sm_90a GPU (compute capability 9.0); this one is {CAP[0]}.{CAP[1]}")
    if not os.environ.get("TIRX_GEMM_BUNDLE") and importlib.util.find_spec("tvm") is None:
        pytest.skip("no kernels: set TIRX_GEMM_BUNDLE (see the module docstring) or install TVM")


def _serve(fn):
    """fn() then a guarded synchronize; skips when the bundle lacks a kernel."""
    import tirx_gemm.matmul as mm
    try:
        out = fn()
        mm.synchronize()
        return out
    except ValueError as exc:
        if "in bundle" in str(exc) or "no kernel" in str(exc):
            pytest.skip(f"the bundle lacks a kernel: {str(exc).splitlines()[0]}")
        raise


def rel_err(got, want) -> float:
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


class Block(torch.nn.Module):
    """A Qwen2-style decoder block: RMSNorm, fused q/k/v with bias, causal GQA attention,
    output projection, RMSNorm, SwiGLU MLP; residuals around both halves."""

    def __init__(self):
        super().__init__()
        kv = KV_HEADS * HEAD
        self.n1 = torch.nn.RMSNorm(H, eps=1e-6)
        self.qkv = torch.nn.Linear(H, H + 2 * kv, bias=True)
        self.o = torch.nn.Linear(H, H, bias=False)
        self.n2 = torch.nn.RMSNorm(H, eps=1e-6)
        self.gate = torch.nn.Linear(H, INTER, bias=False)
        self.up = torch.nn.Linear(H, INTER, bias=False)
        self.down = torch.nn.Linear(INTER, H, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).split([H, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        q = q.view(B, T, HEADS, HEAD).transpose(1, 2)
        k = k.view(B, T, KV_HEADS, HEAD).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, 1)
        v = v.view(B, T, KV_HEADS, HEAD).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, 1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        x = x + self.o(att.transpose(1, 2).reshape(B, T, H))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _blocks(seed=0):
    """(torch's block, a patched copy sharing nothing)."""
    import tirx_gemm
    torch.manual_seed(seed)
    ref = Block().to("cuda", BF16).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    ours = copy.deepcopy(ref)
    report = tirx_gemm.patch(ours)
    assert len(report.replaced) == 5 and not report.kept, str(report)
    return ref, ours


def _x(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, H, device="cuda", dtype=BF16, generator=g)


def _fallbacks(model) -> int:
    return sum(getattr(m, "fallbacks", 0) for m in model.modules())


def _compiled_runs(mode):
    """The patched block compiled with ``mode`` against torch eager at decode and prefill, three
    calls per shape (warm-up, recording, replay for reduce-overhead) with new inputs each."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("inductor needs triton")
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    ref, ours = _blocks()
    compiled = torch.compile(ours, mode=mode, dynamic=False)
    with torch.inference_mode():
        for shape in (DECODE, PREFILL):
            for i in range(3):
                torch.compiler.cudagraph_mark_step_begin()
                x = _x(shape, seed=10 * i + shape[1])
                got = _serve(lambda: compiled(x)).clone()
                err = rel_err(got, ref(x))
                assert err < TOL, f"{mode} {shape} call {i}: {err:.3g}"
    assert _fallbacks(ours) == 0
    skips = dict(counters["inductor"])
    assert not any("cudagraph_skip" in k and v for k, v in skips.items()), skips


def test_reduce_overhead_at_decode_and_prefill():
    _compiled_runs("reduce-overhead")


def test_max_autotune_no_cudagraphs_at_decode_and_prefill():
    _compiled_runs("max-autotune-no-cudagraphs")


def test_two_cuda_graphs_share_one_pool():
    """Decode captured in one graph and prefill in a second on the first's pool; both replay
    (in capture order) with new inputs and match torch."""
    ref, ours = _blocks(seed=1)
    xs = {s: _x(s, seed=s[1]) for s in (DECODE, PREFILL)}
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch's recipe has it
            for x in xs.values():
                _serve(lambda: ours(x))
        torch.cuda.current_stream().wait_stream(side)
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            y1 = ours(xs[DECODE])
        with torch.cuda.graph(g2, pool=g1.pool()):
            y2 = ours(xs[PREFILL])
        for seed in (3, 4):
            for (shape, x), g, y in zip(xs.items(), (g1, g2), (y1, y2)):
                x.copy_(_x(shape, seed))
                g.replay()
                _serve(lambda: None)
                assert rel_err(y, ref(x)) < TOL, f"{shape} replay seed {seed}"


def test_a_captured_split_call_replays_its_kernel_alone():
    """The decode block's split-K GEMM captured in a graph: its counters come from the
    device's capture arena (run/workspace.py), so a replay launches the tirx kernel and
    nothing else (no fill), and replays with new inputs match torch, interleaved with eager
    calls of the same shape (which use their stream's own counters)."""
    import tirx_gemm.torch_op as op
    from torch.profiler import ProfilerActivity, profile
    from tirx_gemm.run import workspace as W
    torch.manual_seed(5)
    w = torch.randn(H, INTER, device="cuda", dtype=BF16) / INTER ** 0.5
    x = torch.randn(1, INTER, device="cuda", dtype=BF16)
    _serve(lambda: op.matmul(x, w))
    used = W.arena_used(torch.cuda.current_device())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = op.matmul(x, w)
    assert W.arena_used(torch.cuda.current_device()) > used
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert names and all(n.startswith("tirx_") for n in names), names
    assert any("_split" in n for n in names), names
    for seed in (6, 7, 8):
        x.copy_(torch.randn(1, INTER, device="cuda", dtype=BF16, generator=torch.Generator(
            device="cuda").manual_seed(seed)))
        g.replay()
        eager = op.matmul(x, w)
        _serve(lambda: None)
        want = F.linear(x, w)
        assert rel_err(y, want) < TOL and rel_err(eager, want) < TOL, f"seed {seed}"


def test_two_streams_overlapping_get_their_own_workspace():
    """The decode block's split-K GEMM queued on two streams at once, many times: each stream
    first sleeps, then writes its input, then calls the op; every output matches torch. A
    kernel run on another stream than the current one would read the input before it is
    written, and two streams sharing a counter would corrupt each other's sums."""
    import tirx_gemm.torch_op as op
    torch.manual_seed(2)
    w = torch.randn(H, INTER, device="cuda", dtype=BF16) / INTER ** 0.5
    srcs = [torch.randn(1, INTER, device="cuda", dtype=BF16) for _ in range(2)]
    xs = [torch.zeros_like(s) for s in srcs]
    _serve(lambda: op.matmul(srcs[0], w))
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [[], []]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for rep in range(20):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                if rep == 0:
                    torch.cuda._sleep(2_000_000)  # ~1 ms: the input is written late
                    xs[i].copy_(srcs[i])
                outs[i].append(op.matmul(xs[i], w))
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    _serve(lambda: None)
    for i in range(2):
        want = F.linear(srcs[i], w)
        assert max(rel_err(y, want) for y in outs[i]) < TOL, f"stream {i}"


def test_eight_threads_at_once_load_each_kernel_once():
    import tirx_gemm.matmul as mm
    from tirx_gemm.run import loader
    torch.manual_seed(3)
    shapes = [(M, N, K) for M in (1, 128) for N, K in ((1536, H), (H, H), (INTER, H), (H, INTER))]
    ops = [(torch.randn(M, K, device="cuda", dtype=BF16),
            torch.randn(N, K, device="cuda", dtype=BF16) / K ** 0.5) for M, N, K in shapes]
    mm.clear_cache()
    loads, real = [], loader.load_kernel

    def counted(path):
        loads.append(str(path))
        return real(path)
    loader.load_kernel = counted
    try:
        barrier, results, errors = threading.Barrier(8), [None] * 8, []

        def work(i):
            try:
                barrier.wait()
                a, b = ops[i]
                results[i] = [mm.matmul(a, b) for _ in range(5)]
                torch.cuda.current_stream().synchronize()
            except Exception as exc:  # noqa: BLE001 (reported below)
                errors.append(f"{shapes[i]}: {exc}")
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        loader.load_kernel = real
    if errors and all("in bundle" in e for e in errors):
        pytest.skip(errors[0])
    assert not errors, errors
    _serve(lambda: None)
    assert len(loads) == len(set(loads)), loads  # each library loaded once
    for (a, b), ys in zip(ops, results):
        assert max(rel_err(y, F.linear(a, b)) for y in ys) < TOL


def test_two_processes_load_one_bundle_at_once():
    bundle = os.environ.get("TIRX_GEMM_BUNDLE")
    if not bundle:
        pytest.skip("needs TIRX_GEMM_BUNDLE")
    code = ("import torch, tirx_gemm.matmul as mm; a = torch.randn(1, 2816, device='cuda', "
            "dtype=torch.bfloat16); b = torch.randn(1024, 2816, device='cuda', "
            "dtype=torch.bfloat16); y = mm.matmul(a, b, sync=True); "
            "e = float((y.float() - torch.nn.functional.linear(a, b).float()).abs().max() / "
            "torch.nn.functional.linear(a, b).float().abs().max()); print('err', e); "
            "raise SystemExit(e > 2e-2)")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs


def test_the_profiler_names_what_ran():
    from torch.profiler import ProfilerActivity, profile
    from tirx_gemm.compile.names import kernel_symbol
    import tirx_gemm.matmul as mm
    from tirx_gemm import registry
    _, ours = _blocks(seed=4)
    x = _x(DECODE, seed=5)
    with torch.inference_mode():
        _serve(lambda: ours(x))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _serve(lambda: ours(x))
    names = {e.key for e in prof.key_averages()}
    ours_names = {n for n in names if n.startswith("tirx_")}
    assert "kernel_kernel" not in names
    step, kw = mm.choose(1, H, INTER, "bfloat16", "sm_90a", torch.cuda.get_device_properties(
        0).multi_processor_count)
    want = kernel_symbol(registry.get(step, "sm_90a"), kw)
    assert want in ours_names, sorted(names)
    assert any(n.endswith("_bias_kernel") for n in ours_names), sorted(ours_names)
