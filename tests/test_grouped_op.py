"""tirx_gemm.grouped_mm on the CPU: every refusal one line and before any launch, the tile pick
and its explanation, suite_builds, the custom op's fake implementation and torch.compile
tracing, and tirx_gemm Experts / patch_moe against transformers-style MoE blocks built here
(the launch itself replaced by a torch reference where a test runs the op's plumbing)."""
import functools
import warnings

import pytest
import torch
import torch.nn.functional as F

from tirx_gemm.op import grouped as G
from tirx_gemm.op import grouped_swiglu as GS
from tirx_gemm.op import moe

BF16, FP16 = torch.bfloat16, torch.float16


def _operands(rows=(3, 0, 5, 2), N=16, K=32, dtype=BF16, seed=0):
    g = torch.Generator().manual_seed(seed)
    E, M = len(rows), sum(rows)
    a = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(E, N, K, generator=g) / K ** 0.5).to(dtype)  # stacked (E, N, K)
    offs = torch.tensor(rows, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return a, w, offs


def _reference(a, w_t, offs):
    out, start = torch.zeros(a.shape[0], w_t.shape[2]), 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end].float() @ w_t[e].float()
        start = end
    return out


def _fake_kernel(calls, kwargs=None):
    """A stand-in for v14's launch on CPU tensors, per the contract: D_e = A_e @ B[e].T, and
    with the epilogue keywords (operands after routing: scale, then bias) D_e = (A_e @ B[e].T
    + bias[e]) * scale[rows of e] in fp32, one rounding; scale float32 (M,) or masked (E, M),
    bias (E, N) in D's dtype."""
    kw = kwargs or {}

    def kernel(A, B, D, index, *extra):
        calls.append((tuple(A.shape), tuple(B.shape), B.is_contiguous(), index.dtype))
        assert B.is_contiguous() and index.dtype == torch.int32
        assert len(extra) == bool(kw.get("ROW_SCALE")) + bool(kw.get("BIAS"))
        scale = extra[0] if kw.get("ROW_SCALE") else None
        bias = extra[-1] if kw.get("BIAS") else None
        if scale is not None:
            assert scale.dtype == torch.float32 and scale.is_contiguous()
            assert tuple(scale.shape) == tuple(D.shape[:-1])
        if bias is not None:
            assert bias.dtype == D.dtype and tuple(bias.shape) == (B.shape[0], B.shape[1])

        def rows(e, lo, hi, a):
            acc = a.float() @ B[e].float().T
            if kw.get("SWIGLU") == "halves":  # gate rows [0, N/2), up rows [N/2, N)
                gate, up = acc.chunk(2, dim=-1)
                return (F.silu(gate) * up).to(D.dtype)
            if kw.get("SWIGLU") == "interleaved":  # 8 gate rows, 8 up rows, ...
                g = acc.unflatten(-1, (-1, 2, 8))
                return (F.silu(g[:, :, 0]) * g[:, :, 1]).flatten(-2).to(D.dtype)
            if bias is not None:
                acc = acc + bias[e].float()
            if scale is not None:
                acc = acc * (scale[lo:hi] if A.dim() == 2 else scale[e, lo:hi])[:, None]
            return acc.to(D.dtype)
        if A.dim() == 2:
            start = 0
            for e, end in enumerate(index.tolist()):
                D[start:end] = rows(e, start, end, A[start:end])
                start = end
        else:
            for e, c in enumerate(index.tolist()):
                D[e, :c] = rows(e, 0, c, A[e, :c])
    return kernel


class _Calls(list):
    """The stand-in's launches (a list) and, in ``loads``, the keywords of each kernel load."""


@pytest.fixture
def cpu_launch(monkeypatch):
    """grouped_mm's plumbing on CPU: the device checks off, the kernel a torch stand-in."""
    calls = _Calls()
    monkeypatch.setattr(G, "check_grouped", functools.partial(G.check_grouped,
                                                              require_cuda=False))
    monkeypatch.setattr(G, "_gpu", lambda device: ("sm_90a", 132))
    calls.loads = []  # the keywords each load asked for

    def load(step_id, arch, N, K, kwargs):
        calls.loads.append(dict(kwargs))
        return _fake_kernel(calls, kwargs), "v14 stand-in"
    monkeypatch.setattr(G, "_load", load)
    G.clear_cache()
    yield calls
    G.clear_cache()


# -- refusals, one line each, before any launch ----------------------------------------
def _refusal(exc_type, match, *args, **kw):
    with pytest.raises(exc_type, match=match) as info:
        G.check_grouped(*args, require_cuda=False, **kw)
    assert "\n" not in str(info.value)


