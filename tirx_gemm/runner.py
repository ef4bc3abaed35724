"""Run, check and time a built GEMM step: D = A @ B.T (fp16 in, fp32 accumulate, fp16 out).

This module is the run side of the project. It imports with torch, numpy and the standard
library only: there is no ``import tvm`` in it, so it works on a GPU host where the TVM
compiler is not installed. An exported step library is loaded with ``apache-tvm-ffi`` plus
TVM's two runtime libraries (see :func:`load_kernel`).

House rules it implements (DESIGN.md, items 6-8):

* correctness is never trivially satisfied: fp32 torch reference, fresh random inputs on each
  check, a small-integer check that must match exactly, the output poisoned with NaN before
  every launch, NaN/Inf (and so unwritten elements) always fail, mismatch count and the first
  few mismatches reported;
* timing happens after a passing check, after warm-up, with CUDA events around each launch,
  rotating input sets when one set would stay resident in L2, median of many launches, and
  torch.matmul (cuBLAS) timed in the same run as the ratio's denominator;
* the result is a record (a dict), not printed text.

Tolerances used by :func:`compare` (inputs from :func:`make_inputs`; the rules are
defined once, in numpy, in ``tirx_gemm.numerics``, shared with the CPU simulation)
--------------------------------------------------------------------
The kernel accumulates in fp32 and rounds once to fp16. The fp16 unit roundoff is
u = 2**-11 ~ 4.9e-4, so the output rounding alone gives a relative Frobenius error of about
u/sqrt(3) ~ 2.8e-4 (2.1e-4 measured on an H200 at 4096^3). Defaults:

* ``max_rel_err = 1e-3`` on ||out - ref||_F / ||ref||_F: ~3.5x the rounding floor. A kernel
  that accumulated in fp16 instead of fp32 lands at ~u*sqrt(K/2) (2.8e-3 at K=64, 2.2e-2 at
  K=4096) and fails, as does any dropped K tile or wrong tile.
* elementwise ``|out - ref| <= atol + rtol*|ref|`` with ``rtol = 1e-3`` (~2u: one fp16 rounding
  plus slack for a different fp32 summation order) and ``atol = 1e-3 * rms(ref)`` (for results
  near zero, where a relative bound is meaningless; scale-aware so it holds for any input
  scale).
* exact mode (small-integer inputs): every element must equal ``ref.to(float16)``. Integer
  products summed in fp32 are exact while |partial sums| < 2**24 whatever the summation order,
  and the single final rounding to fp16 (round to nearest even) is the same in the kernel and
  in torch, so the comparison is exact for any K < 2**22 with entries in [-2, 2]. When
  |result| <= 2048 (guaranteed for K <= 512) no rounding happens at all.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime as _dt
import importlib.metadata
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import time as _time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np  # noqa: F401  (part of the run-side contract; kept importable)
import torch

from tirx_gemm import numerics
from tirx_gemm.gitinfo import git_sha

__all__ = [
    "ARCH_CAPABILITY",
    "DeviceMismatchError",
    "KernelLaunchError",
    "RuntimeLibraryError",
    "BuildMeta",
    "KernelHandle",
    "CompareResult",
    "BenchResult",
    "capability_matches",
    "required_capability_text",
    "check_device",
    "find_runtime_dir",
    "loaded_runtime_dir",
    "load_kernel",
    "validate_inputs",
    "launch",
    "new_seed",
    "make_inputs",
    "poison_",
    "reference",
    "compare",
    "check",
    "n_sets_for_l2",
    "make_bench_sets",
    "bench",
    "bench_interleaved",
    "bench_torch",
    "tflops",
    "git_sha",
    "run_step",
]

# sm_90a kernels use wgmma/setmaxnreg, which exist on compute capability 9.0 only (the "a"
# suffix means arch-specific, not forward compatible). sm_100a (tcgen05, TMEM) needs a 10.x GPU.
# (major, minor); minor None = any minor.
ARCH_CAPABILITY: dict[str, tuple[int, int | None]] = {"sm_90a": (9, 0), "sm_100a": (10, None)}

RUNTIME_DIR_ENV = "TIRX_GEMM_TVM_RUNTIME_DIR"
RUNTIME_LIBS = ("libtvm_runtime.so", "libtvm_runtime_cuda.so")

# compare() defaults; see the module docstring for the reasoning.
from tirx_gemm.numerics import (DEFAULT_ATOL_SCALE, DEFAULT_MAX_REL_ERR,  # noqa: F401
                                DEFAULT_RTOL, INT_HIGH, INT_LOW)

H200_L2_BYTES = 50 * 1024 * 1024  # fallback when torch does not report the L2 size

Log = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


def _quiet(msg: str) -> None:
    pass


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------
class DeviceMismatchError(RuntimeError):
    """No CUDA GPU is visible, or its compute capability does not fit the step's arch."""


class KernelLaunchError(RuntimeError):
    """The kernel launch or its execution failed (surfaced when the host waits for it)."""


class RuntimeLibraryError(RuntimeError):
    """apache-tvm-ffi or TVM's runtime libraries could not be found or loaded."""


