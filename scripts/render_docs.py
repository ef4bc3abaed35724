#!/usr/bin/env python
"""Fill the lessons' (and the lab's) generated figures from their homes (one home per fact).

    python scripts/render_docs.py [--check]

Two kinds of marked places in steps/lessons/vN.md, each an HTML comment pair around the
value (invisible when the Markdown is rendered, readable in the source):

- a barrier table's count cell, ``<!-- count -->`CTA_PAIR * 128` = 256<!-- /count -->``:
  the arrival count of the one mbarrier the row names, as the step's builder declares it
  (a full/empty ``H.Ring(...)``, ``H.Barriers(...)`` with ``.init(n)``, v10's
  ``W.ClusterLaunchControl(...)``), evaluated with the builder's defaults; the row's arch
  is its section's ("## Barriers: sm_100a"); ``<!-- count hgemm_v14_mx tma2mma -->`1 + 32` =
  33<!-- /count -->`` anywhere in that section: the count of that mbarrier as a second
  builder of the step's file (another mode's kernel, ``hgemm_<step>_*``) declares it;
- a build figure, ``<!-- build:smem_kib v7@sm_100a -->161<!-- /build -->``: a field of
  the step's canonical build in goldens/expectations/build.json (``tirx-gemm regress
  --cpu --update``): smem_kib (shared memory per CTA, KiB rounded), registers, threads,
  setmaxnreg_dec, setmaxnreg_inc, reg_cap (the register cap at the build's threads,
  64K / threads rounded down to 8).

- a measured figure, ``<!-- rec:lab/cost_model_fit/records/v10_suite_graph_h200.jsonl M=4096,N=4096,K=512
  ratio .2f -->1.16<!-- /rec -->``: a field of the LAST record of that JSON-lines file
  whose keys equal the selectors (``key=value`` pairs, comma-separated; ``-`` for none),
  a dotted path into the record (``candidates.64x128p.ratio``), formatted by the Python
  format spec. These also fill README.md, the guides in docs/*.md and the lab's READMEs (lab/*/README.md): the
  figures their prose quotes from the H200 runs come from the records themselves; a
  marker's header may break over lines between its four fields. A selector's key may be a dotted path too
  (``build_kwargs.SWAP_AB=true``); its value is read as JSON where it parses (numbers,
  ``true``, ``false``, ``null``), else as a string; ``key!=value`` excludes, and
  ``key^=prefix`` matches a string that starts so (``timestamp^=2026-12-01T04``: one run); a
  value is %-decoded (``impl=v13%20tensor``: a space). The field may be a quotient of two
  paths of the same record (``ms.plain/ms.fused``), and may start with an aggregate over
  EVERY matching record instead of the last one: ``min:``, ``max:``, ``median:``,
  ``mean:`` or ``geomean:`` (``median:ratio_to_torch``: the median of three passes), or
  be ``count`` (how many records match). A field's path is %-decoded too
  (``host_us_per_call.bare%20launch``). A format that starts with ``pct`` prints a ratio
  as a percentage change, (value - 1) * 100 (``pct.0f``: 1.06 gives 6), ``-pct`` as
  (1 - value) * 100 (0.92 gives 8: what a speed ratio below 1 costs); one that starts
  with ``us`` prints milliseconds as microseconds (``us.0f``: 0.1187 gives 119). A one-line JSON file
  is one record (the recorded timelines, ``results/timelines/*.json``).

lab/README.md, the lab's index, is generated from the studies' READMEs (each one's title,
"Question:" and "Decision:" paragraphs).

Without --check the lessons (and README.md, the lab's READMEs and index) are rewritten in place. With --check nothing is written: the
exit status is 1 when a lesson is stale (each stale file named), 2 when a marker cannot be
filled (the reason named). A step card (a builder's docstring) holds no markers: it points
at its lesson for a build figure.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import statistics
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LESSONS_DIR = ROOT / "steps" / "lessons"
EXPECTATIONS_PATH = ROOT / "goldens" / "expectations" / "build.json"

COUNT = re.compile(r"<!-- count -->(.*?)<!-- /count -->")
COUNT_OF = re.compile(r"<!-- count (\w+) (\w+) -->(.*?)<!-- /count -->")
BUILD = re.compile(r"<!-- build:(\w+) (v\d+)@(sm_\w+) -->(.*?)<!-- /build -->")
# the header's four fields may be split over lines (a long sentence breaks inside the comment,
# where a reader of the rendered page sees nothing); the value stays on one line
REC = re.compile(r"<!-- rec:(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*-->(.*?)<!-- /rec -->", re.S)
README_PATH = ROOT / "README.md"
DOCS_DIR = ROOT / "docs"
LAB_DIR = ROOT / "lab"
LAB_INDEX = LAB_DIR / "README.md"
BUILD_FIELDS = ("smem_kib", "registers", "threads", "setmaxnreg_dec", "setmaxnreg_inc",
                "reg_cap")

# how a builder declares its mbarriers
_DECL = re.compile(r'(\w+) = H\.Barriers\([^)]*"(\w+)"\)')
_INIT = re.compile(r"(\w+)\.init\(([^)]*)\)")
# a full/empty ring declares both barriers and both counts in one call
_RING = re.compile(r'= H\.Ring\(\s*\w+,\s*[^,]+,\s*"(\w+)",\s*([^,]+),\s*"(\w+)",\s*([^)]+)\)')
# v10's scheduler object: its barriers' names and full count are the class's, the readers'
# count is the kernel's argument
_CLC = re.compile(r'= W\.ClusterLaunchControl\(\s*\w+,\s*([^,)]+)')


class RenderError(ValueError):
    """A marker that cannot be filled: the text says where and why."""


# --------------------------------------------------------------------------------------
# barrier declarations
# --------------------------------------------------------------------------------------
def _builder_fn(src: str, builder) -> ast.FunctionDef:
    # the builder's own function: a file may hold a second builder for another mode
    # (sm_100a v13's MXFP8 kernel, on v7's skeleton) with its own barriers
    return next(n for n in ast.walk(ast.parse(src))
                if isinstance(n, ast.FunctionDef) and n.name == builder.__name__)


def builder_constants(src: str, builder, caller: dict | None = None) -> dict:
    """The builder's defaults and the plain constants its body assigns before the kernel
    (``CTA_PAIR = W.CTA_PAIR``, ``CLC_READERS = CTA_PAIR * (32 + 32 + 128) + 32``), evaluated
    in order; an assignment that needs more than those is skipped. ``caller``: a second
    builder's names come first from the step builder that calls it (its defaults)."""
    from tirx_gemm import blackwell, helpers, hopper
    ns = {**(caller or {}), "W": blackwell if "blackwell as W" in src else hopper, "H": helpers}
    ns.update({k: p.default for k, p in inspect.signature(builder).parameters.items()
               if p.default is not inspect.Parameter.empty})
    for node in _builder_fn(src, builder).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            try:
                value = eval(compile(ast.Expression(node.value), "<builder>", "eval"), ns)
            except Exception:
                continue
            target = node.targets[0]
            if isinstance(target, ast.Name):
                ns[target.id] = value
            elif isinstance(target, ast.Tuple) and isinstance(value, tuple):
                ns.update({t.id: v for t, v in zip(target.elts, value)
                           if isinstance(t, ast.Name)})
    return ns


