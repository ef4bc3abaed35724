"""The training forward of a fused-activation call that keeps its pre-activation: ``y = act(z)`` and
``z = a @ b.T + bias`` from one kernel, so that the backward is elementwise, as torch's.

torch's Linear + activation keeps ``z`` (one M x N tensor) and its backward forms ``dz = dy *
act'(z)`` in one elementwise pass. tirx's inference forward fuses the activation into the GEMM's
epilogue and ``z`` never reaches memory, so without this the backward recomputes ``z`` with a
second GEMM (tirx_gemm.op.act_grad: one more 2MNK). Here v15 built with ``ACT_SAVE``
(steps/sm90a/hgemm_v15.py; hopper/layouts.epilogue_act_save) writes ``y`` and ``z`` from the same
accumulator registers, both in the operands' dtype; autograd keeps ``z`` and its backward is
torch's own elementwise gradient (``aten.gelu_backward`` / ``aten.silu_backward``: one pass over
dy and z), then dgrad and wgrad on v15 as before. **Memory: z costs one M x N tensor in the
operands' dtype, as torch's Linear + activation keeps.**

When it runs (:func:`applies`): grad mode records the call (eager, or traced by torch.compile:
the op has a fake kernel and its registered backward traces, so a compiled training step keeps z
too; the kernel's presence is asked once while tracing, :func:`found`), sm_90a, gelu /
gelu_tanh / silu (relu's backward needs no z: its mask is ``y > 0``), fp16 / bf16 operands,
the bias in their dtype, N and K multiples of 8, operands contiguous and 16-byte aligned (while
tracing there is no pointer: the op copies a misaligned one), the output in the operands'
dtype, and the kernel found (built here, or in the bundle): where it is missing the call keeps
the recompute path, so a bundle without it still trains. :data:`ENABLED` switches it off (the
A/B of lab/training_backward). Inference (no grad) keeps the plain fused-epilogue kernel.
"""

from __future__ import annotations

import torch

from tirx_gemm.op.launch_site import new_cache

__all__ = ["ENABLED", "ACTS", "OP", "set_enabled", "kwargs", "request", "applies", "kernel",
           "found", "forward", "dz"]

ENABLED = True
TUNE: dict | None = None  # v15's tune keywords (None: the backward's LAYOUT_TUNE; {}: v9's pair)
ACTS = ("gelu", "gelu_tanh", "silu")  # (relu's backward reads y > 0: no z needed)
_DTYPES = (torch.float16, torch.bfloat16)
# (N, K, act, dtype, bias, device, bundle, TUNE) -> kernel, or None where missing (the recompute
# path; matmul.clear_cache forgets the misses too, so the next call looks again)
_kernels: dict = new_cache()


def set_enabled(on: bool) -> None:
    """The saved pre-activation on (the default) or off (the backward recomputes z)."""
    global ENABLED
    if not isinstance(on, bool):
        raise TypeError(f"set_enabled({on!r}): True or False")
    ENABLED = on


def kwargs(step, dtype: str, sm_count: int, act: str, bias: bool,
           tune: dict | None = None) -> dict:
    """v15's build keywords: the backward's build (layouts.layout_kwargs with ``tune``, None:
    :data:`TUNE`, if that is None LAYOUT_TUNE; both operands K-major, M at run time, K fixed),
    ``ACT_SAVE`` and, with a bias, ``BIAS`` = the operands' dtype."""
    from tirx_gemm.op.layouts import LAYOUT_TUNE, layout_kwargs
    tune = TUNE if tune is None else tune
    kw = {**layout_kwargs(step, dtype, sm_count, False, False,
                          LAYOUT_TUNE if tune is None else tune), "ACT_SAVE": act}
    if bias:
        kw["BIAS"] = dtype
    return kw


def request(M: int, N: int, K: int, dtype: str, act: str, bias: bool,
            sm_count: int | None = None, arch: str = "sm_90a", tune: dict | None = None):
    """The bundle.export request (step, build shape, kwargs) of the kernel :func:`forward`
    loads (``sm_count`` None: the arch's, tirx_gemm.spec; ``tune`` as :func:`kwargs`)."""
    from tirx_gemm import registry, spec
    from tirx_gemm.op.keywords import build_shape
    sm_count = spec.SM_COUNT[arch] if sm_count is None else sm_count
    st = registry.get("v15", arch)
    kw = kwargs(st, dtype, sm_count, act, bias, tune)
    return st, build_shape((M, N, K), kw), kw