# --------------------------------------------------------------------------------------
# build metadata
# --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class BuildMeta:
    """What a kernel was built for. Only step, arch, M, N, K are required."""

    step: str
    arch: str
    M: int
    N: int
    K: int
    tvm_version: str | None = None
    git_sha: str | None = None
    lesson: str | None = None
    lib_path: str | None = None
    kwargs: dict | None = None  # build-time tunables beyond the shape (e.g. pipeline depth)

    @classmethod
    def from_any(cls, meta: Any) -> "BuildMeta":
        """Accept a BuildMeta, a mapping, or any object with the same attribute names."""
        if isinstance(meta, BuildMeta):
            return meta
        fields = [f.name for f in dataclasses.fields(cls)]
        if isinstance(meta, Mapping):
            get = lambda name: meta.get(name)  # noqa: E731
        else:
            get = lambda name: getattr(meta, name, None)  # noqa: E731
        values = {name: get(name) for name in fields}
        missing = [name for name in ("step", "arch", "M", "N", "K") if values[name] is None]
        if missing:
            raise ValueError(f"build metadata lacks {', '.join(missing)}: got {meta!r}")
        for name in ("M", "N", "K"):
            v = values[name]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"build metadata {name}={v!r} must be a positive int")
            values[name] = int(v)
        if values["arch"] not in ARCH_CAPABILITY:
            raise ValueError(
                f"build metadata arch={values['arch']!r} is not one of {sorted(ARCH_CAPABILITY)}"
            )
        if values["kwargs"] is not None:
            values["kwargs"] = dict(values["kwargs"])
        if values["lib_path"] is not None:
            values["lib_path"] = str(values["lib_path"])
        return cls(**values)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.M, self.N, self.K)


# --------------------------------------------------------------------------------------
# device
# --------------------------------------------------------------------------------------
def required_capability_text(arch: str) -> str:
    if arch not in ARCH_CAPABILITY:
        raise ValueError(f"unknown arch {arch!r}: expected one of {sorted(ARCH_CAPABILITY)}")
    major, minor = ARCH_CAPABILITY[arch]
    return f"{major}.{'x' if minor is None else minor}"


def capability_matches(arch: str, capability: tuple[int, int]) -> bool:
    """True when a GPU of compute capability ``capability`` can run code built for ``arch``."""
    if arch not in ARCH_CAPABILITY:
        raise ValueError(f"unknown arch {arch!r}: expected one of {sorted(ARCH_CAPABILITY)}")
    major, minor = ARCH_CAPABILITY[arch]
    return capability[0] == major and (minor is None or capability[1] == minor)


def _cuda_unavailable_reason() -> str:
    built = torch.version.cuda
    if built is None:
        return f"torch {torch.__version__} is a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"torch {torch.__version__} (CUDA {built}) reports torch.cuda.is_available() == "
            f"False (no driver or no device; CUDA_VISIBLE_DEVICES={visible!r})")


def _resolve_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device(device)
    if dev.type != "cuda":
        raise DeviceMismatchError(f"device {dev} is not a CUDA device")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _check_capability(arch: str, device=None) -> torch.device:
    """Cheap part of check_device (no nvidia-smi): raises DeviceMismatchError."""
    need = required_capability_text(arch)
    if not torch.cuda.is_available():
        raise DeviceMismatchError(
            f"no CUDA GPU visible: {_cuda_unavailable_reason()}; "
            f"the step built for {arch} needs a GPU of compute capability {need}"
        )
    dev = _resolve_device(device)
    cap = tuple(torch.cuda.get_device_capability(dev))
    if not capability_matches(arch, cap):
        name = torch.cuda.get_device_name(dev)
        raise DeviceMismatchError(
            f"step built for {arch} needs compute capability {need}; "
            f"this GPU {name} is {cap[0]}.{cap[1]}"
        )
    return dev


def _smi_value(text: str):
    text = text.strip()
    if not text or text.startswith("[") or text.lower() in ("n/a", "not supported"):
        return None
    try:
        return int(float(text))
    except ValueError:
        return text


