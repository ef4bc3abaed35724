"""The source views: a step's TIRx source, its code-only diffs, an excerpt of its CUDA.

The rules (which lines are code, how a diff is cut into hunks and named, what the CUDA
skeleton keeps) are ``tirx_gemm.sourceview``'s, shared with scripts/diff_sizes.py; this
module finds the files through the registry and wraps the text for display.
"""

from __future__ import annotations

import re
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.registry import Step
from tirx_gemm.sourceview import code_diff, code_lines, cuda_skeleton, diff_counts, kernel_body
from tirx_gemm.notebook.builds import _not_here, canonical_build, compiler_missing
from tirx_gemm.notebook.display import Code, Md, _shape
from tirx_gemm.notebook.steps import _missing, _rel, _step

__all__ = ["code_diff", "code_lines", "cuda_excerpt", "step_diff", "step_source", "twin_diff"]


def _read_source(step: Step) -> str:
    return Path(step.source_file).read_text(encoding="utf-8")


def step_source(step_id: str, arch: str = "sm_100a") -> Code | Md:
    """The step's TIRx source as it is on disk (``registry.Step.source_file``, read now),
    highlighted, with line numbers; printed, exactly the file's text."""
    step = _step(step_id, arch)
    if step is None:
        return Md(_missing(step_id, arch) + ".")
    text = _read_source(step)
    return Code(text, "python", f"{arch} {step_id}: {_rel(step.source_file)} "
                f"({len(text.splitlines())} lines, read from the file just now)")


def step_diff(step_id: str, arch: str = "sm_100a", *, context: int = 3) -> Code | Md:
    """The code-only diff of the step against the step it changes (``Step.base``), same arch."""
    step = _step(step_id, arch)
    if step is None:
        return Md(_missing(step_id, arch) + ".")
    base = registry.base_of(step)
    if base is None:
        return Md(f"{arch} {step_id} is the first step: there is nothing to diff against.")
    base_id = base.id
    diff = code_diff(_read_source(base), _read_source(step), _rel(base.source_file),
                     _rel(step.source_file), context=context)
    return Code(diff, "diff", _diff_title(f"{arch}: {base_id} -> {step_id}", diff))


def twin_diff(step_id: str, *, context: int = 3) -> Code | Md:
    """The code-only diff of the step's sm_100a builder against its sm_90a twin."""
    steps = {a: _step(step_id, a) for a in registry.ARCHES}
    missing = [a for a, s in steps.items() if s is None]
    if missing:
        return Md(f"{step_id}: no twin diff, " + "; ".join(_missing(step_id, a) for a in missing)
                  + ".")
    a, b = (steps[x] for x in registry.ARCHES)
    diff = code_diff(_read_source(a), _read_source(b), _rel(a.source_file),
                     _rel(b.source_file), context=context)
    return Code(diff, "diff", _diff_title(f"{step_id}: {a.arch} -> {b.arch}", diff))


def _diff_title(what: str, diff: str) -> str:
    plus, minus, hunks = diff_counts(diff)
    return (f"{what}: +{plus} / -{minus} code lines in {hunks} hunk(s); comments, docstrings "
            "and blank lines stripped; hunk headers give the files' line numbers and the "
            "part of the builder they touch")


def cuda_excerpt(step_id: str, arch: str = "sm_100a", lines: int = 40, *,
                 focus: str | None = None, skeleton: bool = True, width: int = 130) -> Md:
    """An excerpt of the generated CUDA kernel (canonical shape).

    ``skeleton=True`` keeps control flow, barriers, MMA issue, TMA and fences (what the
    lesson is about) and folds runs of identical calls; ``focus`` (a regex) starts the
    excerpt a few lines above its first match; lines are cut at ``width`` characters and
    the excerpt at ``lines`` lines.
    """
    if compiler_missing():
        return _not_here()
    r = canonical_build(step_id, arch)
    if r is None:
        return Md(_missing(step_id, arch) + ".")
    body = kernel_body(r.cuda_source)
    total = len(body)
    if skeleton:
        body = cuda_skeleton(body)
    start = 0
    if focus:
        rx = re.compile(focus)
        hit = next((i for i, ln in enumerate(body) if rx.search(ln)), None)
        start = max(0, hit - 3) if hit is not None else 0
    shown = body[start:start + lines]
    cut = [ln if len(ln) <= width else ln[: width - 4] + " ..." for ln in shown]
    head = (f"{arch} {step_id} {_shape((r.M, r.N, r.K))}: `{r.cuda_path}` "
            f"({total} lines in the kernel body; "
            + ("skeleton: control flow, barriers, MMA, TMA, fences" if skeleton else "verbatim")
            + f"; showing {len(cut)} lines from line {start + 1} of that view)")
    more = len(body) - (start + len(shown))
    tail = f"\n// ... {more} more lines" if more > 0 else ""
    return Md(head + "\n\n```cuda\n" + "\n".join(cut) + tail + "\n```")
