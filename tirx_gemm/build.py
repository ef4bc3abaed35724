"""Build harness: compile a step for an arch -> CUDA source, cubin, exported library,
resource usage and a SASS opcode summary.

Every build runs in its own process, forked from a build server that has imported TVM once
(``python -m tirx_gemm.build --serve``), so no TVM compiler state leaks from one step into
the next and no build pays the TVM import again; results are cached on disk by
(step, shape, arch, builder kwargs, sources, toolchain): a repeated build is a file read.

On a machine without a GPU driver the worker first loads a stub ``libcuda.so.1`` (built
from ``tirx_gemm/stub/libcuda_stub.c``) so that TVM embeds the compiled kernel into the
exported library instead of keeping CUDA source only; that library then runs on a GPU
host that has just torch, apache-tvm-ffi and TVM's two runtime libraries.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.registry import KEY_SASS, Step

BUILD_FORMAT = 4  # bump when the cached artefacts or their meaning change
PKG_DIR = Path(__file__).resolve().parent

NVCC_FLAGS = [
    "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "--expt-extended-lambda",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--ptxas-options=-v,--warn-on-local-memory-usage",
]


class BuildError(RuntimeError):
    """The step is valid but the toolchain failed (TVM lowering, nvcc, cuobjdump)."""


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
        d = dataclasses.asdict(self)
        d.pop("cached")
        return d


def count_prefix(counts: dict, prefix: str) -> int:
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))


# ---------------------------------------------------------------------------------------
# tools and cache
# ---------------------------------------------------------------------------------------
def find_tool(name: str) -> str:
    """A CUDA tool from PATH, else from pip's nvidia-* wheels (cuobjdump, nvdisasm)."""
    path = shutil.which(name)
    if path:
        return path
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for cand in sorted(Path(root).glob(f"*/bin/{name}")):
            return str(cand)
    hint = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}.get(name)
    raise BuildError(f"{name} not found on PATH" + (f" (pip install {hint})" if hint else ""))


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
            nvcc = subprocess.run([find_tool("nvcc"), "--version"], capture_output=True,
                                  text=True, check=True).stdout.strip().splitlines()[-1]
        except (BuildError, subprocess.CalledProcessError):
            nvcc = "nvcc-missing"
        _TOOLCHAIN = f"tvm={version('apache-tvm')};{nvcc}"
    return _TOOLCHAIN


def cache_key(step: Step, M: int, N: int, K: int, kwargs: dict) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([BUILD_FORMAT, step.key, M, N, K, sorted(kwargs.items()),
                         _toolchain_id()], default=str).encode())
    # the step's own source and the package modules a step of its arch can pull in
    shared = ["helpers.py"] + (["hopper.py"] if step.arch == "sm_90a" else [])
    for path in [Path(step.source_file), *(PKG_DIR / f for f in shared), Path(__file__)]:
        if path.exists():
            h.update(path.read_bytes())
    return h.hexdigest()[:20]


def _load_cached(step: Step, M, N, K, kwargs) -> BuildResult | None:
    key = cache_key(step, M, N, K, kwargs)
    meta = cache_root() / "builds" / key / "meta.json"
    if meta.exists():
        try:
            res = BuildResult(**json.loads(meta.read_text()))
        except (TypeError, json.JSONDecodeError):
            return None
        if res.lib_path.exists() and res.cubin_path.exists():
            res.cached = True
            return res
    return None


# ---------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------
def resolve_shape(step: Step, mnk) -> tuple[int, int, int]:
    if mnk is None:
        return step.canonical
    if len(mnk) != 3:
        raise ValueError(f"shape must be M,N,K (three integers), got {mnk!r}")
    return tuple(int(x) for x in mnk)


def build(step_id: str, M: int | None = None, N: int | None = None, K: int | None = None,
          arch: str = "sm_100a", *, use_cache: bool = True, **kwargs) -> BuildResult:
    """Compile one step. Raises ValueError for an invalid step/shape (the builder's own
    message), BuildError when the toolchain fails."""
    step = registry.get(step_id, arch)
    M, N, K = step.canonical if M is None else (M, N, K)
    return build_many([(step, (M, N, K), kwargs)], use_cache=use_cache)[0]


