"""Build harness, public API: compile a step for an arch -> CUDA source, cubin, exported
library, resource usage and a SASS opcode summary, cached on disk.

The work is split by job:

- toolchain.py  where nvcc and its tools come from; the toolchain's identity
- doctor.py     `tirx-gemm doctor`: the toolchain as nvcc reports it, the libcuda stub
- procs.py      hardened subprocesses: time limits, process groups, bounded output collection
- cache.py      cache entries (hashed artefacts, keyed by the toolchain), lock-owned work folders
- cudalibs.py   the CUDA runtime and libcuda (driver or checked stub) loaded before TVM
- pipeline.py   one build: TVM -> nvcc -> exported library -> SASS -> meta.json
- pool.py       the build server and its process pool (a fresh process per build)

This module runs a batch of builds through them (:func:`build_many`). A repeated build is a
file read. Every external tool runs with a time limit (``TIRX_GEMM_TOOL_TIMEOUT`` seconds
overrides the defaults) in its own process group, so a timeout or an interrupt (SIGINT,
SIGTERM) kills the tool with all its children; an interrupted build leaves neither temporary
folders nor processes behind, and a build killed outright (SIGKILL) leaves a folder whose lock
is free, which the next build removes.

The other names importable from here (BuildError, BuildResult, cache_key, find_tool, run_tool,
toolchain_report, ...) live in the modules above; they stay importable from here for callers.
"""

from __future__ import annotations

import os

from tirx_gemm import registry
from tirx_gemm.compile.cache import (ARTEFACTS, BUILD_FORMAT, BuildResult, InvalidEntry, WorkFolder,
                             cache_key, cache_root, count_prefix, disk_full, install_entry,
                             load_cached, read_entry, sweep_stale, verify_entry)
from tirx_gemm.compile.cudalibs import ensure_cudart, ensure_libcuda, ensure_stub
from tirx_gemm.compile.doctor import toolchain_report
from tirx_gemm.compile.pipeline import NVCC_FLAGS, parse_ptxas, sass_opcode_counts
from tirx_gemm.compile.pool import job_error, serve
from tirx_gemm.compile.procs import (PROBE_TIMEOUT_S, TOOL_TIMEOUT_ENV, TOOL_TIMEOUT_S, BuildError,
                             run_tool, sigterm_as_exit, tool_timeout)
from tirx_gemm.compile.regbudget import setmaxnreg_problem
from tirx_gemm.registry import Step
from tirx_gemm.compile.toolchain import (SYSTEM_CUDA_ENV, WHEEL_PACKAGES, find_tool, resolved,
                                 toolchain_env, toolchain_id, use_system_cuda, wheel_cuda_root)

__all__ = [
    # this module
    "INT32_MAX", "build", "build_many", "check_shape_limits", "check_watchdog_ms",
    # re-exported from their homes (cache, cudalibs, doctor, pipeline, procs, toolchain)
    "ARTEFACTS", "BUILD_FORMAT", "BuildError", "BuildResult", "InvalidEntry", "NVCC_FLAGS",
    "PROBE_TIMEOUT_S", "SYSTEM_CUDA_ENV", "TOOL_TIMEOUT_ENV", "TOOL_TIMEOUT_S",
    "WHEEL_PACKAGES", "cache_key", "cache_root", "count_prefix", "ensure_cudart",
    "ensure_libcuda", "find_tool", "parse_ptxas", "run_tool", "sass_opcode_counts",
    "tool_timeout", "toolchain_env", "toolchain_id", "toolchain_report", "use_system_cuda",
    "verify_entry", "wheel_cuda_root",
]

# the generated index math uses int32 element offsets (TVM's default index type)
INT32_MAX = 2**31 - 1