def parse_smi_line(line: str) -> dict:
    """Parse one line of ``nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,
    driver_version --format=csv,noheader,nounits``."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 4:
        raise ValueError(f"unexpected nvidia-smi line {line!r}")
    sm, mem, max_sm = (_smi_value(p) for p in parts[:3])
    clocks = {"sm_mhz": sm, "mem_mhz": mem, "max_sm_mhz": max_sm}
    if all(v is None for v in clocks.values()):
        clocks = None
    driver = parts[3] if _smi_value(parts[3]) is not None else None
    return {"clocks": clocks, "driver_version": driver}


def _query_nvidia_smi(props, index: int, timeout: float = 5.0) -> dict:
    """Clocks (MHz) and driver version of this GPU from nvidia-smi; Nones if unreadable."""
    empty = {"clocks": None, "driver_version": None}
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        uuid = str(uuid)
        sel = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    elif "CUDA_VISIBLE_DEVICES" not in os.environ:
        sel = str(index)  # torch index == nvidia-smi index only without remapping
    else:
        return empty
    cmd = ["nvidia-smi", f"--id={sel}",
           "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm,driver_version",
           "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return empty
    if out.returncode != 0 or not out.stdout.strip():
        return empty
    try:
        return parse_smi_line(out.stdout.strip().splitlines()[0])
    except ValueError:
        return empty


def check_device(arch: str, device=None, *, query_smi: bool = True) -> dict:
    """Check that the visible GPU can run a step built for ``arch``; describe it.

    Raises DeviceMismatchError when no CUDA GPU is visible or the compute capability does not
    fit (sm_90a: exactly 9.0, sm_100a: 10.x). Returns a dict: name, capability "9.0",
    sm_count, l2_bytes, total_memory_bytes, clocks ({sm_mhz, mem_mhz, max_sm_mhz} or None),
    driver_version (or None), cuda_runtime (torch's CUDA version), index.
    """
    dev = _check_capability(arch, device)
    props = torch.cuda.get_device_properties(dev)
    cap = torch.cuda.get_device_capability(dev)
    info = {
        "name": props.name,
        "capability": f"{cap[0]}.{cap[1]}",
        "sm_count": int(props.multi_processor_count),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "total_memory_bytes": int(props.total_memory),
        "cuda_runtime": torch.version.cuda,
        "index": dev.index,
        "clocks": None,
        "driver_version": None,
    }
    if query_smi:
        info.update(_query_nvidia_smi(props, dev.index))
    return info


# --------------------------------------------------------------------------------------
# loading an exported step library
# --------------------------------------------------------------------------------------
def _has_runtime_libs(d: Path) -> bool:
    return all((d / name).is_file() for name in RUNTIME_LIBS)


def _tvm_package_lib_dir() -> Path | None:
    """site-packages/tvm/lib of an installed apache-tvm wheel, located WITHOUT importing tvm."""
    try:
        spec = importlib.util.find_spec("tvm")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for loc in locations:
        cand = Path(loc) / "lib"
        if cand.is_dir():
            return cand
    return None


def find_runtime_dir(lib_path: str | os.PathLike | None = None) -> Path:
    """Folder holding libtvm_runtime.so and libtvm_runtime_cuda.so.

    Looked up in order: $TIRX_GEMM_TVM_RUNTIME_DIR; a ``runtime/`` folder next to the library
    (a bundle); the installed tvm package's ``lib/`` folder (found without importing tvm).
    Raises RuntimeLibraryError listing every place it looked.
    """
    tried: list[str] = []
    env = os.environ.get(RUNTIME_DIR_ENV)
    if env:
        d = Path(env)
        if _has_runtime_libs(d):
            return d
        # an explicit setting that is wrong is an error, not something to fall past silently
        raise RuntimeLibraryError(
            f"${RUNTIME_DIR_ENV}={env} does not contain {' and '.join(RUNTIME_LIBS)}"
        )
    tried.append(f"${RUNTIME_DIR_ENV} (not set)")
    if lib_path is not None:
        d = Path(lib_path).resolve().parent / "runtime"
        if _has_runtime_libs(d):
            return d
        tried.append(f"{d} (bundle folder next to the library)")
    d = _tvm_package_lib_dir()
    if d is not None and _has_runtime_libs(d):
        return d
    tried.append(f"{d} (installed tvm package)" if d else "installed tvm package (not found)")
    raise RuntimeLibraryError(
        f"cannot find TVM's runtime libraries {', '.join(RUNTIME_LIBS)}; looked in: "
        + "; ".join(tried)
        + f". Set ${RUNTIME_DIR_ENV} to a folder holding them (they ship in the apache-tvm "
        "wheel under tvm/lib/), or put them in a runtime/ folder next to the step library."
    )


# TVM's runtime may be dlopen'ed once per process: a second copy from another folder aborts the
# process (duplicate global function registration; C++ terminate, not catchable). The first
# folder loaded wins for the life of the process.
_RUNTIME_LOADED: dict = {"dir": None, "handles": []}


def loaded_runtime_dir() -> Path | None:
    """The folder TVM's runtime was loaded from by load_kernel in this process, if any."""
    return _RUNTIME_LOADED["dir"]


def _init_cuda_via_torch() -> None:
    if not torch.cuda.is_available():
        raise DeviceMismatchError(
            f"no CUDA GPU visible: {_cuda_unavailable_reason()}; loading a CUDA step library "
            "needs one"
        )
    torch.cuda.init()
    torch.cuda.current_device()  # forces the primary context into existence


def load_kernel(lib_path: str | os.PathLike):
    """Load an exported step library and return its ``main`` function, f(A, B, D).

    Works on a host with only apache-tvm-ffi and TVM's two runtime libraries (no compiler):
    ``import tvm_ffi``; dlopen libtvm_runtime.so and libtvm_runtime_cuda.so with RTLD_GLOBAL
    (see :func:`find_runtime_dir`); ``tvm_ffi.load_module(lib_path)["main"]``. When tvm is
    already imported in this process, ``tvm.runtime.load_module`` is used instead. CUDA is
    initialised through torch first. Call the result with torch CUDA tensors (DLPack).

    The runtime libraries are loaded once per process (from the folder found by the first
    call); later calls reuse them, since a second copy would abort the process. For the same
    reason, do not ``import tvm`` in a process after this path has loaded the runtime.
    """
    path = Path(lib_path)
    if not path.is_file():
        raise FileNotFoundError(f"step library {path} does not exist")
    _init_cuda_via_torch()
    tvm = sys.modules.get("tvm")
    if tvm is not None and hasattr(tvm, "runtime"):
        mod = tvm.runtime.load_module(str(path))
        return mod["main"]
    try:
        import tvm_ffi  # noqa: PLC0415  (lazy: only needed to load a library)
    except ImportError as e:
        raise RuntimeLibraryError(
            f"loading {path} needs the apache-tvm-ffi package (import tvm_ffi failed: {e}); "
            "install the apache-tvm-ffi wheel matching this Python"
        ) from e
    if _RUNTIME_LOADED["dir"] is None:
        rt_dir = find_runtime_dir(path)
        handles = []
        for name in RUNTIME_LIBS:
            try:
                handles.append(ctypes.CDLL(str(rt_dir / name), mode=ctypes.RTLD_GLOBAL))
            except OSError as e:
                raise RuntimeLibraryError(f"cannot load {rt_dir / name}: {e}") from e
        _RUNTIME_LOADED.update(dir=rt_dir, handles=handles)
    try:
        mod = tvm_ffi.load_module(str(path))
    except Exception as e:  # tvm_ffi raises its own error types
        raise RuntimeLibraryError(f"tvm_ffi.load_module({str(path)!r}) failed: {e}") from e
    try:
        return mod["main"]
    except Exception as e:
        raise RuntimeLibraryError(f"{path} has no function 'main': {e}") from e


# --------------------------------------------------------------------------------------
# input validation and launch
# --------------------------------------------------------------------------------------
def validate_inputs(A, B, D, M: int, N: int, K: int, *, require_cuda: bool = True) -> None:
    """Refuse bad operands before any launch: the kernel would read or write out of bounds.

    Checks in this order, each with its own message: torch.Tensor (TypeError); on CUDA
    (ValueError; skipped with ``require_cuda=False``, which lets the remaining checks be
    exercised on CPU); dtype float16 (TypeError); 2-D, shapes (M,K), (N,K), (M,N), contiguous,
    16-byte aligned (ValueError); all on the same device (ValueError).
    """
    ops = (("A", A, (M, K)), ("B", B, (N, K)), ("D", D, (M, N)))
    for name, t, _ in ops:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if require_cuda:
        for name, t, _ in ops:
            if t.device.type != "cuda":
                raise ValueError(f"{name} is on {t.device}, must be a CUDA tensor")
    for name, t, _ in ops:
        if t.dtype != torch.float16:
            raise TypeError(f"{name} has dtype {t.dtype}, must be torch.float16")
    for name, t, shape in ops:
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got {t.dim()}-D with shape {tuple(t.shape)}")
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}, expected {shape} for M,N,K={M},{N},{K} "
                "(D = A @ B.T with A MxK, B NxK, D MxN)"
            )
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous (strides {t.stride()}); pass "
                             f"{name}.contiguous()")
        if t.data_ptr() % 16 != 0:
            raise ValueError(f"{name} data pointer is not 16-byte aligned (TMA and vector "
                             "copies need it)")
    devices = {str(t.device) for _, t, _ in ops}
    if len(devices) != 1:
        raise ValueError(f"A, B, D must be on one device, got {', '.join(sorted(devices))}")


