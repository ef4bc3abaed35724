"""Bundles: built kernels + a manifest + TVM's runtime libraries, for a GPU host that has
torch and apache-tvm-ffi but not the TVM compiler (or no network to install it).

Layout of a bundle directory::

    manifest.json                   one entry per kernel: step, arch, shape, kwargs, lib, ...
    <step>_<arch>_<M>x<N>x<K>[_<kwarg><value>...][_wd<ms>].so
                                    exported TVM libraries (host code + embedded cubin);
                                    _dtypebfloat16: a bfloat16 build (float16 has no tag);
                                    _wd<ms>: a watchdog build (bounded barrier waits)
    runtime/libtvm_runtime.so       from the apache-tvm wheel (found next to the libraries
    runtime/libtvm_runtime_cuda.so  by tirx_gemm.runner.load_kernel)
    wheels/                         optional: apache-tvm-ffi wheel for the host's Python

This module imports without TVM: the GPU host only calls :func:`find`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.loader import RUNTIME_LIBS, tvm_package_lib_dir

MANIFEST = "manifest.json"
FFI_VERSION = "0.1.15.post2"  # the apache-tvm-ffi that apache-tvm 0.27.0.post1 ships with


def shapes_for(step: registry.Step, which, mnk=None) -> list[tuple[int, int, int]]:
    """The shapes to export or run: ``mnk``; else ``which``, a registry list name
    ("canonical", "test", "bench", "all") or explicit (M, N, K) shapes (any shape: the
    step's builder decides whether it accepts it)."""
    if mnk:
        return [tuple(mnk)]
    if not isinstance(which, str):
        return [tuple(int(x) for x in s) for s in which]
    if which == "canonical":
        return [step.canonical]
    if which == "test":
        return [step.canonical, *[s for s in step.test_shapes if s != step.canonical]]
    if which == "bench":
        return list(step.bench_shapes) or [step.canonical]
    return registry.gpu_shapes(step)


def build_kwargs(step: registry.Step, args) -> dict:
    """Builder keywords chosen at export time: the SM count of persistent steps and the
    operand dtype (written only for bfloat16; float16 is every builder's default)."""
    kw = step.with_sm_count(getattr(args, "num_sms", None))
    if getattr(args, "dtype", None) not in (None, "float16"):
        kw["dtype"] = args.dtype
    return kw


def lib_name(step: str, arch: str, M: int, N: int, K: int, kwargs: dict,
             watchdog_ms: int | None = None) -> str:
    extra = "".join(f"_{k}{v}" for k, v in sorted(kwargs.items()))
    if watchdog_ms is not None:
        extra += f"_wd{watchdog_ms}"
    return f"{step}_{arch}_{M}x{N}x{K}{extra}.so"


def check_out_dir(out: Path) -> None:
    """Refuse, before building, a bundle folder that cannot be created: it or one of its
    parents is an existing file."""
    for d in (out, *out.parents):
        if d.exists():
            if not d.is_dir():
                what = "it is a file" if d == out else f"{d} is a file"
                raise ValueError(f"--out {out}: cannot make a bundle folder there ({what})")
            return


def _tvm_lib_dir() -> Path:
    lib = tvm_package_lib_dir()
    if lib is None:
        raise RuntimeError("the apache-tvm package is not installed: cannot copy its runtime")
    return lib


def export(requests, out: Path, *, jobs=None, progress=True, ffi_wheel_python=None,
           watchdog_ms: int | None = None) -> int:
    from tirx_gemm.build import BuildError, build_many, run_tool

    check_out_dir(out)

    def show(done, total, req, res):
        if progress:
            state = "FAILED" if isinstance(res, Exception) else ("cached" if res.cached else "built")
            print(f"[{done}/{total}] {req[0].key} {'x'.join(map(str, req[1]))} {state}",
                  file=sys.stderr, flush=True)

    results = build_many(requests, jobs=jobs, progress=show, watchdog_ms=watchdog_ms)
    errors = [(req, r) for req, r in zip(requests, results) if isinstance(r, Exception)]
    if errors:  # nothing is written: a bundle never ships part of what was asked
        why = "; ".join(f"{req[0].key} {'x'.join(map(str, req[1]))}: "
                        f"{(str(r).strip() or type(r).__name__).splitlines()[0]}"
                        for req, r in errors)
        raise BuildError(f"{len(errors)} of {len(requests)} build(s) failed, nothing exported: "
                         f"{why}")
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"kernels": []}
    from tirx_gemm.gitinfo import git_sha
    sha = git_sha()
    for r in results:
        name = lib_name(r.step, r.arch, r.M, r.N, r.K, r.kwargs, r.watchdog_ms)
        shutil.copyfile(r.lib_path, out / name)
        entry = {"step": r.step, "arch": r.arch, "M": r.M, "N": r.N, "K": r.K,
                 "kwargs": r.kwargs, "dtype": r.kwargs.get("dtype", "float16"),
                 "watchdog_ms": r.watchdog_ms, "lib": name,
                 "tvm_version": r.tvm_version,
                 "build_key": r.key, "git_sha": sha, "registers": r.registers, "smem_bytes": r.smem_bytes,
                 "spills": r.spill_stores + r.spill_loads}
        manifest["kernels"] = [e for e in manifest["kernels"] if e["lib"] != name] + [entry]
    manifest_path.write_text(json.dumps(manifest, indent=1))
    rt = out / "runtime"
    rt.mkdir(exist_ok=True)
    for lib in RUNTIME_LIBS:
        shutil.copyfile(_tvm_lib_dir() / lib, rt / lib)
    if ffi_wheel_python:
        py = ffi_wheel_python.replace(".", "")
        pip = run_tool([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", ffi_wheel_python,
                        "--implementation", "cp", "--abi", f"cp{py}",
                        "--platform", "manylinux_2_28_x86_64", "-d", str(out / "wheels"),
                        f"apache-tvm-ffi=={FFI_VERSION}"], name="pip download")
        if pip.returncode != 0:
            tail = (pip.stderr.strip().splitlines() or ["no output"])[-1]
            raise BuildError(f"pip download of apache-tvm-ffi=={FFI_VERSION} for Python "
                             f"{ffi_wheel_python} failed: {tail}")
    return len(results)


