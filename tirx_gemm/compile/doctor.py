"""`tirx-gemm doctor`: what a build compiles with, as nvcc itself reports it (``nvcc --dryrun``),
checked against what the cache key names (toolchain.resolve), and whether the libcuda a build
loads (the GPU driver's, or the stub) is sound.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from tirx_gemm.compile.cudalibs import ensure_cudart, stub_status
from tirx_gemm.compile.procs import BuildError, run_tool
from tirx_gemm.compile.toolchain import (SYSTEM_CUDA_ENV, WHEEL_PACKAGES, find_tool, header_versions,
                                 include_dirs, resolve, toolchain_env, use_system_cuda)

__all__ = ["toolchain_report"]


def _path_of(entry: str) -> str:
    """The path of a Toolchain entry "path (version)"."""
    return entry.split(" (", 1)[0]


def toolchain_report() -> list[tuple[str, str]]:
    """What a build compiles with, as (label, text) lines: the source of the toolchain, nvcc,
    the ptxas and cicc that nvcc runs, the include folders it passes and their header versions,
    cuobjdump, nvdisasm, the host compiler, the installed nvidia-* wheels, the libcuda a
    build loads and the toolchain's id in the cache key. The nvcc lines come from
    ``nvcc --dryrun`` itself, so they name what nvcc really uses; a "warning" line says where
    that differs from what the cache key names, or what is broken."""
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

    keyed = resolve()
    ptxas = on(search, "ptxas")
    if ptxas:
        pv = run_tool([ptxas, "--version"], probe=True, env=env, name="ptxas --version")
        rel = [ln for ln in pv.stdout.splitlines() if "release" in ln]
        lines.append(("ptxas", f"{ptxas} ({rel[-1].strip() if rel else '?'})"))
    else:
        lines.append(("ptxas", "not found on nvcc's search path"))
    cicc = on([var.get("CICC_PATH", "")], "cicc")
    lines.append(("cicc", f"{cicc} ({keyed.cicc.partition(' (')[2].rstrip(')')})"
                  if cicc and os.path.realpath(cicc) == _path_of(keyed.cicc)
                  else cicc or "not found"))
    includes = include_dirs(var)
    for inc in includes:
        found = header_versions(inc)
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
    ok, libcuda = stub_status()
    lines.append(("libcuda", libcuda) if ok else ("warning", f"libcuda: {libcuda}"))
    lines.append(("toolchain id", hashlib.sha256(keyed.id().encode()).hexdigest()[:16]
                  + " (part of every cache key)"))
    # what the cache key names must be what nvcc runs
    for label, dry_path, key_entry in (("ptxas", ptxas, keyed.ptxas),
                                       ("cicc", cicc, keyed.cicc),
                                       ("host compiler", cxx, keyed.host_compiler)):
        if dry_path and os.path.realpath(dry_path) != _path_of(key_entry):
            lines.append(("warning", f"nvcc runs {label} {dry_path}, but the cache key names "
                          f"{_path_of(key_entry)}"))
    keyed_includes = [_path_of(h) for h in keyed.headers]
    if [os.path.realpath(i) for i in includes] != keyed_includes:
        lines.append(("warning", f"nvcc includes {includes}, but the cache key names "
                      f"{keyed_includes}"))
    if dry.returncode != 0:
        lines.append(("warning", f"nvcc --dryrun failed (exit {dry.returncode}): "
                      f"{text.strip().splitlines()[-1] if text.strip() else 'no output'}"))
    return lines
