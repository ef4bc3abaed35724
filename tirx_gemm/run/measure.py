"""Measuring a plan: each (step, shape) built here or taken from a bundle, then checked and
timed on this GPU (runner.run_step). The CLI's run/bench/regress commands and the notebooks
both call :func:`measure_plan`.

Imports neither torch nor TVM at import time: the runner (torch) is loaded when a kernel is
run, the build harness (TVM) only when a kernel is built here instead of read from a bundle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from tirx_gemm import registry
from tirx_gemm.gitinfo import git_sha

__all__ = ["dtype_kwargs", "kernel_for", "plan", "measure_plan"]

Plan = Sequence[tuple[registry.Step, tuple[int, int, int]]]


def dtype_kwargs(dtype: str | None) -> dict:
    """The builder keywords of an operand dtype: {} for float16 (the default, never written
    into kwargs, so float16 cache keys, bundles and records stay as they were),
    {"dtype": "bfloat16"} for bfloat16."""
    from tirx_gemm.numerics import check_dtype
    if dtype is None or check_dtype(dtype) == "float16":
        return {}
    return {"dtype": dtype}


def kernel_for(step: registry.Step, mnk, bundle_dir=None, *, sm_count: int | None = None,
               watchdog_ms: int | None = None, dtype: str = "float16"):
    """(library path, build metadata, BuildResult or None) of one step at one shape and
    operand dtype.

    From the bundle when ``bundle_dir`` is given (the entry of that dtype); else built here
    (needs TVM), persistent steps sized to ``sm_count`` SMs when given (the GPU they will
    run on)."""
    if bundle_dir:
        from tirx_gemm import bundle_format
        entry = dict(bundle_format.find(Path(bundle_dir), step, mnk, watchdog_ms=watchdog_ms,
                                 dtype=dtype))
        entry.setdefault("lesson", step.lesson)
        return Path(bundle_dir) / entry["lib"], entry, None
    from tirx_gemm.compile.api import build
    r = build(step.id, *mnk, arch=step.arch, watchdog_ms=watchdog_ms,
              **step.with_sm_count(sm_count), **dtype_kwargs(dtype))
    meta = {"step": r.step, "arch": r.arch, "M": r.M, "N": r.N, "K": r.K, "kwargs": r.kwargs,
            "tvm_version": r.tvm_version, "lesson": step.lesson, "git_sha": git_sha()}
    return r.lib_path, meta, r


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
