"""``tirx_gemm.nn.Linear`` and ``tirx_gemm.patch(module)``: the steps' GEMM in an existing model.

``Linear`` is a ``torch.nn.Linear`` (a subclass: same constructor, parameters, state_dict
keys, ``extra_repr``) whose forward runs ``tirx_gemm.torch_op.matmul`` when it can: input and
weight on one CUDA GPU of arch sm_90a or sm_100a, one dtype, fp16 or bf16, in- and
out-features multiples of 8 (a call autograd records: the differentiable op). The input's leading
dimensions are flattened to the GEMM's M (a non-contiguous input is copied first, as
F.linear would read it). **The bias** is fused into the GEMM's epilogue on sm_90a (added to
the fp32 accumulator before the cast, one kernel: tirx_gemm.matmul's ``bias=``, v12 only);
on sm_100a, where matmul has no epilogue kernels yet, it is added after the GEMM by one
torch op (``add_`` on the fresh output). While torch.compile traces, the bias is fused when
the layer's GPU was seen to be sm_90a (an eager call or ``patch`` probed it), else added.

**What it does with an input the kernels cannot serve**: it runs ``torch.nn.functional.linear``
(the answer, or the error, torch's nn.Linear would give), counts the call in
``layer.fallbacks``, keeps the reason in ``layer.fallback_reason`` and warns once per reason
(``warnings.warn``, so ``warnings.simplefilter("error")`` makes it loud). Falls back: a CPU or
other-device input, a float32 input or weight (an fp32 model, or autocast to another dtype),
a dtype that differs from the weight's, features not a multiple of 8, a GPU older than
sm_90a. **Training**: with grad mode on and a tensor that requires grad, the call runs
through ``tirx_gemm.op.autograd.linear`` (forward, dgrad and wgrad on the kernels, the bias
gradient by torch), eagerly and while torch.compile traces.
``Linear(..., strict=True)`` raises a one-line ValueError instead of falling back. While
torch.compile traces the forward, the fallback is traced as F.linear without counting or
warning, and the GPU's arch is not probed (the op raises one line at run time on a GPU the
kernels cannot serve; ``patch`` checks the arch when it replaces layers).

``patch(module)`` replaces, in place, every ``torch.nn.Linear`` of ``module`` that the kernels
can serve by a ``Linear`` sharing its parameters (same tensors: no copy, state_dict
unchanged), and leaves the rest to torch; it returns a :class:`Report` of the layers replaced
and of each one kept, with why (``print(report)``). All or nothing: every layer is checked
and every replacement built before the first is put in place (and a failure while putting
them in place puts the old layers back). It replaces only exact ``torch.nn.Linear``
instances whose weight and bias are plain ``torch.nn.Parameter``s of the layer and which
hold nothing else (no buffers, submodules or other parameters): a subclass may have its own
forward, and a parametrized weight (torch.nn.utils.parametrize, the old weight_norm's
recomputed ``weight``) or a quantized wrapper's parameter is not what the kernels should
read; such a layer is kept, with the reason in the report. Hooks move with the layer: the
replacement takes the old layer's hook dicts themselves (forward and pre-forward,
backward, state_dict and load_state_dict hooks), so a handle the caller holds still removes
its hook; hooks run with the replacement as their module. A layer with a load_state_dict
pre-hook is kept (torch binds that hook to the layer, which a replacement would orphan).
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
import torch.nn.functional as F

from tirx_gemm.op import autograd as AG  # registers the op's backward (a layer's own import)
from tirx_gemm.op import torch_op
from tirx_gemm.op.matmul import ROW_MULTIPLE, V9_CLUSTER_TILE

__all__ = ["Linear", "patch", "Report", "layer_refusal", "fuses_bias"]
# what the layers beside this one add to tirx_gemm.nn when they are imported (the public module
# tirx_gemm.nn imports them): "fp8" -> tirx_gemm.op.fp8_nn.patch_fp8, which patch(fp8=...) calls
EXTENSIONS: dict = {}

_DTYPES = (torch.float16, torch.bfloat16)
_served: dict = {}  # CUDA device index -> None (served) or why not, probed once per device
_fused_bias: dict = {}  # CUDA device index -> whether matmul fuses a bias there (sm_90a)


def fuses_bias(device: torch.device) -> bool:
    """Whether tirx_gemm.matmul fuses a bias on ``device`` (an sm_90a GPU: v12's epilogue),
    probed once per device."""
    if device.type != "cuda":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    hit = _fused_bias.get(index)
    if hit is None:
        from tirx_gemm.op.matmul import EPILOGUE_STEPS
        from tirx_gemm.run.device import capability_matches
        cap = tuple(torch.cuda.get_device_capability(index))
        hit = _fused_bias[index] = any(capability_matches(a, cap) for a in EPILOGUE_STEPS)
    return hit


def _device_refusal(device: torch.device) -> str | None:
    """None when tirx_gemm's kernels run on ``device``, else why not (one line)."""
    if device.type != "cuda":
        return f"on {device}, not a CUDA GPU"
    index = device.index if device.index is not None else torch.cuda.current_device()
    why = _served.get(index, False)
    if why is not False:
        return why
    if not torch.cuda.is_available():
        why = f"on {device}, but CUDA is not available here"
    else:
        from tirx_gemm.run.device import capability_matches
        cap = tuple(torch.cuda.get_device_capability(index))
        if any(capability_matches(a, cap) for a in V9_CLUSTER_TILE):
            why = None
        else:
            why = (f"on {torch.cuda.get_device_name(index)} (compute capability "
                   f"{cap[0]}.{cap[1]}): the kernels need sm_90a (9.0) or sm_100a (10.x)")
    _served[index] = why
    return why


def layer_refusal(layer: torch.nn.Linear) -> str | None:
    """Why ``layer``'s weights cannot be served by tirx_gemm (one line), or None."""
    w = layer.weight
    if w.dtype not in _DTYPES:
        return f"weight is {w.dtype}: the kernels take float16 or bfloat16"
    if layer.bias is not None and layer.bias.dtype != w.dtype:
        return f"bias is {layer.bias.dtype} but the weight is {w.dtype}"
    for name, v in (("in_features", layer.in_features), ("out_features", layer.out_features)):
        if v % ROW_MULTIPLE:
            return f"{name}={v} is not a multiple of {ROW_MULTIPLE} (TMA's 16-byte rows)"
    if not w.is_contiguous():
        return f"weight is not contiguous (strides {w.stride()})"
    why = _device_refusal(w.device)
    return None if why is None else f"weight is {why}"


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
               "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
               "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
               "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks")


