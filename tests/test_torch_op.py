"""tirx_gemm.torch_op on CPU: the custom op's schema and fake implementation, torch.compile
tracing a model that calls it with no graph break (a recording backend and meta tensors: the
kernel never runs), the eager path that skips the dispatcher, and one-line errors."""
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tirx_gemm
from tirx_gemm import torch_op

BF16, FP16 = torch.bfloat16, torch.float16


def _meta(*shape, dtype=BF16):
    return torch.empty(shape, device="meta", dtype=dtype)


def test_the_op_is_registered_with_its_schema():
    assert torch_op.OP is torch.ops.tirx_gemm.matmul.default
    assert str(torch_op.OP._schema) == (
        "tirx_gemm::matmul(Tensor a, Tensor b, str? step=None, Tensor? bias=None, "
        "str? activation=None, ScalarType? out_dtype=None) -> Tensor")
    assert str(torch_op.SWIGLU_OP._schema) == (
        "tirx_gemm::swiglu(Tensor a, Tensor fused, ScalarType? out_dtype=None) -> Tensor")
    assert tirx_gemm.torch_op is torch_op  # reachable from the package, lazily


@pytest.mark.parametrize("M", [1, 7, 77, 4096])
@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_fake_impl_propagates_shape_dtype_and_device(M, dtype):
    with FakeTensorMode():
        a = torch.empty(M, 2048, device="cuda", dtype=dtype)
        b = torch.empty(7168, 2048, device="cuda", dtype=dtype)
        d = torch_op.OP(a, b)
        assert tuple(d.shape) == (M, 7168) and d.dtype == dtype
        assert d.device == a.device and d.is_contiguous()
    d = torch_op.OP(_meta(M, 64, dtype=dtype), _meta(24, 64, dtype=dtype))
    assert (tuple(d.shape), d.dtype, d.device.type) == ((M, 24), dtype, "meta")


BAD = [
    ("dtype", lambda: (_meta(4, 16, dtype=torch.float32), _meta(8, 16, dtype=torch.float32)),
     TypeError, "matmul takes torch.float16 or torch.bfloat16"),
    ("mixed", lambda: (_meta(4, 16, dtype=FP16), _meta(8, 16)), TypeError, "share one dtype"),
    ("3-D", lambda: (_meta(2, 4, 16), _meta(8, 16)), ValueError, "must be 2-D"),
    ("K", lambda: (_meta(4, 16), _meta(8, 24)), ValueError, "same number of columns K"),
    ("N", lambda: (_meta(4, 16), _meta(12, 16)), ValueError, "N=12 is not a multiple of 8"),
    ("K8", lambda: (_meta(4, 12), _meta(8, 12)), ValueError, "K=12 is not a multiple of 8"),
    ("strided", lambda: (_meta(16, 32)[:, ::2], _meta(8, 16)), ValueError, "not contiguous"),
    ("view M", lambda: (_meta(16, 4).t(), _meta(8, 16)), ValueError,
     "rows are M=4 elements, not a multiple of 8"),
]


@pytest.mark.parametrize("name,make,exc,words", BAD, ids=[b[0] for b in BAD])
def test_fake_impl_refuses_in_one_line(name, make, exc, words):
    with pytest.raises(exc) as info:
        torch_op.OP(*make())
    assert words in str(info.value) and "\n" not in str(info.value)


def test_fake_checks_are_the_eager_checks():
    """check_fake gives the eager call's type of error for what it checks (CPU tensors:
    check_operands(require_cuda=False) is the eager check without the device)."""
    from tirx_gemm.matmul import check_operands
    for name, make, exc, _ in BAD:
        a, b = (torch.empty(1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())),
                            dtype=t.dtype).as_strided(t.shape, t.stride()) for t in make())
        with pytest.raises(exc):
            check_operands(a, b, require_cuda=False)
        with pytest.raises(exc):
            torch_op.check_fake(a, b)


