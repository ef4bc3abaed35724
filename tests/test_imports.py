"""tirx_gemm's modules import each other without circles (issue 20): the graph of
``tirx_gemm.X`` imports (at module level and inside functions alike: a lazy import is still a
dependency) has no cycle."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "tirx_gemm"
KNOWN: set = set()


def _imports(path: Path) -> set[str]:
    """The tirx_gemm modules ``path`` imports anywhere in its code."""
    out = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("tirx_gemm."):
                        out.add(a.name.split(".")[1])
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level == 1:  # from . import x / from .x import y
                    out.update([mod.split(".")[0]] if mod else [a.name for a in node.names])
                elif mod == "tirx_gemm":
                    out.update(a.name for a in node.names)
                elif mod.startswith("tirx_gemm."):
                    out.add(mod.split(".")[1])
    visit(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
    return out


def graph() -> dict[str, set[str]]:
    mods = {p.stem for p in PKG.glob("*.py")}
    return {p.stem: {m for m in _imports(p) if m in mods and m != p.stem}
            for p in PKG.glob("*.py")}


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
