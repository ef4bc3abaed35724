"""``tirx_gemm.grouped_mm`` on e4m3 operands with DeepGEMM's block scales (v14 FP8_BLOCK, sm_90a).

``grouped_mm(a, b, offs, scale_a=sa, scale_b=sb)`` with ``a`` (M, K) and ``b`` float8_e4m3fn is
the contiguous grouped GEMM of :mod:`tirx_gemm.op.grouped` on fp8, dequantized per block:

    out[r, n] = sum over kb of sa[r, kb] * sb[e, n // 128, kb] * (a[r, blk kb] . w[e, n, blk kb])

for every row r of expert e (``offs`` as in grouped_mm), ``w`` the (E, N, K) weights (``b`` as
(E, K, N), a transposed view of them, or (E, N, K) itself; K-major underneath: no copy).
``scale_a`` float32 (M, K/128): one scale per row and 128 columns of K (1x128, per token);
``scale_b`` float32 (E, ceil(N/128), K/128): one per 128x128 block of each expert's weight.
That is DeepGEMM's contiguous layout (``m_grouped_fp8_gemm_nt_contiguous``) with torch's offs
in place of its per-row expert index. The partial sums of each 128-K block are promoted out of
the tensor core into fp32 with their two scales (v13's promotion). The result is
``out_dtype`` (torch.bfloat16 by default, or torch.float16). K must be a multiple of 128.
The masked layout (DeepGEMM's ``m_grouped_fp8_gemm_nt_masked``): ``a`` (E, T, K), ``counts``
(E,) int32 (None: every row), ``scale_a`` (E, T, K/128); the result (E, T, N).

The torch custom op (``torch.ops.tirx_gemm.grouped_mm``, op/moe.py) carries ``scale_a`` and
``scale_b``, so torch.compile traces an fp8 call too. A grouped suite entry with ``"fp8": true``
exports these kernels (op/grouped_kernels.suite_builds). Not built here: bias, scale and SwiGLU
on fp8, sm_100a (v14's twin there has an MXFP8 form, ``SCALE="mx"``: UE8M0 scales per 32 of K,
checked on NumSim only and not served here).
:func:`quantize_rows` and :func:`quantize_experts` make such operands from real tensors.
The checks are grouped_mm's where they apply, one line each: ``TIRX_GEMM_CHECK=1`` adds the
routing's (:func:`check_routing`, shared with the bf16 path) and finite, positive scales
(tirx_gemm.op.fp8.check_scales_finite), a sync per call, skipped while a CUDA graph is captured.
"""

from __future__ import annotations

from tirx_gemm import numerics, spec
from tirx_gemm.kernels import dtype_kwargs
from tirx_gemm.op import grouped_kernels as GK
from tirx_gemm.op.grouped_kernels import gpu as _gpu, load as _load  # noqa: F401 (tests patch)
from tirx_gemm.op.grouped_limits import (check_masked_stride, check_result_size,
                                         check_routing, checking)
from tirx_gemm.op.keywords import NOMINAL_M, _ceil_div, _pool

__all__ = ["grouped_mm_fp8", "choose_grouped_fp8", "check_grouped_fp8", "check_fp8_data",
           "check_routing", "fp8_builds", "fp8_token_counts", "quantize_rows", "quantize_experts",
           "is_fp8", "SCALE_BLOCK", "ARCH"]

ARCH = "sm_90a"
SCALE_BLOCK = numerics.FP8_BLOCK   # 128: the 1x128 and 128x128 blocks of the scales
OUT_DTYPES = ("bfloat16", "float16")
DECODE_TOKENS = 64                 # tokens per expert at or under which the tile is 64 rows
FP8_NAME = "float8_e4m3fn"


def is_fp8(t) -> bool:
    return str(getattr(t, "dtype", "")).removeprefix("torch.") == FP8_NAME


