"""What the notebooks call, so that they stay thin (CONTRIBUTING.md, house style rule 10).

The notebooks in ``notebooks/`` are narrative plus one-line calls into this module; no
kernel code lives in them. Everything here reads the one registry (``tirx_gemm.registry``),
the build harness (``tirx_gemm.compile.api``: canonical shapes only, cached on disk under
``TIRX_GEMM_CACHE``) and the recorded results (``results/*.jsonl`` via
``tirx_gemm.report.records``); runs go through ``tirx_gemm.run.runner`` and only where a GPU of the
step's arch is present.

Every function returns an object that renders itself in Jupyter (markdown, or a PNG for
plots) and prints as plain text elsewhere, so the same calls work in a notebook, in a
terminal and in the headless CI run. Importing this module imports neither TVM nor torch.
"""

from __future__ import annotations

import ast
import difflib
import html
import importlib.util
import io
import os
import re
import tokenize
import tempfile
from pathlib import Path
from typing import Sequence

from tirx_gemm import registry
from tirx_gemm.run import measure
from tirx_gemm.report import plots
from tirx_gemm.report import records
from tirx_gemm.report import tables
from tirx_gemm.registry import Step
from tirx_gemm.compile.sass import KEY_SASS, SASS_GLOSSARY

__all__ = [
    "Md",
    "Png",
    "timeline",
    "steps_of",
    "arches",
    "previous_step_id",
    "results_dir",
    "canonical_build",
    "build_step",
    "build_summary",
    "compiler_missing",
    "step_overview",
    "resource_table",
    "sass_compare",
    "cuda_excerpt",
    "results_for",
    "results_table",
    "measure_or_recorded",
    "plot_results",
    "path_table",
    "resource_overview",
    "sass_overview",
    "device_status",
    "Code",
    "code_lines",
    "code_diff",
    "diff_base",
    "step_source",
    "step_diff",
    "twin_diff",
    "suite_cases",
    "suite_ratios",
    "suite_plot",
]

PKG_DIR = Path(__file__).resolve().parent
RESULTS_ENV = "TIRX_GEMM_RESULTS"


# --------------------------------------------------------------------------------------
# display objects
# --------------------------------------------------------------------------------------
class Md:
    """Markdown text: rendered by Jupyter, printed as-is elsewhere."""

    def __init__(self, text: str):
        self.text = text.rstrip() + "\n"

    def _repr_markdown_(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __add__(self, other: "Md") -> "Md":
        return Md(self.text + "\n" + str(other))


class Png:
    """A rendered plot: Jupyter shows the image, a terminal gets the same data as text."""

    def __init__(self, png: bytes, text: str):
        self.png = png
        self.text = text

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        return self.text


_table = tables.markdown
_shape = tables.shape


def _kib(n) -> str:
    return "—" if n is None else f"{n / 1024:.1f} KiB"


# --------------------------------------------------------------------------------------
# the registry, seen from one step
# --------------------------------------------------------------------------------------
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
    """The step this one is compared with (SASS, resources, "what changes from"): the one
    its step cards name as its base (``diff_base``) when its arches agree, else the
    registry's previous step id."""
    bases = {diff_base(step_id, a) for a in arches(step_id)}
    if len(bases) == 1 and None not in bases:
        return bases.pop()
    ids = registry.step_ids()
    i = ids.index(step_id)
    return ids[i - 1] if i > 0 else None


def _missing(step_id: str, arch: str) -> str:
    return f"{arch} {step_id}: not in the registry (yet)"


# --------------------------------------------------------------------------------------
# builds (canonical shapes only: cached on disk, so a repeat is a file read)
# --------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------
# a step, both arches
# --------------------------------------------------------------------------------------
def _card(step: Step) -> str:
    """The step card: the builder's docstring, else the module docstring (read from the
    source with ast: importing the builder would import TVM)."""
    import ast
    tree = ast.parse(Path(step.source_file).read_text())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef)
               and n.name == f"hgemm_{step.id}"), None)
    doc = (ast.get_docstring(fn) if fn is not None else None) or ast.get_docstring(tree) or ""
    return doc.strip()


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


