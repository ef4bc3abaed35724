"""Launching a loaded kernel: build metadata, operand validation, and the host hang guard.

:func:`launch` refuses operands that do not fit the build (shape, dtype, layout, device,
compute capability) before the kernel runs, and passes a step's workspace operands
(``registry.Step.workspace_specs``: zero-filled buffers after D, allocated once per loaded
kernel by :class:`KernelHandle` and ``runner.run_step``); every wait for the GPU goes through
:func:`synchronize`, which polls against a deadline (``TIRX_GEMM_KERNEL_TIMEOUT``) instead of
blocking forever on a hung kernel. Imports torch, numpy and the standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time as _time
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from tirx_gemm import numerics, registry
from tirx_gemm.run.device import ARCH_CAPABILITY, check_capability
from tirx_gemm.run.errors import KernelLaunchError
from tirx_gemm.run.loader import load_kernel
from tirx_gemm.settings import env_seconds
from tirx_gemm.stepshape import StepShape

__all__ = [
    "BuildMeta",
    "KernelLaunchError",
    "KERNEL_TIMEOUT_ENV",
    "HANG_EXIT_CODE",
    "kernel_timeout",
    "KERNEL_TIMEOUT_MAX_S",
    "label",
    "hang_label",
    "synchronize",
    "validate_inputs",
    "workspace_specs",
    "make_workspace",
    "check_workspace",
    "launch",
    "KernelHandle",
]



@dataclasses.dataclass(eq=False)
class BuildMeta(StepShape):
    """What a kernel was built for. Only step, arch, M, N, K (stepshape.StepShape) are
    required. Read-only once made (as a frozen dataclass; StepShape is not frozen, since
    the build and simulation records extend it and are filled in as they go)."""

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
            numerics.check_dtype(values["kwargs"].get("dtype", "float16"))
        if values["lib_path"] is not None:
            values["lib_path"] = str(values["lib_path"])
        return cls(**values)

    def __post_init__(self):
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name, value):
        if getattr(self, "_sealed", False):
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")



_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def validate_inputs(A, B, D, M: int, N: int, K: int, *, dtype: str = "float16",
                    require_cuda: bool = True) -> None:
    """Refuse bad operands before any launch: the kernel would read or write out of bounds.

    Checks in this order, each with its own message: torch.Tensor (TypeError); on CUDA
    (ValueError; skipped with ``require_cuda=False``, which lets the remaining checks be
    exercised on CPU); the build's ``dtype``, float16 or bfloat16 (TypeError); 2-D, shapes
    (M,K), (N,K), (M,N), contiguous, 16-byte aligned (ValueError); all on the same device
    (ValueError). Any M, N, K: the tile grid is the kernel's business, not the caller's.
    """
    want = _TORCH_DTYPES[numerics.check_dtype(dtype)]
    ops = (("A", A, (M, K)), ("B", B, (N, K)), ("D", D, (M, N)))
    for name, t, _ in ops:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if require_cuda:
        for name, t, _ in ops:
            if t.device.type != "cuda":
                raise ValueError(f"{name} is on {t.device}, must be a CUDA tensor")
    for name, t, _ in ops:
        if t.dtype != want:
            raise TypeError(f"{name} has dtype {t.dtype}, but the kernel was built for "
                            f"{dtype} ({want})")
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


KERNEL_TIMEOUT_MAX_S = 3600.0  # the widest hang guard: one hour per wait


def kernel_timeout() -> float:
    """Seconds the host waits for the GPU: ``TIRX_GEMM_KERNEL_TIMEOUT`` if set, else 60.

    That variable is the way to widen the hang guard (a slow debugging build, a GPU shared
    with other work), up to KERNEL_TIMEOUT_MAX_S (3600 s); it cannot switch the guard off:
    0, a negative number, inf, nan, text or more than 3600 is a one-line ValueError."""
    return env_seconds(KERNEL_TIMEOUT_ENV, KERNEL_TIMEOUT_S, maximum=KERNEL_TIMEOUT_MAX_S)


def label(meta) -> str:
    """What a hang report names: "v4@sm_90a 4096x4096x4096"."""
    return f"{meta.step}@{meta.arch} {meta.M}x{meta.N}x{meta.K}"


@contextlib.contextmanager
def hang_label(text: str) -> Iterator[None]:
    """Name ``text`` (label(meta)) in the hang report of every wait inside the block."""
    global _launch_label
    _launch_label = text
    try:
        yield
    finally:
        _launch_label = None


def _hang(what: str, limit: float) -> None:
    sys.stdout.flush()
    print(f"{_launch_label or what}: no completion within {limit:g} s (kernel hang); "
          f"exiting, the GPU context is unusable ({KERNEL_TIMEOUT_ENV} sets the limit, "
          "--watchdog-ms builds name the stalled barrier)", file=sys.stderr, flush=True)
    os._exit(HANG_EXIT_CODE)


def synchronize(what: str, device=None) -> None:
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


# --------------------------------------------------------------------------------------
# workspace operands (split-K partial sums, tile counters): extra arguments after D
# --------------------------------------------------------------------------------------
def workspace_specs(meta, step: "registry.Step | None" = None) -> tuple:
    """((name, shape, dtype), ...) of the build's workspace operands: ``step`` (default:
    the registry's row of meta's step and arch) at meta's shape and kwargs; () for a step
    without any."""
    m = BuildMeta.from_any(meta)
    step = step if step is not None else registry.get(m.step, m.arch)
    return tuple((str(name), tuple(int(x) for x in shape), str(dt))
                 for name, shape, dt in step.workspace_specs(m.M, m.N, m.K, m.kwargs or {}))


def _workspace_dtype(name: str, dt: str) -> torch.dtype:
    t = getattr(torch, dt, None)
    if not isinstance(t, torch.dtype):
        raise ValueError(f"workspace {name!r} has dtype {dt!r}, which is not a torch dtype")
    return t


def make_workspace(specs, device) -> tuple:
    """((name, zero-filled tensor), ...) for ``specs``, on ``device``."""
    return tuple((name, torch.zeros(shape, dtype=_workspace_dtype(name, dt), device=device))
                 for name, shape, dt in specs)


def check_workspace(specs, workspace, device) -> None:
    """Refuse a workspace that does not fit ``specs`` (names, order, shapes, dtypes), or lies
    on another device than the operands, or is not contiguous: the kernel would run wild."""
    names = [name for name, _ in workspace]
    want = [name for name, _, _ in specs]
    if names != want:
        raise ValueError(f"workspace operands {names} do not match the build's {want}")
    for (name, t), (_, shape, dt) in zip(workspace, specs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"workspace {name!r} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape or t.dtype != _workspace_dtype(name, dt):
            raise ValueError(f"workspace {name!r} is {t.dtype} {tuple(t.shape)}, the build "
                             f"wants {dt} {shape}")
        if t.device != torch.device(device) or not t.is_contiguous():
            raise ValueError(f"workspace {name!r} must be a contiguous tensor on {device}, "
                             f"got {t.device}, strides {t.stride()}")


def launch(kernel, meta, A, B, D, *, sync: bool = True, workspace=None,
           step: "registry.Step | None" = None, device_checked: bool = False) -> tuple:
    """Validate and launch ``kernel(A, B, D, *workspace)`` built with ``meta`` (step, arch,
    M, N, K, kwargs: the dtype and the workspace operands follow from them).

    Refuses, before launching, inputs whose shapes differ from the built shape, bad operands
    (see validate_inputs; the dtype is the build's), a GPU that does not fit the build's
    arch, and a ``workspace`` ((name, tensor), ...) unlike the step's workspace_specs. With
    ``workspace`` None a zero-filled one is made for this launch (KernelHandle keeps its
    own between launches). With ``sync`` it waits for the kernel and turns an asynchronous
    failure into KernelLaunchError. Returns the workspace it passed.

    The GPU's capability is checked once per run, where the run starts: ``device_checked``
    says the caller did (runner.run_step's check_device; a KernelHandle's earlier launch on
    the same device), so a launch does not ask the driver again.
    """
    m = BuildMeta.from_any(meta)
    shapes = [tuple(getattr(t, "shape", ())) for t in (A, B, D)]
    if shapes != [(m.M, m.K), (m.N, m.K), (m.M, m.N)]:
        raise ValueError(
            f"kernel {m.step}/{m.arch} built for M,N,K={m.M},{m.N},{m.K} but inputs are "
            f"A {shapes[0]}, B {shapes[1]}, D {shapes[2]} (expected A {(m.M, m.K)}, "
            f"B {(m.N, m.K)}, D {(m.M, m.N)})"
        )
    validate_inputs(A, B, D, m.M, m.N, m.K, dtype=m.dtype)
    if not device_checked:
        check_capability(m.arch, A.device)
    specs = workspace_specs(m, step)
    if workspace is None:
        workspace = make_workspace(specs, A.device)
    else:
        workspace = tuple(workspace)
        check_workspace(specs, workspace, A.device)
    try:
        kernel(A, B, D, *(t for _, t in workspace))
    except Exception as e:
        raise KernelLaunchError(f"launching {m.step}/{m.arch} failed: {e}") from e
    if sync:
        synchronize(label(m))
    return workspace


class KernelHandle:
    """A loaded kernel with its build metadata; calling it validates, launches and syncs.

    Its workspace operands (if the step has any) are allocated zero-filled on the first
    call's device and reused by every later call there (the kernel leaves them zeroed)."""

    def __init__(self, kernel, meta, *, step: "registry.Step | None" = None):
        self.kernel = kernel
        self.meta = BuildMeta.from_any(meta)
        self.step = step
        self._workspace: dict[str, tuple] = {}

    @classmethod
    def load(cls, lib_path, meta) -> "KernelHandle":
        return cls(load_kernel(lib_path), meta)

    @property
    def dtype(self) -> str:
        return self.meta.dtype

    def __call__(self, A, B, D, *, sync: bool = True) -> None:
        where = str(getattr(A, "device", ""))
        # the capability is checked on the first launch on a device (which then keeps a
        # workspace there), not on every call
        self._workspace[where] = launch(self.kernel, self.meta, A, B, D, sync=sync,
                                        workspace=self._workspace.get(where), step=self.step,
                                        device_checked=where in self._workspace)

    def __repr__(self) -> str:
        m = self.meta
        dt = "" if m.dtype == "float16" else f", {m.dtype}"
        return f"KernelHandle({m.step}/{m.arch}, M,N,K={m.M},{m.N},{m.K}{dt})"
