"""Builds at the canonical shapes (cached on disk, so a repeat is a file read) and their tables."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

from tirx_gemm import registry
from tirx_gemm.compile.sass import KEY_SASS, SASS_GLOSSARY
from tirx_gemm.registry import Step
from tirx_gemm.notebook.display import Md, _kib, _shape, _table
from tirx_gemm.notebook.steps import _missing, _step, previous_step_id, steps_of

_BUILDS: dict = {}


def compiler_missing() -> str | None:
    """Why this host cannot compile, or None. A GPU host that runs exported bundles has
    torch and the TVM runtime but not TVM's compiler: the notebook then skips the build
    cells (saying so) and still checks and times the step from the bundle."""
    if importlib.util.find_spec("tvm") is None:
        return ("the TVM compiler is not installed here (a host that runs exported bundles); "
                "build outputs appear where it is installed")
    return None


def _not_here() -> Md:
    return Md(f"Not shown here: {compiler_missing()}.")


def build_step(step_id: str) -> dict:
    """The step's builds at its canonical shape, arch -> BuildResult ({} where this host
    cannot compile)."""
    if compiler_missing():
        return {}
    from tirx_gemm.compile.api import build
    return {s.arch: build(s.id, *s.canonical, arch=s.arch) for s in steps_of(step_id)}


def canonical_build(step_id: str, arch: str):
    """BuildResult of one step at its canonical shape, or None if the registry lacks it."""
    step = _step(step_id, arch)
    if step is None:
        return None
    key = (step.id, step.arch)
    if key not in _BUILDS:
        from tirx_gemm.compile.api import build
        _BUILDS[key] = build(step.id, *step.canonical, arch=step.arch)
    return _BUILDS[key]


def _prefetch(steps: Sequence[Step]) -> None:
    """Build several steps at once (parallel worker processes for the cache misses)."""
    todo = [s for s in steps if (s.id, s.arch) not in _BUILDS]
    if not todo:
        return
    from tirx_gemm.compile.api import build_many
    for s, res in zip(todo, build_many([(s, s.canonical, {}) for s in todo])):
        if isinstance(res, Exception):
            raise res
        _BUILDS[(s.id, s.arch)] = res


def _total_sass(res) -> int:
    return sum(res.sass_counts.values())


def build_summary(builds: dict) -> Md:
    """One line per arch for the results of ``tirx_gemm.compile.api.build`` (arch -> BuildResult)."""
    if not builds and compiler_missing():
        return _not_here()
    rows = []
    for arch, r in builds.items():
        step = registry.get(r.step, r.arch)
        t = "cached" if r.cached else f"{r.times.get('total', 0):.1f} s"
        rows.append([r.arch, f"`{step.module}.hgemm_{r.step}`", _shape((r.M, r.N, r.K)), t,
                     f"`{Path(r.dir).name}`", f"{len(r.cuda_source.splitlines())} lines",
                     f"{_total_sass(r)} instructions"])
    return Md(_table(["arch", "builder", "M x N x K", "build", "cache entry", "CUDA", "SASS"],
                     rows))


def resource_table(step_id: str) -> Md:
    """Registers, shared memory and spills of this step and the previous one, per arch."""
    if compiler_missing():
        return _not_here()
    prev = previous_step_id(step_id)
    ids = [prev, step_id] if prev else [step_id]
    _prefetch([s for i in ids for s in steps_of(i)])
    rows = []
    notes = []
    for arch in registry.ARCHES:
        for sid in ids:
            r = canonical_build(sid, arch)
            if r is None:
                notes.append(_missing(sid, arch))
                continue
            rows.append([arch, sid + (" (this step)" if sid == step_id else ""),
                         _shape((r.M, r.N, r.K)), r.registers, _kib(r.smem_bytes),
                         r.static_smem_bytes, f"{r.spill_stores} / {r.spill_loads}",
                         _total_sass(r)])
    text = _table(["arch", "step", "M x N x K", "registers / thread", "dynamic smem / CTA",
                   "static smem (B)", "spill st / ld (B)", "SASS instructions"], rows)
    if notes:
        text += "\n\n" + "; ".join(notes) + "."
    return Md(text)


def _key_counts(res) -> dict:
    return res.key_sass() if res is not None else {}


def sass_compare(step_id: str) -> Md:
    """Key SASS opcode counts, previous step vs this step, for each arch."""
    if compiler_missing():
        return _not_here()
    prev = previous_step_id(step_id)
    _prefetch([s for i in filter(None, [prev, step_id]) for s in steps_of(i)])
    cols, counts, notes = [], [], []
    for arch in registry.ARCHES:
        for sid in filter(None, [prev, step_id]):
            r = canonical_build(sid, arch)
            if r is None:
                notes.append(_missing(sid, arch))
                continue
            cols.append(f"{sid} {arch}")
            counts.append(_key_counts(r) | {"(all instructions)": _total_sass(r)})
    ops = [op for op in (*KEY_SASS, "(all instructions)") if any(c.get(op) for c in counts)]
    rows = [[f"`{op}`"] + [c.get(op, 0) for c in counts] for op in ops]
    text = _table(["opcode (prefix)"] + cols, rows)
    if notes:
        text += "\n\n" + "; ".join(notes) + "."
    return Md(text)


def resource_overview() -> Md:
    """Registers, shared memory, spills and instruction count of every step (canonical)."""
    if compiler_missing():
        return _not_here()
    _prefetch(registry.STEPS)
    rows = []
    for s in registry.STEPS:
        r = canonical_build(s.id, s.arch)
        rows.append([s.id, s.arch, _shape(s.canonical), r.registers, _kib(r.smem_bytes),
                     f"{r.spill_stores} / {r.spill_loads}", _total_sass(r)])
    return Md(_table(["step", "arch", "M x N x K", "registers / thread", "dynamic smem / CTA",
                      "spill st / ld (B)", "SASS instructions"], rows))


def sass_overview(arch: str = "sm_100a") -> Md:
    """Key SASS opcode counts of every step of one arch, side by side."""
    steps = registry.all_steps(arch)
    if not steps:
        return Md(f"no {arch} steps in the registry.")
    if compiler_missing():
        return _not_here()
    _prefetch(steps)
    counts = [_key_counts(canonical_build(s.id, arch)) for s in steps]
    ops = [op for op in KEY_SASS if any(c.get(op) for c in counts)]
    rows = [[f"`{op}`", SASS_GLOSSARY.get(op, "")] + [c.get(op, 0) for c in counts]
            for op in ops]
    return Md(f"{arch}, canonical shapes:\n\n"
              + _table(["opcode", "what it is"] + [s.id for s in steps], rows))