def build_many(requests, *, jobs: int | None = None, use_cache: bool = True,
               progress=None) -> list[BuildResult | Exception]:
    """Build several (step, (M, N, K), kwargs), each in its own process.

    A build server process imports TVM once; every build then runs in a child forked from
    it, so each starts from the same clean, just-imported compiler state (nothing one build
    does leaks into another) without paying the ~2.5 s TVM import per build. At most
    ``jobs`` children run at once (default: the CPU count).

    With one request, errors are raised; with several, each failed slot holds its
    exception so that one bad step does not hide the others' results. ``progress`` is
    called as progress(done, total, request, result_or_exc) after each build.
    """
    reqs = [(s, tuple(mnk), dict(kw or {})) for s, mnk, kw in requests]
    out: list = [None] * len(reqs)
    todo = []
    for i, (step, (M, N, K), kw) in enumerate(reqs):
        hit = _load_cached(step, M, N, K, kw) if use_cache else None
        if hit is not None:
            out[i] = hit
        else:
            todo.append(i)
    done = 0
    for i in range(len(reqs)):
        if out[i] is not None:
            done += 1
            if progress:
                progress(done, len(reqs), reqs[i], out[i])
    if todo:
        jobs = jobs or max(1, min(len(todo), os.cpu_count() or 1))
        jobs_by_dir = {}
        for i in todo:
            step, mnk, kw = reqs[i]
            job = _prepare(step, mnk, kw)
            jobs_by_dir[job["dir"]] = (i, job)
        for work_dir, rc, log in _serve([job for _, job in jobs_by_dir.values()], jobs):
            i, job = jobs_by_dir[work_dir]
            try:
                out[i] = _finish(reqs[i][0], job, rc, log)
            except Exception as exc:  # noqa: BLE001 - reported per slot
                out[i] = exc
            done += 1
            if progress:
                progress(done, len(reqs), reqs[i], out[i])
    if len(reqs) == 1 and isinstance(out[0], Exception):
        raise out[0]
    return out


def _prepare(step: Step, mnk, kwargs) -> dict:
    M, N, K = mnk
    key = cache_key(step, M, N, K, kwargs)
    final = cache_root() / "builds" / key
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=final.parent))
    return {"step": step.id, "arch": step.arch, "M": M, "N": N, "K": K, "kwargs": kwargs,
            "key": key, "dir": str(work)}


