"""v14's kernels for grouped_mm, 16-bit and fp8 alike: read from the bundle matmul reads
($TIRX_GEMM_BUNDLE or use_bundle), else built here, and loaded once per process. One cache
for op/grouped.py and op/grouped_fp8.py, so neither imports the other to share it.
:func:`suite_entry` checks a grouped suite entry (grouped.suite_builds lists its kernels:
plain, fused, fp8); :func:`warn_unfused` says, once per kernel, that a fused call runs unfused
for want of its kernel and which suite key exports it."""

from __future__ import annotations

import threading
from typing import NamedTuple

from tirx_gemm import registry
from tirx_gemm.op.keywords import NOMINAL_M

_lock = threading.Lock()
_kernels: dict = {}
_workspaces: dict = {}  # (step, arch, N, K, keywords, device index) -> run.workspace.CallWorkspace
_warned: set = set()  # the fused kernels warn_unfused has named
ENTRY_KEYS = {"kind", "model", "layer", "why", "E", "top_k", "N", "K", "tokens", "layout",
              "dtypes", "arch", "sm_count", "all_m", "epilogues", "fp8"}


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
        _warned.clear()


def warn_unfused(step_id: str, arch: str, N: int, K: int, kwargs: dict, epilogue: dict,
                 exc: Exception) -> None:
    """Warn, once per kernel (until :func:`clear`), that a call with the fused ``epilogue``
    runs the plain kernel and torch ops because ``kwargs``' kernel is neither in the bundle nor
    buildable here (``exc``), naming the grouped suite entry's keys that export it."""
    import json
    import warnings
    key = (step_id, arch, N, K, tuple(sorted(kwargs.items())))
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    entry = {"kind": "grouped", "E": kwargs.get("E"), "N": N, "K": K,
             "dtypes": [kwargs.get("dtype", "float16")], "epilogues": [epilogue]}
    if kwargs.get("LAYOUT", "contiguous") != "contiguous":
        entry["layout"] = kwargs["LAYOUT"]
    warnings.warn(f"grouped: the fused kernel {step_id} {arch} N={N} K={K} {kwargs} cannot be "
                  f"had ({why}): running the plain kernel, then torch ops; export it with a "
                  f"suite entry {json.dumps(entry)} (its tokens, top_k, model, layer, why too) "
                  f"and `tirx-gemm export --suite FILE`", stacklevel=4)


class SuiteEntry(NamedTuple):
    """A grouped suite entry, checked (:func:`suite_entry`): what grouped.suite_builds lists."""
    at: str             # how errors name it: "grouped entry <model> <layer>"
    E: int
    N: int
    K: int
    tokens: list
    top_k: int
    dtypes: list        # 16-bit: the operands' dtypes; fp8: the output dtypes
    layout: str
    arch: str
    sm_count: int | None
    all_m: bool
    epilogues: list     # grouped_epilogue.suite_epilogue's dicts
    fp8: bool


def suite_entry(entry: dict) -> SuiteEntry:
    """A suite entry of kind "grouped" checked, each problem a one-line ValueError naming it:
    ``{"kind": "grouped", "E": 8, "top_k": 2, "N": 28672, "K": 4096, "tokens": [1, 16, ...],
    "layout": "contiguous", "dtypes": ["bfloat16"], "arch": "sm_90a", "sm_count": 132,
    "all_m": true, "epilogues": [{"ROW_SCALE": true}], "fp8": false}`` (all but E, N, K,
    tokens optional; model, layer and why are text). grouped.suite_builds says what each
    key adds; what the picks refuse (E, N, K, layout) they refuse there."""
    from tirx_gemm.numerics import DTYPES
    from tirx_gemm.op import grouped_epilogue as GE
    if not isinstance(entry, dict):
        raise ValueError(f"a grouped suite entry must be a JSON object, got "
                         f"{type(entry).__name__}")
    at = f"grouped entry {entry.get('model', '')!s} {entry.get('layer', '')!s}".rstrip()
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        raise ValueError(f"{at}: unknown key {unknown[0]!r} (a grouped entry has "
                         f"{', '.join(sorted(ENTRY_KEYS))})")
    if entry.get("kind") != "grouped":
        raise ValueError(f"{at}: kind={entry.get('kind')!r}, expected 'grouped'")
    for k in ("E", "N", "K", "tokens"):
        if k not in entry:
            raise ValueError(f"{at}: {k!r} is missing")
    tokens = entry["tokens"]
    tokens = [tokens] if isinstance(tokens, int) and not isinstance(tokens, bool) else tokens
    if not isinstance(tokens, list) or not tokens or any(
            isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tokens):
        raise ValueError(f"{at}: tokens={entry['tokens']!r} must be a positive int or a "
                         f"non-empty list of them")
    E, top_k = entry["E"], entry.get("top_k", 1)
    if isinstance(E, bool) or not isinstance(E, int) or E < 1:
        raise ValueError(f"{at}: E={E!r} must be a positive int")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= E:
        raise ValueError(f"{at}: top_k={top_k!r} must be an int from 1 to E={E}")
    dtypes = entry.get("dtypes", list(DTYPES))
    if not isinstance(dtypes, list) or not dtypes or any(d not in DTYPES for d in dtypes):
        fp8 = ' (fp8 operands: "fp8": true, dtypes the output\'s)' if isinstance(
            dtypes, list) and "float8_e4m3fn" in dtypes else ""
        raise ValueError(f"{at}: dtypes={dtypes!r} must be a non-empty list of "
                         f"{', '.join(DTYPES)}{fp8}")
    for k in ("all_m", "fp8"):
        if not isinstance(entry.get(k, False), bool):
            raise ValueError(f"{at}: {k}={entry[k]!r} must be true or false")
    epilogues = entry.get("epilogues", [])
    if not isinstance(epilogues, list):
        raise ValueError(f"{at}: epilogues={epilogues!r} must be a list of objects of fused "
                         f"keywords ({', '.join(GE.FUSED_KEYWORDS)}, SWIGLU)")
    epis: list[dict] = []
    for j, epi in enumerate(epilogues):
        epi = GE.suite_epilogue(epi, f"{at}: epilogues[{j}]")
        if epi in epis:
            raise ValueError(f"{at}: epilogues[{j}] repeats an earlier one: list each once")
        epis.append(epi)
    return SuiteEntry(at, E, entry["N"], entry["K"], tokens, top_k, dtypes,
                      entry.get("layout", "contiguous"), entry.get("arch", "sm_90a"),
                      entry.get("sm_count"), entry.get("all_m", True), epis,
                      entry.get("fp8", False))
