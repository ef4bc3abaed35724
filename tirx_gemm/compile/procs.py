"""Hardened subprocesses for the build: every external tool runs with a time limit in its own
process group, dies with the process that started it, and is killed whole (children too) on a
timeout, an exception or an interrupt; collecting its output after a kill has its own limit.

Standard library only; imported by every other module of the build side.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tirx_gemm import settings

__all__ = ["BuildError", "COLLECT_TIMEOUT_S", "PROBE_TIMEOUT_S", "TOOL_TIMEOUT_ENV",
           "TOOL_TIMEOUT_S", "die_with_parent", "kill_group", "kill_tools_and_exit",
           "parent_death_signal",
           "run_tool", "sigterm_as_exit", "stop_group", "tool_timeout"]

TOOL_TIMEOUT_ENV = "TIRX_GEMM_TOOL_TIMEOUT"
# seconds: nvcc of v7 takes ~5 s on 2 cores, so 300 s only catches a hung tool; a version
# probe answers at once
TOOL_TIMEOUT_S = settings.setting(TOOL_TIMEOUT_ENV).default  # 300.0
PROBE_TIMEOUT_S = 30.0
# seconds to read what a killed tool wrote: a process that left the tool's group (setsid)
# and keeps the pipes open is not waited for past this
COLLECT_TIMEOUT_S = 5.0
# after SIGTERM, how long a process group gets to clean up before SIGKILL
GROUP_GRACE_S = 3.0


class BuildError(RuntimeError):
    """The step is valid but the toolchain failed (TVM lowering, nvcc, cuobjdump)."""


def tool_timeout(probe: bool = False) -> float:
    """Seconds a tool may run: ``TIRX_GEMM_TOOL_TIMEOUT`` if set (finite, positive, at most
    settings.MAX_SECONDS, else a one-line ValueError), else the default (a probe's: 30)."""
    return settings.get(TOOL_TIMEOUT_ENV, default=PROBE_TIMEOUT_S if probe else TOOL_TIMEOUT_S)


# libc's prctl, looked up at import: die_with_parent also runs in a forked child before exec
# (a tool's preexec_fn), where loading anything could deadlock on a lock another thread of
# the parent held at the fork (dlopen of the running program itself maps nothing new)
_PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None


def _prctl_pdeathsig(sig: int) -> None:
    if _PRCTL is not None:
        _PRCTL(1, sig)  # 1 = PR_SET_PDEATHSIG


def parent_death_signal() -> int:
    """The signal this process gets when its parent dies (0: none; Linux, else 0)."""
    if _PRCTL is None:
        return 0
    sig = ctypes.c_int(0)
    _PRCTL(2, ctypes.byref(sig))  # 2 = PR_GET_PDEATHSIG
    return sig.value


def die_with_parent(parent: int | None = None, sig: int = signal.SIGTERM) -> None:
    """The calling process gets ``sig`` when its parent dies (Linux): the build server when
    the process that started it does, the fork server with the server, a worker with the
    fork server, a tool (SIGKILL) with the process that ran it.

    ``parent`` is the pid that started this process, when known: if it is no longer this
    process's parent, it died before the signal was armed (between the fork and this call)
    and the signal will never come, so this process leaves at once (exit 128 + sig)."""
    _prctl_pdeathsig(sig)
    if parent is not None and os.getppid() != parent:
        os._exit(128 + sig)


_ACTIVE_TOOLS: set[int] = set()  # process groups of this process's running tools


def kill_group(pgid: int, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tools_and_exit(signum, frame):
    """A SIGTERM handler: kill this process's running tools, then leave."""
    for pgid in list(_ACTIVE_TOOLS):
        kill_group(pgid)
    os._exit(128 + signum)


def _collect_after_kill(proc: subprocess.Popen) -> tuple[str, str]:
    """What a killed tool wrote, read for at most COLLECT_TIMEOUT_S: a process that left
    its group may hold the pipes open for as long as it likes, so stop reading then."""
    try:
        return proc.communicate(timeout=COLLECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        try:
            proc.wait(timeout=COLLECT_TIMEOUT_S)  # the tool itself was killed: at once
        except subprocess.TimeoutExpired:
            pass
        return "", ""


def end_pipe_holders(proc: subprocess.Popen) -> list[str]:
    """SIGKILL every other process that holds ``proc``'s stdout or stderr pipe open (a child
    that left the tool's process group, so killing the group missed it); "name (pid N)" of
    each. Linux: read from /proc; elsewhere nothing is found."""
    pipes = set()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None and not pipe.closed:
            pipes.add(f"pipe:[{os.fstat(pipe.fileno()).st_ino}]")
    ended = []
    for pid in (int(d) for d in _listdir("/proc") if d.isdigit()):
        if pid == os.getpid():
            continue
        try:
            held = any(os.readlink(f"/proc/{pid}/fd/{fd}") in pipes
                       for fd in os.listdir(f"/proc/{pid}/fd"))
            if held:
                with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
                    comm = f.read().strip()
                os.kill(pid, signal.SIGKILL)
                ended.append(f"{comm} (pid {pid})")
        except OSError:  # gone meanwhile, or not ours to read or end
            continue
    return ended


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def run_tool(cmd: list, *, probe: bool = False, env: dict | None = None,
             name: str | None = None) -> subprocess.CompletedProcess:
    """Run an external tool with a time limit, capturing its output as text.

    The tool gets its own process group (killed whole on timeout or on any exception here,
    KeyboardInterrupt included, so none of its children outlives it). Raises BuildError
    naming the tool when it cannot start or does not finish within the limit; the whole
    call then ends within the limit plus COLLECT_TIMEOUT_S, whatever the tool's children do.
    """
    name = name or Path(cmd[0]).name
    limit = tool_timeout(probe)
    try:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True,
                                preexec_fn=functools.partial(die_with_parent, os.getpid(),
                                                             signal.SIGKILL))
    except OSError as exc:
        raise BuildError(f"{name} could not be started: {exc.strerror or exc}") from None
    _ACTIVE_TOOLS.add(proc.pid)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        finished = proc.poll()  # the tool itself may have ended, a child holding its output
        kill_group(proc.pid)
        left = end_pipe_holders(proc)
        _collect_after_kill(proc)
        ended = (f"; ended {', '.join(left)}, which it left running" if left else "")
        if finished is not None:
            raise BuildError(f"{name} finished (exit {finished}), but a process it started "
                             f"kept its output open past {limit:g} s{ended} "
                             f"({TOOL_TIMEOUT_ENV} sets the limit in seconds)") from None
        raise BuildError(f"{name} did not finish within {limit:g} s{ended} "
                         f"({TOOL_TIMEOUT_ENV} sets the limit in seconds)") from None
    except BaseException:
        kill_group(proc.pid)
        _collect_after_kill(proc)
        raise
    finally:
        _ACTIVE_TOOLS.discard(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_group(proc: subprocess.Popen, grace_s: float = GROUP_GRACE_S) -> None:
    """SIGTERM to the process group that ``proc`` leads, SIGKILL to whatever is left of it
    after ``grace_s``; then reap ``proc`` (bounded: it was killed)."""
    kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.05)
    kill_group(proc.pid)
    try:
        proc.wait(timeout=COLLECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass


class sigterm_as_exit:
    """While active in the main thread, SIGTERM raises SystemExit(143) like Ctrl-C raises
    KeyboardInterrupt, so the caller's cleanup (finally blocks) runs for both."""

    def __enter__(self):
        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGTERM, _raise_exit)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)
