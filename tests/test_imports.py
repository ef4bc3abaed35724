"""tirx_gemm's modules import each other without circles (issue 20): the graph of
``tirx_gemm.X`` imports (at module level and inside functions alike: a lazy import is still a
dependency) has no cycle."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "tirx_gemm"
KNOWN: set = set()


def _imports(path: Path) -> set[str]:
    """The tirx_gemm modules ``path`` imports anywhere in its code, as dotted names below
    tirx_gemm ("registry", "compile.cache"); ``from tirx_gemm.compile import cache`` names
    "compile.cache" (a module) or "compile" (a name in the package), whichever exists."""
    out = set()
    here = _name(path).split(".")

    def add(dotted: str, names=()):
        for n in names:
            out.add(f"{dotted}.{n}" if dotted else n)
        if dotted:
            out.add(dotted)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("tirx_gemm."):
                    add(a.name[len("tirx_gemm."):])
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                base = ".".join(here[:len(here) - node.level])
                add(".".join(x for x in (base, mod) if x), [a.name for a in node.names])
            elif mod == "tirx_gemm":
                add("", [a.name for a in node.names])
            elif mod.startswith("tirx_gemm."):
                add(mod[len("tirx_gemm."):], [a.name for a in node.names])
    return out


def _name(p: Path) -> str:
    """tirx_gemm/compile/cache.py -> "build.cache"; a package's __init__ -> its package."""
    parts = p.relative_to(PKG).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph() -> dict[str, set[str]]:
    files = {_name(p): p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}
    return {name: {m for m in _imports(p) if m in files and m != name}
            for name, p in files.items()}


def tangles(g: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan): each is a set
    of modules that reach each other through imports, i.e. one or more import circles."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def _path(g, a, b):
    """One import path a -> ... -> b (breadth first), for the message."""
    prev, todo = {a: None}, [a]
    while todo:
        v = todo.pop(0)
        for w in sorted(g[v]):
            if w not in prev:
                prev[w] = v
                todo.append(w)
    out, v = [b], b
    while prev.get(v) is not None:
        v = prev[v]
        out.append(v)
    return out[::-1]


def test_tangle_finder_finds_a_planted_cycle():
    assert tangles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert tangles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    g = graph()
    found = [c for c in tangles(g) if frozenset(c) not in KNOWN]
    lines = []
    for comp in found:
        first = min(comp)
        back = next(w for w in sorted(comp) if first in g[w])
        circle = _path({v: g[v] & comp for v in comp}, first, back) + [first]
        lines.append(f"{{{', '.join(sorted(comp))}}}, e.g. {' -> '.join(circle)}")
    assert not found, "modules that import each other in a circle:\n" + "\n".join(lines)