def step_source(step) -> str:
    return (ROOT / "steps" / step.arch.replace("_", "") / f"hgemm_{step.id}.py").read_text(
        encoding="utf-8")


def builders(step) -> list:
    """The step's builder, then each second builder its file defines for another mode
    (``hgemm_v14_mx``: functions named ``hgemm_<step>_*``), in file order."""
    import importlib
    mod = importlib.import_module(step.module)
    return [step.builder()] + [getattr(mod, n.name) for n in ast.parse(step_source(step)).body
                               if isinstance(n, ast.FunctionDef)
                               and n.name.startswith(f"hgemm_{step.id}_")]


def builder_ns(step, builder) -> dict:
    """builder_constants of one of builders(step); a second one's seeded with the step's."""
    src = step_source(step)
    ns = builder_constants(src, step.builder())
    return ns if builder is step.builder() else builder_constants(src, builder, ns)


def declared_counts(step, builder=None) -> dict[str, str | None]:
    """{mbarrier name: the expression of its arrival count (None: not found)} as the step's
    builder (or ``builder``, one of builders(step)) declares them."""
    src = step_source(step)
    fn = _builder_fn(src, builder or step.builder())
    body = ast.get_source_segment(src, fn)
    inits = dict(_INIT.findall(body))
    counts = {name: inits.get(var) for var, name in _DECL.findall(body)}
    for full, full_count, empty, empty_count in _RING.findall(body):
        counts[full], counts[empty] = full_count.strip(), empty_count.strip()
    for readers in _CLC.findall(body):
        from tirx_gemm.blackwell import ClusterLaunchControl as CLC
        counts[CLC.FULL] = str(CLC.FULL_COUNT)
        counts[CLC.EMPTY] = readers.strip()
    return counts


