"""Inputs, reference and the compare rules, in numpy: the one home of every numerics rule.

The GPU runner (torch tensors on the device) and the CPU simulation (NumSim, numpy
arrays, no torch) check a kernel's output with the same rules, defined once here, for
both operand dtypes (:data:`DTYPES`: the output has the input dtype, accumulation is fp32):

- dtypes: float16 (numpy ``float16``, 11 significant bits, unit roundoff u = 2**-11) and
  bfloat16 (``ml_dtypes.bfloat16``, 8 significant bits, u = 2**-8). :func:`tolerances`
  derives every tolerance from u, scaled so that float16 keeps its 1e-3 of old (bfloat16:
  8e-3); nothing else in the package defines a tolerance.
- inputs: "random" is randn * K**-0.25 rounded to the dtype, so each output element has
  rms ~1 whatever K; "int" is small integers uniform in :func:`int_range` (float16
  [-2, 2], bfloat16 [-1, 1]): the fp32-accumulated result is an integer, exact while
  |partial sums| < 2**24 (:func:`check_int_k`), and checked for exact equality.
- the output is poisoned with NaN before the kernel runs, so an unwritten element fails.
- reference: A @ B.T in fp32 (:func:`reference_np`); :func:`round_to` rounds it to the
  output dtype (round to nearest even, as the kernel's conversion does).
- compare: any NaN/Inf fails; "exact" wants every element equal to the reference rounded to
  the output dtype; otherwise every element must satisfy |out-ref| <= atol + rtol*|ref|
  (atol = atol_scale * rms(ref)) and the relative Frobenius error must be <= max_rel_err.

Why these numbers (u = unit roundoff of the output dtype)
--------------------------------------------------------
The kernel accumulates in fp32 and rounds once to the output dtype, so the output rounding
alone gives a relative Frobenius error of about u/sqrt(3) (float16 2.8e-4, 2.1e-4 measured
on an H200 at 4096^3; bfloat16 2.3e-3).

* ``max_rel_err = 2.048u`` (float16 1e-3, bfloat16 8e-3): ~3.5x the rounding floor. A kernel
  that accumulated in the 2-byte dtype instead of fp32 lands at ~u*sqrt(K/2) (float16
  2.8e-3 at K=64, 2.2e-2 at K=4096; bfloat16 eight times that) and fails, as does any
  dropped K tile or wrong tile.
* elementwise ``rtol = 2.048u`` (~2u: one rounding, at most u*|ref|, plus slack for another
  fp32 summation order) and ``atol = 2.048u * rms(ref)`` (for results near zero, where a
  relative bound is meaningless; scale-aware so it holds for any input scale).
* exact mode (small-integer inputs): integer products summed in fp32 are exact while
  |partial sums| < 2**24 whatever the summation order, and the single final rounding (round
  to nearest even) is the same in the kernel and here, so the comparison is exact for any
  K within :func:`check_int_k`. With p significant bits every integer up to 2**p is
  representable, so no rounding happens at all while |result| <= 2**p: float16 (p=11)
  |result| <= 2048, guaranteed by entries in [-2, 2] for K <= 512; bfloat16 (p=8)
  |result| <= 256, guaranteed by the narrower entries [-1, 1] for K <= 256
  (:func:`exact_k`). Beyond that bound the result is rounded once, identically on both
  sides, so the check stays exact (but a difference below one ulp of a large result could
  hide in the rounding: the random check's tolerance covers those K).

Importing this module needs numpy only (``ml_dtypes`` is imported for bfloat16 arrays).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tirx_gemm import spec

DTYPES = spec.DTYPES  # operand and output dtypes; both are 2 bytes
DEFAULT_DTYPE = spec.DEFAULT_DTYPE
# unit roundoff u = 2**-p of a dtype with p significant bits (the implicit one included)
SIGNIFICANT_BITS = {"float16": 11, "bfloat16": 8}
UNIT_ROUNDOFF = {d: 2.0 ** -p for d, p in SIGNIFICANT_BITS.items()}
# every tolerance is TOL_PER_U * u: float16 keeps exactly the 1e-3 it always had
TOL_PER_U = 1e-3 / UNIT_ROUNDOFF["float16"]  # 2.048

# float16's tolerances (the defaults of callers that do not name a dtype)
DEFAULT_MAX_REL_ERR = 1e-3
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL_SCALE = 1e-3  # atol = DEFAULT_ATOL_SCALE * rms(ref)

# small-integer inputs: entries in INT_RANGE[dtype]; INT_LOW, INT_HIGH are float16's
INT_RANGE = {"float16": (-2, 2), "bfloat16": (-1, 1)}
INT_LOW, INT_HIGH = INT_RANGE["float16"]
INPUT_KINDS = ("random", "int")


def check_dtype(dtype: str) -> str:
    """``dtype`` if it is one of DTYPES, else a ValueError naming the choices."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported: choose one of {', '.join(DTYPES)}")
    return dtype


