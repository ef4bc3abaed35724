"""tirx_gemm.nn on CPU: Linear is a drop-in torch.nn.Linear (state_dict, parameters, bias),
its forward falls back to F.linear, counted and warned, for what the kernels cannot serve
(or raises one line with strict=True), routes served calls to the kernel (a stand-in here)
with leading dimensions flattened and the bias added, and traces under torch.compile as the
custom op; patch replaces what it can and reports every Linear it kept, with why."""
import warnings

import pytest
import torch
from torch import nn

import tirx_gemm
from tirx_gemm import nn as tnn
from tirx_gemm import torch_op

BF16 = torch.bfloat16


@pytest.fixture
def served(monkeypatch):
    """Pretend CPU tensors are on a served GPU and the kernel is ``a @ b.T`` (recorded)."""
    calls = []

    def kernel(a, b, *, step=None, out=None, sync=False):
        assert a.dim() == 2 and a.is_contiguous() and not sync
        calls.append((tuple(a.shape), tuple(b.shape)))
        return (a.float() @ b.float().T).to(a.dtype)
    monkeypatch.setattr(tnn, "_device_refusal", lambda device: None)  # patch's probe
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)  # forward's: "cuda:0",
    monkeypatch.setitem(tnn._served, 0, None)  # a served GPU
    monkeypatch.setattr(torch_op, "_matmul", kernel)
    return calls


def test_state_dict_and_parameters_are_nn_linears():
    torch.manual_seed(0)
    ref = nn.Linear(32, 16)
    ours = tnn.Linear(32, 16)
    assert isinstance(ours, nn.Linear)
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    ours.load_state_dict(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v)
    ref.load_state_dict(ours.state_dict())  # and back
    assert list(tnn.Linear(8, 8, bias=False).state_dict()) == ["weight"]
    assert repr(tnn.Linear(8, 16)) == repr(nn.Linear(8, 16))
    assert "strict=True" in repr(tnn.Linear(8, 16, strict=True))


def test_from_linear_shares_the_tensors_and_keeps_hooks_and_mode():
    ref = nn.Linear(16, 8).eval()
    seen = []
    ref.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    ours = tnn.Linear.from_linear(ref)
    assert ours.weight is ref.weight and ours.bias is ref.bias and not ours.training
    with pytest.warns(RuntimeWarning):  # float32: torch's F.linear
        ours(torch.randn(2, 16))
    assert seen == [torch.Size([2, 8])]


def test_cpu_input_falls_back_counted_and_warned_once():
    torch.manual_seed(1)
    lin = tnn.Linear(16, 8)
    x = torch.randn(3, 5, 16)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("default")
        for _ in range(3):
            y = lin(x)
    torch.testing.assert_close(y, nn.functional.linear(x, lin.weight, lin.bias))
    assert lin.fallbacks == 3
    assert lin.fallback_reason == "weight is torch.float32: the kernels take float16 or bfloat16"
    msgs = [str(m.message) for m in w if issubclass(m.category, RuntimeWarning)]
    assert len(msgs) == 1 and "ran torch's F.linear" in msgs[0]


def test_strict_raises_one_line():
    lin = tnn.Linear(16, 8, dtype=BF16, strict=True)
    with pytest.raises(ValueError) as info:
        lin(torch.randn(2, 16, dtype=BF16))
    msg = str(info.value)
    assert msg.startswith("tirx_gemm.nn.Linear(16, 8) cannot run this call: input is on cpu")
    assert "\n" not in msg


def test_fallback_reproduces_torchs_errors():
    """A drop-in: what nn.Linear refuses, Linear refuses the same way (F.linear raises)."""
    lin = tnn.Linear(16, 8, dtype=BF16)
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lin(torch.randn(2, 16))  # fp32 input into bf16 weights, as nn.Linear raises


