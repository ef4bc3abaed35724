"""Build harness: compile a step for an arch -> CUDA source, cubin, exported library,
resource usage and a SASS opcode summary.

Every build runs in a fresh process of a ``concurrent.futures.ProcessPoolExecutor``
(``max_tasks_per_child=1``) whose workers are forked from a multiprocessing fork server that
has imported TVM once, so no TVM compiler state leaks from one step into the next and no
build pays the TVM import again; results are cached on disk by
(step, shape, arch, builder kwargs, watchdog, sources, toolchain): a repeated build is a file
read.

Reliability contract: a cache entry appears only by renaming a finished, validated build
folder into place, and is validated again on load (an invalid one is rebuilt, with a notice);
its meta.json stores no absolute path, so a moved cache folder still works. Every external
tool runs with a time limit (``TIRX_GEMM_TOOL_TIMEOUT`` seconds overrides the defaults) in its
own process group, so a timeout or an interrupt (SIGINT, SIGTERM) kills the tool with all its
children; an interrupted build leaves neither temporary folders nor processes behind, and a
build killed outright (SIGKILL) leaves a folder that the next build removes.

On a machine without a GPU driver the worker first loads a stub ``libcuda.so.1`` (built
from ``tirx_gemm/stub/libcuda_stub.c``) so that TVM embeds the compiled kernel into the
exported library instead of keeping CUDA source only; that library then runs on a GPU
host that has just torch, apache-tvm-ffi and TVM's two runtime libraries.
"""

from __future__ import annotations

import ctypes
import dataclasses
import faulthandler
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.regbudget import setmaxnreg_problem
from tirx_gemm.registry import KEY_SASS, Step

BUILD_FORMAT = 5  # bump when the cached artefacts or their meaning change
PKG_DIR = Path(__file__).resolve().parent

NVCC_FLAGS = [
    "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "--expt-extended-lambda",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--ptxas-options=-v,--warn-on-local-memory-usage",
]


# every file a cache entry must hold, non-empty, to be used
ARTEFACTS = ("kernel.cu", "kernel.cubin", "kernel.so", "kernel.sass", "kernel.tir.py", "meta.json")

TOOL_TIMEOUT_ENV = "TIRX_GEMM_TOOL_TIMEOUT"
# seconds: nvcc of v7 takes ~5 s on 2 cores, so 300 s only catches a hung tool; a version
# probe answers at once
TOOL_TIMEOUT_S = 300.0
PROBE_TIMEOUT_S = 30.0

# the generated index math uses int32 element offsets (TVM's default index type)
INT32_MAX = 2**31 - 1


class BuildError(RuntimeError):
    """The step is valid but the toolchain failed (TVM lowering, nvcc, cuobjdump)."""


class _InvalidEntry(Exception):
    """A cache entry that must not be used (the message says why)."""


@dataclasses.dataclass
class BuildResult:
    step: str
    arch: str
    M: int
    N: int
    K: int
    kwargs: dict
    key: str
    dir: str
    registers: int | None
    smem_bytes: int | None          # dynamic shared memory per CTA (launch parameter)
    static_smem_bytes: int | None   # static shared memory reported by ptxas
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    sass_counts: dict               # opcode (full mnemonic) -> count
    times: dict                     # seconds: tvm, nvcc, sass, export, total
    tvm_version: str
    nvcc_version: str
    watchdog_ms: int | None = None  # bounded mbarrier waits (helpers.set_watchdog), or None
    cached: bool = False

    # artefact paths
    @property
    def cuda_path(self) -> Path:
        return Path(self.dir) / "kernel.cu"

    @property
    def cubin_path(self) -> Path:
        return Path(self.dir) / "kernel.cubin"

    @property
    def sass_path(self) -> Path:
        return Path(self.dir) / "kernel.sass"

    @property
    def tir_path(self) -> Path:
        return Path(self.dir) / "kernel.tir.py"

    @property
    def lib_path(self) -> Path:
        return Path(self.dir) / "kernel.so"

    @property
    def cuda_source(self) -> str:
        return self.cuda_path.read_text()

    @property
    def sass(self) -> str:
        return self.sass_path.read_text()

    @property
    def tir(self) -> str:
        return self.tir_path.read_text()

    def key_sass(self) -> dict:
        """Counts of the opcodes the lessons talk about (prefix match on the mnemonic)."""
        return {k: n for k in KEY_SASS if (n := count_prefix(self.sass_counts, k))}

    def to_json(self) -> dict:
        """meta.json: everything but the folder, which is wherever the entry is found."""
        d = dataclasses.asdict(self)
        d.pop("cached")
        d.pop("dir")
        return d


