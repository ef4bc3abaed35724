"""``tirx_gemm.grouped_mm``: one GEMM per expert in one launch (step v14), in torch's conventions.

``grouped_mm(a, b, offs)`` is ``torch.nn.functional.grouped_mm(a, b, offs=offs)`` for fp16 and
bf16 CUDA tensors: a (M, K) holds the rows of every expert one after the other (sorted by
expert), ``offs`` (E,) int32 their cumulative ends (expert e owns rows ``offs[e-1]:offs[e]``,
``offs[-1]`` read as 0), and the result (M, N) holds ``a[rows of e] @ b[e]`` in each expert's
rows. The weights come as torch takes them, ``b`` (E, K, N), which for a model's stacked
weights is a transposed view of an (E, N, K) tensor (``w.transpose(1, 2)``): K-major
underneath, as the kernel reads it, so no copy. An (E, N, K) tensor (the Linear convention,
one ``out x in`` weight per expert) is taken too where its shape cannot be read as (E, K, N)
(with N == K it is read as torch reads it: pass ``w.transpose(1, 2)``). A ``b`` whose K is
not its innermost dimension in memory (an N-major (E, K, N), gpt-oss's layout) is copied
into K-major at every call: transpose it once (``w.transpose(1, 2).contiguous()``) and pass
the transposed view instead.

``grouped_mm(a, b, counts=counts, layout="masked")``: a (E, T, K), a fixed buffer of T rows
per expert (decode), ``counts`` (E,) int32 the rows each expert holds (rows ``0:counts[e]`` of
``a[e]``); the result (E, T, N). ``counts=None`` with a 3-D ``a`` is torch's batched form:
every row of every expert. Experts with no rows cost nothing.

Rows the call does not own -- a's rows at or past ``offs[-1]``, rows of ``a[e]`` at or past
``counts[e]`` -- are neither read into any result nor written: those rows of the result hold
whatever the fresh tensor (or ``out``) held, as in torch's grouped_mm. The kernel reads
``offs`` and ``counts`` on the GPU (no host sync, no ``.item()``), so a call is CUDA-graph
capturable and a replay follows new routing.

Epilogue arguments: ``bias`` (E, N) one row per expert, or (N,) shared, added to each
expert's rows; ``scale`` (M,) (masked: (E, T)) float32 or the operands' dtype, multiplying
each result row after the bias (a top-k routing weight on the down projection's rows);
``out_dtype`` None or the operands' dtype (torch's grouped_mm refuses float32 too). On
sm_90a v14 fuses bias and scale (:data:`KERNEL_EPILOGUE`, in fp32 before the one rounding;
on unless grouped_epilogue.ENABLED is set False); otherwise, or where the fused kernel
cannot be had, they are torch ops after the launch (tirx_gemm/op/grouped_epilogue.py; a
fused kernel neither the bundle holds nor TVM here builds warns once, naming its suite key).
SwiGLU over a gate/up weight: tirx_gemm/op/grouped_swiglu.py (fused too on sm_90a's wide
tiles). The routing is never read on the host.

The contract, checked before any launch, one line each: a, b tensors of one dtype (float16 or
bfloat16) on one CUDA GPU; a 2-D with ``offs`` or 3-D with ``counts``; b 3-D with a's K; E at
most :data:`E_MAX`; N and K multiples of 8; the result at most 2^31-1 elements (the stores'
int32 offsets: :func:`check_result_size`); offs and counts 1-D int32 of E elements on a's
device; a contiguous, every base address 16-byte aligned; a masked a's expert T*K*2 bytes under
2^31. An expert's weight may be any size (int64 tensor-map strides where needed: Grok-1's
6144 x 32768 experts).
What would need a sync is the caller's contract -- offs non-decreasing, ``0 <= offs[e] <= M``,
``0 <= counts[e] <= T`` -- and is checked too (a sync per call) with ``TIRX_GEMM_CHECK=1``
(skipped while a CUDA graph is being captured).

The kernel: :func:`choose_grouped` picks v14's tile from the tokens per expert, estimated on
the host as rows / E (narrow tiles at decode, wide at prefill), and :func:`explain_grouped`
says why. One kernel per (E, N, K, dtype, layout, tile) serves every M (M at run time), from
the build cache or a bundle; :func:`suite_builds` lists what a suite entry of kind "grouped"
needs (``tirx-gemm export --suite``: the kernels of every token count, as for dense entries;
its "epilogues" and "fp8" keys: the fused and the fp8 kernels too).
Importing this module imports neither torch nor TVM. The custom op
``torch.ops.tirx_gemm.grouped_mm`` and ``tirx_gemm.nn.Experts`` live in tirx_gemm/op/moe.py.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from tirx_gemm import epilogue as EPI
from tirx_gemm import registry, settings, spec, splitk
from tirx_gemm.kernels import dtype_kwargs
from tirx_gemm.numerics import DTYPES, check_dtype
from tirx_gemm.op import grouped_epilogue as GE
from tirx_gemm.op.grouped_kernels import gpu as _gpu, load as _load  # noqa: F401 (tests patch)
from tirx_gemm.op import grouped_kernels as GK
from tirx_gemm.op.grouped_kernels import ENTRY_KEYS  # noqa: F401 (suite_entry's keys)
from tirx_gemm.op.grouped_epilogue import swiglu_rows  # noqa: F401 (SwiGLU with torch ops)
from tirx_gemm.op.grouped_limits import (CHECK_ENV, check_masked_stride,  # noqa: F401
                                         check_result_size, check_routing, checking as _checking)
from tirx_gemm.op.keywords import NOMINAL_M, ROW_MULTIPLE, _ceil_div, _pool, dtype_name
from tirx_gemm.op.operands import (ALIGN_BYTES, check_dense, check_gate_up_experts,
                                   check_no_overlap, mark_gate_up)

__all__ = ["grouped_mm", "fuse_gate_up_experts", "choose_grouped", "explain_grouped",
           "grouped_variants", "suite_builds", "fused_call", "swiglu_plan", "check_grouped",
           "check_grouped_shapes", "check_result_size", "Problem", "GROUPED_STEP", "LAYOUTS",
           "E_MAX", "CHECK_ENV"]

GROUPED_STEP = "v14"
LAYOUTS = ("contiguous", "masked")
E_MAX = 256  # the experts one kernel takes (DeepSeek-V3's 256)
# the tile menu (v14's builder: BLK_M 64 | 128, BLK_N 8..256 by 8, SWAP_AB): at most
# DECODE_TOKENS tokens per expert, swap-AB -- the weight's rows are the MMA's M (BLK_M: 128
# where those tiles still give every SM DECODE_TALL_WAVES units, else 64), the expert's tokens
# its N in a token tile (BLK_N) of TOKEN_TILES holding twice the mean tokens per expert
# (skewed routing leaves hot experts above the mean); past it the wide 128x256 tile,
# 128x128 where N is under 256 or the wide tiles would not fill the SMs (64x256, finer token
# tiles for the last wave, lost at 7 of 8 cases timed: lab/moe_grouped_gemm)
DECODE_TOKENS = 64
TOKEN_TILES, TOKEN_TILE_SKEW = (8, 16, 32, 64), 2
DECODE_TALL_WAVES = 2
WIDE_TILE = (128, 256)
WIDE_SMALL_TILE = (128, 128)
# v14's last-wave K cut, on the contiguous plain 16-bit 128x256 tile where K >= TAIL_SPLIT_FROM_K
TAIL_SPLIT, TAIL_SPLIT_FROM_K = 4, 8192  # lab/moe_grouped_gemm, "The cut at deep K only"
KERNEL_EPILOGUE = frozenset(GE.FUSED_KEYWORDS)  # v14 sm_90a's epilogue keywords


# --------------------------------------------------------------------------------------
# the pick: v14's tile from the tokens per expert (no torch)
# --------------------------------------------------------------------------------------
def _check_experts_rows(E: int, N: int, K: int, whose: str) -> None:
    """E within E_MAX and N, K whole 16-byte rows (the pick's and the call's check)."""
    if E > E_MAX:
        raise ValueError(f"{whose}E={E} experts: the grouped kernel takes at most E_MAX={E_MAX}; "
                         f"split the experts into groups of at most {E_MAX}, one call each")
    for name, v in (("K", K), ("N", N)):
        if v % ROW_MULTIPLE:
            raise ValueError(f"{name}={v} is not a multiple of {ROW_MULTIPLE}: TMA needs 16-byte "
                             f"rows; pad {name} with zeros to {_ceil_div(v, 8) * 8}")


def _check_numbers(rows, E, N, K, dtype, layout, arch, sm_count) -> None:
    if arch not in spec.SM_COUNT:  # first: an unknown arch has no SM count to default to
        raise ValueError(f"arch={arch!r}: the grouped kernel runs on {' or '.join(spec.SM_COUNT)}")
    for name, v in (("rows", rows), ("E", E), ("N", N), ("K", K), ("sm_count", sm_count)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "rows" else 1):
            kind = "non-negative" if name == "rows" else "positive"
            raise ValueError(f"{name}={v!r} must be a {kind} int")
    _check_experts_rows(E, N, K, "")
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: choose {' or '.join(map(repr, LAYOUTS))}")
    check_dtype(dtype)


def _tile(rows: int, E: int, N: int, pool: int) -> tuple[dict, list[str]]:
    """(tile keywords, why lines) for ``rows`` rows over E experts of N columns."""
    per = rows / E
    active = max(1, min(E, rows))  # a row belongs to one expert: at most `rows` have work
    if per <= DECODE_TOKENS:
        tok = next((t for t in TOKEN_TILES if t >= TOKEN_TILE_SKEW * per), TOKEN_TILES[-1])
        tall = active * _ceil_div(N, 128) >= DECODE_TALL_WAVES * pool
        rows_w = 128 if tall else 64
        why = [f"{rows} rows over {E} experts: ~{per:.3g} tokens per expert <= "
               f"{DECODE_TOKENS}: swap-AB, the weight's rows the MMA's M, the tokens its N in "
               f"a {tok}-token tile (the first of {TOKEN_TILES} that holds {TOKEN_TILE_SKEW}x the "
               f"mean: hot experts sit above it)",
               f"up to {active} active experts x {_ceil_div(N, rows_w)} weight tiles of "
               f"{rows_w} rows" + (f" (128-row tiles give every one of {pool} SMs "
                                   f"{DECODE_TALL_WAVES} units or more)" if tall else
                                   f" (128-row tiles would give {pool} SMs fewer than "
                                   f"{DECODE_TALL_WAVES} units each)")]
        return {"BLK_M": rows_w, "BLK_N": tok, "SWAP_AB": True}, why
    wide = N >= WIDE_TILE[1]
    tiles = active * _ceil_div(int(per), WIDE_TILE[0]) * _ceil_div(N, WIDE_TILE[1])
    if wide and tiles >= pool:
        return ({"BLK_M": WIDE_TILE[0], "BLK_N": WIDE_TILE[1]},
                [f"~{per:.3g} tokens per expert > {DECODE_TOKENS}: the wide "
                 f"{WIDE_TILE[0]}x{WIDE_TILE[1]} tile (~{tiles} tiles fill {pool} SMs)"])
    reason = (f"N={N} < {WIDE_TILE[1]}" if not wide else
              f"~{tiles} {WIDE_TILE[0]}x{WIDE_TILE[1]} tiles < {pool} SMs")
    return ({"BLK_M": WIDE_SMALL_TILE[0], "BLK_N": WIDE_SMALL_TILE[1]},
            [f"~{per:.3g} tokens per expert > {DECODE_TOKENS}: the "
             f"{WIDE_SMALL_TILE[0]}x{WIDE_SMALL_TILE[1]} tile ({reason})"])


def choose_grouped(rows: int, E: int, N: int, K: int, dtype="float16",
                   layout: str = "contiguous", arch: str = "sm_90a",
                   sm_count: int | None = None, *, why: list | None = None) -> tuple[str, dict]:
    """``(step_id, builder keywords)`` of the grouped GEMM of ``rows`` rows (contiguous: a's
    rows; masked: E x the buffer's rows per expert) over E experts of N x K weights. The
    tokens per expert are estimated as rows / E (the routing stays on the GPU). ``why``: a
    list that gets the reasons (what :func:`explain_grouped` prints)."""
    dtype = dtype_name(dtype)
    sm_count = spec.SM_COUNT.get(arch, 0) if sm_count is None else sm_count
    _check_numbers(rows, E, N, K, dtype, layout, arch, sm_count)
    if layout == "masked":
        check_masked_stride(rows // E, K, 2)
    pool = _pool(sm_count)
    if arch == "sm_100a":  # the tcgen05 twin: 128 token rows, no swap-AB (NumSim only)
        wide = rows / E > DECODE_TOKENS and N >= WIDE_TILE[1]
        tile = {"BLK_N": WIDE_TILE[1] if wide else WIDE_SMALL_TILE[1]}
        why_n = ("the wide tile" if wide else
                 f"at most {DECODE_TOKENS} tokens per expert or N < {WIDE_TILE[1]}")
        lines = [f"sm_100a's twin: BLK_M is 128 (the tcgen05 tile), BLK_N {tile['BLK_N']} "
                 f"({why_n})"]
    else:
        tile, lines = _tile(rows, E, N, pool)
        if layout == "contiguous" and tile.get("BLK_N") == WIDE_TILE[1]:  # lab/moe_grouped_gemm
            tile["TMA_STORE"] = True
            lines.append("TMA_STORE: 64-row blocks inside their expert go out by TMA store "
                         "(faster than guarded stores at every 128x256 case timed: "
                         "lab/moe_grouped_gemm)")
        if TAIL_SPLIT > 1 and layout == "contiguous" and not tile.get("SWAP_AB") \
                and (tile["BLK_M"], tile["BLK_N"]) == WIDE_TILE and K >= TAIL_SPLIT_FROM_K \
                and _ceil_div(K, 64) >= splitk.TAIL_MIN_STEPS * TAIL_SPLIT:
            tile["TAIL_SPLIT"] = TAIL_SPLIT
            lines.append(f"TAIL_SPLIT={TAIL_SPLIT} (K={K} >= {TAIL_SPLIT_FROM_K}): the device cuts "
                         f"the last wave's tiles along K where that saves "
                         f"{1 / splitk.TAIL_MIN_GAIN:.0%} of the walk or more, per routing "
                         f"(measured on one H100: lab/moe_grouped_gemm)")
    if why is not None:
        why.extend(lines)
    return GROUPED_STEP, {**dtype_kwargs(dtype), "E": E, "LAYOUT": layout, **tile,
                          "SM_COUNT": pool, "RUNTIME_M": True}


def explain_grouped(rows: int, E: int, N: int, K: int, dtype="float16",
                    layout: str = "contiguous", arch: str = "sm_90a",
                    sm_count: int | None = None) -> str:
    """What :func:`choose_grouped` picks and why: the kernel on one line, then the reasons
    (and what the op applies with torch ops, the epilogues v14 does not fuse yet)."""
    why: list[str] = []
    step, kw = choose_grouped(rows, E, N, K, dtype, layout, arch, sm_count, why=why)
    keys = " ".join(f"{k}={v}" for k, v in kw.items() if k not in ("dtype", "RUNTIME_M"))
    head = (f"{rows} rows x {E} experts of {N}x{K} {dtype_name(dtype)}, {layout}, on {arch}: "
            f"{step} {keys} (M at run time: one kernel serves every token count)")
    names = sorted(KERNEL_EPILOGUE) + ["SWIGLU (grouped_swiglu.swiglu_mm" + (
        ", not on swap-AB tiles unless grouped_epilogue.SWAP_FUSED)" if kw.get("SWAP_AB") else ")")]
    fused = (", ".join(names) + ("" if GE.ENABLED else " (off: grouped_epilogue.ENABLED)")
             if arch in GE.FUSED_ARCHS else "none")
    tail = f"fused epilogues of {step} on {arch}: {fused}; the rest with torch ops after the launch"
    return "\n".join([head] + [f"  - {w}" for w in why] + [f"  - {tail}"])


def grouped_variants(E: int, N: int, K: int, top_k: int = 1, dtype="float16",
                     layout: str = "contiguous", arch: str = "sm_90a",
                     sm_count: int | None = None, max_tokens: int | None = 16384):
    """Every ``(step_id, kwargs, first tokens, last tokens)`` that :func:`choose_grouped`
    picks for a layer of E experts (N x K weights, ``top_k`` experts per token) over
    1 .. ``max_tokens`` tokens, in order: what a bundle needs to serve every token count.
    ``max_tokens=None``: up to where the pick stops changing (past DECODE_TOKENS per expert
    with the wide tile, N under its width, or sm_100a: tile counts only grow with the rows)
    or the first token count it refuses (a masked buffer past its size limit)."""
    out, t = [], 0
    while max_tokens is None or t < max_tokens:
        t += 1
        rows = t * top_k if layout == "contiguous" else E * t
        try:
            step, kw = choose_grouped(rows, E, N, K, dtype, layout, arch, sm_count)
        except ValueError:
            if max_tokens is not None or not out:
                raise
            break
        if out and out[-1][0] == step and out[-1][1] == kw:
            out[-1][3] = t
        else:
            out.append([step, kw, t, t])
        if max_tokens is None and rows / E > DECODE_TOKENS and (
                arch == "sm_100a" or N < WIDE_TILE[1] or kw["BLK_N"] == WIDE_TILE[1]):
            break
    return [tuple(v) for v in out]


def swiglu_plan(rows: int, E: int, N2: int, K: int, dtype: str, layout: str, arch: str,
                sm_count: int | None, gate_up: str):
    """(step, keywords with SWIGLU) of grouped_swiglu's fused launch for a gate/up of N2 = 2I
    rows per expert, or (None, why not) where the call runs unfused."""
    if gate_up not in GE.GATE_UP:
        raise ValueError(f"gate_up={gate_up!r}: choose {' or '.join(map(repr, GE.GATE_UP))}")
    if N2 % 16:
        raise ValueError(f"the gate/up weight has {N2} rows per expert: 2I with I a multiple "
                         f"of 8")
    step, kw = choose_grouped(rows, E, N2, K, dtype, layout, arch, sm_count)
    if arch not in GE.FUSED_ARCHS:
        return None, f"{arch}: SwiGLU is fused on {', '.join(GE.FUSED_ARCHS)} only"
    if kw.get("SWAP_AB") and not (GE.SWAP_FUSED and gate_up == "halves"):
        return None, "swap-AB tile (decode): grouped_mm, then SwiGLU with torch ops"
    kw = {k: v for k, v in kw.items() if k != "TMA_STORE"}  # SWIGLU stores N/2 columns guarded
    return step, {**kw, "SWIGLU": gate_up}


def fused_call(rows: int, E: int, N: int, K: int, dtype, layout: str, arch: str,
               sm_count: int | None, epilogue: dict):
    """(step, keywords) of the fused kernel the op looks up for a call of ``rows`` rows with
    ``epilogue`` (a suite entry's form, grouped_epilogue.suite_epilogue), or None where the op
    runs that call unfused on the plain kernel: the pick with grouped_epilogue.fused_keywords
    (a bias in the operands' dtype), or :func:`swiglu_plan` (N: the gate/up weight's 2I)."""
    from types import SimpleNamespace
    if "SWIGLU" in epilogue:
        step, kw = swiglu_plan(rows, E, N, K, dtype_name(dtype), layout, arch, sm_count,
                               epilogue["SWIGLU"])
        return None if step is None else (step, kw)
    step, kw = choose_grouped(rows, E, N, K, dtype, layout, arch, sm_count)
    like = SimpleNamespace(dtype=dtype_name(dtype))  # an operand in the operands' dtype
    fused = GE.fused_keywords(arch, dtype_name(dtype), like if epilogue.get("BIAS") else None,
                              like if epilogue.get("ROW_SCALE") else None)
    return (step, {**kw, **fused}) if fused else None


def suite_builds(entry: dict) -> list[tuple[str, tuple[int, int, int], dict]]:
    """The kernels a suite entry of kind "grouped" needs, each once: ``(step id, (M, N, K)
    to build, builder keywords)``; the entry checked by grouped_kernels.suite_entry (its keys
    there). Contiguous: rows = tokens x top_k; masked: a buffer of ``tokens`` rows per expert
    (any routing fits it), rows = E x tokens. Every kernel the pick makes at any token count
    is added (:func:`grouped_variants`; decode's swap-AB token tiles too), as for dense
    entries; ``"all_m": false`` keeps to the entry's own tokens. ``"epilogues"`` (the layer's
    fused calls: ``{"ROW_SCALE": true}``, ``{"BIAS": true}``, both, ``{"SWIGLU": "halves" |
    "interleaved"}`` with N the gate/up 2I) adds the fused kernel the op looks up for each at
    those token counts (:func:`fused_call`). ``"fp8": true``: e4m3 operands with block scales,
    "dtypes" the output dtypes: grouped_fp8's kernels instead (grouped_fp8.fp8_suite_builds)."""
    e = GK.suite_entry(entry)
    if e.fp8:
        from tirx_gemm.op.grouped_fp8 import fp8_suite_builds
        return fp8_suite_builds(e)
    out, seen = [], set()
    for dt in e.dtypes:
        try:
            ts = e.tokens if not e.all_m else sorted(set(e.tokens) | {v[2] for v in (
                grouped_variants(e.E, e.N, e.K, e.top_k, dt, e.layout, e.arch, e.sm_count,
                                 None))})
            # masked: a buffer of `tokens` rows per expert (what any routing fits), E of them
            rows = [t * e.top_k if e.layout == "contiguous" else e.E * t for t in ts]
            picks = [choose_grouped(r, e.E, e.N, e.K, dt, e.layout, e.arch, e.sm_count)
                     for r in rows]
            picks += [fused_call(r, e.E, e.N, e.K, dt, e.layout, e.arch, e.sm_count, epi)
                      for epi in e.epilogues for r in rows]
        except ValueError as exc:
            raise ValueError(f"{e.at}: {exc}") from None
        for step, kw in filter(None, picks):  # None: a call the op runs unfused
            key = (step, tuple(sorted(kw.items())))
            if key not in seen:
                seen.add(key)
                out.append((step, (NOMINAL_M, e.N, e.K), kw))
    return out


# --------------------------------------------------------------------------------------
# the checks of a call's tensors, one line each
# --------------------------------------------------------------------------------------
class Problem(NamedTuple):
    layout: str     # "contiguous" or "masked"
    M: int          # contiguous: a's rows; masked: the rows per expert of the buffer
    N: int
    K: int
    E: int
    dtype: str
    weight: object  # b as (E, N, K): K-major when copy is False
    copy: bool      # b's K is not innermost in memory: the call copies it
    out_shape: tuple


def _name(t) -> str | None:
    n = str(getattr(t, "dtype", "")).removeprefix("torch.")
    return n if n in DTYPES else None


def check_grouped_shapes(a, b, offs=None, counts=None, layout=None, bias=None, scale=None,
                         out_dtype=None) -> Problem:
    """The checks that need neither data nor a device (types, dtypes, ranks, shapes, the
    weights' orientation), each a one-line TypeError / ValueError: run by the eager call and
    by the custom op's fake implementation, so a traced model fails where an eager one would."""
    import torch
    named = [("a", a), ("b", b)] + [(n, t) for n, t in (("offs", offs), ("counts", counts),
                                                       ("bias", bias), ("scale", scale))
                                    if t is not None]
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor{'' if name in 'ab' else ' or None'},"
                            f" got {type(t).__name__}")
    check_dense(named)
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: choose {' or '.join(map(repr, LAYOUTS))} (or None:"
                         f" contiguous for a 2-D a, masked for a 3-D a)")
    if a.dim() not in (2, 3):
        raise ValueError(f"a must be 2-D (rows of every expert, with offs) or 3-D (E, T, K, with "
                         f"counts), got shape {tuple(a.shape)}")
    layout = layout or ("contiguous" if a.dim() == 2 else "masked")
    if layout == "contiguous":
        if a.dim() != 2:
            raise ValueError(f"layout='contiguous' takes a 2-D a (rows sorted by expert), got "
                             f"shape {tuple(a.shape)}; a 3-D a is layout='masked'")
        if counts is not None:
            raise ValueError("counts= goes with layout='masked' (a 3-D a); a 2-D a takes offs=")
        if offs is None:
            raise ValueError("a 2-D a needs offs=: an int32 tensor of each expert's cumulative "
                             "row end (torch's grouped_mm convention)")
    else:
        if a.dim() != 3:
            raise ValueError(f"layout='masked' takes a 3-D a (E, T, K), got shape "
                             f"{tuple(a.shape)}")
        if offs is not None:
            raise ValueError("offs= goes with a 2-D a (layout='contiguous'); a 3-D a takes "
                             "counts= (or none: every row)")
    if b.dim() != 3:
        raise ValueError(f"b must be 3-D, one weight per expert: (E, K, N) as torch's "
                         f"grouped_mm takes it, or (E, N, K); got shape {tuple(b.shape)}")
    if _name(a) is None:
        raise TypeError(f"a has dtype {a.dtype}: grouped_mm takes torch.float16 or "
                        f"torch.bfloat16")
    if b.dtype != a.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}: the operands must share one "
                        f"dtype (b.to(a.dtype))")
    K, E = a.shape[-1], b.shape[0]
    if b.shape[1] == K:
        weight = b.transpose(1, 2)  # torch's (E, K, N): its (E, N, K) view
    elif b.shape[2] == K:
        weight = b  # the Linear convention: (E, N, K)
    else:
        raise ValueError(f"a has K={K} columns but b is {tuple(b.shape)}: b must be (E, K, N) "
                         f"(torch's grouped_mm) or (E, N, K) (one out x in weight per expert)")
    N = weight.shape[1]
    if E < 1:
        raise ValueError("b has 0 experts")
    _check_experts_rows(E, N, K, "b has ")
    index = offs if offs is not None else counts
    if index is not None:
        name = "offs" if offs is not None else "counts"
        if index.dtype != torch.int32:
            raise TypeError(f"{name} is {index.dtype}: pass {name}.to(torch.int32) (int32, as "
                            f"torch's grouped_mm takes offs)")
        if index.dim() != 1 or index.shape[0] != E:
            raise ValueError(f"{name} has shape {tuple(index.shape)}, expected ({E},): one "
                             f"{'cumulative row end' if name == 'offs' else 'row count'} per "
                             f"expert (b has {E})")
    if layout == "masked" and a.shape[0] != E:
        raise ValueError(f"a is {tuple(a.shape)} but b has {E} experts: a masked a is (E, T, K)")
    M = a.shape[-2]
    out_shape = (M, N) if layout == "contiguous" else (E, M, N)
    check_result_size(layout, M, N, E)
    if layout == "masked":
        check_masked_stride(M, K, 2)
    if bias is not None:
        if _name(bias) is None and bias.dtype != torch.float32:
            raise TypeError(f"bias has dtype {bias.dtype}: take float16, bfloat16 or float32")
        if tuple(bias.shape) not in ((E, N), (N,)):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({E}, {N}) (one row "
                             f"per expert) or ({N},) (shared)")
    if scale is not None:
        want = (M,) if layout == "contiguous" else (E, M)
        if scale.dtype not in (torch.float32, a.dtype):
            raise TypeError(f"scale has dtype {scale.dtype}: take torch.float32 or {a.dtype}")
        if tuple(scale.shape) != want:
            raise ValueError(f"scale has shape {tuple(scale.shape)}, expected {want}: one "
                             f"weight per row of the result")
    if out_dtype is not None and out_dtype != a.dtype:
        raise ValueError(f"out_dtype={out_dtype}: the grouped kernel returns the operands' dtype "
                         f"({a.dtype}); pass None (float32 output is not built yet)")
    copy = not weight.is_contiguous()  # K-major (E, N, K) underneath: no copy
    return Problem(layout, M, N, K, E, _name(a), weight, copy, out_shape)