def kernel(dtype, M: int, N: int, K: int, act: str, bias: bool, device):
    """The loaded kernel ``fn(a, b, y, z, bias_words)`` (bias_words only with a bias), the one
    :func:`request` names, or None where it is neither in the bundle nor buildable here
    (remembered per (N, K, act, dtype, bias, device, bundle, :data:`TUNE`))."""
    from tirx_gemm.op import matmul as MM
    key = (N, K, act, dtype, bias, device, MM.bundle_path(), str(TUNE))
    if key not in _kernels:
        arch, sm_count = MM._gpu_arch(device)
        st, _, kw = request(M, N, K, str(dtype).removeprefix("torch."), act, bias, sm_count,
                            arch)
        from tirx_gemm.run.workspace import capturing
        if capturing():  # a graph capture cannot load a module: matmul's one-line error
            return MM._load(st, (M, N, K), kw).kernel
        try:
            _kernels[key] = MM._load(st, (M, N, K), kw).kernel
        except (ValueError, RuntimeError):  # not in the bundle, no TVM here: recompute path
            _kernels[key] = None
    return _kernels[key]


@torch.compiler.assume_constant_result  # dynamo asks once while tracing: a constant in the graph
def found(N: int, K: int, act: str, dtype: str, bias: bool, device) -> bool:
    """Whether the save kernel of (N, K, act, ``dtype`` by name, bias) loads on ``device`` (M is
    a run-time argument of the kernel: any M loads the same one)."""
    return kernel(getattr(torch, dtype), 1, N, K, act, bias, device) is not None


def _readable(t) -> bool:
    """Contiguous and (eager) 16-byte aligned; while tracing there is no data pointer: the op
    copies a misaligned operand when it runs (:func:`_run`)."""
    return t.is_contiguous() and (torch.compiler.is_compiling() or t.data_ptr() % 16 == 0)


def applies(a, b, bias, act, out_dtype, arch: str | None) -> bool:
    """Whether :func:`forward` runs for these tensors (module docstring) on a GPU of ``arch``
    (autograd._arch's answer; None: not a GPU). Loads the kernel on the first call of a shape."""
    if not ENABLED or act not in ACTS or a.dtype not in _DTYPES or b.dtype != a.dtype \
            or (bias is not None and bias.dtype != a.dtype) \
            or out_dtype not in (None, a.dtype) or arch != "sm_90a" \
            or a.dim() != 2 or b.dim() != 2:
        return False
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N % 8 or K % 8 or b.shape[1] != K or M * N >= 2 ** 31 \
            or (bias is not None and tuple(bias.shape) != (N,)):
        return False
    if not all(_readable(t) for t in (a, b) + (() if bias is None else (bias,))):
        return False
    if torch.compiler.is_compiling():
        return found(int(N), int(K), act, str(a.dtype).removeprefix("torch."),
                     bias is not None, a.device)
    return kernel(a.dtype, M, N, K, act, bias is not None, a.device) is not None


def _run(a, b, bias, act):
    M, K = a.shape
    N = b.shape[0]
    fn = kernel(a.dtype, M, N, K, act, bias is not None, a.device)
    if fn is None:  # (applies said found: a bundle changed under a compiled graph)
        raise RuntimeError(f"act_save_mm: the {act} save kernel for N={N}, K={K}, {a.dtype} is "
                           f"not in the bundle any more; recompile (torch._dynamo.reset())")
    # a traced graph may hand in an operand at an offset (a view): the TMA reads 16-byte aligned
    a, b = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (a, b))
    if bias is not None and bias.data_ptr() % 16:
        bias = bias.clone()
    y, z = a.new_empty((M, N)), a.new_empty((M, N))
    fn(a, b, y, z, *(() if bias is None else (bias.view(torch.int32),)))
    return y, z


# tirx_gemm::act_save_mm(a, b, bias, act) -> (y, z): the kernel as an op whose backward
# tirx_gemm.op.autograd registers (it keeps z).
_LIB = torch.library.Library("tirx_gemm", "FRAGMENT")
_LIB.define("act_save_mm(Tensor a, Tensor b, Tensor? bias, str act) -> (Tensor, Tensor)")
_LIB.impl("act_save_mm", _run, "CUDA")


@torch.library.register_fake("tirx_gemm::act_save_mm", lib=_LIB)
def _act_save_mm_fake(a, b, bias, act):
    M, N = a.shape[0], b.shape[0]
    return a.new_empty((M, N)), a.new_empty((M, N))


OP = torch.ops.tirx_gemm.act_save_mm.default


def forward(a, b, bias, act):
    """``(y, z)``: y = act(a @ b.T + bias) and z = a @ b.T + bias (M x N, a's dtype each), by
    the op :data:`OP` (autograd records it)."""
    return OP(a, b, bias, act)


def dz(dy, z, act):
    """dz = dy * act'(z) (z's dtype): torch's own elementwise backward of the activation, fp32
    inside, one pass over dy and z."""
    dy = dy.to(z.dtype)
    if act == "silu":
        return torch.ops.aten.silu_backward(dy, z)
    return torch.ops.aten.gelu_backward(dy, z, approximate="tanh" if act == "gelu_tanh"
                                        else "none")
