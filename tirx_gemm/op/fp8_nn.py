"""``Fp8Linear`` and ``patch_fp8(model, scale=...)``: e4m3 weights and v13's scaled GEMM in a model.

``Fp8Linear`` holds an e4m3 (``torch.float8_e4m3fn``) weight, N x K as nn.Linear's, with fp32
dequantization scales (real weight = ``weight.float() * scale``), an optional bias, and the
dtype it returns (``out_dtype``: the original layer's, bf16 or fp16). Its scale kind:

* ``"row"``: one scale per output channel (``weight_scale`` (N,)), activations quantized per
  token (one scale per row of x): matmul_fp8's rowwise kind. The layout of Llama/Qwen fp8
  checkpoints with per-channel scales.
* ``"block"``: one scale per 128 x 128 block of the weight (``weight_scale`` (ceil(N/128),
  K/128)), activations per 1 x 128 block of each token: DeepSeek-V3's recipe (its
  ``weight_scale_inv`` is this tensor: it multiplies). K must be a multiple of 128.
* ``"tensor"``: one scale for the weight and one per call for the activations.

Make one with ``Fp8Linear.from_linear(layer, scale="row")`` (quantizes the weight once: amax
/ 448 per group) or ``Fp8Linear.from_checkpoint(weight_fp8, weight_scale, bias=None,
scale=None)`` (the kind read from the scale's shape, or named by ``scale=`` where the shape fits
two kinds; bf16/fp16 scales are widened to fp32 once).

forward(x): the activations are quantized by torch ops (amax per token or per 1x128 block,
scale, cast to e4m3; their time is part of the layer's), then ``tirx_gemm.matmul_fp8``, then
the bias is added. While torch.compile traces, those three steps are one custom op,
``torch.ops.tirx_gemm.fp8_linear`` (a fake implementation gives its shape, so
``fullgraph=True`` holds; CUDA graphs capture both paths): inductor would otherwise fuse the
quantization with the ops before it and skip their bf16 roundings (and the product's before
the e4m3 cast), which moves values across e4m3 steps, so compiled and eager results differed
by about 2% relative. As one op, the layer computes the same thing in both modes. Leading
dimensions are flattened as F.linear does. Where the kernels cannot run
(no sm_90a GPU, grad mode with a bias that requires grad, ...), it computes
``F.linear(x, dequantized weight, bias)`` in x's dtype instead (no activation quantization),
counted in ``fallbacks`` with one warning per reason; ``strict=True`` raises instead.
Accuracy per scale kind against the bf16 layer: lab/fp8_on_hopper.

``patch_fp8(model, scale="row")`` replaces every plain ``torch.nn.Linear`` it can by an
Fp8Linear (all or nothing, as tirx_gemm.patch: op/nn.py's checks and helpers) and returns a
Report. The state_dict of a patched layer holds ``weight`` (e4m3), ``weight_scale`` and
``bias``. Inference only (no backward).
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from tirx_gemm.op import fp8
from tirx_gemm.op import nn as _nn

__all__ = ["Fp8Linear", "patch_fp8", "quantize_activation", "matmul_fp8", "OP", "LAYER_OP",
           "LAYER_SCALES"]

LAYER_SCALES = ("row", "block", "tensor")
E4M3 = torch.float8_e4m3fn
NAME = "tirx_gemm::matmul_fp8"
LAYER_NAME = "tirx_gemm::fp8_linear"


@torch.library.custom_op(NAME, mutates_args=())
def _op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
        out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return fp8.matmul_fp8(a, b, scale_a.contiguous(), scale_b.contiguous(), out_dtype)


@_op.register_fake
def _fake(a, b, scale_a, scale_b, out_dtype=None):
    check_fake(a, b, scale_a, scale_b, out_dtype)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype or torch.bfloat16)


OP = torch.ops.tirx_gemm.matmul_fp8.default


def check_fake(a, b, scale_a, scale_b, out_dtype) -> None:
    """matmul_fp8's checks that need no data (types, dtypes, shapes, scale kind): eager's own
    (fp8.check_fp8_tensors, check_fp8_types, check_fp8_shapes), so a traced call fails where
    an eager one would, with the same one-line message."""
    fp8.check_fp8_tensors(a, b, scale_a, scale_b)
    fp8.check_fp8_types(a, b, scale_a, scale_b, out_dtype or torch.bfloat16)
    fp8.check_fp8_shapes(a, b, scale_a, scale_b)


@torch.library.custom_op(LAYER_NAME, mutates_args=())
def _layer_op(x: torch.Tensor, weight: torch.Tensor, scale_b: torch.Tensor,
              bias: Optional[torch.Tensor], scale: str, out_dtype: torch.dtype) -> torch.Tensor:
    return layer_product(x, weight, scale_b, bias, scale, out_dtype)


@_layer_op.register_fake
def _layer_fake(x, weight, scale_b, bias, scale, out_dtype):
    _check_scale_kind(scale)
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be 2-D bf16, fp16 or fp32 activations, got {x.dtype} "
                         f"{tuple(x.shape)}")
    M, K = x.shape
    if scale == "block" and K % fp8.SCALE_BLOCK:
        raise ValueError(f"K={K} with block scales: {fp8.block_k_rule()}")
    sa = {"row": (M, 1), "block": (M, K // fp8.SCALE_BLOCK), "tensor": (1,)}[scale]
    check_fake(x.new_empty((M, K), dtype=E4M3), weight, x.new_empty(sa, dtype=torch.float32),
               scale_b, out_dtype)
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({weight.shape[0]},)")
    return x.new_empty((M, weight.shape[0]), dtype=out_dtype)


LAYER_OP = torch.ops.tirx_gemm.fp8_linear.default


def layer_product(x2d, weight, scale_b, bias, scale: str, out_dtype):
    """An Fp8Linear's product on 2-D activations: quantize them (quantize_activation), the
    scaled GEMM, the bias. The custom op LAYER_OP runs exactly this, so compiled and eager
    layers compute the same thing."""
    qa, sa = quantize_activation(x2d, scale)
    y = fp8.matmul_fp8(qa, weight, sa, scale_b, out_dtype)
    return y if bias is None else y + bias


def matmul_fp8(a, b, scale_a, scale_b, out_dtype=None):
    """fp8.matmul_fp8 usable in code torch.compile traces: the custom op while tracing, the
    direct call (no dispatcher) in eager mode."""
    if torch.compiler.is_compiling():
        return OP(a, b, scale_a, scale_b, out_dtype)
    return fp8.matmul_fp8(a, b, scale_a, scale_b, out_dtype)


def quantize_activation(x2d, scale: str):
    """(x_q e4m3, scale_a fp32) of a 2-D activation for a layer of scale kind ``scale``:
    per token ((M, 1), "row"), per 1x128 block ((M, K/128), "block") or per tensor ((1,),
    "tensor"); scale = amax / 448 (1 for an all-zero group). Torch ops only (traceable), few
    passes over x: the amax as one max-norm reduction (no abs copy), then x times the
    scale's reciprocal in x's dtype (bf16 keeps fp32's range; fp16 and fp32 multiply in fp32)
    and the cast to e4m3. The reciprocal's rounding to bf16 moves a group's effective scale by
    at most 2**-9, far inside e4m3's step, and keeps |x| / scale at most 448.9 < 464, which
    rounds to e4m3's 448."""
    _check_scale_kind(scale)  # any other word quantized per tensor without a word
    if not isinstance(x2d, torch.Tensor) or x2d.dim() != 2:
        got = tuple(x2d.shape) if isinstance(x2d, torch.Tensor) else type(x2d).__name__
        raise ValueError(f"x2d must be a 2-D tensor (tokens x features), got {got}: flatten "
                         f"it with x.reshape(-1, x.shape[-1])")
    M, K = x2d.shape
    if scale == "block" and K % fp8.SCALE_BLOCK:
        raise ValueError(f"K={K} with block scales: {fp8.block_k_rule()}")
    inf = float("inf")
    if scale == "block":
        x3 = x2d.reshape(M, K // fp8.SCALE_BLOCK, fp8.SCALE_BLOCK)
        amax = torch.linalg.vector_norm(x3, inf, dim=2, dtype=torch.float32)
    elif scale == "row":
        amax = torch.linalg.vector_norm(x2d, inf, dim=1, keepdim=True, dtype=torch.float32)
    else:
        amax = torch.linalg.vector_norm(x2d, inf, dtype=torch.float32).reshape(1)
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    work = x2d.dtype if x2d.dtype == torch.bfloat16 else torch.float32
    inv = (1.0 / s).to(work)
    if scale == "block":
        q = (x3.to(work) * inv.unsqueeze(2)).reshape(M, K).to(E4M3)
    else:
        q = (x2d.to(work) * inv).to(E4M3)
    return q, s


def _check_scale_kind(scale) -> str:
    if scale not in LAYER_SCALES:
        raise ValueError(f"scale={scale!r}: an Fp8Linear's scale kind is one of "
                         f"{', '.join(map(repr, LAYER_SCALES))} (per output channel + per "
                         f"token; 128x128 blocks + 1x128; per tensor)")
    return scale


def _kernel_scale(weight_scale, scale: str):
    """The layer's weight_scale as matmul_fp8's scale_b: (1, N) rowwise, (1,) per tensor,
    block unchanged."""
    if scale == "row":
        return weight_scale.reshape(1, -1)
    if scale == "tensor":
        return weight_scale.reshape(1)
    return weight_scale


class Fp8Linear(torch.nn.Module):
    """An inference Linear with an e4m3 weight and fp32 scales (module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 scale: str = "row", out_dtype=torch.bfloat16, device=None,
                 strict: bool = False):
        super().__init__()
        self.scale = _check_scale_kind(scale)
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"out_dtype={out_dtype!r}: an Fp8Linear returns torch.bfloat16 or "
                            f"torch.float16")
        _check_features(in_features, out_features, scale)
        self.in_features, self.out_features = in_features, out_features
        self.out_dtype, self.strict = out_dtype, strict
        self.fallbacks, self.fallback_reason = 0, None
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=E4M3,
                                                   device=device))
        nb = -(-out_features // fp8.SCALE_BLOCK)
        shape = {"row": (out_features,), "tensor": (),
                 "block": (nb, in_features // fp8.SCALE_BLOCK)}[scale]
        self.register_buffer("weight_scale", torch.ones(shape, dtype=torch.float32,
                                                        device=device))
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=out_dtype,
                                                   device=device),
                                       requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, scale: str = "row", *,
                    strict: bool = False) -> "Fp8Linear":
        """Quantize ``layer``'s weight once (amax / 448 per output channel, per 128x128
        block or for the tensor); the bias is kept (the same tensor, detached from grad);
        out_dtype is the weight's dtype (bf16 or fp16; fp32 layers return bf16)."""
        _check_scale_kind(scale)
        if not isinstance(layer, torch.nn.Linear):
            raise TypeError(f"from_linear takes a torch.nn.Linear, got {type(layer).__name__}")
        w = layer.weight.detach()
        odt = w.dtype if w.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        new = cls(layer.in_features, layer.out_features, bias=layer.bias is not None,
                  scale=scale, out_dtype=odt, device="meta", strict=strict)
        qw, sw = fp8.quantize(w, scale, "b")
        new.weight = qw
        new.weight_scale = sw.reshape(-1 if scale == "row" else ()) if scale != "block" else sw
        if layer.bias is not None:
            new.bias = torch.nn.Parameter(layer.bias.detach().to(odt), requires_grad=False)
        new.train(layer.training)
        return new

    @classmethod
    def from_checkpoint(cls, weight_fp8, weight_scale, bias=None, *, scale=None,
                        out_dtype=torch.bfloat16, strict: bool = False) -> "Fp8Linear":
        """From an fp8 checkpoint's tensors: ``weight_fp8`` (N, K) float8_e4m3fn and its
        dequantization ``weight_scale``: one element per tensor, (N,), (N, 1) or (1, N) per
        channel, (ceil(N/128), K/128) per 128x128 block. ``scale`` ("tensor", "row" or
        "block", as from_linear's) names the kind; None reads it from the shape, and a shape
        that fits two kinds ((1, N) is also the block shape where N <= 128 and K/128 = N) is
        refused: pass scale=. One-line errors otherwise."""
        if not isinstance(weight_fp8, torch.Tensor) or not isinstance(weight_scale,
                                                                      torch.Tensor):
            raise TypeError("weight_fp8 and weight_scale must be torch.Tensors")
        if weight_fp8.dtype != E4M3:
            hint = (" (only e4m3 kernels are built: requantize e5m2 to e4m3)"
                    if "e5m2" in str(weight_fp8.dtype) else "")
            raise TypeError(f"weight_fp8 has dtype {weight_fp8.dtype}: expected "
                            f"torch.float8_e4m3fn{hint}")
        if weight_fp8.dim() != 2:
            raise ValueError(f"weight_fp8 must be 2-D (out, in), got {tuple(weight_fp8.shape)}")
        if not weight_scale.is_floating_point() or weight_scale.dtype == E4M3:
            raise TypeError(f"weight_scale has dtype {weight_scale.dtype}: expected float32 "
                            f"(bfloat16/float16 are widened)")
        N, K = weight_fp8.shape
        scale, ws = _checkpoint_scale_kind(weight_scale, N, K, scale)
        new = cls(K, N, bias=bias is not None, scale=scale, out_dtype=out_dtype,
                  device="meta", strict=strict)
        new.weight = weight_fp8.contiguous()
        new.weight_scale = ws.float().contiguous()
        # once per layer at load (one read-back, not per call): a NaN, infinite, zero or
        # negative scale makes every output of the layer NaN or 0
        bad = ~(torch.isfinite(new.weight_scale) & (new.weight_scale > 0))
        if not new.weight_scale.is_meta and bool(bad.any()):
            i = int(bad.reshape(-1).nonzero()[0])
            raise ValueError(f"weight_scale holds {float(new.weight_scale.reshape(-1)[i])!r} "
                             f"at flat index {i}: a checkpoint's dequantization scales are "
                             f"finite and > 0 (a damaged or mis-mapped tensor?)")
        if bias is not None:
            if tuple(bias.shape) != (N,):
                raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({N},)")
            new.bias = torch.nn.Parameter(bias.detach().to(out_dtype), requires_grad=False)
        return new

    def dequantized_weight(self, dtype=torch.float32):
        """weight * its scales, (N, K) in ``dtype``."""
        return fp8.dequantize(self.weight, _kernel_scale(self.weight_scale, self.scale),
                              self.scale, "b").to(dtype)

    def _refusal(self, x) -> str | None:
        if not isinstance(x, torch.Tensor):
            return f"input is a {type(x).__name__}, not a tensor"
        if x.shape[-1] != self.in_features:
            return f"input has {x.shape[-1]} features, the layer {self.in_features}"
        if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            return f"input is {x.dtype}: the layer quantizes bf16, fp16 or fp32 activations"
        if x.device != self.weight.device:
            return f"input is on {x.device}, the weight on {self.weight.device}"
        if torch.is_grad_enabled() and x.requires_grad:
            return "autograd records this call (input requires grad): Fp8Linear has no backward"
        why = _fp8_device_refusal(x.device)
        return why

    def forward(self, x):
        if torch.compiler.is_compiling():
            return self._gemm(x)
        why = self._refusal(x)
        if why is not None:
            return self._fallback(x, why)
        return self._gemm(x)

    def _gemm(self, x):
        args = (x.reshape(-1, self.in_features), self.weight,
                _kernel_scale(self.weight_scale, self.scale), self.bias, self.scale,
                self.out_dtype)
        y = LAYER_OP(*args) if torch.compiler.is_compiling() else layer_product(*args)
        return y.view(*x.shape[:-1], self.out_features)

    def _fallback(self, x, why: str):
        if self.strict:
            raise ValueError(f"tirx_gemm Fp8Linear({self.in_features}, {self.out_features}) "
                             f"cannot run this call: {why}")
        self.fallbacks += 1
        self.fallback_reason = why
        warnings.warn(f"tirx_gemm Fp8Linear ran F.linear with the dequantized weight: {why} "
                      f"(counted in the layer's .fallbacks)", RuntimeWarning, stacklevel=2)
        dt = x.dtype if isinstance(x, torch.Tensor) and x.is_floating_point() else self.out_dtype
        b = None if self.bias is None else self.bias.to(dt)
        return F.linear(x, self.dequantized_weight(dt), b)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, scale={self.scale!r}, "
                f"out_dtype={self.out_dtype}" + (", strict=True" if self.strict else ""))