def count_prefix(counts: dict, prefix: str) -> int:
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))


# ---------------------------------------------------------------------------------------
# tools and cache
# ---------------------------------------------------------------------------------------
# The CUDA toolchain comes from pip's nvidia-* wheels (pyproject.toml pins nvcc, crt, runtime,
# cccl and nvvm of one CUDA release): they unpack into one CUDA root,
# site-packages/nvidia/cu13/{bin,include,nvvm,lib}, which nvcc.profile treats like a toolkit.
# A system CUDA (CUDA_HOME, CUDA_PATH or PATH) is used only when TIRX_GEMM_SYSTEM_CUDA=1.
SYSTEM_CUDA_ENV = "TIRX_GEMM_SYSTEM_CUDA"
WHEEL_CUDA_DIRS = ("cu13",)  # nvidia/<dir>/bin/nvcc of the CUDA 13 wheels
WHEEL_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-runtime",
                  "nvidia-cuda-cccl", "nvidia-nvvm", "nvidia-cuda-cuobjdump",
                  "nvidia-cuda-nvdisasm")


def use_system_cuda() -> bool:
    """True when the user asked for a system CUDA (``TIRX_GEMM_SYSTEM_CUDA=1``)."""
    return os.environ.get(SYSTEM_CUDA_ENV, "").strip().lower() not in ("", "0", "no", "false",
                                                                        "off")


def _wheel_dirs() -> list[Path]:
    """The folders of the ``nvidia`` namespace package (where the nvidia-* wheels unpack)."""
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    return [Path(r) for r in (spec.submodule_search_locations or [])] if spec else []


def wheel_cuda_root() -> Path | None:
    """The CUDA root the nvidia-cuda-nvcc wheel installed (holds bin/nvcc), or None."""
    for base in _wheel_dirs():
        for name in WHEEL_CUDA_DIRS:
            if (base / name / "bin" / "nvcc").is_file():
                return base / name
    return None


def _system_tool(name: str) -> str | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / name).is_file():
            return str(Path(root) / "bin" / name)
    return shutil.which(name)


def find_tool(name: str) -> str:
    """A CUDA tool (nvcc, ptxas, cuobjdump, nvdisasm) from the nvidia-* wheels installed with
    this package; with ``TIRX_GEMM_SYSTEM_CUDA=1`` from CUDA_HOME/bin, CUDA_PATH/bin or PATH
    instead (cuobjdump and nvdisasm, which some toolkits lack, then fall back to the wheels)."""
    system = use_system_cuda()
    if system:
        path = _system_tool(name)
        if path:
            return path
        if name in ("nvcc", "ptxas"):
            raise BuildError(f"{name} not found on PATH, in $CUDA_HOME/bin or in $CUDA_PATH/bin "
                             f"({SYSTEM_CUDA_ENV}=1 asks for a system CUDA; unset it to use "
                             "the nvidia-cuda-nvcc wheel that `pip install -e .` installs)")
    root = wheel_cuda_root()
    if root is not None and (root / "bin" / name).is_file():
        return str(root / "bin" / name)
    for base in _wheel_dirs():
        for cand in sorted(base.glob(f"*/bin/{name}")):
            return str(cand)
    hint = {"cuobjdump": "pip install nvidia-cuda-cuobjdump",
            "nvdisasm": "pip install nvidia-cuda-nvdisasm"}.get(
                name, "`pip install -e .` installs the CUDA compiler wheels (nvidia-cuda-nvcc "
                f"and its headers); {SYSTEM_CUDA_ENV}=1 uses a system CUDA instead")
    raise BuildError(f"{name} not found in this Python's nvidia-* wheels ({hint})")


def toolchain_env(env: dict | None = None) -> dict:
    """``env`` (default: os.environ) for running the CUDA compiler: with the wheel toolchain
    its bin/ leads PATH and CUDA_HOME/CUDA_PATH name its root, so TVM's own CUDA lookups
    (tvm.support.nvcc.find_cuda_path, a plain ``nvcc``) find the same toolchain; with
    ``TIRX_GEMM_SYSTEM_CUDA=1`` the environment is left as the user set it."""
    env = dict(os.environ if env is None else env)
    root = None if use_system_cuda() else wheel_cuda_root()
    if root is not None:
        path = env.get("PATH", "")
        if path.split(os.pathsep)[0] != str(root / "bin"):
            env["PATH"] = str(root / "bin") + (os.pathsep + path if path else "")
        env["CUDA_HOME"] = env["CUDA_PATH"] = str(root)
    return env


