"""Inputs that could give a wrong answer without a word, or end in a traceback, refused in one
line on CPU (the checks that run before any launch): an ``out`` whose bytes overlap an input
(plain, epilogue, fp8 and the custom op's eager path, the remembered-call lean paths
included), a sparse tensor (before any data pointer is read), a ``fused=`` weight that
fuse_gate_up did not make (a concatenated [w_gate; w_up]), a step that is not a step id, a
bias that is not a tensor. The lean paths are reached by remembering a call whose kernel is
a stand-in that records its launches."""
import pytest
import torch

from tirx_gemm import matmul as mm
from tirx_gemm import torch_op
from tirx_gemm.op import fp8, operands

F16 = torch.float16
M, N, K = 64, 128, 64


def _ab():
    return torch.randn(M, K).to(F16), torch.randn(N, K).to(F16)


def _one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# --------------------------------------------------------------------------------------
# out overlapping an input: byte ranges, every path
# --------------------------------------------------------------------------------------
def test_byte_range_covers_strides_offsets_and_empty_tensors():
    x = torch.empty(4, 8, dtype=F16)
    p = x.data_ptr()
    assert operands.byte_range(x) == (p, p + 4 * 8 * 2 - 1)
    assert operands.byte_range(x.t()) == operands.byte_range(x)  # a transposed view
    assert operands.byte_range(x[1:3, 2:4]) == (p + (8 + 2) * 2, p + (2 * 8 + 3) * 2 + 1)
    assert operands.byte_range(x[:, ::3]) == (p, p + (3 * 8 + 6) * 2 + 1)
    assert operands.byte_range(x[:0]) is None


def test_out_overlapping_a_at_another_offset_is_refused_by_the_full_checks():
    """Not the same data pointer: out starts inside a (same storage, 8 rows in)."""
    buf = torch.empty(M * K + M * N, dtype=F16)
    a = buf[:M * K].view(M, K)
    out = buf[8 * K:8 * K + M * N].view(M, N)
    b = torch.randn(N, K).to(F16)
    assert out.data_ptr() != a.data_ptr()
    with pytest.raises(ValueError, match="^out overlaps a in memory") as e:
        mm.check_operands(a, b, out, require_cuda=False)
    assert "pass out=None or a tensor of its own" in _one_line(e)
    with pytest.raises(ValueError, match="^out overlaps b in memory"):
        mm.check_operands(torch.randn(M, K).to(F16), buf[-N * K:].view(N, K),
                          buf[M * K - 8 * N:M * K - 8 * N + M * N].view(M, N),
                          require_cuda=False)


def test_disjoint_views_of_one_storage_are_accepted():
    buf = torch.empty(M * K + N * K + M * N, dtype=F16)
    a = buf[:M * K].view(M, K)
    b = buf[M * K:M * K + N * K].view(N, K)
    out = buf[M * K + N * K:].view(M, N)
    assert mm.check_operands(a, b, out, require_cuda=False) == (M, N, K, "float16")


def test_epilogue_out_overlapping_bias_is_refused():
    a, b = _ab()
    buf = torch.empty(M * N, dtype=F16)
    out = buf.view(M, N)
    bias = buf[-N:]
    with pytest.raises(ValueError, match="^out overlaps bias in memory"):
        mm._epilogue_checks(a, b, bias, "relu", None, False, out, require_cuda=False)
    with pytest.raises(ValueError, match="^out overlaps a in memory"):
        mm._epilogue_checks(buf[-M * K:].view(M, K), b, None, "relu", None, False, out,
                            require_cuda=False)


def test_fp8_out_overlapping_an_operand_or_a_scale_is_refused():
    e4m3 = torch.float8_e4m3fn
    raw = torch.empty(M * K + M * N * 2, dtype=torch.uint8)
    a = raw[:M * K].view(e4m3).view(M, K)
    out = raw[M * K - 64:M * K - 64 + M * N * 2].view(torch.bfloat16).view(M, N)
    b = torch.zeros(N, K).to(e4m3)
    one = torch.ones((), dtype=torch.float32)
    with pytest.raises(ValueError, match="^out overlaps a in memory"):
        fp8.check_fp8_operands(a, b, one, one, torch.bfloat16, out, require_cuda=False)
    fresh = torch.empty(M, N, dtype=torch.bfloat16)
    scale = fresh.view(torch.float32).view(-1)[:1].view(())
    with pytest.raises(ValueError, match="^out overlaps scale_b in memory"):
        fp8.check_fp8_operands(torch.zeros(M, K).to(e4m3), b, one, scale, torch.bfloat16,
                               fresh, require_cuda=False)


