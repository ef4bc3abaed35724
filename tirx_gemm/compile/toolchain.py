"""The CUDA toolchain a build compiles with: where nvcc and its tools come from, the
environment that makes TVM find the same ones, and the toolchain's identity for the cache key.

The toolchain comes from pip's nvidia-* wheels (pyproject.toml pins nvcc, crt, runtime, cccl
and nvvm of one CUDA release): they unpack into one CUDA root,
site-packages/nvidia/cu13/{bin,include,nvvm,lib}, which nvcc.profile treats like a toolkit.
A system CUDA (CUDA_HOME, CUDA_PATH or PATH) is used only when TIRX_GEMM_SYSTEM_CUDA=1.

:func:`resolve` names what nvcc runs (ptxas, cicc, the host compiler) and the headers it
includes, each with its path and version, by reading nvcc.profile as nvcc does; nvcc itself is
only asked for ``--version``. :func:`toolchain_id` is that resolution as one string: a cache
entry built by another toolchain has another key. The doctor (tirx_gemm.compile.doctor) asks nvcc
itself (``--dryrun``) and warns where nvcc's answer differs.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import platform
import re
import shutil
from pathlib import Path

from tirx_gemm import settings
from tirx_gemm.compile.procs import BuildError, run_tool

__all__ = ["HEADER_VERSIONS", "SYSTEM_CUDA_ENV", "Toolchain", "WHEEL_PACKAGES", "find_tool",
           "header_versions", "resolve", "toolchain_env", "toolchain_id", "use_system_cuda",
           "wheel_cuda_root", "with_nvdisasm_on_path"]

SYSTEM_CUDA_ENV = "TIRX_GEMM_SYSTEM_CUDA"
WHEEL_CUDA_DIRS = ("cu13",)  # nvidia/<dir>/bin/nvcc of the CUDA 13 wheels
WHEEL_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-runtime",
                  "nvidia-cuda-cccl", "nvidia-nvvm", "nvidia-cuda-cuobjdump",
                  "nvidia-cuda-nvdisasm")
# environment variables nvcc itself reads: they change what it compiles, so they are part of
# the toolchain's identity
NVCC_ENV = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN")
# (header below the CUDA root, macro): the versions the doctor and the cache key name
HEADER_VERSIONS = (("include/cuda.h", "CUDA_VERSION"),
                   ("include/cuda_runtime_api.h", "CUDART_VERSION"),
                   ("include/cccl/cuda/std/__cccl/version.h", "CCCL_VERSION"))


def use_system_cuda() -> bool:
    """True when the user asked for a system CUDA (``TIRX_GEMM_SYSTEM_CUDA=1``)."""
    return settings.get(SYSTEM_CUDA_ENV)


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
    if use_system_cuda():
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


def with_nvdisasm_on_path() -> dict:
    """os.environ with nvdisasm's folder leading PATH (cuobjdump -sass runs it)."""
    env = dict(os.environ)
    try:
        env["PATH"] = str(Path(find_tool("nvdisasm")).parent) + os.pathsep + env.get("PATH", "")
    except BuildError:
        pass
    return env


# ---------------------------------------------------------------------------------------
# what nvcc runs: nvcc.profile, read as nvcc reads it
# ---------------------------------------------------------------------------------------
_PROFILE_LINE = re.compile(r"^\s*(\w+)\s*(\+=|=\+|\?=|=)\s*(.*?)\s*$")
_PROFILE_VAR = re.compile(r"\$\((\w+)\)")