@pytest.mark.parametrize("layout", ["NT", "TN", "TT"])
def test_fake_impl_takes_transposed_views(layout):
    """A transposed view (x.T of a row-major x) passes the fake as eager tirx_gemm.matmul
    takes it (v15 reads it in place): the (M, N) result, contiguous; TT with any K."""
    M, N, K = 24, 16, 40 if layout != "TT" else 36
    a = _meta(K, M).t() if layout[0] == "T" else _meta(M, K)
    b = _meta(K, N).t() if layout[1] == "T" else _meta(N, K)
    d = torch_op.OP(a, b)
    assert tuple(d.shape) == (M, N) and d.is_contiguous()
    assert tuple(torch_op.OP(a, b, "v15").shape) == (M, N)


VIEW_BAD = [
    ("epilogue", lambda: torch_op.OP(_meta(16, 24), _meta(24, 8).t(), None, None, "relu"),
     "the fused epilogues (v12) read K-major operands"),
    ("swiglu", lambda: torch_op.SWIGLU_OP(_meta(16, 24), _meta(24, 32).t()),
     "the fused epilogues (v12) read K-major operands"),
    ("step", lambda: torch_op.OP(_meta(16, 24), _meta(24, 8).t(), "v12"),
     "step='v12' reads K-major operands and b is transposed"),
    ("K", lambda: torch_op.OP(_meta(20, 12), _meta(12, 8).t()),
     "K=12 is not a multiple of 8: a is row-major"),
    ("dtype", lambda: torch_op.OP(_meta(16, 24, dtype=FP16), _meta(16, 8).t()),
     "must share one dtype"),
]


@pytest.mark.parametrize("name,call,words", VIEW_BAD, ids=[b[0] for b in VIEW_BAD])
def test_fake_impl_refuses_a_view_in_one_line(name, call, words):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert words in str(info.value) and "\n" not in str(info.value)


def test_compiled_call_on_a_transposed_view():
    """torch.compile (aot_eager, fullgraph) of a call on w.T: the fake takes the view, the op
    gets it as it lies (a CPU reference kernel records the strides) and the result is torch's."""
    seen = []

    def ref(a, b, step=None, bias=None, activation=None, out_dtype=None):
        seen.append((a.stride(), b.stride()))
        return (a.float() @ b.float().T).to(a.dtype)

    lib = torch.library.Library("tirx_gemm", "IMPL")
    lib.impl("matmul", ref, "CPU")
    try:
        x = torch.randn(24, 40, dtype=BF16)
        w = torch.randn(40, 16, dtype=BF16)  # stored (K, N): the call reads w.T, N x K
        torch._dynamo.reset()
        fn = torch.compile(lambda x, w: torch_op.matmul(x, w.t()), backend="aot_eager",
                           fullgraph=True)
        y = fn(x, w)
    finally:
        lib._destroy()
    assert seen == [((40, 1), (1, 16))]  # b reached the op transposed: no copy
    torch.testing.assert_close(y, (x.float() @ w.float()).to(BF16))


def test_eager_cpu_call_is_one_line():
    a, b = torch.randn(4, 16, dtype=BF16), torch.randn(8, 16, dtype=BF16)
    for call in (torch_op.matmul, torch_op.OP):
        with pytest.raises(ValueError) as info:
            call(a, b)
        assert "cpu" in str(info.value) and "\n" not in str(info.value)


