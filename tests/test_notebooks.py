"""The notebooks: committed stripped, exactly as scripts/make_notebooks.py writes them, and
every one executes headless (CPU, no GPU) without a cell error.

Execution uses nbclient with an ipykernel running *this* interpreter (a kernelspec written to
a temp dir, so no user-level "python3" kernel can take its place) and this process's
environment, so the kernel sees the test session's TIRX_GEMM_CACHE (tests/conftest.py). The
builds the notebooks ask for are made up front with build_many (parallel; already cached
when tests/test_build.py ran first in the session), so the notebooks mostly read the cache.
Each notebook runs in a fresh kernel of its own; two run at a time.
"""
import asyncio
import importlib.util
import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from tirx_gemm import registry

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
CELL_TIMEOUT_S = 300  # a cold build of one step is ~10 s; a cached notebook runs in seconds


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  ROOT / "scripts" / "make_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _generator()
GENERATED = GEN.render()
NAMES = sorted(GENERATED)


# --------------------------------------------------------------------------------------
# the committed files: policy and drift
# --------------------------------------------------------------------------------------
def test_every_registry_step_has_a_notebook():
    names = GEN.notebook_names()
    assert list(names) == registry.step_ids()
    assert GEN.OVERVIEW in GENERATED
    for sid, name in names.items():
        assert name in GENERATED and name.startswith(f"{int(sid[1:]):02d}_"), name


def test_committed_readme_lists_what_the_registry_has():
    """notebooks/README.md's list of notebooks is generated: one line per registry step."""
    text = (NB_DIR / GEN.README).read_text(encoding="utf-8")
    assert text == GEN.render_readme(), (
        "notebooks/README.md's generated list is stale: run `python scripts/make_notebooks.py`")
    listed = text.split(GEN.README_BEGIN, 1)[1].split(GEN.README_END, 1)[0]
    for sid, name in GEN.notebook_names().items():
        assert f"[`{name}`]({name}): **{sid}**" in listed


def test_committed_notebooks_are_what_the_generator_writes():
    committed = sorted(p.name for p in NB_DIR.glob("*.ipynb"))
    assert committed == NAMES, ("notebooks/ and scripts/make_notebooks.py disagree on the "
                                "file list: run `python scripts/make_notebooks.py`")
    for name in NAMES:
        assert (NB_DIR / name).read_text(encoding="utf-8") == GENERATED[name], (
            f"notebooks/{name} differs from the generator's output: edit "
            "scripts/make_notebooks.py, then run it (never edit the .ipynb by hand)")


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_has_no_outputs(name):
    nb = nbformat.read(NB_DIR / name, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{name}: cell {cell.get('id')} carries outputs; notebooks are committed "
                "stripped (notebooks/README.md)")


def test_notebooks_hold_no_kernel_code():
    """Thin notebooks: code cells call the package; no TIRx kernel code is copied in."""
    for name in NAMES:
        nb = json.loads(GENERATED[name])
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        for banned in ("T.prim_func", "tvm.script", "Tx.", "@T.", "import tvm"):
            assert banned not in code, f"{name} contains {banned!r}"


def _step_code_lines():
    """Every code line (no comment, docstring or blank) of every registered step's source,
    40 characters or longer once stripped: text a notebook must never hold."""
    from tirx_gemm import notebook as nb
    out = set()
    for s in registry.STEPS:
        for _, line in nb.code_lines(Path(s.source_file).read_text(encoding="utf-8")):
            if len(line.strip()) >= 40:
                out.add(line.strip())
    return out


def test_notebooks_show_the_source_by_reading_it():
    """Each step notebook calls step_source / step_diff / twin_diff (read at run time) for
    each arch, and no cell, markdown or code, holds a line of any step's source."""
    lines = _step_code_lines()
    assert lines
    for name in NAMES:
        nb = json.loads(GENERATED[name])
        cells = ["".join(c["source"]) for c in nb["cells"]]
        for cell in cells:
            pasted = [ln for ln in lines if ln in cell]
            assert not pasted, f"{name} pastes source lines: {pasted[:2]}"
        if name == GEN.OVERVIEW:
            continue
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        for arch in registry.ARCHES:
            assert f'nb.step_source(STEP, "{arch}")' in code
            assert f'nb.step_diff(STEP, "{arch}")' in code
        order = [i for i, c in enumerate(nb["cells"]) if "".join(c["source"]).startswith(
            ('nb.step_diff(STEP, "sm_90a")', "nb.twin_diff(STEP)"))]
        assert len(order) == 2 and order[1] - order[0] == 2, (
            f"{name}: the twin diff must come one cell after the step diffs")


