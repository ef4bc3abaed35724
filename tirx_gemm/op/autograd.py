"""Autograd for ``torch.ops.tirx_gemm.matmul`` and ``torch.ops.tirx_gemm.swiglu``: the backward pass
on the steps' kernels.

Importing this module registers, by op name (``torch_op.register_autograd``), a backward
for the two custom ops of tirx_gemm.op.torch_op, and gives :func:`matmul` and :func:`linear`:
the differentiable calls a training model makes (they go through the op when autograd records
the call, and straight to the kernel otherwise, as torch_op.matmul does).

For ``y = act(a @ b.T + bias)`` (a: M x K tokens x in-features, b: N x K, a Linear weight) and
the incoming gradient ``dy`` (M x N), with ``dz = dy * act'(z)``:

* **dgrad** ``da = dz @ b`` (M x K) runs as ``matmul(dz, b.T)``;
* **wgrad** ``db = dz.T @ a`` (N x K) runs as ``matmul(dz.T, a.T)``: its reduction dimension is
  the token count M, accumulated in fp32 by the kernel (a split over tokens, where the chooser
  picks v11, reduces in a fixed order: no atomics, the same bits on every run);
* **bias** ``dbias = dz.sum(0)`` (torch's reduction, fp32 accumulation, deterministic); with
  tirx_gemm.op.wgrad_dbias.ENABLED (off by default), where wgrad runs in place on v15, from wgrad's
  own kernel (a row-sum wgmma beside the product: no pass over dz, every path); else with
  tirx_gemm.op.act_grad.DBIAS on (off by default), where the fused activation gradient runs, the
  sum of that kernel's 16-row column sums (no pass over dz).

**Layouts: read in place by v15 (the default on sm_90a), or by copy.** matmul's kernels read
K-major operands only (each row of A and B contiguous along the reduction dimension).
``b.T`` for dgrad, ``dz.T`` and ``a.T`` for wgrad are not. On sm_90a (:data:`LAYOUT_STEP` =
"v15", the default) dgrad and wgrad run on the operand-layout step, which reads ``b``, ``dz``
and ``a`` as they are (MN-major operands: steps/sm90a/hgemm_v15.py): no copy and no padding
(a partial last K step is zero-filled by TMA). Why the default, per GEMM: a layout copy
costs more than v15's gap to v12 in every measured case, for dgrad too, where only the
weight (N x K) is copied -- torch's transposing copy runs far below the HBM bandwidth
(``lab/training_backward/`` has the H200 figures: block, per GEMM, and the copies' share).
v15 is built for the backward with :data:`LAYOUT_TUNE` (one CTA per tile instead of v9's
pair, and PDL), and wgrad with the token count at run time (RUNTIME_K: one kernel per layer,
not per token count; faster on the H200, slower on the H100, kept for the one kernel), dgrad
with K fixed (DGRAD_RUNTIME_K off: slower with it on the H100). The copy path
(:func:`set_layout_step` (None); elsewhere than sm_90a; an operand v15 cannot read as it
lies: not contiguous, misaligned, an MN-major row count not a multiple of 8) makes each
operand K-major with one
``.t().contiguous()``, wgrad's reduction dimension (the token count) padded with zero columns
to a multiple of 8 in the same copy (TMA's 16-byte rows): 2*(N*K + M*N + M*K) bytes more than
the GEMMs read (2-byte dtypes). v15 has no fp32 output, so a ``main_grad`` wgrad keeps the
copy path (dgrad stays on v15).
``tirx_gemm.matmul(a, b)`` runs the same kernels for any caller whose a or b is a transposed
view (NT, TN, TT; tirx_gemm.op.layouts), and a compiled training step keeps them (the traced
backward calls them through the op ``torch.ops.tirx_gemm.layout_mm``, defined here).

**Fused epilogues.** With ``activation`` (gelu, gelu_tanh, silu) on sm_90a the recorded forward
keeps the pre-activation ``z = a @ b.T + bias``: one kernel writes ``y = act(z)`` and ``z``
(tirx_gemm.op.act_save; **z costs one M x N tensor in the operands' dtype, as torch's Linear +
activation keeps**) and the backward forms ``dz = dy * act'(z)`` elementwise (torch's own
activation backward), then dgrad and wgrad as below; a compiled training step keeps it too (the
op traces with its fake kernel and backward). Where that kernel is not found (a bundle
without it), or with an fp32 output or a forced step, the backward recomputes ``z``: on
sm_90a one kernel does that and forms ``dz`` in its epilogue, stored in the operands' dtype
(tirx_gemm.op.act_grad: dy and bias in the operands' dtype); elsewhere the GEMM writes ``z``
in fp32 (bias fused) and torch forms ``dz``. relu needs no GEMM: its mask is ``y > 0``. SwiGLU forms the
interleaved ``dz`` of the fused weight (tirx_gemm.epilogue's groups of 8 rows) the same way:
in the fused gate/up GEMM's epilogue on sm_90a, else from that GEMM in fp32 and torch; so the
gradient of ``fused`` comes out in the fused layout (unfuse it with ``w.view(N // 8, 2, 8,
K)``). ``out_dtype=torch.float32``: the fp32 ``dy`` is rounded to the
operands' dtype before the GEMMs (their inputs are 16-bit).

**The ``main_grad`` pattern.** A weight (or bias) with an attribute ``main_grad`` (an fp32
tensor of its shape on its device, e.g. a distributed optimizer's gradient buffer) gets its
gradient computed with an fp32 output and added in place into ``main_grad``
(``main_grad += dz.T @ a``, in the order of the backward calls); the op then returns no
gradient for it (``.grad`` stays None), as Megatron-style gradient accumulation fusion does.
On sm_100a, where matmul has no fp32-output kernels yet, the product is rounded to the
operands' dtype before the add. Eager only: a traced backward cannot see the attribute, so
under torch.compile a ``main_grad`` is refused in one line (fullgraph) or its call runs eagerly
(a graph break), never passed over.

Refused, one line each: double backward (``create_graph=True``: the backward is not itself
differentiable; use torch.nn.functional.linear for higher-order gradients), float8 operands
that require grad (v13's e4m3 GEMM has no backward: quantize a detached copy and keep the
16-bit master weight for training), a ``main_grad`` that is not fp32 or not of the weight's
shape and device.

Which kernels: :data:`BACKWARD_STEP` (None: the chooser's pick for each backward GEMM, as
for a forward call; "v12" on sm_90a: the tile menu built with N and K at run time, one kernel
per tile serves every layer and token count, what the bundled GPU tests use).
"""

