"""What a matmul call's tensors must be: operand, bias and output checks, each refusal one line.

torch is imported only inside the checks, so importing this module imports no torch."""

from __future__ import annotations

from tirx_gemm import epilogue as E
from tirx_gemm.op.keywords import ROW_MULTIPLE, _ceil_div
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
    if require_cuda:  # first: on a machine without a GPU no other advice can help
        off = [name for name, t in ops if t.device.type != "cuda"]
        if off and not torch.cuda.is_available():
            raise ValueError(f"{', '.join(off)} on {ops[0][1].device} and this machine has no "
                             f"CUDA GPU (torch {torch.__version__}): tirx_gemm.matmul runs on "
                             "an sm_90a or sm_100a GPU; here use torch.nn.functional.linear")
        for name, t in ops:
            if t.device.type != "cuda":
                raise ValueError(f"{name} is on {t.device}: matmul runs on a CUDA GPU "
                                 f"({name}.cuda())")
        devices = sorted({str(t.device) for _, t in ops})
        if len(devices) > 1:
            raise ValueError(f"the operands are on {', '.join(devices)}: put them on one GPU")
    M, N, K = check_layout(a, b, out)
    for name, t in ops:
        if t.data_ptr() % ALIGN_BYTES:
            raise ValueError(f"{name}'s data pointer is not {ALIGN_BYTES}-byte aligned (a view "
                             f"at an odd offset?): TMA needs it; pass {name}.clone()")
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        raise ValueError("matmul has no backward: call it under torch.no_grad() or "
                         "torch.inference_mode(), or pass detached tensors")
    return M, N, K, _dtype_name(a)


def check_layout(a, b, out=None) -> tuple[int, int, int]:
    """(M, N, K): the checks of a call's tensors that need neither their data nor a device
    (dtypes, ranks, shapes, row layout, TMA's row rule), each a one-line TypeError or
    ValueError. The eager call (check_operands) and the traced op's fake implementation
    (torch_op.check_fake) both run these, so a traced model fails where an eager one would."""
    ops = [("a", a), ("b", b)] + ([("out", out)] if out is not None else [])
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
        raise ValueError("matmul has no backward: call it under torch.no_grad() or "
                         "torch.inference_mode(), or pass a detached bias")


def _check_out(out, M: int, N: int, dtype, device) -> None:
    import torch
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"out is {out.dtype} but the result is {dtype}")
    if tuple(out.shape) != (M, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected ({M}, {N})")
    if out.device != device:
        raise ValueError(f"out is on {out.device} but the operands are on {device}")
    if not out.is_contiguous() or out.data_ptr() % ALIGN_BYTES:
        raise ValueError("out must be contiguous and 16-byte aligned: pass a fresh tensor")