def check_grouped(a, b, offs=None, counts=None, layout=None, bias=None, scale=None,
                  out_dtype=None, out=None, *, require_cuda: bool = True) -> Problem:
    """Every check of a call that needs no sync (one line each): :func:`check_grouped_shapes`,
    then devices, layout in memory, alignment, ``out`` and autograd. ``require_cuda=False``
    skips the device checks (tests on CPU tensors)."""
    import torch
    p = check_grouped_shapes(a, b, offs, counts, layout, bias, scale, out_dtype)
    ops = [(n, t) for n, t in (("a", a), ("b", b), ("offs", offs), ("counts", counts),
                               ("bias", bias), ("scale", scale), ("out", out)) if t is not None]
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
        check_dense([("out", out)])
    if require_cuda:
        off = [n for n, t in ops if t.device.type != "cuda"]
        if off and not torch.cuda.is_available():
            raise ValueError(f"{', '.join(off)} on {ops[0][1].device} and this machine has no "
                             f"CUDA GPU: tirx_gemm.grouped_mm runs on an sm_90a GPU; here use "
                             f"torch.nn.functional.grouped_mm")
        if a.device.type != "cuda":
            raise ValueError(f"a is on {a.device}: grouped_mm runs on a CUDA GPU (a.cuda())")
    for n, t in ops:
        if t.device != a.device:
            raise ValueError(f"{n} is on {t.device} but a is on {a.device}: put every "
                             f"operand on one GPU ({n}.to(a.device))")
    if not a.is_contiguous():
        raise ValueError(f"a is not contiguous (strides {a.stride()}): pass a.contiguous()")
    for n, t in (("offs", offs), ("counts", counts), ("bias", bias), ("scale", scale)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{n} is not contiguous (strides {t.stride()}): pass "
                             f"{n}.contiguous()")
    if out is not None:
        if out.dtype != a.dtype or tuple(out.shape) != p.out_shape:
            raise ValueError(f"out is {tuple(out.shape)} {out.dtype}, expected {p.out_shape} "
                             f"{a.dtype}")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous: pass a fresh tensor")
    aligned = [("a", a), ("out", out)] + ([] if p.copy else [("b", p.weight)])
    for n, t in aligned:
        if t is not None and t.data_ptr() % ALIGN_BYTES:
            raise ValueError(f"{n}'s data pointer is not {ALIGN_BYTES}-byte aligned (a view at an "
                             f"odd offset?): TMA needs it; pass {n}.clone()")
    if out is not None:
        check_no_overlap(out, a=a, b=b, offs=offs, counts=counts, bias=bias, scale=scale)
    if torch.is_grad_enabled() and any(t.requires_grad for _, t in ops):
        raise ValueError("grouped_mm has no backward: call it under torch.no_grad() or "
                         "torch.inference_mode(), or pass detached tensors")
    return p