from __future__ import annotations

import math

import torch

from tirx_gemm import epilogue as E
from tirx_gemm.op import act_grad as _AG
from tirx_gemm.op import act_save as _AS
from tirx_gemm.op import wgrad_dbias as _WD
from tirx_gemm.op import torch_op
from tirx_gemm.op.keywords import ROW_MULTIPLE

__all__ = ["matmul", "linear", "swiglu", "BACKWARD_STEP", "set_backward_step", "LAYOUT_STEP",
           "LAYOUT_TUNE", "WGRAD_RUNTIME_K", "DGRAD_RUNTIME_K", "set_layout_step",
           "layout_kwargs", "layout_shape",
           "check_trainable", "layout_copy_bytes"]

BACKWARD_STEP: str | None = None  # the step of the backward GEMMs (None: choose's pick)
LAYOUT_STEP: str | None = "v15"  # sm_90a: dgrad and wgrad read transposed operands in place
# v15's builds and kernels (LAYOUT_TUNE, WGRAD_RUNTIME_K, layout_kwargs, layout_shape, the
# kernel cache) live in tirx_gemm.op.layouts, which tirx_gemm.matmul's transposed calls share
from tirx_gemm.op.layouts import (DGRAD_RUNTIME_K, LAYOUT_TUNE, WGRAD_RUNTIME_K,  # noqa: E402,F401
                                  _layout_kernels, _tune, layout_kwargs, layout_shape)
_STEP_ARCHES = {"v12": "sm_90a"}  # a forced step, on the arch that has it
_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                         "float8_e5m2fnuz") if hasattr(torch, n))


