"""The build cache against what an attacker or an unlucky machine would try: damaged,
swapped and foreign cache entries, work folders of builds that are gone or still running,
a tool whose child holds its output open after a timeout, limits that would switch a time
limit off, and a damaged stub libcuda. Each case asserts its outcome: refused with one line
naming why, rebuilt, kept or bounded; never served, never a traceback, never a hang.

Builds: the seed entry (v1@sm_90a at its canonical shape) comes from the session's cache
(tests/conftest.py; tests/test_build.py builds it too); one test rebuilds for real.
"""
import re
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tirx_gemm import registry, settings
from tirx_gemm.compile import cache
from tirx_gemm.compile import cudalibs
from tirx_gemm.compile import procs
from tirx_gemm.compile import toolchain
from tirx_gemm.compile.api import build, build_many
from tirx_gemm.compile.cache import WorkFolder, cache_key, load_cached, read_entry, sweep_stale
from tirx_gemm.compile.procs import BuildError, run_tool

ROOT = Path(__file__).resolve().parent.parent
STEP = registry.get("v1", "sm_90a")
SHAPE = STEP.canonical
ARGS = ("v1", "--arch", "sm_90a")


from support import cli, one_line_error as _one_line_error  # noqa: E402


@pytest.fixture(scope="module")
def seed() -> Path:
    """The session cache's entry of v1@sm_90a (built there if missing)."""
    res = build_many([(STEP, SHAPE, {})])[0]
    return Path(res.dir)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TIRX_GEMM_CACHE", str(d))
    return d


@pytest.fixture
def entry(cache_dir, seed) -> Path:
    """A copy of the seed entry in this test's own cache (an entry is relocatable)."""
    dst = cache_dir / "builds" / seed.name
    shutil.copytree(seed, dst)
    assert load_cached(STEP, *SHAPE, {}) is not None, "the copied entry is a cache hit"
    return dst


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _symlink_outside(entry: Path, name: str, tmp_path: Path) -> None:
    """Replace ``name`` by a symlink to an identical copy outside the cache: same bytes, so
    only the symlink rule can refuse it."""
    outside = tmp_path / f"outside-{name}"
    shutil.copy(entry / name, outside)
    (entry / name).unlink()
    (entry / name).symlink_to(outside)


def _meta_hash_wrong(entry: Path) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    meta["sha256"]["kernel.cubin"] = "0" * 64
    (entry / "meta.json").write_text(json.dumps(meta))


def _meta_without_hashes(entry: Path) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    del meta["sha256"]
    (entry / "meta.json").write_text(json.dumps(meta))


