"""Code-only views of source text: a builder's code lines, their diff, a CUDA kernel's skeleton.

Standard library only, no registry: the notebooks' source cells (``tirx_gemm.notebook``) and
``scripts/diff_sizes.py`` (how big each lesson's diff is) read steps through the same rules,
so a diff the notebook shows and a size the script counts are of the same lines.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize

__all__ = ["code_lines", "code_diff", "diff_counts", "changed_lines", "kernel_body",
           "cuda_skeleton"]


# --------------------------------------------------------------------------------------
# Python: the code lines of a builder, and the code-only diff of two
# --------------------------------------------------------------------------------------
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


def _matcher(a: list[str], b: list[str]) -> difflib.SequenceMatcher:
    return difflib.SequenceMatcher(None, a, b, autojunk=False)


def code_diff(old_source: str, new_source: str, old_name: str, new_name: str, *,
              context: int = 3) -> str:
    """The unified diff of two Python sources' code lines (``code_lines``: no comments,
    docstrings or blank lines). Each hunk header gives the original line ranges of both
    files and the parts of the new file (or, for a pure deletion, the old one) it touches."""
    a, b = code_lines(old_source), code_lines(new_source)
    sec_a, sec_b = _sections(old_source), _sections(new_source)
    sm = _matcher([t for _, t in a], [t for _, t in b])
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


def diff_counts(diff: str) -> tuple[int, int, int]:
    """(added, removed, hunks) of a ``code_diff``."""
    lines = diff.splitlines()
    body = [ln for ln in lines[2:] if not ln.startswith("@@")]
    return (sum(ln.startswith("+") for ln in body), sum(ln.startswith("-") for ln in body),
            sum(ln.startswith("@@") for ln in lines))


def changed_lines(old_source: str, new_source: str) -> int:
    """Code lines added plus removed between two Python sources: the size of the diff that
    ``code_diff`` shows (scripts/diff_sizes.py's measure of a lesson)."""
    a = [t for _, t in code_lines(old_source)]
    b = [t for _, t in code_lines(new_source)]
    return sum((i2 - i1) + (j2 - j1) for tag, i1, i2, j1, j2 in _matcher(a, b).get_opcodes()
               if tag != "equal")


# --------------------------------------------------------------------------------------
# CUDA: the generated kernel's body and its skeleton (what a lesson is about)
# --------------------------------------------------------------------------------------
SKELETON = re.compile(
    r"__global__|\bfor \(|\bwhile \(|\bif \(|\belse\b|break;|mbarrier|setmaxnreg"
    r"|tcgen05_(mma|commit|ld|alloc|dealloc)|wgmma_(f16|fence|commit|wait)|cp_async_bulk"
    r"|cta_sync|warpgroup_sync|elect_one|fence_proxy|phase\w*\[0\] =|stage\w*\[0\] ="
    r"|^\s*}\s*$")
_CALL = re.compile(r"^\s*(?:[\w:<>*]+\s+)?([A-Za-z_]\w*)\s*\(")


def kernel_body(src: str) -> list[str]:
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


def cuda_skeleton(body: list[str]) -> list[str]:
    """A kernel body's control flow, barriers, MMA issue, TMA and fences, with blocks left
    empty dropped and runs of identical calls folded into one line and a count."""
    return _collapse_repeats(_prune_empty_blocks([ln for ln in body if SKELETON.search(ln)]))
