"""No hang, no traceback, no poisoned cache.

The build cache survives damage, moves and interrupted builds; every external tool has a
time limit; a kernel that never completes is reported and the process exits (proved with
fake CUDA events: there is no GPU here); user mistakes end in one line before any work.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tirx_gemm import registry
from tirx_gemm.compile import bundle
from tirx_gemm.run import launcher
from tirx_gemm.run import runner
from tirx_gemm.compile.api import BuildError, build, build_many, cache_key, find_tool, run_tool

ROOT = Path(__file__).resolve().parent.parent
NVCC = find_tool("nvcc")  # the real one (the wheel's, unless TIRX_GEMM_SYSTEM_CUDA=1)
STEP = registry.get("v3", "sm_90a")
SHAPE = (256, 384, 512)
SHAPE_ARGS = ("v3", "--arch", "sm_90a", "--mnk", ",".join(map(str, SHAPE)))


from support import cli, one_line_error as _one_line_error  # noqa: E402


def _entries(cache: Path) -> list[Path]:
    d = cache / "builds"
    return sorted(d.iterdir()) if d.is_dir() else []


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """True once ``pid`` no longer runs: SIGKILL is delivered asynchronously, so a process
    just killed may be seen for a moment; a live one is still there after ``within_s``."""
    deadline = time.monotonic() + within_s
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): only a process that runs counts
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 120.0):
    """Until ``path`` exists (the fake tool started); fail if the build ended first."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _fake_nvcc(tmp_path: Path, *, hang_version: bool) -> Path:
    """An nvcc that hangs (writing its pid first); ``nvcc --version`` and the toolchain
    key's ``nvcc --dryrun`` probe are the real one unless hang_version."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "nvcc.pid"
    version = "" if hang_version else f'case "$*" in *--version*|*--dryrun*) exec {NVCC} "$@";; esac\n'
    (bin_dir / "nvcc").write_text(f"#!/bin/sh\n{version}echo $$ > {pid_file}\nexec sleep 600\n")
    (bin_dir / "nvcc").chmod(0o755)
    return bin_dir


def _path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def _fake_env(bin_dir: Path) -> dict:
    """PATH with the fake nvcc first, in the system-CUDA mode that takes nvcc from PATH (by
    default nvcc comes from the nvidia-cuda-nvcc wheel, whatever PATH says)."""
    return {"PATH": _path_with(bin_dir), "TIRX_GEMM_SYSTEM_CUDA": "1", "CUDA_HOME": "",
            "CUDA_PATH": ""}


# --------------------------------------------------------------------------------------
# 1. build cache
# --------------------------------------------------------------------------------------


# the entries these tests start from, built once in the session's cache (tests/conftest.py;
# already there when tests/test_build.py ran first) and copied into each test's own cache:
# an entry is relocatable (test_a_moved_cache_folder_still_works), so a copy is the entry a
# build would have written, without paying for the build again
SEED_REQUESTS = ([(STEP, SHAPE, {}), (registry.get("v4", "sm_90a"), SHAPE, {})]
                 + [(s, s.canonical, {}) for s in registry.all_steps("sm_90a")])


@pytest.fixture(scope="module")
def seeds():
    """{(step key, shape): entry folder in the session cache} for SEED_REQUESTS."""
    out = {}
    for (step, mnk, _), res in zip(SEED_REQUESTS, build_many(SEED_REQUESTS)):
        if isinstance(res, Exception):
            raise res
        out[(step.key, mnk)] = Path(res.dir)
    return out


def _seed(cache: Path, seeds: dict, step=STEP, mnk=SHAPE) -> Path:
    """Copy the session's entry of (step, mnk) into ``cache``; its path there."""
    src = seeds[(step.key, tuple(mnk))]
    dst = cache / "builds" / src.name
    shutil.copytree(src, dst)
    return dst


