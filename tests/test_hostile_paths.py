"""Every module path and file name the package writes as a string names something that exists:
a module moved without its string following it must fail here, not silently
(the CLI's error lookup named tirx_gemm.device after it moved to run/, and the cache key
skipped build/pipeline.py after it moved to compile/)."""
import ast
import re
from pathlib import Path

import pytest

from tirx_gemm import registry
from tirx_gemm.compile import cache

PKG = Path(__file__).resolve().parent.parent / "tirx_gemm"
ROOT = PKG.parent

MODULE = re.compile(r"tirx_gemm(\.\w+)+(:\w+)?")
FILE = re.compile(r"[\w.-]+(/[\w.-]+)*\.(py|json|jsonl|c|toml|sh|tgz|tsv|md)")
# strings of that form that are not paths of this checkout, each with why
NOT_PATHS = {
    "tirx_gemm.resident_clusters": "a PrimFunc attribute name (sim/runcase.py)",
    "kernel.tir.py": "an artefact a build writes",
    "meta.json": "an artefact a build writes",
    "error.json": "what a failed build worker writes",
    "manifest.json": "what an export writes",
    "cards.json": "the card record an export writes beside its manifest",
    "helpers_mutant.py": "a mutant's generated helpers",
    "tirx_gemm.mutant_blackwell_": "the name prefix of that copy, loaded inside the package",
    "_mutant.py": "the suffix of a mutant's generated step file",
    "config.toml": "the cargo config inside vendor/numsim/cargo-vendor.tgz",
}


def _strings():
    """(file, line, text, built) of every string constant in the package; an f-string as its
    constant head (the part before the first placeholder), ``built`` True when a
    placeholder follows it directly (f"tirx_gemm.{name}": a name made from pieces)."""
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield path, node.lineno, node.value, False
            elif isinstance(node, ast.JoinedStr) and len(node.values) > 1 \
                    and isinstance(node.values[0], ast.Constant) \
                    and isinstance(node.values[1], ast.FormattedValue):
                yield path, node.lineno, node.values[0].value, True


def _module_file(dotted: str) -> Path | None:
    parts = dotted.split(".")[1:]
    for cand in (PKG.joinpath(*parts).with_suffix(".py"), PKG.joinpath(*parts, "__init__.py")):
        if cand.is_file():
            return cand
    return None


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name
                                                    for a in node.names):
            return True
    return False


def test_every_module_string_names_a_module_and_attribute_that_exist():
    bad = []
    for path, line, text, _ in _strings():
        if not MODULE.fullmatch(text) or text in NOT_PATHS:
            continue
        module, _, attr = text.partition(":")
        found = _module_file(module)
        where = f"{path.relative_to(ROOT)}:{line} {text!r}"
        if found is None:
            bad.append(f"{where}: no module {module}")
        elif attr and not _defines(found, attr):
            bad.append(f"{where}: {module} defines no {attr}")
    assert not bad, "\n".join(bad)


# module names built from pieces, each with the test that checks every name it can build
BUILT_NAMES = {("registry.py", "tirx_gemm.steps."): "test_every_step_module_resolves",
               ("__init__.py", "tirx_gemm."): "test_every_lazy_package_attribute_resolves"}


def test_no_module_name_is_built_from_pieces():
    """f"tirx_gemm.{mod}" cannot be checked by the test above: name modules whole, or list
    the place in BUILT_NAMES with a test that checks every name it builds."""
    built = [f"{p.relative_to(ROOT)}:{line}" for p, line, text, fstring in _strings()
             if fstring and re.fullmatch(r"tirx_gemm(\.\w+)*\.", text)
             and (str(p.relative_to(PKG)), text) not in BUILT_NAMES]
    assert not built, built


def test_every_lazy_package_attribute_resolves():
    """tirx_gemm/__init__.py's __getattr__ imports f"tirx_gemm.{name}" for the names it
    lists in ``name in (...)``: each must be a module."""
    tree = ast.parse((PKG / "__init__.py").read_text(encoding="utf-8"))
    listed = [elt.value for node in ast.walk(tree) if isinstance(node, ast.Compare)
              and isinstance(node.left, ast.Name) and node.left.id == "name"
              and isinstance(node.ops[0], ast.In) and isinstance(node.comparators[0], ast.Tuple)
              for elt in node.comparators[0].elts if isinstance(elt, ast.Constant)]
    assert listed
    missing = [n for n in listed if _module_file(f"tirx_gemm.{n}") is None]
    assert not missing, missing


def test_every_step_module_resolves():
    import importlib.util
    for step in registry.STEPS:
        assert importlib.util.find_spec(step.module) is not None or \
            Path(step.source_file).is_file(), f"{step.key}: {step.module}"
        assert Path(step.source_file).is_file(), step.key


def test_every_file_string_names_a_file_of_the_checkout():
    """A relative path or file name written in the package is found below the package, the
    repository root or the folder of the file that names it (or is listed in NOT_PATHS as
    something a run writes)."""
    bad = []
    for path, line, text, fstring in _strings():
        if fstring or not FILE.fullmatch(text) or text in NOT_PATHS:
            continue
        here = [PKG / text, ROOT / text, path.parent / text]
        # a bare name joined onto a folder in code (Path(...) / "stub" / "libcuda_stub.c")
        if "/" not in text:
            here += [p for top in (PKG, ROOT / "goldens", ROOT / "results", ROOT / "vendor")
                     for p in top.rglob(text)]
        if not any(p.exists() for p in here):
            bad.append(f"{path.relative_to(ROOT)}:{line} {text!r}")
    assert not bad, "\n".join(bad)