def set_backward_step(step: str | None) -> None:
    """The step of every backward GEMM from now on: None (choose's pick) or "v12" (sm_90a's
    tile menu with N and K at run time; elsewhere choose's pick)."""
    global BACKWARD_STEP
    if step is not None and step not in _STEP_ARCHES:
        raise ValueError(f"backward step {step!r}: None (the chooser's pick) or one of "
                         f"{', '.join(_STEP_ARCHES)}")
    BACKWARD_STEP = step


def set_layout_step(step: str | None) -> None:
    """"v15" (the default: on sm_90a transposed operands are read in place by the
    operand-layout step; elsewhere the copies) or None (the layout copies everywhere)."""
    global LAYOUT_STEP
    if step not in (None, "v15"):
        raise ValueError(f"layout step {step!r}: None (copies) or 'v15'")
    LAYOUT_STEP = step


def _layout_kernel(dtype, rows_a: int, rows_b: int, red: int, a_mn: bool, b_mn: bool, device,
                   tune: dict | None = None):
    """v15's kernel for D (rows_a x rows_b) = A @ B.T over ``red``, each operand K- or
    MN-major, as tirx_gemm.matmul loads it (matmul.v15_kernel: one cache for both)."""
    from tirx_gemm.op import matmul as MM
    return MM.v15_kernel(dtype, rows_a, rows_b, red, a_mn, b_mn, device, tune)


def _layout_readable(t) -> bool:
    """Whether v15 reads ``t`` (an operand as stored, 2-D) in place: contiguous, 16-byte
    aligned, rows of a multiple of 8 elements (TMA's 16-byte row rule: an MN-major operand's
    rows are its M or N extent, a K-major one's K, checked here for a RUNTIME_K build)."""
    return t.is_contiguous() and t.shape[-1] % ROW_MULTIPLE == 0 and (
        _traced(t) or t.data_ptr() % 16 == 0)  # traced: no data pointer


def _traced(t) -> bool:
    """Whether ``t`` is being traced (torch.compile, AOTAutograd's fake tensors): no data."""
    if torch.compiler.is_compiling():
        return True
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


def _gemm_layout(a_store, a_mn: bool, b_store, b_mn: bool, tune: dict | None = None):
    """``A @ B.T`` on v15 with A, B given as stored: a K-major operand as (rows, red), an
    MN-major one as (red, rows) (the tensor whose transpose the GEMM reads); ``tune``:
    layout_kwargs'."""
    rows_a, red = (a_store.shape[1], a_store.shape[0]) if a_mn else a_store.shape
    rows_b = b_store.shape[1] if b_mn else b_store.shape[0]
    for name, t in (("a", a_store), ("b", b_store)):
        if not _layout_readable(t):
            raise ValueError(f"v15's {name} ({tuple(t.shape)}, strides {t.stride()}) must be "
                             f"contiguous, 16-byte aligned and have rows of a multiple of "
                             f"{ROW_MULTIPLE} elements: use the layout copies "
                             f"(set_layout_step(None))")
    kernel = _layout_kernel(a_store.dtype, rows_a, rows_b, red, a_mn, b_mn, a_store.device,
                            tune)
    out = a_store.new_empty((rows_a, rows_b))
    kernel(a_store, b_store, out)
    return out


def _layout_in_place(device) -> bool:
    return LAYOUT_STEP == "v15" and _arch(device) == "sm_90a"


@torch.compiler.assume_constant_result  # dynamo asks the GPU once while tracing
def _arch(device) -> str | None:
    if device.type != "cuda":
        return None
    from tirx_gemm.op.operands import _gpu_arch
    return _gpu_arch(device)[0]


def _step(device) -> str | None:
    if BACKWARD_STEP is None:
        return None
    return BACKWARD_STEP if _arch(device) == _STEP_ARCHES[BACKWARD_STEP] else None


def _fp32_out(device) -> bool:
    """Whether matmul can write an fp32 product on ``device`` (v12's OUT_DTYPE, sm_90a; the
    CPU reference kernel of the tests takes it too)."""
    return device.type != "cuda" or _arch(device) == "sm_90a"