@pytest.fixture
def remembered(monkeypatch):
    """A remembered plain call and epilogue call of (M, N, K) fp16 on CPU, whose kernel
    records its launches: the lean paths of matmul, as on a GPU after the first call."""
    launches = []

    def kernel(*args):
        launches.append(args)
    monkeypatch.setattr(mm, "_torch", torch)
    key = (torch.Size((M, K)), torch.Size((N, K)), F16, -1, None)
    monkeypatch.setitem(mm._calls, key, mm._Call(kernel, (), "stand-in"))
    epi_key = ("epilogue", key[0], key[1], F16, -1, None, (F16, torch.Size((N,))), None, None,
               False)
    monkeypatch.setitem(mm._calls, epi_key, mm._Call(kernel, ((M, N), F16), "stand-in"))
    return launches


def test_the_lean_paths_refuse_an_overlapping_out_and_launch_a_fresh_one(remembered):
    a, b = _ab()
    mm.matmul(a, b, out=torch.empty(M, N, dtype=F16))
    mm.matmul(a, b, torch.zeros(N, dtype=F16), out=torch.empty(M, N, dtype=F16))
    assert len(remembered) == 2
    buf = torch.empty(M * N + M * K, dtype=F16)
    a_in_out = buf[M * N - K:M * N - K + M * K].view(M, K)
    out = buf[:M * N].view(M, N)
    with pytest.raises(ValueError, match="^out overlaps a in memory"):
        mm.matmul(a_in_out, b, out=out)
    with pytest.raises(ValueError, match="^out overlaps bias in memory"):
        mm.matmul(a, b, out[-1], out=out)
    with pytest.raises(ValueError, match="^out overlaps a in memory"):
        torch_op.matmul(a_in_out, b, out=out)  # the custom op's eager path
    assert len(remembered) == 2  # nothing launched into an overlapping out


# --------------------------------------------------------------------------------------
# sparse tensors: refused before any data pointer is read
# --------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("to_sparse", [torch.Tensor.to_sparse, torch.Tensor.to_sparse_csr])
def test_a_sparse_operand_is_refused_with_to_dense(to_sparse):
    a, b = _ab()
    with pytest.raises(TypeError, match=r"^a is a torch.sparse_\w+ tensor: the kernels take "
                                        r"dense tensors; pass a.to_dense\(\)$"):
        mm.check_operands(to_sparse(a), b)  # before the no-GPU advice too
    with pytest.raises(TypeError, match=r"^b is a torch.sparse_\w+ tensor.*b.to_dense\(\)"):
        torch_op.check_fake(a, to_sparse(b))  # the traced op's fake implementation
    e4m3 = torch.float8_e4m3fn
    one = torch.ones((), dtype=torch.float32)
    with pytest.raises(TypeError, match=r"^a is a torch.sparse_coo tensor"):
        fp8.check_fp8_operands(torch.zeros(M, K).to_sparse(), torch.zeros(N, K).to(e4m3),
                               one, one, torch.bfloat16, require_cuda=False)


def test_a_sparse_operand_of_a_remembered_shape_is_refused_not_a_traceback(remembered):
    a, b = _ab()
    with pytest.raises(TypeError, match=r"a.to_dense\(\)"):
        mm.matmul(a.to_sparse(), b)
    with pytest.raises(TypeError, match=r"b.to_dense\(\)"):
        mm.matmul(a, b.to_sparse(), torch.zeros(N, dtype=F16))
    assert remembered == []