DAMAGE = {
    "tampered-so": (lambda e, t: _flip(e / "kernel.so"),
                    "kernel.so does not match the sha256 in meta.json"),
    "truncated-so": (lambda e, t: (e / "kernel.so").write_bytes(
        (e / "kernel.so").read_bytes()[:1000]), "kernel.so does not match the sha256"),
    "random-so": (lambda e, t: (e / "kernel.so").write_bytes(os.urandom(
        (e / "kernel.so").stat().st_size)), "kernel.so does not match the sha256"),
    "tampered-cubin": (lambda e, t: _flip(e / "kernel.cubin"),
                       "kernel.cubin does not match the sha256"),
    "symlinked-so": (lambda e, t: _symlink_outside(e, "kernel.so", t), "kernel.so is a symlink"),
    "symlinked-meta": (lambda e, t: _symlink_outside(e, "meta.json", t),
                       "meta.json is a symlink"),
    "symlink-planted": (lambda e, t: (e / "extra").symlink_to("/etc/passwd"),
                        "extra is a symlink"),
    "meta-hash-mismatch": (lambda e, t: _meta_hash_wrong(e),
                           "kernel.cubin does not match the sha256 in meta.json"),
    "meta-without-hashes": (lambda e, t: _meta_without_hashes(e),
                            "meta.json holds no sha256 of kernel.cu"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_or_swapped_entry_is_never_served(entry, tmp_path, capsys, case):
    damage, reason = DAMAGE[case]
    damage(entry, tmp_path)
    capsys.readouterr()
    assert load_cached(STEP, *SHAPE, {}) is None, f"{case}: served"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"tirx-gemm: cache entry {entry} is invalid ("), err
    assert reason in err[0] and err[0].endswith("; rebuilding"), err


def test_a_symlinked_entry_is_never_served(cache_dir, seed, capsys):
    """The entry folder itself a symlink to a folder outside the cache (an intact copy)."""
    outside = cache_dir.parent / "outside-entry"
    shutil.copytree(seed, outside)
    (cache_dir / "builds").mkdir(parents=True)
    (cache_dir / "builds" / seed.name).symlink_to(outside)
    assert load_cached(STEP, *SHAPE, {}) is None
    assert "is invalid (the entry is a symlink); rebuilding" in capsys.readouterr().err


def test_verify_entry_catches_a_change_after_loading(entry):
    res = load_cached(STEP, *SHAPE, {})
    cache.verify_entry(res)  # unchanged: passes
    _flip(entry / "kernel.so")
    with pytest.raises(cache.InvalidEntry, match="kernel.so does not match"):
        cache.verify_entry(res)


def test_a_damaged_entry_and_a_damaged_stub_are_rebuilt(entry, cache_dir):
    """One real build: the entry's kernel.so replaced by random bytes and the stub libcuda
    truncated; `tirx-gemm build` names both in one line each, rebuilds both, exits 0, and
    the new entry checks out."""
    (entry / "kernel.so").write_bytes(os.urandom(4096))
    stub = cudalibs.ensure_stub()
    stub.write_bytes(stub.read_bytes()[:200])
    out = cli("build", *ARGS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert f"cache entry {entry} is invalid (kernel.so does not match" in out.stderr
    assert f"the stub libcuda {stub} is damaged (its sha256 differs" in out.stderr
    assert not re.search(r"^v\d+ .* cached ", out.stdout, re.M)  # the row: rebuilt
    assert cudalibs.stub_problem(stub) is None
    res = read_entry(entry, entry.name)
    assert res.lib_path.stat().st_size > 10_000
    assert res.cubin_path.read_bytes() in res.lib_path.read_bytes()


# --------------------------------------------------------------------------------------
# foreign toolchains
# --------------------------------------------------------------------------------------
def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _other_headers(tmp_path: Path, monkeypatch) -> str:
    """A system CUDA whose nvcc is the real one behind a wrapper, with the wheel's profile,
    ptxas and cicc, but CUDA 12.8's headers."""
    real = Path(toolchain.find_tool("nvcc"))
    root = tmp_path / "cuda"
    _script(root / "bin" / "nvcc", f'exec {real} "$@"\n')
    shutil.copy(real.parent / "nvcc.profile", root / "bin" / "nvcc.profile")
    (root / "bin" / "ptxas").symlink_to(real.parent / "ptxas")
    (root / "nvvm" / "bin").mkdir(parents=True)
    (root / "nvvm" / "bin" / "cicc").symlink_to(real.parent.parent / "nvvm" / "bin" / "cicc")
    (root / "include").mkdir()
    (root / "include" / "cuda.h").write_text("#define CUDA_VERSION 12080\n")
    monkeypatch.setenv(toolchain.SYSTEM_CUDA_ENV, "1")
    monkeypatch.setenv("CUDA_HOME", str(root))
    return "CUDA_VERSION=12080"


def _other_host_compiler(tmp_path: Path, monkeypatch) -> str:
    gcc = _script(tmp_path / "bin" / "gcc", 'echo "gcc (Other) 99.1.0"\n')
    monkeypatch.setenv("NVCC_CCBIN", str(gcc))
    return "gcc (Other) 99.1.0"


def _other_nvcc_release(tmp_path: Path, monkeypatch) -> str:
    _script(tmp_path / "bin" / "nvcc",
            'echo "Cuda compilation tools, release 12.9, V12.9.41"\necho "Build cuda_12.9.r12.9"\n')
    monkeypatch.setenv(toolchain.SYSTEM_CUDA_ENV, "1")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    return "Build cuda_12.9.r12.9"


def _other_nvcc_flags(tmp_path: Path, monkeypatch) -> str:
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-G")
    return "NVCC_APPEND_FLAGS=-G"


@pytest.mark.parametrize("other", [_other_headers, _other_host_compiler, _other_nvcc_release,
                                   _other_nvcc_flags],
                         ids=["headers", "host-compiler", "nvcc-release", "nvcc-env-flags"])
def test_an_entry_of_another_toolchain_is_never_served(entry, tmp_path, monkeypatch, other):
    """The entry in the cache was built by the wheel toolchain; under another one the same
    request has another key, so that entry is a miss, not a hit."""
    mine = toolchain.toolchain_id()
    marker = other(tmp_path, monkeypatch)
    theirs = toolchain.toolchain_id()
    assert theirs != mine and marker in theirs and marker not in mine
    assert cache_key(STEP, *SHAPE, {}) != entry.name
    assert load_cached(STEP, *SHAPE, {}) is None


def test_the_key_names_every_part_of_the_toolchain():
    tc = toolchain.resolved()
    root = str(toolchain.wheel_cuda_root())
    assert tc.ptxas.startswith(root + "/bin/ptxas (Cuda compilation tools, release 13.0")
    assert tc.cicc.startswith(root + "/nvvm/bin/cicc (Cuda compilation tools, release 13.0")
    assert tc.headers[0] == (f"{root}/include (CUDA_VERSION=13000, CUDART_VERSION=13000, "
                             "CCCL_VERSION=3000001)")
    assert "gcc" in tc.host_compiler and "(" in tc.host_compiler
    for part in (tc.nvcc, tc.nvcc_version, tc.ptxas, tc.cicc, tc.headers[0],
                 tc.host_compiler, tc.tvm):
        assert part in tc.id()


# --------------------------------------------------------------------------------------
# work folders: locks, not PIDs
# --------------------------------------------------------------------------------------
HOLDER = ("import sys, time; from tirx_gemm.compile.cache import WorkFolder; "
          "w = WorkFolder(sys.argv[1]); print(w.path, flush=True); time.sleep(600)")


def _holder(prefix=()) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([*prefix, sys.executable, "-c", HOLDER, "0123456789abcdef0123"],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    return proc, Path(proc.stdout.readline().strip())


def _can_unshare_pid() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "-rpf", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_the_sweep_removes_only_folders_whose_lock_is_free(cache_dir):
    """A build killed outright leaves its folder with a free lock (swept); a running build
    holds its lock (kept), and so does this very process (kept); once the running one ends,
    its folder is swept too."""
    dead, dead_dir = _holder()
    live, live_dir = _holder()
    mine = WorkFolder("0123456789abcdef0123")
    try:
        dead.kill()
        dead.wait()
        assert dead_dir.is_dir() and (dead_dir / "owner.lock").is_file()
        assert sweep_stale() == [dead_dir] and not dead_dir.exists()
        assert live_dir.is_dir() and mine.path.is_dir()
    finally:
        live.kill()
        live.wait()
        mine.release()
    assert sweep_stale() == [live_dir] and not live_dir.exists()


@pytest.mark.skipif(not _can_unshare_pid(), reason="unshare -rpf (a PID namespace) unavailable")
def test_a_build_in_another_pid_namespace_is_not_swept(cache_dir, soon):
    """Its PID (1 or so in its namespace) means nothing here; its lock does."""
    other, other_dir = _holder(("unshare", "-rpf", "--kill-child"))
    try:
        assert sweep_stale() == [] and other_dir.is_dir()
    finally:
        other.kill()
        other.wait()
    assert soon(lambda: sweep_stale() == [other_dir], 10), "its lock outlived it"



def test_a_folder_without_a_lock_is_kept_until_it_is_old(cache_dir):
    builds = cache_dir / "builds"
    young = builds / "0123456789abcdef0123.young"
    old = builds / "0123456789abcdef0123.oldold"
    for d in (young, old):
        d.mkdir(parents=True)
    past = time.time() - cache.STALE_UNOWNED_S - 60
    os.utime(old, (past, past))
    assert sweep_stale() == [old]
    assert young.is_dir() and not old.exists()


def test_a_recycled_pid_does_not_keep_a_folder(cache_dir):
    """A folder whose owner file names a PID that now belongs to some other live process
    (here: this one) is still swept once its lock is free."""
    dead, dead_dir = _holder()
    dead.kill()
    dead.wait()
    (dead_dir / "owner.pid").write_text(str(os.getpid()))
    assert sweep_stale() == [dead_dir]


# --------------------------------------------------------------------------------------
# every wait bounded
# --------------------------------------------------------------------------------------
def test_a_detached_child_holding_the_output_does_not_extend_the_timeout(tmp_path,
                                                                          monkeypatch):
    """The tool starts a child in a new session (out of its process group, so the kill
    misses it) that keeps stdout open, then hangs: the call ends within the tool's limit
    plus the collection limit, not when the child lets go."""
    monkeypatch.setenv(procs.TOOL_TIMEOUT_ENV, "0.5")
    monkeypatch.setattr(procs, "COLLECT_TIMEOUT_S", 1.0)
    pid_file = tmp_path / "detached.pid"
    tool = _script(tmp_path / "tool", f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 60' &\n"
                   "exec sleep 600\n")
    t0 = time.monotonic()
    try:
        with pytest.raises(BuildError, match=r"^tool did not finish within 0.5 s"):
            run_tool([tool])
        took = time.monotonic() - t0
    finally:
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text().strip():
                break
            time.sleep(0.05)
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    assert took < 0.5 + 1.0 + 2.0, f"run_tool took {took:.1f} s"


def test_a_tool_that_finished_is_reported_finished_and_the_child_it_left_is_ended(
        tmp_path, monkeypatch):
    """The tool exits at once but leaves a child in a new session holding its stdout: the
    report says the tool finished (not that it hung) and the child is ended."""
    monkeypatch.setenv(procs.TOOL_TIMEOUT_ENV, "1")
    monkeypatch.setattr(procs, "COLLECT_TIMEOUT_S", 1.0)
    pid_file = tmp_path / "detached.pid"
    tool = _script(tmp_path / "tool", f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 60' &\n"
                   "while [ ! -s " + str(pid_file) + " ]; do sleep 0.05; done\nexit 0\n")
    with pytest.raises(BuildError, match=r"^tool finished \(exit 0\), but a process it "
                                         r"started kept its output open past 1 s; ended "
                                         r"sleep \(pid \d+\)") as exc:
        run_tool([tool])
    pid = int(pid_file.read_text())
    assert f"(pid {pid})" in str(exc.value)
    for _ in range(100):  # SIGKILLed: gone (or a zombie of init) within moments
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the detached child {pid} was left running")


BAD_SECONDS = ["inf", "1e400", "-1", "0", "nan", "soon", "-inf", "86401"]


@pytest.mark.parametrize("value", BAD_SECONDS)
def test_bad_limits_are_one_line_errors(monkeypatch, value):
    monkeypatch.setenv(procs.TOOL_TIMEOUT_ENV, value)
    with pytest.raises(ValueError) as exc:
        run_tool(["true"])
    text = str(exc.value)
    assert "\n" not in text and text == (f"{procs.TOOL_TIMEOUT_ENV}={value!r} must be a positive "
                                         f"number of seconds, at most {settings.MAX_SECONDS:g}")


@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_an_infinite_limit_cannot_switch_a_guard_off(monkeypatch, value):
    """The kernel hang guard reads its limit through the same parser."""
    launcher = pytest.importorskip("tirx_gemm.run.launcher")
    monkeypatch.setenv(launcher.KERNEL_TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match="must be a positive number of seconds, at most"):
        launcher.kernel_timeout()


@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_bad_tool_limit_through_the_cli_is_one_line(cache_dir, value):
    out = cli("build", *ARGS, env={procs.TOOL_TIMEOUT_ENV: value})
    _one_line_error(out, f"{procs.TOOL_TIMEOUT_ENV}={value!r} must be a positive number")
    assert not (cache_dir / "builds").exists()


def test_good_limits_are_accepted(monkeypatch):
    for text, want in (("0.25", 0.25), ("86400", 86400.0), ("1e3", 1000.0)):
        monkeypatch.setenv(procs.TOOL_TIMEOUT_ENV, text)
        assert procs.tool_timeout() == want and math.isfinite(want)
    monkeypatch.delenv(procs.TOOL_TIMEOUT_ENV)
    assert procs.tool_timeout() == procs.TOOL_TIMEOUT_S


# --------------------------------------------------------------------------------------
# the stub libcuda
# --------------------------------------------------------------------------------------
def _other_elf(path: Path, tmp_path: Path) -> None:
    """A well-formed shared object of the right soname but none of the entry points, with
    a matching recorded sha256: only the ELF check can refuse it."""
    src = tmp_path / "empty.c"
    src.write_text("int nothing(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(path),
                    str(src)], check=True)
    (path.parent / (path.name + ".sha256")).write_text(cache.sha256_file(path))


STUB_DAMAGE = {
    "truncated": (lambda p, t: p.write_bytes(p.read_bytes()[:100]), "its sha256 differs"),
    "random": (lambda p, t: p.write_bytes(os.urandom(p.stat().st_size)), "its sha256 differs"),
    "empty": (lambda p, t: p.write_bytes(b""), "its sha256 differs"),
    "no-record": (lambda p, t: (p.parent / (p.name + ".sha256")).unlink(),
                  "its recorded sha256 is missing"),
    "symlink": (lambda p, t: (p.unlink(), p.symlink_to("/bin/true")), "it is a symlink"),
    "other-elf": (_other_elf, "it lacks cuInit"),
}


@pytest.mark.parametrize("case", sorted(STUB_DAMAGE))
def test_a_damaged_stub_is_reported_and_rebuilt(cache_dir, tmp_path, capsys, case):
    stub = cudalibs.ensure_stub()
    assert cudalibs.stub_problem(stub) is None
    ok, text = cudalibs.stub_status()
    assert ok and "sha256 as built, loads" in text
    damage, reason = STUB_DAMAGE[case]
    damage(stub, tmp_path)
    ok, text = cudalibs.stub_status()  # the doctor's check
    assert not ok and reason in text and "is damaged" in text
    capsys.readouterr()
    assert cudalibs.ensure_stub() == stub
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the stub libcuda {stub} is damaged ({reason}" in err[0]
    assert cudalibs.stub_problem(stub) is None and not stub.is_symlink()
    assert cudalibs.stub_status()[0]


def test_doctor_flags_a_damaged_stub(cache_dir):
    stub = cudalibs.ensure_stub()
    stub.write_bytes(b"\x7fELF" + os.urandom(64))
    out = cli("doctor")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"warning:       libcuda: stub {stub} is damaged" in out.stdout, out.stdout


# --------------------------------------------------------------------------------------
# a full disk is named, not reported as a JSON error
# --------------------------------------------------------------------------------------
class _NoSpace:
    f_bavail, f_frsize = 0, 4096


def test_an_empty_error_report_on_a_full_disk_names_the_file_system_and_the_space(
        tmp_path, monkeypatch):
    from tirx_gemm.compile import cache, pool
    monkeypatch.setenv("TIRX_GEMM_CACHE", str(tmp_path / "c"))
    entry = tmp_path / "c" / "builds" / "0123"
    entry.mkdir(parents=True)
    (entry / "kernel.so").write_bytes(b"x" * 300_000)
    work = tmp_path / "c" / "builds" / "4567.tmp"
    work.mkdir()
    (work / "error.json").write_text("")  # what a worker leaves when its write fails
    monkeypatch.setattr(cache.os, "statvfs", lambda p: _NoSpace)
    err = pool.job_error(work)
    assert err["type"] == "BuildError"
    msg = err["message"]
    assert "Expecting value" not in msg and "\n" not in msg
    assert f"(holding {work}) is full: 0.0 MiB free, a build needs about 0.3 MiB (the " \
           "largest of the 1 builds in the cache)" in msg
    assert msg.startswith("the file system at /")


def test_an_empty_error_report_with_space_left_says_it_is_damaged(tmp_path, monkeypatch):
    from tirx_gemm.compile import pool
    monkeypatch.setenv("TIRX_GEMM_CACHE", str(tmp_path / "c"))
    (tmp_path / "error.json").write_text("{")
    assert pool.job_error(tmp_path)["message"] == (
        f"the build failed, and its error report {tmp_path / 'error.json'} is empty or damaged")


def test_the_cli_names_the_full_file_system_of_a_failed_write(tmp_path, monkeypatch):
    import errno as _errno
    from tirx_gemm import cli
    from tirx_gemm.compile import cache
    monkeypatch.setenv("TIRX_GEMM_CACHE", str(tmp_path / "c"))
    monkeypatch.setattr(cache.os, "statvfs", lambda p: _NoSpace)
    line = cli._one_line(OSError(_errno.ENOSPC, "No space left on device", str(tmp_path / "f")))
    assert line.startswith(f"{tmp_path / 'f'}: No space left on device (the file system at /")
    assert "is full: 0.0 MiB free" in line


@pytest.mark.parametrize("where", ["file", "dangling", "proc"])
def test_a_cache_root_that_cannot_be_a_folder_is_named_in_one_line(where, tmp_path,
                                                                 monkeypatch, capsys):
    """TIRX_GEMM_CACHE at a file, a dangling symlink or where no folder can be made (/proc,
    even for root): the first build said "NotADirectoryError: .../stub/..." or "File
    exists" (a traceback from the Python API); now one line names the setting."""
    from tirx_gemm import cli
    from tirx_gemm.kernels import kernel_for
    root = {"file": tmp_path / "f", "dangling": tmp_path / "d",
            "proc": Path("/proc/tirx-gemm-nowhere/c")}[where]
    if where == "file":
        root.write_text("x")
    if where == "dangling":
        root.symlink_to(tmp_path / "nowhere")
    monkeypatch.setenv("TIRX_GEMM_CACHE", str(root))
    with pytest.raises(ValueError, match=rf"^TIRX_GEMM_CACHE={re.escape(str(root))}: cannot "
                                         r"hold the build cache \(.*\): point TIRX_GEMM_CACHE"):
        kernel_for(registry.get("v1", "sm_100a"), (128, 128, 64))
    rc = cli.main(["build", "v1", "--mnk", "128,128,64", "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "TIRX_GEMM_CACHE=" in err[0], err
    if where == "file":
        assert root.read_text() == "x"