class Linear(torch.nn.Linear):
    """A torch.nn.Linear whose forward runs tirx_gemm's kernels when it can (see the module
    docstring): ``y = x @ weight.T (+ bias)``, the bias fused into the GEMM on sm_90a.

    Inputs the kernels cannot serve run torch's F.linear, counted in ``fallbacks`` with the
    last reason in ``fallback_reason`` and one warning per reason; ``strict=True`` raises a
    one-line ValueError instead."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, strict: bool = False):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.strict = strict
        self.fallbacks = 0
        self.fallback_reason: str | None = None

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, *, strict: bool = False) -> "Linear":
        """A Linear sharing ``layer``'s parameters (the same tensors), training flag and
        hooks (the same dicts: see the module docstring)."""
        if not isinstance(layer, torch.nn.Linear):
            raise TypeError(f"from_linear takes a torch.nn.Linear, got {type(layer).__name__}")
        new = cls(layer.in_features, layer.out_features, bias=layer.bias is not None,
                  device="meta", dtype=layer.weight.dtype, strict=strict)
        new.weight = layer.weight
        new.bias = layer.bias
        new.train(layer.training)
        for hooks in _HOOK_DICTS:
            if hasattr(layer, hooks):
                object.__setattr__(new, hooks, getattr(layer, hooks))
        if hasattr(layer, "_is_full_backward_hook"):
            new._is_full_backward_hook = layer._is_full_backward_hook
        return new

    def _refusal(self, x, w, b) -> str | None:
        """Why this eager call cannot run tirx_gemm's kernels, or None. Runs on every call,
        so only cheap checks, cheapest first (tirx_gemm.matmul checks the rest and raises
        one line); ``w`` and ``b`` are the layer's weight and bias."""
        if not isinstance(x, torch.Tensor):
            return f"input is a {type(x).__name__}, not a tensor"
        dt = w.dtype
        if dt not in _DTYPES:
            return f"weight is {dt}: the kernels take float16 or bfloat16"
        if x.dtype is not dt:
            return f"input is {x.dtype} but the weight is {dt}"
        if x.layout is not torch.strided:
            return f"input is a {x.layout} tensor (the kernels take dense ones)"
        dev = x.get_device()
        if dev < 0 or dev != w.get_device():
            return f"input is on {x.device}, weight on {w.device}"
        k = self.in_features
        if x.shape[-1] != k:
            return f"input has {x.shape[-1]} features, the layer {k}"
        if k % ROW_MULTIPLE or self.out_features % ROW_MULTIPLE:
            return (f"features {k}->{self.out_features}: the kernels need multiples of "
                    f"{ROW_MULTIPLE}")
        if b is not None and b.dtype is not dt:
            return f"bias is {b.dtype}, weight {dt}"
        if torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") is not dt:
            return f"autocast to {torch.get_autocast_dtype('cuda')}"
        if not w.is_contiguous():
            return f"weight is not contiguous (strides {w.stride()})"
        why = _served.get(dev, False)
        return _device_refusal(x.device) if why is False else why

    def _traced_refusal(self, x) -> str | None:
        """_refusal while torch.compile traces: the same rules on the traced tensors, with
        no probe of the GPU (the op checks it when it runs)."""
        w, b = self.weight, self.bias
        if not isinstance(x, torch.Tensor) or w.dtype not in _DTYPES or x.dtype != w.dtype:
            return "dtype"
        if not x.is_cuda or x.device != w.device:
            return "device"
        if (x.shape[-1] != self.in_features or self.in_features % ROW_MULTIPLE
                or self.out_features % ROW_MULTIPLE):
            return "shape"
        if b is not None and b.dtype != w.dtype:
            return "bias dtype"
        if torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") != w.dtype:
            return "autocast"
        return None

    def forward(self, x):
        if torch.compiler.is_compiling():
            return self._traced_forward(x)
        p = self._parameters  # one dict, not two nn.Module.__getattr__ calls (~0.4 us each)
        w, b = p["weight"], p["bias"]
        why = self._refusal(x, w, b)
        if why is not None:
            return self._fallback(x, why)
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (
                b is not None and b.requires_grad)):  # training: forward, dgrad, wgrad on the kernels
            return AG.linear(x, w, b, fuse_bias=fuses_bias(x.device))
        a = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if not a.is_contiguous():  # reshape may give a strided view (a slice of rows, e.g.
            a = a.contiguous()     # transformers' lm_head input at decode): rows made compact
        if a.data_ptr() & 15:
            a = a.clone()  # a view at an odd offset: TMA needs 16-byte aligned rows
        # eager: the kernel directly, no dispatcher (tirx_gemm.torch_op's docstring)
        if b is not None and fuses_bias(x.device):
            y = torch_op._matmul(a, w, b, sync=False)  # the bias in the epilogue
        else:
            y = torch_op._matmul(a, w, sync=False)
            if b is not None:
                y.add_(b)
        return y if a is x else y.view(*x.shape[:-1], self.out_features)

    def _traced_forward(self, x):
        """forward while torch.compile traces: the custom op (one node of the graph) or,
        for what the kernels cannot serve, F.linear, with no counting or warning."""
        if self._traced_refusal(x) is not None:
            if self.strict:
                raise ValueError(f"tirx_gemm.nn.Linear({self.in_features}, "
                                 f"{self.out_features}) cannot run this call")
            return F.linear(x, self.weight, self.bias)
        index = x.device.index if x.device.index is not None else 0
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad or (
                self.bias is not None and self.bias.requires_grad)):
            return AG.linear(x, self.weight, self.bias, fuse_bias=bool(_fused_bias.get(index)))
        a = x.reshape(-1, self.in_features).contiguous()
        if self.bias is not None and _fused_bias.get(index):
            y = torch_op.OP(a, self.weight, None, self.bias)  # the bias in the epilogue
        else:
            y = torch_op.OP(a, self.weight, None)
            if self.bias is not None:
                y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def _fallback(self, x, why: str):
        if self.strict:
            raise ValueError(f"tirx_gemm.nn.Linear({self.in_features}, {self.out_features}) "
                             f"cannot run this call: {why}")
        self.fallbacks += 1
        self.fallback_reason = why
        warnings.warn(f"tirx_gemm.nn.Linear ran torch's F.linear: {why} (counted in the "
                      "layer's .fallbacks)", RuntimeWarning, stacklevel=2)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + (", strict=True" if self.strict else "")


