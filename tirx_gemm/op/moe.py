"""Mixture-of-experts in PyTorch: the op ``torch.ops.tirx_gemm.grouped_mm``, ``Experts`` and
``patch_moe(model)``.

Importing this module registers ``tirx_gemm::grouped_mm(Tensor a, Tensor b, Tensor? offs=None,
Tensor? counts=None, str? layout=None, Tensor? bias=None, Tensor? scale=None, ScalarType?
out_dtype=None, Tensor? scale_a=None, Tensor? scale_b=None) -> Tensor`` with
``torch.library.custom_op``: its implementation is tirx_gemm.op.grouped.grouped_mm
(asynchronous, no host sync; float8_e4m3fn operands with their block scales ``scale_a``,
``scale_b``: op/grouped_fp8.py), its fake implementation returns the empty result after the
checks that need no data (grouped.check_grouped_shapes, grouped_fp8.check_grouped_fp8),
so ``torch.compile(model, fullgraph=True)`` traces a model that calls :func:`grouped_mm`
without a graph break and CUDA graphs capture its launch. As in tirx_gemm.torch_op,
:func:`grouped_mm` calls the op while torch.compile traces and the function directly in eager
mode (the dispatcher costs microseconds a call).

``Experts`` holds E experts' SwiGLU MLPs as stacked weights -- ``gate_up_proj`` (E, 2I, H),
the gate rows then the up rows of each expert, and ``down_proj`` (E, H, I), the layout of
transformers' stacked experts (MixtralExperts, Qwen3MoeExperts) -- and its forward takes what
theirs takes: ``(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k))``. It runs
an MoE MLP as two grouped launches and torch ops, never reading the routing on the host:

1. permute: the T*k (token, slot) pairs sorted by expert (a stable sort), each expert's
   cumulative row end (``offs``, int32) by ``searchsorted`` of 0..E-1 in the sorted ids;
   the rows of the activations gathered in that order (``index_select``);
2. gate/up: ``silu(gate) * up`` of ``rows @ gate_up_proj`` (M = T*k, N = 2I): with the fused
   epilogues on (grouped_epilogue.ENABLED), on sm_90a past decode one launch with SwiGLU in
   v14's epilogue (grouped_swiglu), else ``grouped_mm`` then the SwiGLU in fp32 with torch ops;
3. down: ``grouped_mm(h, down_proj, scale=weights)``, each row times its top-k weight (float32;
   with the fused epilogues on, in the kernel's epilogue before the one rounding);
4. unpermute: the rows scattered back to (token, slot) order and summed over the k slots
   with fp32 accumulation (deterministic, no atomics).

Where the kernels cannot serve a call (CPU tensors, float32, autograd recording, a GPU other
than sm_90a or sm_100a) the forward runs the same steps with torch's grouped_mm
(or a per-expert loop where torch has none for the dtype), counts it in ``fallbacks`` with
the reason in ``fallback_reason`` and warns once per reason; ``strict=True`` raises instead. A
kernel that cannot be had on a GPU that could run it (a bundle without the layer's kernels, no TVM
to build them) is not a fallback: the op's one-line error says what to export
(lab/moe_grouped_gemm/export_bundle.py, or ``tirx-gemm export --suite`` with grouped entries).

``patch_moe(model)`` swaps, in place, every stacked-experts module of a transformers-style MoE
block (Mixtral, Qwen3-MoE: a module with 3-D ``gate_up_proj`` and ``down_proj`` parameters
and a SiLU ``act_fn``) for an ``Experts`` sharing its parameters (no copy; the state_dict
keys stay), all or nothing, and returns a :class:`MoEReport` of what it swapped and what it
kept, with why (a bias, a transposed layout, another activation, a dtype the kernels lack).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from tirx_gemm.op import grouped as G
from tirx_gemm.op import grouped_swiglu as GS

__all__ = ["grouped_mm", "OP", "Experts", "patch_moe", "MoEReport", "permute", "unpermute"]

NAME = "tirx_gemm::grouped_mm"
_DTYPES = (torch.float16, torch.bfloat16)


@torch.library.custom_op(NAME, mutates_args=())
def _op(a: torch.Tensor, b: torch.Tensor, offs: Optional[torch.Tensor] = None,
        counts: Optional[torch.Tensor] = None, layout: Optional[str] = None,
        bias: Optional[torch.Tensor] = None, scale: Optional[torch.Tensor] = None,
        out_dtype: Optional[torch.dtype] = None, scale_a: Optional[torch.Tensor] = None,
        scale_b: Optional[torch.Tensor] = None) -> torch.Tensor:
    fp8 = {} if scale_a is None and scale_b is None else {"scale_a": scale_a, "scale_b": scale_b}
    return _eager(a, b, offs, counts=counts, layout=layout, bias=bias, scale=scale,
                  out_dtype=out_dtype, **fp8)


def _eager(a, b, offs=None, **kw):
    """The eager call (a module-level name, so a test can run the op's plumbing on CPU)."""
    return G.grouped_mm(a, b, offs, **kw)


@_op.register_fake
def _fake(a, b, offs=None, counts=None, layout=None, bias=None, scale=None, out_dtype=None,
          scale_a=None, scale_b=None):
    if scale_a is not None or scale_b is not None or "float8" in str(a.dtype):
        from tirx_gemm.op.grouped_fp8 import check_grouped_fp8
        layout, M, N, _, E, _, odt = check_grouped_fp8(
            a, b, offs, scale_a, scale_b, out_dtype, counts=counts, layout=layout, bias=bias,
            scale=scale, require_cuda=False)
        return a.new_empty((E, M, N) if layout == "masked" else (M, N), dtype=odt)
    p = G.check_grouped_shapes(a, b, offs, counts, layout, bias, scale, out_dtype)
    return a.new_empty(p.out_shape)


OP = torch.ops.tirx_gemm.grouped_mm.default


def grouped_mm(a, b, offs=None, *, counts=None, layout=None, bias=None, scale=None,
               out_dtype=None, scale_a=None, scale_b=None):
    """tirx_gemm.op.grouped.grouped_mm, usable in a model that torch.compile traces: the op
    ``torch.ops.tirx_gemm.grouped_mm`` while tracing, the function directly in eager mode
    (fp8 with ``scale_a``, ``scale_b`` too)."""
    if torch.compiler.is_compiling():
        return OP(a, b, offs, counts, layout, bias, scale, out_dtype, scale_a, scale_b)
    fp8 = {} if scale_a is None and scale_b is None else {"scale_a": scale_a, "scale_b": scale_b}
    return _eager(a, b, offs, counts=counts, layout=layout, bias=bias, scale=scale,
                  out_dtype=out_dtype, **fp8)


# --------------------------------------------------------------------------------------
# permute / unpermute: the routing stays on the GPU
# --------------------------------------------------------------------------------------
def permute(top_k_index, num_experts: int):
    """``(order, offs)`` of a routing (T, k): ``order`` (T*k,) the (token, slot) pairs
    (flattened, token-major) sorted by expert, stably; ``offs`` (E,) int32 the cumulative
    row ends per expert. Torch ops only, no host sync (capturable in a CUDA graph): the
    ids' range is read back on a GPU only with TIRX_GEMM_CHECK=1 (on the CPU, where it
    costs no sync, always); an id outside 0..E-1 would index out of bounds (on a GPU a
    device-side assert)."""
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts={num_experts!r} must be a positive int")
    if not isinstance(top_k_index, torch.Tensor) or top_k_index.dim() != 2 \
            or top_k_index.dtype.is_floating_point or top_k_index.dtype.is_complex \
            or top_k_index.dtype == torch.bool:
        what = (f"{top_k_index.dtype} of shape {tuple(top_k_index.shape)}"
                if isinstance(top_k_index, torch.Tensor) else type(top_k_index).__name__)
        raise TypeError(f"top_k_index must be an integer tensor (tokens, k) of expert ids, "
                        f"got {what}")
    if top_k_index.numel() and not torch.compiler.is_compiling() and (
            not top_k_index.is_cuda or G._checking() and not (
                torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())):
        lo, hi = int(top_k_index.min()), int(top_k_index.max())
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"top_k_index holds expert ids {lo}..{hi}, outside 0.."
                             f"{num_experts - 1} ({num_experts} experts)")
    flat = top_k_index.reshape(-1)
    if flat.dtype not in (torch.int64, torch.int32):  # 0..E-1 must fit the ids' dtype
        flat = flat.long()
    ids, order = torch.sort(flat, stable=True)
    # expert e's cumulative row end: how many sorted ids are <= e (two launches, no counts)
    return order, torch.searchsorted(ids, _expert_ids(num_experts, ids), right=True,
                                     out_int32=True)