_SKELETON = re.compile(
    r"__global__|\bfor \(|\bwhile \(|\bif \(|\belse\b|break;|mbarrier|setmaxnreg"
    r"|tcgen05_(mma|commit|ld|alloc|dealloc)|wgmma_(f16|fence|commit|wait)|cp_async_bulk"
    r"|cta_sync|warpgroup_sync|elect_one|fence_proxy|phase\w*\[0\] =|stage\w*\[0\] ="
    r"|^\s*}\s*$")
_CALL = re.compile(r"^\s*(?:[\w:<>*]+\s+)?([A-Za-z_]\w*)\s*\(")


def _kernel_body(src: str) -> list[str]:
    """Lines of the __global__ kernel definition (the last __global__ occurrence that opens
    a body), up to its closing brace."""
    lines = src.splitlines()
    start = None
    for i, line in enumerate(lines):
        if "__global__" in line and line.rstrip().endswith("{"):
            start = i
    if start is None:
        return lines
    depth, out = 0, []
    for line in lines[start:]:
        out.append(line)
        depth += line.count("{") - line.count("}")
        if depth <= 0 and len(out) > 1:
            break
    return out


def _prune_empty_blocks(lines: list[str]) -> list[str]:
    """Drop blocks left empty by the skeleton filter (`if (..) {` + `}`, empty `else`)."""
    out = list(lines)
    changed = True
    while changed:
        changed = False
        for i in range(len(out) - 1):
            a, b = out[i].strip(), out[i + 1].strip()
            if b == "}" and a == "} else {":
                out[i:i + 2] = [out[i + 1]]
                changed = True
                break
            if b == "}" and a.endswith("{") and "__global__" not in a:
                del out[i:i + 2]
                changed = True
                break
    return out


def _collapse_repeats(lines: list[str]) -> list[str]:
    """Runs of calls to the same function (e.g. 8 wgmma issues) -> first + a count."""
    out, i = [], 0
    while i < len(lines):
        m = _CALL.match(lines[i])
        j = i + 1
        if m and not lines[i].lstrip().startswith(("if", "for", "while")):
            while j < len(lines) and (mm := _CALL.match(lines[j])) and mm.group(1) == m.group(1):
                j += 1
        out.append(lines[i])
        if j - i > 1:
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            out.append(f"{indent}// ... {j - i - 1} more {m.group(1)}(...) (x{j - i} in all)")
        i = j
    return out


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
    body = _kernel_body(r.cuda_source)
    total = len(body)
    if skeleton:
        body = _collapse_repeats(_prune_empty_blocks(
            [ln for ln in body if _SKELETON.search(ln)]))
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


# --------------------------------------------------------------------------------------
# the TIRx source of a step, and the code-only diffs that carry the lesson
# --------------------------------------------------------------------------------------
class Code:
    """Python source or a diff of it. Jupyter shows it as HTML, syntax-highlighted with
    pygments where it is installed (it comes with IPython) and as a plain ``<pre>`` with
    coloured +/- lines where not; printed, it is exactly ``text``."""

    _BG = {"+": "#e6ffec", "-": "#ffebe9", "@": "#ddf4ff"}

    def __init__(self, text: str, kind: str, title: str, *, first_line: int = 1):
        if kind not in ("python", "diff"):
            raise ValueError(f"kind {kind!r} must be 'python' or 'diff'")
        self.text, self.kind, self.title, self.first_line = text, kind, title, first_line

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def _repr_html_(self) -> str:
        body = self._python_html() if self.kind == "python" else self._diff_html()
        return (f"<p><b>{html.escape(self.title)}</b></p>\n"
                '<div style="max-height:48em; overflow:auto; border:1px solid #d0d7de">'
                '<pre style="margin:0; padding:4px; line-height:1.3; font-size:12px">'
                + body + "</pre></div>")

    @staticmethod
    def _pygments(text: str) -> str | None:
        """The text as inline-styled HTML spans (no wrapper), or None without pygments."""
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer
        except ImportError:
            return None
        out = highlight(text, PythonLexer(stripnl=False, ensurenl=False),
                        HtmlFormatter(noclasses=True, nowrap=True))
        return out

    def _python_html(self) -> str:
        lines = (self._pygments(self.text) or html.escape(self.text)).split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        width = len(str(self.first_line + len(lines)))
        return "\n".join(f'<span style="color:#8c959f">{self.first_line + i:>{width}} </span>'
                         + ln for i, ln in enumerate(lines))

    def _diff_html(self) -> str:
        out = []
        for line in self.text.splitlines():
            mark = line[:1]
            if line.startswith(("---", "+++")) or mark not in "+- ":
                out.append(f'<span style="display:block; background:{self._BG["@"]}; '
                           f'color:#57606a">{html.escape(line)}</span>')
                continue
            code = self._pygments(line[1:]) if line[1:].strip() else None
            code = html.escape(line[1:]) if code is None else code.rstrip("\n")
            style = f' style="display:block; background:{self._BG[mark]}"' if mark != " " \
                else ' style="display:block"'
            out.append(f"<span{style}>{html.escape(mark)}{code}</span>")
        return "".join(out)