def test_served_call_flattens_adds_bias_and_keeps_shape(served):
    torch.manual_seed(2)
    ref = nn.Linear(32, 24).to(BF16).requires_grad_(False)
    ours = tnn.Linear.from_linear(ref)
    x = torch.randn(2, 3, 32, dtype=BF16)
    y = ours(x)
    assert y.shape == (2, 3, 24) and y.dtype == BF16
    torch.testing.assert_close(y, ref(x), atol=2e-2, rtol=2e-2)
    assert served == [((6, 32), (24, 32))] and ours.fallbacks == 0
    xt = torch.randn(32, 4, dtype=BF16).t()  # a transposed view: copied, then served
    torch.testing.assert_close(ours(xt), ref(xt), atol=2e-2, rtol=2e-2)
    assert served[-1] == ((4, 32), (24, 32))
    # the last position of each row of a batch (transformers' lm_head input at decode):
    # reshape gives a strided view, made compact before the kernel
    h = torch.randn(8, 5, 32, dtype=BF16)[:, -1:, :]
    assert not h.reshape(-1, 32).is_contiguous()
    torch.testing.assert_close(ours(h), ref(h), atol=2e-2, rtol=2e-2)
    assert served[-1] == ((8, 32), (24, 32)) and ours(h).shape == (8, 1, 24)


def test_grad_mode_trains_through_the_autograd_op_and_no_grad_is_served(served, monkeypatch):
    from tirx_gemm.op import autograd as AG
    routed = []
    monkeypatch.setattr(AG, "linear", lambda x, w, b, fuse_bias: routed.append(
        (tuple(x.shape), fuse_bias)) or torch.nn.functional.linear(x, w, b))
    lin = tnn.Linear(16, 8, dtype=BF16)  # parameters require grad, as nn.Linear's do
    x = torch.randn(4, 16, dtype=BF16)
    y = lin(x)
    assert routed == [((4, 16), tnn.fuses_bias(x.device))] and lin.fallbacks == 0
    y.float().sum().backward()
    assert lin.weight.grad is not None and served == []
    with torch.no_grad():
        lin(x)
    with torch.inference_mode():
        lin(x)
    assert len(served) == 2 and lin.fallbacks == 0 and len(routed) == 1


@pytest.mark.parametrize("make,words", [
    (lambda: (tnn.Linear(12, 8, dtype=BF16), torch.randn(2, 12, dtype=BF16)),
     "features 12->8: the kernels need multiples of 8"),
    (lambda: (tnn.Linear(16, 8, dtype=BF16), torch.randn(2, 16, dtype=torch.float16)),
     "input is torch.float16 but the weight is torch.bfloat16"),
])
def test_unservable_shapes_and_dtypes_fall_back(served, make, words):
    lin, x = make()
    lin.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            lin(x)
        except RuntimeError:
            pass  # F.linear's own refusal of a mixed dtype
    assert lin.fallback_reason == words and served == []


def _recording_backend(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return backend


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_compile_fullgraph_traces_linear_as_the_op(served, monkeypatch):
    # dynamo reads a meta tensor's device itself: let every call be served while tracing
    monkeypatch.setattr(tnn.Linear, "_traced_refusal", lambda self, x: None)
    graphs = []
    backend = _recording_backend(graphs)
    model = nn.Sequential(tnn.Linear(32, 64, device="meta", dtype=BF16), nn.ReLU(),
                          tnn.Linear(64, 16, bias=False, device="meta", dtype=BF16))
    model.requires_grad_(False)
    y = torch.compile(model, fullgraph=True, backend=backend)(
        torch.empty(2, 5, 32, device="meta", dtype=BF16))
    assert tuple(y.shape) == (2, 5, 16) and y.dtype == BF16
    targets = _targets(graphs[0])
    assert targets.count(torch.ops.tirx_gemm.matmul.default) == 2
    assert served == []  # traced, never run: meta tensors go through the fake impl


def test_compile_fullgraph_traces_the_fallback_as_f_linear_without_counting():
    graphs = []
    model = nn.Sequential(tnn.Linear(32, 64), nn.ReLU(), tnn.Linear(64, 16)).eval()
    x = torch.randn(3, 32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning while tracing
        y = torch.compile(model, fullgraph=True, backend=_recording_backend(graphs))(x)
        F = nn.functional
        want = F.linear(F.relu(F.linear(x, model[0].weight, model[0].bias)), model[2].weight,
                        model[2].bias)
    torch.testing.assert_close(y, want)
    assert torch.ops.tirx_gemm.matmul.default not in _targets(graphs[0])
    assert _targets(graphs[0]).count(nn.functional.linear) == 2
    assert model[0].fallbacks == 0 and model[2].fallbacks == 0


class Custom(nn.Linear):
    pass


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(32, 64, dtype=BF16)
        self.fp32 = nn.Linear(64, 64)
        self.odd = nn.Linear(64, 60, bias=False, dtype=BF16)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(64, 64, dtype=BF16), nn.GELU())])
        self.custom = Custom(64, 64, dtype=BF16)
        self.mixed = nn.Linear(64, 64, dtype=BF16)
        self.mixed.bias.data = self.mixed.bias.data.float()
        self.mine = tnn.Linear(64, 64, dtype=BF16)
        self.shared = self.up  # one layer at two names