def choose_grouped_fp8(rows: int, E: int, N: int, K: int, out_dtype="bfloat16",
                       sm_count: int | None = None, *, layout: str = "contiguous",
                       why: list | None = None):
    """``("v14", keywords)`` of the block-scaled fp8 grouped GEMM: 64 token rows (one consumer)
    where the tokens per expert (rows / E; masked: E x the buffer's rows) are at most
    DECODE_TOKENS, else 128; BLK_N 128 (one 128-row block of B per tile), or the narrowest of
    16..64 that holds a smaller N."""
    sm_count = spec.SM_COUNT[ARCH] if sm_count is None else sm_count
    for name, v in (("rows", rows), ("E", E), ("N", N), ("K", K), ("sm_count", sm_count)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "rows" else 1):
            kind = "non-negative" if name == "rows" else "positive"
            raise ValueError(f"{name}={v!r} must be a {kind} int")
    out_dtype = str(out_dtype).removeprefix("torch.")
    if E > 256 or N % 8 or K % SCALE_BLOCK or out_dtype not in OUT_DTYPES \
            or layout not in ("contiguous", "masked"):
        raise ValueError(f"E={E}, N={N}, K={K}, out_dtype={out_dtype!r}, layout={layout!r}: fp8 "
                         f"grouped_mm takes E in [1, 256], N a multiple of 8, K a multiple of "
                         f"{SCALE_BLOCK}, out_dtype one of {OUT_DTYPES}, layout 'contiguous' or "
                         f"'masked'")
    per = rows / max(E, 1)
    blk_m = 64 if per <= DECODE_TOKENS else 128
    blk_n = next((w for w in (16, 32, 64) if N <= w), 128)
    if why is not None:
        why.append(f"fp8 block scales: ~{per:.3g} tokens per expert -> BLK_M {blk_m}; BLK_N "
                   f"{blk_n} (a tile inside one 128x128 scale block of B)")
    return "v14", {**dtype_kwargs(str(out_dtype)), "E": E, "LAYOUT": layout,
                   "FP8_BLOCK": True, "BLK_M": blk_m, "BLK_N": blk_n,
                   "SM_COUNT": _pool(sm_count), "RUNTIME_M": True}


def fp8_token_counts(E: int, top_k: int = 1, layout: str = "contiguous") -> list[int]:
    """The first token count of each tile :func:`choose_grouped_fp8` picks over all of them
    (BLK_M 64 up to DECODE_TOKENS tokens per expert, 128 past): a bundle holding the picks at
    these counts serves every count. Masked: ``tokens`` rows per expert."""
    per_expert = DECODE_TOKENS * E // top_k if layout == "contiguous" else DECODE_TOKENS
    return [1, per_expert + 1]


def fp8_builds(E: int, N: int, K: int, tokens, top_k: int = 1, out_dtypes=("bfloat16",),
               sm_count: int | None = None, layout: str = "contiguous"):
    """[(step id, (M, N, K), keywords)] the calls of ``tokens`` x ``top_k`` rows need (masked:
    E x ``tokens`` rows, a buffer of ``tokens`` per expert), once each."""
    out, seen = [], set()
    for dt in out_dtypes:
        for t in tokens:
            rows = t * top_k if layout == "contiguous" else E * t
            step, kw = choose_grouped_fp8(rows, E, N, K, dt, sm_count, layout=layout)
            key = tuple(sorted(kw.items()))
            if key not in seen:
                seen.add(key)
                out.append((step, (NOMINAL_M, N, K), kw))
    return out


def fp8_suite_builds(entry) -> list:
    """The kernels of a grouped suite entry with ``"fp8": true`` (a checked
    grouped_kernels.SuiteEntry; "dtypes" the output dtypes, as in fp8 suites): the picks at
    its tokens and, with all_m, at :func:`fp8_token_counts` (every tile of every count)."""
    at = entry.at
    if entry.epilogues:
        raise ValueError(f"{at}: an fp8 entry has no epilogues (fp8 grouped_mm fuses none): "
                         f"list the fused calls on the layer's 16-bit entry")
    if entry.arch != ARCH:
        raise ValueError(f"{at}: arch={entry.arch!r}: fp8 grouped_mm runs on {ARCH} only; drop "
                         f"\"fp8\" or the arch")
    more = fp8_token_counts(entry.E, entry.top_k, entry.layout) if entry.all_m else ()
    try:
        return fp8_builds(entry.E, entry.N, entry.K, sorted(set(entry.tokens) | set(more)),
                          entry.top_k, tuple(entry.dtypes), entry.sm_count, entry.layout)
    except ValueError as exc:
        raise ValueError(f"{at}: {exc}") from None


