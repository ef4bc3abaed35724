"""The build worker pool (concurrent.futures over a multiprocessing fork server).

Every build runs in a fresh process; a build whose process dies fails alone, with a clear
BuildError, while the other requests still build; the server, its fork server and its
workers leave no process behind, whether the builds finish or are interrupted.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tirx_gemm import registry
from tirx_gemm.compile.api import BuildError, build_many, find_tool

ROOT = Path(__file__).resolve().parent.parent
NVCC = find_tool("nvcc")  # the real one
STEP = registry.get("v2", "sm_90a")  # small kernels: quick builds
SHAPES = [(128, 128, 64), (128, 128, 512), (128, 128, 1024)]




def _fake_nvcc(tmp_path: Path, body: str) -> dict:
    """Environment whose nvcc runs ``body`` (sh; $PPID is the build's worker process), then
    the real nvcc; ``nvcc --version`` and the toolchain key's ``nvcc --dryrun`` probe (made
    by the caller's process, not a build's) are the real one. Each call appends "<worker pid>
    <worker's process group> <the -o path>" to tmp_path/calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "nvcc").write_text(
        "#!/bin/sh\n"
        f'case "$*" in *--version*|*--dryrun*) exec {NVCC} "$@";; esac\n'
        'out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'
        f'echo "$PPID $(cut -d" " -f5 /proc/$PPID/stat) $out" >> {calls}\n'
        f"{body}\n"
        f'exec {NVCC} "$@"\n')
    (bin_dir / "nvcc").chmod(0o755)
    # system-CUDA mode takes nvcc from PATH (by default it comes from the wheel)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TIRX_GEMM_SYSTEM_CUDA": "1",
            "CUDA_HOME": "", "CUDA_PATH": ""}


def _calls(tmp_path: Path) -> list[tuple[int, int, str]]:
    lines = (tmp_path / "calls").read_text().split("\n")
    return [(int(p), int(g), o) for p, g, o in (ln.split(" ", 2) for ln in lines if ln)]


def _stat(pid) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, pgrp, ...]."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` still runs (a zombie has finished running)."""
    return any(f and f[0] != "Z" and int(f[2]) == pgid
               for f in map(_stat, (p.name for p in Path("/proc").iterdir() if p.name.isdigit())))


def _pid_alive(pid: int) -> bool:
    f = _stat(pid)
    return bool(f) and f[0] != "Z"



def test_a_dying_build_fails_alone_and_every_build_has_its_own_process(cache, tmp_path,
                                                                       monkeypatch, soon):
    # nvcc kills the process of the first build that calls it, and of each retry of that
    # build, outright, as a crash in TVM would
    crash = (f'key=$(basename $(dirname "$out")); key=${{key%%.*}}; f={tmp_path}/crash_key\n'
             'if mkdir "$f.lock" 2>/dev/null; then echo "$key" > "$f"; fi\n'
             'if [ "$(cat "$f" 2>/dev/null)" = "$key" ]; then\n'
             '  kill -SEGV $PPID; sleep 5; exit 1\n'
             'fi')
    for k, v in _fake_nvcc(tmp_path, crash).items():
        monkeypatch.setenv(k, v)
    reqs = [(STEP, shape, {}) for shape in SHAPES]
    done = []
    out = build_many(reqs, jobs=2, progress=lambda i, n, req, res: done.append(req[1]))
    calls = _calls(tmp_path)
    crash_key = (tmp_path / "crash_key").read_text().strip()
    crashed = [i for i, r in enumerate(out) if isinstance(r, Exception)]
    assert len(crashed) == 1, out
    exc = out[crashed[0]]
    assert isinstance(exc, BuildError)
    # its exit status (TVM's own crash handler may exit with 255 instead of the signal)
    assert re.search(r"the build process died \(exit (-11, SIGSEGV|255)\) before reporting a "
                     "result", str(exc)), exc
    assert "Fatal Python error: Segmentation fault" in str(exc)  # its log: where it died
    key = [r.key for r in out if not isinstance(r, Exception)]
    assert len(key) == len(SHAPES) - 1 and crash_key not in key
    for r in out:
        if not isinstance(r, Exception):
            assert not r.cached and r.lib_path.stat().st_size > 0
    assert sorted(done) == sorted(SHAPES)  # progress once per request
    # every nvcc call came from its own build process (a rerun gets a fresh one too)
    assert len({pid for pid, _, _ in calls}) == len(calls)
    t = time.monotonic()
    assert soon(lambda: not _group_alive(calls[0][1]), 5), "the pool outlived build_many"
    print(f"pool gone {time.monotonic() - t:.3f} s after build_many")
    assert sorted(p.name for p in (cache / "builds").iterdir()) == sorted(key)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                      (signal.SIGKILL, -signal.SIGKILL)])
def test_no_pool_process_outlives_an_interrupted_build(cache, tmp_path, sig, code, soon):
    """Ctrl-C and SIGTERM end the build with 130 and 143 and leave no work folder; after any
    of them, SIGKILL included, no server, fork server, worker or nvcc is left."""
    env = _fake_nvcc(tmp_path, f"echo $$ >> {tmp_path}/nvcc.pids; exec sleep 600")
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, "
         "signal.default_int_handler); from tirx_gemm.cli import main; sys.exit(main())",
         "build", "--all", "--arch", "sm_90a", "--jobs", "2"],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    pid_file = tmp_path / "nvcc.pids"
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no build reached nvcc"
        time.sleep(0.05)
    pgid = _calls(tmp_path)[0][1]  # the server's group: server, fork server, workers
    assert pgid != os.getpgrp() and _group_alive(pgid)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == code
    assert soon(lambda: not _group_alive(pgid)), \
        "a server, fork server or worker outlived the build"
    for nvcc in map(int, pid_file.read_text().split()):
        assert soon(lambda: not _pid_alive(nvcc)), "nvcc outlived the build"
    if sig != signal.SIGKILL:
        assert not (cache / "builds").exists() or not list((cache / "builds").iterdir())


