"""What a matmul call's tensors must be: operand, bias and output checks, each refusal one line.

torch is imported only inside the checks, so importing this module imports no torch."""

from __future__ import annotations

import weakref

from tirx_gemm import epilogue as E
from tirx_gemm.op.keywords import ROW_MULTIPLE, _ceil_div, check_index_limits
from tirx_gemm.numerics import DTYPES

ALIGN_BYTES = 16  # TMA and 16-byte vector copies: every operand's base address


def _dtype_name(t) -> str | None:
    name = str(t.dtype).removeprefix("torch.")
    return name if name in DTYPES else None


def check_operands(a, b, out=None, *, require_cuda: bool = True) -> tuple[int, int, int, str]:
    """(M, N, K, dtype) of ``a @ b.T``, or a one-line TypeError/ValueError saying what to
    change. ``require_cuda=False`` skips the device checks so that the others can be
    exercised on CPU tensors (tests)."""
    import torch
    ops = [("a", a), ("b", b)] + ([("out", out)] if out is not None else [])
    for name, t in ops:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(ops)
    if require_cuda:  # first: on a machine without a GPU no other advice can help
        check_devices(ops)
    M, N, K = check_layout(a, b, out)
    for name, t in ops:
        if t.data_ptr() % ALIGN_BYTES:
            raise ValueError(f"{name}'s data pointer is not {ALIGN_BYTES}-byte aligned (a view "
                             f"at an odd offset?): TMA needs it; pass {name}.clone()")
    if out is not None:
        check_no_overlap(out, a=a, b=b)
    check_no_grad(a, b)
    check_out_grad(out)
    return M, N, K, _dtype_name(a)


def check_devices(ops, op: str = "matmul", gpus: str = "an sm_90a or sm_100a GPU",
                  instead: str = "torch.nn.functional.linear", them: str = "them") -> None:
    """One-line ValueErrors for ``ops`` [(name, tensor)] not all on one CUDA GPU: ``op`` runs
    on ``gpus``; ``instead`` is what to use on a machine without one; ``them``: what to move."""
    import torch
    off = [name for name, t in ops if t.device.type != "cuda"]
    if off and not torch.cuda.is_available():
        raise ValueError(f"{', '.join(off)} on {ops[0][1].device} and this machine has no "
                         f"CUDA GPU (torch {torch.__version__}): tirx_gemm.{op} runs on "
                         f"{gpus}; here use {instead}")
    for name, t in ops:
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: {op} runs on a CUDA GPU "
                             f"({name}.cuda())")
    devices = sorted({str(t.device) for _, t in ops})
    if len(devices) > 1:
        raise ValueError(f"the operands are on {', '.join(devices)}: put {them} on one GPU")


def check_step(step) -> None:
    """A one-line TypeError / ValueError unless ``step`` is None or names a step of the
    registry ("v9"; "V9" and "9" too, as registry.get reads them), on any arch."""
    if step is None:
        return
    if not isinstance(step, str):
        raise TypeError(f"step={step!r} is a {type(step).__name__}: pass a step id string "
                        f"such as 'v9', or step=None for choose's pick")
    sid = step.lower()
    sid = sid if sid.startswith("v") else "v" + sid
    from tirx_gemm import registry
    ids = dict.fromkeys(s.id for s in registry.STEPS)
    if sid not in ids:
        raise ValueError(f"there is no step {step!r}: the steps are {', '.join(ids)} (or "
                         f"step=None for choose's pick)")


def check_no_grad(a, b) -> None:
    """The direct kernel call records no gradient: a one-line ValueError, while grad mode is
    on, for operands that require grad, naming the differentiable calls."""
    import torch
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        raise ValueError("this direct kernel call records no gradient: call tirx_gemm.matmul(a, "
                         "b, ...) or tirx_gemm.nn.Linear to train through it, or run it under "
                         "torch.no_grad() or with detached tensors")