def test_damaged_cache_entries_are_rebuilt_with_a_notice(cache, seeds):
    """Four kinds of damage, one on each of four entries; one `tirx-gemm build` names each
    with its reason and rebuilds exactly those (the undamaged ones stay cache hits)."""
    steps = registry.all_steps("sm_90a")
    entries = {s.id: _seed(cache, seeds, s, s.canonical) for s in steps}
    damages = {
        "v1": ("meta.json is not readable JSON",
               lambda e: (e / "meta.json").write_text("garbage{")),
        "v2": ("kernel.so is missing or empty", lambda e: (e / "kernel.so").write_bytes(b"")),
        "v3": ("kernel.cubin is missing or empty", lambda e: (e / "kernel.cubin").unlink()),
        "v4": ("meta.json has the wrong fields", lambda e: (e / "meta.json").write_text(
            json.dumps({"key": e.name, "step": "v4"}))),
    }
    for sid, (_, damage) in damages.items():
        damage(entries[sid])
    out = cli("build", "--all", "--arch", "sm_90a")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()
            if line.split() and line.split()[0] in entries}
    assert sorted(rows) == sorted(entries), out.stdout
    for sid, entry in entries.items():
        if sid in damages:
            assert f"cache entry {entry} is invalid ({damages[sid][0]}" in out.stderr, sid
            assert "cached" not in rows[sid], f"{sid} was damaged: it must be rebuilt"
        else:
            assert f"cache entry {entry} is invalid" not in out.stderr, sid
            assert "cached" in rows[sid], f"{sid} was intact: it must stay a cache hit"
    again = build_many([(s, s.canonical, {}) for s in steps])
    assert all(r.cached and r.lib_path.stat().st_size > 0 for r in again)
    assert _entries(cache) == sorted(entries.values())


def test_no_cache_rebuilds_and_replaces_the_entry(cache, seeds):
    entry = _seed(cache, seeds)
    marker = entry / "marker"
    marker.write_text("from the old entry")
    res = build(STEP.id, *SHAPE, arch=STEP.arch, use_cache=False)
    assert not res.cached and Path(res.dir) == entry
    assert not marker.exists(), "--no-cache must replace the entry, not keep the old one"
    assert _entries(cache) == [entry]


def test_a_moved_cache_folder_still_works(cache, seeds, tmp_path):
    """An entry built in another cache folder (the session's) and copied here is a cache
    hit from its new place, and exports without a rebuild."""
    origin = seeds[(STEP.key, SHAPE)]
    entry = _seed(cache, seeds)
    assert str(origin.parent.parent) not in (entry / "meta.json").read_text()
    res = build(STEP.id, *SHAPE, arch=STEP.arch)
    assert res.cached and Path(res.dir) == entry
    assert "__global__" in res.cuda_source and res.lib_path.is_file()
    out = cli("export", *SHAPE_ARGS, "--out", str(tmp_path / "bundle"), "-q")
    assert out.returncode == 0, out.stderr
    assert "built" not in out.stderr  # exported from the copied entry, not rebuilt
    assert (tmp_path / "bundle" / bundle.MANIFEST).is_file()
    assert _entries(cache) == [entry]


# Ctrl-C / SIGTERM during a build (exit 130 / 143, no work folder, no server, fork server,
# worker or tool left): tests/test_build_pool.py::test_no_pool_process_outlives_an_interrupted_build


LOCK_HOLDER = ("import sys, time; from tirx_gemm.compile.cache import WorkFolder; "
               "w = WorkFolder(sys.argv[1]); print(w.path, flush=True); time.sleep(600)")


