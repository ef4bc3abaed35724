"""One resolver: the kernel for (step, shape, keywords), read from a bundle or built here.

The run side (run/measure.py, run/trace.py) and tirx_gemm.matmul all get their kernels from
:func:`kernel_for`. With a bundle it is found through :mod:`tirx_gemm.bundle_format` (no
TVM, no torch); without one it is built by the build harness, which this module imports
only then (tirx_gemm.compile.api: TVM). So a GPU host that runs bundles never imports the
compiler, and nothing under tirx_gemm/run/ imports tirx_gemm/compile/.
"""

from __future__ import annotations

from pathlib import Path

from tirx_gemm import bundle_format, registry
from tirx_gemm.gitinfo import git_sha

__all__ = ["dtype_kwargs", "kernel_for"]


def dtype_kwargs(dtype: str | None) -> dict:
    """The builder keywords of an operand dtype: {} for float16 (the default, never written
    into kwargs, so float16 cache keys, bundles and records stay as they were),
    {"dtype": "bfloat16"} for bfloat16."""
    from tirx_gemm.numerics import check_dtype
    if dtype is None or check_dtype(dtype) == "float16":
        return {}
    return {"dtype": dtype}


def kernel_for(step: registry.Step, mnk, bundle=None, *, kwargs: dict | None = None,
               dtype: str = "float16", sm_count: int | None = None,
               watchdog_ms: int | None = None, timeline: bool = False):
    """(library path, build metadata, BuildResult or None) of ``step`` at shape ``mnk``.

    ``kwargs`` given: exactly those builder keywords (the dtype among them). Else the
    keywords of operand ``dtype``: from a bundle its entry of that dtype whatever its other
    keywords; built here, persistent steps sized to ``sm_count`` SMs when given (the GPU
    they will run on). ``timeline``: the instrumented build (export --timeline), which is
    never picked otherwise. ``watchdog_ms``: the build with bounded barrier waits.

    From the bundle at ``bundle`` when given (bundle_format.find: verified first; a
    ValueError names what the bundle has instead); else built here (needs TVM; the build
    cache returns a previous build at once). The metadata's M, N, K are the shape built
    or exported."""
    if bundle:
        entry = dict(bundle_format.find(
            Path(bundle), step, mnk, kwargs=None if kwargs is None else dict(kwargs),
            watchdog_ms=watchdog_ms, dtype=dtype if kwargs is None else None,
            timeline=timeline))
        entry.setdefault("lesson", step.lesson)
        return Path(bundle) / entry["lib"], entry, None
    from tirx_gemm.compile.api import build
    if kwargs is None:
        kwargs = {**step.with_sm_count(sm_count), **dtype_kwargs(dtype)}
        if timeline:
            from tirx_gemm.timeline import KWARG
            kwargs[KWARG] = True
    r = build(step.id, *mnk, arch=step.arch, watchdog_ms=watchdog_ms, **kwargs)
    meta = {"step": r.step, "arch": r.arch, "M": r.M, "N": r.N, "K": r.K, "kwargs": r.kwargs,
            "tvm_version": r.tvm_version, "lesson": step.lesson, "git_sha": git_sha()}
    return Path(r.lib_path), meta, r