def _gemm(x, w, out_dtype=None, bias=None):
    """``x @ w.T`` on the kernels (x, w K-major), fp32 out where asked and possible."""
    if out_dtype is torch.float32 and not _fp32_out(x.device):
        out_dtype = None
    return torch_op.OP(x, w, _step(x.device), bias, None, out_dtype)


def _k_major_t(x, pad_rows_to: int = 1):
    """``x.T`` (R x C -> C x R) as a new K-major (contiguous) tensor, its R columns padded
    with zeros to a multiple of ``pad_rows_to``: the layout copy of the module docstring."""
    R, C = x.shape
    Rp = -(-R // pad_rows_to) * pad_rows_to
    if Rp == R:
        return x.t().contiguous()
    out = x.new_empty((C, Rp))
    out[:, R:].zero_()
    out[:, :R].copy_(x.t())
    return out


def layout_copy_bytes(M: int, N: int, K: int, elem_bytes: int = 2) -> int:
    """Bytes the layout copies of one backward of an M x N x K layer read and write:
    b.T (N*K), dz.T (M*N) and a.T (M*K, tokens padded to a multiple of 8), each read and
    written once."""
    Mp = -(-M // ROW_MULTIPLE) * ROW_MULTIPLE
    return 2 * elem_bytes * (N * K + Mp * N + Mp * K)


def _main_grad(p):
    """``p.main_grad`` when ``p`` has one (checked: fp32, p's shape and device), else None."""
    mg = getattr(p, "main_grad", None) if p is not None else None
    if mg is None:
        return None
    if not isinstance(mg, torch.Tensor) or mg.dtype != torch.float32 \
            or mg.shape != p.shape or mg.device != p.device:
        what = (f"{mg.dtype} {tuple(mg.shape)} on {mg.device}" if isinstance(mg, torch.Tensor)
                else type(mg).__name__)
        raise ValueError(f"main_grad is {what}: the gradient buffer must be a float32 tensor "
                         f"of the parameter's shape {tuple(p.shape)} on {p.device}")
    return mg


def _act_grad(act: str, z):
    """act'(z) in fp32 for tirx_gemm.epilogue's activations (z fp32)."""
    if act == "relu":
        return (z > 0).to(z.dtype)
    if act == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(z * (1.0 / math.sqrt(2.0))))
        return cdf + z * torch.exp(-0.5 * z * z) * (1.0 / math.sqrt(2.0 * math.pi))
    if act == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        t = torch.tanh(c * (z + 0.044715 * z ** 3))
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * z * z)
    if act == "silu":
        s = torch.sigmoid(z)
        return s * (1.0 + z * (1.0 - s))
    raise ValueError(f"activation {act!r} has no gradient here: one of {E.ACTIVATIONS}")


def _no_double_backward(what: str) -> None:
    if torch.is_grad_enabled():
        raise RuntimeError(f"{what} has no double backward (create_graph=True or a gradient "
                           f"of a gradient): its backward is not differentiable; use "
                           f"torch.nn.functional.linear where higher-order gradients are needed")


def _in_place(a_store, a_mn: bool, b_store, b_mn: bool):
    """v15 on the stored operands: the kernel directly, or the op :data:`LAYOUT_OP` while
    torch.compile traces the backward (fake tensors: a graph node, not a launch)."""
    if _traced(a_store):
        return LAYOUT_OP(a_store, b_store, a_mn, b_mn)
    return _gemm_layout(a_store, a_mn, b_store, b_mn)


def _dgrad(dz, b):
    """dz @ b (M x K): b read MN-major in place by v15, or from a K-major copy of b.T."""
    if dz.shape[0] and _layout_in_place(dz.device) and _layout_readable(b) \
            and _layout_readable(dz):
        return _in_place(dz, False, b, True)
    return _gemm(dz, _k_major_t(b))