def test_killed_build_does_not_poison_the_next(cache, tmp_path):
    """A SIGKILLed build can clean nothing up: its tool dies with it, and the next build
    sweeps the work folders whose lock is free (their builder is gone), leaves a running
    build's alone (its lock is held), and builds afresh."""
    bin_dir = _fake_nvcc(tmp_path, hang_version=False)
    proc = subprocess.Popen([sys.executable, "-m", "tirx_gemm.cli", "build", *SHAPE_ARGS],
                            cwd=ROOT, env={**os.environ, **_fake_env(bin_dir)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = tmp_path / "nvcc.pid"
    _wait_for(pid_file, proc)
    proc.kill()
    proc.wait()
    assert _gone(int(pid_file.read_text()), within_s=30), "the tool dies with a SIGKILLed build"
    builds = cache / "builds"
    # what the killed build left: its work folder, whose owner.lock nobody holds any more
    left = [d for d in builds.iterdir() if "." in d.name]
    assert left and all((d / "owner.lock").is_file() for d in left), left
    # a build running elsewhere (another process, maybe another PID namespace): its work
    # folder's lock is held, whatever PID it has
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, "0123456789abcdef0123"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        live = Path(holder.stdout.readline().strip())
        assert live.is_dir()
        res = build(STEP.id, *SHAPE, arch=STEP.arch)
        assert live.exists(), "a running build's work folder must be left alone"
        assert _entries(cache) == sorted([Path(res.dir), live])
    finally:
        holder.kill()
        holder.wait()
    assert not res.cached and res.lib_path.stat().st_size > 0
    assert not any(d.exists() for d in left), "the killed build's work folder must be swept"


# --------------------------------------------------------------------------------------
# 2. external tools have time limits
# --------------------------------------------------------------------------------------
def test_hung_nvcc_compile_is_a_one_line_error(cache, tmp_path):
    bin_dir = _fake_nvcc(tmp_path, hang_version=False)
    out = cli("build", *SHAPE_ARGS, env={**_fake_env(bin_dir),
                                         "TIRX_GEMM_TOOL_TIMEOUT": "1"})
    _one_line_error(out, "nvcc did not finish within 1 s")
    assert "(TIRX_GEMM_TOOL_TIMEOUT sets the limit" in out.stderr
    assert _entries(cache) == []
    assert _gone(int((tmp_path / "nvcc.pid").read_text())), "the hung nvcc must be killed"


def test_hung_nvcc_version_probe_is_a_one_line_error(cache, tmp_path):
    bin_dir = _fake_nvcc(tmp_path, hang_version=True)
    out = cli("build", *SHAPE_ARGS, env={**_fake_env(bin_dir),
                                         "TIRX_GEMM_TOOL_TIMEOUT": "1"})
    _one_line_error(out, "nvcc --version did not finish within 1 s")


def test_run_tool_kills_the_tools_children_on_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("TIRX_GEMM_TOOL_TIMEOUT", "0.5")
    child = tmp_path / "child.pid"
    script = tmp_path / "tool"
    script.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {child}\nwait\n")
    script.chmod(0o755)
    with pytest.raises(BuildError, match=r"^tool did not finish within 0.5 s"):
        run_tool([script])
    assert _gone(int(child.read_text())), "the tool's child outlived the tool's time limit"


def test_bad_tool_timeout_value(monkeypatch):
    monkeypatch.setenv("TIRX_GEMM_TOOL_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TIRX_GEMM_TOOL_TIMEOUT='soon' must be a positive"):
        run_tool(["true"])


def test_missing_nvcc_is_one_line(cache, tmp_path):
    bin_dir = tmp_path / "empty"
    bin_dir.mkdir()
    out = cli("build", *SHAPE_ARGS, env={"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin",
                                         "TIRX_GEMM_SYSTEM_CUDA": "1", "CUDA_HOME": "",
                                         "CUDA_PATH": ""})
    _one_line_error(out, "nvcc not found on PATH")


# --------------------------------------------------------------------------------------
# 3. host-side hang guard (fake CUDA events: no GPU here)
# --------------------------------------------------------------------------------------
class _NeverDone:
    def record(self):
        pass

    def query(self):
        return False


def _cpu_operands(M, N, K):
    return (torch.zeros(M, K, dtype=torch.float16), torch.zeros(N, K, dtype=torch.float16),
            torch.zeros(M, N, dtype=torch.float16))


def test_launch_of_a_hanging_kernel_reports_and_exits():
    """In a real process: launch() waits through the guard, which prints the one-line
    report and leaves with os._exit (no cleanup can block on the GPU)."""
    code = textwrap.dedent("""
        import torch
        from tirx_gemm.run import launcher
        class NeverDone:
            def record(self): pass
            def query(self): return False
        torch.cuda.Event = NeverDone
        torch.cuda.synchronize = lambda: (_ for _ in ()).throw(AssertionError("blocked"))
        launcher.validate_inputs = lambda *a, **k: None
        launcher.check_capability = lambda *a, **k: None
        ops = [torch.zeros(s, dtype=torch.float16) for s in ((256, 512), (384, 512), (256, 384))]
        meta = {"step": "v4", "arch": "sm_90a", "M": 256, "N": 384, "K": 512}
        launcher.launch(lambda *a: None, meta, *ops)
        print("not reached")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "TIRX_GEMM_KERNEL_TIMEOUT": "0.2"})
    assert out.returncode == launcher.HANG_EXIT_CODE, out.stderr
    assert "not reached" not in out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "v4@sm_90a 256x384x512: no completion within 0.2 s (kernel hang)"), out.stderr


class _Exited(BaseException):  # like SystemExit: no "except Exception" may swallow it
    pass


@pytest.fixture
def guard(monkeypatch):
    """Fake GPU waits: os._exit raises _Exited(code); the limit is 0.05 s."""
    monkeypatch.setenv("TIRX_GEMM_KERNEL_TIMEOUT", "0.05")
    monkeypatch.setattr(launcher.os, "_exit", lambda code: (_ for _ in ()).throw(_Exited(code)))
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synced.append(1))
    return synced


def test_run_step_labels_every_wait_with_step_arch_and_shape(guard, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "Event", _NeverDone)

    def check_device(arch, device=None):  # the first wait of run_step happens after this
        launcher.synchronize("preparing inputs")

    monkeypatch.setattr(runner, "check_device", check_device)
    meta = {"step": "v7", "arch": "sm_90a", "M": 4096, "N": 4096, "K": 4096}
    with pytest.raises(_Exited) as exc:
        runner.run_step(lambda *a: None, meta, log=None)
    assert exc.value.args == (launcher.HANG_EXIT_CODE,)
    assert capsys.readouterr().err.startswith(
        "v7@sm_90a 4096x4096x4096: no completion within 0.05 s (kernel hang)")
    assert launcher._launch_label is None, "the label is cleared after the step"
    assert guard == [], "a hung kernel is never waited for without a limit"


def test_completed_wait_returns_and_surfaces_async_errors(guard, monkeypatch):
    polls = []

    class DoneAfterThree(_NeverDone):
        def query(self):
            polls.append(1)
            return len(polls) >= 3

    monkeypatch.setattr(torch.cuda, "Event", DoneAfterThree)
    meta = launcher.BuildMeta("v2", "sm_90a", 128, 128, 256)
    monkeypatch.setattr(launcher, "validate_inputs", lambda *a, **k: None)
    monkeypatch.setattr(launcher, "check_capability", lambda *a, **k: None)
    launched = []
    launcher.launch(lambda *a: launched.append(a), meta, *_cpu_operands(128, 128, 256))
    assert launched and len(polls) == 3 and guard == [1]


def test_faulting_kernel_is_a_launch_error_not_a_hang(guard, monkeypatch):
    class Faulted(_NeverDone):
        def query(self):
            raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(torch.cuda, "Event", Faulted)
    with pytest.raises(launcher.KernelLaunchError, match="v1@sm_90a 128x128x64 failed on the "
                                                       "GPU: CUDA error: unspecified launch"):
        launcher.synchronize("v1@sm_90a 128x128x64")


def test_bad_kernel_timeout_value(monkeypatch):
    monkeypatch.setenv("TIRX_GEMM_KERNEL_TIMEOUT", "-1")
    with pytest.raises(ValueError, match="TIRX_GEMM_KERNEL_TIMEOUT='-1' must be a positive"):
        launcher.kernel_timeout()


# --------------------------------------------------------------------------------------
# watchdog plumbing (the kernel side is helpers.set_watchdog)
# --------------------------------------------------------------------------------------
def test_watchdog_is_part_of_the_cache_key_and_the_bundle_name():
    assert cache_key(STEP, *SHAPE, {}) != cache_key(STEP, *SHAPE, {}, 2000)
    assert cache_key(STEP, *SHAPE, {}, 2000) != cache_key(STEP, *SHAPE, {}, 1000)
    assert bundle.lib_name("v3", "sm_90a", 256, 384, 512, {}, 2000).endswith("_wd2000.so")
    assert "_wd" not in bundle.lib_name("v3", "sm_90a", 256, 384, 512, {})


def test_watchdog_build_reaches_the_builder(cache, seeds):
    """v4 waits on mbarriers (v3 does not): its watchdog build bounds them, the normal one
    (the session's, copied here) does not, and both are cached side by side."""
    _seed(cache, seeds, registry.get("v4", "sm_90a"), SHAPE)
    plain = build("v4", *SHAPE, arch="sm_90a")
    assert plain.cached
    guarded = build("v4", *SHAPE, arch="sm_90a", watchdog_ms=2000)
    assert (plain.watchdog_ms, guarded.watchdog_ms) == (None, 2000)
    assert "watchdog" not in plain.cuda_source and "watchdog" in guarded.cuda_source
    assert plain.key != guarded.key and len(_entries(cache)) == 2
    assert build("v4", *SHAPE, arch="sm_90a", watchdog_ms=2000).cached


def test_bundle_find_respects_the_watchdog(tmp_path):
    entry = {"step": "v3", "arch": "sm_90a", "M": 256, "N": 384, "K": 512, "kwargs": {},
             "dtype": "float16", "watchdog_ms": None, "lib": "v3_sm_90a_256x384x512.so"}
    files = {}
    for rel, data in ((entry["lib"], b"kernel"), *((f"runtime/{n}", b"rt")
                                                  for n in bundle.RUNTIME_LIBS)):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(data)
        files[rel] = bundle.file_sha256(tmp_path / rel)
    entry["sha256"] = files[entry["lib"]]
    entry["binding"] = bundle.kernel_binding(entry)
    (tmp_path / bundle.MANIFEST).write_text(json.dumps({"format": bundle.FORMAT,
                                                        "kernels": [entry], "files": files}))
    assert bundle.find(tmp_path, STEP, SHAPE)["lib"] == entry["lib"]
    with pytest.raises(ValueError, match="built with watchdog_ms None, not 2000"):
        bundle.find(tmp_path, STEP, SHAPE, watchdog_ms=2000)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "2000"])
def test_watchdog_and_jobs_values_are_checked_before_work(bad):
    with pytest.raises(ValueError, match="watchdog_ms=.* must be a positive integer"):
        build_many([(STEP, SHAPE, {})], watchdog_ms=bad)
    with pytest.raises(ValueError, match="jobs=.* must be a positive integer"):
        build_many([(STEP, SHAPE, {})], jobs=bad)


# --------------------------------------------------------------------------------------
# 4. user mistakes: one line, exit 2, before any work
# --------------------------------------------------------------------------------------
MISTAKES = [
    (("build", "v3", "--mnk", "256,256,128", "--jobs", "-1"), "--jobs: must be a positive integer"),
    (("build", "v3", "--jobs", "0"), "--jobs: must be a positive integer"),
    (("export", "v6", "--arch", "sm_90a", "--num-sms", "0"), "--num-sms: must be a positive"),
    (("build", "v4", "--all"), "name a step (v4) or pass --all, not both"),
    (("regress", "--tolerance", "15"), "--tolerance: must be a fraction in [0, 1)"),
    (("export", "v4", "--arch", "sm_90a", "--out", "README.md/x"),
     "README.md is a file"),
    (("export", "--all", "--arch", "sm_90a", "--mnk", "256,256,128", "--out", "build/qa"),
     "--mnk names one shape, which not every step accepts"),
    (("build", "v3", "--mnk", "65536,128,65536"), "M*K=4294967296 elements exceeds 2^31-1"),
    (("build", "v3", "--mnk", "10000000,10000000,10000000"), "exceeds 2^31-1"),
    (("build", "v3", "--mnk", "0,128,64"), "M=0 must be a positive integer"),
    (("bench", "--shapes", "benchmark"), "unknown shape list 'benchmark'"),
    (("run", "v3", "--watchdog-ms", "0"), "--watchdog-ms: must be a positive integer"),
    (("build", "v4", "--dtype", "fp32"), "--dtype 'fp32' is not one of float16, bfloat16"),
    (("export", "v4", "--arch", "sm_90a", "--shapes", "everything"),
     "unknown shape list 'everything'"),
    (("export", "v4", "--arch", "sm_90a", "--shapes", "1,264"), "three integers"),
    (("sim", "v4", "--dtype", "float32"), "--dtype 'float32' is not one of float16, bfloat16"),
]


@pytest.mark.parametrize("args,needle", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_user_mistakes_are_one_line_errors_before_any_work(cache, args, needle):
    out = cli(*args)
    _one_line_error(out, needle)
    assert _entries(cache) == [], "nothing may be built before the values are checked"
    assert not (ROOT / "build" / "qa").exists()


def test_debug_env_shows_the_traceback(cache):
    out = cli("build", "v4", "--all", env={"TIRX_GEMM_DEBUG": "1"})
    assert out.returncode == 2
    assert "Traceback" in out.stderr and out.stderr.strip().endswith(
        "tirx-gemm: error: name a step (v4) or pass --all, not both")


@pytest.mark.parametrize("args,env", [
    (("run", "v3", "--arch", "sm_90a"), {"TIRX_GEMM_KERNEL_TIMEOUT": "soon"}),
    (("regress",), {"TIRX_GEMM_KERNEL_TIMEOUT": "0"}),
    (("build", "v3", "--arch", "sm_90a"), {"TIRX_GEMM_TOOL_TIMEOUT": "-3"}),
], ids=["run-kernel-timeout", "regress-kernel-timeout", "build-tool-timeout"])
def test_bad_limit_variables_are_one_line_errors_before_any_work(cache, args, env):
    out = cli(*args, env=env)
    (name, value), = env.items()
    _one_line_error(out, f"{name}={value!r} must be a positive number of seconds")
    assert _entries(cache) == []