# Host-side hang guard. A kernel whose barrier wait never completes (a learner's wrong phase)
# would freeze torch.cuda.synchronize() forever; every wait of this module instead polls a
# CUDA event against a deadline. After a hang the CUDA context cannot be used or torn down
# cleanly (the kernel still occupies the GPU), so the process reports it in one line and
# leaves with os._exit, skipping interpreter cleanup that would block on the GPU.
KERNEL_TIMEOUT_ENV = "TIRX_GEMM_KERNEL_TIMEOUT"
KERNEL_TIMEOUT_S = 60.0  # the slowest wait here (warm-up at 8192^3) takes well under 1 s
HANG_EXIT_CODE = 3
_POLL_MAX_S = 0.01  # the poll interval grows to this: fast for short waits, cheap for long

_launch_label: str | None = None  # "v4@sm_90a 4096x4096x4096" while run_step runs a step


def kernel_timeout() -> float:
    """Seconds the host waits for the GPU: ``TIRX_GEMM_KERNEL_TIMEOUT`` if set, else 60."""
    text = os.environ.get(KERNEL_TIMEOUT_ENV)
    if not text:
        return KERNEL_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{KERNEL_TIMEOUT_ENV}={text!r} must be a positive number of seconds")
    return value


def _label(meta) -> str:
    return f"{meta.step}@{meta.arch} {meta.M}x{meta.N}x{meta.K}"


def _hang(what: str, limit: float) -> None:
    sys.stdout.flush()
    print(f"{_launch_label or what}: no completion within {limit:g} s (kernel hang); "
          f"exiting, the GPU context is unusable ({KERNEL_TIMEOUT_ENV} sets the limit, "
          "--watchdog-ms builds name the stalled barrier)", file=sys.stderr, flush=True)
    os._exit(HANG_EXIT_CODE)


def _synchronize(what: str, device=None) -> None:
    """Wait for the work queued so far, at most kernel_timeout() seconds (then _hang)."""
    if device is not None and torch.device(device).type != "cuda":
        return  # CPU stand-ins (tests) have nothing to wait for
    limit = kernel_timeout()
    try:
        done = torch.cuda.Event()
        done.record()
        deadline = _time.monotonic() + limit
        pause = 1e-4
        while not done.query():
            if _time.monotonic() >= deadline:
                _hang(what, limit)
            _time.sleep(pause)
            pause = min(2 * pause, _POLL_MAX_S)
        torch.cuda.synchronize()  # returns at once now; raises a pending asynchronous error
    except Exception as e:  # torch raises RuntimeError / torch.AcceleratorError
        raise KernelLaunchError(f"{what} failed on the GPU: {e}") from e


def launch(kernel, meta, A, B, D, *, sync: bool = True) -> None:
    """Validate and launch ``kernel(A, B, D)`` built with ``meta`` (step, arch, M, N, K).

    Refuses, before launching, inputs whose shapes differ from the built shape, bad operands
    (see validate_inputs) and a GPU that does not fit the build's arch. With ``sync`` it waits
    for the kernel and turns an asynchronous failure into KernelLaunchError.
    """
    m = BuildMeta.from_any(meta)
    shapes = [tuple(getattr(t, "shape", ())) for t in (A, B, D)]
    if shapes != [(m.M, m.K), (m.N, m.K), (m.M, m.N)]:
        raise ValueError(
            f"kernel {m.step}/{m.arch} built for M,N,K={m.M},{m.N},{m.K} but inputs are "
            f"A {shapes[0]}, B {shapes[1]}, D {shapes[2]} (expected A {(m.M, m.K)}, "
            f"B {(m.N, m.K)}, D {(m.M, m.N)})"
        )
    validate_inputs(A, B, D, m.M, m.N, m.K)
    _check_capability(m.arch, A.device)
    try:
        kernel(A, B, D)
    except Exception as e:
        raise KernelLaunchError(f"launching {m.step}/{m.arch} failed: {e}") from e
    if sync:
        _synchronize(_label(m))


class KernelHandle:
    """A loaded kernel with its build metadata; calling it validates, launches and syncs."""

    def __init__(self, kernel, meta):
        self.kernel = kernel
        self.meta = BuildMeta.from_any(meta)

    @classmethod
    def load(cls, lib_path, meta) -> "KernelHandle":
        return cls(load_kernel(lib_path), meta)

    def __call__(self, A, B, D, *, sync: bool = True) -> None:
        launch(self.kernel, self.meta, A, B, D, sync=sync)

    def __repr__(self) -> str:
        m = self.meta
        return f"KernelHandle({m.step}/{m.arch}, M,N,K={m.M},{m.N},{m.K})"