def _weight_grads(dz, a, b, bias, needs_b: bool, needs_bias: bool, dbias_parts=None):
    """(db, dbias) from dz (M x N, a's dtype, contiguous): wgrad on the kernels, fp32
    accumulation over the tokens, into ``main_grad`` in place where the parameter has one.
    ``dbias_parts``: fp32 column sums of dz's row blocks (act_grad.dz_dbias), summed for the
    bias gradient instead of dz itself; without them, where wgrad_dbias applies, the bias
    gradient comes from wgrad's kernel."""
    db = dbias = g = None
    if needs_b:
        mg = _main_grad(b)
        if dz.shape[0] == 0:
            db = None if mg is not None else torch.zeros_like(b)
        elif mg is None and _layout_in_place(dz.device) and _layout_readable(dz) \
                and _layout_readable(a):
            if needs_bias and dbias_parts is None and _WD.applies(dz, a, _arch(dz.device), False):
                db, g = _WD.wgrad_dbias(dz, a, _traced(dz))  # dz.T @ a and dz.sum(0), one kernel
            else:
                db = _in_place(dz, True, a, True)  # dz.T @ a, both read transposed
        else:
            dzt = _k_major_t(dz, ROW_MULTIPLE)   # N x Mp
            at = _k_major_t(a, ROW_MULTIPLE)     # K x Mp
            if mg is not None:
                mg.add_(_gemm(dzt, at, torch.float32))
            else:
                db = _gemm(dzt, at)
    if needs_bias:
        mg = _main_grad(bias)
        if g is None:
            g = dz.sum(0, dtype=torch.float32) if dbias_parts is None else dbias_parts.sum(0)
        if mg is not None:
            mg.add_(g)
        else:
            dbias = g.to(bias.dtype)
    return db, dbias


# --------------------------------------------------------------------------------------
# tirx_gemm::matmul(a, b, step, bias, activation, out_dtype)
# --------------------------------------------------------------------------------------
def _setup_matmul(ctx, inputs, output):
    a, b, _step_arg, bias, activation, out_dtype = inputs
    ctx.activation = activation
    ctx.needs = (a.requires_grad, b.requires_grad, bias is not None and bias.requires_grad)
    ctx.save_for_backward(a, b, bias, output if activation == "relu" else None)


def act_dz_unfused(a, b, dy, bias, act):
    """dz = dy * act'(a @ b.T + bias) without the fused kernel: the GEMM writes z in fp32, torch
    forms act'(z) and the product (a's dtype)."""
    z = _gemm(a, b, torch.float32, bias) if a.shape[0] else dy.float()
    return (dy.float() * _act_grad(act, z)).to(a.dtype)