def test_offs_refusals():
    a, w, offs = _operands()
    _refusal(TypeError, r"offs is torch.int64: pass offs.to\(torch.int32\)", a, w, offs.long())
    _refusal(ValueError, r"offs has shape \(1, 4\), expected \(4,\)", a, w, offs[None])
    _refusal(ValueError, r"offs has shape \(3,\), expected \(4,\)", a, w, offs[:3])
    _refusal(ValueError, "offs is on meta but a is on cpu", a, w, offs.to("meta"))
    _refusal(ValueError, "a 2-D a needs offs=", a, w)
    _refusal(TypeError, "offs must be a torch.Tensor or None, got list", a, w, [3, 3, 8, 10])


def test_operand_refusals():
    a, w, offs = _operands()
    _refusal(ValueError, r"a has K=32 columns but b is \(4, 16, 24\)", a, w[:, :, :24], offs)
    _refusal(TypeError, "a is torch.bfloat16 but b is torch.float16", a, w.half(), offs)
    _refusal(TypeError, "a has dtype torch.float32", a.float(), w.float(), offs)
    _refusal(ValueError, "b must be 3-D", a, w[0], offs)
    _refusal(ValueError, "N=12 is not a multiple of 8", a, w[:, :12], offs)
    _refusal(ValueError, "a is not contiguous", a.t().contiguous().t(), w, offs)
    _refusal(ValueError, "counts= goes with layout='masked'", a, w, offs, counts=offs)
    _refusal(ValueError, "layout='sparse'", a, w, offs, layout="sparse")
    _refusal(ValueError, "layout='masked' takes a 3-D a", a, w, offs, layout="masked")
    _refusal(ValueError, r"out_dtype=torch.float32", a, w, offs, out_dtype=torch.float32)
    _refusal(ValueError, r"bias has shape \(16, 4\), expected \(4, 16\)", a, w, offs,
             bias=torch.zeros(16, 4, dtype=BF16))
    _refusal(ValueError, r"scale has shape \(9,\), expected \(10,\)", a, w, offs,
             scale=torch.ones(9))
    _refusal(ValueError, "out is", a, w, offs, out=torch.empty(10, 8, dtype=BF16))
    _refusal(ValueError, "out overlaps a", a, w, offs, out=a.view(-1)[:160].view(10, 16))


def test_experts_over_the_limit_refused():
    E = G.E_MAX + 1
    a = torch.zeros(4, 16, dtype=BF16)
    w = torch.zeros(E, 8, 16, dtype=BF16)
    offs = torch.zeros(E, dtype=torch.int32)
    _refusal(ValueError, f"E={E} experts: the grouped kernel takes at most E_MAX={G.E_MAX}",
             a, w, offs)


def test_masked_refusals():
    a = torch.zeros(4, 8, 32, dtype=BF16)
    w = torch.zeros(4, 16, 32, dtype=BF16)
    counts = torch.tensor([1, 0, 8, 2], dtype=torch.int32)
    _refusal(ValueError, "offs= goes with a 2-D a", a, w, counts)
    _refusal(ValueError, r"a is \(4, 8, 32\) but b has 3 experts", a, w[:3], counts=counts[:3])
    _refusal(ValueError, r"scale has shape \(32,\), expected \(4, 8\)", a, w, counts=counts,
             scale=torch.ones(32))
    p = G.check_grouped(a, w, counts=counts, require_cuda=False)
    assert p.out_shape == (4, 8, 16) and p.layout == "masked"


def test_grad_refused():
    a, w, offs = _operands()
    w.requires_grad_(True)
    _refusal(ValueError, "grouped_mm has no backward", a, w, offs)


def test_no_gpu_named():
    a, w, offs = _operands()
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="this machine has no CUDA GPU"):
        G.grouped_mm(a, w, offs)