@dataclasses.dataclass
class Report:
    """What :func:`patch` did: ``replaced`` [(name, note)], ``kept`` [(name, why)], and
    ``module``, the patched module (the argument itself, or its replacement when the
    argument is a Linear)."""

    module: torch.nn.Module
    replaced: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"tirx_gemm.patch: {len(self.replaced)} Linear layer(s) replaced, "
                 f"{len(self.kept)} kept on torch"]
        lines += [f"  replaced  {name or '(root)'}" + (f"  ({note})" if note else "")
                  for name, note in self.replaced]
        lines += [f"  kept      {name or '(root)'}: {why}" for name, why in self.kept]
        return "\n".join(lines)


def _describe(layer) -> str:
    return (f"{layer.in_features}->{layer.out_features} {str(layer.weight.dtype)[6:]}"
            + (" +bias" if layer.bias is not None else ""))


def patch(module: torch.nn.Module, *, strict: bool = False, verbose: bool = False,
          fp8: str | None = None) -> Report:
    """Replace every torch.nn.Linear of ``module`` that tirx_gemm can serve by a
    :class:`Linear` sharing its parameters; leave the others. Returns a :class:`Report`
    (printed with ``verbose``). A Linear shared by several parents is replaced once, by one
    new layer. ``strict`` is passed to the new layers (raise instead of falling back).
    ``fp8="row"`` / ``"block"`` / ``"tensor"``: the layers become tirx_gemm.nn.Fp8Linear
    instead, their weights quantized once with that scale kind (tirx_gemm.op.fp8_nn)."""
    if fp8 is not None:
        if "fp8" not in EXTENSIONS:
            raise RuntimeError("patch(fp8=...) needs tirx_gemm.op.fp8_nn: import tirx_gemm.nn "
                               "(the public module), which loads it")
        return EXTENSIONS["fp8"](module, fp8, strict=strict, verbose=verbose)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"patch takes a torch.nn.Module, got {type(module).__name__}")
    return walk(module, lambda m: isinstance(m, torch.nn.Linear),
                lambda m: _replacement(m, strict), verbose)