def _serve(jobs: list[dict], parallel: int):
    """Run the build server; yield (work dir, exit status, log tail) as builds finish."""
    env = dict(os.environ)
    # the server must import this very package, whichever way it was made importable
    env["PYTHONPATH"] = os.pathsep.join([str(PKG_DIR.parent)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryFile("w+") as server_err:
        proc = subprocess.Popen([sys.executable, "-m", "tirx_gemm.build", "--serve",
                                 str(parallel)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=server_err, text=True, env=env)
        proc.stdin.write("".join(json.dumps(j) + "\n" for j in jobs))
        proc.stdin.close()
        seen = set()
        for line in proc.stdout:
            if line.startswith("DONE "):
                msg = json.loads(line[5:])
                seen.add(msg["dir"])
                log = Path(msg["dir"]) / "build.log"
                yield msg["dir"], msg["rc"], log.read_text() if log.exists() else ""
        proc.wait()
        server_err.seek(0)
        err = server_err.read()
    for job in jobs:  # the server died before reporting these
        if job["dir"] not in seen:
            yield job["dir"], proc.returncode or -1, err[-3000:]


def _finish(step: Step, job: dict, rc: int, log: str) -> BuildResult:
    work, final = Path(job["dir"]), cache_root() / "builds" / job["key"]
    shape = f"{job['M']}x{job['N']}x{job['K']}"
    err_file = work / "error.json"
    if err_file.exists():
        err = json.loads(err_file.read_text())
        shutil.rmtree(work, ignore_errors=True)
        if err["type"] == "ValueError":
            raise ValueError(err["message"])
        raise BuildError(f"{step.key} {shape}: {err['type']}: {err['message']}")
    if rc != 0 or not (work / "meta.json").exists():
        shutil.rmtree(work, ignore_errors=True)
        tail = "\n".join(log.strip().splitlines()[-25:])
        raise BuildError(f"{step.key} {shape}: build process failed (exit {rc}):\n{tail}")
    meta = json.loads((work / "meta.json").read_text())
    meta["dir"] = str(final)
    (work / "meta.json").write_text(json.dumps(meta, indent=1))
    if final.exists():  # a concurrent build of the same key won; keep theirs
        shutil.rmtree(work, ignore_errors=True)
    else:
        try:
            work.rename(final)
        except OSError:
            shutil.rmtree(work, ignore_errors=True)
    return BuildResult(**json.loads((final / "meta.json").read_text()))


def _server(parallel: int) -> int:
    """Import TVM once, then fork one child per build request read from stdin."""
    jobs = [json.loads(line) for line in sys.stdin if line.strip()]
    ensure_libcuda()
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
    import tvm  # noqa: F401  (imported before forking: the point of the server)
    import tvm_ffi  # noqa: F401
    running: dict[int, dict] = {}
    pending = list(jobs)
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop(0)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:  # child: one build, then leave without running parent cleanup
                code = 1
                try:
                    # the child's own output goes to its log, not into the server's protocol
                    log = os.open(os.path.join(job["dir"], "build.log"),
                                  os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    code = _worker_main(job)
                finally:
                    os._exit(code)
            running[pid] = job
        pid, status = os.wait()
        job = running.pop(pid, None)
        if job is not None:
            rc = os.waitstatus_to_exitcode(status)
            print("DONE " + json.dumps({"dir": job["dir"], "rc": rc}), flush=True)
    return 0


# ---------------------------------------------------------------------------------------
# worker (runs in its own process)
# ---------------------------------------------------------------------------------------
def ensure_libcuda() -> str:
    """Load the real libcuda if there is one, else the stub. Returns which."""
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        return "driver"
    except OSError:
        pass
    src = PKG_DIR / "stub" / "libcuda_stub.c"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    out = cache_root() / "stub" / digest / "libcuda.so.1"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", str(tmp),
                        str(src)], check=True)
        tmp.rename(out)
    ctypes.CDLL(str(out), mode=ctypes.RTLD_GLOBAL)
    return "stub"


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
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError("nvcc failed:\n" + proc.stdout + proc.stderr)
        nvcc_log.append(proc.stdout + proc.stderr)
        times["nvcc"] = time.perf_counter() - t
        return bytearray((work / "kernel.cubin").read_bytes())

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
    sass = subprocess.run([find_tool("cuobjdump"), "-sass", str(work / "kernel.cubin")],
                          capture_output=True, text=True, env=_with_nvdisasm_on_path())
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
        tvm_version=tvm.__version__, nvcc_version=nvcc_version)
    (work / "meta.json").write_text(json.dumps(meta.to_json(), indent=1))


def _with_nvdisasm_on_path() -> dict:
    env = dict(os.environ)
    try:
        env["PATH"] = str(Path(find_tool("nvdisasm")).parent) + os.pathsep + env.get("PATH", "")
    except BuildError:
        pass
    return env


def _worker_main(req: dict) -> int:
    try:
        _worker(req)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        Path(req["dir"]).mkdir(parents=True, exist_ok=True)
        (Path(req["dir"]) / "error.json").write_text(
            json.dumps({"type": type(exc).__name__, "message": str(exc)[-4000:]}))
        return 1
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--serve":
        return _server(int(argv[1]))
    print("usage: python -m tirx_gemm.build --serve JOBS < requests.jsonl (internal)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