def test_routing_checks_need_the_setting(monkeypatch):
    a, w, offs = _operands()
    p = G.check_grouped(a, w, offs, require_cuda=False)
    with pytest.raises(ValueError, match=r"decreases at expert 2 \(offs\[1\]=8 > offs\[2\]=5\)"):
        G.check_routing(p, offs=torch.tensor([3, 8, 5, 10], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"offs\[-1\]=11 is past a's 10 rows"):
        G.check_routing(p, offs=torch.tensor([3, 3, 8, 11], dtype=torch.int32))
    with pytest.raises(ValueError, match="offs\\[0\\]=-1 is negative"):
        G.check_routing(p, offs=torch.tensor([-1, 3, 8, 10], dtype=torch.int32))
    G.check_routing(p, offs=offs)  # a valid routing passes
    am = torch.zeros(4, 8, 32, dtype=BF16)
    pm = G.check_grouped(am, w, counts=torch.zeros(4, dtype=torch.int32), require_cuda=False)
    with pytest.raises(ValueError, match=r"counts\[2\]=9 is outside 0..8"):
        G.check_routing(pm, counts=torch.tensor([1, 0, 9, 2], dtype=torch.int32))
    monkeypatch.delenv(G.CHECK_ENV, raising=False)
    assert G._checking() is False
    monkeypatch.setenv(G.CHECK_ENV, "1")
    assert G._checking() is (G.CHECK_ENV in G.settings.TABLE)  # once declared: on


# -- the weights' orientation ----------------------------------------------------------
def test_weight_forms_and_copies():
    a, w, offs = _operands()
    p = G.check_grouped(a, w.transpose(1, 2), offs, require_cuda=False)  # torch's (E, K, N)
    assert (p.N, p.K, p.copy) == (16, 32, False)
    assert p.weight.data_ptr() == w.data_ptr()
    p = G.check_grouped(a, w, offs, require_cuda=False)  # the Linear convention (E, N, K)
    assert (p.N, p.K, p.copy) == (16, 32, False)
    n_major = w.transpose(1, 2).contiguous()  # (E, K, N) with N innermost: copied
    p = G.check_grouped(a, n_major, offs, require_cuda=False)
    assert (p.N, p.copy) == (16, True)


def test_plumbing_matches_torch(cpu_launch):
    a, w, offs = _operands()
    for b in (w.transpose(1, 2), w, w.transpose(1, 2).contiguous()):
        got = G.grouped_mm(a, b, offs)
        want = F.grouped_mm(a, w.transpose(1, 2), offs=offs)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert cpu_launch and all(c[2] for c in cpu_launch)  # the kernel got K-major weights


def test_plumbing_bias_scale_masked(cpu_launch):
    a, w, offs = _operands()
    bias = torch.randn(4, 16).to(BF16)
    scale = torch.rand(10)
    got = G.grouped_mm(a, w, offs, bias=bias, scale=scale)
    ref = _reference(a, w.transpose(1, 2), offs)
    owner = torch.tensor([0, 0, 0, 2, 2, 2, 2, 2, 3, 3])
    ref = (ref + bias.float()[owner]) * scale[:, None]
    torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=3e-2)
    am = torch.randn(4, 6, 32).to(BF16)
    counts = torch.tensor([6, 0, 2, 4], dtype=torch.int32)
    out = torch.full((4, 6, 16), float("nan"), dtype=BF16)
    G.grouped_mm(am, w, counts=counts, out=out)
    for e, c in enumerate(counts.tolist()):
        torch.testing.assert_close(out[e, :c].float(), am[e, :c].float() @ w[e].float().T,
                                   atol=3e-2, rtol=3e-2)
        assert out[e, c:].isnan().all()  # rows past counts[e] are not written
    full = G.grouped_mm(am, w)  # 3-D x 3-D without counts: torch's batched form
    torch.testing.assert_close(full, F.grouped_mm(am, w.transpose(1, 2)), atol=3e-2, rtol=3e-2)


@pytest.fixture
def fused_on(monkeypatch):
    """The fused epilogues on (grouped_epilogue.ENABLED, the default; set here so that a test
    does not depend on it)."""
    from tirx_gemm.op import grouped_epilogue as GE
    monkeypatch.setattr(GE, "ENABLED", True)


def test_fused_epilogues_are_on_by_default_and_can_be_turned_off(cpu_launch, monkeypatch):
    """On by default (their GPU tests pass); ENABLED = False: bias, scale and SwiGLU take the
    plain kernel."""
    from tirx_gemm.op import grouped_epilogue as GE
    from tirx_gemm.op import grouped_swiglu as GS
    assert GE.ENABLED is True
    # 2.5 rows per expert: a swap-AB tile
    swiglu = ("SWIGLU (grouped_swiglu.swiglu_mm, not on swap-AB tiles unless "
              "grouped_epilogue.SWAP_FUSED)")
    assert f"BIAS, ROW_SCALE, {swiglu};" in G.explain_grouped(10, 4, 16, 32, "bfloat16")
    monkeypatch.setattr(GE, "ENABLED", False)
    a, w, offs = _operands()
    G.grouped_mm(a, w, offs, bias=torch.randn(4, 16).to(BF16), scale=torch.rand(10))
    GS._calls.clear()
    big = torch.randn(300, 32).to(BF16)
    GS.swiglu_mm(big, torch.randn(2, 32, 32).to(BF16), torch.tensor([100, 300],
                                                                   dtype=torch.int32))
    assert all(not (set(k) & {"ROW_SCALE", "BIAS", "SWIGLU"}) for k in cpu_launch.loads)
    assert f"BIAS, ROW_SCALE, {swiglu} (off: grouped_epilogue.ENABLED)" in G.explain_grouped(
        10, 4, 16, 32, "bfloat16")