def check_out_grad(out) -> None:
    """A one-line ValueError for an ``out`` that requires grad while grad mode is on: the
    kernel writes it with no record for autograd (torch refuses such an out= too), and the
    GPU launch failed on it with DLPack's "Can't export tensors that require gradient"."""
    import torch
    if out is not None and out.requires_grad and torch.is_grad_enabled():
        raise ValueError("out requires grad: matmul writes out= with no record for autograd; "
                         "pass out=None (a fresh result), or run under torch.no_grad()")


def check_dense(ops) -> None:
    """A one-line TypeError for a sparse (or other non-strided) tensor among ``ops``
    [(name, tensor)]: run before anything reads a data pointer, which such a tensor lacks."""
    for name, t in ops:
        if getattr(t, "is_nested", False):  # strided layout, yet no sizes or data pointer
            raise TypeError(f"{name} is a nested tensor: the kernels take dense 2-D tensors; "
                            f"pass torch.cat(list({name}.unbind())) (its rows one after "
                            f"another) or {name}.to_padded_tensor(0)")
        layout = getattr(t, "layout", None)
        if layout is not None and str(layout) != "torch.strided":
            raise TypeError(f"{name} is a {layout} tensor: the kernels take dense tensors; "
                            f"pass {name}.to_dense()")


def byte_range(t) -> tuple[int, int] | None:
    """(first, last) address of the bytes ``t``'s elements occupy, strides and storage
    offset included (``data_ptr`` is the first element's address), or None when empty."""
    if t.numel() == 0:
        return None
    lo = hi = t.data_ptr()
    size = t.element_size()
    for n, s in zip(t.shape, t.stride()):
        if s >= 0:
            hi += (n - 1) * s * size
        else:
            lo += (n - 1) * s * size
    return lo, hi + size - 1


def check_no_overlap(out, **inputs) -> None:
    """A one-line ValueError when the bytes ``out`` spans overlap those of an input
    (``name=tensor``; None skipped): the kernel would write the result over what it is
    still reading. Compares the byte ranges (:func:`byte_range`), so a view at another
    offset of the same storage is caught, not only an equal data pointer."""
    span = byte_range(out)
    if span is None:
        return
    for name, t in inputs.items():
        if t is None or t.device != out.device:
            continue
        other = byte_range(t)
        if other is not None and other[0] <= span[1] and span[0] <= other[1]:
            raise ValueError(f"out overlaps {name} in memory (out's bytes "
                             f"{span[0]:#x}-{span[1]:#x}, {name}'s {other[0]:#x}-{other[1]:#x}):"
                             f" the kernel would overwrite {name} while reading it; pass "
                             f"out=None or a tensor of its own")


def out_overlaps(out, a, b, bias=None) -> bool:
    """Cheap test for the lean paths: whether out's bytes may overlap a's, b's or bias's,
    taking each tensor as compact (what the kernel's host code lets through); where it
    may, :func:`check_no_overlap` decides exactly."""
    p, n = out.data_ptr(), out.nbytes
    for t in (a, b, bias):
        if t is not None:
            q = t.data_ptr()
            if q < p + n and p < q + t.nbytes:
                return True
    return False