def np_dtype(dtype: str):
    """The numpy dtype of ``dtype``: np.float16, or ml_dtypes.bfloat16."""
    if check_dtype(dtype) == "bfloat16":
        import ml_dtypes  # noqa: PLC0415  (lazy: float16 needs numpy only)
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float16)


@dataclasses.dataclass(frozen=True)
class Tolerances:
    rtol: float         # elementwise |out-ref| <= atol + rtol*|ref|
    atol_scale: float   # atol = atol_scale * rms(ref)
    max_rel_err: float  # relative Frobenius error bound


def tolerances(dtype: str = DEFAULT_DTYPE) -> Tolerances:
    """The compare tolerances of an output dtype, each TOL_PER_U * u (module docstring):
    float16 1e-3, bfloat16 8e-3."""
    scale = UNIT_ROUNDOFF[check_dtype(dtype)] / UNIT_ROUNDOFF["float16"]  # 1 or 8, exact
    return Tolerances(DEFAULT_RTOL * scale, DEFAULT_ATOL_SCALE * scale,
                      DEFAULT_MAX_REL_ERR * scale)


def random_scale(K: int) -> float:
    """Scale of the "random" inputs: each output element then has rms ~1 whatever K."""
    return float(K) ** -0.25


def int_range(dtype: str = DEFAULT_DTYPE) -> tuple[int, int]:
    """(low, high) of the small-integer inputs in ``dtype``."""
    return INT_RANGE[check_dtype(dtype)]


def exact_k(dtype: str = DEFAULT_DTYPE) -> int:
    """The largest K whose small-integer results are representable in ``dtype`` whatever
    the inputs (|result| <= K*max|entry|**2 <= 2**p): float16 512, bfloat16 256."""
    lo, hi = int_range(dtype)
    return 2 ** SIGNIFICANT_BITS[dtype] // max(abs(lo), abs(hi)) ** 2


def check_int_k(K: int, dtype: str = DEFAULT_DTYPE) -> None:
    """Refuse a K whose small-integer partial sums could leave fp32's exact integers."""
    lo, hi = int_range(dtype)
    peak = max(abs(lo), abs(hi)) ** 2
    if peak * K >= 2 ** 24:
        raise ValueError(f"K={K} too large for an exact integer check in {dtype} (needs "
                         f"{peak}*K < 2**24)")


def make_inputs_np(M: int, N: int, K: int, kind: str, seed: int, dtype: str = DEFAULT_DTYPE):
    """(A, B, D) as numpy arrays of ``dtype``: A (MxK) and B (NxK) per ``kind``, D (MxN)
    all NaN. float16 inputs are the same for a seed as they always were."""
    dt = np_dtype(dtype)
    rng = np.random.default_rng(int(seed))
    if kind == "random":
        s = random_scale(K)
        A = (rng.standard_normal((M, K), dtype=np.float32) * s).astype(dt)
        B = (rng.standard_normal((N, K), dtype=np.float32) * s).astype(dt)
    elif kind == "int":
        check_int_k(K, dtype)
        lo, hi = int_range(dtype)
        A = rng.integers(lo, hi + 1, (M, K)).astype(dt)
        B = rng.integers(lo, hi + 1, (N, K)).astype(dt)
    else:
        raise ValueError(f"kind={kind!r} must be one of {INPUT_KINDS}")
    D = np.full((M, N), np.nan, dtype=dt)
    return A, B, D


