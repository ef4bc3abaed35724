"""Checking a kernel against torch: fresh inputs, the fp32 reference, the comparison.

:func:`check` makes fresh inputs (new seed each call), poisons the output with NaN, launches,
waits through the hang guard and compares with the fp32 torch reference. The comparison
rules are defined once, in numpy, in ``tirx_gemm.numerics`` (shared with the CPU
simulation); :func:`compare` applies them to torch tensors.

The inputs and the comparison, for both dtypes (float16, bfloat16), follow
``tirx_gemm.numerics``, whose docstring gives every tolerance and why (all derived from the
output dtype's unit roundoff); nothing here defines a number of its own.
"""

from __future__ import annotations

import dataclasses
import os
import time as _time
from typing import Callable, Sequence

import torch

from tirx_gemm import numerics
from tirx_gemm.run.device import DeviceMismatchError
from tirx_gemm.run.launcher import KernelLaunchError, synchronize, validate_inputs
# compare() defaults; see the module docstring for the reasoning.
from tirx_gemm.numerics import FROM_DTYPE

__all__ = [
    "Log",
    "new_seed",
    "Inputs",
    "torch_dtype",
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


def torch_dtype(dtype: str) -> torch.dtype:
    """torch.float16 or torch.bfloat16 for a dtype name of numerics.DTYPES."""
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[numerics.check_dtype(dtype)]


def dtype_name(t: torch.dtype) -> str | None:
    """The numerics dtype name of a torch dtype (float16 or bfloat16), else None."""
    return {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(t)


def make_inputs(M: int, N: int, K: int, kind: str = "random", seed: int | None = None,
                device="cuda", dtype: str = "float16") -> Inputs:
    """Fresh operands A (MxK), B (NxK) and an output D (MxN, poisoned with NaN), all of
    ``dtype`` (float16 or bfloat16; the rules are numerics'):

    kind "random": randn * K**-0.25 rounded to the dtype, so each D element has rms ~1
    whatever K. kind "int": integers uniform in numerics.int_range(dtype); the
    fp32-accumulated result is an integer that compare(exact=True) checks exactly.
    ``seed`` None draws a fresh one; it is returned in ``.seed`` so the run can be recorded
    and reproduced.
    """
    tdt = torch_dtype(dtype)
    if seed is None:
        seed = new_seed()
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(int(seed))
    if kind == "random":
        scale = numerics.random_scale(K)
        A = (torch.randn(M, K, generator=gen, device=dev) * scale).to(tdt)
        B = (torch.randn(N, K, generator=gen, device=dev) * scale).to(tdt)
    elif kind == "int":
        numerics.check_int_k(K, dtype)
        lo, hi = numerics.int_range(dtype)
        A = torch.randint(lo, hi + 1, (M, K), generator=gen, device=dev).to(tdt)
        B = torch.randint(lo, hi + 1, (N, K), generator=gen, device=dev).to(tdt)
    else:
        raise ValueError(f"kind={kind!r} must be 'random' or 'int'")
    D = torch.empty(M, N, dtype=tdt, device=dev)
    poison_(D)
    return Inputs(A, B, D, kind, int(seed))


def poison_(D: torch.Tensor) -> torch.Tensor:
    """Fill D with NaN in place so any element the kernel does not write fails the check."""
    D.fill_(float("nan"))
    return D


def reference(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """fp32 reference A.float() @ B.float().T, with TF32 forced off for the duration (compare
    rounds it to the output dtype where its rules need it)."""
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


def compare(out: torch.Tensor, ref: torch.Tensor, *, dtype: str | None = None,
            exact: bool = False, rtol: float | None = None, atol: float | None = None,
            max_rel_err: float | None | str = FROM_DTYPE, n_show: int = 5,
            atol_scale: float | None = None) -> CompareResult:
    """Compare a kernel output with the fp32 reference: the rules of ``numerics.compare_np``
    (one definition for the GPU checks and the CPU simulation), applied on the host.
    ``dtype`` (the output dtype, which sets the tolerances) defaults to out's own when it
    is float16 or bfloat16, else float16; a 2-byte ``out`` of another dtype is refused."""
    own = dtype_name(out.dtype)
    if dtype is None:
        dtype = own or "float16"
    elif own is not None and own != dtype:
        raise ValueError(f"out has dtype {out.dtype} but is compared as {dtype}")
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"out has shape {tuple(out.shape)} but ref has {tuple(ref.shape)}")
    if atol_scale is not None and atol is None:  # atol = atol_scale * rms(ref) (fp8 steps)
        atol = atol_scale * float(ref.detach().double().norm()) / max(ref.numel(), 1) ** 0.5
    return numerics.compare_np(out.detach().float().cpu().numpy(),
                               ref.detach().float().cpu().numpy(), dtype=dtype, exact=exact,
                               rtol=rtol, atol=atol, max_rel_err=max_rel_err, n_show=n_show)


def workspace_dirt(workspace: Sequence[tuple[str, torch.Tensor]]) -> str:
    """"" when every integer workspace buffer (tile counters) is all zeros, else what is
    left in which. The contract (registry.Step.workspace): integer buffers are zero when a
    launch starts and the kernel leaves them zero; floating-point buffers are scratch."""
    dirty = [(name, int(t.count_nonzero())) for name, t in workspace
             if not (t.is_floating_point() or t.is_complex())]
    dirty = [(name, n) for name, n in dirty if n]
    if not dirty:
        return ""
    return ("workspace " + ", ".join(f"{name!r} has {n} nonzero element(s)" for name, n in dirty)
            + " after the kernel returned (it must leave its counters zero-filled: the next "
            "launch would start from stale values)")


def poison_workspace_(workspace: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Fill the floating-point (scratch) workspace buffers with NaN: a launch that reads
    an element it did not write first then fails its check. Integer buffers keep their
    zeros, which the kernel relies on."""
    for _, t in workspace:
        if t.is_floating_point():
            t.fill_(float("nan"))


def check(kernel, M: int, N: int, K: int, *, launch: Callable | None = None,
          kinds: Sequence[str] = ("random", "int"), seed: int | None = None, device="cuda",
          dtype: str = "float16", workspace: Sequence[tuple[str, torch.Tensor]] = (),
          log: Log | None = _print, **compare_kw) -> dict:
    """Check a kernel against the fp32 torch reference on fresh inputs of ``dtype``.

    For each kind ("random": tolerance check, "int": exact check) it makes fresh inputs
    (new seed each call unless ``seed`` is given), poisons D with NaN, launches through
    ``launch(A, B, D)`` (default: validate_inputs then ``kernel(A, B, D, *workspace)``),
    synchronizes (a launch failure raises KernelLaunchError) and compares. ``workspace``
    ((name, tensor), ...) are the kernel's extra operands: its floating-point (scratch)
    buffers are poisoned with NaN before each launch, and a kind whose launch leaves an
    integer buffer (a counter) not all zeros fails, whatever its numbers.

    Returns {"ok": bool, "rel_err": rel. Frobenius error of the random check (or None),
    "results": [{"kind", "seed", **CompareResult.to_dict()}, ...]}.
    """
    log = log or _quiet
    if launch is None:
        def launch(A, B, D):  # noqa: F811
            validate_inputs(A, B, D, M, N, K, dtype=dtype)
            kernel(A, B, D, *(t for _, t in workspace))
    results = []
    for kind in kinds:
        inp = make_inputs(M, N, K, kind=kind, seed=seed, device=device, dtype=dtype)
        log(f"  check {kind:6s} M,N,K={M},{N},{K} {dtype} seed={inp.seed} ...")
        poison_(inp.D)
        poison_workspace_(workspace)
        synchronize("preparing inputs", device)
        try:
            launch(inp.A, inp.B, inp.D)
        except (KernelLaunchError, TypeError, ValueError, DeviceMismatchError):
            raise  # refused before launching, or already explained
        except Exception as e:
            raise KernelLaunchError(f"launch at M,N,K={M},{N},{K} failed: {e}") from e
        synchronize(f"kernel at M,N,K={M},{N},{K}", device)
        ref = reference(inp.A, inp.B)
        res = compare(inp.D, ref, dtype=dtype, exact=(kind == "int"), **compare_kw)
        dirt = workspace_dirt(workspace)
        if dirt:
            res.ok = False
            res.reason = "; ".join(x for x in (res.reason, dirt) if x)
            for _, t in workspace:  # the next kind starts from the state the contract promises
                if not t.is_floating_point():
                    t.zero_()
        log(f"    {res.summary()}")
        results.append({"kind": kind, "seed": inp.seed, **res.to_dict()})
        del inp, ref
    rel = next((r["rel_frobenius_error"] for r in results if r["kind"] == "random"), None)
    return {"ok": all(r["ok"] for r in results), "rel_err": rel, "results": results}