def test_generator_survives_a_lesson_being_written(tmp_path, monkeypatch):
    """A lessons file with only some sections (a step being written) still gives a notebook,
    which says what is missing; an unknown section is an error naming it."""
    sid = registry.step_ids()[-1]
    part = tmp_path / f"{sid}.md"
    part.write_text("title: half written\n\n## What changes\n\nThe idea, so far.\n")
    lesson = GEN._read_lesson(part)
    assert lesson == {"title": "half written", "changes": "The idea, so far."}
    monkeypatch.setitem(GEN.NARRATIVE, sid, lesson)
    names = GEN.notebook_names()
    text = GEN.step_notebook(sid, names)
    assert "half written" in text and "The idea, so far." in text
    assert "has no \\\"Barriers: sm_100a\\\" section" in text
    assert names[sid].startswith(f"{int(sid[1:]):02d}_")
    bad = tmp_path / "bad.md"
    bad.write_text("## What chnages\n")
    with pytest.raises(ValueError, match="unknown section 'What chnages'"):
        GEN._read_lesson(bad)


# --------------------------------------------------------------------------------------
# the source and diff helpers
# --------------------------------------------------------------------------------------
def test_step_source_is_the_file():
    from tirx_gemm import notebook as nb
    for s in registry.STEPS:
        shown = nb.step_source(s.id, s.arch)
        text = Path(s.source_file).read_text(encoding="utf-8")
        assert isinstance(shown, nb.Code) and repr(shown) == text
        html_ = shown._repr_html_()
        assert html_.count("\n") >= len(text.splitlines()) - 1  # one numbered line each


_SAMPLE = '''"""Module docstring: dropped."""
import os  # a trailing comment


def f(x):
    """Function docstring,
    two lines: dropped."""
    # a comment line: dropped
    s = "a # in a string stays"  # this comment goes
    t = """not a docstring:
    an assigned string stays"""

    return x + 1
'''


def test_code_lines_strip_comments_and_docstrings():
    from tirx_gemm import notebook as nb
    assert nb.code_lines(_SAMPLE) == [
        (2, "import os"),
        (5, "def f(x):"),
        (9, '    s = "a # in a string stays"'),
        (10, '    t = """not a docstring:'),
        (11, '    an assigned string stays"""'),
        (13, "    return x + 1"),
    ]


def test_code_diff_shows_code_changes_only():
    from tirx_gemm import notebook as nb
    recommented = _SAMPLE.replace("# a comment line: dropped", "# reworded comment").replace(
        "Function docstring,", "Another docstring,")
    assert nb.code_diff(_SAMPLE, recommented, "a.py", "b.py").splitlines() == [
        "--- a.py", "+++ b.py"]
    changed = recommented.replace("return x + 1", "return x + 2  # and a comment")
    diff = nb.code_diff(_SAMPLE, changed, "a.py", "b.py", context=0).splitlines()
    assert diff == ["--- a.py", "+++ b.py", "@@ lines 13-13 -> 13-13 @@ builder (host side)",
                    "-    return x + 1", "+    return x + 2"]