def reference_np(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """fp32 reference A @ B.T (fp32 products and sums, as the tensor cores accumulate); the
    comparison rounds it to the output dtype where it needs to (:func:`round_to`)."""
    return A.astype(np.float32) @ B.astype(np.float32).T


def round_to(x: np.ndarray, dtype: str = DEFAULT_DTYPE) -> np.ndarray:
    """``x`` rounded to ``dtype`` (round to nearest even), returned as float32."""
    return np.asarray(x, dtype=np.float32).astype(np_dtype(dtype)).astype(np.float32)


@dataclasses.dataclass
class CompareResult:
    ok: bool
    exact: bool
    rel_frobenius_error: float
    max_abs_error: float
    n_nan: int
    n_inf: int
    n_mismatch: int  # elements failing the elementwise test, NaN/Inf included
    n_total: int
    first_mismatches: list  # [(row, col, got, want), ...] in row-major order
    rtol: float
    atol: float
    max_rel_err: float | None
    reason: str  # "" when ok, else why it failed
    dtype: str = DEFAULT_DTYPE  # the output dtype the tolerances were derived from

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["first_mismatches"] = [list(m) for m in self.first_mismatches]
        return d

    def summary(self) -> str:
        head = "ok" if self.ok else f"FAILED ({self.reason})"
        s = (f"{head}: rel_err={self.rel_frobenius_error:.3g} max_abs={self.max_abs_error:.3g} "
             f"mismatches={self.n_mismatch}/{self.n_total} nan={self.n_nan} inf={self.n_inf}")
        if self.first_mismatches:
            shown = ", ".join(f"D[{r},{c}]={g!r} want {w!r}" for r, c, g, w in
                              self.first_mismatches)
            s += f"; first: {shown}"
        return s

    __str__ = summary


FROM_DTYPE = "from dtype"  # compare_np's max_rel_err default: tolerances(dtype)


def compare_np(out: np.ndarray, ref: np.ndarray, *, dtype: str = DEFAULT_DTYPE,
               exact: bool = False, rtol: float | None = None, atol: float | None = None,
               max_rel_err: float | None | str = FROM_DTYPE,
               n_show: int = 5) -> CompareResult:
    """Compare a kernel output of ``dtype`` with the fp32 reference (the rules in the
    module docstring). ``rtol``, ``atol`` and ``max_rel_err`` default to
    ``tolerances(dtype)``; ``max_rel_err=None`` skips the Frobenius bound. ``out`` may be
    float32 (NumSim hands bfloat16 back widened); a 2-byte ``out`` must be of ``dtype``."""
    tol = tolerances(dtype)
    out = np.asarray(out)
    ref = np.asarray(ref)
    if out.dtype.name in DTYPES and out.dtype.name != dtype:
        raise ValueError(f"out has dtype {out.dtype.name} but is compared as {dtype}")
    if out.shape != ref.shape:
        raise ValueError(f"out has shape {out.shape} but ref has {ref.shape}")
    if isinstance(max_rel_err, str):
        if max_rel_err != FROM_DTYPE:
            raise ValueError(f"max_rel_err={max_rel_err!r}: a number, None or {FROM_DTYPE!r}")
        max_rel_err = tol.max_rel_err
    o = out.astype(np.float32)
    r = ref.astype(np.float32)
    n_total = int(o.size)
    n_nan = int(np.isnan(o).sum())
    n_inf = int(np.isinf(o).sum())

    # norms in fp64 so the error of a large matrix is not lost in the sum
    with np.errstate(invalid="ignore", over="ignore"):
        diff = o - r
        ref_norm = float(np.linalg.norm(r.ravel().astype(np.float64)))
        diff_norm = float(np.linalg.norm(diff.ravel().astype(np.float64)))
    if ref_norm > 0:
        rel = diff_norm / ref_norm
    else:
        rel = 0.0 if diff_norm == 0 else math.inf
    finite = np.isfinite(diff)
    max_abs = float(np.abs(diff[finite]).max()) if finite.any() else math.nan
    if n_nan or n_inf:
        max_abs = math.nan if n_nan else math.inf

    with np.errstate(invalid="ignore"):
        if exact:
            want = round_to(r, dtype)
            bad = ~(o == want)  # NaN != anything, so poisoned elements count
            used_rtol, used_atol = 0.0, 0.0
            display_want = want
        else:
            rms = ref_norm / math.sqrt(n_total) if n_total else 0.0
            used_atol = float(atol) if atol is not None else tol.atol_scale * rms
            used_rtol = float(rtol) if rtol is not None else tol.rtol
            bad = ~(np.abs(diff) <= used_atol + used_rtol * np.abs(r))
            display_want = r
    n_mismatch = int(bad.sum())

    first = []
    if n_mismatch and n_show > 0:
        ncols = o.shape[-1] if o.ndim >= 2 else 1
        flat_idx = np.flatnonzero(bad.reshape(-1))[:n_show].tolist()
        o_flat, w_flat = o.reshape(-1), display_want.reshape(-1)
        for i in flat_idx:
            first.append((i // ncols, i % ncols, float(o_flat[i]), float(w_flat[i])))

    reasons = []
    if n_nan:
        reasons.append(f"{n_nan} NaN (unwritten or invalid) elements")
    if n_inf:
        reasons.append(f"{n_inf} Inf elements")
    if n_mismatch:
        what = f"not exactly equal to the {dtype}-rounded reference" if exact else (
            f"outside |out-ref| <= {used_atol:.3g} + {used_rtol:.3g}*|ref|")
        reasons.append(f"{n_mismatch} of {n_total} elements {what}")
    if not exact and max_rel_err is not None and not (rel <= max_rel_err):
        reasons.append(f"relative Frobenius error {rel:.3g} > {max_rel_err:.3g}")
    return CompareResult(
        ok=not reasons, exact=exact, rel_frobenius_error=rel, max_abs_error=max_abs,
        n_nan=n_nan, n_inf=n_inf, n_mismatch=n_mismatch, n_total=n_total,
        first_mismatches=first, rtol=used_rtol, atol=used_atol,
        max_rel_err=None if exact else max_rel_err, reason="; ".join(reasons), dtype=dtype,
    )


# --------------------------------------------------------------------------------------
# fp8 (e4m3) operands, v13: inputs, scales, the dequantized reference, the tolerances
# --------------------------------------------------------------------------------------
# e4m3 (``float8_e4m3fn``: 4 exponent bits, 3 mantissa bits, no infinities) holds
# |x| <= 448. An operand is stored as A_q = e4m3(A / scale), and the GEMM computes
# D = dequant(A_q) @ dequant(B_q).T, dequant multiplying each element by its scale:
#   "tensor": one scale per operand, shapes (1,), (1,);
#   "row":    scale_a (M,) per row of A, scale_b (N,) per row of B (column of D);
#   "block":  scale_a (M, ceil(K/128)) per 1x128 block of A, scale_b (ceil(N/128),
#             ceil(K/128)) per 128x128 block of B (DeepGEMM's and DeepSeek-V3's layout).
# The reference is the fp32 product of the dequantized inputs -- the same quantized values
# the kernel reads -- so input quantization is no part of the compared error.
#
# Tolerances (fp8_tolerances): the kernel's error against that reference has two sources.
# (1) the output's rounding to bf16 / fp16, exactly as for the 16-bit steps: tolerances(
# out dtype) covers it. (2) the fp8 tensor core's accumulator, which keeps about 14
# significant bits (FP8_ACC_BITS; measured by the DeepSeek-V3 report, arXiv 2412.19437,
# not documented by NVIDIA). Summed over S products whose running sum grows like
# sqrt(k) * sigma, a loss of up to 2**-14 of the running value per k32 wgmma adds up to
# about 2**-14 * (2/3) * S/32 of the final rms (sum of sqrt(i) ~ (2/3) n**1.5); we allow
# 2**-14 * S/32 (the 2/3 dropped: 1.5x slack), with S = K unpromoted, or the promotion
# interval's 32 * PROMOTE products (the fp32 adds of the promotion are exact to 2**-24).
# lab/fp8_on_hopper/fp8_promotion_error.py's emulation gives 3.2e-3 at K=4096 unpromoted (the
# bound: 7.8e-3) and 1.2e-4 at PROMOTE=4 (the bound: 2.4e-4). The allowance is added to
# rtol, atol_scale and max_rel_err.
# The unpromoted (promote=0, fast accumulation) allowance is the emulation's bound only:
# the H200 refuted it (lab/fp8_on_hopper/records/fp8_h200_1.jsonl: at K >= 2064 a few
# elements per million fell outside it, e.g. 37 of 16.7M at 4096^3, where the promoted
# runs of the same shapes all passed). The 14-bit truncation model underestimates that
# accumulator's error, so lab/fp8_on_hopper/fp8_h200.py records fast accumulation's error
# without judging it; the promoted allowance held on every H200 check.
E4M3_MAX = 448.0
FP8_SCALES = ("tensor", "row", "block")
FP8_BLOCK = 128          # the block of "block" scaling, along K (and N for B)
FP8_WGMMA_K = 32         # products summed by one fp8 wgmma
FP8_ACC_BITS = 14        # significant bits the fp8 tensor core's accumulator keeps (measured)


def check_fp8_scale(scale: str) -> str:
    if scale not in FP8_SCALES:
        raise ValueError(f"scale={scale!r} is not an fp8 scaling: choose one of "
                         f"{', '.join(FP8_SCALES)}")
    return scale


def fp8_scale_shapes(scale: str, M: int, N: int, K: int):
    """(shape of scale_a, shape of scale_b) of a scaling mode (fp32 tensors)."""
    check_fp8_scale(scale)
    if scale == "tensor":
        return (1,), (1,)
    if scale == "row":
        return (M,), (N,)
    kb = -(-K // FP8_BLOCK)
    return (M, kb), (-(-N // FP8_BLOCK), kb)


def _e4m3():
    import ml_dtypes  # noqa: PLC0415
    return np.dtype(ml_dtypes.float8_e4m3fn)


def _block_amax(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """max |x| over each rows x cols block (the last blocks may be partial)."""
    R, C = x.shape
    pr, pc = -(-R // rows) * rows, -(-C // cols) * cols
    p = np.zeros((pr, pc), np.float32)
    p[:R, :C] = np.abs(x)
    return p.reshape(pr // rows, rows, pc // cols, cols).max(axis=(1, 3))


def quantize_fp8_np(x: np.ndarray, scale: str, operand: str):
    """(x_q as float8_e4m3fn, scales fp32) for operand "a" (M x K) or "b" (N x K) of a
    scaling mode: each scale = amax of its group / 448 (1 for an all-zero group)."""
    check_fp8_scale(scale)
    if operand not in ("a", "b"):
        raise ValueError(f"operand={operand!r} must be 'a' or 'b'")
    x = np.asarray(x, np.float32)
    if scale == "tensor":
        amax = np.array([np.abs(x).max()], np.float32)
    elif scale == "row":
        amax = np.abs(x).max(axis=1).astype(np.float32)
    else:
        rows = 1 if operand == "a" else FP8_BLOCK
        amax = _block_amax(x, rows, FP8_BLOCK)
    s = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
    q = (x / expand_fp8_scale(s, scale, operand, x.shape)).astype(_e4m3())
    return q, s


def expand_fp8_scale(s: np.ndarray, scale: str, operand: str, shape) -> np.ndarray:
    """The scales of an operand of ``shape`` (rows x K) broadcast to one per element."""
    R, K = shape
    if scale == "tensor":
        return np.full((R, K), s.reshape(-1)[0], np.float32)
    if scale == "row":
        return np.repeat(s.reshape(R, 1), K, axis=1).astype(np.float32)
    rows = 1 if operand == "a" else FP8_BLOCK
    e = np.repeat(np.repeat(s, rows, axis=0), FP8_BLOCK, axis=1)
    return e[:R, :K].astype(np.float32)


def make_fp8_inputs_np(M: int, N: int, K: int, scale: str, seed: int,
                       out_dtype: str = "bfloat16"):
    """(A_q, B_q, scale_a, scale_b, D): A_q (M x K) and B_q (N x K) float8_e4m3fn, the
    fp32 scales of ``scale``, D (M x N) of ``out_dtype`` filled with NaN. The real values
    are randn * K**-0.25 with each row of A and B multiplied by 2**u, u uniform in
    [-4, 4] (so per-row and per-block scales differ from the per-tensor one), then
    quantized (quantize_fp8_np)."""
    check_dtype(out_dtype)
    rng = np.random.default_rng(seed)
    s = random_scale(K)
    A = rng.standard_normal((M, K), dtype=np.float32) * s
    B = rng.standard_normal((N, K), dtype=np.float32) * s
    A *= np.exp2(rng.uniform(-4, 4, (M, 1))).astype(np.float32)
    B *= np.exp2(rng.uniform(-4, 4, (N, 1))).astype(np.float32)
    Aq, sa = quantize_fp8_np(A, scale, "a")
    Bq, sb = quantize_fp8_np(B, scale, "b")
    D = np.full((M, N), np.nan, dtype=np_dtype(out_dtype))
    return Aq, Bq, sa, sb, D


def reference_fp8_np(Aq: np.ndarray, Bq: np.ndarray, sa: np.ndarray, sb: np.ndarray,
                     scale: str) -> np.ndarray:
    """The fp32 reference: dequant(A_q) @ dequant(B_q).T (products of the values the
    kernel reads, summed in fp32)."""
    A = Aq.astype(np.float32) * expand_fp8_scale(np.asarray(sa, np.float32), scale, "a",
                                                 Aq.shape)
    B = Bq.astype(np.float32) * expand_fp8_scale(np.asarray(sb, np.float32), scale, "b",
                                                 Bq.shape)
    return (A @ B.T).astype(np.float32)


def fp8_accumulation_allowance(K: int, promote: int) -> float:
    """The relative error allowed for the fp8 tensor core's limited accumulator (see the
    block comment above): 2**-FP8_ACC_BITS * S / 32, S = K (promote 0) or
    min(K, 32 * promote)."""
    if isinstance(promote, bool) or not isinstance(promote, int) or promote < 0:
        raise ValueError(f"promote={promote!r} must be an int >= 0 (k32 wgmmas per "
                         f"promotion, 0 = never)")
    span = K if promote == 0 else min(K, FP8_WGMMA_K * promote)
    return 2.0 ** -FP8_ACC_BITS * span / FP8_WGMMA_K


def fp8_tolerances(out_dtype: str, K: int, promote: int) -> Tolerances:
    """tolerances(out_dtype) plus fp8_accumulation_allowance(K, promote) on each bound."""
    t = tolerances(out_dtype)
    extra = fp8_accumulation_allowance(K, promote)
    return Tolerances(t.rtol + extra, t.atol_scale + extra, t.max_rel_err + extra)


def compare_fp8_np(out: np.ndarray, ref: np.ndarray, *, out_dtype: str, K: int,
                   promote: int) -> CompareResult:
    """compare_np with fp8_tolerances (atol = atol_scale * rms(ref))."""
    t = fp8_tolerances(out_dtype, K, promote)
    r = np.asarray(ref, np.float32)
    rms = float(np.linalg.norm(r.ravel().astype(np.float64))) / math.sqrt(max(r.size, 1))
    return compare_np(out, ref, dtype=out_dtype, rtol=t.rtol, atol=t.atol_scale * rms,
                      max_rel_err=t.max_rel_err)


def fp8_promote(kwargs: dict | None) -> int:
    """The PROMOTE of a v13 build with these keywords: its own, else the builder's default,
    4 in every SCALE mode (the accurate one: "block" needs it, and the H200 measured the
    unpromoted sum outside the tolerance at deep K; PROMOTE=0 is the opt-in fast mode)."""
    kw = kwargs or {}
    if kw.get("PROMOTE") is not None:
        return kw["PROMOTE"]
    return 4


def fp8_bytes_np(x: np.ndarray) -> np.ndarray:
    """The uint8 bit patterns of a float8_e4m3fn array: how v13's kernels take A and B."""
    x = np.asarray(x)
    if x.dtype != _e4m3():
        raise TypeError(f"fp8_bytes_np takes a float8_e4m3fn array, got {x.dtype}: quantize "
                        f"it first (quantize_fp8_np)")
    return x.view(np.uint8)


def fp8_from_bytes_np(b: np.ndarray) -> np.ndarray:
    """The float8_e4m3fn array whose bit patterns are the uint8 array ``b`` (a v13 operand)."""
    b = np.asarray(b)
    if b.dtype != np.uint8:
        raise TypeError(f"fp8_from_bytes_np takes the uint8 bit patterns of e4m3 values, got "
                        f"{b.dtype}")
    return b.view(_e4m3())


# --------------------------------------------------------------------------------------
# MXFP8 (sm_100a v13 SCALE="mx"): e4m3 values with one UE8M0 scale per 32 elements of K
# --------------------------------------------------------------------------------------
# A UE8M0 scale factor is a biased power-of-two exponent byte e: 2**(e - 127), e in
# [0, 254] (255 is NaN). Per row of A (M x K) and of B (N x K), block j covers K elements
# [32 j, 32 j + 32): A_real[m, k] = e4m3(A)[m, k] * 2**(sfa[m, k // 32] - 127), B likewise,
# and D = A_real @ B_real.T, the products summed in fp32 by the tensor core (which applies
# the scales); reference_mx_np sums them in float64. The kernel reads the SFs in the
# hardware's blocked order (mx_block_sf_np).
MX_SF_VEC = 32
MX_SF_BIAS = 127
MX_SF_ROWS, MX_SF_KB = 128, 4  # one blocked atom: 128 rows x 4 SFs (one 128-K stage)


def mx_sf_shape(rows: int, K: int) -> tuple[int, int]:
    """(rows, ceil(K / 32)): the logical shape of an operand's scale factors."""
    return rows, -(-K // MX_SF_VEC)


def mx_scales_np(sf: np.ndarray, K: int) -> np.ndarray:
    """The fp32 factor of every element, rows x K: 2**(sf[r, k // 32] - 127)."""
    sf = np.asarray(sf)
    if sf.dtype != np.uint8:
        raise TypeError(f"mx scale factors are UE8M0 bytes (uint8), got {sf.dtype}")
    e = np.repeat(sf.astype(np.int32) - MX_SF_BIAS, MX_SF_VEC, axis=1)[:, :K]
    return np.exp2(e).astype(np.float32)


def quantize_mx_np(x: np.ndarray):
    """(x_q float8_e4m3fn, sf uint8): per row and 32-element block of K, the smallest
    power of two s = 2**(e - 127) with amax / s <= 448 (e = 127 for an all-zero block)."""
    x = np.asarray(x, np.float32)
    R, K = x.shape
    kb = -(-K // MX_SF_VEC)
    p = np.zeros((R, kb * MX_SF_VEC), np.float32)
    p[:, :K] = np.abs(x)
    amax = p.reshape(R, kb, MX_SF_VEC).max(axis=2)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.ceil(np.log2(np.where(amax > 0, amax, 1) / E4M3_MAX)), 0)
    sf = np.clip(e + MX_SF_BIAS, 0, 254).astype(np.uint8)
    q = (x / mx_scales_np(sf, K)).astype(_e4m3())
    return q, sf


def make_mx_inputs_np(M: int, N: int, K: int, seed: int, out_dtype: str = "bfloat16"):
    """(A_q, B_q, sfa, sfb, D): randn * K**-0.25 with every 32-element block of K of every
    row of A and B multiplied by 2**u, u uniform in [-3, 3] (so neighbouring blocks get
    different scale factors), quantized by quantize_mx_np; D (M x N) all NaN."""
    check_dtype(out_dtype)
    rng = np.random.default_rng(seed)
    s = random_scale(K)
    kb = -(-K // MX_SF_VEC)

    def operand(rows):
        x = rng.standard_normal((rows, K), dtype=np.float32) * s
        u = np.exp2(rng.uniform(-3, 3, (rows, kb))).astype(np.float32)
        return quantize_mx_np(x * np.repeat(u, MX_SF_VEC, axis=1)[:, :K])

    Aq, sfa = operand(M)
    Bq, sfb = operand(N)
    D = np.full((M, N), np.nan, dtype=np_dtype(out_dtype))
    return Aq, Bq, sfa, sfb, D


def reference_mx_np(Aq: np.ndarray, Bq: np.ndarray, sfa: np.ndarray,
                    sfb: np.ndarray) -> np.ndarray:
    """The float64 reference: (e4m3(A) * 2**(sfa - 127)) @ (e4m3(B) * 2**(sfb - 127)).T,
    the scales expanded along K per 32 elements. Every dequantized operand and product is
    exact in float64 (a 4-bit mantissa times a power of two), so only the sum rounds."""
    K = Aq.shape[1]
    A = Aq.astype(np.float64) * mx_scales_np(sfa, K).astype(np.float64)
    B = Bq.astype(np.float64) * mx_scales_np(sfb, K).astype(np.float64)
    return A @ B.T


def mx_block_sf_np(sf: np.ndarray, K: int) -> np.ndarray:
    """The kernel's SFA / SFB operand: (rows, ceil(K/32)) UE8M0 bytes in the blocked order
    tcgen05.cp reads (padded with e = 127 to 128 rows and 4 SFs per 128 of K): atom (row
    block rb, K stage kb) is 512 bytes, byte l * 16 + i * 4 + j holding row rb * 128 +
    32 i + l, SF kb * 4 + j; the atoms in (rb, kb) order, as (atoms * 4, 128) uint8."""
    sf = np.asarray(sf, np.uint8)
    R = sf.shape[0]
    rb = -(-R // MX_SF_ROWS)
    kb = -(-K // (MX_SF_VEC * MX_SF_KB))
    p = np.full((rb * MX_SF_ROWS, kb * MX_SF_KB), MX_SF_BIAS, np.uint8)
    p[:R, :sf.shape[1]] = sf
    atoms = p.reshape(rb, 4, 32, kb, MX_SF_KB).transpose(0, 3, 2, 1, 4)
    return np.ascontiguousarray(atoms).reshape(rb * kb * 4, 128)


def mx_unblock_sf_np(blocked: np.ndarray, rows: int, K: int) -> np.ndarray:
    """mx_block_sf_np's inverse: the (rows, ceil(K/32)) scale factors."""
    rb = -(-rows // MX_SF_ROWS)
    kb = -(-K // (MX_SF_VEC * MX_SF_KB))
    p = np.asarray(blocked, np.uint8).reshape(rb, kb, 32, 4, MX_SF_KB).transpose(0, 3, 2, 1, 4)
    return np.ascontiguousarray(p).reshape(rb * MX_SF_ROWS, kb * MX_SF_KB)[
        :rows, :mx_sf_shape(rows, K)[1]]
