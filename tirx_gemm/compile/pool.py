"""The build server and its process pool: every build runs in a fresh process of a
``concurrent.futures.ProcessPoolExecutor`` (``max_tasks_per_child=1``) whose workers are forked
from a multiprocessing fork server that has imported TVM once, so no TVM compiler state leaks
from one build into the next and no build pays the TVM import again.

The caller (:func:`serve`) starts the server (:func:`server_main`) as a child that leads its
own process group, which the fork server and the workers share; closing :func:`serve` early
stops the whole group. Each process of the chain dies with its parent (PR_SET_PDEATHSIG:
server, fork server, worker, tool), so neither a SIGKILLed caller nor a finished server leaves
one behind. A worker that dies (a crash in TVM, say) fails its own build alone.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from tirx_gemm.compile.cudalibs import ensure_libcuda
from tirx_gemm.compile.procs import (COLLECT_TIMEOUT_S, die_with_parent, kill_tools_and_exit,
                             stop_group)
from tirx_gemm.compile.toolchain import toolchain_env

__all__ = ["POOL_PRELOAD", "prepare_fork_server", "serve", "server_main"]

PKG_DIR = Path(__file__).resolve().parents[1]
# modules the fork server imports once, so that no build pays for them. First the entry
# module, which calls prepare_fork_server: the CUDA libraries must be loaded before TVM is
# imported (else TVM silently keeps CUDA source only)
POOL_PRELOAD = ["tirx_gemm.compile.forkserver_entry", "tvm", "tvm_ffi", "tirx_gemm.compile.pipeline",
                "tirx_gemm.helpers", "tirx_gemm.hopper"]


# the pids a process of the chain checks its parent against (procs.die_with_parent): the
# server's, set by server_main for its fork server, and the fork server's, set there for
# the workers it forks; serve() clears both from the server's environment
_SERVER_PID = "_TIRX_GEMM_BUILD_SERVER_PID"
_FORK_SERVER_PID = "_TIRX_GEMM_FORK_SERVER_PID"


def prepare_fork_server() -> None:
    """In the fork server, before TVM is imported: die with the build server (waiting for
    the server's end of its pipe to close is not enough, as every worker holds a copy of that
    end), and load the CUDA libraries the workers inherit. The server's pid comes from the
    environment it started this process with; the workers learn this process's pid from the
    environment they inherit."""
    server = os.environ.get(_SERVER_PID)
    die_with_parent(int(server) if server else None)
    os.environ[_FORK_SERVER_PID] = str(os.getpid())
    ensure_libcuda()


# ---------------------------------------------------------------------------------------
# the caller's side
# ---------------------------------------------------------------------------------------
def serve(jobs: list[dict], parallel: int):
    """Run the build server on ``jobs``; yield (work dir, failure) as builds finish, where
    failure is None or why the server could not report the build. Closing the generator
    early (an exception or interrupt in the caller) stops the server's whole group."""
    env = {k: v for k, v in os.environ.items() if k not in (_SERVER_PID, _FORK_SERVER_PID)}
    # the server must import this very package, whichever way it was made importable
    env["PYTHONPATH"] = os.pathsep.join([str(PKG_DIR.parent)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryFile("w+") as server_err:
        proc = subprocess.Popen([sys.executable, "-c",
                                 "import sys; from tirx_gemm.compile.pool import server_main; "
                                 "sys.exit(server_main())"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=server_err,
                                text=True, env=env, start_new_session=True,
                                preexec_fn=functools.partial(die_with_parent, os.getpid()))
        seen = set()
        try:
            json.dump({"jobs": jobs, "parallel": parallel}, proc.stdin)
            proc.stdin.close()
            for line in proc.stdout:  # one JSON string per finished build: its work dir
                seen.add(work_dir := json.loads(line))
                yield work_dir, None
            try:  # its channel is closed: it is leaving
                proc.wait(timeout=COLLECT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                stop_group(proc)
        except BaseException:
            stop_group(proc)
            raise
        server_err.seek(0)
        err = server_err.read()
    missing = [job for job in jobs if job["dir"] not in seen]
    if missing:  # the server died before reporting these: its traceback goes to a log
        log = _server_log(err)
        last = (err.strip().splitlines() or ["no output"])[-1][:200]
        for job in missing:
            yield job["dir"], (f"the build server failed (exit {proc.returncode}: {last}); "
                               f"its full output is in {log}; `tirx-gemm doctor` checks the "
                               "toolchain")


def _server_log(text: str) -> str:
    """Write a failed build server's output to a log file under the cache; its path (or
    why it could not be written)."""
    from tirx_gemm.compile.cache import cache_root
    try:
        logs = cache_root() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="build-server-", suffix=".log", dir=logs)
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
        return path
    except OSError as exc:
        return f"(no log: {exc.strerror or exc})"


def job_error(work: Path) -> dict | None:
    """The error a build reported as data ({"type", "message"}), or None."""
    path = Path(work) / "error.json"
    try:
        err = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # empty or cut short: a full disk, most often
        err = None
    if isinstance(err, dict) and isinstance(err.get("type"), str) \
            and isinstance(err.get("message"), str):
        return err
    from tirx_gemm.compile.cache import disk_full
    return {"type": "BuildError",
            "message": disk_full(work) or f"the build failed, and its error report {path} "
                                          "is empty or damaged"}


# ---------------------------------------------------------------------------------------
# the server (its own process)
# ---------------------------------------------------------------------------------------
def server_main() -> int:
    """Run the build requests read from stdin ({"jobs": [...], "parallel": n}) in a process
    pool; print each finished build's work dir as a JSON line on stdout."""
    req = json.load(sys.stdin)
    os.environ[_SERVER_PID] = str(os.getpid())  # for the fork server (prepare_fork_server)
    # stdout is the channel to the caller; fd 1 becomes stderr for everything else, so the
    # fork server and the workers, which inherit it, cannot write into the channel
    report_to = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    ensure_libcuda()  # builds (or repairs) the libcuda stub once, here
    os.environ.update(toolchain_env())  # TVM's own nvcc/CUDA lookups find our toolchain
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(POOL_PRELOAD)

    def report(job: dict) -> None:
        print(json.dumps(job["dir"]), file=report_to, flush=True)

    # a worker that dies breaks the pool and fails every request not yet reported: those
    # that had not started run again; of those that were running, a lone one is the one
    # that died, several run again one at a time (then a death names its build)
    rounds = [(req["jobs"], req["parallel"])]
    while rounds:
        batch, parallel = rounds.pop(0)
        broken: list[dict] = []
        with ProcessPoolExecutor(min(parallel, len(batch)), mp_context=ctx,
                                 initializer=_pool_worker_init,
                                 max_tasks_per_child=1) as pool:
            futures = {pool.submit(_pool_build, job): job for job in batch}
            for fut in as_completed(futures):
                job, exc = futures[fut], fut.exception()
                if isinstance(exc, BrokenProcessPool) and not _wrote_result(job):
                    broken.append(job)
                    continue
                if exc is not None:  # _pool_build reports a build's errors itself
                    _write_error(job, f"the build process raised {type(exc).__name__}: {exc}")
                report(job)
            # only to name a dead worker's exit status: the pool keeps it in a private dict
            exit_codes = {pid: proc.exitcode
                          for pid, proc in (getattr(pool, "_processes", None) or {}).items()}
        if not broken:
            continue
        started = [job for job in broken if (Path(job["dir"]) / "worker.pid").exists()]
        waiting = [job for job in broken if job not in started]
        if not started:  # the pool broke before any build ran: no build's fault, no retry
            for job in waiting:
                _write_error(job, "the build process pool broke before this build started "
                                  f"(worker exit codes: {sorted(map(str, exit_codes.values()))})")
                report(job)
            continue
        if len(started) == 1:
            _write_error(started[0], _death_message(started[0], exit_codes))
            report(started[0])
        else:
            for job in started:
                (Path(job["dir"]) / "worker.pid").unlink()
            rounds[:0] = [([job], 1) for job in started]
        if waiting:
            rounds.insert(0, (waiting, parallel))
    return 0


def _wrote_result(job: dict) -> bool:
    """The build wrote its result (it may have finished just as another worker died)."""
    return any((Path(job["dir"]) / name).exists() for name in ("meta.json", "error.json"))


def _write_error(job: dict, message: str) -> None:
    (Path(job["dir"]) / "error.json").write_text(json.dumps({"type": "BuildError",
                                                             "message": message[-4000:]}))


def _death_message(job: dict, exit_codes: dict) -> str:
    # worker.pid names a process of this server's own pool (same PID namespace, still a
    # child): only used to look up the exit status the pool recorded
    try:
        code = exit_codes.get(int((Path(job["dir"]) / "worker.pid").read_text()))
    except (OSError, ValueError):
        code = None
    how = "" if code is None else f" (exit {code}" + (
        f", {signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals()
        else ")")
    try:
        log = (Path(job["dir"]) / "build.log").read_text(errors="replace")
    except OSError:
        log = ""
    fatal = log.find("Fatal Python error")  # faulthandler's report: where it died
    lines = (log[fatal:].strip().splitlines()[:25] if fatal >= 0
             else log.strip().splitlines()[-25:])
    return (f"the build process died{how} before reporting a result:\n"
            + ("\n".join(lines) or "(its log is empty)"))


# ---------------------------------------------------------------------------------------
# a worker (a fresh process per build)
# ---------------------------------------------------------------------------------------
def _pool_worker_init() -> None:
    """In each pool worker: die with the fork server, and on SIGTERM (the server's group
    stopped, or the pool broken) kill the running tools before leaving."""
    fork_server = os.environ.get(_FORK_SERVER_PID)
    die_with_parent(int(fork_server) if fork_server else None)
    signal.signal(signal.SIGTERM, kill_tools_and_exit)


def _pool_build(job: dict) -> None:
    """One build in a fresh pool worker (max_tasks_per_child=1: the process ends after it);
    its errors are reported as data, in error.json."""
    from tirx_gemm.compile.pipeline import compile_job
    work = Path(job["dir"])
    (work / "error.json").unlink(missing_ok=True)  # from an attempt the pool's breakage ended
    (work / "worker.pid").write_text(str(os.getpid()))
    # the build's own output, and a fatal signal's traceback, go to its log
    log = os.open(work / "build.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    faulthandler.enable()
    try:
        compile_job(job)
    except Exception as exc:  # noqa: BLE001 - reported to the caller as data
        (work / "error.json").write_text(
            json.dumps({"type": type(exc).__name__, "message": str(exc)[-4000:]}))