def test_patch_replaces_what_it_can_and_says_why_not(served):
    net = Net().requires_grad_(False)
    before = {k: v for k, v in net.state_dict().items()}
    up = net.up
    report = tirx_gemm.patch(net)
    assert report.module is net
    assert [n for n, _ in report.replaced] == ["up", "shared", "blocks.0.0"]
    assert dict(report.replaced)["shared"] == "the same layer as up"
    assert type(net.up) is tnn.Linear and net.shared is net.up and net.up.weight is up.weight
    assert type(net.blocks[0][0]) is tnn.Linear
    kept = dict(report.kept)
    assert kept["fp32"] == ("64->64 float32 +bias: weight is torch.float32: the kernels take "
                            "float16 or bfloat16")
    assert kept["odd"].endswith("out_features=60 is not a multiple of 8 (TMA's 16-byte rows)")
    assert "subclasses nn.Linear" in kept["custom"] and "test_nn.Custom" in kept["custom"]
    assert kept["mixed"].endswith("bias is torch.float32 but the weight is torch.bfloat16")
    assert kept["mine"].startswith("already a tirx_gemm.nn.Linear")
    assert set(kept) == {"fp32", "odd", "custom", "mixed", "mine"}
    after = net.state_dict()
    assert list(after) == list(before)
    assert all(after[k] is before[k] or torch.equal(after[k], before[k]) for k in before)
    text = str(report)
    assert text.splitlines()[0] == ("tirx_gemm.patch: 3 Linear layer(s) replaced, 5 kept on "
                                    "torch")
    assert "  replaced  up  (32->64 bfloat16 +bias)" in text
    assert "  kept      odd: 64->60 bfloat16: out_features=60" in text


def test_patch_on_cpu_keeps_everything_and_says_so(capsys):
    net = nn.Sequential(nn.Linear(16, 16, dtype=BF16), nn.ReLU())
    report = tirx_gemm.patch(net, verbose=True)
    assert report.replaced == [] and report.kept == [
        ("0", "16->16 bfloat16 +bias: weight is on cpu, not a CUDA GPU")]
    assert capsys.readouterr().out.strip() == str(report)


def test_patch_notes_weights_that_require_grad_train_on_the_kernels(served):
    net = nn.Sequential(nn.Linear(16, 16, dtype=BF16))
    report = tirx_gemm.patch(net)
    assert "trainable: forward, dgrad and wgrad on the kernels" in report.replaced[0][1]


def test_patch_of_a_bare_linear_returns_the_replacement(served):
    lin = nn.Linear(16, 8, dtype=BF16)
    report = tirx_gemm.patch(lin)
    assert type(report.module) is tnn.Linear and report.module.weight is lin.weight
    assert report.replaced[0][0] == ""


def test_patch_refuses_a_non_module_in_one_line():
    with pytest.raises(TypeError, match="^patch takes a torch.nn.Module, got dict$"):
        tirx_gemm.patch({})