def walk(module: torch.nn.Module, is_layer, replacement, verbose: bool) -> Report:
    """patch's walk, shared with patch_fp8: every submodule for which ``is_layer`` holds is
    offered to ``replacement`` (returns (new layer, note) or (None, why it is kept)), once
    however many names it has; then every replacement is put in place, all or nothing."""
    report = Report(module)
    done: dict = {}  # id(old layer) -> (replacement or None, the name it was first seen at)
    seen: set = set()
    plan = []  # (parent, attr, old layer, new layer): put in place once all are checked
    todo = [("", None, "", module)]
    while todo:
        name, parent, attr, m = todo.pop(0)
        if is_layer(m):
            if id(m) in done:  # one layer under several names: one replacement
                new, first = done[id(m)]
                if new is not None:
                    report.replaced.append((name, f"the same layer as {first}"))
            else:
                new, note = replacement(m)
                done[id(m)] = (new, name)
                (report.kept if new is None else report.replaced).append((name, note))
            if new is not None:
                plan.append((parent, attr, m, new))
            continue
        if id(m) in seen:
            continue
        seen.add(id(m))
        # _modules, not named_children(): that skips a module met before under another name
        for child_attr, child in list(m._modules.items()):
            if child is not None:
                todo.append((f"{name}.{child_attr}" if name else child_attr, m, child_attr,
                             child))
    _apply(plan, report)
    if verbose:
        print(report)
    return report