def read_nvcc_profile(nvcc: str, env: dict) -> dict:
    """The variables nvcc sets from the nvcc.profile beside it (TOP, CICC_PATH, PATH,
    INCLUDES, SYSTEM_INCLUDES, ...): ``+=`` puts the value before the inherited one, ``=+``
    after it, as ``nvcc --dryrun`` shows."""
    here = str(Path(nvcc).parent)
    machine = platform.machine() or "x86_64"
    top = Path(here).parent
    target = f"targets/{machine}-linux"
    var = {"_HERE_": here, "_THERE_": here, "_SPACE_": " ", "_NVVM_BRANCH_": "nvvm",
           "_CUDART_": "cudart", "_TARGET_SIZE_": "64",
           "_TARGET_DIR_": target if (top / target).is_dir() else ""}
    profile = Path(here) / "nvcc.profile"
    try:
        text = profile.read_text(errors="replace")
    except OSError:
        return var
    for line in text.splitlines():
        m = _PROFILE_LINE.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        name, op, value = m.groups()
        value = _PROFILE_VAR.sub(lambda v: var.get(v.group(1), env.get(v.group(1), "")), value)
        old = var.get(name, env.get(name, ""))
        var[name] = {"+=": value + old, "=+": old + value, "?=": old or value}.get(op, value)
    return var


def dryrun_variables(nvcc: str, env: dict) -> dict:
    """The variables nvcc reports setting (``#$ NAME=value``, the last one of a name wins)
    in a dry run: its profile's values wherever that profile is, e.g. behind a wrapper
    script with no nvcc.profile beside it. {} when the dry run fails."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="tirx-gemm-nvcc.") as d:
        src = Path(d) / "probe.cu"
        src.write_text("")
        try:
            dry = run_tool([nvcc, "--dryrun", "-c", str(src), "-o", str(Path(d) / "probe.o")],
                           probe=True, env=env, name="nvcc --dryrun")
        except BuildError:
            return {}
    if dry.returncode != 0:
        return {}
    return dict(re.findall(r"^#\$ (\w+)=(.*?)\s*$", dry.stdout + dry.stderr, re.M))


def _on_path(dirs, tool: str) -> str | None:
    for d in dirs:
        if d and (Path(d) / tool).is_file():
            return os.path.normpath(Path(d) / tool)
    return None


def header_versions(include_dir: str) -> list[str]:
    """``MACRO=value`` of HEADER_VERSIONS found for one include folder."""
    found = []
    for rel, macro in HEADER_VERSIONS:
        for cand in (Path(include_dir).parent / rel, Path(include_dir) / Path(rel).name):
            if cand.is_file():
                m = re.search(rf"#define\s+{macro}\s+(\d+)", cand.read_text(errors="replace"))
                if m and f"{macro}={m.group(1)}" not in found:
                    found.append(f"{macro}={m.group(1)}")
                break
    return found


def include_dirs(variables: dict) -> list[str]:
    """The -I and -isystem folders of nvcc's INCLUDES and SYSTEM_INCLUDES."""
    return [os.path.normpath(p) for p in re.findall(
        r'"-(?:I|isystem" ")([^"]+)"',
        variables.get("INCLUDES", "") + " " + variables.get("SYSTEM_INCLUDES", ""))]


def _release_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if "release" in ln]
    return lines[-1] if lines else (text.strip().splitlines() or ["?"])[-1]