def test_step_diffs_are_code_only_and_name_their_base():
    from tirx_gemm import notebook as nb
    for s in registry.STEPS:
        base = nb.diff_base(s.id, s.arch)
        ids = [x.id for x in registry.all_steps(s.arch)]
        if base is None:
            assert ids.index(s.id) == 0
            assert isinstance(nb.step_diff(s.id, s.arch), nb.Md)
            continue
        assert ids.index(base) < ids.index(s.id)
        card = nb._card(s)
        if "Changes from v" in card:
            assert f"Changes from {base}" in card
        diff = nb.step_diff(s.id, s.arch)
        base_src = Path(registry.get(base, s.arch).source_file).read_text()
        old = {t for _, t in nb.code_lines(base_src)}
        new = {t for _, t in nb.code_lines(Path(s.source_file).read_text())}
        lines = repr(diff).splitlines()
        assert lines[0].endswith(f"hgemm_{base}.py") and lines[1].endswith(f"hgemm_{s.id}.py")
        body = [ln for ln in lines[2:] if not ln.startswith("@@")]
        assert any(ln.startswith("+") for ln in body)
        for ln in body:
            assert ln[1:] in (new if ln[0] == "+" else old if ln[0] == "-" else old & new)
    for sid in registry.step_ids():
        twin = nb.twin_diff(sid)
        if len(nb.arches(sid)) == 2:
            assert isinstance(twin, nb.Code) and "sm100a" in repr(twin).splitlines()[0]


def test_diff_html_with_and_without_pygments(monkeypatch):
    from tirx_gemm import notebook as nb
    sid = registry.step_ids()[1]
    diff = nb.step_diff(sid, registry.ARCHES[0])
    plus_bg = nb.Code._BG["+"]
    if importlib.util.find_spec("pygments") is not None:
        assert "<span style=\"color:" in diff._repr_html_()
    monkeypatch.setitem(sys.modules, "pygments", None)  # import pygments -> ImportError
    plain = diff._repr_html_()
    assert "<pre" in plain and plus_bg in plain and "<span style=\"color:" not in plain
    added = [ln for ln in repr(diff).splitlines() if ln.startswith("+") and not
             ln.startswith("+++")]
    assert f"background:{plus_bg}\">+" in plain and len(added) == plain.count(
        f"background:{plus_bg}")


# --------------------------------------------------------------------------------------
# the shape suite: what matmul runs, and the recorded before/after
# --------------------------------------------------------------------------------------
def test_suite_plot_says_so_without_records(tmp_path, monkeypatch):
    from tirx_gemm import notebook as nb
    monkeypatch.setenv(nb.RESULTS_ENV, str(tmp_path))
    out = nb.suite_plot()
    assert isinstance(out, nb.Md) and "No H200 suite records yet" in str(out)


def test_suite_plot_draws_recorded_ratios_only(tmp_path, monkeypatch):
    """Two recorded cases (test data in a temporary results folder): both sides appear with
    their ratios, a failed check is shown as such and left out of the summary, a case with
    no record is not drawn."""
    from tirx_gemm import matmul
    from tirx_gemm.report import records
    from tirx_gemm.op import suite
    from tirx_gemm import notebook as nb
    monkeypatch.setenv(nb.RESULTS_ENV, str(tmp_path))
    st = suite.load_suite()
    (e1, d1), (e2, d2) = st.cases()[:2]

    def rec(entry, dtype, target, ratio, ok=True):
        return {"step": matmul.DATA_PARALLEL, "arch": "sm_90a", "M": entry.M, "N": entry.N,
                "K": entry.K, "device": "Test GPU", "dtype": dtype, "verified": ok,
                "ratio_to_torch": ratio, "timestamp": "2026-01-01T00:00:00+00:00",
                "suite": {"name": st.name, "target": target, "dtype": dtype}}

    for r in (rec(e1, d1, matmul.DATA_PARALLEL, 0.25), rec(e1, d1, suite.MATMUL, 0.93),
              rec(e2, d2, suite.MATMUL, 0.5, ok=False)):
        records.append_record(r, tmp_path / "suites")
    data = nb.suite_ratios()
    rows = data["devices"]["Test GPU"]
    assert len(rows) == 2 and rows[0]["shape"] == e1.shape
    text = nb._suite_text(data)
    assert "0.25x" in text and "0.93x" in text and "FAIL (check)" in text
    assert "geomean 0.930x" in text and "geomean 0.250x" in text
    out = nb.suite_plot()
    assert "0.93x" in repr(out)