_HEADER_VERSIONS = (("include/cuda.h", "CUDA_VERSION"),
                    ("include/cuda_runtime_api.h", "CUDART_VERSION"),
                    ("include/cccl/cuda/std/__cccl/version.h", "CCCL_VERSION"))


def toolchain_report() -> list[tuple[str, str]]:
    """What a build compiles with, as (label, text) lines: the source of the toolchain, nvcc,
    the ptxas and cicc that nvcc runs, the include folders it passes and their header versions,
    cuobjdump, nvdisasm, the host compiler and the installed nvidia-* wheels. The nvcc lines
    come from ``nvcc --dryrun`` itself, so they name what nvcc really uses."""
    from importlib.metadata import PackageNotFoundError, version
    lines = []
    system = use_system_cuda()
    lines.append(("toolchain", f"system CUDA ({SYSTEM_CUDA_ENV}=1)" if system else
                  f"nvidia-* wheels in this Python (set {SYSTEM_CUDA_ENV}=1 for a system CUDA)"))
    env = toolchain_env()
    nvcc = find_tool("nvcc")
    ver = run_tool([nvcc, "--version"], probe=True, env=env, name="nvcc --version")
    release = [ln for ln in ver.stdout.splitlines() if "release" in ln]
    lines.append(("nvcc", f"{nvcc} ({release[-1].strip() if release else ver.stdout.strip()})"))
    with tempfile.TemporaryDirectory(prefix="tirx-gemm-doctor.") as d:
        src = Path(d) / "probe.cu"
        src.write_text("__global__ void k() {}\n")
        dry = run_tool([nvcc, "--dryrun", "--cubin", "-arch", "sm_90a", "-o",
                        str(Path(d) / "probe.cubin"), str(src)], probe=True, env=env,
                       name="nvcc --dryrun")
    text = dry.stdout + dry.stderr
    var = dict(re.findall(r"^#\$ (\w+)=(.*)$", text, re.M))
    search = (var.get("PATH", "") + os.pathsep + env.get("PATH", "")).split(os.pathsep)

    def on(path_dirs, tool):
        for d in path_dirs:
            if d and (Path(d) / tool).is_file():
                return str(Path(os.path.normpath(Path(d) / tool)))
        return None

    ptxas = on(search, "ptxas")
    if ptxas:
        pv = run_tool([ptxas, "--version"], probe=True, env=env, name="ptxas --version")
        rel = [ln for ln in pv.stdout.splitlines() if "release" in ln]
        lines.append(("ptxas", f"{ptxas} ({rel[-1].strip() if rel else '?'})"))
    else:
        lines.append(("ptxas", "not found on nvcc's search path"))
    cicc = on([var.get("CICC_PATH", "")], "cicc")
    lines.append(("cicc", cicc or "not found"))
    includes = [os.path.normpath(p) for p in re.findall(r'"-(?:I|isystem" ")([^"]+)"',
                                                        var.get("INCLUDES", "") + " " +
                                                        var.get("SYSTEM_INCLUDES", ""))]
    for inc in includes:
        found = []
        for rel, macro in _HEADER_VERSIONS:
            for cand in (Path(inc).parent / rel, Path(inc) / Path(rel).name):
                if cand.is_file():
                    m = re.search(rf"#define\s+{macro}\s+(\d+)", cand.read_text(errors="replace"))
                    if m and f"{macro}={m.group(1)}" not in found:
                        found.append(f"{macro}={m.group(1)}")
                    break
        lines.append(("headers", inc + (f" ({', '.join(found)})" if found else "")))
    if not includes:
        lines.append(("headers", "(nvcc --dryrun named no include folders)"))
    lines.append(("cudart", ensure_cudart() or "missing: libcudart.so.13 (TVM's CUDA module "
                  "needs it; the nvidia-cuda-runtime wheel has it)"))
    for tool in ("cuobjdump", "nvdisasm"):
        try:
            lines.append((tool, find_tool(tool)))
        except BuildError as exc:
            lines.append((tool, f"missing: {exc}"))
    host = re.search(r"^#\$ (\S+) .* -E -x c\+\+", text, re.M)
    cxx = shutil.which(host.group(1), path=var.get("PATH") or None) if host else None
    if cxx:
        hv = run_tool([cxx, "--version"], probe=True, name=f"{host.group(1)} --version")
        cc1plus = run_tool([cxx, "-print-prog-name=cc1plus"], probe=True,
                           name=f"{host.group(1)} -print-prog-name").stdout.strip()
        lines.append(("host compiler", f"{cxx} ({(hv.stdout.splitlines() or ['?'])[0]})" + (
            "" if os.path.isabs(cc1plus) and os.path.isfile(cc1plus) else
            "; missing: its C++ front end cc1plus, which nvcc needs (install g++)")))
    else:
        lines.append(("host compiler", "not found (nvcc needs gcc/g++ to preprocess)"))
    wheels = []
    for pkg in WHEEL_PACKAGES:
        try:
            wheels.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            wheels.append(f"{pkg} (not installed)")
    lines.append(("wheels", ", ".join(wheels)))
    if dry.returncode != 0:
        lines.append(("warning", f"nvcc --dryrun failed (exit {dry.returncode}): "
                      f"{text.strip().splitlines()[-1] if text.strip() else 'no output'}"))
    return lines