def _binary_release(path: str) -> str:
    """The "Cuda compilation tools, release X, VY" string a CUDA binary (cicc, which has no
    --version) carries, or its size when it carries none."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            i = m.find(b"Cuda compilation tools, release")
            if i >= 0:
                return m[i:i + 80].split(b"\0")[0].decode(errors="replace")
            return f"{len(m)} bytes, no release string"
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """What a build compiles with, each tool as "path (version)" or "missing"."""
    source: str             # "wheels" or "system"
    nvcc: str
    nvcc_version: str       # nvcc --version's last line
    ptxas: str
    cicc: str
    headers: tuple          # ("folder (MACRO=v, ...)", ...)
    host_compiler: str
    nvcc_env: tuple         # (("NVCC_PREPEND_FLAGS", value), ...) where set
    tvm: str

    def id(self) -> str:
        """One string naming all of it (part of every cache key)."""
        return ";".join([f"tvm={self.tvm}", f"source={self.source}", f"nvcc={self.nvcc}",
                         f"nvcc_version={self.nvcc_version}", f"ptxas={self.ptxas}",
                         f"cicc={self.cicc}", "headers=" + "|".join(self.headers),
                         f"host={self.host_compiler}",
                         "env=" + "|".join(f"{k}={v}" for k, v in self.nvcc_env)])


def _nvcc_version(nvcc: str, env: dict) -> str:
    probe = run_tool([nvcc, "--version"], probe=True, env=env, name="nvcc --version")
    lines = probe.stdout.strip().splitlines()
    if probe.returncode != 0 or not lines:
        raise BuildError(f"nvcc --version failed (exit {probe.returncode}): "
                         f"{(probe.stderr.strip().splitlines() or ['no output'])[-1]}")
    return lines[-1].strip()


def _version_of(tool: str | None, args: list, env: dict, first_line: bool = False) -> str:
    if not tool:
        return "missing"
    try:
        out = run_tool([tool, *args], probe=True, env=env,
                       name=f"{Path(tool).name} {' '.join(args)}")
    except BuildError as exc:
        return f"{os.path.realpath(tool)} (failed: {exc})"
    text = out.stdout if out.stdout.strip() else out.stderr
    version = (text.strip().splitlines() or ["?"])[0] if first_line else _release_line(text)
    return f"{os.path.realpath(tool)} ({version.strip()})"


def resolve() -> Toolchain:
    """The toolchain a build uses now. A missing nvcc resolves to nvcc "missing" (a build
    then fails with find_tool's one-line error); a hung or failing ``nvcc --version`` raises
    BuildError."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        tvm = version("apache-tvm")
    except PackageNotFoundError:
        tvm = "missing"
    env = toolchain_env()
    nvcc_env = tuple((k, env[k]) for k in NVCC_ENV if env.get(k))
    source = "system" if use_system_cuda() else "wheels"
    try:
        nvcc = find_tool("nvcc")
    except BuildError as exc:
        if "not found" not in str(exc):
            raise
        return Toolchain(source, "missing", "missing", "missing", "missing", (), "missing",
                         nvcc_env, tvm)
    nvcc_version = _nvcc_version(nvcc, env)
    var = read_nvcc_profile(nvcc, env)
    if not (Path(nvcc).parent / "nvcc.profile").is_file():  # a wrapper script: ask nvcc
        var = {**var, **dryrun_variables(nvcc, env)}
    search = var.get("PATH", env.get("PATH", "")).split(os.pathsep)
    ptxas = _version_of(_on_path(search, "ptxas"), ["--version"], env)
    cicc_path = _on_path([var.get("CICC_PATH", "")], "cicc")
    cicc = (f"{os.path.realpath(cicc_path)} ({_binary_release(cicc_path)})" if cicc_path
            else "missing")
    headers = tuple(os.path.realpath(inc) + (f" ({', '.join(v)})" if v else "")
                    for inc in include_dirs(var) for v in [header_versions(inc)])
    ccbin = env.get("NVCC_CCBIN") or "gcc"
    host = shutil.which(ccbin, path=os.pathsep.join(search)) if not os.path.isabs(ccbin) \
        else ccbin
    host_compiler = _version_of(host, ["--version"], env, first_line=True)
    return Toolchain(source, os.path.realpath(nvcc), nvcc_version, ptxas, cicc, headers,
                     host_compiler, nvcc_env, tvm)


_RESOLVED: dict[tuple, Toolchain] = {}  # per process: the environment it was resolved in


def resolved() -> Toolchain:
    """:func:`resolve`, once per process and environment (the tools are asked once)."""
    key = tuple(os.environ.get(k) for k in (SYSTEM_CUDA_ENV, "PATH", "CUDA_HOME", "CUDA_PATH",
                                            *NVCC_ENV))
    if key not in _RESOLVED:
        _RESOLVED[key] = resolve()
    return _RESOLVED[key]


def toolchain_id() -> str:
    """The resolved toolchain as one string (see Toolchain.id)."""
    return resolved().id()