# --------------------------------------------------------------------------------------
# the helper module without matplotlib
# --------------------------------------------------------------------------------------
def test_plot_falls_back_to_a_table_without_matplotlib(monkeypatch):
    from tirx_gemm import notebook as nb
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = nb.plot_results(highlight="v1")
    assert isinstance(out, nb.Md) and not hasattr(out, "_repr_png_")
    text = out._repr_markdown_()
    assert "matplotlib is not installed" in text
    for s in registry.STEPS:
        assert f"| {s.arch} |" in text


def test_results_name_the_device_or_say_not_measured(tmp_path, monkeypatch):
    from tirx_gemm import notebook as nb
    from tirx_gemm.report import records
    monkeypatch.setenv(nb.RESULTS_ENV, str(tmp_path))  # no records at all
    text = str(nb.results_table("v1"))
    assert records.NO_SM100_GPU in text
    rec = {"step": "v1", "arch": "sm_90a", "M": 128, "N": 128, "K": 64, "device": "NVIDIA H200",
           "tflops": 0.3, "ratio_to_torch": 0.78, "verified": True, "rel_err": 2e-4,
           "timestamp": "2026-11-29T10:07:01+00:00"}
    records.append_record(rec, tmp_path)
    text = str(nb.results_table("v1"))
    assert "NVIDIA H200" in text and records.NO_SM100_GPU in text


def test_measure_runs_where_a_gpu_of_the_arch_is_present(monkeypatch):
    """The GPU branch (faked here): a present arch is measured through measure.measure_plan and
    its record shown; an absent one falls back to the recorded results."""
    from tirx_gemm.run import measure
    from tirx_gemm import notebook as nb
    calls = []

    def fake_device(arch):
        if arch == "sm_90a":
            return {"name": "NVIDIA H200", "capability": "9.0", "sm_count": 132}, None
        return None, "no sm_100a GPU here"

    def fake_measure(plan, *, bundle=None, check_only=False, log=print):
        (s, mnk), = plan
        calls.append((s.key, tuple(mnk), bundle))
        return [{"step": s.id, "arch": s.arch, "M": mnk[0], "N": mnk[1],
                 "K": mnk[2], "device": "NVIDIA H200", "verified": True,
                 "rel_err": 2.1e-4, "tflops": 123.4, "ratio_to_torch": 0.5,
                 "timestamp": "2026-11-29T00:00:00+00:00"}]

    from tirx_gemm.notebook import results as nb_results  # the room that runs and reads results
    monkeypatch.setattr(nb_results, "_device_for", fake_device)
    monkeypatch.setattr(measure, "measure_plan", fake_measure)
    text = str(nb.measure_or_recorded("v1", bundle="some/bundle"))
    assert calls == [("v1@sm_90a", registry.get("v1", "sm_90a").canonical, "some/bundle")]
    assert "measured here on NVIDIA H200" in text and "123.4" in text and "✓" in text
    assert "sm_100a" in text and "no sm_100a GPU here" in text
    # the dtype has its own column (without it fp16 and bf16 rows look like duplicates);
    # a record without one is from before bf16, so float16
    assert "| dtype |" in text and "| float16 |" in text


# --------------------------------------------------------------------------------------
# execution
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel_spec_dir(tmp_path_factory):
    """A 'python3' kernelspec that runs this very interpreter (the test venv)."""
    d = tmp_path_factory.mktemp("kernels")
    (d / "python3").mkdir()
    (d / "python3" / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (test venv)", "language": "python"}))
    return d


@pytest.fixture(scope="module")
def warm_cache():
    """Build every step's canonical shape once, in parallel (cache hits after test_build)."""
    from tirx_gemm.compile.api import build_many
    res = build_many([(s, s.canonical, {}) for s in registry.STEPS])
    for s, r in zip(registry.STEPS, res):
        if isinstance(r, Exception):
            raise AssertionError(f"{s.key} does not build: {r}")


NB_PARALLEL = 2  # notebooks executed at once (each in its own kernel): the CI machine's cores


async def _execute(name, kernel_spec_dir):
    nb = nbformat.read(NB_DIR / name, as_version=4)
    ksm = KernelSpecManager(kernel_dirs=[str(kernel_spec_dir)], ensure_native_kernel=False)
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ksm)
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=False,
                            resources={"metadata": {"path": str(NB_DIR)}})
    try:
        # the kernel inherits this environment: TIRX_GEMM_CACHE from conftest, PATH (nvcc)
        await client.async_execute(env=dict(os.environ))
    finally:
        if km.has_kernel:  # we own the kernel manager, so nbclient leaves the kernel running
            await km.shutdown_kernel(now=True)
    return nb