_ids: dict = {}


def _expert_ids(num_experts: int, like):
    """0..E-1 in ``like``'s dtype and device, made once per (E, dtype, device) outside a CUDA
    graph capture (a tensor made during one would live in the graph's memory pool)."""
    key = (num_experts, like.dtype, like.device)
    hit = _ids.get(key)
    if hit is None:
        hit = torch.arange(num_experts, dtype=like.dtype, device=like.device)
        if not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
            _ids[key] = hit
    return hit


def unpermute(rows, order, tokens: int, k: int):
    """The (T, H) sum over each token's k slots of ``rows`` (T*k, H), given in ``order``
    (:func:`permute`): scattered back, then summed in fp32 and rounded once (torch's sum of
    a 16-bit tensor accumulates in fp32: two launches, no fp32 copy)."""
    back = torch.empty_like(rows)
    back.index_copy_(0, order, rows)
    return back.view(tokens, k, rows.shape[-1]).sum(1)


def _torch_grouped(a, w_t, offs):
    """torch's grouped_mm (a (M, K), w_t (E, K, N), offs), or a per-expert loop where torch
    has none for these tensors (the loop reads offs on the host)."""
    try:
        return torch._grouped_mm(a, w_t, offs=offs)
    except (RuntimeError, AttributeError, NotImplementedError):
        out = a.new_zeros((a.shape[0], w_t.shape[2]))
        start = 0
        for e, end in enumerate(offs.tolist()):
            if end > start:
                out[start:end] = a[start:end] @ w_t[e]
            start = end
        return out