def count_value(step, expr: str, ns: dict | None = None) -> int:
    ns = builder_constants(step_source(step), step.builder()) if ns is None else ns
    value = eval(expr, ns)
    if not isinstance(value, int):
        raise RenderError(f"{step.key}: arrival count {expr!r} is not an int ({value!r})")
    return value


def count_text(expr: str, value: int) -> str:
    """What a count cell shows: the value, with the builder's expression when it is one."""
    return str(value) if expr.strip() == str(value) else f"`{expr}` = {value}"


def row_mbarriers(first_cell: str, counts: dict) -> list[str]:
    """The declared mbarriers a table row's first cell names (`name` or `name[s]`)."""
    return [n for n in re.findall(r"`(\w+)(?:\[[^\]]*\])?`", first_cell) if n in counts]


def barrier_sections(text: str):
    """(arch, start, end) of each "## Barriers: <arch>" section of a lesson."""
    for m in re.finditer(r"^## Barriers: (sm_\w+)\n(.*?)(?=^## |\Z)", text, re.S | re.M):
        yield m.group(1), m.start(2), m.end(2)


def _render_counts(step_id: str, text: str, where: str) -> str:
    from tirx_gemm import registry
    out, pos = [], 0
    for arch, start, end in barrier_sections(text):
        section = text[start:end]
        if "<!-- count" not in section:
            continue
        step = registry.get(step_id, arch)
        counts = declared_counts(step)
        ns = builder_constants(step_source(step), step.builder())
        lines = section.split("\n")
        for i, line in enumerate(lines):
            if "<!-- count -->" not in line:
                continue
            cells = line.split("|")
            names = row_mbarriers(cells[1], counts) if len(cells) > 2 else []
            if len(names) != 1:
                raise RenderError(f"{where} (Barriers: {arch}): a count marker in a row that "
                                  f"names {len(names)} declared mbarriers: {line[:80]!r}")
            expr = counts[names[0]]
            if expr is None:
                raise RenderError(f"{where}: {step.key} declares {names[0]} without a count")
            text_ = count_text(expr, count_value(step, expr, ns))
            lines[i] = COUNT.sub(lambda m: f"<!-- count -->{text_}<!-- /count -->", line)
        out.append(text[pos:start] + COUNT_OF.sub(
            lambda m: _count_of(step, m.group(1), m.group(2), where), "\n".join(lines)))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _count_of(step, builder_name: str, name: str, where: str) -> str:
    # a second builder's count marker, filled (see the module's docstring)
    builder = next((b for b in builders(step)[1:] if b.__name__ == builder_name), None)
    expr = None if builder is None else declared_counts(step, builder).get(name)
    if expr is None:
        raise RenderError(f"{where}: {step.key} has no second builder {builder_name} that "
                          f"declares {name} with a count")
    value = count_value(step, expr, builder_ns(step, builder))
    return f"<!-- count {builder_name} {name} -->{count_text(expr, value)}<!-- /count -->"


# --------------------------------------------------------------------------------------
# build figures
# --------------------------------------------------------------------------------------
def build_figure(expectations: dict, step_id: str, arch: str, field: str) -> int:
    from tirx_gemm import registry
    step = registry.get(step_id, arch)
    key = f"{step.key}:{'x'.join(map(str, step.canonical))}"
    entry = expectations.get(key)
    if entry is None:
        raise RenderError(f"{key}: no build expectation recorded in "
                          f"{EXPECTATIONS_PATH.relative_to(ROOT)}")
    split = entry.get("setmaxnreg") or {}
    if field == "smem_kib":
        return round(entry["smem_bytes"] / 1024)
    if field in ("registers", "threads"):
        return entry[field]
    if field == "reg_cap":
        return 65536 // entry["threads"] // 8 * 8
    if field in ("setmaxnreg_dec", "setmaxnreg_inc"):
        values = split.get(field.split("_")[1]) or []
        if len(values) != 1:
            raise RenderError(f"{key}: setmaxnreg {field.split('_')[1]} is {values!r}, not "
                              "one value")
        return values[0]
    raise RenderError(f"unknown build field {field!r} (one of {', '.join(BUILD_FIELDS)})")


