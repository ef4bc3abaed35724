"""``tirx_gemm.matmul_fp8(a, b, scale_a, scale_b)``: v13's scaled e4m3 GEMM for PyTorch.

``matmul_fp8(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)`` returns
``(a * scale_a) @ (b * scale_b).T`` for e4m3 (``torch.float8_e4m3fn``) operands, fp32
accumulation, in ``out_dtype`` (bfloat16 or float16), with the scales broadcast as below.

Conventions: torch._scaled_mm's where they fit.

* ``a`` is M x K, row-major (K-major); ``b`` is **N x K**, row-major: the project's
  D = A @ B.T, and the layout of a Linear weight. ``torch._scaled_mm(a, mat2, ...)`` takes
  ``mat2`` K x N column-major, which is this ``b`` transposed: ``_scaled_mm(a, b.t(), ...)``
  computes what ``matmul_fp8(a, b, ...)`` does.
* scales are float32 on a's device, as in ``_scaled_mm``:
  per tensor, ``scale_a`` and ``scale_b`` of one element each (shape ``()``, ``(1,)`` or
  ``(1, 1)``); rowwise, ``scale_a`` (M, 1) and ``scale_b`` (1, N) (``_scaled_mm``'s
  rowwise shapes; ``scale_b[0, n]`` scales row n of ``b``); block (DeepGEMM's layout,
  which ``_scaled_mm`` does not take on Hopper): ``scale_a`` (M, ceil(K/128)) per 1x128
  block of ``a`` and ``scale_b`` (ceil(N/128), ceil(K/128)) per 128x128 block of ``b``.
  The mode is read from the shapes; mixing two modes is refused.
* ``fast_accum`` as ``_scaled_mm``'s ``use_fast_accum``: False (default) promotes the
  tensor core's limited-precision partial sums into fp32 every 128 K (v13's PROMOTE=4,
  overlapped with the next stage's wgmmas); True keeps the whole K in the tensor core's
  accumulator (PROMOTE=0; per-tensor and rowwise only: block scaling always promotes).
  Fast accumulation is outside the project's tolerance at deep K, like torch's
  use_fast_accum: measured on the H200 (lab/fp8_on_hopper/records/fp8_h200_1.jsonl),
  at K >= 2064 a few elements per million fall outside the tolerance derived from the
  14-bit accumulator emulation (37 of 16.7M at 4096^3, rel. error 2.1e-3 against 1.66e-3
  promoted; 230 of 67M at 8192^3), while every promoted check passed. It was 1.5-1.6x
  faster than the (serial) promotion of that run at the large shapes.
* the tile, simply: M <= 128 (one row of 128-row tiles): BLK_M 64 x BLK_N 64, one
  consumer warpgroup per CTA and 4x the CTAs of a 128 x 128 tile (at 77x4096x4096 a
  128 x 128 tile gave 32 CTAs for 132 SMs); else BLK_M 128 x BLK_N 128, or 256 for
  fast_accum without block scaling (an unpromoted 128x256 tile fits the registers; the
  overlapped promotion's acc + two partial sums fit up to BLK_N 128). One kernel per
  (mode, fast_accum, tile, out dtype) serves every shape: v13 is built with RUNTIME_M
  and RUNTIME_NK, so a bundle holds 10 kernels per out dtype (:func:`export_requests`).
* how e4m3 reaches the kernel: as ``t.view(torch.uint8)``, a zero-copy view of the same
  bytes (the kernel's A and B are uint8 operands; see v13's card).

The kernel comes from the build cache here or, on a GPU host without TVM, from a bundle
(``tirx_gemm.matmul.use_bundle`` / ``$TIRX_GEMM_BUNDLE``), exactly as matmul's do;
export one with ``lab/fp8_on_hopper/fp8_export.py``. Importing this module imports neither
torch nor TVM.
"""

from __future__ import annotations

import threading

from tirx_gemm import numerics, registry, spec
from tirx_gemm.op.operands import check_dense, check_no_overlap

__all__ = ["matmul_fp8", "scale_mode", "check_fp8_operands", "choose_fp8", "export_requests",
           "FP8_STEP", "OUT_DTYPES", "lab_variants", "lab_variant_requests"]