def test_patch_and_nn_are_lazy_attributes_of_the_package():
    assert tirx_gemm.patch is tnn.patch and tirx_gemm.nn is tnn


# --- the fused bias ------------------------------------------------------------------------
def test_served_call_fuses_the_bias_where_matmul_fuses_it(served, monkeypatch):
    """On an sm_90a GPU (fuses_bias) the bias goes to the kernel's epilogue: one call with
    the bias, no add_ afterwards; elsewhere (the served fixture's CPU stand-in) it is added."""
    fused_calls = []

    def kernel(a, b, bias=None, *, step=None, out=None, sync=False):
        fused_calls.append(None if bias is None else tuple(bias.shape))
        y = a.float() @ b.float().T
        return (y + bias.float() if bias is not None else y).to(a.dtype)
    monkeypatch.setattr(torch_op, "_matmul", kernel)
    monkeypatch.setattr(tnn, "fuses_bias", lambda device: True)
    torch.manual_seed(3)
    ref = nn.Linear(32, 24).to(BF16).requires_grad_(False)
    ours = tnn.Linear.from_linear(ref)
    x = torch.randn(5, 32, dtype=BF16)
    torch.testing.assert_close(ours(x), ref(x), atol=2e-2, rtol=2e-2)
    assert fused_calls == [(24,)]
    ours_nobias = tnn.Linear.from_linear(nn.Linear(32, 24, bias=False).to(BF16))
    ours_nobias.requires_grad_(False)(x)
    assert fused_calls[-1] is None


def test_fuses_bias_is_false_off_cuda():
    assert tnn.fuses_bias(torch.device("cpu")) is False
    assert tnn.fuses_bias(torch.device("meta")) is False


def test_compile_traces_the_fused_bias_when_the_gpu_fuses(served, monkeypatch):
    monkeypatch.setattr(tnn.Linear, "_traced_refusal", lambda self, x: None)
    monkeypatch.setitem(tnn._fused_bias, 0, True)
    graphs = []
    model = tnn.Linear(32, 64, device="meta", dtype=BF16).requires_grad_(False)
    y = torch.compile(model, fullgraph=True, backend=_recording_backend(graphs))(
        torch.empty(5, 32, device="meta", dtype=BF16))
    assert tuple(y.shape) == (5, 64)
    nodes = [n for n in graphs[0].graph.nodes if n.op == "call_function"
             and n.target is torch.ops.tirx_gemm.matmul.default]
    assert len(nodes) == 1 and len(nodes[0].args) >= 4 and nodes[0].args[3] is not None
    assert not any(n.target in (torch.ops.aten.add.Tensor, torch.add)
                   or getattr(n.target, "__name__", "") == "add"
                   for n in graphs[0].graph.nodes if n.op == "call_function")


# --------------------------------------------------------------------------------------
# patch: all or nothing, layers it must not replace, hooks
# --------------------------------------------------------------------------------------
def test_patch_checks_every_layer_before_replacing_any(served, monkeypatch):
    net = nn.Sequential(nn.Linear(16, 16, dtype=BF16), nn.Linear(16, 16, dtype=BF16))
    first, second = net[0], net[1]
    real = tnn._replacement

    def failing(layer, strict):
        if layer is second:
            raise RuntimeError("checking the second layer failed")
        return real(layer, strict)
    monkeypatch.setattr(tnn, "_replacement", failing)
    with pytest.raises(RuntimeError, match="second layer"):
        tirx_gemm.patch(net)
    assert net[0] is first and net[1] is second  # nothing replaced


def test_patch_puts_the_old_layers_back_when_a_replacement_fails(served):
    class Picky(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 16, dtype=BF16)
            self.b = nn.Linear(16, 16, dtype=BF16)

        def __setattr__(self, name, value):
            if name == "b" and isinstance(value, tnn.Linear):
                raise AttributeError("b cannot be replaced")
            super().__setattr__(name, value)
    net = Picky()
    a, b = net.a, net.b
    with pytest.raises(AttributeError, match="b cannot be replaced"):
        tirx_gemm.patch(net)
    assert net.a is a and net.b is b