def test_a_process_whose_parent_died_before_the_death_signal_was_armed_leaves():
    """die_with_parent arms the parent-death signal and, given the pid that started the
    process, leaves at once (128 + signal) when that pid is no longer the parent: a parent
    that died between the fork and the arming would never send the signal (CI once kept a
    SIGKILLed build's nvcc alive that way)."""
    code = ("import ctypes, os, signal, sys\n"
            "from tirx_gemm.compile.procs import die_with_parent\n"
            "die_with_parent(int(sys.argv[1]), int(sys.argv[2]))\n"
            "libc = ctypes.CDLL(None); sig = ctypes.c_int(-1)\n"
            "libc.prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG\n"
            "print(sig.value)\n")
    for parent, sig, rc, out in ((os.getpid(), signal.SIGTERM, 0, str(int(signal.SIGTERM))),
                                 (os.getpid(), signal.SIGKILL, 0, str(int(signal.SIGKILL))),
                                 (1 if os.getpid() != 1 else 2, signal.SIGTERM, 143, ""),
                                 (1 if os.getpid() != 1 else 2, signal.SIGKILL, 137, "")):
        res = subprocess.run([sys.executable, "-c", code, str(parent), str(int(sig))],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert (res.returncode, res.stdout.strip()) == (rc, out), (parent, sig, res.stderr)


def test_pool_workers_check_their_parent_against_the_fork_server_pid():
    """The chain's pids reach who checks them: a pool worker, forked by the fork server that
    server_main's environment started, has that fork server as its parent, the same pid in
    its environment (what die_with_parent compared), SIGTERM armed for its parent's death;
    and run_tool's tools get SIGKILL armed."""
    code = """if True:
        import json, os, signal, sys
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing
        from tirx_gemm.compile import pool, procs
        os.environ[pool._SERVER_PID] = str(os.getpid())  # as server_main does
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(pool.POOL_PRELOAD[:1])
        with ProcessPoolExecutor(1, mp_context=ctx, initializer=pool._pool_worker_init,
                                 max_tasks_per_child=1) as ex:
            got = [ex.submit(f, *a).result(timeout=120) for f, a in
                   ((os.getppid, ()), (os.getenv, (pool._FORK_SERVER_PID,)),
                    (procs.parent_death_signal, ()))]
        tool = procs.run_tool([sys.executable, "-c",
                               "from tirx_gemm.compile import procs; "
                               "print(procs.parent_death_signal())"])
        print(json.dumps([os.getpid(), *got, tool.stdout.strip()]))
    """
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    me, ppid, env_pid, sig, tool_sig = json.loads(res.stdout.strip().splitlines()[-1])
    assert ppid == int(env_pid) != me  # the worker's parent: the fork server, not the server
    assert (sig, tool_sig) == (int(signal.SIGTERM), str(int(signal.SIGKILL)))


# dotted below tirx_gemm: the build subpackage and the settings it reads
BUILD_MODULES = ("compile.api", "compile.cache", "compile.cudalibs", "compile.doctor",
                 "compile.forkserver_entry", "compile.pipeline", "compile.pool", "compile.procs",
                 "settings", "compile.toolchain")


def test_importing_the_build_modules_does_nothing():
    """No import-time side effect: importing every build module (the fork server's entry
    module too) loads no CUDA library, sets no parent-death signal and starts no process;
    only the fork server runs prepare_fork_server (through its entry module)."""
    code = ("import ctypes, os, sys\n"
            f"for m in {BUILD_MODULES!r}: __import__('tirx_gemm.' + m)\n"
            "from tirx_gemm.compile import cudalibs\n"
            "libc = ctypes.CDLL(None); sig = ctypes.c_int(-1)\n"
            "libc.prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG\n"
            "maps = open('/proc/self/maps').read()\n"
            "print(cudalibs._LOADED, sig.value, 'libcuda' in maps, 'libcudart' in maps,\n"
            "      'tvm' in sys.modules, os.listdir('/proc/self/task').__len__())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["{}", "0", "False", "False", "False", "1"], out.stdout


def test_the_build_modules_import_no_circle():
    """The module-level imports among tirx_gemm's build modules form no cycle."""
    import ast
    graph = {}
    for name in BUILD_MODULES:
        tree = ast.parse((ROOT / "tirx_gemm" / f"{name.replace('.', '/')}.py").read_text())
        deps = set()
        for node in tree.body:  # module level only (function-level imports run later)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tirx_gemm"):
                pkg = node.module[len("tirx_gemm"):].lstrip(".")
                deps |= {f"{pkg}.{a.name}" if pkg else a.name for a in node.names} | {pkg}
            elif isinstance(node, ast.Import):
                deps |= {a.name[len("tirx_gemm."):] for a in node.names
                         if a.name.startswith("tirx_gemm.")}
        graph[name] = deps & set(BUILD_MODULES)
    assert graph["compile.api"] >= {"compile.cache", "compile.pool", "compile.pipeline",
                                    "compile.toolchain"}, graph  # parsed
    done, path = set(), []

    def visit(n):
        assert n not in path, f"import circle: {' -> '.join(path + [n])}"
        if n in done:
            return
        path.append(n)
        for d in sorted(graph[n]):
            visit(d)
        path.pop()
        done.add(n)

    for n in BUILD_MODULES:
        visit(n)