def check_layout(a, b, out=None) -> tuple[int, int, int]:
    """(M, N, K): the checks of a call's tensors that need neither their data nor a device
    (dtypes, ranks, shapes, row layout, TMA's row rule), each a one-line TypeError or
    ValueError. The eager call (check_operands) and the traced op's fake implementation
    (torch_op.check_fake) both run these, so a traced model fails where an eager one would."""
    ops = [("a", a), ("b", b)] + ([("out", out)] if out is not None else [])
    check_dense(ops)
    for name, t in ops:
        if _dtype_name(t) is None:
            raise TypeError(f"{name} has dtype {t.dtype}: matmul takes torch.float16 or "
                            f"torch.bfloat16 (convert with {name}.half() or {name}.bfloat16())")
    for name, t in ops[1:]:
        if t.dtype != a.dtype:
            raise TypeError(f"a is {a.dtype} but {name} is {t.dtype}: the operands (and out) "
                            f"must share one dtype")
    for name, t in ops:
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)} (flatten the "
                             f"leading dimensions: {name}.reshape(-1, {name}.shape[-1]))")
    (M, K), (N, Kb) = a.shape, b.shape
    if Kb != K:
        raise ValueError(f"a is {M}x{K} but b is {N}x{Kb}: matmul computes a @ b.T, so both "
                         f"need the same number of columns K (b is out-features x in-features, "
                         f"like a Linear weight)")
    if out is not None and tuple(out.shape) != (M, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected ({M}, {N}) for "
                         f"a {M}x{K} @ b.T with b {N}x{K}")
    for name, t in ops:
        if not t.is_contiguous():
            rows = t.shape[1]
            why = (f"row stride {t.stride(0)} for {rows} columns (a view with padded rows)"
                   if t.stride(1) == 1 else f"strides {t.stride()}, not row-major")
            raise ValueError(f"{name} is not contiguous ({why}): the kernels' TMA descriptors "
                             f"take compact rows; pass {name}.contiguous()")
    for name, v in (("K", K), ("N", N)):
        if v % ROW_MULTIPLE:
            rows = "a and b" if name == "K" else "out"
            raise ValueError(f"{name}={v} is not a multiple of {ROW_MULTIPLE}: the rows of "
                             f"{rows} are {v} elements, and TMA needs row strides of a "
                             f"multiple of 16 bytes; pad {name} with zeros to "
                             f"{_ceil_div(v, ROW_MULTIPLE) * ROW_MULTIPLE}")
    check_index_limits(M, N, K)
    return M, N, K


def _gpu_arch(dev) -> tuple[str, int]:
    """(arch, SM count) of the GPU holding the operands, or a ValueError naming the fix."""
    import torch
    from tirx_gemm.run.device import ARCH_CAPABILITY, capability_matches
    cap = tuple(torch.cuda.get_device_capability(dev))
    for arch in ARCH_CAPABILITY:
        if capability_matches(arch, cap):
            return arch, int(torch.cuda.get_device_properties(dev).multi_processor_count)
    raise ValueError(f"{torch.cuda.get_device_name(dev)} is compute capability "
                     f"{cap[0]}.{cap[1]}: the steps run on sm_90a (9.0, Hopper) or sm_100a "
                     "(10.x, Blackwell); use torch.matmul(a, b.T) on this GPU")


def _out_dtype_name(out_dtype, dtype: str) -> str | None:
    """OUT_DTYPE of a call: None for the operands' dtype, "float32" for fp32."""
    if out_dtype is None:
        return None
    name = out_dtype if isinstance(out_dtype, str) else str(out_dtype).removeprefix("torch.")
    if name == dtype:
        return None
    if name not in E.OUT_DTYPES:
        raise ValueError(f"out_dtype={out_dtype!r} is not supported: pass None (the operands' "
                         f"dtype, {dtype}) or torch.float32")
    return name


def epilogue_kwargs(bias=None, activation=None, out_dtype=None, swiglu: bool = False,
                    dtype: str = "float16") -> dict:
    """The builder keywords (tirx_gemm.epilogue) of a call's epilogue arguments, checked
    (one-line errors): what :func:`choose` and :func:`variants` take as ``epilogue``.
    ``bias`` may be a tensor or a dtype name."""
    if activation is not None and activation not in E.ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not supported: choose one of "
                         f"{', '.join(E.ACTIVATIONS)} (or None)")
    if bias is None:
        bias_dt = False
    else:
        bias_dt = bias if isinstance(bias, str) else _bias_dtype(bias)
    return E.epilogue_kwargs({"BIAS": bias_dt, "ACT": activation, "SWIGLU": bool(swiglu),
                              "OUT_DTYPE": _out_dtype_name(out_dtype, dtype)})