# --------------------------------------------------------------------------------------
# kernels: built here or read from a bundle (matmul's resolver), loaded once per process
# --------------------------------------------------------------------------------------
_lock = threading.Lock()  # guards _calls; the kernels' own cache is op/grouped_kernels.py's
_calls: dict = {}
_CALLS_MAX = 1 << 12


def clear_cache() -> None:
    """Forget the loaded grouped kernels and remembered calls (after changing the bundle)."""
    with _lock:
        _calls.clear()
    GK.clear()


def call_key(layout, out_dtype, grad: bool, a, b, offs, counts, bias, scale, out) -> tuple:
    """The remembered call's key: what decides whether a call is valid (shapes, dtypes,
    devices; strides of a, b and the routing; whether an operand needs a gradient while
    ``grad``), so that a call differing in any of those is checked again. Written out flat:
    it runs on every call (data pointers are read at every call)."""
    return (layout, out_dtype, grad and (a.requires_grad or b.requires_grad), a.shape,
            a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype, b.get_device(),
            offs if offs is None else (offs.shape, offs.stride(), offs.dtype, offs.get_device()),
            counts if counts is None else (counts.shape, counts.stride(), counts.dtype,
                                           counts.get_device()),
            bias if bias is None else (bias.shape, bias.dtype, bias.get_device(),
                                       grad and bias.requires_grad),
            scale if scale is None else (scale.shape, scale.dtype, scale.get_device(),
                                         grad and scale.requires_grad),
            out if out is None else (out.shape, out.dtype, out.get_device()))