def _read_source(step: Step) -> str:
    return Path(step.source_file).read_text(encoding="utf-8")


def _rel(path) -> str:
    p = Path(path)
    try:
        return str(p.resolve().relative_to(PKG_DIR.parent))
    except ValueError:
        return str(p)


def step_source(step_id: str, arch: str = "sm_100a") -> Code | Md:
    """The step's TIRx source as it is on disk (``registry.Step.source_file``, read now),
    highlighted, with line numbers; printed, exactly the file's text."""
    step = _step(step_id, arch)
    if step is None:
        return Md(_missing(step_id, arch) + ".")
    text = _read_source(step)
    return Code(text, "python", f"{arch} {step_id}: {_rel(step.source_file)} "
                f"({len(text.splitlines())} lines, read from the file just now)")


def code_lines(source: str) -> list[tuple[int, str]]:
    """The code lines of a Python source: (1-based line number, text without its comment),
    with docstrings (every statement that is a bare string), comments and blank lines
    dropped. What a code-only diff compares."""
    tree = ast.parse(source)
    drop: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            drop.update(range(node.lineno, node.end_lineno + 1))
    cut: dict[int, int] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0]] = tok.start[1]
    out = []
    for i, line in enumerate(source.splitlines(), 1):
        if i in drop:
            continue
        text = line[:cut[i]] if i in cut else line
        if text.strip():
            out.append((i, text.rstrip()))
    return out


_SECTION = re.compile(r"^\s*#\s*---\s*(.*?)\s*(?:---\s*)?$")


def _section_name(comment: str) -> str:
    """A section comment's name: its text up to the first ':', ';' or ',' outside
    parentheses ("load (producer, both CTAs): ..." -> "load (producer, both CTAs")."""
    depth = 0
    for i, ch in enumerate(comment):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and ch in ":;,":
            return comment[:i].strip()
    return comment.strip()


