"""tirx_gemm.grouped_mm on a GPU (marked `gpu`): grouped correctness against torch (contiguous and
masked, empty experts, one expert holding every row, bias, row scale and SwiGLU -- fused in
v14's epilogue, launched directly and through the op -- and split stores), CUDA-graph replay
with new routing, torch.compile(fullgraph=True), the refusals on CUDA tensors, and tirx_gemm
Experts / patch_moe against a Mixtral-style and a Qwen3-MoE-style block (transformers' own when
it is installed, else the CPU tests' copies of their structure).

Skipped without a CUDA GPU of arch sm_90a; the tests that launch v14 skip when its kernels
cannot be had (no bundle in TIRX_GEMM_BUNDLE and no TVM here, or a bundle without the kernel:
the test says which). The op-side tests (refusals, routing checks, permute under capture)
run without kernels. The shapes are lab/moe_grouped_gemm's small ones; its export script
writes the bundle they need:

    python lab/moe_grouped_gemm/export_bundle.py --tests --out DIR
    TIRX_GEMM_BUNDLE=DIR python -m pytest -m gpu tests/test_gpu_grouped.py
"""
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

CAP = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
BF16, FP16 = torch.bfloat16, torch.float16
TOL = 2e-2  # max relative error against torch, fp32 accumulation both sides
# (E, N, K) of the tests: 8 experts of a 1024x512 weight, and 128 small ones
SHAPES = [(8, 1024, 512), (128, 256, 128)]


@pytest.fixture(autouse=True)
def _gpu():
    if CAP is None:
        pytest.skip("no CUDA GPU visible")
    if CAP != (9, 0):
        pytest.skip(f"needs an sm_90a GPU (compute capability 9.0); this one is "
                    f"{CAP[0]}.{CAP[1]}")


@pytest.fixture
def kernels():
    from tirx_gemm import registry
    try:
        registry.get("v14", "sm_90a")
    except ValueError as exc:
        pytest.skip(f"no v14 step registered: {exc}")
    if not os.environ.get("TIRX_GEMM_BUNDLE") and importlib.util.find_spec("tvm") is None:
        pytest.skip("no kernels: set TIRX_GEMM_BUNDLE to a bundle (see the module docstring) "
                    "or install TVM")


def _sync():
    from tirx_gemm.op.matmul import synchronize
    synchronize()


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


