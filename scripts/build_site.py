"""Build the tutorial's website: every notebook executed headless on this (CPU) machine, then
rendered with mkdocs-material and mkdocs-jupyter into build/site/.

    python scripts/build_site.py [--out build/site] [--jobs 2] [--fresh] [--from-generator]

What it does, each stage printing a line per item and a heartbeat at least every 10 s:

1. executes a copy of every notebook in notebooks/ (nbclient, an ipykernel running this
   interpreter, ``--jobs`` at a time), exactly as tests/test_notebooks.py does; the builds
   the notebooks ask for come from the build cache (``$TIRX_GEMM_CACHE``; CI points it at
   the tests' cache, already warm). The committed notebooks are never written: executed
   copies go to build/site-exec/ (kept, keyed by a sha256 of the notebook and of every file
   its outputs are made from, so an unchanged notebook is not executed again; ``--fresh``
   executes all);
2. writes the pages that are not notebooks into build/site-src/: the overview (path table
   and suite summary, from the registry and the recorded results), the results page and
   the ``tirx_gemm.matmul`` page (its README sections and docstrings), from the hand-written
   texts in docs/pages/ and what the project generates;
3. runs ``mkdocs build --strict`` with docs/mkdocs.yml plus the nav in the path's order.

Open build/site/index.html in a browser (the site is plain .html files that need no
server), or serve it: ``python -m http.server -d build/site``. tests/test_site.py opens it
in headless Chromium and checks every page.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import datetime as _dt
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
DOCS = ROOT / "docs"
BUILD = ROOT / "build"
SRC = BUILD / "site-src"       # mkdocs' docs_dir, written anew by every build
EXEC = BUILD / "site-exec"     # executed notebooks, kept between builds (keyed)
CELL_TIMEOUT_S = 600           # one cell; a cold build of a step is ~10-30 s on 2 cores
# what a notebook's outputs are made from: a change in any of these executes it again
INPUTS = ("tirx_gemm", "steps", "results", "goldens", "pyproject.toml")

sys.path.insert(0, str(ROOT))
from tirx_gemm import settings  # noqa: E402  (standard library only)
from tirx_gemm.progress import Progress  # noqa: E402  (standard library only)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _generator():
    """scripts/make_notebooks.py as a module: the notebook names in the path's order."""
    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  ROOT / "scripts" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _git_rev() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=20)
        rev = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *INPUTS, "notebooks"],
                               cwd=ROOT, capture_output=True, text=True, timeout=20)
        return rev + (" with local changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def inputs_digest() -> str:
    """sha256 over every file the notebooks' outputs are made from (paths and bytes)."""
    h = hashlib.sha256()
    for name in INPUTS:
        base = ROOT / name
        files = [base] if base.is_file() else sorted(
            p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for p in files:
            h.update(str(p.relative_to(ROOT)).encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def section(text: str, heading: str) -> str:
    """The body of the README section whose '## ' heading starts with ``heading``."""
    m = re.search(rf"^## {re.escape(heading)}.*?$\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        raise SystemExit(f"build_site: README.md has no '## {heading}' section")
    return m.group(1).strip() + "\n"


def block(text: str, name: str) -> str:
    """A generated README block, <!-- name:begin ... --> to <!-- name:end -->."""
    m = re.search(rf"<!-- {name}:begin[^>]*-->\n(.*?)<!-- {name}:end -->", text, re.S)
    if not m:
        raise SystemExit(f"build_site: README.md has no generated '{name}' block")
    return m.group(1).strip() + "\n"


_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def localise(md: str) -> str:
    """Links of text taken from the README, for a page at the site's top level: a repo file
    that is an image is copied into the site (repo/<path>) and shown; a link to any other
    repo file becomes the path in code (the site does not ship the repo); web links stay."""
    def one(m):
        bang, label, target = m.groups()
        if re.match(r"[a-z]+://|#|mailto:", target):
            return m.group(0)
        path = (ROOT / target.split("#")[0]).resolve()
        if bang and path.is_file() and ROOT in path.parents:
            rel = path.relative_to(ROOT)
            dest = SRC / "repo" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            return f"![{label}](repo/{rel.as_posix()})"
        return f"{label} (`{target}`)" if label and label != target else f"`{target}`"
    return _LINK.sub(one, md)


# --------------------------------------------------------------------------------------
# 1. execute the notebooks (copies)
# --------------------------------------------------------------------------------------
_SOURCES: dict[str, str] = {}  # notebook name -> the text executed (main() fills it)


def _kernel_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="tirx-gemm-site-kernel-"))
    (d / "python3").mkdir()
    (d / "python3" / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (site build)", "language": "python"}))
    return d


async def _execute(name: str, kdir: Path):
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    nb = nbformat.reads(_SOURCES[name], as_version=4)
    ksm = KernelSpecManager(kernel_dirs=[str(kdir)], ensure_native_kernel=False)
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ksm)
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=False,
                            resources={"metadata": {"path": str(NB_DIR)}})
    env = dict(os.environ)
    env.setdefault("MPLBACKEND", "Agg")
    try:
        await client.async_execute(env=env)
    finally:
        if km.has_kernel:
            await km.shutdown_kernel(now=True)
    return nb


STAMP = ".site-inputs.sha256"  # in the built site: what it was built from (site_digest)


def site_digest(gen=None) -> str:
    """sha256 of everything a build reads: the notebooks as scripts/make_notebooks.py writes
    them (tests/test_notebooks.py holds the committed ones to that), what their outputs are
    made from, docs/ and the README (its sections and tables become pages). The build
    stores it in the site; tests/test_site.py compares, so a site left from older sources
    is never mistaken for the current one."""
    gen = gen or _generator()
    h = hashlib.sha256(inputs_digest().encode())
    for name, text in sorted(gen.render().items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    for p in sorted([*DOCS.rglob("*"), ROOT / "README.md", Path(__file__).resolve()]):
        if p.is_file():
            h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _key(digest: str, source: str) -> str:
    return hashlib.sha256(digest.encode() + source.encode()).hexdigest()


def store_executed(name: str, nb, source: str | None = None) -> None:
    """Keep a notebook executed elsewhere (tests/test_notebooks.py executes every one) for
    the next site build, under the key execute_all looks for; ``source`` is the notebook's
    text as executed (default: the committed file)."""
    import nbformat
    if source is None:
        source = (NB_DIR / name).read_text(encoding="utf-8")
    EXEC.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, EXEC / name)
    (EXEC / (name + ".sha256")).write_text(_key(inputs_digest(), source) + "\n")


def execute_all(names: list[str], jobs: int, fresh: bool) -> dict:
    """{name: executed notebook}; exits non-zero naming every notebook that failed."""
    import nbformat
    EXEC.mkdir(parents=True, exist_ok=True)
    digest = inputs_digest()
    done, todo = {}, []
    for name in names:
        key = _key(digest, _SOURCES[name])
        out, keyfile = EXEC / name, EXEC / (name + ".sha256")
        if not fresh and out.is_file() and keyfile.is_file() and \
                keyfile.read_text().strip() == key:
            done[name] = nbformat.read(out, as_version=4)
        else:
            todo.append((name, key))
    print(f"site: {len(done)} notebook(s) unchanged since their last execution "
          f"(build/site-exec/), {len(todo)} to execute, {jobs} at a time; build cache "
          f"{settings.get('TIRX_GEMM_CACHE')}",
          flush=True)
    if not todo:
        return done
    kdir = _kernel_dir()
    failed = {}
    running: list[str] = []
    with Progress("executing notebooks", len(todo), stream=sys.stdout) as prog:
        async def run_all():
            gate = asyncio.Semaphore(jobs)

            async def one(name, key):
                async with gate:
                    running.append(name)
                    prog.current = ", ".join(running)
                    prog.say(f"executing {name}")
                    t0 = time.monotonic()
                    try:
                        nb = await _execute(name, kdir)
                    except Exception as exc:  # noqa: BLE001 - reported below, build fails
                        failed[name] = exc
                        prog.item("FAILED", name, time.monotonic() - t0)
                        return
                    finally:
                        running.remove(name)
                        prog.current = ", ".join(running) or None
                    nbformat.write(nb, EXEC / name)
                    (EXEC / (name + ".sha256")).write_text(key + "\n")
                    done[name] = nb
                    prog.item("executed", name, time.monotonic() - t0)

            await asyncio.gather(*(one(n, k) for n, k in todo))

        asyncio.run(run_all())
    shutil.rmtree(kdir, ignore_errors=True)
    if failed:
        for name, exc in failed.items():
            last = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
            print(f"site: error: {name} did not execute: {last[0]}", file=sys.stderr)
        raise SystemExit(1)
    return done


def _page_name(name: str) -> str:
    return name.removesuffix(".ipynb") + ".html"


_NB_LINK = re.compile(r"""(\]\(|href=["'])(\d\d_[A-Za-z0-9_]+)\.ipynb(?=[#)"'])""")


def _page_links(text: str) -> str:
    """Markdown and HTML links to a notebook of the path -> links to its page."""
    return _NB_LINK.sub(lambda m: f"{m.group(1)}{m.group(2)}.html", text)


def prepare_notebook(nb, name: str, banner: str) -> None:
    """The executed copy as the site shows it: links between notebooks point at their pages
    (mkdocs does not rewrite links inside a notebook's HTML), and a first cell says where
    and how it was executed and where its measured figures come from."""
    import nbformat
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _page_links(cell.source)
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            for mime in ("text/markdown", "text/html"):
                if mime in data:
                    text = data[mime] if isinstance(data[mime], str) else "".join(data[mime])
                    data[mime] = _page_links(text)
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(banner))
    nb.metadata.pop("widgets", None)