def check_shape_limits(M: int, N: int, K: int) -> None:
    """Positive sizes whose operands fit the int32 element offsets of the index math (TVM
    would otherwise fail deep inside lowering, or overflow silently)."""
    for name, v in (("M", M), ("N", N), ("K", K)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")
    for name, v in (("M*K", M * K), ("N*K", N * K), ("M*N", M * N)):
        if v > INT32_MAX:
            raise ValueError(f"M,N,K={M},{N},{K}: {name}={v} elements exceeds 2^31-1, the "
                             "limit of the kernels' int32 index math")


def check_watchdog_ms(watchdog_ms) -> None:
    if watchdog_ms is not None and (isinstance(watchdog_ms, bool)
                                    or not isinstance(watchdog_ms, int) or watchdog_ms < 1):
        raise ValueError(f"watchdog_ms={watchdog_ms!r} must be a positive integer "
                         "(milliseconds) or None")


def build(step_id: str, M: int | None = None, N: int | None = None, K: int | None = None,
          arch: str = "sm_100a", *, use_cache: bool = True, watchdog_ms: int | None = None,
          **kwargs) -> BuildResult:
    """Compile one step. Raises ValueError for an invalid step/shape (the builder's own
    message), BuildError when the toolchain fails. ``watchdog_ms`` builds the kernel with
    bounded barrier waits (helpers.set_watchdog)."""
    step = registry.get(step_id, arch)
    M, N, K = step.canonical if M is None else (M, N, K)
    return build_many([(step, (M, N, K), kwargs)], use_cache=use_cache,
                      watchdog_ms=watchdog_ms)[0]


def build_many(requests, *, jobs: int | None = None, use_cache: bool = True,
               progress=None, watchdog_ms: int | None = None) -> list[BuildResult | Exception]:
    """Build several (step, (M, N, K), kwargs), each in its own process (pool.py).

    At most ``jobs`` builds run at once (default: the CPU count); a build whose process dies
    (a crash in TVM, say) fails alone.

    With one request, errors are raised; with several, each failed slot holds its
    exception so that one bad step does not hide the others' results. ``progress`` is
    called as progress(done, total, request, result_or_exc) after each build. Without
    ``use_cache`` every request is rebuilt and replaces its cache entry. ``watchdog_ms``
    applies to every request.
    """
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs={jobs!r} must be a positive integer")
    check_watchdog_ms(watchdog_ms)
    tool_timeout()  # a bad TIRX_GEMM_TOOL_TIMEOUT is one line before any work
    reqs = [(s, tuple(mnk), dict(kw or {})) for s, mnk, kw in requests]
    out: list = [None] * len(reqs)
    todo = []
    for i, (step, (M, N, K), kw) in enumerate(reqs):
        try:
            check_shape_limits(M, N, K)
        except ValueError as exc:
            out[i] = exc
            continue
        hit = load_cached(step, M, N, K, kw, watchdog_ms) if use_cache else None
        if hit is not None:
            out[i] = hit
        else:
            todo.append(i)
    if todo:  # before any work: a missing tool is one clear line, not a failed worker each
        find_tool("nvcc")
        find_tool("cuobjdump")
        ensure_stub()  # checked (rebuilt when damaged) here, where its notice is seen
    done = 0
    for i in range(len(reqs)):
        if out[i] is not None:
            done += 1
            if progress:
                progress(done, len(reqs), reqs[i], out[i])
    if not todo:
        return _result(out)
    parallel = jobs or max(1, min(len(todo), os.cpu_count() or 1))
    owned: dict[str, tuple[int, dict, WorkFolder]] = {}  # work dir -> (slot, job, folder)
    with sigterm_as_exit():
        try:
            sweep_stale()
            for i in todo:
                step, mnk, kw = reqs[i]
                job, folder = _prepare(step, mnk, kw, watchdog_ms)
                owned[job["dir"]] = (i, job, folder)
            server = serve([job for _, job, _ in owned.values()], parallel)
            try:
                for work_dir, failure in server:
                    i, job, folder = owned[work_dir]
                    try:
                        out[i] = _finish(reqs[i][0], job, folder, failure)
                    except Exception as exc:  # noqa: BLE001 - reported per slot
                        out[i] = exc
                    done += 1
                    if progress:
                        progress(done, len(reqs), reqs[i], out[i])
            finally:
                server.close()  # on an interrupt: kills the server and its builds
        finally:
            for _, _, folder in owned.values():  # finished ones were renamed already
                folder.release()
    return _result(out)


def _result(out: list) -> list:
    if len(out) == 1 and isinstance(out[0], Exception):
        raise out[0]
    return out


def _prepare(step: Step, mnk, kwargs, watchdog_ms=None) -> tuple[dict, WorkFolder]:
    M, N, K = mnk
    key = cache_key(step, M, N, K, kwargs, watchdog_ms)
    folder = WorkFolder(key)
    job = {"step": step.id, "arch": step.arch, "M": M, "N": N, "K": K, "kwargs": kwargs,
           "watchdog_ms": watchdog_ms, "key": key, "dir": str(folder.path),
           "nvcc_version": resolved().nvcc_version}
    return job, folder


def _finish(step: Step, job: dict, folder: WorkFolder, failure: str | None) -> BuildResult:
    """The finished work folder's result, renamed into place as the cache entry; or the
    build's error."""
    shape = f"{job['M']}x{job['N']}x{job['K']}"
    err = job_error(folder.path)
    if err is not None:
        if err["type"] == "ValueError":
            raise ValueError(err["message"])
        if err["type"] == "BuildError":
            raise BuildError(f"{step.key} {shape}: {err['message']}")
        raise BuildError(f"{step.key} {shape}: {err['type']}: {err['message']}")
    if failure:
        raise BuildError(f"{step.key} {shape}: {failure}")
    try:
        built = read_entry(folder.path, job["key"])
        # a setmaxnreg split that the registers ptxas chose cannot honour hangs on the GPU
        why = setmaxnreg_problem(built.cuda_source, built.registers)
        if why:
            raise BuildError(f"{step.key} {shape}: {why}")
        return install_entry(folder, job["key"])
    except InvalidEntry as exc:
        raise BuildError(f"{step.key} {shape}: " + (disk_full(folder.path) or (
            f"the build produced an unusable result ({exc})"))) from None
