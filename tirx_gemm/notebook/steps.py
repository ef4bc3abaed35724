"""The registry seen from one step: its arches, its card, the step it extends, its overview."""

from __future__ import annotations

from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.registry import Step
from tirx_gemm.notebook.display import Md, _shape, _table

# the package folder (tirx_gemm/): its parent is the checkout of an editable install
PKG_DIR = Path(__file__).resolve().parent.parent


def steps_of(step_id: str) -> list[Step]:
    """Every registered arch of one step, in registry order (sm_100a first)."""
    return [s for s in registry.STEPS if s.id == step_id]


def arches(step_id: str) -> list[str]:
    return [s.arch for s in steps_of(step_id)]


def _step(step_id: str, arch: str) -> Step | None:
    try:
        return registry.get(step_id, arch)
    except ValueError:
        return None


def previous_step_id(step_id: str) -> str | None:
    """The step this one is compared with (SASS, resources, "what changes from"): its
    registry ``base`` when its arches agree on one, else the registry's previous step id."""
    bases = {diff_base(step_id, a) for a in arches(step_id)}
    if len(bases) == 1 and None not in bases:
        return bases.pop()
    ids = registry.step_ids()
    i = ids.index(step_id)
    return ids[i - 1] if i > 0 else None


def _missing(step_id: str, arch: str) -> str:
    return f"{arch} {step_id}: not in the registry (yet)"


def _rel(path) -> str:
    p = Path(path)
    try:
        return str(p.resolve().relative_to(PKG_DIR.parent))
    except ValueError:
        return str(p)


def _card(step: Step) -> str:
    """The step card: the builder's docstring, else the module docstring (read from the
    source with ast: importing the builder would import TVM)."""
    import ast
    tree = ast.parse(Path(step.source_file).read_text())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef)
               and n.name == f"hgemm_{step.id}"), None)
    doc = (ast.get_docstring(fn) if fn is not None else None) or ast.get_docstring(tree) or ""
    return doc.strip()


def diff_base(step_id: str, arch: str = "sm_100a") -> str | None:
    """The step this one changes on ``arch``: the registry's ``Step.base`` (the one its card
    names, "Changes from vN"); None for the first step or an unregistered one."""
    step = _step(step_id, arch)
    return None if step is None else step.base


def step_overview(step_id: str) -> Md:
    """Lesson, constraints, canonical shape, source file and step card for each arch."""
    out = [f"### {step_id}: the registry's view"]
    for arch in registry.ARCHES:
        step = _step(step_id, arch)
        if step is None:
            out.append(f"\n**{arch}**: not in the registry (yet).")
            continue
        src = Path(step.source_file)
        try:
            src = src.relative_to(PKG_DIR.parent)
        except ValueError:
            pass
        out.append(f"\n**{arch}**: {step.lesson}\n\n"
                   f"- builder: `{step.module}.hgemm_{step.id}` (`{src}`)\n"
                   f"- constraints: {step.constraints}\n"
                   f"- canonical shape: {_shape(step.canonical)}\n"
                   f"- SASS the lesson promises: {', '.join(f'`{o}`' for o in step.sass_expect)}"
                   + (f"; forbids: {', '.join(f'`{o}`' for o in step.sass_forbid)}"
                      if step.sass_forbid else ""))
        card = _card(step)
        if card:
            out.append("\n<details><summary>step card (docstring)</summary>\n\n```text\n"
                       + card + "\n```\n</details>")
    return Md("\n".join(out))


def path_table(notebooks: dict | None = None) -> Md:
    """The path v1 -> vN from the registry: lesson per arch (and the notebook of each step)."""
    rows = []
    for sid in registry.step_ids():
        by = {s.arch: s.lesson for s in steps_of(sid)}
        row = [sid] + [by.get(a, "not in the registry (yet)") for a in registry.ARCHES]
        if notebooks is not None:
            nb = notebooks.get(sid)
            row.append(f"[{nb}]({nb})" if nb else None)
        rows.append(row)
    head = ["step"] + [f"{a} lesson" for a in registry.ARCHES]
    if notebooks is not None:
        head.append("notebook")
    return Md(_table(head, rows))