FP8_STEP = "v13"
ARCH = "sm_90a"
K_MULTIPLE = spec.row_multiple("float8_e4m3fn")  # TMA: a row of a or b (K bytes): 16
N_MULTIPLE = spec.row_multiple("bfloat16")       # TMA: a row of out (N x 2 bytes): 8
ALIGN_BYTES = spec.TMA_ROW_BYTES
OUT_DTYPES = ("bfloat16", "float16")
SMALL_M = 128     # M <= this (one row of 128-row tiles): the 64 x 64 tile
SCALE_BLOCK = numerics.FP8_BLOCK


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def scale_mode(scale_a_shape, scale_b_shape, M: int, N: int, K: int) -> str:
    """"tensor", "row" or "block" from the scales' shapes, or a one-line ValueError."""
    sa, sb = tuple(scale_a_shape), tuple(scale_b_shape)

    def one(s):
        n = 1
        for d in s:
            n *= d
        return n == 1 and len(s) <= 2

    kb = _ceil_div(K, SCALE_BLOCK)
    if one(sa) and one(sb):
        return "tensor"
    if sa == (M, 1) and sb == (1, N):
        return "row"
    if sa == (M, kb) and sb == (_ceil_div(N, SCALE_BLOCK), kb):
        return "block"
    raise ValueError(
        f"scale_a {sa} and scale_b {sb} match no scaling for a {M}x{K} @ ({N}x{K}).T: use "
        f"per tensor (), (); rowwise ({M}, 1), (1, {N}); or block ({M}, {kb}), "
        f"({_ceil_div(N, SCALE_BLOCK)}, {kb})")


