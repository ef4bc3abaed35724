"""The website, opened in a real browser: headless Chromium from the system's
packages, driven by Playwright, reading the site that ``python scripts/build_site.py`` built
(build/site/, or ``$TIRX_GEMM_SITE``) through a local HTTP server on 127.0.0.1.

For every page: it loads (HTTP 200) without a console error, an uncaught exception or a
failed request, asks nothing of any other host, every image has loaded with a nonzero
natural size, and every internal link (page and #anchor) resolves. Step pages carry each
code cell of their notebook with its outputs (source, diff, build, SASS, registers, recorded
results naming their device, the plot), and the footer leads along the path.

Skipped, saying why, where the site is not built, Playwright is not installed or no
Chromium is found (the README's test command runs in a venv without the `docs` extra); CI
builds the site and sets TIRX_GEMM_SITE_REQUIRED=1, which turns each of those skips into a
failure (.ci/run, its last step).
"""
from __future__ import annotations

import functools
import http.server
import importlib.util
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tirx_gemm import settings

ROOT = Path(__file__).resolve().parent.parent
SITE = settings.get("TIRX_GEMM_SITE", default=ROOT / "build" / "site")
REQUIRED = settings.get("TIRX_GEMM_SITE_REQUIRED")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage"]
PAGE_TIMEOUT_MS = 60_000


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  ROOT / "scripts" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _generator()
_spec = importlib.util.spec_from_file_location("build_site", ROOT / "scripts" / "build_site.py")
BUILDER = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(BUILDER)  # imports only the standard library and tirx_gemm.progress
STEP_NOTEBOOKS = GEN.notebook_names()  # {step id: notebook file}, in the path's order
NOTEBOOKS = [GEN.OVERVIEW] + list(STEP_NOTEBOOKS.values())
PAGES = ["index.html", "results.html", "matmul.html"] + [
    n.removesuffix(".ipynb") + ".html" for n in NOTEBOOKS]


def _chromium() -> str | None:
    chromium = settings.get("TIRX_GEMM_CHROMIUM")
    for cand in (chromium and str(chromium), "/usr/bin/chromium",
                 shutil.which("chromium"), shutil.which("chromium-browser"),
                 shutil.which("google-chrome")):  # the last: GitHub's runners
        if cand and Path(cand).is_file():
            return cand
    return None


def _missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return ("Playwright is not installed (the `docs` extra: pip install -e '.[test,docs]'); "
                "CI installs it and runs this file in its site step")
    if _chromium() is None:
        return ("no Chromium found (/usr/bin/chromium, or $TIRX_GEMM_CHROMIUM): "
                "apt-get install chromium")
    if not (SITE / "index.html").is_file():
        return (f"the site is not built ({SITE}/index.html missing): "
                "run `python scripts/build_site.py` first")
    stamp = SITE / BUILDER.STAMP
    if not stamp.is_file() or stamp.read_text().strip() != BUILDER.site_digest(GEN):
        return (f"the site in {SITE} was built from other sources than these (notebooks, "
                "steps, package, results, docs/ or README changed since): run "
                "`python scripts/build_site.py` again")
    return None


@pytest.fixture(scope="module")
def site():
    why = _missing()
    if why:
        if REQUIRED:
            pytest.fail(f"TIRX_GEMM_SITE_REQUIRED=1 but {why}")
        pytest.skip(why)
    return SITE


# --------------------------------------------------------------------------------------
# the browser and the server
# --------------------------------------------------------------------------------------
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test reports failures itself
        pass


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser(site):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


_WAIT_IMAGES = """async () => {
  for (const img of document.images) { img.loading = 'eager'; }
  await Promise.all(Array.from(document.images).map(img => img.complete ? null :
      new Promise(resolve => { img.addEventListener('load', resolve);
                               img.addEventListener('error', resolve); })));
  return Array.from(document.images).map(img => ({
      src: (img.currentSrc || img.src).slice(0, 120), complete: img.complete,
      w: img.naturalWidth, h: img.naturalHeight}));
}"""