def _sections(source: str) -> dict[int, str]:
    """Line number -> the part of the file it sits in: ``imports`` (outside the builder),
    ``builder (host side)`` (tunables, checks), and for a function nested in the builder
    (the kernel, an inlined body) ``NAME(): signature`` and then ``NAME(): SECTION`` after
    each ``# --- SECTION: ... ---`` comment (``_section_name``)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    out = {i: "imports" for i in range(1, len(lines) + 1)}

    def span(node):
        return min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.end_lineno

    for top in tree.body:
        if not isinstance(top, ast.FunctionDef):
            continue
        a, b = span(top)
        for i in range(a, b + 1):
            out[i] = "builder (host side)"
        nested = [n for n in ast.walk(top) if isinstance(n, ast.FunctionDef) and n is not top]
        inner = [n for n in nested if not any(
            o is not n and span(o)[0] <= span(n)[0] and span(n)[1] <= span(o)[1] for o in nested)]
        for fn in inner:
            a, b = span(fn)
            current = "signature"
            for i in range(a, b + 1):
                m = _SECTION.match(lines[i - 1])
                if m and m.group(1):
                    current = _section_name(m.group(1))
                out[i] = f"{fn.name}(): {current}"
    return out


def code_diff(old_source: str, new_source: str, old_name: str, new_name: str, *,
              context: int = 3) -> str:
    """The unified diff of two Python sources' code lines (``code_lines``: no comments,
    docstrings or blank lines). Each hunk header gives the original line ranges of both
    files and the parts of the new file (or, for a pure deletion, the old one) it touches."""
    a, b = code_lines(old_source), code_lines(new_source)
    sec_a, sec_b = _sections(old_source), _sections(new_source)
    sm = difflib.SequenceMatcher(None, [t for _, t in a], [t for _, t in b], autojunk=False)
    out = [f"--- {old_name}", f"+++ {new_name}"]
    for group in sm.get_grouped_opcodes(context):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        ra = f"{a[i1][0]}-{a[i2 - 1][0]}" if i2 > i1 else "-"
        rb = f"{b[j1][0]}-{b[j2 - 1][0]}" if j2 > j1 else "-"
        where: list[str] = []
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                continue
            names = ([sec_b[b[j][0]] for j in range(y1, y2)] if y2 > y1
                     else [sec_a[a[i][0]] for i in range(x1, x2)])
            for n in names:
                if n not in where:
                    where.append(n)
        out.append(f"@@ lines {ra} -> {rb} @@ {', '.join(where)}")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out += [" " + t for _, t in a[x1:x2]]
                continue
            out += ["-" + t for _, t in a[x1:x2]]
            out += ["+" + t for _, t in b[y1:y2]]
    return "\n".join(out) + "\n"


def _diff_title(what: str, diff: str) -> str:
    body = [ln for ln in diff.splitlines()[2:] if not ln.startswith("@@")]
    plus = sum(ln.startswith("+") for ln in body)
    minus = sum(ln.startswith("-") for ln in body)
    hunks = sum(ln.startswith("@@") for ln in diff.splitlines())
    return (f"{what}: +{plus} / -{minus} code lines in {hunks} hunk(s); comments, docstrings "
            "and blank lines stripped; hunk headers give the files' line numbers and the "
            "part of the builder they touch")


_BASE = re.compile(r"Changes from (v\d+)\b")


def diff_base(step_id: str, arch: str = "sm_100a") -> str | None:
    """The step this one extends on ``arch``: the one its card names ("Changes from vN"),
    else the previous registered step of the arch; None for the first step."""
    step = _step(step_id, arch)
    if step is None:
        return None
    m = _BASE.search(_card(step))
    if m and _step(m.group(1), arch) is not None and m.group(1) != step_id:
        return m.group(1)
    ids = [s.id for s in registry.all_steps(arch)]
    i = ids.index(step_id)
    return ids[i - 1] if i > 0 else None


def step_diff(step_id: str, arch: str = "sm_100a", *, context: int = 3) -> Code | Md:
    """The code-only diff of the step against the step it extends (``diff_base``), same arch."""
    step = _step(step_id, arch)
    if step is None:
        return Md(_missing(step_id, arch) + ".")
    base_id = diff_base(step_id, arch)
    if base_id is None:
        return Md(f"{arch} {step_id} is the first step: there is nothing to diff against.")
    base = registry.get(base_id, arch)
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


# --------------------------------------------------------------------------------------
# recorded results (results/*.jsonl) and runs on this machine
# --------------------------------------------------------------------------------------
def results_dir() -> Path:
    """$TIRX_GEMM_RESULTS, else the checkout's results/ (editable install), else the first
    results/ found walking up from the working directory."""
    env = os.environ.get(RESULTS_ENV)
    if env:
        return Path(env)
    cand = PKG_DIR.parent / "results"
    if cand.is_dir():
        return cand
    for d in [Path.cwd(), *Path.cwd().parents]:
        if (d / "results").is_dir():
            return d / "results"
    return cand


def _all_latest() -> list[dict]:
    return list(records.latest_by_key(records.load_records(results_dir())).values())


def results_for(step_id: str | None = None) -> list[dict]:
    """Latest recorded run per (step, arch, shape, device), for one step or all, sorted."""
    recs = [r for r in _all_latest() if step_id is None or r["step"] == step_id]
    order = {a: i for i, a in enumerate(registry.ARCHES)}
    return sorted(recs, key=lambda r: (r["step"], order.get(r["arch"], 9), r["device"],
                                       int(r["M"]) * int(r["N"]) * int(r["K"])))


def _step_rows(step_ids: Sequence[str]) -> list[tuple]:
    return [(s.id, s.arch, s.lesson) for sid in step_ids for s in steps_of(sid)]


def results_table(step_id: str | None = None) -> Md:
    """The README-style results table (records.render_table), for one step or all; steps
    without records say why (sm_100a: no sm_100a GPU available)."""
    ids = [step_id] if step_id else registry.step_ids()
    recs = [r for r in _all_latest() if r["step"] in ids]
    shapes = sorted({(int(r["M"]), int(r["N"]), int(r["K"])) for r in recs},
                    key=lambda s: s[0] * s[1] * s[2])
    if not shapes:
        shapes = sorted({s.canonical for sid in ids for s in steps_of(sid)})
    src = results_dir()
    try:
        src = src.relative_to(PKG_DIR.parent)
    except ValueError:
        pass
    return Md(f"Recorded in `{src}/` (newest run per step, arch, shape and GPU):\n\n"
              + records.render_table(recs, _step_rows(ids), shapes,
                                     sim_records=sim_records()))


def sim_records() -> list[dict]:
    """The NumSim records (results/sim/*.jsonl): sm_100a steps run on a CPU model."""
    return records.load_records(results_dir() / "sim")


_SIM_HEAD = ["M x N x K", "kwargs", "result", "rel. error", "synccheck", "racecheck", "date",
             "git"]


def simulation(step_id: str, *, live: bool | None = None) -> Md:
    """The sm_100a step on NumSim, a CPU model of Blackwell: simulated here when the
    simulator is installed (Python >= 3.12, ``pip install -e ".[sim]"``), else the step's
    latest recorded simulation (results/sim/). Correctness and synchronization on a model;
    no timing."""
    from tirx_gemm.sim import gate as sim
    step = _step(step_id, sim.ARCH)
    if step is None:
        return Md(f"{step_id} has no sm_100a step to simulate.")
    why = sim.unavailable_reason()
    if live is None:
        live = why is None
    if live:
        lines: list[str] = []
        log_path = Path(tempfile.mkdtemp(prefix="tirx-gemm-sim-")) / f"{step_id}.txt"
        rows = sim.simulate(sim.cases_for(step), log_path=log_path, out=lines.append)
        ok = sum(r.ok for r in rows)
        return Md(f"Simulated here on NumSim ({ok}/{len(rows)} cases correct and clean; full "
                  f"checker text in `{log_path}`):\n\n```\n" + "\n".join(lines) + "\n```")
    run = sorted(records.latest_sim_run(sim_records(), step_id),
                 key=lambda r: int(r["M"]) * int(r["N"]) * int(r["K"]))
    if not run:
        return Md(f"Not simulated here ({why}) and no simulation recorded in results/sim/.")
    rows = [[_shape((r["M"], r["N"], r["K"])),
             " ".join(f"{k}={v}" for k, v in (r.get("kwargs") or {}).items()) or "-",
             r.get("numsim"), None if r.get("rel_err") is None else f"{r['rel_err']:.1e}",
             r.get("synccheck"), r.get("racecheck"), str(r.get("timestamp", ""))[:10],
             str(r.get("git_sha"))[:10]] for r in run]
    return Md(f"Not simulated here ({why}). The latest recorded simulation "
              f"(`tirx-gemm sim {step_id} --record`, {run[0].get('device')}):\n\n"
              + _table(_SIM_HEAD, rows))


def _device_for(arch: str):
    """(device info, None) if a GPU of this arch is here, else (None, why not)."""
    try:
        from tirx_gemm.run import device
    except Exception as exc:  # noqa: BLE001 - no torch: nothing can run here
        return None, f"the run side cannot be imported ({type(exc).__name__}: {exc})"
    return device.device_or_reason(arch, query_smi=False)


def _record_rows(recs: Sequence[dict]) -> list[list]:
    rows = []
    for r in recs:
        tf, ratio = r.get("tflops"), r.get("ratio_to_torch")
        rows.append([r["step"], r["arch"], r["device"], _shape((r["M"], r["N"], r["K"])),
                     records.record_dtype(r), "✓" if r.get("verified") else "✗",
                     None if r.get("rel_err") is None else f"{r['rel_err']:.1e}",
                     None if tf is None else f"{tf:.1f}",
                     None if ratio is None else f"{ratio:.2f}x",
                     str(r.get("timestamp", ""))[:10]])
    return rows


_RECORD_HEAD = ["step", "arch", "GPU", "M x N x K", "dtype", "check", "rel. error",
                "TFLOP/s", "x torch", "date"]


def measure_or_recorded(step_id: str, *, bundle: str | None = None) -> Md:
    """For each arch of the step: where a GPU of that arch is present, check and time the
    step here at its canonical shape (``tirx_gemm.run.measure.measure_plan``: build or bundle
    -> runner.run_step); where not, say why and show the recorded results with their GPU."""
    bundle = bundle or os.environ.get("TIRX_GEMM_BUNDLE") or None
    out = []
    for arch in registry.ARCHES:
        step = _step(step_id, arch)
        if step is None:
            out.append(f"**{arch}**: {step_id} is not in the registry (yet).")
            continue
        dev, why = _device_for(arch)
        if dev is not None:
            log: list[str] = []
            recs = measure.measure_plan([(step, step.canonical)], bundle=bundle,
                                        log=log.append)
            out.append(f"**{arch}**: measured here on {dev['name']} (cc {dev['capability']}, "
                       f"{dev['sm_count']} SMs), canonical shape; not recorded "
                       "(`tirx-gemm run ... --record` appends to results/):\n\n"
                       + _table(_RECORD_HEAD, _record_rows(recs)))
            continue
        recs = [r for r in results_for(step_id) if r["arch"] == arch]
        if recs:
            devices = ", ".join(sorted({r["device"] for r in recs}))
            out.append(f"**{arch}**: not run here ({why}). Recorded on {devices}:\n\n"
                       + _table(_RECORD_HEAD, _record_rows(recs)))
        elif arch == "sm_100a" and not any(r["arch"] == "sm_100a" for r in _all_latest()):
            out.append(f"**{arch}**: {records.NO_SM100_GPU} (not run here either: {why}).")
        else:
            out.append(f"**{arch}**: {records.NOT_MEASURED} (no record in results/; not run "
                       f"here: {why}).")
    return Md("\n\n".join(out))


def timeline(step_id: str, arch: str = "sm_90a", *, bundle: str | None = None) -> Md | Png:
    """The in-kernel timeline of this step at its canonical shape: recorded live here when
    a GPU of the arch is present and the bundle (``bundle`` or TIRX_GEMM_BUNDLE) holds the
    step's instrumented build (`tirx-gemm export ... --timeline`); else the one recorded
    in results/timelines/ (the Gantt chart of the first CTAs around the first tile
    boundary, and the whole run summarised), or why there is none: sm_100a runs only on
    NumSim, which has no clock; an sm_90a step may not be recorded yet."""
    from tirx_gemm import timeline as TL
    bundle = bundle or os.environ.get("TIRX_GEMM_BUNDLE") or None
    note = ""
    dev, why = _device_for(arch) if arch == "sm_90a" else (None, "")
    if dev is not None and bundle:
        live, note = _live_timeline(step_id, arch, bundle, dev)
        if live is not None:
            return live
    png, text = TL.recorded_figure(step_id, arch, folder=results_dir() / "timelines")
    text = (note + "\n\n" if note else "") + text
    return Md(text) if png is None else Png(png, text)


def _live_timeline(step_id: str, arch: str, bundle: str, dev: dict):
    """(Png, "") of a trace recorded now from the bundle's instrumented kernel, or (None,
    why not) -- the caller then shows the recorded one."""
    import argparse
    import tempfile
    from tirx_gemm.run import trace
    step = registry.get(step_id, arch)
    out = Path(tempfile.mkdtemp(prefix=f"tirx-gemm-trace-{step_id}-"))
    args = argparse.Namespace(step=step_id, arch=arch, mnk=None, dtype="float16", out=str(out),
                              bundle=bundle, ctas=4, no_timing=False)
    try:
        rc = trace.trace_main(args)
    except (ValueError, LookupError, FileNotFoundError) as e:
        return None, (f"Not recorded live on {dev['name']}: {e}. The recorded trace "
                      "instead:")
    pngs, txts = sorted(out.glob("*.png")), sorted(out.glob("*.txt"))
    if rc != 0 or not txts:
        return None, (f"The live recording on {dev['name']} failed (exit {rc}); the recorded "
                      "trace instead:")
    text = (f"Recorded live just now on {dev['name']} ({step.key}, "
            f"{'x'.join(map(str, step.canonical))}; files in {out}):\n\n```\n"
            + txts[0].read_text().rstrip() + "\n```")
    return (Png(pngs[0].read_bytes(), text) if pngs else Md(text)), ""


def plot_results(highlight: str | None = None):
    """Recorded TFLOP/s and ratio to torch of every step at its canonical shape, one bar per
    (step, arch, GPU), ``highlight`` in a stronger colour (``tirx_gemm.report.plots``). A PNG when
    matplotlib is importable (the ``plot`` extra), else the same numbers as a table."""
    data = plots.canonical_data(_all_latest(), registry.STEPS, highlight)
    text = plots.canonical_text(data)
    try:
        return Png(plots.canonical_png(data, highlight), text)
    except ImportError:
        return Md("matplotlib is not installed (`pip install -e '.[plot]'`): the recorded "
                  "results as a table instead.\n\n" + text)


# --------------------------------------------------------------------------------------
# the shape suite (tirx_gemm/suites/models.json): what matmul picks, and how it measured
# --------------------------------------------------------------------------------------
def _default_sm_count() -> int:
    """The SM count ``matmul.choose`` plans for by default (the H200's)."""
    import inspect
    from tirx_gemm import matmul
    return int(inspect.signature(matmul.choose).parameters["sm_count"].default)


def _kw(kwargs: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(kwargs.items()) if k != "dtype") or "-"


def suite_cases(arch: str = "sm_90a", sm_count: int | None = None, path=None) -> Md:
    """The shape suite (default: the packaged models.json), one row per shape, with the step
    and keywords ``tirx_gemm.matmul`` picks for it on a GPU of ``arch`` with ``sm_count``
    SMs (default: matmul.choose's, the H200's 132). Planning only: no GPU, no timing."""
    from tirx_gemm import suite as S
    st = S.load_suite(path)
    n = sm_count or _default_sm_count()
    picks: dict = {}
    for (e, dtype), it in zip(st.cases(), S.plan(st, S.MATMUL, arch, n)):
        picks.setdefault(e.shape, {})[dtype] = f"{it.step.id} {_kw(it.kwargs)}".strip()
    rows = []
    for e in st.entries:
        choice = sorted(set(picks[e.shape].values()))
        rows.append([_shape(e.shape), e.model, e.layer,
                     ", ".join(records.DTYPE_LABEL.get(d, d) for d in e.dtypes),
            "; ".join(choice) if len(choice) == 1 else "; ".join(
                f"{records.DTYPE_LABEL.get(d, d)}: {c}" for d, c in picks[e.shape].items())])
    return Md(f"Suite `{st.name}` ({len(st.entries)} shapes, {len(st.cases())} cases; "
              f"`{_rel(st.path)}`). The last column is what `tirx_gemm.matmul` would run on "
              f"{arch} with {n} SMs (`matmul.choose`, computed now; nothing is timed here):\n\n"
              + _table(["M x N x K", "model", "layer", "dtypes", "matmul runs"], rows))


def _suite_latest(suite_name: str) -> dict:
    """(device, target, (M, N, K), dtype) -> the newest record of the suite run, from
    results/suites/*.jsonl (records carry a "suite" field: name, target, dtype, ...)."""
    recs = [r for r in records.load_records(results_dir() / "suites")
            if isinstance(r.get("suite"), dict) and r["suite"].get("name") == suite_name]
    recs.sort(key=lambda r: str(r.get("timestamp", "")))  # ISO UTC stamps; stable on ties
    out = {}
    for r in recs:
        out[(r["device"], r["suite"].get("target"), (int(r["M"]), int(r["N"]), int(r["K"])),
             r["suite"].get("dtype") or records.record_dtype(r))] = r
    return out


def suite_ratios(before: str | None = None, after: str | None = None, path=None) -> dict:
    """The suite's recorded ratios to torch.matmul (timed in the same run), per GPU: before
    (``before``, default the data-parallel step matmul falls back to, v9 alone) and after
    (``after``, default "matmul": the step matmul picks per shape). Returns {"suite": name,
    "before": target, "after": target, "devices": {device: [row, ...]}}, a row per suite
    case with at least one record: {"label", "shape", "dtype", "model", "before", "after"},
    each side the record or None. Nothing is estimated: no record, no row."""
    from tirx_gemm import matmul
    from tirx_gemm import suite as S
    st = S.load_suite(path)
    before = before or matmul.DATA_PARALLEL
    after = after or S.MATMUL
    latest = _suite_latest(st.name)
    devices = sorted({k[0] for k in latest if k[1] in (before, after)})
    out = {}
    for dev in devices:
        rows = []
        for e, dtype in st.cases():
            b = latest.get((dev, before, e.shape, dtype))
            a = latest.get((dev, after, e.shape, dtype))
            if b is None and a is None:
                continue
            rows.append({"label": f"{e.label} {records.DTYPE_LABEL.get(dtype, dtype)}",
                         "shape": e.shape, "dtype": dtype, "model": e.model,
                         "before": b, "after": a})
        out[dev] = rows
    return {"suite": st.name, "before": before, "after": after, "devices": out}


def _ratio(rec) -> float | None:
    if rec is None or not rec.get("verified"):
        return None
    r = rec.get("ratio_to_torch")
    return float(r) if isinstance(r, (int, float)) and r > 0 else None


def _suite_text(data: dict) -> str:
    from tirx_gemm import suite as S
    parts = []
    for dev, rows in data["devices"].items():
        def cell(rec):
            if rec is None:
                return "not run"
            if not rec.get("verified"):
                return "FAIL (check)"
            r = _ratio(rec)
            return "—" if r is None else f"{r:.2f}x"
        table = _table(["case", "model", f"before: {data['before']}", f"after: {data['after']}",
                        "after runs"],
                       [[r["label"], r["model"], cell(r["before"]), cell(r["after"]),
                         "" if r["after"] is None else
                         f"{r['after']['step']} {_kw(r['after'].get('build_kwargs') or {})}"]
                        for r in rows])
        lines = []
        for side in ("before", "after"):
            s = S.summarize([r[side] for r in rows if r[side] is not None])
            lines.append(f"- {side} ({data[side]}): " + (
                f"geomean {s['geomean_ratio']:.3f}x torch, min {s['min_ratio']:.3f}x "
                f"({s['min_case']}), over {s['n']} checked and timed case(s)" if s["n"]
                else "no checked and timed case"))
        parts.append(f"**{dev}**, suite `{data['suite']}`, ratio to torch.matmul timed in "
                     "the same run:\n\n" + table + "\n\n" + "\n".join(lines))
    return "\n\n".join(parts)


def _no_suite_records(data: dict) -> Md:
    return Md(f"**No H200 suite records yet:** `{_rel(results_dir() / 'suites')}/` holds no "
              f"record of suite `{data['suite']}` run as `{data['before']}` or "
              f"`{data['after']}` (they come from `tirx-gemm bench --suite --target T --record` "
              "on a GPU host, once per target). Nothing is plotted: no number here is estimated.")


def suite_plot(before: str | None = None, after: str | None = None, path=None):
    """Ratio to torch.matmul over the shape suite, before (v9 alone) and after (what
    matmul picks), one panel per GPU, from the recorded suite runs (``suite_ratios``).
    A PNG with matplotlib, else the table; without records, a message saying so."""
    data = suite_ratios(before, after, path)
    if not any(data["devices"].values()):
        return _no_suite_records(data)
    text = _suite_text(data)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return Md("matplotlib is not installed (`pip install -e '.[plot]'`): the recorded "
                  "suite results as a table instead.\n\n" + text)
    devs = [d for d, rows in data["devices"].items() if rows]
    width = max(8.0, 0.28 * max(len(data["devices"][d]) for d in devs) + 2)
    fig = Figure(figsize=(width, 3.6 * len(devs)), dpi=100)
    FigureCanvasAgg(fig)
    for i, dev in enumerate(devs):
        rows = data["devices"][dev]
        ax = fig.add_subplot(len(devs), 1, i + 1)
        xs = range(len(rows))
        for side, marker, color in (("before", "o", "tab:gray"), ("after", "D", "tab:orange")):
            pts = [(x, _ratio(r[side])) for x, r in zip(xs, rows) if _ratio(r[side])]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=22,
                           color=color, zorder=3, label=f"{side}: {data[side]}")
        ax.axhline(1.0, color="black", lw=0.8, ls="--", label="torch.matmul")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["label"] for r in rows], rotation=75, fontsize=7)
        ax.set_ylabel("ratio to torch (higher is better)")
        ax.set_title(f"{dev}: suite {data['suite']}, ratio to torch.matmul timed in the same "
                     "run", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return Png(buf.getvalue(), text)


# --------------------------------------------------------------------------------------
# the overview notebook: all steps at once
# --------------------------------------------------------------------------------------
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


def device_status() -> Md:
    """Which tracks can run on this machine."""
    rows = []
    for arch in registry.ARCHES:
        dev, why = _device_for(arch)
        rows.append([arch, f"yes: {dev['name']} (cc {dev['capability']})" if dev else
                     f"no: {why}"])
    return Md(_table(["arch", "runs here?"], rows))