def test_bias_and_scale_fused_on_sm90a(cpu_launch, fused_on):
    """bias in a's dtype and a scale: one launch of the fused kernel (ROW_SCALE, BIAS; scale
    passed as float32, a shared (N,) bias expanded to (E, N)); a float32 bias: the plain kernel
    and torch ops after it, bias first, so the scale is not fused either."""
    a, w, offs = _operands()
    owner = torch.tensor([0, 0, 0, 2, 2, 2, 2, 2, 3, 3])
    ref = _reference(a, w.transpose(1, 2), offs)
    scale = torch.rand(10).to(BF16)
    for bias, rows in ((torch.randn(4, 16).to(BF16), lambda b: b.float()[owner]),
                       (torch.randn(16).to(BF16), lambda b: b.float())):
        G.clear_cache()
        cpu_launch.loads.clear()
        got = G.grouped_mm(a, w, offs, bias=bias, scale=scale)
        assert [(k.get("ROW_SCALE"), k.get("BIAS")) for k in cpu_launch.loads] == [(True, True)]
        torch.testing.assert_close(got.float(), (ref + rows(bias)) * scale.float()[:, None],
                                   atol=3e-2, rtol=3e-2)
    G.clear_cache()
    cpu_launch.loads.clear()
    bias32 = torch.randn(4, 16)
    got = G.grouped_mm(a, w, offs, bias=bias32, scale=scale)
    assert [("ROW_SCALE" in k, "BIAS" in k) for k in cpu_launch.loads] == [(False, False)]
    torch.testing.assert_close(got.float(), (ref + bias32[owner]) * scale.float()[:, None],
                               atol=3e-2, rtol=3e-2)
    assert "fused epilogues of v14 on sm_90a: BIAS, ROW_SCALE, SWIGLU" in G.explain_grouped(
        10, 4, 16, 32, "bfloat16")
    wide = G.explain_grouped(8192, 8, 28672, 4096, "bfloat16")  # SwiGLU fused on this tile
    assert "BIAS, ROW_SCALE, SWIGLU (grouped_swiglu.swiglu_mm);" in wide
    assert "fused epilogues of v14 on sm_100a: none" in G.explain_grouped(
        10, 4, 16, 32, "bfloat16", arch="sm_100a")


def test_fused_kernel_missing_falls_back_unfused(cpu_launch, fused_on, monkeypatch):
    """A fused kernel the bundle lacks (no TVM to build it): the plain kernel, then torch ops,
    and a warning naming the suite key that exports it."""
    plain = G._load

    def load(step_id, arch, N, K, kwargs):
        if "ROW_SCALE" in kwargs:
            raise ValueError("no kernel for v14 in bundle B (not exported)")
        return plain(step_id, arch, N, K, kwargs)
    monkeypatch.setattr(G, "_load", load)
    a, w, offs = _operands()
    scale = torch.rand(10)
    with pytest.warns(UserWarning, match=r'"epilogues": \[\{"ROW_SCALE": true\}\]'):
        got = G.grouped_mm(a, w, offs, scale=scale)
    ref = _reference(a, w.transpose(1, 2), offs) * scale[:, None]
    torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=3e-2)
    assert [("ROW_SCALE" in k) for k in cpu_launch.loads] == [False]