def _index(p: Problem, offs, counts, a):
    """The offs / counts operand of the launch (masked with counts=None: every row)."""
    if p.layout == "contiguous":
        return offs
    if counts is not None:
        return counts
    import torch
    return torch.full((p.E,), p.M, dtype=torch.int32, device=a.device)


def _load_fused(step_id, arch, p: Problem, kwargs, bias, scale):
    """(kernel, label, fused keywords): the fused epilogue's kernel where it can be had, else
    the plain one (grouped_epilogue's module docstring)."""
    fused = GE.fused_keywords(arch, p.dtype, bias, scale) if GE.ENABLED else {}
    if fused:
        try:
            return (*_load(step_id, arch, p.N, p.K, {**kwargs, **fused}), fused)
        except (ValueError, RuntimeError) as exc:  # not in the bundle and no TVM here: unfused
            GK.warn_unfused(step_id, arch, p.N, p.K, {**kwargs, **fused}, fused, exc)
    return (*_load(step_id, arch, p.N, p.K, kwargs), {})


def grouped_mm(a, b, offs=None, *, counts=None, layout: str | None = None, bias=None,
               scale=None, out_dtype=None, out=None, sync: bool = False, scale_a=None,
               scale_b=None):
    """One GEMM per expert in one launch: ``torch.nn.functional.grouped_mm(a, b, offs=offs)``
    for 2-D ``a`` (rows sorted by expert, ``offs`` int32 cumulative ends), or the masked
    layout (3-D ``a`` (E, T, K), ``counts`` int32 rows per expert). ``b``: (E, K, N) as torch
    takes it (a transposed view of stacked (E, N, K) weights: no copy) or (E, N, K). ``bias``
    (E, N) or (N,), ``scale`` one value per result row, ``out_dtype`` None or a's dtype,
    ``out`` a tensor to write into. Asynchronous like every torch op (``sync=True`` waits
    through the hang guard). See the module docstring for the contract and the checks.
    float8_e4m3fn a, b with block scales ``scale_a``, ``scale_b``: tirx_gemm/op/grouped_fp8.py."""
    import torch
    if scale_a is not None or scale_b is not None or "float8" in str(getattr(a, "dtype", "")):
        from tirx_gemm.op.grouped_fp8 import grouped_mm_fp8
        return grouped_mm_fp8(a, b, offs, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype,
                              out=out, counts=counts, layout=layout, bias=bias, scale=scale,
                              sync=sync)
    key = None
    try:
        key = call_key(layout, out_dtype, torch.is_grad_enabled(), a, b, offs, counts, bias,
                       scale, out)
        call = _calls.get(key)
    except (AttributeError, TypeError, RuntimeError):
        call = None
    checking = _checking()
    if call is not None and not checking and not (a.data_ptr() | b.data_ptr() | (
            0 if out is None else out.data_ptr())) & (ALIGN_BYTES - 1):
        p = call[1]
    else:
        p = check_grouped(a, b, offs, counts, layout, bias, scale, out_dtype, out)
        call = None
    if checking and not torch.cuda.is_current_stream_capturing():
        check_routing(p, offs, counts)
    if out is None:
        out = a.new_empty(p.out_shape)
    elif call is not None:
        check_no_overlap(out, a=a, b=b, offs=offs, counts=counts, bias=bias, scale=scale)
    if p.M == 0 or out.numel() == 0:
        return out
    if call is None:
        arch, sm_count = _gpu(a.device)
        rows = p.M if p.layout == "contiguous" else p.E * p.M
        step_id, kwargs = choose_grouped(rows, p.E, p.N, p.K, p.dtype, p.layout, arch, sm_count)
        kernel, label, fused = _load_fused(step_id, arch, p, kwargs, bias, scale)
        call = (kernel, p, label, fused,
                GK.workspace(step_id, arch, p.N, p.K, {**kwargs, **fused}, a.device))
        if key is not None and a.is_cuda:
            if len(_calls) >= _CALLS_MAX:
                _calls.clear()
            _calls[key] = call
    kernel, _, label, fused, ws = call
    weight = b.transpose(1, 2) if b.shape[1] == p.K else b
    if p.copy or not weight.is_contiguous():
        weight = weight.contiguous()  # an N-major b: copied at every call (module docstring)
    try:
        kernel(a, weight, out, _index(p, offs, counts, a),
               *GE.kernel_operands(p, fused, bias, scale),
               *(ws if ws.__class__ is tuple else ws.get()))
    except Exception as exc:  # the kernel's host code refused an operand: say which
        check_grouped(a, b, offs, counts, layout, bias, scale, out_dtype, out)
        from tirx_gemm.run.errors import KernelLaunchError
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise KernelLaunchError(f"launching {label} failed: {first}") from exc
    GE.torch_epilogue(p, out, offs, bias, scale, fused)
    if sync:
        from tirx_gemm.op.matmul import synchronize
        synchronize(a.device, what=label)
    return out