# --------------------------------------------------------------------------------------
# step= and bias= that are not what they should be
# --------------------------------------------------------------------------------------
def test_a_step_that_is_not_a_string_says_so():
    a, b = _ab()
    with pytest.raises(TypeError, match=r"^step=5 is a int: pass a step id string such as "
                                        r"'v9', or step=None") as e:
        mm.matmul(a, b, step=5)
    _one_line(e)
    with pytest.raises(TypeError, match="^step=5 is a int"):
        mm.matmul(a, b, activation="relu", step=5)


def test_an_unknown_step_says_there_is_no_such_step():
    a, b = _ab()
    for call in (lambda: mm.matmul(a, b, step="v99"),
                 lambda: mm.matmul(a, b, activation="relu", step="v99")):
        with pytest.raises(ValueError, match=r"^there is no step 'v99': the steps are v1, "):
            call()
    for ok in (None, "v9", "V12", "9"):  # what registry.get reads
        mm.check_step(ok)


def test_a_bias_that_is_not_a_tensor_names_its_type():
    for bias, kind in ((True, "bool"), ([0.0] * N, "list"), (1.5, "float")):
        with pytest.raises(TypeError, match=f"^bias must be a 1-D torch.Tensor of N values "
                                            f"\\(or None\\), got {kind}$"):
            mm.epilogue_kwargs(bias)


# --------------------------------------------------------------------------------------
# swiglu(fused=): only what fuse_gate_up made
# --------------------------------------------------------------------------------------
def _gate_up(n=N, dtype=torch.bfloat16):
    return torch.randn(n, K).to(dtype), torch.randn(n, K).to(dtype)


def test_a_concatenated_gate_up_weight_is_refused_with_the_fix():
    g, u = _gate_up()
    a = torch.randn(M, K).to(torch.bfloat16)
    with pytest.raises(ValueError) as e:
        mm.swiglu(a, fused=torch.cat([g, u]))
    text = _one_line(e)
    for words in ("fused=fuse_gate_up(w_gate, w_up)", "w_gate=, w_up=",
                  "w_gate, w_up = w.chunk(2, dim=0)"):
        assert words in text
    with pytest.raises(ValueError, match="fuse_gate_up"):
        torch_op.swiglu(a, torch.cat([g, u]))  # the custom op's eager path


def test_fuse_gate_ups_weight_and_what_shares_it_pass_the_mark():
    g, u = _gate_up()
    f = mm.fuse_gate_up(g, u)
    a = torch.randn(M, K).to(torch.bfloat16)
    with pytest.raises(ValueError, match="cpu"):  # past the mark, to the device check
        mm.swiglu(a, fused=f)
    param = torch.nn.Parameter(f, requires_grad=False)
    for same in (f, f.contiguous(), f.detach(), f.view(2 * N, K), param):
        operands.check_gate_up(same)
    for copy in (f.clone(), f.half(), f[:N], f.reshape(N, 2 * K)):
        with pytest.raises(ValueError, match="fuse_gate_up"):
            operands.check_gate_up(copy)


def test_a_fused_parameter_keeps_the_mark_through_the_modules_moves():
    """The usual model: fuse at construction, then move the module (its .to() swaps the
    Parameter's data): the mark rides on the Parameter, set when it is registered."""
    layer = torch.nn.Module()
    layer.w = torch.nn.Parameter(mm.fuse_gate_up(*_gate_up(dtype=torch.float32)),
                                 requires_grad=False)
    layer.to(torch.bfloat16)
    assert layer.w.dtype == torch.bfloat16
    operands.check_gate_up(layer.w)
    layer.w2 = torch.nn.Parameter(torch.cat(_gate_up()), requires_grad=False)
    with pytest.raises(ValueError, match="fuse_gate_up"):
        operands.check_gate_up(layer.w2)


def test_a_non_tensor_out_or_b_of_a_remembered_shape_is_refused_not_a_traceback(remembered):
    a, b = _ab()
    with pytest.raises(TypeError, match="^out must be a torch.Tensor, got int$"):
        mm.matmul(a, b, out=5)
    with pytest.raises(TypeError, match="^b must be a torch.Tensor, got NoneType$"):
        mm.matmul(a, None, torch.zeros(N, dtype=F16))
    assert remembered == []


