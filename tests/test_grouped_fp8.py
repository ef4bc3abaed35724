"""fp8 grouped_mm on the CPU: its refusals (one line each), the tile it picks, the builder's
refusals, and the launch's operands -- in a stand-in kernel that computes v14 FP8_BLOCK's
formula from the operands as the kernel reads them (uint8 bytes, SB flattened to
(E * ceil(N/128), K/128)), checked against the fp32 product of the dequantized operands."""
import pytest
import torch

from tirx_gemm import registry
from tirx_gemm.op import grouped as G
from tirx_gemm.op import grouped_fp8 as GF

FP8 = torch.float8_e4m3fn


def operands(rows=40, E=4, N=200, K=384, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(rows, K, generator=g)
    a[:, ::37] *= 30
    w = torch.randn(E, N, K, generator=g) / K ** 0.5
    qa, sa = GF.quantize_rows(a)
    qw, sw = GF.quantize_experts(w)
    return qa, sa, qw, sw


def dequantized(qa, sa, qw, sw):
    rows, K = qa.shape
    N = qw.shape[1]
    deq_a = (qa.float().reshape(rows, -1, 128) * sa[:, :, None]).reshape(rows, K)
    full = sw.repeat_interleave(128, dim=1)[:, :N].repeat_interleave(128, dim=2)
    return deq_a, qw.float() * full


@pytest.mark.parametrize("bad,err,match", [
    (dict(K=192), ValueError, "K=192 is not a multiple of 128"),
    (dict(scale_a="half"), TypeError, "scale_a is torch.float16: block scales are torch.float32"),
    (dict(scale_b="short"), ValueError, r"scale_b has shape \(4, 2, 2\), expected \(4, 2, 3\)"),
    (dict(scale_a="rows"), ValueError, r"scale_a has shape \(39, 3\), expected \(40, 3\)"),
    (dict(b="bf16"), TypeError, "fp8 grouped_mm takes both torch.float8_e4m3fn"),
    (dict(offs="int64"), ValueError, r"offs is \(4,\) torch.int64, expected \(4,\) torch.int32"),
    (dict(bias=True), ValueError, "bias= is not built for fp8 grouped_mm"),
    (dict(layout="masked"), ValueError, r"a must be 3-D \(E, T, K\) for layout='masked'"),
    (dict(out_dtype=torch.float32), ValueError, "returns torch.bfloat16 or torch.float16"),
    (dict(scale_b=None), TypeError, "scale_b must be a torch.Tensor"),
])
def test_refusals_in_one_line(bad, err, match):
    qa, sa, qw, sw = operands()
    if "K" in bad:
        qa, qw = qa[:, :192].contiguous(), qw[:, :, :192].contiguous()
    sa = {"half": sa.half(), "rows": sa[:39].contiguous()}.get(bad.get("scale_a"), sa)
    sw = sw[:, :, :2].contiguous() if bad.get("scale_b") == "short" else sw
    sw = None if "scale_b" in bad and bad["scale_b"] is None else sw
    b = qw.to(torch.bfloat16) if bad.get("b") else qw
    offs = torch.tensor([10, 10, 25, 40], dtype=torch.int64 if bad.get("offs") else torch.int32)
    kw = dict(scale_a=sa, scale_b=sw, out_dtype=bad.get("out_dtype"), layout=bad.get("layout"),
              bias=torch.zeros(4, 200) if bad.get("bias") else None)
    with pytest.raises(err, match=match) as info:
        G.grouped_mm(qa, b.transpose(1, 2), offs, **kw)
    assert "\n" not in str(info.value)


def test_routing_of_the_wrong_layout_is_refused_with_the_way_out():
    qa, sa, qw, sw = operands()
    offs = torch.tensor([10, 10, 25, 40], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"counts= does not go with a 2-D a: pass offs= with a "
                                         r"2-D a \(contiguous\) or counts= with a 3-D a"):
        G.grouped_mm(qa, qw.transpose(1, 2), counts=offs, scale_a=sa, scale_b=sw)
    a3, sa3 = qa.view(4, 10, 384)[:3], sa.view(4, 10, 3)[:3]
    with pytest.raises(ValueError, match=r"a is \(3, 10, 384\) but b has 4 experts: a masked a "
                                         r"must be \(4, T, K\)"):
        G.grouped_mm(a3, qw.transpose(1, 2), counts=offs, scale_a=sa3, scale_b=sw)


@pytest.mark.parametrize("args,match", [
    ((-1, 8, 4096, 4096), "rows=-1 must be a non-negative int"),
    ((128, 0, 4096, 4096), "E=0 must be a positive int"),
    ((128, 300, 4096, 4096), "E=300, .*E in \\[1, 256\\]"),
    ((128, 8, 4096, 200), "K=200, .*K a multiple of 128"),
    ((128, 8, 12, 256), "N=12, .*N a multiple of 8"),
    ((128, 8, 4096, 4096, "float32"), "out_dtype='float32'"),
])
def test_choose_refuses_what_no_kernel_takes(args, match):
    with pytest.raises(ValueError, match=match):
        GF.choose_grouped_fp8(*args)


def test_cpu_tensors_are_refused_after_the_shape_checks():
    qa, sa, qw, sw = operands()
    offs = torch.tensor([10, 10, 25, 40], dtype=torch.int32)
    with pytest.raises(ValueError, match="a is on cpu: every operand on a's CUDA GPU"):
        G.grouped_mm(qa, qw.transpose(1, 2), offs, scale_a=sa, scale_b=sw)


def test_pick_by_tokens_per_expert():
    why = []
    _, kw = GF.choose_grouped_fp8(16 * 2, 8, 28672, 4096, why=why)
    assert kw["FP8_BLOCK"] and kw["BLK_M"] == 64 and kw["BLK_N"] == 128 and why
    _, kw = GF.choose_grouped_fp8(4096 * 8, 128, 1536, 2048, "float16")
    assert kw["BLK_M"] == 128 and "dtype" not in kw  # float16 output: the default keyword
    assert GF.choose_grouped_fp8(64, 4, 48, 256)[1]["BLK_N"] == 64
    builds = GF.fp8_builds(8, 4096, 14336, [1, 16, 4096], top_k=2)
    assert [kw["BLK_M"] for _, _, kw in builds] == [64, 128]


def _stand_in(calls):
    """A kernel that computes FP8_BLOCK's formula from its operands as the kernel takes them
    (masked: A (E, T, K) and D (E, T, N) read as their (E * T, ..) rows, SA (E * T, K/128))."""
    def kernel(A, B, D, routing, SA, SB):
        assert A.dtype == torch.uint8 and B.dtype == torch.uint8 and A.dim() in (2, 3)
        E, N, K = B.shape
        KB, NB = K // 128, -(-N // 128)
        assert SA.shape == (A.shape[:-1].numel(), KB) and SB.shape == (E * NB, KB)
        masked, T = A.dim() == 3, A.shape[-2]
        a, b = A.view(FP8).float().reshape(-1, K), B.view(FP8).float()
        D = D.view(-1, N)
        ends = [e * T + c for e, c in enumerate(routing.tolist())] if masked else routing.tolist()
        for e, end in enumerate(ends):
            start = e * T if masked else (ends[e - 1] if e else 0)
            acc = torch.zeros(end - start, N)  # fp32, one rounding at the store
            for kb in range(KB):
                ks = slice(128 * kb, 128 * kb + 128)
                sb = SB[e * NB + torch.arange(N) // 128, kb]
                acc += (a[start:end, ks] @ b[e, :, ks].T) * SA[start:end, kb, None] * sb[None, :]
            D[start:end] = acc.to(D.dtype)
        calls.append((tuple(A.shape), tuple(B.shape), tuple(SB.shape)))
    return kernel


def test_launch_operands_follow_the_kernel_contract(monkeypatch):
    """The op's operands, read as the kernel reads them, give the dequantized product."""
    calls = []
    monkeypatch.setattr(GF, "_gpu", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(GF, "_load", lambda step, arch, N, K, kw: (_stand_in(calls), "v14 fp8"))
    qa, sa, qw, sw = operands(rows=45)
    offs = torch.tensor([10, 10, 25, 40], dtype=torch.int32)  # expert 1 empty; 5 rows unowned
    out = torch.full((45, 200), float("nan"), dtype=torch.bfloat16)
    # every check but the device's (CPU tensors here)
    checked = GF.check_grouped_fp8(qa, qw.transpose(1, 2), offs, sa, sw, out=out,
                                   require_cuda=False)
    monkeypatch.setattr(GF, "check_grouped_fp8", lambda *a, **k: checked)
    GF.grouped_mm_fp8(qa, qw.transpose(1, 2), offs, scale_a=sa, scale_b=sw, out=out)
    assert calls == [((45, 384), (4, 200, 384), (8, 3))]
    deq_a, deq_w = dequantized(qa, sa, qw, sw)
    start = 0
    for e, end in enumerate(offs.tolist()):
        want = deq_a[start:end] @ deq_w[e].T
        torch.testing.assert_close(out[start:end].float(), want, rtol=1e-2, atol=1e-2)
        start = end
    assert out[40:].isnan().all()


@pytest.mark.parametrize("kw,match", [
    (dict(SWAP_AB=True), "FP8_BLOCK=True is built for plain tiles only"),
    (dict(TMA_STORE=True), "FP8_BLOCK=True is built for plain tiles only"),
    (dict(BLK_N=256), r"BLK_N=256 with FP8_BLOCK: one of \(16, 32, 64, 128\)"),
    (dict(K=1040), "K=1040 is not a multiple of 128"),
    (dict(FP8_BLOCK=1), "FP8_BLOCK=1 must be True or False"),
])
def test_builder_refusals(kw, match):
    kw = {"FP8_BLOCK": True, **kw}
    K = kw.pop("K", 1024)
    with pytest.raises(ValueError, match=match):
        registry.get("v14", "sm_90a").build_primfunc(1024, 1024, K, **kw)


def test_fp8_signature():
    text = registry.get("v14", "sm_90a").build_primfunc(512, 200, 384, E=4, FP8_BLOCK=True,
                                                          dtype="bfloat16").script()
    sig = next(ln for ln in text.splitlines() if "def kernel" in ln)
    assert 'A: T.Buffer(("M", 384), "uint8")' in sig
    assert 'B: T.Buffer((4, 200, 384), "uint8")' in sig
    assert 'SA: T.Buffer((M, 3), "float32")' in sig and 'SB: T.Buffer((8, 3), "float32")' in sig
    text = registry.get("v14", "sm_90a").build_primfunc(512, 200, 384, E=4, FP8_BLOCK=True,
                                                          LAYOUT="masked").script()
    sig = next(ln for ln in text.splitlines() if "def kernel" in ln)
    assert 'A: T.Buffer((4, "M", 384), "uint8")' in sig and 'D: T.Buffer((4, M, 200)' in sig
    assert 'SA: T.Buffer(("SA_ROWS", 3), "float32")' in sig


def test_masked_launch_operands_follow_the_kernel_contract(monkeypatch):
    """Masked: a (E, T, K), counts, scale_a (E, T, K/128) flattened to the kernel's (E * T, ..)."""
    calls = []
    monkeypatch.setattr(GF, "_gpu", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(GF, "_load", lambda step, arch, N, K, kw: (_stand_in(calls), "v14 fp8"))
    E, T, N, K = 3, 12, 136, 256
    g = torch.Generator().manual_seed(3)
    x = torch.randn(E * T, K, generator=g)
    qa, sa = GF.quantize_rows(x)
    qw, sw = GF.quantize_experts(torch.randn(E, N, K, generator=g) / 16)
    qa, sa = qa.reshape(E, T, K), sa.reshape(E, T, 2)
    counts = torch.tensor([12, 0, 5], dtype=torch.int32)
    out = torch.full((E, T, N), float("nan"), dtype=torch.bfloat16)
    checked = GF.check_grouped_fp8(qa, qw, None, sa, sw, out=out, counts=counts,
                                   require_cuda=False)
    assert checked[0] == "masked"
    monkeypatch.setattr(GF, "check_grouped_fp8", lambda *a, **k: checked)
    GF.grouped_mm_fp8(qa, qw, counts=counts, scale_a=sa, scale_b=sw, out=out)
    assert calls == [((E, T, K), (E, N, K), (E * 2, 2))]
    deq_a, deq_w = dequantized(qa.reshape(-1, K), sa.reshape(-1, 2), qw, sw)
    deq_a = deq_a.reshape(E, T, K)
    for e, c in enumerate(counts.tolist()):
        torch.testing.assert_close(out[e, :c].float(), deq_a[e, :c] @ deq_w[e].T, rtol=1e-2,
                                   atol=1e-2)
        assert out[e, c:].isnan().all()


# -- the custom op (torch.ops.tirx_gemm.grouped_mm) on fp8 --------------------------------
def test_fake_shapes_and_checks_of_the_fp8_op():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tirx_gemm.op import moe
    qa, sa, qw, sw = operands()
    offs = torch.tensor([10, 10, 25, 40], dtype=torch.int32)
    qm, sm, sw2 = qa.view(4, 10, 384), sa.view(4, 10, 3), sw[:, :, :2].contiguous()
    with FakeTensorMode() as mode:
        fa, fsa, fw, fsw, fo, fm, fsm, fsw2 = (mode.from_tensor(t) for t in (
            qa, sa, qw, sw, offs, qm, sm, sw2))
        out = moe.OP(fa, fw.transpose(1, 2), fo, None, None, None, None, None, fsa, fsw)
        assert out.shape == (40, 200) and out.dtype == torch.bfloat16
        out = moe.OP(fa, fw, fo, None, None, None, None, torch.float16, fsa, fsw)
        assert out.shape == (40, 200) and out.dtype == torch.float16
        out = moe.OP(fm, fw, None, fo, "masked", None, None, None, fsm, fsw)
        assert out.shape == (4, 10, 200)
        with pytest.raises(ValueError, match=r"scale_b has shape \(4, 2, 2\), expected"):
            moe.OP(fa, fw, fo, None, None, None, None, None, fsa, fsw2)


def test_compile_fullgraph_traces_the_fp8_op(monkeypatch):
    """torch.compile(fullgraph=True) over moe.grouped_mm with fp8 operands: the op in the
    graph, its eager call given scale_a and scale_b (here a stand-in of the dequantized
    product on the CPU)."""
    from tirx_gemm.op import moe
    qa, sa, qw, sw = operands()
    offs = torch.tensor([10, 10, 25, 40], dtype=torch.int32)
    seen = []

    def eager(a, b, offs=None, scale_a=None, scale_b=None, **kw):
        seen.append((scale_a is not None, scale_b is not None, kw.get("out_dtype")))
        deq_a, deq_w = dequantized(a, scale_a, b.transpose(1, 2), scale_b)
        out, start = torch.zeros(a.shape[0], deq_w.shape[1]), 0
        for e, end in enumerate(offs.tolist()):
            out[start:end] = deq_a[start:end] @ deq_w[e].T
            start = end
        return out.to(torch.bfloat16)

    monkeypatch.setattr(moe, "_eager", eager)

    def f(a, w, offs, sa, sw):
        return moe.grouped_mm(a, w.transpose(1, 2), offs, scale_a=sa, scale_b=sw) * 2

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(qa, qw, offs, sa, sw)
    torch.testing.assert_close(got, f(qa, qw, offs, sa, sw))
    assert seen and all(s[:2] == (True, True) for s in seen)