# --------------------------------------------------------------------------------------
# SwiGLU over stacked gate/up weights (fuse_gate_up's layout rule, per expert)
# --------------------------------------------------------------------------------------
def fuse_gate_up_experts(w_gate, w_up):
    """The fused gate/up weight of E experts: w_gate and w_up (E, N, K) each, interleaved per
    expert in groups of 8 rows as tirx_gemm.matmul.fuse_gate_up does for one weight (gate
    0-7, up 0-7, gate 8-15, ...): a new contiguous (E, 2N, K) tensor for
    :func:`grouped_swiglu`. A checkpoint's concatenated ``gate_up_proj`` (E, 2N, K) splits as
    ``w.chunk(2, dim=1)``. Do it once per model (it copies both)."""
    import torch
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
        if w.dim() != 3:
            raise ValueError(f"{name} must be 3-D (E, N, K), got shape {tuple(w.shape)}")
    if w_gate.shape != w_up.shape or w_gate.dtype != w_up.dtype or \
            w_gate.device != w_up.device:
        raise ValueError(f"w_gate ({tuple(w_gate.shape)}, {w_gate.dtype}) and w_up "
                         f"({tuple(w_up.shape)}, {w_up.dtype}) must share shape, dtype, device")
    E, N, K = w_gate.shape
    EPI.check_swiglu_n(N)
    G = EPI.SWIGLU_GROUP
    return mark_gate_up(torch.stack((w_gate.reshape(E, N // G, G, K),  # for grouped_swiglu
                                     w_up.reshape(E, N // G, G, K)), dim=2).reshape(E, 2 * N, K)
                        .contiguous())
