"""Measuring a plan: each (step, shape) built here or taken from a bundle, then checked and
timed on this GPU (runner.run_step). The CLI's run/bench/regress commands and the notebooks
both call :func:`measure_plan`.

Imports neither torch nor TVM at import time: the runner (torch) is loaded when a kernel is
run; kernels come from tirx_gemm.kernels.kernel_for (a bundle, or the build harness, TVM,
only when a kernel is built here).
"""

from __future__ import annotations

from typing import Callable, Sequence

from tirx_gemm import registry
from tirx_gemm.kernels import kernel_for

__all__ = ["plan", "measure_plan"]

Plan = Sequence[tuple[registry.Step, tuple[int, int, int]]]


def plan(steps: Sequence[registry.Step], shapes) -> list:
    """(step, shape) pairs: ``shapes`` is a registry shape list name ("bench", "test",
    "all", "canonical") or a list of explicit (M, N, K)."""
    from tirx_gemm.bundle_format import shapes_for
    return [(s, mnk) for s in steps for mnk in (
        shapes_for(s, shapes) if isinstance(shapes, str) else shapes)]


def measure_plan(plan: Plan, *, bundle=None, check_only: bool = False,
                 log: Callable[[str], None] = print, watchdog_ms: int | None = None,
                 dtype: str = "float16") -> list:
    """Check (and time) every (step, shape) of the plan in operand ``dtype``; returns the
    records in order. Kernels built here size persistent steps to this GPU's SM count."""
    from tirx_gemm.run import device
    from tirx_gemm.run import loader
    from tirx_gemm.run import runner
    recs = []
    for i, (step, mnk) in enumerate(plan, 1):
        log(f"[{i}/{len(plan)}] {step.key} {'x'.join(map(str, mnk))}"
            + ("" if dtype == "float16" else f" {dtype}"))
        sm_count = None if bundle else device.check_device(step.arch, query_smi=False)["sm_count"]
        lib, meta, _ = kernel_for(step, mnk, bundle, sm_count=sm_count, watchdog_ms=watchdog_ms,
                                  dtype=dtype)
        kernel = loader.load_kernel(str(lib))
        recs.append(runner.run_step(kernel, meta, check=True, time=not check_only,
                                    git_sha=meta.get("git_sha"), log=lambda m: log("    " + m)))
    return recs