def tool_timeout(probe: bool = False) -> float:
    """Seconds a tool may run: ``TIRX_GEMM_TOOL_TIMEOUT`` if set, else the default."""
    from tirx_gemm.settings import env_seconds
    return env_seconds(TOOL_TIMEOUT_ENV, PROBE_TIMEOUT_S if probe else TOOL_TIMEOUT_S)


def _tool_preexec() -> None:
    """In the tool's process, before exec: die with the process that started it (Linux), so
    not even a SIGKILLed build leaves a compiler running."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


_ACTIVE_TOOLS: set[int] = set()  # process groups of running tools (killed on SIGTERM)


def _kill_group(pgid: int, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_tool(cmd: list, *, probe: bool = False, env: dict | None = None,
             name: str | None = None) -> subprocess.CompletedProcess:
    """Run an external tool with a time limit, capturing its output as text.

    The tool gets its own process group (killed whole on timeout or on any exception here,
    KeyboardInterrupt included, so none of its children outlives it). Raises BuildError
    naming the tool when it cannot start or does not finish within the limit.
    """
    name = name or Path(cmd[0]).name
    limit = tool_timeout(probe)
    try:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True, preexec_fn=_tool_preexec)
    except OSError as exc:
        raise BuildError(f"{name} could not be started: {exc.strerror or exc}") from None
    _ACTIVE_TOOLS.add(proc.pid)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.communicate()
        raise BuildError(f"{name} did not finish within {limit:g} s "
                         f"({TOOL_TIMEOUT_ENV} sets the limit in seconds)") from None
    except BaseException:
        _kill_group(proc.pid)
        proc.wait()
        raise
    finally:
        _ACTIVE_TOOLS.discard(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cache_root() -> Path:
    root = os.environ.get("TIRX_GEMM_CACHE") or Path.home() / ".cache" / "tirx-gemm"
    return Path(root)


_TOOLCHAIN: str | None = None


def _toolchain_id() -> str:
    """tvm version + nvcc version, read without importing tvm (imports are slow)."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None:
        from importlib.metadata import version
        try:
            probe = run_tool([find_tool("nvcc"), "--version"], probe=True, env=toolchain_env(),
                             name="nvcc --version")
        except BuildError as exc:
            if "not found" not in str(exc):
                raise  # a hung or broken nvcc must not pass for a missing one
            nvcc = "nvcc-missing"
        else:
            lines = probe.stdout.strip().splitlines()
            if probe.returncode != 0 or not lines:
                raise BuildError(f"nvcc --version failed (exit {probe.returncode}): "
                                 f"{(probe.stderr.strip().splitlines() or ['no output'])[-1]}")
            nvcc = lines[-1]
        _TOOLCHAIN = f"tvm={version('apache-tvm')};{nvcc}"
    return _TOOLCHAIN


def cache_key(step: Step, M: int, N: int, K: int, kwargs: dict,
              watchdog_ms: int | None = None) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([BUILD_FORMAT, step.key, M, N, K, sorted(kwargs.items()), watchdog_ms,
                         _toolchain_id()], default=str).encode())
    # the step's own source and the package modules a step of its arch can pull in
    shared = ["helpers.py"] + (["hopper.py"] if step.arch == "sm_90a" else [])
    for path in [Path(step.source_file), *(PKG_DIR / f for f in shared), Path(__file__)]:
        if path.exists():
            h.update(path.read_bytes())
    return h.hexdigest()[:20]