class Experts(torch.nn.Module):
    """E experts' SwiGLU MLPs over stacked weights, run as two grouped GEMMs (see the module
    docstring): ``forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k))``
    returns (T, H), the sum over each token's k experts of ``weight * down(silu(gate(x)) *
    up(x))``. ``gate_up_proj`` (E, 2I, H) holds each expert's gate rows then its up rows."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 device=None, dtype=None, strict: bool = False):
        super().__init__()
        for name, v in (("num_experts", num_experts), ("hidden_size", hidden_size),
                        ("intermediate_size", intermediate_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive int")
        self.num_experts, self.hidden_dim, self.intermediate_dim = (num_experts, hidden_size,
                                                                    intermediate_size)
        kw = {"device": device, "dtype": dtype}
        self.gate_up_proj = torch.nn.Parameter(torch.empty(num_experts, 2 * intermediate_size,
                                                           hidden_size, **kw))
        self.down_proj = torch.nn.Parameter(torch.empty(num_experts, hidden_size,
                                                        intermediate_size, **kw))
        for w in (self.gate_up_proj, self.down_proj):
            torch.nn.init.normal_(w, std=0.02)
        self.strict = strict
        self.fallbacks = 0
        self.fallback_reason: str | None = None
        self._warned: set = set()

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden={self.hidden_dim}, "
                f"intermediate={self.intermediate_dim}")

    @classmethod
    def from_module(cls, module, *, strict: bool = False) -> "Experts":
        """An Experts sharing ``module``'s ``gate_up_proj`` and ``down_proj`` (the same
        Parameters) and training flag (a transformers stacked-experts module; see
        :func:`experts_refusal` for what it must be)."""
        why = experts_refusal(module)
        if why is not None:
            raise ValueError(f"cannot serve {type(module).__name__}: {why}")
        E, I2, H = module.gate_up_proj.shape
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.num_experts, new.hidden_dim, new.intermediate_dim = E, H, I2 // 2
        new.gate_up_proj = module.gate_up_proj
        new.down_proj = module.down_proj
        new.strict, new.fallbacks, new.fallback_reason, new._warned = strict, 0, None, set()
        new.train(module.training)
        return new

    # -- which path a call takes ---------------------------------------------------------
    def _refusal(self, x) -> str | None:
        """Why the kernels cannot serve this call (one line), or None; cheap checks only."""
        w = self.gate_up_proj
        if w.dtype not in _DTYPES:
            return f"weights are {w.dtype}: the kernels take float16 or bfloat16"
        if x.dtype != w.dtype:
            return f"input is {x.dtype} but the weights are {w.dtype}"
        if not x.is_cuda or x.device != w.device:
            return f"input on {x.device}, weights on {w.device}: the kernels run on a CUDA GPU"
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                        or self.down_proj.requires_grad):
            return ("autograd records this call: run under torch.no_grad() or "
                    "torch.inference_mode() to use tirx_gemm")
        if self.hidden_dim % 8 or self.intermediate_dim % 8:
            return (f"hidden {self.hidden_dim} / intermediate {self.intermediate_dim}: the "
                    f"kernels need multiples of 8")
        if self.num_experts > G.E_MAX:
            return f"{self.num_experts} experts: the kernel takes at most {G.E_MAX}"
        if not torch.compiler.is_compiling():
            from tirx_gemm.op.nn import _device_refusal
            return _device_refusal(x.device)
        return None

    def _check_inputs(self, x, top_k_index, top_k_weights) -> None:
        """The shapes of a call, one line each (no sync): torch's errors from deep inside
        index_select said "index out of range in self" for a mismatched routing."""
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.hidden_dim:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"hidden_states must be (tokens, {self.hidden_dim}), got {got} "
                             f"(flatten the batch: x.reshape(-1, {self.hidden_dim}))")
        for name, t in (("top_k_index", top_k_index), ("top_k_weights", top_k_weights)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != x.shape[0]:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be (tokens, k) with {x.shape[0]} tokens, as "
                                 f"hidden_states has, got {got}")
        if top_k_weights.shape != top_k_index.shape:
            raise ValueError(f"top_k_weights {tuple(top_k_weights.shape)} and top_k_index "
                             f"{tuple(top_k_index.shape)} must have one shape (tokens, k)")

    def _fallback(self, why: str) -> None:
        if self.strict:
            raise ValueError(f"tirx_gemm Experts (strict) cannot serve this call: {why}")
        if torch.compiler.is_compiling():
            return
        self.fallbacks += 1
        self.fallback_reason = why
        if why not in self._warned:
            self._warned.add(why)
            warnings.warn(f"tirx_gemm Experts runs torch for this call: {why}", stacklevel=3)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        x = hidden_states
        self._check_inputs(x, top_k_index, top_k_weights)
        T, k = top_k_index.shape
        why = self._refusal(x)
        if why is not None:
            self._fallback(why)
        order, offs = permute(top_k_index, self.num_experts)
        rows = x.index_select(0, torch.div(order, k, rounding_mode="floor"))
        w_rows = top_k_weights.reshape(-1).index_select(0, order)
        gate_up_t, down_t = self.gate_up_proj.transpose(1, 2), self.down_proj.transpose(1, 2)
        if why is None:
            if torch.compiler.is_compiling():  # the custom op, then SwiGLU with torch ops
                h = G.swiglu_rows(grouped_mm(rows, gate_up_t, offs), interleaved=False)
            else:  # one launch with SwiGLU in v14's epilogue where on and had (grouped_swiglu)
                h = GS.swiglu_mm(rows, gate_up_t, offs, gate_up="halves")
            y = grouped_mm(h, down_t, offs, scale=w_rows.float())  # fused on sm_90a
        else:
            h = _torch_grouped(rows, gate_up_t, offs)
            gate, up = h.chunk(2, dim=-1)
            h = (F.silu(gate.float()) * up.float()).to(h.dtype)
            y = _torch_grouped(h, down_t, offs) * w_rows.to(x.dtype).unsqueeze(-1)
        return unpermute(y, order, T, k)


# --------------------------------------------------------------------------------------
# patch_moe: swap transformers' stacked experts for Experts
# --------------------------------------------------------------------------------------
def _is_silu(act) -> bool:
    """Whether ``act`` computes SiLU (tried on a few values; a transformers ACT2FN entry or
    torch.nn.SiLU)."""
    if act is None or not callable(act):
        return False
    x = torch.linspace(-6.0, 6.0, 25)
    try:
        with torch.no_grad():
            return bool(torch.allclose(act(x), F.silu(x), atol=1e-6))
    except Exception:  # noqa: BLE001 -- anything that does not take a tensor is not SiLU
        return False


def looks_like_experts(module) -> bool:
    """A transformers-style stacked-experts module: 3-D ``gate_up_proj`` and ``down_proj``."""
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (isinstance(gu, torch.nn.Parameter) and isinstance(dn, torch.nn.Parameter)
            and gu.dim() == 3 and dn.dim() == 3 and not isinstance(module, Experts))


def experts_refusal(module) -> str | None:
    """Why ``module`` cannot become an :class:`Experts` (one line), or None."""
    if not looks_like_experts(module):
        return "no 3-D gate_up_proj and down_proj parameters (not stacked experts)"
    gu, dn = module.gate_up_proj, module.down_proj
    E, I2, H = gu.shape
    if getattr(module, "is_transposed", False) or tuple(dn.shape) != (E, H, I2 // 2) or I2 % 2:
        return (f"gate_up_proj {tuple(gu.shape)} and down_proj {tuple(dn.shape)} are not "
                f"(E, 2I, H) and (E, H, I) (a transposed layout)")
    if getattr(module, "has_bias", False) or any(
            n not in ("gate_up_proj", "down_proj") for n, _ in module.named_parameters()):
        return "it has parameters besides gate_up_proj and down_proj (an expert bias)"
    if getattr(module, "has_gate", True) is False or getattr(module, "is_concatenated",
                                                             True) is False:
        return "its gate and up weights are not concatenated in gate_up_proj"
    if not _is_silu(getattr(module, "act_fn", None)):
        return "its act_fn is not SiLU (Experts computes SwiGLU)"
    if gu.dtype != dn.dtype:
        return f"gate_up_proj is {gu.dtype} but down_proj is {dn.dtype}"
    if any(True for _ in module.buffers()) or any(
            n != "act_fn" for n, _ in module.named_children()):
        return "it holds buffers or submodules besides its two weights and act_fn"
    return None


@dataclasses.dataclass
class MoEReport:
    """What :func:`patch_moe` did: the modules swapped and those kept, with why."""
    replaced: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)  # (name, reason)

    def __str__(self) -> str:
        lines = [f"patch_moe: {len(self.replaced)} experts module(s) swapped for "
                 f"tirx_gemm Experts, {len(self.kept)} kept"]
        lines += [f"  swapped {n}" for n in self.replaced]
        lines += [f"  kept {n}: {why}" for n, why in self.kept]
        return "\n".join(lines)


def patch_moe(model: torch.nn.Module, *, strict: bool = False) -> MoEReport:
    """Swap every stacked-experts module of ``model`` (:func:`looks_like_experts`) that
    Experts can serve for one sharing its parameters, in place; all or nothing (every swap
    is built before the first is made). Returns the :class:`MoEReport`."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"patch_moe takes a torch.nn.Module, got {type(model).__name__}")
    report, swaps = MoEReport(), []
    for name, module in model.named_modules():
        if not looks_like_experts(module):
            continue
        why = experts_refusal(module)
        if why is None and module.gate_up_proj.dtype not in _DTYPES:
            why = f"weights are {module.gate_up_proj.dtype}: the kernels take float16 or bfloat16"
        if why is not None:
            report.kept.append((name or type(module).__name__, why))
            continue
        if not name:
            raise ValueError("patch_moe swaps submodules: pass the model that holds the "
                             "experts module, or build tirx_gemm Experts.from_module(module)")
        parent_name, _, attr = name.rpartition(".")
        swaps.append((model.get_submodule(parent_name), attr, name,
                      Experts.from_module(module, strict=strict)))
    done = []
    try:
        for parent, attr, name, new in swaps:
            done.append((parent, attr, getattr(parent, attr)))
            setattr(parent, attr, new)
            report.replaced.append(name)
    except Exception:
        for parent, attr, old in reversed(done):
            setattr(parent, attr, old)
        raise
    return report
