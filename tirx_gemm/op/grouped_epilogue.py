"""The grouped op's epilogue: ``bias`` and the row ``scale`` of ``tirx_gemm.grouped_mm``.

On sm_90a, v14's builder fuses both (``BIAS=True``, ``ROW_SCALE=True``: in fp32 on the
accumulator, before the one rounding to the output's dtype): with :data:`ENABLED` on, the op
asks for the fused kernel when the call passes them in a form the kernel takes -- ``scale``
float32 or the operands' dtype (converted to float32: one small copy), ``bias`` in the
operands' dtype, (E, N) or (N,) (expanded to (E, N): one small copy). A float32 ``bias``
(and then the scale after it), the sm_100a twin, or a fused kernel that can be had neither
from the bundle nor from a build here (no TVM) take the unfused path: the plain kernel, then
torch ops on the result (bias, then scale; one rounding more); the last of those warns once
per kernel, naming the suite key that exports it (grouped_kernels.warn_unfused).
:func:`fused_keywords` says which keywords a call gets, :func:`kernel_operands` the extra
operands in the kernel's order (scale, then bias), :func:`torch_epilogue` the unfused path,
:func:`swiglu_rows` grouped_swiglu's (SwiGLU with torch ops).
A grouped suite entry's ``"epilogues"`` lists its fused calls in those keywords
(:func:`suite_epilogue`: ``{"ROW_SCALE": true}``, ``{"BIAS": true}``, both, or
``{"SWIGLU": "halves"}`` / ``{"SWIGLU": "interleaved"}``, grouped_swiglu's);
grouped.fused_call is the kernel the op looks up for such a call (what ``tirx-gemm export
--suite`` builds). :data:`ENABLED` and :data:`SWAP_FUSED` are the fused epilogues' switches.
Importing this module imports neither torch nor TVM.
"""

from __future__ import annotations

# On by default: tests/test_gpu_grouped.py's fused cases (bias and row scale, SwiGLU halves and
# interleaved, the patched Mixtral- and Qwen3-style blocks) pass on an NVIDIA H100 80GB HBM3.
# ENABLED = False takes the plain kernel and torch ops (grouped_mm's bias / scale,
# grouped_swiglu, Experts).
ENABLED = True
# SwiGLU in the epilogue of a swap-AB (decode) tile too, "halves" only (v14's 8-row gate and
# up boxes): off until tests/test_gpu_grouped.py's swap_swiglu cases pass on a GPU
SWAP_FUSED = False
FUSED_ARCHS = ("sm_90a",)  # bias, scale and SwiGLU alike
FUSED_KEYWORDS = ("ROW_SCALE", "BIAS")  # v14 sm_90a's epilogue keywords, in operand order
GATE_UP = ("halves", "interleaved")  # SwiGLU's gate/up layouts (grouped_swiglu's module doc)


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


def suite_epilogue(value, at: str) -> dict:
    """One object of a grouped suite entry's "epilogues", checked: ROW_SCALE and / or BIAS true
    (grouped_mm's scale= and bias=, as :func:`fused_keywords` spells them), or SWIGLU alone,
    "halves" or "interleaved" (grouped_swiglu's gate_up: the entry's N is the gate/up 2I)."""
    ok = isinstance(value, dict) and bool(value) and (
        set(value) <= set(FUSED_KEYWORDS) and all(v is True for v in value.values())
        or set(value) == {"SWIGLU"} and value["SWIGLU"] in GATE_UP)
    if not ok:
        raise ValueError(f'{at}: {value!r} is none of {{"ROW_SCALE": true}}, '
                         f'{{"BIAS": true}}, both, {{"SWIGLU": "halves"}}, '
                         f'{{"SWIGLU": "interleaved"}}: write one of those')
    return dict(value)


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


def swiglu_rows(h, interleaved: bool = True):
    """``silu(gate) * up`` of a gate/up result h (..., 2N), in fp32, rounded once to h's
    dtype: interleaved in groups of 8 columns (grouped.fuse_gate_up_experts) or, with
    ``interleaved=False``, [gate | up] halves (a checkpoint's concatenated gate_up_proj)."""
    import torch
    import torch.nn.functional as F
    from tirx_gemm.epilogue import SWIGLU_GROUP
    n2 = h.shape[-1]
    if interleaved:
        g = h.unflatten(-1, (n2 // (2 * SWIGLU_GROUP), 2, SWIGLU_GROUP))
        gate, up = g.select(-2, 0).flatten(-2), g.select(-2, 1).flatten(-2)
    else:
        gate, up = h.chunk(2, dim=-1)
    gf = gate.float()
    act = F.silu(gf, inplace=gf is not gate)  # in place on gate's fp32 copy (never on h)
    out = torch.empty(up.shape, dtype=h.dtype, device=h.device)
    return torch.mul(act, up, out=out)  # in fp32 (up read exactly), rounded once into out