def _read_entry(entry: Path, key: str) -> BuildResult:
    """The build stored in ``entry``; _InvalidEntry says why it cannot be used."""
    try:
        data = json.loads((entry / "meta.json").read_text())
    except FileNotFoundError:
        raise _InvalidEntry("no meta.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _InvalidEntry(f"meta.json is not readable JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("key") != key:
        raise _InvalidEntry("meta.json does not describe this build")
    try:
        res = BuildResult(**data, dir=str(entry))
    except TypeError as exc:
        raise _InvalidEntry(f"meta.json has the wrong fields: {exc}") from None
    for name in ARTEFACTS:
        path = entry / name
        if not path.is_file() or path.stat().st_size == 0:
            raise _InvalidEntry(f"{name} is missing or empty")
    return res


def _load_cached(step: Step, M, N, K, kwargs, watchdog_ms=None) -> BuildResult | None:
    key = cache_key(step, M, N, K, kwargs, watchdog_ms)
    entry = cache_root() / "builds" / key
    if not entry.exists():
        return None
    try:
        res = _read_entry(entry, key)
    except _InvalidEntry as exc:
        print(f"tirx-gemm: cache entry {entry} is invalid ({exc}); rebuilding", file=sys.stderr)
        return None
    res.cached = True
    return res


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


STALE_UNOWNED_S = 600  # a work folder without an owner file is a crash between two syscalls


def _sweep_stale(builds: Path) -> None:
    """Remove work folders (``<key>.xxxxxxxx``) whose building process is gone: what a build
    killed outright (SIGKILL, power loss) leaves behind."""
    if not builds.is_dir():
        return
    for d in builds.glob("*.*"):
        owner = d / "owner.pid"
        try:
            if owner.exists():
                stale = not _pid_alive(int(owner.read_text() or 0))
            else:
                stale = time.time() - d.stat().st_mtime > STALE_UNOWNED_S
        except (OSError, ValueError):
            stale = True
        if stale:
            shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------
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
    """Build several (step, (M, N, K), kwargs), each in its own process.

    A build server process runs a process pool whose fork server imports TVM once; every
    build then runs in a fresh worker forked from it, so each starts from the same clean,
    just-imported compiler state (nothing one build does leaks into another) without paying
    the ~2.5 s TVM import per build. At most ``jobs`` builds run at once (default: the CPU
    count); a build whose process dies (a crash in TVM, say) fails alone.

    With one request, errors are raised; with several, each failed slot holds its
    exception so that one bad step does not hide the others' results. ``progress`` is
    called as progress(done, total, request, result_or_exc) after each build. Without
    ``use_cache`` every request is rebuilt and replaces its cache entry. ``watchdog_ms``
    applies to every request.
    """
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs={jobs!r} must be a positive integer")
    check_watchdog_ms(watchdog_ms)
    reqs = [(s, tuple(mnk), dict(kw or {})) for s, mnk, kw in requests]
    out: list = [None] * len(reqs)
    todo = []
    for i, (step, (M, N, K), kw) in enumerate(reqs):
        try:
            check_shape_limits(M, N, K)
        except ValueError as exc:
            out[i] = exc
            continue
        hit = _load_cached(step, M, N, K, kw, watchdog_ms) if use_cache else None
        if hit is not None:
            out[i] = hit
        else:
            todo.append(i)
    if todo:  # before any work: a missing tool is one clear line, not a failed worker each
        find_tool("nvcc")
        find_tool("cuobjdump")
    done = 0
    for i in range(len(reqs)):
        if out[i] is not None:
            done += 1
            if progress:
                progress(done, len(reqs), reqs[i], out[i])
    if todo:
        jobs = jobs or max(1, min(len(todo), os.cpu_count() or 1))
        jobs_by_dir = {}
        builds = cache_root() / "builds"
        with _terminate_as_exit():
            try:
                _sweep_stale(builds)
                for i in todo:
                    step, mnk, kw = reqs[i]
                    job = _prepare(step, mnk, kw, watchdog_ms)
                    jobs_by_dir[job["dir"]] = (i, job)
                server = _serve([job for _, job in jobs_by_dir.values()], jobs)
                try:
                    for work_dir, failure in server:
                        i, job = jobs_by_dir[work_dir]
                        try:
                            out[i] = _finish(reqs[i][0], job, failure)
                        except Exception as exc:  # noqa: BLE001 - reported per slot
                            out[i] = exc
                        done += 1
                        if progress:
                            progress(done, len(reqs), reqs[i], out[i])
                finally:
                    server.close()  # on an interrupt: kills the server and its builds
            finally:
                for work_dir in jobs_by_dir:  # finished ones were renamed or removed already
                    shutil.rmtree(work_dir, ignore_errors=True)
    if len(reqs) == 1 and isinstance(out[0], Exception):
        raise out[0]
    return out


class _terminate_as_exit:
    """While building in the main thread, SIGTERM raises SystemExit(143) like Ctrl-C raises
    KeyboardInterrupt, so the cleanup above runs for both."""

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


def _prepare(step: Step, mnk, kwargs, watchdog_ms=None) -> dict:
    M, N, K = mnk
    key = cache_key(step, M, N, K, kwargs, watchdog_ms)
    final = cache_root() / "builds" / key
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=final.parent))
    (work / "owner.pid").write_text(str(os.getpid()))
    return {"step": step.id, "arch": step.arch, "M": M, "N": N, "K": K, "kwargs": kwargs,
            "watchdog_ms": watchdog_ms, "key": key, "dir": str(work)}