@pytest.fixture(scope="module")
def executed(kernel_spec_dir, warm_cache):
    """{name: executed notebook, or the exception its execution raised}: every notebook
    runs once, each in a fresh kernel of its own (no state passes between notebooks),
    NB_PARALLEL at a time; each notebook's test then reads its own result."""
    async def run_all():
        gate = asyncio.Semaphore(NB_PARALLEL)

        async def one(name):
            async with gate:
                try:
                    return await _execute(name, kernel_spec_dir)
                except Exception as exc:  # noqa: BLE001 - raised again by that notebook's test
                    return exc

        return dict(zip(NAMES, await asyncio.gather(*(one(n) for n in NAMES))))

    results = asyncio.run(run_all())
    # the site build (scripts/build_site.py) reuses what ran here instead of executing the
    # notebooks again: each is kept under the key the site build looks for
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "scripts" / "build_site.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    for name, nb in results.items():
        if not isinstance(nb, Exception):
            site.store_executed(name, nb)
    return results


def _text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                parts.append("ERROR " + out.get("ename", "") + ": " + out.get("evalue", ""))
            data = out.get("data", {})
            for key in ("text/markdown", "text/plain"):
                if key in data:
                    parts.append("".join(data[key]))
            if "text" in out:
                parts.append("".join(out["text"]))
    return "\n".join(parts)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes_headless(name, executed):
    nb = executed[name]
    if isinstance(nb, Exception):  # CellExecutionError on any cell error
        raise nb
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out
    text = _text(nb)
    # every notebook ends in recorded results (no GPU here) that name their device, and a
    # plot (or its table fallback)
    from tirx_gemm.report import records
    assert records.NO_SM100_GPU in text
    plot_out = [o for o in nb.cells[-1].get("outputs", []) if o.get("output_type") in
                ("execute_result", "display_data")]
    assert plot_out and ("image/png" in plot_out[0]["data"]
                         or "matplotlib is not installed" in "".join(
                             plot_out[0]["data"].get("text/markdown", "")))
    if name != GEN.OVERVIEW:
        sid = next(k for k, v in GEN.notebook_names().items() if v == name)
        for s in registry.STEPS:
            if s.id == sid:  # the build summary and resource tables name each registered arch
                assert f"| {s.arch} |" in text
                # the source cell shows the file as it is now, never a copy (IPython drops
                # the text's final newline from a result's text/plain)
                src = f'nb.step_source(STEP, "{s.arch}")'
                cell = next(c for c in nb.cells if c.source == src)
                shown = [o for o in cell.outputs if o.get("output_type") == "execute_result"]
                assert shown and "".join(shown[0]["data"]["text/plain"]) == Path(
                    s.source_file).read_text(encoding="utf-8").removesuffix("\n")
                assert "text/html" in shown[0]["data"]
        assert "opcode (prefix)" in text and "registers / thread" in text and "```cuda" in text


def test_diff_sizes_counts_the_diff_the_notebook_shows():
    """scripts/diff_sizes.py and the notebooks' step diffs share tirx_gemm.sourceview: the size
    it prints for a step is the +/- count of the diff the step's notebook shows."""
    from tirx_gemm import notebook as nb
    from tirx_gemm.sourceview import diff_counts
    spec = importlib.util.spec_from_file_location("diff_sizes", ROOT / "scripts" / "diff_sizes.py")
    ds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ds)
    sizes = ds.sizes(None)
    for arch, (old, new) in (("sm_90a", ("v4", "v5")), ("sm_100a", ("v6", "v7")),
                             ("sm_100a", ("v8", "v10")), ("sm_90a", ("v9", "v12"))):
        assert nb.diff_base(new, arch) == old
        plus, minus, _ = diff_counts(str(nb.step_diff(new, arch)))
        assert sizes[f"{arch.replace('_', '')} {old}->{new}"] == plus + minus