# mkdocs-jupyter wraps each cell in a second div of the same classes: the innermost counts
_CELLS = """() => Array.from(document.querySelectorAll('.jp-CodeCell'))
  .filter(cell => !cell.querySelector('.jp-CodeCell')).map(cell => ({
  input: (cell.querySelector('.jp-InputArea') || {innerText: ''}).innerText,
  outputs: Array.from(cell.querySelectorAll('.jp-OutputArea-output')).map(o => ({
      text: o.innerText, images: o.querySelectorAll('img').length,
      mime: o.getAttribute('data-mime-type') || ''})),
}))"""


@pytest.fixture(scope="module")
def visit(browser, server):
    """visit(page) -> what the browser saw on it, each page loaded once per module."""
    seen = {}

    def load(page_name: str) -> dict:
        if page_name in seen:
            return seen[page_name]
        ctx = browser.new_context()
        page = ctx.new_page()
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        errors, failed, foreign = [], [], []
        page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
        page.on("requestfailed", lambda r: failed.append(f"{r.url}: {r.failure}"))
        page.on("response", lambda r: failed.append(f"{r.url}: HTTP {r.status}")
                if r.status >= 400 else None)

        def route(r):
            if r.request.url.startswith(server) or r.request.url.startswith("data:"):
                r.continue_()
            else:  # the site must be self-contained: nothing from another host
                foreign.append(r.request.url)
                r.abort()
        page.route("**/*", route)
        resp = page.goto(server + page_name, wait_until="load")
        page.wait_for_load_state("networkidle")
        images = page.evaluate(_WAIT_IMAGES)
        links = page.evaluate("() => Array.from(document.querySelectorAll('a[href]'))"
                              ".map(a => a.href)")
        data = {"status": resp.status if resp else None, "errors": errors, "failed": failed,
                "foreign": foreign, "images": images, "links": links,
                "cells": page.evaluate(_CELLS), "text": page.inner_text("body"),
                "next": page.evaluate("() => { const a = document.querySelector("
                                      "'a.md-footer__link--next'); return a ? a.href : null }"),
                "title": page.title()}
        ctx.close()
        seen[page_name] = data
        return data

    return load


# --------------------------------------------------------------------------------------
# every page
# --------------------------------------------------------------------------------------
def test_every_built_page_is_one_the_test_knows(site):
    """The site holds the pages this test checks (and only those, besides mkdocs' 404)."""
    built = sorted(p.name for p in site.glob("*.html"))
    assert sorted(set(built) - {"404.html"}) == sorted(PAGES)


_ID = re.compile(r"""\bid=["']?([^"'\s>]+)""")