# --------------------------------------------------------------------------------------
# 2. the pages that are not notebooks
# --------------------------------------------------------------------------------------
def _docstrings(path: Path, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(title, docstring) of the module and of each named top-level function, read from the
    source without importing it (importing tirx_gemm.matmul would need torch)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = [("module", ast.get_docstring(tree) or "")]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            args = ast.unparse(node.args)
            out.append((f"{node.name}({args})", ast.get_docstring(node) or ""))
    return out


def _defining(name: str) -> Path:
    """The module of tirx_gemm/op/ that defines the top-level function ``name`` (read from
    the source, nothing imported)."""
    for path in sorted((ROOT / "tirx_gemm" / "op").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
            return path
    raise SystemExit(f"build_site: no module of tirx_gemm/op/ defines {name}()")


def timelines_md() -> str:
    """Every recorded in-kernel timeline in results/timelines/, in step order: the Gantt
    chart and the first lines of its summary, which name the step, shape and GPU."""
    folder = ROOT / "results" / "timelines"
    pngs = sorted(folder.glob("*.png"),
                  key=lambda p: (int(re.match(r"v(\d+)", p.name).group(1))
                                 if re.match(r"v\d+", p.name) else 0, p.name))
    if not pngs:
        return "_No recorded timeline in `results/timelines/`._"
    out = []
    for png in pngs:
        txt = png.with_suffix(".txt")
        lines = txt.read_text(encoding="utf-8").splitlines()[:3] if txt.is_file() else []
        head = lines[0] if lines else png.stem
        out.append(f"### {head.split(', instrumented')[0]}\n")
        if lines[1:]:
            out.append("\n".join(f"- {ln}" for ln in lines[1:]) + "\n")
        out.append(localise(f"![Timeline {png.stem}]({png.relative_to(ROOT).as_posix()})")
                   + "\n")
    return "\n".join(out)


def _step_title(gen, sid: str) -> str:
    """The step's title as its notebook's heading gives it (the lesson's 'title:' line)."""
    try:
        return gen._title(sid)
    except Exception:  # noqa: BLE001 - a title is decoration; the id alone will do
        return sid


def write_pages(gen, readme: str, rev: str, when: str) -> None:
    from tirx_gemm import notebook as nbmod
    from tirx_gemm import registry

    names = gen.notebook_names()  # {step id: notebook file}
    fills = {
        "path": str(nbmod.path_table(notebooks=dict(names))),
        "suite": block(readme, "suite"),
        "built": f"git {rev}, {when}",
    }
    suite = nbmod.suite_plot()
    if hasattr(suite, "_repr_png_"):
        (SRC / "assets").mkdir(parents=True, exist_ok=True)
        (SRC / "assets" / "suite.png").write_bytes(suite._repr_png_())
        fills["suite_plot"] = ("![Ratio to torch.matmul over the shape suite, recorded on the "
                               "H200](assets/suite.png)")
    else:
        fills["suite_plot"] = str(suite)
    # the README's results section; its link to this very page becomes one to the full table
    fills["results"] = localise(section(readme, "Results").replace(
        "](docs/pages/results.md)", "](#every-step-at-every-shape)"))
    fills["timelines"] = timelines_md()
    fills["matmul_readme"] = localise(section(readme, "`tirx_gemm.matmul`"))
    try:  # the README's section on models (tirx_gemm.nn, patch), where it has one
        fills["matmul_model"] = "## Using it in a model\n\n" + localise(
            section(readme, "Using it in a model"))
    except SystemExit:
        fills["matmul_model"] = ""
    docs = _docstrings(ROOT / "tirx_gemm" / "op" / "matmul.py", ("matmul", "use_bundle"))
    # choose lives in the op library's rule module (tirx_gemm.matmul.choose imports it)
    docs[1:1] = _docstrings(_defining("choose"), ("choose",))[1:]
    parts = []
    for title, doc in docs:
        if not doc:
            continue
        head = "The module `tirx_gemm.matmul`" if title == "module" else f"`{title}`"
        parts.append(f"### {head}\n\n```text\n{doc}\n```\n")
    fills["matmul_doc"] = "\n".join(parts)
    fills["steps"] = "\n".join(
        f"- [**{sid}**: {_step_title(gen, sid)}]({nbname}) "
        f"({', '.join(s.arch for s in registry.STEPS if s.id == sid)})"
        for sid, nbname in names.items())
    for page in sorted((DOCS / "pages").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for key, value in fills.items():
            text = text.replace("{{ " + key + " }}", value.strip())
        left = re.findall(r"\{\{ (\w+) \}\}", text)
        if left:
            raise SystemExit(f"build_site: docs/pages/{page.name} asks for unknown {left}")
        (SRC / page.name).write_text(text, encoding="utf-8")
    if (DOCS / "assets").is_dir():
        shutil.copytree(DOCS / "assets", SRC / "assets", dirs_exist_ok=True)


def _nb_title(nb, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.match(r"#\s+(.+)", cell.source.strip())
            if m:
                return m.group(1).strip()
    return fallback


def write_config(gen, executed: dict, out: Path) -> Path:
    names = gen.notebook_names()
    nav = [{"Overview": "index.md"},
           {_nb_title(executed[gen.OVERVIEW], "The whole path"): gen.OVERVIEW}]
    for sid, name in names.items():
        nav.append({_nb_title(executed[name], sid): name})
    nav += [{"Recorded results": "results.md"}, {"tirx_gemm.matmul": "matmul.md"}]
    cfg = {"INHERIT": str(DOCS / "mkdocs.yml"), "docs_dir": str(SRC), "site_dir": str(out),
           "nav": nav}
    path = BUILD / "site-mkdocs.yml"
    path.write_text(json.dumps(cfg, indent=1), encoding="utf-8")  # JSON is YAML
    return path


# --------------------------------------------------------------------------------------
# 3. mkdocs
# --------------------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_mkdocs(cfg: Path) -> None:
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(cfg)]
    with Progress("mkdocs build", None, stream=sys.stdout) as prog:
        prog.current = "mkdocs build"
        proc = subprocess.Popen(cmd, cwd=BUILD, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "NO_COLOR": "1"})
        for line in proc.stdout:
            line = _ANSI.sub("", line).rstrip()
            if line.strip(" │"):
                prog.say("mkdocs: " + line)
        rc = proc.wait()
    if rc:
        raise SystemExit(f"build_site: mkdocs build failed (exit {rc})")


def results_read() -> tuple[Path, int]:
    """(the results folder the notebooks read, $TIRX_GEMM_RESULTS or the checkout's
    results/, and its number of records); a folder without records is refused: every table
    and plot of the site would be empty."""
    from tirx_gemm.notebook.results import results_dir
    from tirx_gemm.report import records
    folder = results_dir()
    n = len(records.load_records(folder))
    if not n:
        raise ValueError(f"the results folder {folder} holds no records (*.jsonl): the "
                         f"site's tables and plots would be empty; point $TIRX_GEMM_RESULTS "
                         f"at a folder of records, or unset it for the checkout's results/")
    return folder, n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(BUILD / "site"), help="the site (default build/site)")
    ap.add_argument("--jobs", type=int, default=2, help="notebooks executed at once")
    ap.add_argument("--fresh", action="store_true",
                    help="execute every notebook, even those unchanged since the last build")
    ap.add_argument("--from-generator", action="store_true",
                    help="execute what scripts/make_notebooks.py would write now instead of "
                         "the committed notebooks/ (to preview a step being written)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    try:
        folder, n = results_read()
    except ValueError as exc:
        print(f"build_site: error: {exc}", file=sys.stderr)
        return 2
    print(f"site: {n} records from {folder}", flush=True)
    for mod in ("mkdocs", "material", "mkdocs_jupyter", "nbclient", "ipykernel"):
        if importlib.util.find_spec(mod) is None:
            print(f"build_site: error: {mod} is not installed; install the docs extra: "
                  "pip install -e '.[test,docs]'", file=sys.stderr)
            return 2
    t0 = time.monotonic()
    gen = _generator()
    names = [gen.OVERVIEW] + list(gen.notebook_names().values())
    if args.from_generator:
        _SOURCES.update(gen.render())
    else:
        _SOURCES.update({n: (NB_DIR / n).read_text(encoding="utf-8") for n in names
                         if (NB_DIR / n).is_file()})
    missing = [n for n in names if n not in _SOURCES]
    if missing:
        print(f"build_site: error: the registry has notebooks that notebooks/ lacks: "
              f"{', '.join(missing)}; run `python scripts/make_notebooks.py`", file=sys.stderr)
        return 1
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rev = _git_rev()
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    executed = execute_all(names, args.jobs, args.fresh)
    t_exec = time.monotonic() - t0

    if SRC.exists():
        shutil.rmtree(SRC)
    SRC.mkdir(parents=True)
    banner = (DOCS / "notebook_banner.md").read_text(encoding="utf-8").replace(
        "{{ built }}", f"git {rev}, {when}")
    import copy
    import nbformat
    for name in names:
        nb = copy.deepcopy(executed[name])
        prepare_notebook(nb, name, banner)
        nbformat.write(nb, SRC / name)
    write_pages(gen, readme, rev, when)
    cfg = write_config(gen, executed, Path(args.out).resolve())
    print(f"site: pages written to {SRC.relative_to(ROOT)} ({len(names)} notebooks)",
          flush=True)
    run_mkdocs(cfg)
    out = Path(args.out).resolve()
    (out / STAMP).write_text(site_digest(gen) + "\n")
    pages = sorted(out.glob("*.html"))
    total = time.monotonic() - t0
    print(f"site: built {out} ({len(pages)} pages) in {total:.0f} s (notebooks {t_exec:.0f} s, "
          f"pages and mkdocs {total - t_exec:.0f} s); open {out / 'index.html'} or run "
          f"`python -m http.server -d {os.path.relpath(out, Path.cwd())}`", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
