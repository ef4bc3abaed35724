"""v14's kernels for grouped_mm, 16-bit and fp8 alike: read from the bundle matmul reads
($TIRX_GEMM_BUNDLE or use_bundle), else built here, and loaded once per process. One cache
for op/grouped.py and op/grouped_fp8.py, so neither imports the other to share it."""

from __future__ import annotations

import threading

from tirx_gemm import registry
from tirx_gemm.op.keywords import NOMINAL_M

_lock = threading.Lock()
_kernels: dict = {}
_workspaces: dict = {}  # (step, arch, N, K, keywords, device index) -> run.workspace.CallWorkspace


def gpu(device) -> tuple[str, int]:
    """(arch, SM count) of the GPU holding ``device``'s tensors (operands._gpu_arch)."""
    from tirx_gemm.op.operands import _gpu_arch
    return _gpu_arch(device)


def load(step_id: str, arch: str, N: int, K: int, kwargs: dict):
    """(the loaded kernel, its label) of ``step_id`` at (N, K) with ``kwargs``."""
    from tirx_gemm.op import matmul as mm
    bundle = mm.bundle_path()
    key = (step_id, arch, N, K, tuple(sorted(kwargs.items())), str(bundle) if bundle else None)
    with _lock:
        hit = _kernels.get(key)
        if hit is None:
            from tirx_gemm.run.loader import load_kernel
            step = registry.get(step_id, arch)
            lib, _ = mm.kernel_source(step, (NOMINAL_M, N, K), kwargs, bundle)
            hit = _kernels[key] = (load_kernel(str(lib)),
                                   f"{step.key} MxNxK=Mx{N}x{K} ({kwargs})")
    return hit


def workspace(step_id: str, arch: str, N: int, K: int, kwargs: dict, device):
    """() for a build without workspace operands, else the operands' CallWorkspace (v14
    TAIL_SPLIT's slabs and counters, registry.Step.workspace_specs; M does not enter): one set
    per stream eagerly, fresh per call under graph capture (tirx_gemm.run.workspace), shared by
    every call of one kernel on one device."""
    step = registry.get(step_id, arch)
    if not step.workspace_specs(0, N, K, kwargs):
        return ()
    key = (step_id, arch, N, K, tuple(sorted(kwargs.items())), device.index)
    with _lock:
        hit = _workspaces.get(key)
        if hit is None:
            from tirx_gemm.run.workspace import Workspaces
            specs = Workspaces(lambda M, n, k: step.workspace_specs(M, n, k, kwargs), True)
            hit = _workspaces[key] = specs.for_call(0, N, K, device)
    return hit


def clear() -> None:
    """Forget every loaded grouped kernel and its workspace (after changing the bundle)."""
    with _lock:
        _kernels.clear()
        _workspaces.clear()