@functools.lru_cache(maxsize=None)
def _ids(path: Path) -> frozenset:
    return frozenset(unquote(i) for i in _ID.findall(path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page_name", PAGES)
def test_page_loads_clean(page_name, visit, server, site):
    got = visit(page_name)
    assert got["status"] == 200, f"{page_name}: HTTP {got['status']}"
    assert not got["errors"], f"{page_name}: {got['errors'][:5]}"
    assert not got["failed"], f"{page_name}: failed requests {got['failed'][:5]}"
    assert not got["foreign"], f"{page_name}: asks other hosts for {got['foreign'][:5]}"
    # every image has loaded and has a size
    for img in got["images"]:
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, f"{page_name}: {img}"
    # every internal link resolves: the file exists, and so does its #anchor
    internal = [u for u in got["links"] if u.startswith(server)]
    assert internal, f"{page_name} links nowhere inside the site"
    for url in internal:
        parts = urlsplit(url)
        rel = unquote(parts.path)[len(urlsplit(server).path):] or "index.html"
        target = site / rel
        if target.is_dir():
            target = target / "index.html"
        assert target.is_file(), f"{page_name}: link {url} -> no file {rel}"
        if parts.fragment and target.suffix == ".html":
            assert unquote(parts.fragment) in _ids(target), (
                f"{page_name}: link {url} -> no id {parts.fragment!r} in {rel}")


# --------------------------------------------------------------------------------------
# step pages: the cells and their outputs
# --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _generated() -> dict:
    """What scripts/make_notebooks.py writes (tests/test_notebooks.py holds notebooks/ to
    it byte for byte), so a step whose notebook is not committed yet is checked too."""
    return GEN.render()


def _code_cells(nb_name: str) -> list[str]:
    import json
    nb = json.loads(_generated()[nb_name])
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("nb_name", NOTEBOOKS)
def test_notebook_page_has_every_code_cell_and_its_outputs(nb_name, visit):
    got = visit(nb_name.removesuffix(".ipynb") + ".html")
    sources = _code_cells(nb_name)
    cells = got["cells"]
    assert len(cells) == len(sources), f"{nb_name}: {len(cells)} code cells on the page, " \
                                       f"{len(sources)} in the notebook"
    for src, cell in zip(sources, cells):
        first = src.strip().splitlines()[-1].strip()
        assert first in cell["input"].replace("\u00a0", " "), (nb_name, first)
        shown = [o for o in cell["outputs"] if o["text"].strip() or o["images"]]
        assert shown, f"{nb_name}: the cell {first!r} shows no output"
        for out in cell["outputs"]:
            assert "Traceback (most recent call last)" not in out["text"], (nb_name, first)
    text = got["text"]
    # what a reader comes for, labelled with its device: the H200 for sm_90a, NumSim (and
    # no speed) for sm_100a, on every page that has that track
    from tirx_gemm import registry
    sid = next((k for k, v in STEP_NOTEBOOKS.items() if v == nb_name), None)
    arches = {s.arch for s in registry.STEPS if sid is None or s.id == sid}
    if "sm_90a" in arches:
        assert "NVIDIA H200" in text, nb_name
    if "sm_100a" in arches:
        assert "NumSim" in text, nb_name
        assert "not measured: no sm_100a GPU available" in text, nb_name
    assert any(img["w"] > 0 for img in got["images"]), f"{nb_name}: no plot drawn"


@pytest.mark.parametrize("sid", list(STEP_NOTEBOOKS))
def test_step_page_shows_what_changed_what_it_compiles_to_and_results(sid, visit):
    from tirx_gemm import registry
    name = STEP_NOTEBOOKS[sid]
    got = visit(name.removesuffix(".ipynb") + ".html")
    text = got["text"]
    for s in registry.STEPS:
        if s.id != sid:
            continue
        assert f"def hgemm_{sid}(" in text, f"{name}: the {s.arch} source is not shown"
        assert f"| {s.arch} |" not in text  # tables render as tables, not as raw markdown
    for must in ("opcode (prefix)", "registers / thread", "Barriers and phases",
                 "The twin diff", "How this page was made"):
        assert must in text, f"{name}: no {must!r}"
    if sid != registry.step_ids()[0]:
        assert "The diff against" in text and "@@ lines" in text, f"{name}: no diff shown"


def test_footer_leads_along_the_path(visit, server):
    """Overview -> the whole path -> v1 -> ... -> last step -> results -> matmul."""
    order = ["index.html"] + [n.removesuffix(".ipynb") + ".html" for n in NOTEBOOKS] + [
        "results.html", "matmul.html"]
    for here, there in zip(order, order[1:]):
        assert visit(here)["next"] == server + there, f"{here}: next is not {there}"


def test_overview_has_the_path_table_the_suite_and_every_step(visit, server):
    from tirx_gemm import registry
    got = visit("index.html")
    text = got["text"]
    for s in registry.STEPS:
        assert s.lesson.split(":")[0].split(";")[0][:40] in text, s.key
    assert "geomean" in text and "NVIDIA H200" in text  # the suite summary
    for name in NOTEBOOKS:
        assert server + name.removesuffix(".ipynb") + ".html" in got["links"], name


def test_matmul_and_results_pages(visit):
    m = visit("matmul.html")["text"]
    assert "matmul(a, b" in m and "choose(" in m and "The shape suite" in m
    r = visit("results.html")
    assert "NVIDIA H200" in r["text"] and "NumSim" in r["text"] and "dtype" in r["text"]
    timelines = sorted((ROOT / "results" / "timelines").glob("*.png"))
    assert len(r["images"]) >= 1 + len(timelines)  # the H200 plot and every timeline
    assert all(i["w"] > 0 for i in r["images"])
    for png in timelines:
        assert png.stem in " ".join(i["src"] for i in r["images"]), png.name