def check_fp8_operands(a, b, scale_a, scale_b, out_dtype, out=None, *,
                       require_cuda: bool = True) -> tuple[int, int, int, str, str]:
    """(M, N, K, scale mode, out dtype name), or a one-line TypeError / ValueError."""
    import torch
    ops = [("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)]
    if out is not None:
        ops.append(("out", out))
    for name, t in ops:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(ops)
    if not isinstance(out_dtype, torch.dtype) or \
            str(out_dtype).removeprefix("torch.") not in OUT_DTYPES:
        raise TypeError(f"out_dtype={out_dtype!r}: matmul_fp8 returns torch.bfloat16 or "
                        f"torch.float16")
    odt = str(out_dtype).removeprefix("torch.")
    for name, t in (("a", a), ("b", b)):
        if t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{name} has dtype {t.dtype}: matmul_fp8 takes "
                            f"torch.float8_e4m3fn operands (quantize: "
                            f"({name} / scale).to(torch.float8_e4m3fn))")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} has dtype {t.dtype}: scales are torch.float32 "
                            f"({name}.float())")
    if out is not None and out.dtype != out_dtype:
        raise TypeError(f"out has dtype {out.dtype} but out_dtype is {out_dtype}")
    if require_cuda:
        off = [name for name, t in ops if t.device.type != "cuda"]
        if off and not torch.cuda.is_available():
            raise ValueError(f"{', '.join(off)} on {ops[0][1].device} and this machine has no "
                             f"CUDA GPU: matmul_fp8 runs on an sm_90a GPU; here use "
                             f"torch._scaled_mm or dequantize and torch.matmul")
        for name, t in ops:
            if t.device.type != "cuda":
                raise ValueError(f"{name} is on {t.device}: matmul_fp8 runs on a CUDA GPU "
                                 f"({name}.cuda())")
        devices = sorted({str(t.device) for _, t in ops})
        if len(devices) > 1:
            raise ValueError(f"the operands are on {', '.join(devices)}: put them (and the "
                             f"scales) on one GPU")
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    (M, K), (N, Kb) = a.shape, b.shape
    if Kb != K:
        raise ValueError(f"a is {M}x{K} but b is {N}x{Kb}: matmul_fp8 computes a @ b.T with "
                         f"b N x K (torch._scaled_mm's mat2 is b.t()), so both need K columns")
    if K % K_MULTIPLE:
        raise ValueError(f"K={K} is not a multiple of {K_MULTIPLE}: TMA needs 16-byte rows "
                         f"of a and b (K bytes); pad K with zeros to "
                         f"{_ceil_div(K, K_MULTIPLE) * K_MULTIPLE}")
    if N % N_MULTIPLE:
        raise ValueError(f"N={N} is not a multiple of {N_MULTIPLE}: TMA needs 16-byte rows "
                         f"of out (N x 2 bytes); pad b with zero rows to "
                         f"{_ceil_div(N, N_MULTIPLE) * N_MULTIPLE}")
    if out is not None and tuple(out.shape) != (M, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected ({M}, {N})")
    mode = scale_mode(scale_a.shape, scale_b.shape, M, N, K)
    for name, t in ops:
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous (strides {t.stride()}): pass "
                             f"{name}.contiguous()")
    for name, t in ops:
        if name.startswith("scale"):
            continue
        if t.data_ptr() % ALIGN_BYTES:
            raise ValueError(f"{name}'s data pointer is not {ALIGN_BYTES}-byte aligned: "
                             f"TMA needs it; pass {name}.clone()")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.data_ptr() % 4:
            raise ValueError(f"{name}'s data pointer is not 4-byte aligned: pass "
                             f"{name}.clone()")
    if out is not None:
        check_no_overlap(out, a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    if torch.is_grad_enabled() and any(t.requires_grad for _, t in ops):
        raise ValueError("matmul_fp8 has no backward: call it under torch.no_grad() or "
                         "pass detached tensors")
    return M, N, K, mode, odt


def choose_fp8(M: int, mode: str, fast_accum: bool, out_dtype: str = "bfloat16",
               sm_count: int = spec.SM_COUNT[ARCH]) -> dict:
    """v13's builder keywords for a call (module docstring: the tile rule)."""
    numerics.check_fp8_scale(mode)
    if not isinstance(fast_accum, bool):
        raise TypeError(f"fast_accum={fast_accum!r} must be True or False")
    promote = 0 if fast_accum and mode != "block" else 4
    if M <= SMALL_M:
        blk_m, blk_n = 64, 64
    else:
        blk_m, blk_n = 128, (256 if promote == 0 else 128)
    return {"dtype": out_dtype, "SCALE": mode, "PROMOTE": promote, "BLK_M": blk_m,
            "BLK_N": blk_n, "RUNTIME_M": True, "RUNTIME_NK": True, "SM_COUNT": sm_count}


def export_requests(sm_count: int = spec.SM_COUNT[ARCH], out_dtypes=("bfloat16",)):
    """Every (step, build shape, keywords) choose_fp8 can ask for: what a bundle for
    matmul_fp8 must hold (runtime-shape kernels: the build shape is nominal)."""
    from tirx_gemm.op.matmul import build_shape
    step = registry.get(FP8_STEP, ARCH)
    seen, reqs = set(), []
    for odt in out_dtypes:
        for mode in numerics.FP8_SCALES:
            for fast in (False, True):
                for M in (1, SMALL_M + 1):
                    kw = choose_fp8(M, mode, fast, odt, sm_count)
                    key = tuple(sorted(kw.items()))
                    if key not in seen:
                        seen.add(key)
                        reqs.append((step, build_shape((M, 256, 256), kw), kw))
    return reqs


def lab_variants(sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) of the per-tensor bf16 kernels lab/fp8_on_hopper/fp8_h200.py times
    next to choose_fp8's, to separate the promotion's cost from the tile's: the
    serial promotion (128 x 128, PROMOTE_OVERLAP=False) and the 128 x 128 tile without
    promotion; the small-M tiles (64 x 128 promoted serially, for M <= 64)."""
    base = {"dtype": "bfloat16", "SCALE": "tensor", "RUNTIME_M": True, "RUNTIME_NK": True,
            "SM_COUNT": sm_count}
    return [("v13 tensor serial 128x128", {**base, "PROMOTE": 4, "PROMOTE_OVERLAP": False,
                                           "BLK_M": 128, "BLK_N": 128}),
            ("v13 tensor fast 128x128", {**base, "PROMOTE": 0, "BLK_M": 128, "BLK_N": 128}),
            ("v13 tensor serial 64x128", {**base, "PROMOTE": 4, "PROMOTE_OVERLAP": False,
                                          "BLK_M": 64, "BLK_N": 128})]


def lab_variant_requests(sm_count: int = spec.SM_COUNT[ARCH]):
    """lab_variants as bundle requests (step, nominal build shape, keywords)."""
    from tirx_gemm.op.matmul import build_shape
    step = registry.get(FP8_STEP, ARCH)
    return [(step, build_shape((kw["BLK_M"], 256, 256), kw), kw)
            for _, kw in lab_variants(sm_count)]


_lock = threading.Lock()
_kernels: dict = {}


def _kernel(kwargs: dict, mnk):
    from tirx_gemm.op.matmul import _Loaded, bundle_path, kernel_source
    step = registry.get(FP8_STEP, ARCH)
    bundle = bundle_path()
    key = (tuple(sorted(kwargs.items())), str(bundle) if bundle else None)
    with _lock:
        hit = _kernels.get(key)
        if hit is None:
            lib, meta = kernel_source(step, mnk, kwargs, bundle)
            hit = _kernels[key] = _Loaded(step, lib, meta)
    return hit.kernel


def clear_cache() -> None:
    with _lock:
        _kernels.clear()


def kernel_scales(scale_a, scale_b, mode: str):
    """The scales as v13's kernel takes them: (1,), (1,) per tensor; (M,), (N,) rowwise;
    block ones unchanged (views, no copies)."""
    if mode == "tensor":
        return scale_a.reshape(1), scale_b.reshape(1)
    if mode == "row":
        return scale_a.reshape(-1), scale_b.reshape(-1)
    return scale_a, scale_b


def matmul_fp8(a, b, scale_a, scale_b, out_dtype=None, *, out=None, fast_accum: bool = False,
               sync: bool = False, _kwargs: dict | None = None):
    """``(a * scale_a) @ (b * scale_b).T`` for e4m3 ``a`` (M x K) and ``b`` (N x K) on an
    sm_90a GPU, fp32 accumulation, returned in ``out_dtype`` (default torch.bfloat16; or
    torch.float16). Scales per tensor, rowwise or per block (module docstring).
    Asynchronous like matmul (``sync=True`` waits through the hang guard).
    ``_kwargs`` (for the lab scripts): v13 builder keywords instead of choose_fp8's."""
    import torch
    from tirx_gemm.op.matmul import _gpu_arch, synchronize
    if out_dtype is None:
        out_dtype = torch.bfloat16
    M, N, K, mode, odt = check_fp8_operands(a, b, scale_a, scale_b, out_dtype, out)
    arch, sms = _gpu_arch(a.device)
    if arch != ARCH:
        raise ValueError(f"matmul_fp8 runs on sm_90a (Hopper) only: this GPU is {arch} (the "
                         f"sm_100a v13 is not written yet)")
    kw = dict(_kwargs) if _kwargs is not None else choose_fp8(M, mode, fast_accum, odt, sms)
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if M == 0:
        return out
    kernel = _kernel(kw, (M, N, K))
    sa, sb = kernel_scales(scale_a, scale_b, mode)
    kernel(a.view(torch.uint8), b.view(torch.uint8), out, sa, sb)
    if sync:
        synchronize(a.device, what=f"tirx_gemm.matmul_fp8 {M}x{N}x{K} {mode}")
    return out


def quantize(x, mode: str, operand: str):
    """(x_q float8_e4m3fn, scale float32) of a real 2-D tensor ``x`` for matmul_fp8: each
    scale = amax of its group / 448 (1 for an all-zero group), in the shapes matmul_fp8
    takes (module docstring) -- the torch twin of numerics.quantize_fp8_np. ``operand``
    "a" (M x K) or "b" (N x K): rowwise scale_b comes out (1, N), block scale_b per
    128x128 block."""
    import torch
    numerics.check_fp8_scale(mode)
    if operand not in ("a", "b"):
        raise ValueError(f"operand={operand!r} must be 'a' or 'b'")
    x = x.float()
    R, K = x.shape
    if mode == "tensor":
        amax = x.abs().amax().reshape(())
    elif mode == "row":
        amax = x.abs().amax(dim=1, keepdim=True)
    else:
        rows = 1 if operand == "a" else SCALE_BLOCK
        pr, pk = _ceil_div(R, rows) * rows, _ceil_div(K, SCALE_BLOCK) * SCALE_BLOCK
        p = torch.zeros(pr, pk, dtype=torch.float32, device=x.device)
        p[:R, :K] = x.abs()
        amax = p.reshape(pr // rows, rows, pk // SCALE_BLOCK, SCALE_BLOCK).amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / numerics.E4M3_MAX, torch.ones_like(amax))
    q = (x / expand_scale(scale, mode, operand, R, K)).to(torch.float8_e4m3fn)
    if mode == "row" and operand == "b":
        scale = scale.reshape(1, R)
    return q, scale.contiguous()


def expand_scale(scale, mode: str, operand: str, R: int, K: int):
    """A scale tensor of matmul_fp8's shapes broadcast to one per element of an R x K
    operand."""
    if mode == "tensor":
        return scale.reshape(1, 1).expand(R, K)
    if mode == "row":
        return scale.reshape(R, 1).expand(R, K)
    rows = 1 if operand == "a" else SCALE_BLOCK
    e = scale.repeat_interleave(rows, dim=0).repeat_interleave(SCALE_BLOCK, dim=1)
    return e[:R, :K]


def dequantize(q, scale, mode: str, operand: str):
    """q * its scales, fp32: the operand the kernel's result is the product of."""
    R, K = q.shape
    return q.float() * expand_scale(scale.float(), mode, operand, R, K)


def reference(a, b, scale_a, scale_b, mode: str):
    """fp32 reference of matmul_fp8: dequantize(a) @ dequantize(b).T (no TF32)."""
    import torch
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return dequantize(a, scale_a, mode, "a") @ dequantize(b, scale_b, mode, "b").T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


__all__ += ["quantize", "dequantize", "expand_scale", "reference", "kernel_scales",
            "clear_cache"]
