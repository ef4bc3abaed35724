"""The grouped op's epilogue: ``bias`` and the row ``scale`` of ``tirx_gemm.grouped_mm``.

On sm_90a, v14's builder fuses both (``BIAS=True``, ``ROW_SCALE=True``: in fp32 on the
accumulator, before the one rounding to the output's dtype): with :data:`ENABLED` on, the op
asks for the fused kernel when the call passes them in a form the kernel takes -- ``scale`` float32 or the operands'
dtype (converted to float32: one small copy), ``bias`` in the operands' dtype, (E, N) or (N,)
(expanded to (E, N): one small copy). A float32 ``bias`` (and then the scale after it), the
sm_100a twin, or a fused kernel that can be had neither from the bundle nor from a build here
(no TVM) take the unfused path: the plain kernel, then torch ops on the result (bias, then
scale; one rounding more).
:func:`fused_keywords` says which keywords a call gets, :func:`kernel_operands` the extra
operands in the kernel's order (scale, then bias), :func:`torch_epilogue` the unfused path.
Importing this module imports neither torch nor TVM.
"""

from __future__ import annotations

# On by default: tests/test_gpu_grouped.py's fused cases (bias and row scale, SwiGLU halves and
# interleaved, the patched Mixtral- and Qwen3-style blocks) pass on an NVIDIA H100 80GB HBM3.
# ENABLED = False takes the plain kernel and torch ops (grouped_mm's bias / scale,
# grouped_swiglu, Experts).
ENABLED = True
FUSED_ARCHS = ("sm_90a",)
FUSED_KEYWORDS = ("ROW_SCALE", "BIAS")  # v14 sm_90a's epilogue keywords, in operand order


def fused_keywords(arch: str, dtype: str, bias, scale) -> dict:
    """The epilogue keywords v14 takes for this call's ``bias`` / ``scale`` on ``arch``
    (``dtype``: the operands' dtype name): {} where nothing is fused."""
    if arch not in FUSED_ARCHS:
        return {}
    if bias is not None and str(bias.dtype).removeprefix("torch.") != dtype:
        return {}  # the bias goes after the launch, so the scale must too (bias first)
    kw = {}
    if scale is not None:
        kw["ROW_SCALE"] = True
    if bias is not None:
        kw["BIAS"] = True
    return kw


def kernel_operands(p, fused: dict, bias, scale) -> list:
    """The fused kernel's operands after (A, B, D, routing): scale as float32 of one value per
    result row, then bias as (E, N) in the operands' dtype, each only where ``fused`` has it."""
    import torch
    out = []
    if fused.get("ROW_SCALE"):
        out.append(scale if scale.dtype == torch.float32 else scale.float())
    if fused.get("BIAS"):
        out.append(bias if bias.dim() == 2 else bias.expand(p.E, p.N).contiguous())
    return out


def torch_epilogue(p, out, offs, bias, scale, fused: dict):
    """What ``fused`` leaves out, with torch ops on the result: bias, then scale."""
    import torch
    if bias is not None and not fused.get("BIAS"):
        if bias.dim() == 1:
            out.add_(bias)
        elif p.layout == "masked":
            out.add_(bias.unsqueeze(1))
        else:  # each row's expert, found on the GPU (rows past offs[-1] take no bias)
            rows = torch.arange(p.M, dtype=torch.int32, device=out.device)
            owner = torch.searchsorted(offs, rows, right=True)
            table = torch.cat([bias, bias.new_zeros(1, p.N)])
            out.add_(table.index_select(0, owner))
    if scale is not None and not fused.get("ROW_SCALE"):
        out.mul_(scale.unsqueeze(-1))
    return out