def _apply(plan, report) -> None:
    """Put every planned replacement in place, or, when one fails, put back those done and
    re-raise: patch leaves the module whole or unchanged."""
    done = []
    try:
        for parent, attr, old, new in plan:
            if parent is None:
                report.module = new
            else:
                setattr(parent, attr, new)
            done.append((parent, attr, old))
    except BaseException:
        for parent, attr, old in reversed(done):
            if parent is None:
                report.module = old
            else:
                setattr(parent, attr, old)
        raise


def _not_plain(layer) -> str | None:
    """Why ``layer``'s weight or bias is not a plain Parameter the kernels may read, or
    what else it holds that a replacement would drop (one line), or None."""
    from torch.nn.utils import parametrize
    if parametrize.is_parametrized(layer):
        names = ", ".join(layer.parametrizations.keys())
        return (f"its {names} is parametrized (torch.nn.utils.parametrize): computed at each "
                f"call, left as is")
    params = layer._parameters
    for name in ("weight", "bias"):
        p = params.get(name)
        if p is None and (name == "weight" or getattr(layer, name, None) is not None):
            return (f"its {name} is not a Parameter of the layer (weight_norm or another "
                    f"reparametrization computes it): left as is")
        if p is not None and type(p) is not torch.nn.Parameter:
            return (f"its {name} is a {type(p).__module__}.{type(p).__qualname__}, not a plain "
                    f"torch.nn.Parameter (a quantized wrapper?): left as is")
    extra = [f"parameter {k}" for k in params if k not in ("weight", "bias")]
    extra += [f"buffer {k}" for k in layer._buffers] + [f"submodule {k}" for k in layer._modules]
    if extra:
        return f"it also holds {', '.join(extra)}, which a replacement would drop: left as is"
    for hook in getattr(layer, "_load_state_dict_pre_hooks", {}).values():
        if getattr(hook, "with_module", False):
            return ("it has a load_state_dict pre-hook, which torch binds to the layer itself "
                    "(a replacement would orphan it): left as is")
    return None


def _replacement(layer, strict: bool):
    """(new Linear, note) for a layer patch replaces, else (None, why it is kept)."""
    if isinstance(layer, Linear):
        return None, f"already a tirx_gemm.nn.Linear ({_describe(layer)})"
    why = _not_plain(layer)
    if why is not None:
        return None, f"{_describe(layer)}: {why}"
    if type(layer) is not torch.nn.Linear:
        return None, (f"{type(layer).__module__}.{type(layer).__qualname__} subclasses "
                      f"nn.Linear: its forward may differ, left as is")
    why = layer_refusal(layer)
    if why is not None:
        return None, f"{_describe(layer)}: {why}"
    note = _describe(layer)
    if layer.bias is not None and fuses_bias(layer.weight.device):
        note += "; bias fused into the GEMM's epilogue"
    if layer.weight.requires_grad or (layer.bias is not None and layer.bias.requires_grad):
        note += "; trainable: forward, dgrad and wgrad on the kernels (tirx_gemm.op.autograd)"
    return Linear.from_linear(layer, strict=strict), note

