"""Inputs, reference and the compare rules, in numpy: one definition for every checker.

The GPU runner (torch tensors on the device) and the CPU simulation (NumSim, numpy
arrays, no torch) check a kernel's output with the same rules, defined once here:

- inputs: "random" is randn * K**-0.25 rounded to fp16, so each output element has rms ~1
  whatever K; "int" is integers uniform in [INT_LOW, INT_HIGH]: the fp32-accumulated
  result is an integer, exact for K < 2**22 and unrounded by fp16 when |result| <= 2048
  (guaranteed for K <= 512), so it is checked for exact equality.
- the output is poisoned with NaN before the kernel runs, so an unwritten element fails.
- compare: any NaN/Inf fails; "exact" wants every element equal to the fp16-rounded fp32
  reference; otherwise every element must satisfy |out-ref| <= atol + rtol*|ref|
  (atol = 1e-3 * rms(ref)) and the relative Frobenius error must be <= 1e-3.

Importing this module needs numpy only.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

DEFAULT_MAX_REL_ERR = 1e-3
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL_SCALE = 1e-3  # atol = DEFAULT_ATOL_SCALE * rms(ref)

INT_LOW, INT_HIGH = -2, 2  # small-integer inputs: entries in [INT_LOW, INT_HIGH]
INPUT_KINDS = ("random", "int")


def random_scale(K: int) -> float:
    """Scale of the "random" inputs: each output element then has rms ~1 whatever K."""
    return float(K) ** -0.25


def check_int_k(K: int) -> None:
    if 4 * K >= 2 ** 24:
        raise ValueError(f"K={K} too large for an exact integer check (needs 4*K < 2**24)")


def make_inputs_np(M: int, N: int, K: int, kind: str, seed: int):
    """(A, B, D) as numpy arrays: A (MxK) and B (NxK) fp16 per ``kind``, D (MxN) all NaN."""
    rng = np.random.default_rng(int(seed))
    if kind == "random":
        s = random_scale(K)
        A = (rng.standard_normal((M, K), dtype=np.float32) * s).astype(np.float16)
        B = (rng.standard_normal((N, K), dtype=np.float32) * s).astype(np.float16)
    elif kind == "int":
        check_int_k(K)
        A = rng.integers(INT_LOW, INT_HIGH + 1, (M, K)).astype(np.float16)
        B = rng.integers(INT_LOW, INT_HIGH + 1, (N, K)).astype(np.float16)
    else:
        raise ValueError(f"kind={kind!r} must be one of {INPUT_KINDS}")
    D = np.full((M, N), np.nan, dtype=np.float16)
    return A, B, D


def reference_np(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """fp32 reference A @ B.T (fp32 products and sums, as the tensor cores accumulate)."""
    return A.astype(np.float32) @ B.astype(np.float32).T


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


def compare_np(out: np.ndarray, ref: np.ndarray, *, exact: bool = False,
               rtol: float = DEFAULT_RTOL, atol: float | None = None,
               max_rel_err: float | None = DEFAULT_MAX_REL_ERR,
               n_show: int = 5) -> CompareResult:
    """Compare a kernel output with the fp32 reference (the rules in the module docstring)."""
    out = np.asarray(out)
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        raise ValueError(f"out has shape {out.shape} but ref has {ref.shape}")
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
            want = r.astype(np.float16).astype(np.float32)
            bad = ~(o == want)  # NaN != anything, so poisoned elements count
            used_rtol, used_atol = 0.0, 0.0
            display_want = want
        else:
            rms = ref_norm / math.sqrt(n_total) if n_total else 0.0
            used_atol = float(atol) if atol is not None else DEFAULT_ATOL_SCALE * rms
            used_rtol = float(rtol)
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
        what = "not exactly equal to the fp16-rounded reference" if exact else (
            f"outside |out-ref| <= {used_atol:.3g} + {used_rtol:.3g}*|ref|")
        reasons.append(f"{n_mismatch} of {n_total} elements {what}")
    if not exact and max_rel_err is not None and not (rel <= max_rel_err):
        reasons.append(f"relative Frobenius error {rel:.3g} > {max_rel_err:.3g}")
    return CompareResult(
        ok=not reasons, exact=exact, rel_frobenius_error=rel, max_abs_error=max_abs,
        n_nan=n_nan, n_inf=n_inf, n_mismatch=n_mismatch, n_total=n_total,
        first_mismatches=first, rtol=used_rtol, atol=used_atol,
        max_rel_err=None if exact else max_rel_err, reason="; ".join(reasons),
    )