def _bias_dtype(bias) -> str:
    if not hasattr(bias, "dtype") or isinstance(bias, (bool, int, float, complex)):
        raise TypeError(f"bias must be a 1-D torch.Tensor of N values (or None), got "
                        f"{type(bias).__name__}")
    name = str(getattr(bias, "dtype", "")).removeprefix("torch.")
    if name not in E.BIAS_DTYPES:
        raise TypeError(f"bias has dtype {getattr(bias, 'dtype', type(bias).__name__)}: the "
                        f"fused bias takes {', '.join('torch.' + d for d in E.BIAS_DTYPES)}")
    return name


def check_bias(bias, N: int, device=None) -> None:
    """A one-line TypeError / ValueError unless ``bias`` is a contiguous 1-D tensor of N
    elements of a fused-bias dtype (on ``device`` when given)."""
    import torch
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    _bias_dtype(bias)
    if bias.dim() != 1 or bias.shape[0] != N:
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({N},): one value per "
                         f"output column (b's rows)")
    if device is not None and bias.device != device:
        raise ValueError(f"bias is on {bias.device} but the operands are on {device}: "
                         f"bias.to({str(device)!r})")
    if not bias.is_contiguous():
        raise ValueError(f"bias is not contiguous (stride {bias.stride()}): pass "
                         f"bias.contiguous()")
    if bias.requires_grad and torch.is_grad_enabled():
        raise ValueError("bias requires grad and this direct kernel call records no "
                         "gradient: call tirx_gemm.matmul(a, b, bias=...) or tirx_gemm.nn.Linear "
                         "to train through it, or pass bias.detach()")