def test_a_dtype_mismatch_says_what_to_pass():
    """The mismatch messages named both dtypes and stopped there."""
    from tirx_gemm.op import grouped
    a, b = _ab()
    with pytest.raises(TypeError, match=r"^out is torch.float16 but the result is "
                                        r"torch.float32: pass out=None or an out of"):
        mm._epilogue_checks(a, b, None, None, torch.float32, False,
                            torch.empty(M, N, dtype=F16), require_cuda=False)
    e4m3, one = torch.float8_e4m3fn, torch.ones((), dtype=torch.float32)
    with pytest.raises(TypeError, match=r"but out_dtype is torch.bfloat16: pass "
                                        r"out_dtype=torch.float16, or an out of"):
        fp8.check_fp8_operands(torch.zeros(M, K).to(e4m3), torch.zeros(N, K).to(e4m3), one, one,
                               torch.bfloat16, torch.empty(M, N, dtype=F16), require_cuda=False)
    with pytest.raises(TypeError, match=r"must share one dtype \(b.to\(a.dtype\)\)$"):
        grouped.check_grouped(a, torch.randn(4, K, N).bfloat16(),
                              torch.tensor([16, 32, 48, 64], dtype=torch.int32),
                              require_cuda=False)


def test_an_out_that_requires_grad_is_refused_in_grad_mode():
    """torch refuses an out= that requires grad; matmul handed it to the kernel, whose
    launch failed on it ("launching ... failed: Can't export tensors that require
    gradient"), a message that does not name out."""
    a, b = _ab()
    out = torch.empty(M, N, dtype=F16).requires_grad_()
    for call in (lambda: mm.check_operands(a, b, out, require_cuda=False),
                 lambda: mm._epilogue_checks(a, b, None, "relu", None, False, out,
                                             require_cuda=False)):
        with pytest.raises(ValueError, match=r"^out requires grad: .*pass out=None") as e:
            call()
        _one_line(e)
    with torch.no_grad():
        mm.check_operands(a, b, out, require_cuda=False)  # no graph to record: taken


def test_a_nested_operand_is_refused_before_its_sizes_are_read():
    """A nested tensor has the strided layout but no sizes: reading a.shape raised torch's
    "Internal error: NestedTensorImpl doesn't support sizes. Please file an issue." """
    a, b = _ab()
    nested = torch.nested.nested_tensor([a[:3], a[:5]])
    for call in (lambda: mm.check_operands(nested, b, require_cuda=False),
                 lambda: torch_op.check_fake(nested, b),
                 lambda: mm.matmul(nested, b), lambda: mm.matmul(nested, b, activation="relu")):
        with pytest.raises(TypeError, match=r"^a is a nested tensor: .*to_padded_tensor\(0\)$"):
            call()


# --------------------------------------------------------------------------------------
# operands past the int32 index math: refused before any kernel is picked or built
# --------------------------------------------------------------------------------------
def test_operands_past_the_int32_index_limit_are_refused_with_the_split():
    """M*K, M*N or N*K past 2^31-1 elements: a runtime-M kernel's int32 offsets would wrap,
    so matmul, its epilogue path, the traced op's checks and choose refuse it (build --mnk
    and the suites already do). Meta tensors: the shapes without the memory."""
    rows = 2**31 // K + 64
    a = torch.empty(rows, K, dtype=F16, device="meta")
    b = torch.empty(N, K, dtype=F16, device="meta")
    for check in (lambda: operands.check_layout(a, b),
                  lambda: torch_op.check_fake(a, b),
                  lambda: mm.choose(rows, N, K),
                  lambda: mm.explain(rows, N, K)):
        with pytest.raises(ValueError, match=r"M\*K=\d+ elements exceeds 2\^31-1.*split a "
                                             r"along M into calls of at most \d+ rows") as e:
            check()
        _one_line(e)
    with pytest.raises(ValueError, match=r"N\*K=.*split b \(the weight\) along N"):
        mm.choose(8, 2**31 // 4096 + 8, 4096)
    mm.choose(2**31 // 4096 - 8, 4096, 4096)  # just under the limit: picked