def routing(rows, E, seed=0, hot=None):
    """Skewed counts of ``rows`` rows over E experts (some hot, some empty), as int32 offs."""
    g = torch.Generator().manual_seed(seed)
    if hot is not None:
        counts = torch.zeros(E, dtype=torch.int64)
        counts[hot] = rows
    else:
        p = torch.rand(E, generator=g) ** 4
        p[torch.randperm(E, generator=g)[: E // 4]] = 0  # a quarter of the experts empty
        counts = torch.distributions.Multinomial(rows, p / p.sum()).sample().long() \
            if rows else torch.zeros(E, dtype=torch.int64)
    return counts.cumsum(0).to(torch.int32).cuda()


def operands(M, E, N, K, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(E, N, K, device="cuda", dtype=dtype, generator=g) / K ** 0.5
    return a, w


def reference(a, w, offs):
    out, start = torch.zeros(a.shape[0], w.shape[1], device=a.device), 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end].float() @ w[e].float().T
        start = end
    return out


# -- op side: no kernel needed ------------------------------------------------------------
def test_refusals_on_cuda_tensors():
    from tirx_gemm.op.grouped import grouped_mm
    a, w = operands(16, 8, 256, 128, BF16)
    offs = routing(16, 8)
    with pytest.raises(ValueError, match="offs is on cpu but a is on cuda"):
        grouped_mm(a, w, offs.cpu())
    with pytest.raises(TypeError, match="offs is torch.int64"):
        grouped_mm(a, w, offs.long())
    with pytest.raises(ValueError, match="a is on cpu"):
        grouped_mm(a.cpu(), w.cpu(), offs.cpu())


def test_routing_checks_under_the_setting(monkeypatch):
    from tirx_gemm.op import grouped as G
    if G.CHECK_ENV not in G.settings.TABLE:
        pytest.skip(f"{G.CHECK_ENV} is not declared in tirx_gemm/settings.py yet")
    a, w = operands(16, 8, 256, 128, BF16)
    bad = torch.tensor([2, 9, 4, 16, 16, 16, 16, 16], dtype=torch.int32, device="cuda")
    monkeypatch.setenv(G.CHECK_ENV, "1")
    with pytest.raises(ValueError, match=r"offs decreases at expert 2"):
        G.grouped_mm(a, w, bad)


def test_permute_captures_in_a_graph():
    """The MoE forward's permute reads nothing on the host: it captures and replays."""
    from tirx_gemm.op import moe
    idx = torch.randint(0, 8, (64, 2), device="cuda")
    moe.permute(idx, 8)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        order, offs = moe.permute(idx, 8)
    idx.copy_(torch.randint(0, 8, (64, 2), device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    want = torch.bincount(idx.reshape(-1), minlength=8).cumsum(0)
    assert offs.tolist() == want.tolist()
    assert torch.equal(idx.reshape(-1)[order], idx.reshape(-1).sort(stable=True).values)


# -- the kernel ---------------------------------------------------------------------------
@pytest.mark.parametrize("E,N,K", SHAPES, ids=[f"E{e}_{n}x{k}" for e, n, k in SHAPES])
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_contiguous_matches_torch(kernels, E, N, K, dtype):
    from tirx_gemm.op.grouped import grouped_mm
    for rows in (1, 7, 64, 333, 2048):
        a, w = operands(rows, E, N, K, dtype, seed=rows)
        offs = routing(rows, E, seed=rows)
        got = _serve(lambda: grouped_mm(a, w.transpose(1, 2), offs))
        assert rel_err(got, reference(a, w, offs)) < TOL, f"rows={rows}"


@pytest.mark.parametrize("case", ["empty", "one_expert_all", "rows_past_offs"])
def test_edge_routings(kernels, case):
    from tirx_gemm.op.grouped import grouped_mm
    E, N, K = SHAPES[0]
    a, w = operands(300, E, N, K, BF16)
    if case == "empty":
        offs = torch.zeros(E, dtype=torch.int32, device="cuda")
    elif case == "one_expert_all":
        offs = routing(300, E, hot=5)
    else:
        offs = routing(200, E)  # rows 200..299 belong to no expert
    out = torch.full((300, N), float("nan"), dtype=BF16, device="cuda")
    _serve(lambda: grouped_mm(a, w, offs, out=out))
    end = int(offs[-1])
    if end:
        assert rel_err(out[:end], reference(a[:end], w, offs)) < TOL
    assert out[end:].isnan().all(), "rows past offs[-1] were written"


def test_masked_matches_torch(kernels):
    from tirx_gemm.op.grouped import grouped_mm
    E, N, K = SHAPES[0]
    a = torch.randn(E, 40, K, device="cuda", dtype=BF16)
    w = torch.randn(E, N, K, device="cuda", dtype=BF16) / K ** 0.5
    counts = torch.tensor([0, 40, 3, 17, 0, 1, 40, 8], dtype=torch.int32, device="cuda")
    out = torch.full((E, 40, N), float("nan"), dtype=BF16, device="cuda")
    _serve(lambda: grouped_mm(a, w, counts=counts, layout="masked", out=out))
    for e, c in enumerate(counts.tolist()):
        if c:
            assert rel_err(out[e, :c], a[e, :c].float() @ w[e].float().T) < TOL
        assert out[e, c:].isnan().all(), f"expert {e}: rows past counts were written"


@pytest.mark.parametrize("fused", [False, True], ids=["torch_epilogue", "fused"])
def test_bias_and_scale(kernels, fused, monkeypatch):
    from tirx_gemm.op import grouped_epilogue as GE
    from tirx_gemm.op.grouped import clear_cache, grouped_mm
    monkeypatch.setattr(GE, "ENABLED", fused)
    clear_cache()
    E, N, K = SHAPES[0]
    a, w = operands(256, E, N, K, BF16)
    offs = routing(256, E)
    bias = torch.randn(E, N, device="cuda", dtype=BF16)
    scale = torch.rand(256, device="cuda")
    got = _serve(lambda: grouped_mm(a, w, offs, bias=bias, scale=scale))
    owner = torch.searchsorted(offs, torch.arange(256, device="cuda", dtype=torch.int32),
                               right=True)
    want = (reference(a, w, offs) + bias.float()[owner]) * scale[:, None]
    assert rel_err(got, want) < TOL


# v14's fused epilogue (ROW_SCALE, BIAS, SWIGLU) and split stores (STORE_STEPS), each launched
# directly at (E, N, K) = SHAPES[0], bf16: (name, layout, the tile's and epilogue's keywords).
# lab/moe_grouped_gemm/export_bundle.py --tests exports these.
FUSED_CASES = [
    ("tile", "contiguous", dict(BLK_M=128, BLK_N=128, ROW_SCALE=True, BIAS=True)),
    ("swap", "contiguous", dict(BLK_M=64, BLK_N=16, SWAP_AB=True, ROW_SCALE=True, BIAS=True)),
    ("masked", "masked", dict(BLK_M=128, BLK_N=128, ROW_SCALE=True, BIAS=True)),
    ("masked_swap", "masked", dict(BLK_M=64, BLK_N=16, SWAP_AB=True, ROW_SCALE=True, BIAS=True)),
    ("split_stores", "contiguous", dict(BLK_M=128, BLK_N=256, STORE_STEPS=4)),
    ("split_stores_fused", "contiguous", dict(BLK_M=128, BLK_N=256, STORE_STEPS=4,
                                              ROW_SCALE=True)),
    ("swiglu_halves", "contiguous", dict(BLK_M=128, BLK_N=256, SWIGLU="halves")),
    ("swiglu_interleaved", "contiguous", dict(BLK_M=128, BLK_N=128, SWIGLU="interleaved",
                                              STORE_STEPS=2)),
    ("swiglu_halves_masked", "masked", dict(BLK_M=128, BLK_N=128, SWIGLU="halves")),
    ("tma_store", "contiguous", dict(BLK_M=128, BLK_N=256, TMA_STORE=True)),
    ("tma_store_fused", "contiguous", dict(BLK_M=128, BLK_N=256, TMA_STORE=True, ROW_SCALE=True,
                                           BIAS=True)),
    ("half_wide_tma_store", "contiguous", dict(BLK_M=64, BLK_N=256, TMA_STORE=True)),
    ("half_wide_tma_store_fused", "contiguous", dict(BLK_M=64, BLK_N=256, TMA_STORE=True,
                                                     ROW_SCALE=True, BIAS=True)),
    ("half_wide_swiglu_halves", "contiguous", dict(BLK_M=64, BLK_N=256, SWIGLU="halves")),
    ("swap_swiglu_halves", "contiguous", dict(BLK_M=128, BLK_N=16, SWAP_AB=True,
                                              SWIGLU="halves")),
    ("swap_swiglu_halves_masked", "masked", dict(BLK_M=64, BLK_N=8, SWAP_AB=True,
                                                 SWIGLU="halves")),
    ("cluster_pair_tma_store", "contiguous", dict(BLK_M=64, BLK_N=256, TMA_STORE=True,
                                                  CLUSTER=2)),
    ("cluster_pair_masked_fused", "masked", dict(BLK_M=128, BLK_N=128, ROW_SCALE=True,
                                                 BIAS=True, CLUSTER=2)),
    # TAIL_SPLIT: at these sizes the walk is one wave, all of it tail: every tile in 2 pieces
    ("tail_split_tma_store", "contiguous", dict(BLK_M=128, BLK_N=256, TMA_STORE=True,
                                                TAIL_SPLIT=2)),
    ("tail_split_fused", "contiguous", dict(BLK_M=128, BLK_N=256, ROW_SCALE=True, BIAS=True,
                                            TAIL_SPLIT=2)),
    ("tail_split_swiglu_masked", "masked", dict(BLK_M=128, BLK_N=256, SWIGLU="halves",
                                                TAIL_SPLIT=2)),
]
FUSED_ROWS = 333  # a's rows (contiguous) or rows per expert (masked): partial tiles


def fused_kernel_keywords(layout, tile, sm_count=132, shape=None, rows=FUSED_ROWS):
    """The v14 keywords of a FUSED_CASES case (TAIL_CASES: its own (E, N, K) ``shape`` and
    ``rows``): the op's base keywords with the case's."""
    from tirx_gemm.op.grouped import choose_grouped
    E, N, K = shape or SHAPES[0]
    _, kw = choose_grouped(rows, E, N, K, "bfloat16", layout, "sm_90a", sm_count)
    kw = {k: v for k, v in kw.items() if k not in ("BLK_M", "BLK_N", "SWAP_AB", "GROUP",
                                                   "TMA_STORE")}
    return {**kw, **tile}


def workspace(kw, N, K):
    """The workspace operands of a v14 build (TAIL_SPLIT's WS and CNT; none without it),
    counters zeroed, slabs poisoned with NaN (every slab a launch reads it wrote first)."""
    from tirx_gemm import registry
    return [torch.zeros(shape, dtype=torch.int32, device="cuda") if dt == "int32" else
            torch.full(shape, float("nan"), dtype=torch.float32, device="cuda")
            for _, shape, dt in registry.get("v14", "sm_90a").workspace_specs(0, N, K, kw)]


def check_workspace_after(ws, name, out, launch):
    """TAIL_SPLIT: every counter back at zero, and a second launch gives the same bits (the
    pieces summed in K order whichever finished last)."""
    if ws:
        assert int(ws[1].abs().sum()) == 0, f"{name}: counters left non-zero"
        first = out.clone()
        _serve(launch)
        assert torch.equal(out.nan_to_num(7.0), first.nan_to_num(7.0)), f"{name}: not repeatable"


def fused_reference(acc, kw, bias_e, scale_rows):
    """What v14's epilogue makes of an expert's fp32 rows ``acc``: bias, scale, or SwiGLU."""
    if kw.get("SWIGLU") == "halves":
        gate, up = acc.chunk(2, dim=-1)
        return F.silu(gate) * up
    if kw.get("SWIGLU") == "interleaved":
        g = acc.unflatten(-1, (-1, 2, 8))
        return (F.silu(g[:, :, 0]) * g[:, :, 1]).flatten(-2)
    if kw.get("BIAS"):
        acc = acc + bias_e.float()
    if kw.get("ROW_SCALE"):
        acc = acc * scale_rows[:, None]
    return acc


@pytest.mark.parametrize("name,layout,tile", FUSED_CASES, ids=[c[0] for c in FUSED_CASES])
def test_fused_epilogue_kernels(kernels, name, layout, tile):
    """The kernel itself against fp32 torch: D = (A_e @ B_e^T + bias[e]) * scale[row], or
    silu(gate) * up (SWIGLU, D N/2 wide); rows no expert owns stay untouched (NaN)."""
    from tirx_gemm.op import grouped as G
    from tirx_gemm.op.operands import _gpu_arch
    E, N, K = SHAPES[0]
    M, ND = FUSED_ROWS, N // 2 if tile.get("SWIGLU") else N
    kw = fused_kernel_keywords(layout, tile, _gpu_arch(torch.device("cuda"))[1])
    kernel = _serve(lambda: G._load("v14", "sm_90a", N, K, kw)[0])
    ws = workspace(kw, N, K)
    g = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randn(E, N, K, device="cuda", dtype=BF16, generator=g) / K ** 0.5
    bias = torch.randn(E, N, device="cuda", dtype=BF16, generator=g)
    ops_of = lambda scale: ([scale] * bool(kw.get("ROW_SCALE"))  # noqa: E731
                            + [bias] * bool(kw.get("BIAS")))
    if layout == "contiguous":
        a = torch.randn(M, K, device="cuda", dtype=BF16, generator=g)
        offs = routing(M - 20, E, seed=3)  # the last 20 rows belong to no expert
        scale = torch.rand(M, device="cuda", generator=g) + 0.5
        out = torch.full((M, ND), float("nan"), device="cuda", dtype=BF16)
        launch = lambda: kernel(a, w, out, offs, *ops_of(scale), *ws)  # noqa: E731
        _serve(launch)
        start = 0
        for e, end in enumerate(offs.tolist()):
            if end > start:
                want = fused_reference(a[start:end].float() @ w[e].float().T, kw, bias[e],
                                       scale[start:end])
                assert rel_err(out[start:end], want) < TOL, (name, e)
            start = end
        assert out[start:].isnan().all(), f"{name}: rows past offs[-1] were written"
        check_workspace_after(ws, name, out, launch)
    else:
        a = torch.randn(E, M, K, device="cuda", dtype=BF16, generator=g)
        counts = torch.tensor([M, 0, 1, 17, M - 1, 64, 65, 200], dtype=torch.int32,
                              device="cuda")
        scale = torch.rand(E, M, device="cuda", generator=g) + 0.5
        out = torch.full((E, M, ND), float("nan"), device="cuda", dtype=BF16)
        launch = lambda: kernel(a, w, out, counts, *ops_of(scale), *ws)  # noqa: E731
        _serve(launch)
        for e in range(E):
            c = int(counts[e])
            if c:
                want = fused_reference(a[e, :c].float() @ w[e].float().T, kw, bias[e],
                                       scale[e, :c])
                assert rel_err(out[e, :c], want) < TOL, (name, e)
            assert out[e, c:].isnan().all(), f"{name}: expert {e}'s rows past counts written"
        check_workspace_after(ws, name, out, launch)


# TAIL_SPLIT where the walk is several waves: (E, N, K, rows, hot expert or None, keywords);
# the last wave's tiles are cut in K (tail * TAIL_SPLIT <= 132 at these routings), the rest run
# whole. lab/moe_grouped_gemm/export_bundle.py --tests exports these too.
TAIL_CASES = [
    (8, 1024, 1024, 40 * 128, 3, dict(BLK_M=128, BLK_N=256, TMA_STORE=True, TAIL_SPLIT=4)),
    (8, 1024, 1024, 4321, None, dict(BLK_M=128, BLK_N=256, TMA_STORE=True, TAIL_SPLIT=4)),
    (8, 1024, 1024, 4321, None, dict(BLK_M=128, BLK_N=256, TAIL_SPLIT=3, ROW_SCALE=True)),
]


@pytest.mark.parametrize("E,N,K,rows,hot,tile", TAIL_CASES)
def test_tail_split_after_whole_waves(kernels, E, N, K, rows, hot, tile):
    """Whole waves, then the tail's pieces: every expert's rows against fp32 torch, counters
    back at zero, the same bits on a second launch."""
    from tirx_gemm.op import grouped as G
    from tirx_gemm.op.operands import _gpu_arch
    sm_count = _gpu_arch(torch.device("cuda"))[1]
    kw = fused_kernel_keywords("contiguous", tile, sm_count, (E, N, K), rows)
    kernel = _serve(lambda: G._load("v14", "sm_90a", N, K, kw)[0])
    ws = workspace(kw, N, K)
    a, w = operands(rows, E, N, K, BF16, seed=11)
    offs = routing(rows, E, seed=4, hot=hot)
    scale = torch.rand(rows, device="cuda") + 0.5
    out = torch.full((rows, N), float("nan"), device="cuda", dtype=BF16)
    launch = lambda: kernel(a, w, out, offs, *([scale] * bool(kw.get("ROW_SCALE"))), *ws)  # noqa
    _serve(launch)
    want = reference(a, w, offs) * (scale[:, None] if kw.get("ROW_SCALE") else 1)
    assert rel_err(out, want) < TOL
    check_workspace_after(ws, "tail", out, launch)


def test_graph_replay_follows_new_routing(kernels):
    from tirx_gemm.op.grouped import grouped_mm
    E, N, K = SHAPES[0]
    a, w = operands(512, E, N, K, BF16)
    offs = routing(512, E, seed=1)
    out = _serve(lambda: grouped_mm(a, w, offs))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        grouped_mm(a, w, offs, out=out)
    for seed in (2, 3, 4):
        offs.copy_(routing(512, E, seed=seed))
        g.replay()
        _sync()
        assert rel_err(out[: int(offs[-1])], reference(a, w, offs)[: int(offs[-1])]) < TOL


def test_compile_fullgraph(kernels):
    from tirx_gemm.op import moe
    E, N, K = SHAPES[0]
    a, w = operands(128, E, N, K, BF16)
    offs = routing(128, E)
    want = _serve(lambda: moe.grouped_mm(a, w.transpose(1, 2), offs))
    torch._dynamo.reset()
    f = torch.compile(lambda a, w, o: moe.grouped_mm(a, w.transpose(1, 2), o) + 1,
                      fullgraph=True)
    got = f(a, w, offs)
    _sync()
    assert rel_err(got - 1, want) < TOL


# -- Experts and patch_moe -------------------------------------------------------------------
def _blocks():
    """(name, builder) of a Mixtral-style and a Qwen3-MoE-style block in bf16 on the GPU:
    transformers' classes from a config with random weights where transformers is here."""
    out = []
    try:
        from transformers import MixtralConfig, Qwen3MoeConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        def hf(cls, cfg):
            def build():
                torch.manual_seed(0)
                block = cls(cfg)
                for p in block.parameters():
                    torch.nn.init.normal_(p, std=0.05)
                return block.to("cuda", BF16).eval()
            return build
        out += [("hf_mixtral", hf(MixtralSparseMoeBlock, MixtralConfig(
                    hidden_size=512, intermediate_size=1024, num_local_experts=8,
                    num_experts_per_tok=2))),
                ("hf_qwen3moe", hf(Qwen3MoeSparseMoeBlock, Qwen3MoeConfig(
                    hidden_size=512, moe_intermediate_size=256, num_experts=32,
                    num_experts_per_tok=4, norm_topk_prob=False)))]
    except ImportError:
        pass
    from test_grouped_op import SparseMoeBlock

    def own(*args):
        def build():
            torch.manual_seed(0)
            return SparseMoeBlock(*args).to("cuda", BF16)
        return build
    out += [("mixtral_like", own(8, 512, 1024, 2, True)),
            ("qwen3moe_like", own(32, 512, 256, 4, False))]
    return out


@pytest.mark.parametrize("fused", [False, True], ids=["torch_epilogues", "fused"])
@pytest.mark.parametrize("name,build", _blocks(), ids=[n for n, _ in _blocks()])
def test_patch_moe_within_bf16_tolerance(kernels, name, build, fused, monkeypatch):
    from tirx_gemm.op import grouped as G, grouped_epilogue as GE, grouped_swiglu as GS
    monkeypatch.setattr(GE, "ENABLED", fused)  # SwiGLU and the row scale in v14's epilogue
    G.clear_cache()
    GS._calls.clear()
    from tirx_gemm.op import moe
    block = build()
    for tokens in (1, 16, 300):
        x = torch.randn(1, tokens, 512, device="cuda", dtype=BF16)
        with torch.no_grad():
            want = block(x)
            want = want[0] if isinstance(want, tuple) else want
            fresh = build()
            report = moe.patch_moe(fresh)
            assert report.replaced, str(report)
            got = _serve(lambda: fresh(x))
            got = got[0] if isinstance(got, tuple) else got
        assert rel_err(got, want) < TOL, f"{name} at {tokens} tokens"
        assert all(m.fallbacks == 0 for m in fresh.modules() if isinstance(m, moe.Experts))


def test_experts_capture_and_replay(kernels):
    """The whole MoE MLP (permute, two grouped launches, unpermute) in one CUDA graph."""
    from tirx_gemm.op import moe
    from test_grouped_op import SparseMoeBlock
    block = SparseMoeBlock(8, 512, 1024, 2, True).to("cuda", BF16)
    moe.patch_moe(block)
    x = torch.randn(1, 64, 512, device="cuda", dtype=BF16)
    with torch.no_grad():
        y = _serve(lambda: block(x))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = block(x)
        x.copy_(torch.randn_like(x))
        g.replay()
        _sync()
        ref = SparseMoeBlock(8, 512, 1024, 2, True).to("cuda", BF16)
        ref.load_state_dict(block.state_dict())
        assert rel_err(y, ref(x)) < TOL


# -- fp8 with DeepGEMM's block scales (v14 FP8_BLOCK) -------------------------------------
# (E, N, K, rows, hot expert or None, out dtype): 64- and 128-row tiles, an N inside one 128
# block and across two with a partial tile, an odd number of 128-K blocks (one stage past K)
FP8_CASES = ([(8, 1024, 512, r, None, BF16) for r in (7, 333, 2048)]
             + [(8, 1024, 512, 300, 3, BF16), (8, 1024, 512, 2048, None, FP16)]
             + [(4, 200, 384, r, None, BF16) for r in (9, 1000)])


def fp8_operands(rows, E, N, K, seed=0):
    """(a_q, scale_a, w_q, scale_b, a dequantized fp32, w dequantized fp32)."""
    from tirx_gemm.op.grouped_fp8 import quantize_experts, quantize_rows
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(rows, K, device="cuda", generator=g)
    a[:, ::37] *= 30  # outlier channels: the 1x128 scales differ along K
    w = torch.randn(E, N, K, device="cuda", generator=g) / K ** 0.5
    qa, sa = quantize_rows(a)
    qw, sw = quantize_experts(w)
    deq_a = (qa.float().reshape(rows, -1, 128) * sa[:, :, None]).reshape(rows, K)
    full = sw.repeat_interleave(128, dim=1)[:, :N].repeat_interleave(128, dim=2)
    return qa, sa, qw, sw, deq_a, qw.float() * full


@pytest.mark.parametrize("E,N,K,rows,hot,odt", FP8_CASES,
                         ids=[f"E{c[0]}_{c[1]}x{c[2]}_r{c[3]}" + ("_hot" if c[4] is not None
                                                                  else "")
                              + ("_fp16" if c[5] == FP16 else "") for c in FP8_CASES])
def test_fp8_block_scales_match_dequantized_fp32(kernels, E, N, K, rows, hot, odt):
    """grouped_mm on e4m3 operands with 1x128 / 128x128 scales against the fp32 product of the
    dequantized operands, per expert; empty experts and rows past offs[-1] left unwritten."""
    import tirx_gemm
    qa, sa, qw, sw, deq_a, deq_w = fp8_operands(rows + 5, E, N, K, seed=rows)
    offs = routing(rows, E, seed=rows, hot=hot)  # a quarter of the experts empty (or one hot)
    out = torch.full((rows + 5, N), float("nan"), dtype=odt, device="cuda")
    _serve(lambda: tirx_gemm.grouped_mm(qa, qw.transpose(1, 2), offs, scale_a=sa, scale_b=sw,
                                        out_dtype=odt, out=out))
    assert rel_err(out[:rows], reference(deq_a[:rows], deq_w, offs)) < TOL
    assert out[rows:].isnan().all(), "rows past offs[-1] were written"


def test_fp8_masked_matches_dequantized_fp32(kernels):
    """The masked layout: a (E, T, K), counts, scale_a (E, T, K/128); rows past counts unwritten."""
    import tirx_gemm
    E, T, (_, N, K) = 8, 40, SHAPES[0]
    qa, sa, qw, sw, deq_a, deq_w = fp8_operands(E * T, E, N, K, seed=5)
    qa, sa, deq_a = qa.reshape(E, T, K), sa.reshape(E, T, -1), deq_a.reshape(E, T, K)
    counts = torch.tensor([0, 40, 3, 17, 0, 1, 40, 8], dtype=torch.int32, device="cuda")
    out = torch.full((E, T, N), float("nan"), dtype=BF16, device="cuda")
    _serve(lambda: tirx_gemm.grouped_mm(qa, qw, counts=counts, scale_a=sa, scale_b=sw, out=out))
    for e, c in enumerate(counts.tolist()):
        if c:
            assert rel_err(out[e, :c], deq_a[e, :c] @ deq_w[e].T) < TOL, f"expert {e}"
        assert out[e, c:].isnan().all(), f"expert {e}: rows past counts were written"


def test_fp8_compile_fullgraph(kernels):
    """torch.compile(fullgraph=True) over moe.grouped_mm on fp8: torch.ops.tirx_gemm.grouped_mm
    with scale_a, scale_b in the graph, the same result as the eager call."""
    from tirx_gemm.op import moe
    qa, sa, qw, sw, _, _ = fp8_operands(14, 4, 200, 384, seed=9)
    offs = routing(9, 4, seed=9)
    want = _serve(lambda: moe.grouped_mm(qa, qw.transpose(1, 2), offs, scale_a=sa, scale_b=sw))
    torch._dynamo.reset()
    f = torch.compile(lambda a, w, o, s1, s2: moe.grouped_mm(a, w.transpose(1, 2), o,
                                                             scale_a=s1, scale_b=s2) + 1,
                      fullgraph=True)
    got = f(qa, qw, offs, sa, sw)
    _sync()
    assert rel_err(got[:9] - 1, want[:9]) < TOL


def test_fp8_refusals_on_cuda_tensors():
    from tirx_gemm.op.grouped import grouped_mm
    qa, sa, qw, sw, _, _ = fp8_operands(16, 4, 256, 256)
    offs = routing(16, 4)
    with pytest.raises(ValueError, match=r"scale_b has shape \(4, 2, 1\), expected \(4, 2, 2\)"):
        grouped_mm(qa, qw, offs, scale_a=sa, scale_b=sw[:, :, :1].contiguous())
    with pytest.raises(TypeError, match="block scales are torch.float32"):
        grouped_mm(qa, qw, offs, scale_a=sa.half(), scale_b=sw)
    with pytest.raises(ValueError, match="K=192 is not a multiple of 128"):
        grouped_mm(qa[:, :192].contiguous(), qw[:, :, :192].contiguous(), offs,
                   scale_a=sa, scale_b=sw)


def test_tail_split_through_the_op(kernels, monkeypatch):
    """grouped_mm with choose_grouped's TAIL_SPLIT (its deep-K bound lowered to this case's K
    to keep the kernel small): the workspace comes from the op (per stream eagerly, fresh
    under capture), eager and in a CUDA graph replayed with new routing."""
    from tirx_gemm.op import grouped as G
    monkeypatch.setattr(G, "TAIL_SPLIT_FROM_K", TAIL_CASES[0][2])
    G.clear_cache()
    E, N, K, rows = TAIL_CASES[0][:4]
    assert G.choose_grouped(rows, E, N, K, "bfloat16")[1]["TAIL_SPLIT"] == 4
    a, w = operands(rows, E, N, K, BF16, seed=12)
    w_t = w.transpose(1, 2)  # torch's (E, K, N): with N == K the op reads a 3-D weight so
    offs = routing(rows, E, seed=4, hot=3)
    out = _serve(lambda: G.grouped_mm(a, w_t, offs))
    assert rel_err(out, reference(a, w, offs)) < TOL
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        G.grouped_mm(a, w_t, offs, out=out)
    for seed in (5, 6):
        offs.copy_(routing(rows, E, seed=seed))
        g.replay()
        _sync()
        assert rel_err(out, reference(a, w, offs)) < TOL
    G.clear_cache()