def check_grouped_fp8(a, b, offs=None, scale_a=None, scale_b=None, out_dtype=None, out=None, *,
                      counts=None, layout=None, bias=None, scale=None, require_cuda=True):
    """Every check before the launch, one line each; returns (M, N, K, E, weight, out dtype)."""
    import torch
    for name, t in (("bias", bias), ("scale", scale)):
        if t is not None:
            raise ValueError(f"{name}= is not built for fp8 grouped_mm (no fused epilogue on "
                             f"fp8); apply it after the call")
    for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor for fp8 grouped_mm, got "
                            f"{type(t).__name__}")
    if not (is_fp8(a) and is_fp8(b)):
        raise TypeError(f"a is {a.dtype} and b is {b.dtype}: fp8 grouped_mm takes both "
                        f"torch.float8_e4m3fn (with scale_a, scale_b)")
    if layout not in (None, "contiguous", "masked"):
        raise ValueError(f"layout={layout!r}: choose 'contiguous' or 'masked'")
    layout = layout or ("contiguous" if a.dim() == 2 else "masked")
    masked = layout == "masked"
    if a.dim() != (3 if masked else 2) or b.dim() != 3:
        raise ValueError(f"a must be {'3-D (E, T, K)' if masked else '2-D (rows sorted by expert)'}"
                         f" for layout={layout!r} and b 3-D (E, K, N) or (E, N, K), got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    index, iname = (counts, "counts") if masked else (offs, "offs")
    other = offs if masked else counts
    if other is not None:
        raise ValueError(f"{'offs' if masked else 'counts'}= does not go with a "
                         f"{'3-D' if masked else '2-D'} a: pass offs= with a 2-D a (contiguous) "
                         f"or counts= with a 3-D a (masked)")
    if index is None and not masked:
        raise ValueError("a 2-D a needs offs=: int32 cumulative row ends, one per expert")
    if index is not None and not isinstance(index, torch.Tensor):
        raise TypeError(f"{iname} must be a torch.Tensor, got {type(index).__name__}")
    M, K, E = a.shape[-2], a.shape[-1], b.shape[0]
    if masked and a.shape[0] != E:
        raise ValueError(f"a is {tuple(a.shape)} but b has {E} experts: a masked a must be "
                         f"({E}, T, K), one block of T rows per expert")
    if b.shape[1] == K:
        weight = b.transpose(1, 2)
    elif b.shape[2] == K:
        weight = b
    else:
        raise ValueError(f"a has K={K} columns but b is {tuple(b.shape)}: b must be (E, K, N) "
                         f"or (E, N, K)")
    N = weight.shape[1]
    if not 1 <= E <= 256:
        raise ValueError(f"b has E={E} experts: the grouped kernel takes 1 to 256")
    if K % SCALE_BLOCK or K == 0:
        raise ValueError(f"K={K} is not a multiple of {SCALE_BLOCK}: the block scales cover "
                         f"1x{SCALE_BLOCK} of a and {SCALE_BLOCK}x{SCALE_BLOCK} of b along K; pad "
                         f"K with zeros to {_ceil_div(max(K, 1), SCALE_BLOCK) * SCALE_BLOCK}")
    if N % 8 or N == 0:
        raise ValueError(f"N={N} is not a positive multiple of 8: TMA needs 16-byte rows of out")
    if index is not None and (index.dtype != torch.int32 or index.dim() != 1
                              or index.shape[0] != E):
        raise ValueError(f"{iname} is {tuple(index.shape)} {index.dtype}, expected ({E},) "
                         f"torch.int32 (each expert's "
                         f"{'row count' if masked else 'cumulative row end'})")
    KB, NB = K // SCALE_BLOCK, _ceil_div(N, SCALE_BLOCK)
    sa_shape = (E, M, KB) if masked else (M, KB)
    for name, t, want in (("scale_a", scale_a, sa_shape), ("scale_b", scale_b, (E, NB, KB))):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} is {t.dtype}: block scales are torch.float32")
        if tuple(t.shape) != want:
            what = "one per row of a and 128 of K" if name == "scale_a" else \
                "one per expert, 128 rows of N and 128 of K"
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {want} ({what})")
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous: pass {name}.contiguous()")
    odt = torch.bfloat16 if out_dtype is None else out_dtype
    if str(odt).removeprefix("torch.") not in OUT_DTYPES:
        raise ValueError(f"out_dtype={out_dtype}: fp8 grouped_mm returns torch.bfloat16 or "
                         f"torch.float16")
    if not a.is_contiguous() or not weight.is_contiguous():
        raise ValueError("a and the (E, N, K) weights must be contiguous (K innermost): pass "
                         "a.contiguous(), and b as w.transpose(1, 2) of a contiguous w")
    out_shape = (E, M, N) if masked else (M, N)
    check_result_size(layout, M, N, E)
    if masked:
        check_masked_stride(M, K, 1)
    if out is not None and (tuple(out.shape) != out_shape or out.dtype != odt
                            or not out.is_contiguous()):
        raise ValueError(f"out is {tuple(out.shape)} {out.dtype}, expected {out_shape} {odt}, "
                         f"contiguous")
    if require_cuda:
        for name, t in (("a", a), ("b", b), (iname, index), ("scale_a", scale_a),
                        ("scale_b", scale_b), ("out", out)):
            if t is not None and (t.device.type != "cuda" or t.device != a.device):
                raise ValueError(f"{name} is on {t.device}: every operand on a's CUDA GPU")
    if torch.is_grad_enabled():
        for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b),
                        ("out", out)):
            if t is not None and t.requires_grad:
                raise ValueError(f"{name} requires grad but fp8 grouped_mm has no backward: call "
                                 f"it under torch.no_grad() or pass {name}.detach()")
    return layout, M, N, K, E, weight, odt