@pytest.mark.parametrize("gate_up", ["halves", "interleaved"])
def test_swiglu_fused_past_decode(cpu_launch, fused_on, gate_up):
    """Past DECODE_TOKENS tokens per expert on sm_90a: one launch of the SWIGLU kernel writing
    (M, I); at decode (swap-AB): grouped_mm, then swiglu_rows. Both match the reference."""
    from tirx_gemm.op import grouped_swiglu as GS
    g = torch.Generator().manual_seed(4)
    E, I, K = 2, 16, 32
    wg, wu = (torch.randn(E, I, K, generator=g).to(BF16) for _ in range(2))
    w = (torch.cat([wg, wu], dim=1) if gate_up == "halves" else G.fuse_gate_up_experts(wg, wu))
    for M, fused in ((300, True), (6, False)):
        GS._calls.clear()
        cpu_launch.loads.clear()
        a = torch.randn(M, K, generator=g).to(BF16)
        offs = torch.tensor([M // 3, M], dtype=torch.int32)
        got = GS.swiglu_mm(a, w.transpose(1, 2), offs, gate_up=gate_up)
        want = F.silu(_reference(a, wg.transpose(1, 2), offs)) * _reference(
            a, wu.transpose(1, 2), offs)
        assert got.shape == (M, I)
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)
        assert [k.get("SWIGLU") for k in cpu_launch.loads] == (
            [gate_up] if fused else [None])
    with pytest.raises(ValueError, match="gate_up='rows'"):
        GS.swiglu_mm(a, w.transpose(1, 2), offs, gate_up="rows")


@pytest.mark.parametrize("gate_up", ["halves", "interleaved"])
def test_swiglu_fused_at_decode_with_swap_fused(cpu_launch, fused_on, gate_up, monkeypatch):
    """grouped_epilogue.SWAP_FUSED on: at decode (swap-AB) a "halves" gate/up is one launch of
    the swap-AB SWIGLU kernel writing (M, I); "interleaved" stays grouped_mm, then
    swiglu_rows. The flag is part of the remembered call: turning it off takes effect."""
    from tirx_gemm.op import grouped_epilogue as GE, grouped_swiglu as GS
    g = torch.Generator().manual_seed(5)
    E, I, K, M = 2, 16, 32, 6
    wg, wu = (torch.randn(E, I, K, generator=g).to(BF16) for _ in range(2))
    w = (torch.cat([wg, wu], dim=1) if gate_up == "halves" else G.fuse_gate_up_experts(wg, wu))
    a = torch.randn(M, K, generator=g).to(BF16)
    offs = torch.tensor([M // 3, M], dtype=torch.int32)
    want = F.silu(_reference(a, wg.transpose(1, 2), offs)) * _reference(
        a, wu.transpose(1, 2), offs)
    GS._calls.clear()
    for on in (True, False):
        monkeypatch.setattr(GE, "SWAP_FUSED", on)
        cpu_launch.loads.clear()
        got = GS.swiglu_mm(a, w.transpose(1, 2), offs, gate_up=gate_up)
        torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)
        fused = on and gate_up == "halves"
        assert [(k.get("SWIGLU"), k.get("SWAP_AB")) for k in cpu_launch.loads] == (
            [("halves", True)] if fused else [(None, True)])


def test_swiglu_interleaved(cpu_launch):
    a, _, offs = _operands()
    g = torch.Generator().manual_seed(3)
    wg, wu = (torch.randn(4, 16, 32, generator=g).to(BF16) for _ in range(2))
    fused = G.fuse_gate_up_experts(wg, wu)
    assert fused.shape == (4, 32, 32)
    got = GS.grouped_swiglu(a, fused, offs)
    want = F.silu(_reference(a, wg.transpose(1, 2), offs)) * _reference(a, wu.transpose(1, 2),
                                                                        offs)
    torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)


def test_swiglu_refuses_a_concatenated_gate_up_weight(cpu_launch):
    """A checkpoint's gate_up_proj (E, 2N, K), [w_gate; w_up] per expert, has the fused
    weight's shape: taken as interleaved it gives a wrong MLP without a word."""
    a, _, offs = _operands()
    g = torch.Generator().manual_seed(3)
    wg, wu = (torch.randn(4, 16, 32, generator=g).to(BF16) for _ in range(2))
    for unmarked in (torch.cat([wg, wu], dim=1), G.fuse_gate_up_experts(wg, wu).clone()):
        with pytest.raises(ValueError, match=r"fuse_gate_up_experts\(w_gate, w_up\).*"
                                             r"w\.chunk\(2, dim=1\)") as info:
            GS.grouped_swiglu(a, unmarked, offs)
        assert "\n" not in str(info.value)
    assert cpu_launch == []  # refused before any launch
    GS.grouped_swiglu(a, G.fuse_gate_up_experts(wg, wu), offs)  # what it made passes


# -- the pick ----------------------------------------------------------------------------
def test_an_unknown_arch_is_named_not_a_zero_sm_count():
    """choose_grouped(arch='sm_80') said "sm_count=0 must be a positive int"."""
    for call in (G.choose_grouped, G.explain_grouped):
        with pytest.raises(ValueError, match=r"^arch='sm_80': the grouped kernel runs on sm_"):
            call(128, 8, 4096, 4096, arch="sm_80")


def test_pick_swap_ab_at_decode_wide_at_prefill():
    step, kw = G.choose_grouped(2, 8, 28672, 4096, BF16)  # Mixtral gate/up, one token
    assert step == G.GROUPED_STEP and kw["SWAP_AB"] and kw["BLK_N"] == G.TOKEN_TILES[0]
    assert kw["dtype"] == "bfloat16" and kw["E"] == 8 and kw["RUNTIME_M"]
    assert kw["BLK_M"] == 128  # 2 experts x 224 weight tiles fill the SMs twice
    _, kw = G.choose_grouped(2, 8, 4096, 14336)  # the down projection: 2 x 32 tiles do not
    assert (kw["BLK_M"], kw["BLK_N"], kw["SWAP_AB"]) == (64, 8, True)
    _, kw = G.choose_grouped(1024, 128, 1536, 2048)  # 8 tokens per expert: a 16-token tile
    assert kw["BLK_N"] == 16 and kw["SWAP_AB"]
    _, kw = G.choose_grouped(8192, 8, 28672, 4096)
    assert (kw["BLK_M"], kw["BLK_N"]) == G.WIDE_TILE and "SWAP_AB" not in kw
    _, kw = G.choose_grouped(128 * 512, 128, 128, 2048)  # N below the wide tile
    assert (kw["BLK_M"], kw["BLK_N"]) == G.WIDE_SMALL_TILE
    _, kw = G.choose_grouped(1024, 8, 28672, 4096, layout="masked")
    assert kw["LAYOUT"] == "masked"


def test_explain_says_why():
    text = G.explain_grouped(2, 8, 28672, 4096, "bfloat16")
    assert text.splitlines()[0].startswith("2 rows x 8 experts of 28672x4096 bfloat16")
    assert "tokens per expert <= 64: swap-AB" in text and "torch ops" in text
    assert "> 64: the wide 128x256 tile" in G.explain_grouped(8192, 8, 28672, 4096)
    with pytest.raises(ValueError, match="E_MAX"):
        G.choose_grouped(4, 300, 64, 64)
    with pytest.raises(ValueError, match="K=100 is not a multiple of 8"):
        G.choose_grouped(4, 8, 64, 100)


def test_suite_builds():
    entry = {"kind": "grouped", "model": "Mixtral-8x7B", "layer": "gate/up", "E": 8,
             "top_k": 2, "N": 28672, "K": 4096, "tokens": [1, 16, 128, 4096, 16384],
             "dtypes": ["bfloat16"], "all_m": False}  # the entry's own tokens only
    builds = G.suite_builds(entry)
    tiles = [(kw["BLK_M"], kw["BLK_N"]) for _, _, kw in builds]
    assert tiles == [(128, 8), (128, 64), G.WIDE_TILE]  # one per tile, M at run time
    assert all(s == "v14" and mnk == (128, 28672, 4096) for s, mnk, _ in builds)
    assert len(G.suite_builds({**entry, "dtypes": ["float16", "bfloat16"]})) == 6
    assert G.suite_builds({**entry, "layout": "masked"})[0][2]["LAYOUT"] == "masked"
    for bad, match in (({"kind": "dense"}, "expected 'grouped'"),
                       ({"top_k": 9}, "top_k=9 must be an int from 1 to E=8"),
                       ({"tokens": []}, "tokens=\\[\\] must be"),
                       ({"E": 512}, "E_MAX"), ({"colour": 1}, "unknown key 'colour'"),
                       ({"E": 512, "all_m": True}, "grouped entry Mixtral-8x7B gate/up: .*E_MAX"),
                       ({"all_m": "yes"}, "all_m='yes' must be true or false")):
        with pytest.raises(ValueError, match=match):
            G.suite_builds({**entry, **bad})


# -- the custom op ----------------------------------------------------------------------
def test_fake_shapes_and_checks():
    from torch._subclasses.fake_tensor import FakeTensorMode
    a, w, offs = _operands()
    with FakeTensorMode() as mode:
        fa, fw, fo = (mode.from_tensor(t) for t in (a, w, offs))
        assert moe.OP(fa, fw.transpose(1, 2), fo).shape == (10, 16)
        assert moe.OP(fa, fw, fo).shape == (10, 16)
        fm = mode.from_tensor(torch.zeros(4, 6, 32, dtype=BF16))
        fc = mode.from_tensor(torch.zeros(4, dtype=torch.int32))
        out = moe.OP(fm, fw, None, fc, "masked")
        assert out.shape == (4, 6, 16) and out.dtype == BF16
        with pytest.raises(TypeError, match="offs is torch.int64"):
            moe.OP(fa, fw, fo.long())


def test_compile_fullgraph_traces_the_op(monkeypatch):
    a, w, offs = _operands()
    monkeypatch.setattr(moe, "_eager", lambda a, b, offs=None, **kw: F.grouped_mm(
        a, b if b.shape[1] == a.shape[1] else b.transpose(1, 2), offs=offs))

    def f(a, w, offs):
        return moe.grouped_mm(a, w.transpose(1, 2), offs) * 2

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(a, w, offs)
    torch.testing.assert_close(got, 2 * F.grouped_mm(a, w.transpose(1, 2), offs=offs))


# -- Experts and patch_moe against transformers-style blocks -----------------------------
class TopKRouter(torch.nn.Module):
    """transformers' TopKRouter (Mixtral: renormalized top-k; Qwen3-MoE: norm_topk_prob)."""

    def __init__(self, E, H, k, norm=True):
        super().__init__()
        self.top_k, self.norm = k, norm
        self.weight = torch.nn.Parameter(torch.randn(E, H) * 0.5)

    def forward(self, x):
        logits = F.linear(x, self.weight)
        probs = F.softmax(logits, dim=-1, dtype=torch.float)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top.to(x.dtype), idx


class StackedExperts(torch.nn.Module):
    """transformers' MixtralExperts / Qwen3MoeExperts: stacked weights, a loop over experts."""

    def __init__(self, E, H, I):
        super().__init__()
        self.num_experts = E
        self.gate_up_proj = torch.nn.Parameter(torch.randn(E, 2 * I, H) / H ** 0.5)
        self.down_proj = torch.nn.Parameter(torch.randn(E, H, I) / I ** 0.5)
        self.act_fn = torch.nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            e = e[0]
            pos, tok = torch.where(mask[e])
            gate, up = F.linear(hidden_states[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            h = F.linear(self.act_fn(gate) * up, self.down_proj[e])
            final.index_add_(0, tok, (h * top_k_weights[tok, pos, None]).to(final.dtype))
        return final


class SparseMoeBlock(torch.nn.Module):
    def __init__(self, E=8, H=64, I=32, k=2, norm=True):
        super().__init__()
        self.gate = TopKRouter(E, H, k, norm)
        self.experts = StackedExperts(E, H, I)

    def forward(self, x):
        b, s, h = x.shape
        flat = x.view(-1, h)
        _, weights, idx = self.gate(flat)
        return self.experts(flat, idx, weights).reshape(b, s, h)


def mixtral_like(dtype=BF16, seed=0):
    torch.manual_seed(seed)
    return SparseMoeBlock(E=8, H=64, I=32, k=2, norm=True).to(dtype)


def qwen3_moe_like(dtype=BF16, seed=0):
    torch.manual_seed(seed)
    return SparseMoeBlock(E=16, H=64, I=24, k=4, norm=False).to(dtype)


def rel_err(got, want):
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


@pytest.mark.parametrize("build", [mixtral_like, qwen3_moe_like], ids=["mixtral", "qwen3moe"])
def test_patch_moe_keeps_outputs(build):
    block = build()
    x = torch.randn(3, 5, 64).to(BF16)
    with torch.no_grad():
        want = block(x)
        report = moe.patch_moe(block)
        assert report.replaced == ["experts"] and not report.kept
        assert isinstance(block.experts, moe.Experts)
        assert block.experts.gate_up_proj is block.state_dict(keep_vars=True)[
            "experts.gate_up_proj"]
        with pytest.warns(UserWarning, match="runs torch for this call: input on cpu"):
            got = block(x)
    assert rel_err(got, want) < 2e-2
    assert block.experts.fallbacks == 1 and "cpu" in block.experts.fallback_reason


def test_experts_grouped_path_matches(cpu_launch, monkeypatch):
    block = mixtral_like()
    x = torch.randn(2, 7, 64).to(BF16)
    with torch.no_grad():
        want = block(x)
        moe.patch_moe(block)
        monkeypatch.setattr(moe.Experts, "_refusal", lambda self, x: None)
        got = block(x)
    assert rel_err(got, want) < 2e-2 and block.experts.fallbacks == 0
    assert len(cpu_launch) == 2  # gate/up and down: two grouped launches


def test_permute_unpermute():
    idx = torch.tensor([[2, 0], [2, 1], [0, 2]])
    order, offs = moe.permute(idx, 4)
    assert offs.tolist() == [2, 3, 6, 6] and offs.dtype == torch.int32
    assert idx.reshape(-1)[order].tolist() == [0, 0, 1, 2, 2, 2]
    rows = torch.arange(6.0)[order].unsqueeze(1)  # row r holds its pair's flat index
    assert moe.unpermute(rows, order, 3, 2).squeeze(1).tolist() == [1.0, 5.0, 9.0]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_permute_offs_are_the_counts_cumsum_for_every_id_dtype(dtype):
    """offs by searchsorted of 0..E-1 in the sorted ids equal the counts' cumsum, and order is
    the stable argsort, whatever integer dtype the ids come in (E 200 past int8's range)."""
    g = torch.Generator().manual_seed(3)
    for T, k in ((1, 8), (16, 2), (300, 6)):
        idx = torch.randint(0, 100, (T, k), generator=g).to(dtype)
        order, offs = moe.permute(idx, 200)
        flat = idx.reshape(-1).long()
        assert offs.dtype == torch.int32
        assert torch.equal(offs, torch.bincount(flat, minlength=200).cumsum(0).int())
        assert torch.equal(order, torch.argsort(flat, stable=True))


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
def test_swiglu_rows_and_unpermute_round_once(dtype):
    """swiglu_rows (three launches) and unpermute (fp32 accumulation, no fp32 copy) give what
    the fp32 reference rounded once gives, bit for bit, and never write their input."""
    g = torch.Generator().manual_seed(4)
    h = (torch.randn(3, 16, 64, generator=g) * 4).to(dtype)
    before = h.clone()
    for interleaved in (True, False):
        if interleaved:
            grp = h.unflatten(-1, (4, 2, 8))
            gate, up = grp.select(-2, 0).flatten(-2), grp.select(-2, 1).flatten(-2)
        else:
            gate, up = h.chunk(2, dim=-1)
        want = (F.silu(gate.float()) * up.float()).to(dtype)
        assert torch.equal(G.swiglu_rows(h, interleaved=interleaved), want)
        assert torch.equal(h, before)
    rows, order = h.reshape(48, 64), torch.randperm(48, generator=g)
    back = torch.empty_like(rows).index_copy_(0, order, rows)
    want = back.view(6, 8, 64).float().sum(1).to(dtype)
    assert torch.equal(moe.unpermute(rows, order, 6, 8), want)


def test_a_routing_of_the_wrong_kind_is_refused_in_one_line():
    """A float or 1-D top_k_index, weights or tokens that do not match: refused in one line
    (they ran on float ids, or ended in "index out of range in self"); ids outside 0..E-1
    are refused (read back on the CPU; on a GPU with TIRX_GEMM_CHECK=1, where they would
    trip a device-side assert)."""
    m = moe.Experts(4, 64, 32).to(BF16)
    x, idx, w = torch.randn(6, 64).to(BF16), torch.randint(0, 4, (6, 2)), torch.rand(6, 2)
    for args, exc, needle in (((x, idx.float(), w), TypeError, "top_k_index must be an integer"),
                              ((x, idx[:, 0], w[:, 0]), ValueError, "top_k_index must be "
                                                                    "(tokens, k) with 6 tokens"),
                              ((x, idx, w[:, :1]), ValueError, "top_k_weights (6, 1)"),
                              ((x[:4], idx, w), ValueError, "top_k_index must be (tokens, k) "
                                                            "with 4 tokens"),
                              ((torch.randn(6, 72).to(BF16), idx, w), ValueError,
                               "hidden_states must be (tokens, 64)")):
        with pytest.raises(exc) as info, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m(*args)
        assert needle in str(info.value) and "\n" not in str(info.value), info.value
    with pytest.raises(ValueError, match="num_experts=0 must be a positive int"):
        moe.permute(idx, 0)
    for ids in ([[0, 7]], [[-1, 2]]):  # CPU ids are read back with no sync to pay
        with pytest.raises(ValueError, match=r"expert ids -?\d\.\.\d, outside 0\.\.3 "
                                             r"\(4 experts\)"):
            moe.permute(torch.tensor(ids), 4)
        with pytest.raises(ValueError, match="outside 0..3"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m(x[:1], torch.tensor(ids), w[:1])


def test_patch_moe_keeps_what_it_cannot_serve():
    block = mixtral_like()
    block.experts.act_fn = torch.nn.GELU()
    report = moe.patch_moe(block)
    assert not report.replaced and "not SiLU" in report.kept[0][1]
    assert not isinstance(block.experts, moe.Experts) and "kept experts" in str(report)
    fp32 = mixtral_like(torch.float32)
    assert "float32" in moe.patch_moe(fp32).kept[0][1]
    strict = mixtral_like()
    moe.patch_moe(strict, strict=True)
    with torch.no_grad(), pytest.raises(ValueError, match="strict"):
        strict(torch.randn(1, 2, 64).to(BF16))


def test_experts_compile_fullgraph(monkeypatch):
    """The patched block traces in one graph: routing, permute, the op twice, unpermute."""
    block = mixtral_like()
    x = torch.randn(2, 5, 64).to(BF16)
    with torch.no_grad():
        want = block(x)
        moe.patch_moe(block)
        monkeypatch.setattr(moe.Experts, "_refusal", lambda self, x: None)
        monkeypatch.setattr(moe, "_eager", lambda a, b, offs=None, scale=None, **kw: (
            F.grouped_mm(a, b, offs=offs) * (1 if scale is None else scale[:, None])
        ).to(a.dtype))
        torch._dynamo.reset()
        got = torch.compile(block, fullgraph=True, backend="eager")(x)
    assert rel_err(got, want) < 2e-2


def test_pick_on_the_sm100a_twin():
    _, kw = G.choose_grouped(2, 8, 4096, 14336, arch="sm_100a")
    assert "BLK_M" not in kw and "SWAP_AB" not in kw and kw["BLK_N"] == 128
    assert kw["SM_COUNT"] == 148
    _, kw = G.choose_grouped(8192, 8, 4096, 14336, arch="sm_100a")
    assert kw["BLK_N"] == 256


def test_refusals_come_before_any_launch(cpu_launch):
    a, w, offs = _operands()
    G.grouped_mm(a, w, offs)  # the call is remembered: the next ones of its shapes run lean
    launched = len(cpu_launch)
    for kw, err in (({"offs": offs.long()}, TypeError), ({"offs": offs[:3]}, ValueError),
                    ({"offs": offs, "out_dtype": torch.float32}, ValueError),
                    ({"offs": offs, "counts": offs}, ValueError)):
        with pytest.raises(err):
            G.grouped_mm(a, w, **kw)
    assert len(cpu_launch) == launched


def test_grouped_variants_cover_every_token_count():
    v = G.grouped_variants(8, 28672, 4096, top_k=2, dtype="bfloat16", max_tokens=16384)
    assert v[0][2] == 1 and v[-1][3] == 16384
    assert all(a[3] + 1 == b[2] for a, b in zip(v, v[1:]))  # contiguous, no gap
    for step, kw, first, last in v:
        for t in (first, last):
            assert G.choose_grouped(2 * t, 8, 28672, 4096, "bfloat16") == (step, kw)
    entry = {"kind": "grouped", "E": 8, "top_k": 2, "N": 28672, "K": 4096, "tokens": [1, 16384],
             "dtypes": ["bfloat16"], "all_m": True}
    assert [kw for _, _, kw in G.suite_builds(entry)] == [kw for _, kw, _, _ in v]
