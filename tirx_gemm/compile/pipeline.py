"""One build, TVM -> nvcc -> SASS, in the process that runs it (a pool worker): the step's
PrimFunc, TVM's lowering with our nvcc (flags, cubin, ptxas -v captured), the exported library,
cuobjdump's SASS, and meta.json with the resource usage and every artefact's sha256.

Imports TVM only inside :func:`compile_job`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.compile.cache import META, BuildResult, artefact_hashes
from tirx_gemm.compile.cudalibs import ensure_libcuda
from tirx_gemm.compile.names import DEVICE_SUFFIX, kernel_name
from tirx_gemm.compile.procs import BuildError, run_tool
from tirx_gemm.compile.toolchain import find_tool, toolchain_env, with_nvdisasm_on_path

__all__ = ["NVCC_FLAGS", "compile_job", "parse_ptxas", "sass_opcode_counts"]

NVCC_FLAGS = [
    "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "--expt-extended-lambda",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--ptxas-options=-v,--warn-on-local-memory-usage",
]

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


def compile_job(job: dict) -> None:
    """Build ``job`` (step, arch, M, N, K, kwargs, watchdog_ms, key, dir, nvcc_version) into
    its folder.
    An invalid shape writes error.json (ValueError, the builder's words); a toolchain
    failure raises BuildError in the tool's own words; success writes meta.json last."""
    work = Path(job["dir"])
    t0 = time.perf_counter()
    times = {}
    libcuda = ensure_libcuda()
    os.environ.update(toolchain_env())
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"

    import tvm
    import tvm_ffi

    step = registry.get(job["step"], job["arch"])
    nvcc_log: list[str] = []
    tool_failure: list[BuildError] = []  # what the callback raised: TVM re-wraps it

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code, *_):  # our flags, our cubin, ptxas -v captured
        t = time.perf_counter()
        (work / "kernel.cu").write_text(code)
        cmd = [find_tool("nvcc"), "--cubin", "-arch", job["arch"], *NVCC_FLAGS,
               "-o", str(work / "kernel.cubin"), str(work / "kernel.cu")]
        try:
            proc = run_tool(cmd)
            if proc.returncode != 0:
                raise BuildError("nvcc failed:\n" + proc.stdout + proc.stderr)
        except BuildError as exc:
            tool_failure.append(exc)
            raise
        nvcc_log.append(proc.stdout + proc.stderr)
        times["nvcc"] = time.perf_counter() - t
        return bytearray((work / "kernel.cubin").read_bytes())

    from tirx_gemm import helpers
    helpers.set_watchdog(job["watchdog_ms"])  # every mbarrier wait the builder emits
    try:
        func = step.build_primfunc(job["M"], job["N"], job["K"], **job["kwargs"])
    except ValueError as exc:
        (work / "error.json").write_text(json.dumps({"type": "ValueError", "message": str(exc)}))
        return
    # the global symbol says what the kernel is (compile/names.py): profilers show it + "_kernel"
    name = kernel_name(step, job["kwargs"])
    func = func.with_attr("global_symbol", name)
    (work / "kernel.tir.py").write_text(func.script())
    target = tvm.target.Target({"kind": "cuda", "arch": job["arch"]})
    t = time.perf_counter()
    try:
        with target:
            exe = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")
    except Exception:
        if tool_failure:
            raise tool_failure[0] from None  # the tool's own words, not TVM's wrap
        raise
    times["tvm"] = time.perf_counter() - t - times.get("nvcc", 0.0)
    if not nvcc_log:
        raise BuildError(f"TVM did not compile the kernel (libcuda: {libcuda})")
    host_ir = exe.mod.inspect_source()
    t = time.perf_counter()
    exe.export_library(str(work / "kernel.so"))
    times["export"] = time.perf_counter() - t

    t = time.perf_counter()
    sass = run_tool([find_tool("cuobjdump"), "-sass", str(work / "kernel.cubin")],
                    env=with_nvdisasm_on_path())
    if sass.returncode != 0:
        raise BuildError("cuobjdump failed: " + sass.stderr.strip())
    (work / "kernel.sass").write_text(sass.stdout)
    times["sass"] = time.perf_counter() - t
    times["total"] = time.perf_counter() - t0

    res = parse_ptxas("\n".join(nvcc_log))
    meta = BuildResult(
        step=step.id, arch=step.arch, M=job["M"], N=job["N"], K=job["K"], kwargs=job["kwargs"],
        key=job["key"], dir=str(work), registers=res["registers"],
        smem_bytes=_dynamic_smem_from_host(host_ir, name + DEVICE_SUFFIX),
        static_smem_bytes=res["static_smem_bytes"], spill_stores=res["spill_stores"],
        spill_loads=res["spill_loads"], stack_bytes=res["stack_bytes"],
        sass_counts=sass_opcode_counts(sass.stdout), times={k: round(v, 3) for k, v in times.items()},
        tvm_version=tvm.__version__, nvcc_version=job["nvcc_version"],
        watchdog_ms=job["watchdog_ms"], sha256=artefact_hashes(work))
    # written last: a work folder with meta.json is complete
    (work / META).write_text(json.dumps(meta.to_json(), indent=1))