def test_key_sources_exist_for_every_step():
    for arch, names in cache.KEY_SOURCES.items():
        for name in names:
            assert (cache.PKG_DIR / name).is_file(), f"KEY_SOURCES[{arch}] names {name}"
    for step in registry.STEPS:
        for source in cache.key_sources(step):
            assert source.is_file(), f"{step.key}: key source {source} does not exist"


@pytest.mark.parametrize("arch,package", [("sm_90a", "hopper"), ("sm_100a", "blackwell")])
def test_the_key_covers_every_module_of_the_arch_package(arch, package):
    """hopper/ and blackwell/ are one module per job: a module added there
    without joining KEY_SOURCES would leave that arch's builds cached on its old bytes."""
    listed = set(cache.KEY_SOURCES[arch])
    modules = {f"{package}/{p.name}" for p in (cache.PKG_DIR / package).glob("*.py")}
    assert modules and modules <= listed, sorted(modules - listed)


@pytest.mark.parametrize("arch", sorted(cache.KEY_SOURCES))
def test_the_key_covers_every_module_a_builder_reaches(arch):
    """Every tirx_gemm module a step builder of ``arch`` imports, directly or through the
    modules it imports (splitk, streamk, pdl, epilogue, spec, ...), is a key source: a
    change there changes the kernels, so it must change the key (streamk.py and splitk.py
    were once left out)."""
    import ast
    listed = set(cache.KEY_SOURCES[arch])
    pkg = cache.PKG_DIR

    def imported(path):
        out = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = node.module
                if node.level:  # relative, inside a subpackage of tirx_gemm
                    base = path.parent.relative_to(pkg).parts[:max(0, len(
                        path.parent.relative_to(pkg).parts) - node.level + 1)]
                    mod = ".".join(("tirx_gemm", *base, mod))
                if mod == "tirx_gemm":
                    out |= {f"tirx_gemm.{a.name}" for a in node.names}
                elif mod.startswith("tirx_gemm."):
                    out.add(mod)
        return out

    def files(mod):
        rel = mod.split(".")[1:]
        if rel[:1] == ["steps"]:
            return []
        f = pkg.joinpath(*rel)
        if f.is_dir():
            return [f / "__init__.py", *sorted(f.glob("*.py"))]
        return [f.with_suffix(".py")] if f.with_suffix(".py").is_file() else []

    todo = [p for p in (cache.PKG_DIR.parent / "steps" / arch.replace("_", "")).glob("hgemm_v*.py")]
    seen, missing = set(), set()
    while todo:
        path = todo.pop()
        for mod in imported(path):
            for f in files(mod):
                if f in seen:
                    continue
                seen.add(f)
                rel = f.relative_to(pkg).as_posix()
                if rel not in listed:
                    missing.add(rel)
                todo.append(f)
    assert not missing, f"KEY_SOURCES[{arch}] lacks {sorted(missing)}"


def test_the_key_covers_the_pipeline():
    """Changing the compile pipeline (nvcc flags live there) changes every key."""
    names = {n for names in cache.KEY_SOURCES.values() for n in names}
    assert {"compile/pipeline.py", "compile/cudalibs.py"} <= names


def test_a_missing_key_source_is_an_error_not_a_skip(monkeypatch, tmp_path):
    step = registry.get("v1", "sm_100a")
    monkeypatch.setattr(cache, "toolchain_id", lambda: "fixed")
    monkeypatch.setitem(cache.KEY_SOURCES, "sm_100a",
                        cache.KEY_SOURCES["sm_100a"] + ("build/moved_away.py",))
    with pytest.raises(FileNotFoundError, match="moved_away.py.*KEY_SOURCES"):
        cache.cache_key(step, *step.canonical, {})


def test_a_changed_key_source_changes_the_key(monkeypatch, tmp_path):
    step = registry.get("v1", "sm_100a")
    monkeypatch.setattr(cache, "toolchain_id", lambda: "fixed")
    fake = tmp_path / "pkg"
    for name in cache.KEY_SOURCES["sm_100a"]:
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_bytes((cache.PKG_DIR / name).read_bytes())
    monkeypatch.setattr(cache, "PKG_DIR", fake)
    before = cache.cache_key(step, *step.canonical, {})
    pipeline = fake / "compile" / "pipeline.py"
    pipeline.write_text(pipeline.read_text().replace("-O3", "-O0"))
    assert cache.cache_key(step, *step.canonical, {}) != before


def test_a_wrapper_script_nvcc_keys_the_cicc_and_headers_it_really_uses(tmp_path, monkeypatch):
    """A system nvcc that is a wrapper script (no nvcc.profile beside it) still names the
    cicc and headers of the nvcc it runs, from nvcc's own dry run, not "cicc=missing"."""
    from tirx_gemm.compile import toolchain
    wheel = toolchain.resolve()
    real = Path(toolchain.find_tool("nvcc"))
    wrapper = tmp_path / "cuda" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv(toolchain.SYSTEM_CUDA_ENV, "1")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    tc = toolchain.resolve()
    assert tc.nvcc == str(wrapper)
    assert tc.cicc != "missing" and tc.cicc == wheel.cicc
    assert tc.headers and tc.headers == wheel.headers
