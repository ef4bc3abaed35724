"""SwiGLU fused into the grouped gate/up GEMM: ``silu(a @ gate[e].T) * (a @ up[e].T)`` per expert.

:func:`swiglu_mm` takes a fused gate/up weight ``b`` of 2I rows per expert -- "halves" (gate rows
[0, I), up rows [I, 2I): transformers' stacked ``gate_up_proj``) or "interleaved" (groups of 8
gate rows, then 8 up rows: :func:`tirx_gemm.op.grouped.fuse_gate_up_experts`) -- as
``grouped_mm`` takes ``b`` ((E, K, 2I) or (E, 2I, K)), with its ``offs`` / ``counts``, and
returns the (M, I) (masked: (E, T, I)) result. With grouped_epilogue.ENABLED on (the
default), on sm_90a where the pick is a wide tile (more than grouped's
DECODE_TOKENS tokens per expert), one launch of v14 with ``SWIGLU`` computes it in the epilogue
in fp32 and writes only the I columns (the 2I-wide gate/up result never reaches memory).
With grouped_epilogue.SWAP_FUSED on, a swap-AB tile at
decode ("halves") fuses it too (8-row gate and up boxes). Elsewhere -- fused epilogues off;
swap-AB tiles at decode, where the result is a few rows; the sm_100a twin; a fused kernel the
bundle lacks with no TVM to build it (it warns once, naming the suite key that exports it:
grouped_kernels.warn_unfused); autograd recording -- it is ``grouped_mm`` then
:func:`tirx_gemm.op.grouped.swiglu_rows` (fp32, one rounding more).
:func:`swiglu_plan` (grouped's) says which. The checks are grouped_mm's, one line each, before
any launch.
"""

from __future__ import annotations

from tirx_gemm.op import grouped_epilogue as GE
from tirx_gemm.op.grouped import swiglu_plan  # noqa: F401 (the plan's home is grouped)
from tirx_gemm.op.grouped_epilogue import FUSED_ARCHS, GATE_UP  # noqa: F401

_calls: dict = {}
_CALLS_MAX = 1 << 10


def _unfused(a, b, offs, counts, layout, gate_up, sync):
    from tirx_gemm.op import grouped as G
    h = G.grouped_mm(a, b, offs, counts=counts, layout=layout, sync=sync)
    return G.swiglu_rows(h, interleaved=gate_up == "interleaved")


def swiglu_mm(a, b, offs=None, *, counts=None, layout: str | None = None,
              gate_up: str = "halves", sync: bool = False):
    """``silu(gate) * up`` of the grouped GEMM of ``a`` by the fused gate/up weight ``b``
    (module docstring). Asynchronous; no host sync."""
    import torch
    from tirx_gemm.op import grouped as G
    if gate_up not in GATE_UP:
        raise ValueError(f"gate_up={gate_up!r}: choose {' or '.join(map(repr, GATE_UP))}")
    if not GE.ENABLED or torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _unfused(a, b, offs, counts, layout, gate_up, sync)  # grouped_mm says why not
    key = (layout, a.shape, b.shape, b.stride(), a.dtype, a.get_device(), offs is None,
           counts is None, gate_up, GE.SWAP_FUSED)
    call = _calls.get(key, False)
    if call is None:  # a shape seen before that runs unfused: grouped_mm checks the call
        return _unfused(a, b, offs, counts, layout, gate_up, sync)
    p = G.check_grouped(a, b, offs, counts, layout)
    if p.M == 0:
        return _unfused(a, b, offs, counts, layout, gate_up, sync)
    if call is False:
        arch, sm_count = G._gpu(a.device)
        rows = p.M if p.layout == "contiguous" else p.E * p.M
        step, kw = swiglu_plan(rows, p.E, p.N, p.K, p.dtype, p.layout, arch, sm_count, gate_up)
        kernel = None
        if step is not None:
            try:  # the kernel with its workspace (TAIL_SPLIT's; () without)
                kernel = (G._load(step, arch, p.N, p.K, kw)[0],
                          G.GK.workspace(step, arch, p.N, p.K, kw, a.device))
            except (ValueError, RuntimeError) as exc:  # not in the bundle and no TVM here
                G.GK.warn_unfused(step, arch, p.N, p.K, kw, {"SWIGLU": gate_up}, exc)
                kernel = None
        if len(_calls) >= _CALLS_MAX:
            _calls.clear()
        call = _calls[key] = kernel
    if call is None:
        return _unfused(a, b, offs, counts, layout, gate_up, sync)
    half = p.N // 2
    out = a.new_empty((p.M, half) if p.layout == "contiguous" else (p.E, p.M, half))
    if G._checking() and not torch.cuda.is_current_stream_capturing():
        G.check_routing(p, offs, counts)
    weight = p.weight if not p.copy and p.weight.is_contiguous() else p.weight.contiguous()
    kernel, ws = call
    kernel(a, weight, out, G._index(p, offs, counts, a),
           *(ws if ws.__class__ is tuple else ws.get()))
    if sync:
        from tirx_gemm.op.matmul import synchronize
        synchronize(a.device, what="v14 SWIGLU")
    return out


def grouped_swiglu(a, fused, offs=None, *, counts=None, layout: str | None = None,
                   sync: bool = False):
    """``silu(a @ w_gate[e].T) * (a @ w_up[e].T)`` per expert over the fused weight
    ``fused`` (E, 2N, K) of :func:`fuse_gate_up_experts`: the result (M, N) (masked:
    (E, T, N)): one launch with SwiGLU in v14's epilogue where the pick is a wide tile on
    sm_90a, else a grouped GEMM then the SwiGLU with torch ops in fp32
    (:func:`swiglu_mm`). ``fused`` is read as (E, N, K) weights."""
    import torch
    from tirx_gemm import epilogue as EPI
    from tirx_gemm.op import grouped as G
    if not isinstance(fused, torch.Tensor) or fused.dim() != 3:
        raise ValueError("fused must be the 3-D (E, 2N, K) tensor fuse_gate_up_experts made")
    if fused.shape[1] % (2 * EPI.SWIGLU_GROUP):
        raise ValueError(f"fused has {fused.shape[1]} rows per expert: a fused gate/up weight "
                         f"has 2N rows, N a multiple of {EPI.SWIGLU_GROUP}")
    G.check_gate_up_experts(fused)
    return swiglu_mm(a, fused.transpose(1, 2), offs, counts=counts, layout=layout,
                     gate_up="interleaved", sync=sync)