# --------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------
def new_seed() -> int:
    """A fresh 31-bit seed from os.urandom and the clock: every run sees new inputs."""
    return (int.from_bytes(os.urandom(4), "little") ^ _time.time_ns()) & 0x7FFF_FFFF


@dataclasses.dataclass
class Inputs:
    A: torch.Tensor
    B: torch.Tensor
    D: torch.Tensor
    kind: str
    seed: int

    def __iter__(self):  # allows ``A, B, D = make_inputs(...)``
        return iter((self.A, self.B, self.D))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.A, self.B, self.D))


def make_inputs(M: int, N: int, K: int, kind: str = "random", seed: int | None = None,
                device="cuda") -> Inputs:
    """Fresh operands A (MxK), B (NxK) and an output D (MxN, poisoned with NaN), all fp16.

    kind "random": randn * K**-0.25 rounded to fp16, so each D element has rms ~1 whatever K.
    kind "int": integers uniform in [-2, 2]; the fp32-accumulated result is an integer that
    compare(exact=True) checks exactly (see the module docstring: exact for K < 2**22; no
    fp16 rounding at all when |result| <= 2048, guaranteed for K <= 512).
    ``seed`` None draws a fresh one; it is returned in ``.seed`` so the run can be recorded
    and reproduced.
    """
    if seed is None:
        seed = new_seed()
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(int(seed))
    if kind == "random":
        scale = numerics.random_scale(K)
        A = (torch.randn(M, K, generator=gen, device=dev) * scale).half()
        B = (torch.randn(N, K, generator=gen, device=dev) * scale).half()
    elif kind == "int":
        numerics.check_int_k(K)
        A = torch.randint(INT_LOW, INT_HIGH + 1, (M, K), generator=gen, device=dev).half()
        B = torch.randint(INT_LOW, INT_HIGH + 1, (N, K), generator=gen, device=dev).half()
    else:
        raise ValueError(f"kind={kind!r} must be 'random' or 'int'")
    D = torch.empty(M, N, dtype=torch.float16, device=dev)
    poison_(D)
    return Inputs(A, B, D, kind, int(seed))


def poison_(D: torch.Tensor) -> torch.Tensor:
    """Fill D with NaN in place so any element the kernel does not write fails the check."""
    D.fill_(float("nan"))
    return D


