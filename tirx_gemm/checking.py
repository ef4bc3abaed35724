"""Checking a kernel against torch: fresh inputs, the fp32 reference, the comparison.

:func:`check` makes fresh inputs (new seed each call), poisons the output with NaN, launches,
waits through the hang guard and compares with the fp32 torch reference. The comparison
rules are defined once, in numpy, in ``tirx_gemm.numerics`` (shared with the CPU
simulation); :func:`compare` applies them to torch tensors.

Tolerances used by :func:`compare` (inputs from :func:`make_inputs`)
--------------------------------------------------------------------
The kernel accumulates in fp32 and rounds once to fp16. The fp16 unit roundoff is
u = 2**-11 ~ 4.9e-4, so the output rounding alone gives a relative Frobenius error of about
u/sqrt(3) ~ 2.8e-4 (2.1e-4 measured on an H200 at 4096^3). Defaults:

* ``max_rel_err = 1e-3`` on ||out - ref||_F / ||ref||_F: ~3.5x the rounding floor. A kernel
  that accumulated in fp16 instead of fp32 lands at ~u*sqrt(K/2) (2.8e-3 at K=64, 2.2e-2 at
  K=4096) and fails, as does any dropped K tile or wrong tile.
* elementwise ``|out - ref| <= atol + rtol*|ref|`` with ``rtol = 1e-3`` (~2u: one fp16 rounding
  plus slack for a different fp32 summation order) and ``atol = 1e-3 * rms(ref)`` (for results
  near zero, where a relative bound is meaningless; scale-aware so it holds for any input
  scale).
* exact mode (small-integer inputs): every element must equal ``ref.to(float16)``. Integer
  products summed in fp32 are exact while |partial sums| < 2**24 whatever the summation order,
  and the single final rounding to fp16 (round to nearest even) is the same in the kernel and
  in torch, so the comparison is exact for any K < 2**22 with entries in [-2, 2]. When
  |result| <= 2048 (guaranteed for K <= 512) no rounding happens at all.
"""

from __future__ import annotations

import dataclasses
import os
import time as _time
from typing import Callable, Sequence

import torch

from tirx_gemm import numerics
from tirx_gemm.device import DeviceMismatchError
from tirx_gemm.launcher import KernelLaunchError, synchronize, validate_inputs
# compare() defaults; see the module docstring for the reasoning.
from tirx_gemm.numerics import DEFAULT_MAX_REL_ERR, DEFAULT_RTOL, INT_HIGH, INT_LOW

__all__ = [
    "Log",
    "new_seed",
    "Inputs",
    "make_inputs",
    "poison_",
    "reference",
    "CompareResult",
    "compare",
    "check",
]

Log = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


def _quiet(msg: str) -> None:
    pass


def new_seed() -> int:
    """A fresh 31-bit seed from os.urandom and the clock: every run sees new inputs."""
    return (int.from_bytes(os.urandom(4), "little") ^ _time.time_ns()) & 0x7FFF_FFFF


@dataclasses.dataclass
class Inputs:
    A: torch.Tensor
    B: torch.Tensor
    D: torch.Tensor
    kind: str
    seed: int

    def __iter__(self):  # allows ``A, B, D = make_inputs(...)``
        return iter((self.A, self.B, self.D))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.A, self.B, self.D))


def make_inputs(M: int, N: int, K: int, kind: str = "random", seed: int | None = None,
                device="cuda") -> Inputs:
    """Fresh operands A (MxK), B (NxK) and an output D (MxN, poisoned with NaN), all fp16.

    kind "random": randn * K**-0.25 rounded to fp16, so each D element has rms ~1 whatever K.
    kind "int": integers uniform in [-2, 2]; the fp32-accumulated result is an integer that
    compare(exact=True) checks exactly (see the module docstring: exact for K < 2**22; no
    fp16 rounding at all when |result| <= 2048, guaranteed for K <= 512).
    ``seed`` None draws a fresh one; it is returned in ``.seed`` so the run can be recorded
    and reproduced.
    """
    if seed is None:
        seed = new_seed()
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(int(seed))
    if kind == "random":
        scale = numerics.random_scale(K)
        A = (torch.randn(M, K, generator=gen, device=dev) * scale).half()
        B = (torch.randn(N, K, generator=gen, device=dev) * scale).half()
    elif kind == "int":
        numerics.check_int_k(K)
        A = torch.randint(INT_LOW, INT_HIGH + 1, (M, K), generator=gen, device=dev).half()
        B = torch.randint(INT_LOW, INT_HIGH + 1, (N, K), generator=gen, device=dev).half()
    else:
        raise ValueError(f"kind={kind!r} must be 'random' or 'int'")
    D = torch.empty(M, N, dtype=torch.float16, device=dev)
    poison_(D)
    return Inputs(A, B, D, kind, int(seed))