def _check_out(out, M: int, N: int, dtype, device) -> None:
    import torch
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"out is {out.dtype} but the result is {dtype}: pass out=None or an "
                        f"out of {dtype}")
    if tuple(out.shape) != (M, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected ({M}, {N})")
    if out.device != device:
        raise ValueError(f"out is on {out.device} but the operands are on {device}")
    if not out.is_contiguous() or out.data_ptr() % ALIGN_BYTES:
        raise ValueError("out must be contiguous and 16-byte aligned: pass a fresh tensor")
    check_out_grad(out)


# --------------------------------------------------------------------------------------
# the mark of a fused gate/up weight: swiglu(fused=) takes only what fuse_gate_up made
# --------------------------------------------------------------------------------------
GATE_UP_MARK = "_tirx_gemm_gate_up"  # attribute fuse_gate_up sets: the (2N, K) it made
_gate_up_storages: dict = {}  # id(storage fuse_gate_up wrote) -> (weakref to it, (2N, K))
_hooked = False  # whether the Parameter-registration hook that carries the mark is in place


def mark_gate_up(t):
    """Mark ``t``, just made by fuse_gate_up, as a fused gate/up weight. Two marks: an
    attribute on the tensor (kept by ``.contiguous()``, ``requires_grad_``, deepcopy and
    torch.save/load) and a weak registry of its storage, which recognizes what shares it
    (``nn.Parameter(t)``, ``t.detach()``, full views). A Parameter made of it gets the
    attribute when it is set on a module (a torch parameter-registration hook, installed by
    the first call) or first passed to swiglu, and keeps it through the module's
    ``.to()``/``.cuda()``/``.half()`` (they swap the Parameter's data, not the Parameter). A
    copy of a bare tensor (``.to(other dtype or device)``, ``.clone()``) and a Parameter
    replaced by ``load_state_dict(assign=True)`` carry no mark: fuse after moving. Returns
    ``t``."""
    global _hooked
    shape = tuple(t.shape)
    setattr(t, GATE_UP_MARK, shape)
    s = t.untyped_storage()
    key = id(s)

    def forget(ref, key=key):
        if _gate_up_storages.get(key, (None,))[0] is ref:
            del _gate_up_storages[key]
    _gate_up_storages[key] = (weakref.ref(s, forget), shape)
    if not _hooked:
        from torch.nn.modules.module import register_module_parameter_registration_hook
        register_module_parameter_registration_hook(_carry_mark)
        _hooked = True
    return t


def _carry_mark(module, name, param) -> None:
    """Parameter-registration hook: a Parameter sharing fuse_gate_up's storage takes its
    mark (the attribute), so that the module's ``.to()`` keeps it. Never raises."""
    if param is not None and _gate_up_storages:
        try:
            _is_gate_up(param)
        except Exception:  # noqa: BLE001 -- a hook must not break a module's construction
            pass


def _is_gate_up(t) -> bool:
    """Whether ``t`` carries fuse_gate_up's mark for its shape, or shares a marked storage
    whole (then it gets the attribute, the fast check next time)."""
    shape = tuple(getattr(t, "shape", ()))
    if getattr(t, GATE_UP_MARK, None) == shape:
        return True
    try:
        s = t.untyped_storage()
        ref, made = _gate_up_storages.get(id(s), (None, None))
        if ref is not None and ref() is s and made == shape and t.storage_offset() == 0 \
                and t.is_contiguous():
            setattr(t, GATE_UP_MARK, shape)
            return True
    except (AttributeError, RuntimeError, TypeError):
        pass
    return False


def check_gate_up(fused) -> None:
    """A one-line ValueError unless ``fused`` carries fuse_gate_up's mark
    (:func:`mark_gate_up`) for its shape: a concatenated [w_gate; w_up] (how fused
    checkpoints store gate_up_proj) has the same shape and would give a wrong MLP."""
    if not _is_gate_up(fused):
        raise ValueError("fused= takes only what fuse_gate_up made (rows interleaved in groups "
                         "of 8, not [w_gate; w_up]): pass fused=fuse_gate_up(w_gate, w_up) or "
                         "w_gate=, w_up=; a concatenated weight splits as "
                         "w_gate, w_up = w.chunk(2, dim=0); a fused weight copied by .to()/"
                         ".clone() loses the mark: fuse after moving")


def check_gate_up_experts(fused) -> None:
    """check_gate_up for grouped_swiglu's (E, 2N, K) weight: only what
    fuse_gate_up_experts marked (a checkpoint's concatenated gate_up_proj has its shape)."""
    if not _is_gate_up(fused):
        raise ValueError("fused takes only what fuse_gate_up_experts made (each expert's rows "
                         "interleaved in groups of 8, not [w_gate; w_up]): pass "
                         "fused=fuse_gate_up_experts(w_gate, w_up); a checkpoint's "
                         "concatenated gate_up_proj (E, 2N, K) splits as "
                         "w_gate, w_up = w.chunk(2, dim=1); a copy (.to()/.clone()) loses "
                         "the mark: fuse after moving")


def fuse_gate_up(w_gate, w_up):
    """The fused gate/up weight of a SwiGLU MLP, for :func:`swiglu` (``fused=``): w_gate and
    w_up (N x K each, one dtype and device, N a multiple of 8) interleaved in groups of
    8 rows (gate 0-7, up 0-7, gate 8-15, ...; tirx_gemm.epilogue.SWIGLU_GROUP), a new
    contiguous (2N, K) tensor, marked (operands.mark_gate_up: what survives a copy) so that
    swiglu refuses any other ``fused=``. Do it once per model (it copies both weights).
    Its numpy twin: tirx_gemm.epilogue.interleave_gate_up_np."""
    import torch
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
        if w.dim() != 2:
            raise ValueError(f"{name} must be 2-D (N x K), got shape {tuple(w.shape)}")
    if w_gate.shape != w_up.shape or w_gate.dtype != w_up.dtype \
            or w_gate.device != w_up.device:
        raise ValueError(f"w_gate ({tuple(w_gate.shape)}, {w_gate.dtype}, {w_gate.device}) and "
                         f"w_up ({tuple(w_up.shape)}, {w_up.dtype}, {w_up.device}) must have "
                         f"one shape, dtype and device")
    N, K = w_gate.shape
    E.check_swiglu_n(N)
    G = E.SWIGLU_GROUP
    fused = torch.stack((w_gate.reshape(N // G, G, K), w_up.reshape(N // G, G, K)),
                        dim=1).reshape(2 * N, K).contiguous()
    mark_gate_up(fused)
    return fused