def _render_build(text: str, expectations: dict) -> str:
    return BUILD.sub(lambda m: (f"<!-- build:{m.group(1)} {m.group(2)}@{m.group(3)} -->"
                                f"{build_figure(expectations, m.group(2), m.group(3), m.group(1))}"
                                "<!-- /build -->"), text)


# --------------------------------------------------------------------------------------
# measured figures
# --------------------------------------------------------------------------------------
def _selector_value(text: str):
    text = unquote(text)
    try:
        return json.loads(text)
    except ValueError:
        return text


def _path(rec, dotted: str):
    """The value at a dotted path of a record (a key may hold dots itself:
    ``ratio_to_linear.tirx_gemm.matmul``); KeyError when a part is missing."""
    value, parts = rec, dotted.split(".")
    while parts:
        for n in range(len(parts), 0, -1):
            if isinstance(value, dict) and ".".join(parts[:n]) in value:
                value, parts = value[".".join(parts[:n])], parts[n:]
                break
        else:
            raise KeyError(dotted)
    return value


_SELECTOR = re.compile(r"([\w.]+)(=|!=|\^=)(.*)")


def _selector(text: str):
    """``key=value``, ``key!=value`` or ``key^=prefix`` (the value a string starting so)."""
    m = _SELECTOR.fullmatch(text)
    if m is None:
        raise RenderError(f"rec marker: bad selector {text!r} (key=value, key!=value or "
                          "key^=prefix)")
    key, op, value = m.groups()
    return key, op, unquote(value) if op == "^=" else _selector_value(value)


def _matches(rec: dict, want: list) -> bool:
    for key, op, value in want:
        try:
            got = _path(rec, key)
        except KeyError:
            if op == "!=":
                continue
            return False
        if op == "=" and got != value or op == "!=" and got == value or (
                op == "^=" and not (isinstance(got, str) and got.startswith(value))):
            return False
    return True


AGGREGATES = {
    "min": min, "max": max,
    "median": lambda xs: statistics.median(xs),
    "mean": lambda xs: statistics.fmean(xs),
    "geomean": lambda xs: statistics.geometric_mean(xs),
}


def record_figure(path: str, selectors: str, field: str, fmt: str, root: Path = ROOT) -> str:
    """``field`` (a dotted path, or ``a/b`` a quotient of two) of the last record in ``path``
    matching ``selectors``; with an ``AGG:`` prefix, that aggregate over every matching
    record; ``count``: how many match."""
    src = root / path
    if not src.is_file():
        raise RenderError(f"rec marker: {path} does not exist")
    want = [] if selectors == "-" else [_selector(x) for x in selectors.split(",")]
    found = [rec for rec in (json.loads(line) for line in
                             src.read_text(encoding="utf-8").splitlines() if line.strip())
             if _matches(rec, want)]
    if not found:
        raise RenderError(f"rec marker: no record of {path} has {selectors}")
    if field == "count":
        return format(len(found), fmt)
    agg, _, expr = field.rpartition(":")
    if agg and agg not in AGGREGATES:
        raise RenderError(f"rec marker: unknown aggregate {agg!r} (one of "
                          f"{', '.join(AGGREGATES)})")

    def value_of(rec):
        try:
            parts = [_path(rec, unquote(p)) for p in expr.split("/")]
        except KeyError:
            raise RenderError(f"rec marker: {'a' if agg else 'the last'} record of {path} "
                              f"with {selectors} has no {expr}") from None
        if len(parts) == 1:
            return parts[0]
        if len(parts) != 2:
            raise RenderError(f"rec marker: {expr!r}: one quotient at most")
        return parts[0] / parts[1]

    value = AGGREGATES[agg]([value_of(r) for r in found]) if agg else value_of(found[-1])
    return format_figure(value, fmt)


def format_figure(value, fmt: str) -> str:
    """``format(value, fmt)``; ``pct<spec>``: the ratio as a change in percent,
    (value - 1) * 100; ``-pct<spec>``: (1 - value) * 100; ``us<spec>``: milliseconds as
    microseconds."""
    if fmt.startswith("us"):
        return format(value * 1e3, fmt[2:])
    sign, pct, spec = fmt.partition("pct")
    if pct and sign in ("", "-"):
        value = (value - 1) * 100 * (-1 if sign else 1)
        fmt = spec
    return format(value, fmt)


REC_OPEN = re.compile(r"<!-- rec:[^>]*-->")