def swiglu_dz_unfused(a, fused, dy):
    """SwiGLU's interleaved dz (M x 2N, a's dtype) without the fused kernel: the fused
    gate/up GEMM in fp32, then torch."""
    M, N = dy.shape
    G = E.SWIGLU_GROUP
    if M:
        acc = _gemm(a, fused, torch.float32).view(M, N // G, 2, G)  # interleaved gate/up
    else:
        acc = dy.new_zeros((0, N // G, 2, G), dtype=torch.float32)
    g, u = acc[:, :, 0], acc[:, :, 1]
    s = torch.sigmoid(g)
    d = dy.float().view(M, N // G, G)
    dg = d * u * s * (1.0 + g * (1.0 - s))
    du = d * g * s
    return torch.stack((dg, du), dim=2).reshape(M, 2 * N).to(a.dtype)


def _backward_matmul(ctx, dy):
    _no_double_backward("tirx_gemm.matmul")
    a, b, bias, y = ctx.saved_tensors
    needs_a, needs_b, needs_bias = ctx.needs
    dz = dy.to(a.dtype)
    act = ctx.activation
    parts = None  # the bias gradient's column sums, where the fused kernel wrote them
    if act == "relu":
        dz = dz * (y > 0)
    elif act is not None:
        got = _AG.dz_dbias(a, b, dy, bias, act, _arch(a.device), _traced(a)) \
            if needs_bias else None  # None unless act_grad.DBIAS is on and the kernel applies
        if got is not None:
            dz, parts = got
        else:
            dz = _AG.dz(a, b, dy, bias, act, _arch(a.device), _traced(a))  # one kernel, sm_90a
        if dz is None:
            dz = act_dz_unfused(a, b, dy, bias, act)
    dz = dz.contiguous()
    da = _dgrad(dz, b) if needs_a else None
    db, dbias = _weight_grads(dz, a, b, bias, needs_b, needs_bias, parts)
    return da, db, None, dbias, None, None


# --------------------------------------------------------------------------------------
# tirx_gemm::act_save_mm(a, b, bias, act) -> (y, z): the forward that keeps z (op.act_save)
# --------------------------------------------------------------------------------------
def _setup_act_save(ctx, inputs, output):
    a, b, bias, act = inputs
    ctx.activation = act
    ctx.needs = (a.requires_grad, b.requires_grad, bias is not None and bias.requires_grad)
    ctx.save_for_backward(a, b, bias, output[1])  # z: one M x N tensor, as torch keeps


def _backward_act_save(ctx, dy, _dz_of_z):
    _no_double_backward("tirx_gemm.matmul")
    a, b, bias, z = ctx.saved_tensors
    needs_a, needs_b, needs_bias = ctx.needs
    dz = _AS.dz(dy, z, ctx.activation).contiguous()  # elementwise: no recompute GEMM
    da = _dgrad(dz, b) if needs_a else None
    db, dbias = _weight_grads(dz, a, b, bias, needs_b, needs_bias)
    return da, db, dbias, None


# --------------------------------------------------------------------------------------
# tirx_gemm::swiglu(a, fused, out_dtype): silu(a @ gate.T) * (a @ up.T), fused interleaved
# --------------------------------------------------------------------------------------
def _setup_swiglu(ctx, inputs, output):
    a, fused = inputs[:2]
    ctx.needs = (a.requires_grad, fused.requires_grad)
    ctx.save_for_backward(a, fused)


def _backward_swiglu(ctx, dy):
    _no_double_backward("torch.ops.tirx_gemm.swiglu")
    a, fused = ctx.saved_tensors
    needs_a, needs_w = ctx.needs
    dz = _AG.dz(a, fused, dy, None, _AG.SWIGLU, _arch(a.device), _traced(a))  # one kernel
    if dz is None:
        dz = swiglu_dz_unfused(a, fused, dy)
    da = _dgrad(dz, fused) if needs_a else None
    dw, _ = _weight_grads(dz, a, fused, None, needs_w, False)
    return da, dw, None


# --------------------------------------------------------------------------------------
# tirx_gemm::layout_mm(a, b, a_mn, b_mn): v15 on operands as stored, for the traced backward
# --------------------------------------------------------------------------------------
# AOTAutograd traces the backward with fake tensors: a direct kernel call there has no data
# and becomes no node, so under tracing dgrad and wgrad call this op (one node each; its fake
# kernel gives the shape) and a compiled training step keeps v15 in place. No backward.
_LIB = torch.library.Library("tirx_gemm", "FRAGMENT")
_LIB.define("layout_mm(Tensor a, Tensor b, bool a_mn, bool b_mn) -> Tensor")
_LIB.impl("layout_mm", lambda a, b, a_mn, b_mn: _gemm_layout(a, a_mn, b, b_mn),
          "CompositeExplicitAutograd")


@torch.library.register_fake("tirx_gemm::layout_mm", lib=_LIB)
def _layout_mm_fake(a, b, a_mn, b_mn):
    red_a, red_b = (a.shape[0] if a_mn else a.shape[1]), (b.shape[0] if b_mn else b.shape[1])
    if red_a != red_b or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"layout_mm: a {tuple(a.shape)} and b {tuple(b.shape)} (MN-major: "
                         f"{a_mn}, {b_mn}) need one K, dtype and device")
    return a.new_empty((a.shape[1] if a_mn else a.shape[0], b.shape[1] if b_mn else b.shape[0]))


LAYOUT_OP = torch.ops.tirx_gemm.layout_mm.default
torch_op.register_autograd(torch_op.NAME, _backward_matmul, setup_context=_setup_matmul)
torch_op.register_autograd(torch_op.SWIGLU_NAME, _backward_swiglu, setup_context=_setup_swiglu)
torch.library.register_autograd("tirx_gemm::act_save_mm", _backward_act_save,
                                setup_context=_setup_act_save, lib=_AS._LIB)


# --------------------------------------------------------------------------------------
# the calls a training model makes
# --------------------------------------------------------------------------------------
def check_trainable(**tensors) -> None:
    """A one-line TypeError for a float8 tensor (``name=tensor``) that requires grad while
    grad mode is on: the e4m3 GEMM has no backward."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.dtype in _FP8 and t.requires_grad:
            raise TypeError(f"{name} is {t.dtype} and requires grad: tirx_gemm's float8 GEMM "
                            f"has no backward; quantize {name}.detach() and train the 16-bit "
                            f"master copy")


def check_no_main_grad_traced(**params) -> None:
    """Under torch.compile a parameter's ``main_grad`` would be passed over (the traced backward
    sees fake tensors without the attribute, so the gradient would go to ``.grad``): a one-line
    ValueError instead, naming the parameter and the way out."""
    if not torch.compiler.is_compiling():
        return
    for name, p in params.items():
        if p is not None and getattr(p, "main_grad", None) is not None:
            raise ValueError(f"{name} has a main_grad: tirx_gemm accumulates into main_grad in "
                             f"eager mode only (under torch.compile the gradient would go to "
                             f"{name}.grad instead); run the step eagerly, or drop main_grad "
                             f"and read {name}.grad")


def _records(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def matmul(a, b, bias=None, activation: str | None = None, out_dtype=None, *,
           step: str | None = None):
    """``act(a @ b.T + bias)`` as tirx_gemm.torch_op.matmul, differentiable: while autograd
    records the call (grad mode on, an operand requires grad) it runs through the op
    ``torch.ops.tirx_gemm.matmul``, whose backward this module registers; otherwise the
    kernel directly. Arguments and errors as tirx_gemm.matmul.matmul's."""
    check_trainable(a=a, b=b, bias=bias)
    check_no_main_grad_traced(b=b, bias=bias)
    if _records(a, b, bias) or torch.compiler.is_compiling():
        if activation in _AS.ACTS and step is None and _records(a, b, bias) \
                and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) \
                and _AS.applies(a, b, bias, activation, out_dtype, _arch(a.device)):
            return _AS.forward(a, b, bias, activation)[0]  # keeps z: an elementwise backward
        return torch_op.OP(a, b, step, bias, activation, out_dtype)
    return torch_op.matmul(a, b, bias, activation, out_dtype, step=step)


def swiglu(a, fused, *, out_dtype=None):
    """tirx_gemm.torch_op.swiglu, differentiable (the gradient of ``fused`` in its fused,
    interleaved layout)."""
    check_trainable(a=a, fused=fused)
    if _records(a, fused) or torch.compiler.is_compiling():
        return torch_op.SWIGLU_OP(a, fused, out_dtype)
    return torch_op.swiglu(a, fused, out_dtype=out_dtype)


def linear(x, weight, bias=None, *, step: str | None = None, fuse_bias: bool = True):
    """``F.linear(x, weight, bias)`` on the kernels, differentiable: x's leading dimensions
    flattened to the GEMM's M (a copy when x's layout needs one), the bias fused into the
    epilogue where ``fuse_bias`` and the GPU has the epilogue kernels (sm_90a), else added
    by torch after the GEMM."""
    check_trainable(input=x, weight=weight, bias=bias)
    check_no_main_grad_traced(weight=weight, bias=bias)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (out_features x in_features), got shape "
                         f"{tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"input has shape {tuple(x.shape)}: its last dimension must be the "
                         f"weight's in_features {weight.shape[1]}")
    a = x.reshape(-1, weight.shape[1])
    if torch.compiler.is_compiling():  # no data pointers while tracing: the op checks them
        a = a.contiguous()
    elif not a.is_contiguous() or a.data_ptr() % 16:
        a = a.contiguous() if not a.is_contiguous() else a.clone()
    fused = bias is not None and fuse_bias and _fp32_out(a.device)
    y = matmul(a, weight, bias if fused else None, step=step)
    if bias is not None and not fused:
        y = y + bias
    return y.view(*x.shape[:-1], weight.shape[0])