def load_manifest(bundle: Path) -> list[dict]:
    path = Path(bundle) / MANIFEST
    if not path.exists():
        raise ValueError(f"{bundle} is not a bundle: no {MANIFEST} (make one with "
                         f"`tirx-gemm export`)")
    return json.loads(path.read_text())["kernels"]


def find(bundle: Path, step: registry.Step, mnk, kwargs: dict | None = None,
         watchdog_ms: int | None = None, dtype: str | None = None) -> dict:
    """The manifest entry for (step, arch, shape, dtype) built with ``watchdog_ms`` (None:
    the normal build); a clear error if the bundle has the step only for other shapes,
    dtypes, arches or watchdog settings. ``kwargs`` given: exactly those builder keywords
    (the dtype among them); else any, with operand ``dtype`` (default float16)."""
    kernels = load_manifest(bundle)
    M, N, K = mnk
    want_dtype = step.dtype(kwargs) if kwargs is not None else (dtype or "float16")
    if kwargs is not None and dtype is not None and dtype != want_dtype:
        raise ValueError(f"find: dtype={dtype!r} contradicts kwargs {kwargs}")
    mine = [e for e in kernels if e["step"] == step.id and e["arch"] == step.arch]
    same = [e for e in mine if e.get("watchdog_ms") == watchdog_ms]
    if mine and not same:
        have = sorted({str(e.get("watchdog_ms")) for e in mine})
        raise ValueError(f"bundle {bundle} has {step.key} built with watchdog_ms "
                         f"{', '.join(have)}, not {watchdog_ms} (export with the same "
                         "--watchdog-ms)")
    at_shape = [e for e in same if (e["M"], e["N"], e["K"]) == (M, N, K)]
    hits = [e for e in at_shape if step.dtype(e.get("kwargs")) == want_dtype
            and (kwargs is None or (e.get("kwargs") or {}) == kwargs)]
    if hits:
        return hits[-1]
    if at_shape:
        have = sorted({step.dtype(e.get("kwargs")) for e in at_shape})
        if want_dtype not in have:
            raise ValueError(f"bundle {bundle} has {step.key} at {M}x{N}x{K} only in "
                             f"{', '.join(have)}, not {want_dtype} (export with --dtype "
                             f"{want_dtype})")
        kws = "; ".join(json.dumps(e.get("kwargs") or {}, sort_keys=True) for e in at_shape)
        raise ValueError(f"bundle {bundle} has {step.key} at {M}x{N}x{K} built with {kws}, "
                         f"not {json.dumps(kwargs, sort_keys=True)}")
    if same:
        have = ", ".join(dict.fromkeys(f"{e['M']}x{e['N']}x{e['K']}" for e in same))
        raise ValueError(f"bundle {bundle} has {step.key} built for {have}, not {M}x{N}x{K}: "
                         f"a kernel runs only at the shape it was built for")
    others = sorted({e["arch"] for e in kernels if e["step"] == step.id})
    if others:
        raise ValueError(f"bundle {bundle} has {step.id} only for {', '.join(others)}, "
                         f"not {step.arch}")
    raise ValueError(f"bundle {bundle} has no {step.key}")