def _recording_backend(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return backend


def _ops_in(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.empty(64, 32, device="meta", dtype=BF16))
        self.w2 = torch.nn.Parameter(torch.empty(16, 64, device="meta", dtype=BF16))

    def forward(self, x):
        h = torch.relu(torch_op.matmul(x, self.w1))
        return torch_op.matmul(h, self.w2) * 2


def test_compile_fullgraph_traces_the_op_without_a_graph_break():
    graphs = []
    model = Tiny().requires_grad_(False)
    compiled = torch.compile(model, fullgraph=True, backend=_recording_backend(graphs))
    y = compiled(_meta(5, 32))  # meta tensors: the op's fake implementation computes shapes
    assert (tuple(y.shape), y.dtype) == ((5, 16), BF16)
    assert len(graphs) == 1
    assert _ops_in(graphs[0]).count(torch.ops.tirx_gemm.matmul.default) == 2
    explained = torch._dynamo.explain(Tiny().requires_grad_(False))(_meta(3, 32))
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_compile_with_dynamic_token_count_and_aot():
    """Dynamic M (a decoder's token count) and AOTAutograd (functionalization of the op,
    the fake impl on SymInts) on meta tensors."""
    model = Tiny().requires_grad_(False)
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    for M in (3, 17, 1000):
        assert tuple(compiled(_meta(M, 32)).shape) == (M, 16)


def test_traced_out_argument_gets_a_copy():
    graphs = []

    def f(x, w, out):
        return torch_op.matmul(x, w, out=out)
    out = _meta(4, 8)
    r = torch.compile(f, fullgraph=True, backend=_recording_backend(graphs))(_meta(4, 16),
                                                                            _meta(8, 16), out)
    assert tuple(r.shape) == (4, 8)
    assert torch.ops.tirx_gemm.matmul.default in _ops_in(graphs[0])


def test_traced_bad_shape_fails_in_one_line_at_trace_time():
    def f(x, w):
        return torch_op.matmul(x, w)
    with pytest.raises(Exception) as info:
        torch.compile(f, fullgraph=True, backend="eager")(_meta(4, 16), _meta(12, 16))
    assert "N=12 is not a multiple of 8" in str(info.value)


def test_eager_calls_the_kernel_directly_not_through_the_dispatcher(monkeypatch):
    calls = []

    def fake_matmul(a, b, *, step=None, out=None, sync=False):
        calls.append((tuple(a.shape), tuple(b.shape), step, out is not None, sync))
        return a @ b.T
    monkeypatch.setattr(torch_op, "_matmul", fake_matmul)
    monkeypatch.setattr(torch_op, "OP", None)  # the eager path must not touch it
    a, b = torch.randn(3, 16), torch.randn(8, 16)
    torch.testing.assert_close(torch_op.matmul(a, b), a @ b.T)
    torch_op.matmul(a, b, step="v9")
    assert calls == [((3, 16), (8, 16), None, False, False), ((3, 16), (8, 16), "v9", False,
                                                               False)]


def test_the_op_implementation_calls_matmul_asynchronously(monkeypatch):
    calls = []

    def fake_matmul(a, b, *, step=None, out=None, sync=True):
        calls.append((step, sync))
        return a @ b.T
    monkeypatch.setattr(torch_op, "_matmul", fake_matmul)
    a, b = torch.randn(3, 16, dtype=BF16), torch.randn(8, 16, dtype=BF16)
    torch.testing.assert_close(torch.ops.tirx_gemm.matmul(a, b, "v11"), a @ b.T)
    assert calls == [("v11", False)]


_ONE_KERNEL_OR_A_NODE = r"""
import sys, torch
from torch._subclasses.fake_tensor import FakeTensorMode
from tirx_gemm import torch_op
from tirx_gemm.op import autograd as AG
BF16 = torch.bfloat16
# CPU tensors stand in for CUDA ones: CPU counted as the op's backend, registered again with it
torch_op._BACKEND_KEYS = (torch._C.DispatchKey.CPU,)
torch_op.register_autograd(torch_op.NAME, AG._backward_matmul, setup_context=AG._setup_matmul)
calls = []
def fake_matmul(a, b, bias=None, activation=None, out_dtype=None, *, step=None, sync=True):
    calls.append((step, sync, bias is not None))
    return (a @ b.T).detach()
torch_op._matmul = fake_matmul
a, b = torch.randn(3, 16, dtype=BF16), torch.randn(8, 16, dtype=BF16)
seen = []
def profile(frame, event, arg):
    if event == "call":
        seen.append(frame.f_code.co_filename)
sys.setprofile(profile)
try:
    y = torch_op.OP(a, b, "v11")
    y2 = torch_op.OP(a, b, None, torch.zeros(8, dtype=BF16), "relu")
finally:
    sys.setprofile(None)
torch.testing.assert_close(y, a @ b.T)
assert y.grad_fn is None and y2.grad_fn is None
assert not [f for f in seen if f.replace("\\", "/").endswith("_library/autograd.py")], seen
assert calls == [("v11", False, False), (None, False, True)], calls
y = torch_op.OP(a.clone().requires_grad_(), b)
assert "GeneratedBackwardFor_tirx_gemm_matmul" in type(y.grad_fn).__name__
with torch.no_grad():
    assert torch_op.OP(a.clone().requires_grad_(), b).grad_fn is None
assert len(calls) == 4
with FakeTensorMode():  # a fake tensor takes torch's path to the fake implementation
    d = torch_op.OP(torch.empty(5, 16, device="cuda", dtype=BF16),
                    torch.empty(8, 16, device="cuda", dtype=BF16))
    assert tuple(d.shape) == (5, 8)
assert len(calls) == 4  # the fake implementation ran, not the eager one
print("one kernel or a node")
"""


def test_a_call_without_gradient_runs_one_python_kernel_and_one_with_gradient_records_it():
    """With the backward registered through torch_op.register_autograd (as
    tirx_gemm.op.autograd registers it): a call that records no gradient runs
    the implementation straight from the autograd key (torch's generated autograd kernel and
    its redispatch never run); a call with an input that requires grad goes through the
    generated kernel and records a node for backward. In its own process, so the
    registration stays out of the other tests' op."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", _ONE_KERNEL_OR_A_NODE], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "one kernel or a node" in out.stdout, out.stdout + out.stderr


def test_register_autograd_refuses_another_op_in_one_line():
    with pytest.raises(ValueError, match=r"^register_autograd: 'aten::mm' is not one of"):
        torch_op.register_autograd("aten::mm", lambda ctx, g: g, setup_context=None)


def test_the_callable_module_is_not_traceable_so_the_docs_point_to_torch_op():
    """dynamo cannot call a module object: code under torch.compile must call
    tirx_gemm.torch_op.matmul (or use tirx_gemm.nn.Linear), as torch_op's docstring says."""
    doc = " ".join(torch_op.__doc__.split())
    assert "dynamo cannot trace the launch itself" in doc
    assert "dynamo cannot call a module object" in doc


def test_the_benchmarks_print_suites_that_export_reads(tmp_path):
    """scripts/bench_model.py --print-shapes and bench_overhead.py --print-suite write suite
    files that tirx_gemm.op.suite loads and plans (what `tirx-gemm export --suite` does), with
    every (N, K) of tests/test_gpu_op.py, without a GPU."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    from tirx_gemm.op import suite
    root = Path(__file__).resolve().parent.parent
    for script, flag in (("bench_model.py", "--print-shapes"),
                         ("bench_overhead.py", "--print-suite")):
        out = subprocess.run([sys.executable, str(root / "scripts" / script), flag],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        path = tmp_path / f"{script}.json"
        path.write_text(out)
        s = suite.load_suite(path)
        assert suite.export_requests(s, "matmul", "sm_90a", 132)
        assert json.loads(out)["dtypes"] == ["bfloat16"]
        if script == "bench_model.py":
            nk = {(e.N, e.K) for e in s.entries}
            assert nk == {(1024, 4096), (4096, 4096), (14336, 4096), (4096, 14336)}
            assert {e.M for e in s.entries} == {1, 8, 64, 128, 256, 1000, 4096}


# --- the fused epilogue's arguments ------------------------------------------------------
@pytest.mark.parametrize("dtype", [FP16, BF16])
def test_fake_epilogue_shapes_and_dtypes(dtype):
    a, b = _meta(77, 64, dtype=dtype), _meta(40, 64, dtype=dtype)
    for bias_dt in (FP16, BF16, torch.float32):
        d = torch_op.OP(a, b, None, _meta(40, dtype=bias_dt), "gelu")
        assert (tuple(d.shape), d.dtype) == ((77, 40), dtype)
    d = torch_op.OP(a, b, None, None, "silu", torch.float32)
    assert (tuple(d.shape), d.dtype) == ((77, 40), torch.float32)
    d = torch_op.OP(a, b, None, None, None, dtype)  # out_dtype = the operands': plain
    assert d.dtype == dtype
    s = torch_op.SWIGLU_OP(a, _meta(32, 64, dtype=dtype))
    assert (tuple(s.shape), s.dtype) == ((77, 16), dtype)
    s = torch_op.SWIGLU_OP(a, _meta(32, 64, dtype=dtype), torch.float32)
    assert s.dtype == torch.float32


EPI_BAD = [
    ("act", lambda: (_meta(4, 16), _meta(8, 16), None, None, "tanh"), ValueError,
     "activation='tanh' is not supported"),
    ("bias shape", lambda: (_meta(4, 16), _meta(8, 16), None, _meta(16)), ValueError,
     "expected (8,)"),
    ("bias 2-D", lambda: (_meta(4, 16), _meta(8, 16), None, _meta(1, 8)), ValueError,
     "expected (8,)"),
    ("bias dtype", lambda: (_meta(4, 16), _meta(8, 16), None, _meta(8, dtype=torch.int32)),
     TypeError, "the fused bias takes"),
    ("out dtype", lambda: (_meta(4, 16), _meta(8, 16), None, None, None, torch.float16),
     ValueError, "out_dtype=torch.float16 is not supported"),
]


@pytest.mark.parametrize("name,make,exc,words", EPI_BAD, ids=[b[0] for b in EPI_BAD])
def test_fake_epilogue_refuses_in_one_line(name, make, exc, words):
    with pytest.raises(exc) as info:
        torch_op.OP(*make())
    assert words in str(info.value) and "\n" not in str(info.value)


def test_fake_swiglu_refuses_a_weight_that_is_not_fused():
    with pytest.raises(ValueError, match="2N rows, N a multiple of 8") as info:
        torch_op.SWIGLU_OP(_meta(4, 16), _meta(24, 16))
    assert "\n" not in str(info.value)


def test_compile_traces_the_epilogue_and_swiglu_ops():
    graphs = []

    def f(x, w, bias, fused):
        return torch_op.matmul(x, w, bias, "gelu"), torch_op.swiglu(x, fused)
    y, s = torch.compile(f, fullgraph=True, backend=_recording_backend(graphs))(
        _meta(4, 16), _meta(24, 16), _meta(24), _meta(32, 16))
    assert tuple(y.shape) == (4, 24) and tuple(s.shape) == (4, 16)
    ops = _ops_in(graphs[0])
    assert torch.ops.tirx_gemm.matmul.default in ops and torch.ops.tirx_gemm.swiglu.default in ops


def test_eager_epilogue_calls_pass_the_arguments(monkeypatch):
    seen = []
    monkeypatch.setattr(torch_op, "_matmul",
                        lambda a, b, *args, **kw: seen.append(("mm", args, kw)) or "y")
    monkeypatch.setattr(torch_op, "_swiglu", lambda a, **kw: seen.append(("sw", kw)) or "s")
    a, b = torch.randn(4, 16, dtype=BF16), torch.randn(8, 16, dtype=BF16)
    bias = torch.randn(8, dtype=BF16)
    assert torch_op.matmul(a, b, bias, "relu", torch.float32) == "y"
    assert seen[-1] == ("mm", (bias, "relu", torch.float32), {"step": None, "out": None,
                                                               "sync": False})
    assert torch_op.swiglu(a, b) == "s"
    assert seen[-1] == ("sw", {"fused": b, "out_dtype": None, "sync": False})


def test_the_library_registers_the_backward_through_the_fast_path():
    """Importing tirx_gemm.op.autograd installs torch_op's Autograd kernel for both ops (a call
    that records no gradient runs one Python kernel), not torch.library's generated one."""
    from tirx_gemm.op import autograd  # noqa: F401 (registers)
    for name in (torch_op.NAME, torch_op.SWIGLU_NAME):
        active = [line for line in torch._C._dispatch_dump(name).splitlines()
                  if line.startswith("Autograd[alias]:")]
        assert active and "tirx_gemm/op/torch_op.py" in active[0].replace("\\", "/"), active