def check_fp8_data(layout, M, N, K, E, offs=None, counts=None, scale_a=None,
                   scale_b=None) -> None:
    """What ``TIRX_GEMM_CHECK=1`` adds before an fp8 launch (a sync; the caller skips it
    while a CUDA graph is captured): :func:`check_routing` on offs / counts, then every scale
    finite and > 0 (tirx_gemm.op.fp8.check_scales_finite), one-line ValueErrors."""
    from types import SimpleNamespace
    from tirx_gemm.op.fp8 import check_scales_finite
    check_routing(SimpleNamespace(M=M, E=E, K=K), offs, counts)
    check_scales_finite(scale_a, scale_b)


def clear_cache() -> None:
    """Forget the loaded grouped kernels, fp8 ones included (op/grouped_kernels.py's cache)."""
    GK.clear()


def grouped_mm_fp8(a, b, offs=None, *, scale_a=None, scale_b=None, out_dtype=None, out=None,
                   counts=None, layout=None, bias=None, scale=None, sync: bool = False):
    """The fp8 form of grouped_mm (module docstring): one launch, no host sync."""
    import torch
    layout, M, N, K, E, weight, odt = check_grouped_fp8(
        a, b, offs, scale_a, scale_b, out_dtype, out, counts=counts, layout=layout, bias=bias,
        scale=scale)
    arch, sm_count = _gpu(a.device)
    if arch != ARCH:
        raise ValueError(f"fp8 grouped_mm runs on sm_90a (Hopper) only: this GPU is {arch}; "
                         "sm_100a's v14 MXFP8 twin (SCALE='mx') is checked on NumSim only, "
                         "not served by grouped_mm yet")
    if checking() and not (torch.cuda.is_available()
                            and torch.cuda.is_current_stream_capturing()):
        check_fp8_data(layout, M, N, K, E, offs, counts, scale_a, scale_b)
    masked = layout == "masked"
    if out is None:
        out = torch.empty((E, M, N) if masked else (M, N), dtype=odt, device=a.device)
    if M == 0:
        return out
    rows = E * M if masked else M
    step_id, kw = choose_grouped_fp8(rows, E, N, K, str(odt).removeprefix("torch."), sm_count,
                                     layout=layout)
    kernel, label = _load(step_id, arch, N, K, kw)
    KB = K // SCALE_BLOCK
    if masked:
        routing = counts if counts is not None else torch.full(
            (E,), M, dtype=torch.int32, device=a.device)
    else:
        routing = offs
    kernel(a.view(torch.uint8), weight.view(torch.uint8), out, routing,
           scale_a.view(rows, KB), scale_b.view(E * _ceil_div(N, SCALE_BLOCK), KB))
    if sync:
        from tirx_gemm.op.matmul import synchronize
        synchronize(a.device, what=label)
    return out


def quantize_rows(x):
    """(x_q float8_e4m3fn (M, K), scale_a float32 (M, K/128)) of a real (M, K) tensor."""
    from tirx_gemm.op.fp8 import quantize
    return quantize(x, "block", "a")


def quantize_experts(w):
    """(w_q float8_e4m3fn (E, N, K), scale_b float32 (E, ceil(N/128), K/128)) of real (E, N, K)
    weights, each expert's 128x128 blocks scaled to e4m3's range."""
    import torch
    from tirx_gemm.op.fp8 import quantize
    qs = [quantize(w[e], "block", "b") for e in range(w.shape[0])]
    return (torch.stack([q for q, _ in qs]).contiguous(),
            torch.stack([s for _, s in qs]).contiguous())