def reference(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """fp32 reference A.float() @ B.float().T, with TF32 forced off for the duration."""
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    prev_prec = torch.get_float32_matmul_precision()
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        return A.float() @ B.float().T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
        torch.set_float32_matmul_precision(prev_prec)


# --------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------
CompareResult = numerics.CompareResult


def compare(out: torch.Tensor, ref: torch.Tensor, *, exact: bool = False,
            rtol: float = DEFAULT_RTOL, atol: float | None = None,
            max_rel_err: float | None = DEFAULT_MAX_REL_ERR, n_show: int = 5) -> CompareResult:
    """Compare a kernel output with the fp32 reference: the rules of ``numerics.compare_np``
    (one definition for the GPU checks and the CPU simulation), applied on the host."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"out has shape {tuple(out.shape)} but ref has {tuple(ref.shape)}")
    return numerics.compare_np(out.detach().float().cpu().numpy(),
                               ref.detach().float().cpu().numpy(), exact=exact, rtol=rtol,
                               atol=atol, max_rel_err=max_rel_err, n_show=n_show)


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------
def check(kernel, M: int, N: int, K: int, *, launch: Callable | None = None,
          kinds: Sequence[str] = ("random", "int"), seed: int | None = None, device="cuda",
          log: Log | None = _print, **compare_kw) -> dict:
    """Check a kernel against the fp32 torch reference on fresh inputs.

    For each kind ("random": tolerance check, "int": exact check) it makes fresh inputs
    (new seed each call unless ``seed`` is given), poisons D with NaN, launches through
    ``launch(A, B, D)`` (default: validate_inputs then ``kernel(A, B, D)``), synchronizes
    (a launch failure raises KernelLaunchError) and compares.

    Returns {"ok": bool, "rel_err": rel. Frobenius error of the random check (or None),
    "results": [{"kind", "seed", **CompareResult.to_dict()}, ...]}.
    """
    log = log or _quiet
    if launch is None:
        def launch(A, B, D):  # noqa: F811
            validate_inputs(A, B, D, M, N, K)
            kernel(A, B, D)
    results = []
    for kind in kinds:
        inp = make_inputs(M, N, K, kind=kind, seed=seed, device=device)
        log(f"  check {kind:6s} M,N,K={M},{N},{K} seed={inp.seed} ...")
        poison_(inp.D)
        _synchronize("preparing inputs", device)
        try:
            launch(inp.A, inp.B, inp.D)
        except (KernelLaunchError, TypeError, ValueError, DeviceMismatchError):
            raise  # refused before launching, or already explained
        except Exception as e:
            raise KernelLaunchError(f"launch at M,N,K={M},{N},{K} failed: {e}") from e
        _synchronize(f"kernel at M,N,K={M},{N},{K}", device)
        ref = reference(inp.A, inp.B)
        res = compare(inp.D, ref, exact=(kind == "int"), **compare_kw)
        log(f"    {res.summary()}")
        results.append({"kind": kind, "seed": inp.seed, **res.to_dict()})
        del inp, ref
    rel = next((r["rel_frobenius_error"] for r in results if r["kind"] == "random"), None)
    return {"ok": all(r["ok"] for r in results), "rel_err": rel, "results": results}


_run_check = check  # run_step's keyword ``check`` shadows the function


# --------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------
@dataclasses.dataclass
class BenchResult:
    median_ms: float
    best_ms: float
    mean_ms: float
    iters: int
    warmup: int  # warm-up launches actually run (at least the requested count)
    n_sets: int
    rounds: int = 1
    queue_ahead: bool = False
    times_ms: list = dataclasses.field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("times_ms")
        return d

    @classmethod
    def from_times(cls, times: list, **kw) -> "BenchResult":
        return cls(median_ms=statistics.median(times), best_ms=min(times),
                   mean_ms=statistics.fmean(times), iters=len(times), times_ms=list(times), **kw)


def _l2_bytes(device=None) -> int:
    try:
        props = torch.cuda.get_device_properties(_resolve_device(device))
        l2 = int(getattr(props, "L2_cache_size", 0))
        if l2 > 0:
            return l2
    except Exception:
        pass
    return H200_L2_BYTES


def n_sets_for_l2(set_bytes: int, l2_bytes: int, max_sets: int = 1024) -> int:
    """How many input sets to rotate among so no launch finds its operands in L2.

    One set when a set (A+B+D bytes) is at least twice L2 (little of it can survive in L2
    until its next use); otherwise enough sets that the ones touched since a set's last use
    total at least 2x L2 (capped at ``max_sets``).
    """
    if set_bytes <= 0:
        raise ValueError("set_bytes must be positive")
    if set_bytes >= 2 * l2_bytes:
        return 1
    return max(2, min(max_sets, math.ceil(2 * l2_bytes / set_bytes) + 1))


def make_bench_sets(M: int, N: int, K: int, *, device="cuda", n_sets: int | None = None,
                    seed: int | None = None) -> list[tuple]:
    """Input sets (A, B, D) for timing; as many as n_sets_for_l2 asks for unless given."""
    set_bytes = 2 * (M * K + N * K + M * N)
    if n_sets is None:
        n_sets = n_sets_for_l2(set_bytes, _l2_bytes(device))
    base = new_seed() if seed is None else int(seed)
    sets = []
    for i in range(n_sets):
        inp = make_inputs(M, N, K, kind="random", seed=(base + i) & 0x7FFF_FFFF, device=device)
        sets.append((inp.A, inp.B, inp.D))
    return sets


# A GPU boosts for the first tens of ms of load and then settles at its power-limited clock
# (H200, cuBLAS 8192^3: 759 TFLOP/s for ~50 ms, then ~658). Warm-up therefore runs until at
# least DEFAULT_MIN_WARMUP_MS of GPU time has passed, and run_step interleaves the kernel and
# torch launch by launch in alternation so both are measured in the same clock state.
DEFAULT_MIN_WARMUP_MS = 200.0
# Queue-ahead: a torch.cuda._sleep kernel holds the stream while the host enqueues the timed
# launches, so the events measure GPU time, not Python/launch overhead (H200, 256x256x128
# cuBLAS: 26-40 us per launch without, 5.3 us with).
SLEEP_CYCLES_PER_MS = 2.0e6  # ~2 GHz; a lower clock only lengthens the sleep
MAX_QUEUE_AHEAD_MS = 100.0
EVENT_HOST_MS = 0.02  # host cost of the two event records around a launch


def _warm_up(fn: Callable, sets: Sequence[tuple], warmup: int, min_warmup_ms: float,
             start: int = 0) -> tuple[int, float]:
    """Run >= ``warmup`` launches and >= ``min_warmup_ms`` of GPU time.

    Returns (launches run, host milliseconds per launch).
    """
    n = len(sets)
    done = 0
    host_ms = 0.05
    if warmup > 0:
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
        t0 = _time.perf_counter()
        for i in range(warmup):
            fn(*sets[(start + i) % n])
        host_ms = (_time.perf_counter() - t0) * 1e3 / warmup
        ev1.record()
        _synchronize("warm-up launches")
        gpu_ms = ev0.elapsed_time(ev1)
        done = warmup
        if gpu_ms < min_warmup_ms:
            per = max(gpu_ms / warmup, 1e-3)
            extra = min(math.ceil((min_warmup_ms - gpu_ms) / per), 20000)
            for i in range(extra):
                fn(*sets[(start + done + i) % n])
            done += extra
            _synchronize("warm-up launches")
    return done, host_ms


def _timed_launches(fns: Sequence[Callable], sets: Sequence[tuple], count: int, start: int,
                    host_ms: float, queue_ahead: bool) -> tuple[list[list[float]], int]:
    """CUDA events around each of ``count`` launches of every function in ``fns``.

    With several functions the launches alternate A B, B A, A B, ... so that each sees the same
    clock state. Launch j (over all functions) uses ``sets[(start + j) % len(sets)]``, so no
    launch reuses the operands another launch has just pulled into L2. Returns (times in ms
    per function, next set index).
    """
    n, k = len(sets), len(fns)
    starts = [[torch.cuda.Event(enable_timing=True) for _ in range(count)] for _ in range(k)]
    ends = [[torch.cuda.Event(enable_timing=True) for _ in range(count)] for _ in range(k)]
    if queue_ahead:
        sleep_ms = min(MAX_QUEUE_AHEAD_MS, count * (host_ms + k * EVENT_HOST_MS) * 1.5 + 0.5)
        torch.cuda._sleep(int(sleep_ms * SLEEP_CYCLES_PER_MS))
    pos = start
    for i in range(count):
        for j in (range(k) if i % 2 == 0 else range(k - 1, -1, -1)):
            args = sets[pos % n]
            starts[j][i].record()
            fns[j](*args)
            ends[j][i].record()
            pos += 1
    _synchronize("timed launches")
    times = [[a.elapsed_time(b) for a, b in zip(starts[j], ends[j])] for j in range(k)]
    return times, pos


def _check_bench_args(input_sets, iters):
    if not input_sets:
        raise ValueError("bench needs at least one input set")
    if iters < 1:
        raise ValueError("iters must be >= 1")


def bench(fn: Callable, input_sets: Sequence[tuple], *, warmup: int = 10, iters: int = 100,
          min_warmup_ms: float = DEFAULT_MIN_WARMUP_MS, queue_ahead: bool = True,
          log: Log | None = None) -> BenchResult:
    """Time ``fn(A, B, D)`` with CUDA events around each launch, after warm-up.

    Warm-up: at least ``warmup`` launches and ``min_warmup_ms`` of GPU time (clocks settle).
    Launch i uses ``input_sets[i % len(input_sets)]`` (make_bench_sets sizes the list so the
    operands are not L2-resident). With ``queue_ahead`` the timed launches are queued behind a
    GPU sleep so host overhead is not timed. Returns median and best of ``iters`` launches (ms).
    """
    _check_bench_args(input_sets, iters)
    log = log or _quiet
    qa = queue_ahead and hasattr(torch.cuda, "_sleep")
    done, host_ms = _warm_up(fn, input_sets, warmup, min_warmup_ms)
    (times,), _ = _timed_launches([fn], input_sets, iters, done, host_ms, qa)
    res = BenchResult.from_times(times, warmup=done, n_sets=len(input_sets), queue_ahead=qa)
    log(f"    median {res.median_ms:.4f} ms, best {res.best_ms:.4f} ms ({iters} launches over "
        f"{res.n_sets} input set{'s' if res.n_sets > 1 else ''}, {done} warm-up)")
    return res


def bench_interleaved(fns: Mapping[str, Callable], input_sets: Sequence[tuple], *,
                      warmup: int = 10, iters: int = 100, rounds: int = 4,
                      min_warmup_ms: float = DEFAULT_MIN_WARMUP_MS, queue_ahead: bool = True,
                      log: Log | None = None) -> dict[str, BenchResult]:
    """Time several functions of (A, B, D) launch by launch in alternation (A B B A A B ...).

    Each gets its warm-up; then ``iters`` timed launches of each, alternating, so a clock or
    power change during the run affects all of them alike (a fair ratio). ``rounds`` splits the
    launches into that many queue-ahead batches (each batch queued behind one GPU sleep).
    """
    _check_bench_args(input_sets, iters)
    log = log or _quiet
    qa = queue_ahead and hasattr(torch.cuda, "_sleep")
    names = list(fns)
    rounds = max(1, min(rounds, iters))
    sizes = [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]
    warmed, host_ms, pos = {}, 0.0, 0
    for name in names:
        warmed[name], h = _warm_up(fns[name], input_sets, warmup, min_warmup_ms, start=pos)
        host_ms += h
        pos += warmed[name]
    times: dict[str, list] = {name: [] for name in names}
    for count in sizes:
        chunk, pos = _timed_launches([fns[nm] for nm in names], input_sets, count, pos,
                                     host_ms, qa)
        for name, t in zip(names, chunk):
            times[name] += t
    out = {}
    for name in names:
        res = BenchResult.from_times(times[name], warmup=warmed[name], n_sets=len(input_sets),
                                     rounds=rounds, queue_ahead=qa)
        out[name] = res
        log(f"    {name}: median {res.median_ms:.4f} ms, best {res.best_ms:.4f} ms")
    log(f"    ({iters} launches each, alternating, in {rounds} batches over "
        f"{len(input_sets)} input set{'s' if len(input_sets) > 1 else ''})")
    return out


def _torch_matmul(A, B, D):
    torch.matmul(A, B.T, out=D)


def bench_torch(M: int, N: int, K: int, *, input_sets: Sequence[tuple] | None = None,
                device="cuda", **bench_kw) -> BenchResult:
    """Time torch.matmul(A, B.T, out=D) (cuBLAS) exactly as :func:`bench` times a kernel."""
    if input_sets is None:
        input_sets = make_bench_sets(M, N, K, device=device)
    return bench(_torch_matmul, input_sets, **bench_kw)


def tflops(M: int, N: int, K: int, ms: float | None) -> float | None:
    """2*M*N*K / seconds / 1e12."""
    if ms is None or not ms > 0:
        return None
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


# --------------------------------------------------------------------------------------
# provenance
# --------------------------------------------------------------------------------------
_read_git_sha = git_sha  # run_step's keyword ``git_sha`` shadows the function


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tvm_version(meta: BuildMeta) -> str | None:
    if meta.tvm_version:
        return meta.tvm_version
    tvm = sys.modules.get("tvm")
    if tvm is not None and getattr(tvm, "__version__", None):
        return str(tvm.__version__)
    return _dist_version("apache-tvm")


def _finite_or_none(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


# --------------------------------------------------------------------------------------
# one step, end to end
# --------------------------------------------------------------------------------------
def run_step(kernel, meta, *, check: bool = True, time: bool = True, warmup: int = 10,
             iters: int = 100, rounds: int = 4, min_warmup_ms: float = DEFAULT_MIN_WARMUP_MS,
             torch_baseline: bool = True, time_unverified: bool = False, device=None,
             git_sha: str | None = None, seed: int | None = None,
             log: Log | None = _print) -> dict:
    """Check and time one built step on this GPU; return a record (a dict, see records.py).

    ``kernel`` is the loaded function f(A, B, D) (load_kernel); ``meta`` has step, arch, M, N,
    K (and optionally tvm_version, git_sha, lesson, lib_path). The GPU must fit the arch
    (DeviceMismatchError otherwise). The check runs first; a kernel that fails it is not timed
    unless ``time_unverified`` (and its record then says verified=false). With ``check=False``
    the record also says verified=false. Timing: warm-up (>= ``warmup`` launches and
    ``min_warmup_ms`` of GPU time), then ``iters`` launches of the kernel and of torch.matmul,
    alternating launch by launch on the same input sets (``rounds`` queue-ahead batches).
    """
    global _launch_label
    log = log or _quiet
    m = BuildMeta.from_any(meta)
    _launch_label = _label(m)  # what a hang report names, for every wait below
    try:
        return _run_step(kernel, m, log=log, check=check, time=time, warmup=warmup,
                         iters=iters, rounds=rounds, min_warmup_ms=min_warmup_ms,
                         torch_baseline=torch_baseline, time_unverified=time_unverified,
                         device=device, git_sha=git_sha, seed=seed)
    finally:
        _launch_label = None


def _run_step(kernel, m, *, log, check, time, warmup, iters, rounds, min_warmup_ms,
              torch_baseline, time_unverified, device, git_sha, seed) -> dict:
    M, N, K = m.shape
    dev_info = check_device(m.arch, device)
    dev = torch.device("cuda", dev_info["index"])
    clocks = dev_info["clocks"]
    log(f"{m.step}/{m.arch} M,N,K={M},{N},{K} on {dev_info['name']} "
        f"(cc {dev_info['capability']}, {dev_info['sm_count']} SMs"
        + (f", SM clock {clocks['sm_mhz']} MHz" if clocks and clocks.get("sm_mhz") else "")
        + ")")

    def launch_checked(A, B, D):
        launch(kernel, m, A, B, D, sync=True)

    verified = False
    rel_err = None
    check_results = None
    if check:
        log("checking against the fp32 torch reference (fresh inputs, D poisoned with NaN)")
        rep = _run_check(kernel, M, N, K, launch=launch_checked, seed=seed,
                        device=dev, log=log)
        verified = rep["ok"]
        rel_err = rep["rel_err"]
        check_results = [
            {k: r[k] for k in ("kind", "seed", "ok", "exact", "rel_frobenius_error",
                               "max_abs_error", "n_nan", "n_inf", "n_mismatch", "n_total",
                               "first_mismatches", "reason")}
            for r in rep["results"]
        ]
        log("check: " + ("passed" if verified else "FAILED"))
    else:
        log("check skipped: the record will say verified=false")

    timing = None
    torch_timing = None
    clocks_after = None
    timed = time and (verified or time_unverified)
    if time and not timed:
        log("timing skipped: the kernel failed its check (time_unverified=True to time anyway)")
    if timed:
        sets = make_bench_sets(M, N, K, device=dev)
        for A, B, D in sets[:1]:
            validate_inputs(A, B, D, M, N, K)  # the timed loop calls the kernel raw
        _check_capability(m.arch, dev)
        if torch_baseline:
            log(f"timing {m.step} and torch.matmul(A, B.T) (cuBLAS): warm-up, then {iters} "
                f"launches each, alternating, CUDA events, {len(sets)} input set(s)")
            res = bench_interleaved({"kernel": kernel, "torch": _torch_matmul}, sets,
                                    warmup=warmup, iters=iters, rounds=rounds,
                                    min_warmup_ms=min_warmup_ms, log=log)
            timing, torch_timing = res["kernel"], res["torch"]
        else:
            log(f"timing {m.step}: warm-up, then {iters} launches, CUDA events, {len(sets)} "
                "input set(s)")
            timing = bench(kernel, sets, warmup=warmup, iters=iters,
                           min_warmup_ms=min_warmup_ms, log=log)
        clocks_after = _query_nvidia_smi(torch.cuda.get_device_properties(dev),
                                         dev.index)["clocks"]
        del sets

    k_tflops = tflops(M, N, K, timing.median_ms) if timing else None
    t_tflops = tflops(M, N, K, torch_timing.median_ms) if torch_timing else None
    ratio = (k_tflops / t_tflops) if (k_tflops and t_tflops) else None
    if timing:
        log(f"{m.step}/{m.arch}: {k_tflops:.1f} TFLOP/s"
            + (f", torch {t_tflops:.1f} TFLOP/s, ratio {ratio:.3f}" if ratio else "")
            + ("" if verified else "  [UNVERIFIED]"))

    sha = git_sha or m.git_sha or _read_git_sha()
    return {
        "record_version": 1,
        "step": m.step,
        "arch": m.arch,
        "lesson": m.lesson,
        "M": M,
        "N": N,
        "K": K,
        "build_kwargs": m.kwargs or {},
        "device": dev_info["name"],
        "capability": dev_info["capability"],
        "sm_count": dev_info["sm_count"],
        "l2_bytes": dev_info["l2_bytes"],
        "clocks": clocks,
        "driver_version": dev_info["driver_version"],
        "cuda_runtime": dev_info["cuda_runtime"],
        "torch_version": torch.__version__,
        "tvm_version": _tvm_version(m),
        "tvm_ffi_version": _dist_version("apache-tvm-ffi"),
        "python_version": sys.version.split()[0],
        "git_sha": sha,
        "checked": bool(check),
        "verified": bool(verified),
        "rel_err": _finite_or_none(rel_err),
        "check": check_results,
        "median_ms": timing.median_ms if timing else None,
        "best_ms": timing.best_ms if timing else None,
        "tflops": k_tflops,
        "torch_median_ms": torch_timing.median_ms if torch_timing else None,
        "torch_best_ms": torch_timing.best_ms if torch_timing else None,
        "torch_tflops": t_tflops,
        "ratio_to_torch": ratio,
        "clocks_after_timing": clocks_after,
        "timing": None if timing is None else {
            "method": ("CUDA events around each launch"
                       + ("; kernel and torch launches alternate" if torch_timing else "")
                       + ("; launches queued behind a GPU sleep" if timing.queue_ahead else "")),
            "warmup_launches": timing.warmup,
            "min_warmup_ms": min_warmup_ms,
            "iters": timing.iters,
            "rounds": timing.rounds,
            "n_input_sets": timing.n_sets,
            "mean_ms": timing.mean_ms,
            "torch_mean_ms": torch_timing.mean_ms if torch_timing else None,
        },
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
