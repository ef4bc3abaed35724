"""matmul_fp8's operands on the torch side: quantize a real tensor into e4m3 and its scales
(the shapes matmul_fp8 takes, tirx_gemm/op/fp8.py's docstring), expand or apply the scales,
and the fp32 reference product. Re-exported by tirx_gemm.op.fp8."""
from __future__ import annotations

from tirx_gemm import numerics

__all__ = ["quantize", "dequantize", "expand_scale", "reference"]
BLOCK = numerics.FP8_BLOCK  # the 1x128 / 128x128 blocks of "block" scales


def quantize(x, mode: str, operand: str):
    """(x_q float8_e4m3fn, scale float32) of a real 2-D tensor ``x`` for matmul_fp8: each
    scale = amax of its group / 448 (1 for an all-zero group), in the shapes matmul_fp8 takes
    (tirx_gemm/op/fp8.py's docstring) -- the torch twin of numerics.quantize_fp8_np. ``operand``
    "a" (M x K) or "b" (N x K): rowwise scale_b comes out (1, N), block scale_b per
    128x128 block."""
    import torch
    numerics.check_fp8_scale(mode)
    if operand not in ("a", "b"):
        raise ValueError(f"operand={operand!r} must be 'a' or 'b'")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D ({'M' if operand == 'a' else 'N'} x K), got shape "
                         f"{tuple(x.shape)}: flatten it with x.reshape(-1, x.shape[-1])")
    x = x.float()
    R, K = x.shape
    if mode == "tensor":
        amax = x.abs().amax().reshape(())
    elif mode == "row":
        amax = x.abs().amax(dim=1, keepdim=True)
    else:
        rows = 1 if operand == "a" else BLOCK
        pr, pk = -(-R // rows) * rows, -(-K // BLOCK) * BLOCK
        p = torch.zeros(pr, pk, dtype=torch.float32, device=x.device)
        p[:R, :K] = x.abs()
        amax = p.reshape(pr // rows, rows, pk // BLOCK, BLOCK).amax(dim=(1, 3))
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
    rows = 1 if operand == "a" else BLOCK
    e = scale.repeat_interleave(rows, dim=0).repeat_interleave(BLOCK, dim=1)
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
