"""tirx_gemm's modules import each other without circles: the graph of
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
    if path.name == "__init__.py":  # a package's own level: `from .x import y` is its x
        here.append("__init__")

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
    """tirx_gemm/compile/cache.py -> "compile.cache"; a package's __init__ -> its package."""
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


def test_a_package_init_resolves_relative_imports_inside_the_package():
    """``from .fp8 import x`` in hopper/__init__.py is hopper/fp8.py (not tirx_gemm/op/fp8.py),
    ``from ..helpers import y`` is helpers.py."""
    deps = graph()["hopper"]
    assert {"hopper.fp8", "helpers"} <= deps and "fp8" not in deps, deps


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


# The layers of CONTRIBUTING.md's picture, bottom up: a module may import its own layer and
# the ones below it, never one above. "shared" is every top-level module not named here.
LAYERS = (
    ("shared", None),
    ("authoring", {"helpers", "blackwell", "hopper", "splitk", "timeline", "mutants"}),
    ("registry", {"registry"}),
    ("bundle format", {"bundle_format"}),  # read by run/ and matmul, written by compile/
    ("compile", {"compile"}),
    ("kernels", {"kernels"}),  # a kernel from a bundle (bundle format) or built (compile)
    ("run, report", {"run", "report"}),
    ("sim", {"sim"}),
    ("op", {"op"}),  # matmul, its rules and operands, fp8, nn, the torch op, suites
    ("entry points", {"notebook", "cli", "", "matmul", "nn", "torch_op"}),  # the public names
)
# within a layer of two: run and report must not import each other
APART = {("run", "report"), ("report", "run")}


def _layer(module: str) -> int:
    top = module.split(".")[0]
    for i, (_, members) in enumerate(LAYERS):
        if members and top in members:
            return i
    return 0


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    out = []
    for a, deps in sorted(g.items()):
        for b in sorted(deps):
            la, lb = _layer(a), _layer(b)
            pair = (a.split(".")[0], b.split(".")[0])
            if lb > la or pair in APART:
                out.append(f"{a} ({LAYERS[la][0]}) imports {b} ({LAYERS[lb][0]})")
    return out


def test_the_layer_check_finds_an_upward_import():
    assert upward_imports({"compile.api": {"run.runner"}, "run.runner": set()}) == [
        "compile.api (compile) imports run.runner (run, report)"]
    assert upward_imports({"run.runner": {"report.records"}, "report.records": set()})
    assert upward_imports({"sim.gate": {"compile.api"}, "compile.api": set()}) == []


def test_no_module_imports_a_layer_above_it():
    """The machinery stays below the entry points, and each subpackage below the ones that
    use it: compile < run, report < sim < matmul < torch_op, nn < suite, notebook, cli
    (CONTRIBUTING.md)."""
    bad = upward_imports(graph())
    assert not bad, "imports against the layers of CONTRIBUTING.md:\n" + "\n".join(bad)


def test_contributing_names_the_layers_in_this_order():
    """CONTRIBUTING.md's sentence on the layers is a copy of LAYERS: it must list the same
    names, bottom up, in the same order."""
    text = " ".join((PKG.parent / "CONTRIBUTING.md").read_text(encoding="utf-8").split())
    m = __import__("re").search(r"\(bottom up: ([^)]*)\)", text)
    assert m, "CONTRIBUTING.md no longer lists the layers '(bottom up: ...)'"
    written = [w.strip() for w in m.group(1).split(",")]
    assert written == [name.replace(", ", " and ") for name, _ in LAYERS], written


def compile_imports_of_the_run_side(g: dict[str, set[str]]) -> list[str]:
    """Every import of tirx_gemm/compile/ (any module of it) by a module under tirx_gemm/run/
    or by tirx_gemm/op/matmul.py, lazy ones too: they read bundles through
    tirx_gemm/bundle_format.py (below both the exporter and the run side) and get a kernel
    built here only through tirx_gemm/kernels.py (kernel_for), the one bridge to compile/."""
    readers = [m for m in g if m.split(".")[0] == "run" or m == "op.matmul"]
    return [f"{a} imports {b}" for a in sorted(readers) for b in sorted(g[a])
            if b.split(".")[0] == "compile"]


def test_the_compile_check_finds_a_planted_import():
    assert compile_imports_of_the_run_side(
        {"run.loader": {"compile.bundle"}, "compile.bundle": set()}) == [
        "run.loader imports compile.bundle"]
    assert compile_imports_of_the_run_side({"run.measure": {"compile.api"}}) == [
        "run.measure imports compile.api"]
    assert compile_imports_of_the_run_side({"run.loader": {"bundle_format", "kernels"}}) == []


def test_the_run_side_reads_bundles_without_compile():
    """A GPU host reads bundles through tirx_gemm/bundle_format.py and gets every kernel
    through tirx_gemm/kernels.py: nothing under run/ (nor matmul.py) imports compile/, even
    lazily."""
    bad = compile_imports_of_the_run_side(graph())
    assert not bad, "the run side imports compile/:\n" + "\n".join(bad)