def _checkpoint_scale_kind(weight_scale, N: int, K: int, scale):
    """(scale kind, weight_scale reshaped for it) of a checkpoint's scale for an N x K weight:
    the kind ``scale`` names, or with None the one kind its shape fits. A one-element scale is
    one scale for the whole weight whichever kind it also fits (per tensor); a (1, N) scale
    that is also the block shape means two different weights, so None refuses it."""
    if scale is not None:
        _check_scale_kind(scale)
    ss = tuple(weight_scale.shape)
    nb, kb = -(-N // fp8.SCALE_BLOCK), -(-K // fp8.SCALE_BLOCK)
    fits = [kind for kind, ok in (("tensor", weight_scale.numel() == 1 and len(ss) <= 2),
                                  ("row", ss in ((N,), (N, 1), (1, N))),
                                  ("block", ss == (nb, kb))) if ok]
    if scale is None and len(fits) > 1 and "tensor" not in fits:
        raise ValueError(f"weight_scale has shape {ss}, which fits both {fits[0]!r} and "
                         f"{fits[1]!r} scales of a {N}x{K} weight: pass scale={fits[0]!r} "
                         f"or scale={fits[1]!r} to from_checkpoint")
    if scale is None and not fits:
        raise ValueError(f"weight_scale has shape {ss}, which fits no scale kind of a "
                         f"{N}x{K} weight: () per tensor, ({N},) or ({N}, 1) per channel, "
                         f"({nb}, {kb}) per 128x128 block")
    if scale is not None and scale not in fits:
        want = {"tensor": "one element", "row": f"({N},), ({N}, 1) or (1, {N})",
                "block": f"({nb}, {kb})"}[scale]
        fix = (f"pass {' or '.join(f'scale={k!r}' for k in fits)}, which its shape fits"
               if fits else "check that this scale tensor belongs to this weight")
        raise ValueError(f"weight_scale has shape {ss}, but a {scale!r} scale of a {N}x{K} "
                         f"weight is {want}: {fix}")
    scale = scale or fits[0]
    if scale == "tensor":
        return scale, weight_scale.reshape(())
    return scale, weight_scale.reshape(N) if scale == "row" else weight_scale


def _check_features(K: int, N: int, scale: str) -> None:
    why = _feature_refusal(K, N, scale)
    if why:
        raise ValueError(why)


def _feature_refusal(K: int, N: int, scale: str) -> str | None:
    for name, v in (("in_features", K), ("out_features", N)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"{name}={v!r} must be a positive int"
    if K % fp8.K_MULTIPLE:
        return (f"in_features={K} is not a multiple of {fp8.K_MULTIPLE} (16-byte rows of "
                f"e4m3)")
    if N % fp8.N_MULTIPLE:
        return f"out_features={N} is not a multiple of {fp8.N_MULTIPLE} (16-byte output rows)"
    if scale == "block" and K % fp8.SCALE_BLOCK:
        return f"in_features={K} with block scales: {fp8.block_k_rule()}"
    return None


_served: dict = {}


def _fp8_device_refusal(device) -> str | None:
    """None when matmul_fp8 runs on ``device`` (an sm_90a GPU), else why not; probed once."""
    if device.type != "cuda":
        return f"on {device}, not a CUDA GPU (matmul_fp8 runs on sm_90a)"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _served:
        cap = tuple(torch.cuda.get_device_capability(index))
        _served[index] = None if cap == (9, 0) else (
            f"on a GPU of compute capability {cap[0]}.{cap[1]}: matmul_fp8 runs on sm_90a (9.0)")
    return _served[index]


def _replacement(layer, scale: str, strict: bool):
    """(Fp8Linear, note) or (None, why the layer is kept)."""
    if isinstance(layer, Fp8Linear):
        return None, "already an Fp8Linear"
    why = _nn._not_plain(layer)
    if why is None and type(layer) is not torch.nn.Linear:
        why = (f"{type(layer).__module__}.{type(layer).__qualname__} subclasses nn.Linear: its "
               f"forward may differ, left as is")
    if why is None and layer.weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        why = f"weight is {layer.weight.dtype}: Fp8Linear quantizes bf16, fp16 or fp32 weights"
    why = why or _feature_refusal(layer.in_features, layer.out_features, scale)
    why = why or _fp8_device_refusal(layer.weight.device)
    if why is not None:
        return None, f"{_nn._describe(layer)}: {why}"
    new = Fp8Linear.from_linear(layer, scale, strict=strict)
    for hooks in _nn._HOOK_DICTS:  # hooks move with the layer, as tirx_gemm.patch does
        if hasattr(layer, hooks):
            object.__setattr__(new, hooks, getattr(layer, hooks))
    return new, f"{_nn._describe(layer)} -> e4m3, {scale} scales"


def patch_fp8(module: torch.nn.Module, scale: str = "row", *, strict: bool = False,
              verbose: bool = False) -> "_nn.Report":
    """Replace every plain torch.nn.Linear of ``module`` that matmul_fp8 can serve by an
    :class:`Fp8Linear` of scale kind ``scale`` (its weight quantized once); all or nothing:
    every replacement is built before the first is put in place. Returns a Report."""
    _check_scale_kind(scale)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"patch_fp8 takes a torch.nn.Module, got {type(module).__name__}")
    return _nn.walk(module, lambda m: isinstance(m, (torch.nn.Linear, Fp8Linear)),
                    lambda m: _replacement(m, scale, strict), verbose)


_nn.EXTENSIONS["fp8"] = patch_fp8  # tirx_gemm.patch(model, fp8=...) calls it