def _render_records(text: str, root: Path = ROOT) -> str:
    # a marker REC cannot parse (a missing selector: "-" means every record) would be left
    # as typed, unrendered and unchecked; refuse it instead
    for m in REC_OPEN.finditer(text):
        if not REC.match(text, m.start()):
            raise RenderError(f"rec marker: {m.group(0)!r} is not 'rec:PATH SELECTORS FIELD "
                              "FORMAT' (SELECTORS '-' for every record)")
    return REC.sub(lambda m: (m.group(0)[:m.start(5) - m.start()]
                              + f"{record_figure(*m.group(1, 2, 3, 4), root=root)}<!-- /rec -->"),
                   text)


# --------------------------------------------------------------------------------------
def render_lesson(path: Path, expectations: dict | None = None) -> str:
    """The lesson at ``path`` (or README.md) with every marker filled from its home."""
    expectations = load_expectations() if expectations is None else expectations
    text = path.read_text(encoding="utf-8")
    if (path.resolve() == README_PATH.resolve() or LAB_DIR.resolve() in path.resolve().parents
            or path.resolve().parent == DOCS_DIR.resolve()):
        return _render_records(text)
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    return _render_records(_render_build(_render_counts(path.stem, text, rel), expectations))


def load_expectations() -> dict:
    return json.loads(EXPECTATIONS_PATH.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------
# the lab's index: generated from the studies' READMEs
# --------------------------------------------------------------------------------------
def study_parts(path: Path) -> dict:
    """A study README's parts: its title (the first line, "# ..."), and the paragraphs that
    start "Question:", "Command:" and "Decision:" (a paragraph ends at a blank line); a part
    that is missing is absent from the dict."""
    lines = path.read_text(encoding="utf-8").split("\n")
    parts = {}
    if lines and lines[0].startswith("# "):
        parts["title"] = lines[0][2:].strip()
    for para in re.split(r"\n\s*\n", "\n".join(lines)):
        for key in ("Question", "Command", "Decision"):
            if para.startswith(key + ":"):
                parts[key.lower()] = " ".join(para[len(key) + 1:].split())
    return parts


def _wrapped(text: str, width: int = 200) -> list[str]:
    import textwrap
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


def lab_index(root: Path = ROOT) -> str:
    """lab/README.md: every study folder of lab/, its title, question and decision, as the
    study's own README states them."""
    out = ["# The lab", "",
           "One folder per study, named by the question it asks. Each holds a README (the question, the shapes,",
           "the command that reruns it, a table rendered from its records, the decision), its suites, scripts,",
           "records and logs. This index is generated from those READMEs by `python scripts/render_docs.py`;",
           "`--check` fails when it or a study's figures are stale.", ""]
    for d in sorted(p for p in (root / "lab").iterdir() if p.is_dir()):
        readme = d / "README.md"
        parts = study_parts(readme) if readme.is_file() else {}
        out += [f"## [{parts.get('title', d.name)}]({d.name}/README.md)", ""]
        out += _wrapped(f"Question: {parts.get('question', '(no README)')}") + [""]
        out += _wrapped(f"Decision: {parts.get('decision', '(no README)')}") + [""]
    return "\n".join(out)


def lab_readmes(root: Path = ROOT) -> list[Path]:
    return sorted((root / "lab").glob("*/README.md"))


def stale(expectations: dict | None = None) -> list[Path]:
    """The lessons (and README.md, the lab's READMEs and its index) whose generated parts do
    not hold what their homes say."""
    expectations = load_expectations() if expectations is None else expectations
    out = [p for p in [*sorted(LESSONS_DIR.glob("v*.md")), README_PATH, *sorted(DOCS_DIR.glob("*.md")),
                       *lab_readmes()]
           if render_lesson(p, expectations) != p.read_text(encoding="utf-8")]
    if not LAB_INDEX.is_file() or LAB_INDEX.read_text(encoding="utf-8") != lab_index():
        out.append(LAB_INDEX)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a lesson is stale")
    args = ap.parse_args(argv)
    try:
        expectations = load_expectations()
        changed = stale(expectations)
        if args.check:
            for p in changed:
                print(f"stale: {p.relative_to(ROOT)} (run python scripts/render_docs.py)")
            return 1 if changed else 0
        for p in changed:
            p.write_text(lab_index() if p == LAB_INDEX else render_lesson(p, expectations),
                         encoding="utf-8")
            print(f"wrote {p.relative_to(ROOT)}")
    except RenderError as e:
        print(f"render_docs: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