class Int8Param(nn.Parameter):
    """A Parameter subclass, as quantization libraries wrap their weights."""


def test_patch_keeps_reparametrized_quantized_and_extended_layers_with_why(served):
    net = nn.Sequential(*[nn.Linear(16, 16, dtype=BF16) for _ in range(7)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.nn.utils.weight_norm(net[0])  # the old API: weight recomputed by a pre-hook
    torch.nn.utils.parametrizations.weight_norm(net[1])
    net[2].weight = Int8Param(net[2].weight.detach())
    net[3].register_buffer("scale", torch.ones(1))
    net[4].lora = nn.Linear(16, 4, bias=False, dtype=BF16)
    net[5].register_load_state_dict_pre_hook(lambda *args: None)
    report = tirx_gemm.patch(net)
    kept = dict(report.kept)
    assert "its weight is not a Parameter of the layer (weight_norm" in kept["0"]
    assert "its weight is parametrized (torch.nn.utils.parametrize)" in kept["1"]
    assert "its weight is a test_nn.Int8Param, not a plain torch.nn.Parameter" in kept["2"]
    assert "it also holds buffer scale, which a replacement would drop" in kept["3"]
    assert "it also holds submodule lora" in kept["4"]
    assert "load_state_dict pre-hook" in kept["5"]
    assert [name for name, _ in report.replaced] == ["6"] and type(net[6]) is tnn.Linear
    assert not any(type(m) is tnn.Linear for m in net[:6])


def test_patch_moves_every_hook_and_the_callers_handles_still_remove_them(served):
    net = nn.Sequential(nn.Linear(16, 16, dtype=BF16))
    seen = []
    handles = [
        net[0].register_forward_pre_hook(lambda m, args: seen.append(("pre", type(m)))),
        net[0].register_forward_hook(lambda m, args, out: seen.append(("fwd", type(m)))),
        net[0].register_full_backward_hook(lambda m, gi, go: seen.append(("bwd", type(m)))),
        net[0].register_state_dict_post_hook(
            lambda m, sd, prefix, meta: seen.append(("sd", type(m))))]
    assert tirx_gemm.patch(net).replaced[0][0] == "0"
    assert type(net[0]) is tnn.Linear
    x = torch.randn(2, 16, dtype=BF16, requires_grad=True)
    net(x).sum().backward()  # grad mode: the autograd op, forward and backward on the kernels
    net.state_dict()
    assert seen == [(k, tnn.Linear) for k in ("pre", "fwd", "bwd", "sd")]
    for h in handles:
        h.remove()
    seen.clear()
    with torch.no_grad():
        net(x)
    net.state_dict()
    assert seen == []


def test_a_sparse_input_falls_back_to_torch_before_any_data_pointer_is_read(served):
    layer = tnn.Linear(16, 16, dtype=BF16).requires_grad_(False)
    x = torch.randn(4, 16).to(BF16)
    with pytest.warns(RuntimeWarning, match="input is a torch.sparse_coo tensor"):
        y = layer(x.to_sparse())
    assert torch.equal(y, nn.functional.linear(x.to_sparse(), layer.weight, layer.bias))
    assert layer.fallbacks == 1 and served == []


def test_from_linear_and_use_bundle_refuse_what_they_do_not_take():
    """Linear.from_linear(5) and from_linear(Conv1d) ended in AttributeError; use_bundle(5)
    in pathlib's TypeError, use_bundle('') looked for a bundle in the current folder."""
    for layer, kind in ((5, "int"), (nn.Conv1d(4, 4, 1), "Conv1d")):
        with pytest.raises(TypeError, match=f"^from_linear takes a torch.nn.Linear, got {kind}$"):
            tnn.Linear.from_linear(layer)
    from tirx_gemm import matmul as mm
    for path in (5, "", "  "):
        with pytest.raises(TypeError, match="^use_bundle takes the path of a bundle folder"):
            mm.use_bundle(path)