def poison_(D: torch.Tensor) -> torch.Tensor:
    """Fill D with NaN in place so any element the kernel does not write fails the check."""
    D.fill_(float("nan"))
    return D


def reference(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """fp32 reference A.float() @ B.float().T, with TF32 forced off for the duration."""
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    prev_prec = torch.get_float32_matmul_precision()
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        return A.float() @ B.float().T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
        torch.set_float32_matmul_precision(prev_prec)


CompareResult = numerics.CompareResult


def compare(out: torch.Tensor, ref: torch.Tensor, *, exact: bool = False,
            rtol: float = DEFAULT_RTOL, atol: float | None = None,
            max_rel_err: float | None = DEFAULT_MAX_REL_ERR, n_show: int = 5) -> CompareResult:
    """Compare a kernel output with the fp32 reference: the rules of ``numerics.compare_np``
    (one definition for the GPU checks and the CPU simulation), applied on the host."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"out has shape {tuple(out.shape)} but ref has {tuple(ref.shape)}")
    return numerics.compare_np(out.detach().float().cpu().numpy(),
                               ref.detach().float().cpu().numpy(), exact=exact, rtol=rtol,
                               atol=atol, max_rel_err=max_rel_err, n_show=n_show)


def check(kernel, M: int, N: int, K: int, *, launch: Callable | None = None,
          kinds: Sequence[str] = ("random", "int"), seed: int | None = None, device="cuda",
          log: Log | None = _print, **compare_kw) -> dict:
    """Check a kernel against the fp32 torch reference on fresh inputs.

    For each kind ("random": tolerance check, "int": exact check) it makes fresh inputs
    (new seed each call unless ``seed`` is given), poisons D with NaN, launches through
    ``launch(A, B, D)`` (default: validate_inputs then ``kernel(A, B, D)``), synchronizes
    (a launch failure raises KernelLaunchError) and compares.

    Returns {"ok": bool, "rel_err": rel. Frobenius error of the random check (or None),
    "results": [{"kind", "seed", **CompareResult.to_dict()}, ...]}.
    """
    log = log or _quiet
    if launch is None:
        def launch(A, B, D):  # noqa: F811
            validate_inputs(A, B, D, M, N, K)
            kernel(A, B, D)
    results = []
    for kind in kinds:
        inp = make_inputs(M, N, K, kind=kind, seed=seed, device=device)
        log(f"  check {kind:6s} M,N,K={M},{N},{K} seed={inp.seed} ...")
        poison_(inp.D)
        synchronize("preparing inputs", device)
        try:
            launch(inp.A, inp.B, inp.D)
        except (KernelLaunchError, TypeError, ValueError, DeviceMismatchError):
            raise  # refused before launching, or already explained
        except Exception as e:
            raise KernelLaunchError(f"launch at M,N,K={M},{N},{K} failed: {e}") from e
        synchronize(f"kernel at M,N,K={M},{N},{K}", device)
        ref = reference(inp.A, inp.B)
        res = compare(inp.D, ref, exact=(kind == "int"), **compare_kw)
        log(f"    {res.summary()}")
        results.append({"kind": kind, "seed": inp.seed, **res.to_dict()})
        del inp, ref
    rel = next((r["rel_frobenius_error"] for r in results if r["kind"] == "random"), None)
    return {"ok": all(r["ok"] for r in results), "rel_err": rel, "results": results}