SERVER_GRACE_S = 3.0  # after SIGTERM, how long builds get to kill their tools and exit


def _serve(jobs: list[dict], parallel: int):
    """Run the build server (``_server``); yield (work dir, failure) as builds finish, where
    failure is None or why the server could not report the build.

    The server leads its own process group, which its fork server and pool workers share:
    closing this generator early (an exception or interrupt in the caller) sends SIGTERM to
    the group, then SIGKILL to whatever is left after SERVER_GRACE_S. Each process of the
    chain dies with its parent (PR_SET_PDEATHSIG: server, fork server, worker, tool), so
    neither a SIGKILLed caller nor a finished server leaves one behind.
    """
    env = dict(os.environ)
    # the server must import this very package, whichever way it was made importable
    env["PYTHONPATH"] = os.pathsep.join([str(PKG_DIR.parent)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryFile("w+") as server_err:
        proc = subprocess.Popen([sys.executable, "-c",
                                 "import sys, tirx_gemm.build as b; sys.exit(b._server())"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=server_err,
                                text=True, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent)
        seen = set()
        try:
            json.dump({"jobs": jobs, "parallel": parallel}, proc.stdin)
            proc.stdin.close()
            for line in proc.stdout:  # one JSON string per finished build: its work dir
                seen.add(work_dir := json.loads(line))
                yield work_dir, None
            proc.wait()
        except BaseException:
            _stop_group(proc)
            raise
        server_err.seek(0)
        err = server_err.read()
    tail = "\n".join(err.strip().splitlines()[-25:])
    for job in jobs:  # the server died before reporting these
        if job["dir"] not in seen:
            yield job["dir"], f"the build server failed (exit {proc.returncode}):\n{tail}"


def _die_with_parent() -> None:
    """The calling process gets SIGTERM when its parent dies (Linux): the server when the
    process that started it does, the fork server with the server, a worker with the fork
    server."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _stop_group(proc: subprocess.Popen) -> None:
    _kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + SERVER_GRACE_S
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.05)
    _kill_group(proc.pid)
    proc.wait()


def _finish(step: Step, job: dict, failure: str | None) -> BuildResult:
    """Validate a finished work folder and rename it into place as the cache entry,
    replacing an entry already there (a --no-cache build, or one found invalid)."""
    work, final = Path(job["dir"]), cache_root() / "builds" / job["key"]
    shape = f"{job['M']}x{job['N']}x{job['K']}"
    try:
        err_file = work / "error.json"
        if err_file.exists():
            err = json.loads(err_file.read_text())
            if err["type"] == "ValueError":
                raise ValueError(err["message"])
            if err["type"] == "BuildError":
                raise BuildError(f"{step.key} {shape}: {err['message']}")
            raise BuildError(f"{step.key} {shape}: {err['type']}: {err['message']}")
        if failure:
            raise BuildError(f"{step.key} {shape}: {failure}")
        try:
            built = _read_entry(work, job["key"])
        except _InvalidEntry as exc:
            raise BuildError(f"{step.key} {shape}: the build produced an unusable result "
                             f"({exc})") from None
        # a setmaxnreg split that the registers ptxas chose cannot honour hangs on the GPU
        why = setmaxnreg_problem(built.cuda_source, built.registers)
        if why:
            raise BuildError(f"{step.key} {shape}: {why}")
        (work / "owner.pid").unlink()
        (work / "worker.pid").unlink(missing_ok=True)
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{job['key']}.", dir=final.parent))
            (old / "owner.pid").write_text(str(os.getpid()))
            final.rename(old / "entry")
            shutil.rmtree(old, ignore_errors=True)
        try:
            work.rename(final)
        except OSError:
            if not final.is_dir():  # else a concurrent build of the same key won: use theirs
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _read_entry(final, job["key"])


# modules the pool's fork server imports once, so that no build pays for them; this module
# first: told by _POOL_PRELOAD_ENV, its import loads the CUDA libraries, which TVM needs
# loaded before it is imported (else it silently keeps CUDA source only)
POOL_PRELOAD = ["tirx_gemm.build", "tvm", "tvm_ffi", "tirx_gemm.helpers", "tirx_gemm.hopper"]
_POOL_PRELOAD_ENV = "_TIRX_GEMM_BUILD_POOL_PRELOAD"


def _server() -> int:
    """Run the build requests read from stdin ({"jobs": [...], "parallel": n}) in a process
    pool; print each finished build's work dir as a JSON line on stdout."""
    req = json.load(sys.stdin)
    # stdout is the channel to the caller; fd 1 becomes stderr for everything else, so the
    # fork server and the workers, which inherit it, cannot write into the channel
    report_to = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    ensure_libcuda()  # builds the libcuda stub once, here, so the fork server just loads it
    os.environ.update(toolchain_env())  # TVM's own nvcc/CUDA lookups find our toolchain
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
    os.environ[_POOL_PRELOAD_ENV] = "1"  # for the fork server, which inherits this environment
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
# worker (runs in its own process)
# ---------------------------------------------------------------------------------------
def _pool_worker_init() -> None:
    """In each pool worker: die with the fork server, and on SIGTERM (the server's group
    stopped, or the pool broken) kill the running tools before leaving."""
    _die_with_parent()
    signal.signal(signal.SIGTERM, _kill_tools_and_exit)


def _kill_tools_and_exit(signum, frame):
    for pgid in list(_ACTIVE_TOOLS):
        _kill_group(pgid)
    os._exit(128 + signum)


def _pool_build(job: dict) -> None:
    """One build in a fresh pool worker (max_tasks_per_child=1: the process ends after it);
    its errors are reported as data, in error.json."""
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
        _worker(job)
    except Exception as exc:  # noqa: BLE001 - reported to the caller as data
        exc = tool_errors[0] if tool_errors else exc  # the tool's own words, not TVM's wrap
        (work / "error.json").write_text(
            json.dumps({"type": type(exc).__name__, "message": str(exc)[-4000:]}))


_LIBCUDA: str | None = None  # what ensure_libcuda loaded in this process


def ensure_cudart() -> str | None:
    """Load the CUDA runtime library that TVM's CUDA module (libtvm_runtime_cuda.so needs
    libcudart.so.13) links against: the nvidia-cuda-runtime wheel's, found from the installed
    packages; with TIRX_GEMM_SYSTEM_CUDA=1 the system's first (the loader's search path).
    Without it TVM silently keeps CUDA source only. Returns the path loaded, or None."""
    root = wheel_cuda_root()
    wheel = [str(p) for p in sorted((root / "lib").glob("libcudart.so.*[0-9]"))] if root else []
    for cand in (["libcudart.so.13"] + wheel) if use_system_cuda() else wheel:
        try:
            ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
            return cand
        except OSError:
            continue
    return None


def ensure_libcuda() -> str:
    """Load the CUDA runtime (ensure_cudart), then the real libcuda if there is one, else
    the stub. Returns which libcuda."""
    global _LIBCUDA
    if _LIBCUDA is not None:
        return _LIBCUDA
    ensure_cudart()
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        _LIBCUDA = "driver"
        return _LIBCUDA
    except OSError:
        pass
    src = PKG_DIR / "stub" / "libcuda_stub.c"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    out = cache_root() / "stub" / digest / "libcuda.so.1"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        gcc = run_tool(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o",
                        str(tmp), str(src)])
        if gcc.returncode != 0:
            raise BuildError(f"gcc failed to build the libcuda stub: {gcc.stderr.strip()}")
        tmp.rename(out)
    ctypes.CDLL(str(out), mode=ctypes.RTLD_GLOBAL)
    _LIBCUDA = "stub"
    return _LIBCUDA


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SASS_OP = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", re.M)


def parse_ptxas(text: str) -> dict:
    regs = _PTXAS_REGS.findall(text)
    smem = _PTXAS_SMEM.findall(text)
    spill = _PTXAS_SPILL.findall(text)
    stack, st, ld = (int(x) for x in spill[-1]) if spill else (0, 0, 0)
    return {"registers": int(regs[-1]) if regs else None,
            "static_smem_bytes": int(smem[-1]) if smem else 0,
            "stack_bytes": stack, "spill_stores": st, "spill_loads": ld}


def sass_opcode_counts(sass: str) -> dict:
    return dict(Counter(_SASS_OP.findall(sass)).most_common())


def _dynamic_smem_from_host(host_ir: str, kernel: str) -> int | None:
    """The dynamic shared memory size TVM passes at launch (last i64 stored before the
    kernel call in the host module)."""
    idx = host_ir.find(f"@.tvm_func.{kernel}, ptr")
    if idx < 0:
        return None
    stores = re.findall(r"store i64 (\d+), ptr", host_ir[:idx])
    return int(stores[-1]) if stores else None


def _worker(req: dict) -> None:
    work = Path(req["dir"])
    t0 = time.perf_counter()
    times = {}
    libcuda = ensure_libcuda()
    os.environ.update(toolchain_env())
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"

    import tvm
    import tvm_ffi

    step = registry.get(req["step"], req["arch"])
    nvcc_log = []

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code, *_):  # our flags, our cubin, ptxas -v captured
        t = time.perf_counter()
        (work / "kernel.cu").write_text(code)
        cmd = [find_tool("nvcc"), "--cubin", "-arch", req["arch"], *NVCC_FLAGS,
               "-o", str(work / "kernel.cubin"), str(work / "kernel.cu")]
        try:
            proc = run_tool(cmd)
        except BuildError as exc:
            tool_errors.append(exc)  # TVM re-wraps what a callback raises
            raise
        if proc.returncode != 0:
            tool_errors.append(BuildError("nvcc failed:\n" + proc.stdout + proc.stderr))
            raise tool_errors[-1]
        nvcc_log.append(proc.stdout + proc.stderr)
        times["nvcc"] = time.perf_counter() - t
        return bytearray((work / "kernel.cubin").read_bytes())

    from tirx_gemm import helpers
    helpers.set_watchdog(req["watchdog_ms"])  # every mbarrier wait the builder emits
    try:
        func = step.build_primfunc(req["M"], req["N"], req["K"], **req["kwargs"])
    except ValueError as exc:
        (work / "error.json").write_text(json.dumps({"type": "ValueError", "message": str(exc)}))
        return
    (work / "kernel.tir.py").write_text(func.script())
    target = tvm.target.Target({"kind": "cuda", "arch": req["arch"]})
    t = time.perf_counter()
    with target:
        exe = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")
    times["tvm"] = time.perf_counter() - t - times.get("nvcc", 0.0)
    if not nvcc_log:
        raise BuildError(f"TVM did not compile the kernel (libcuda: {libcuda})")
    host_ir = exe.mod.inspect_source()
    t = time.perf_counter()
    exe.export_library(str(work / "kernel.so"))
    times["export"] = time.perf_counter() - t

    t = time.perf_counter()
    sass = run_tool([find_tool("cuobjdump"), "-sass", str(work / "kernel.cubin")],
                    env=_with_nvdisasm_on_path())
    if sass.returncode != 0:
        raise BuildError("cuobjdump failed: " + sass.stderr.strip())
    (work / "kernel.sass").write_text(sass.stdout)
    times["sass"] = time.perf_counter() - t
    times["total"] = time.perf_counter() - t0

    res = parse_ptxas("\n".join(nvcc_log))
    nvcc_version = _toolchain_id().split(";", 1)[1]
    meta = BuildResult(
        step=step.id, arch=step.arch, M=req["M"], N=req["N"], K=req["K"], kwargs=req["kwargs"],
        key=req["key"], dir=str(work), registers=res["registers"],
        smem_bytes=_dynamic_smem_from_host(host_ir, "kernel_kernel"),
        static_smem_bytes=res["static_smem_bytes"], spill_stores=res["spill_stores"],
        spill_loads=res["spill_loads"], stack_bytes=res["stack_bytes"],
        sass_counts=sass_opcode_counts(sass.stdout), times={k: round(v, 3) for k, v in times.items()},
        tvm_version=tvm.__version__, nvcc_version=nvcc_version, watchdog_ms=req["watchdog_ms"])
    # written last: a work folder with meta.json is complete
    (work / "meta.json").write_text(json.dumps(meta.to_json(), indent=1))


tool_errors: list[BuildError] = []  # a tool failure inside TVM's compile callback


def _with_nvdisasm_on_path() -> dict:
    env = dict(os.environ)
    try:
        env["PATH"] = str(Path(find_tool("nvdisasm")).parent) + os.pathsep + env.get("PATH", "")
    except BuildError:
        pass
    return env


if os.environ.pop(_POOL_PRELOAD_ENV, None) == "1":
    # imported by the build pool's fork server (POOL_PRELOAD), before TVM. It must die with
    # the server itself: waiting for the server's end of its pipe to close is not enough,
    # as every worker holds a copy of that end
    _die_with_parent()
    ensure_libcuda()
