#!/usr/bin/env python3
"""Generate notebooks/*.ipynb: an overview plus one notebook per registry step.

The notebooks are generated, never edited by hand: each step's narrative lives next to the
step in ``steps/lessons/vN.md`` (what changes on both arches, the barrier tables, what to
look for in SASS), code lives in ``tirx_gemm.notebook`` (and the package it calls), and every notebook is written without
outputs (the policy: committed stripped; see notebooks/README.md). tests/test_notebooks.py
checks that the committed files are exactly what this script writes.

    python scripts/make_notebooks.py            # (re)write notebooks/ (and its README's list)
    python scripts/make_notebooks.py --check    # exit 1 if notebooks/ differs from the output

Steps come from the registry (``registry.step_ids()``); a step without a lessons file (or
with one still being written) still gets a notebook, with the registry's lesson, its source
and diffs, every generated table, and a note where its narrative is missing. Each step
notebook shows the step's TIRx source on both arches, its code-only diff against the step it
extends and the sm_100a/sm_90a twin diff, all read from steps/ when the notebook runs
(``tirx_gemm.notebook.step_source`` / ``step_diff`` / ``twin_diff``); the lesson's optional
"Reading the code" section says where in them the lesson is. notebooks/README.md keeps its
prose; its list of notebooks, between two markers, is generated here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbformat
from nbformat import v4

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing: import tirx_gemm here
    sys.path.insert(0, str(ROOT))
NB_DIR = ROOT / "notebooks"
OVERVIEW = "00_overview.ipynb"
NBFORMAT_MINOR = 5  # pinned: the files must not change with the installed nbformat
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}

# --------------------------------------------------------------------------------------
# narrative, per step id: slug (file name), title, what changes, barriers, SASS notes
# --------------------------------------------------------------------------------------
TRACKS_NOTE = (
    "Both tracks appear where the registry lists them: **sm_100a** (Blackwell, tcgen05, "
    "accumulator in tensor memory; compiled here and executed on NumSim, a CPU model of "
    "sm_100a, never on silicon: no Blackwell GPU) and its "
    "**sm_90a** twin (Hopper, wgmma, accumulator in registers; runs on an H200). A twin the "
    "registry does not list yet is reported as such by the cells below.")

LESSONS_DIR = ROOT / "steps" / "lessons"
_SECTIONS = {"What changes": "changes", "Reading the code": "code",
             "Barriers: sm_100a": "barriers_sm100a", "Barriers: sm_90a": "barriers_sm90a",
             "SASS": "sass"}
_FIELDS = {"slug": "slug", "title": "title", "cuda excerpt lines": "lines"}
_OPTIONAL = {"code"}  # "Reading the code": where in the source and diffs the lesson sits


def _read_lesson(path: Path) -> dict:
    """One steps/lessons/vN.md: header lines ``key: value``, then ``## <section>`` blocks."""
    out: dict = {}
    section = None
    body: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            if section:
                out[section] = "\n".join(body).strip("\n")
            name = line[3:].strip()
            if name not in _SECTIONS:
                raise ValueError(f"{path}: unknown section {name!r} (known: {', '.join(_SECTIONS)})")
            section, body = _SECTIONS[name], []
        elif section:
            body.append(line)
        elif ": " in line and not line.startswith("<!--"):
            key, value = line.split(": ", 1)
            if key in _FIELDS:
                out[_FIELDS[key]] = int(value) if key == "cuda excerpt lines" else value.strip()
    if section:
        out[section] = "\n".join(body).strip("\n")
    missing = [k for k in (*_FIELDS.values(), *_SECTIONS.values())
               if k not in out and k not in _OPTIONAL]
    if missing:  # a lesson being written: its notebook says what is missing, never breaks
        print(f"make_notebooks: note: {path} lacks {', '.join(missing)}; its notebook says "
              "so", file=sys.stderr)
    return out


# the narrative of each step lives next to the step, in steps/lessons/<step>.md
NARRATIVE: dict[str, dict] = {p.stem: _read_lesson(p) for p in sorted(LESSONS_DIR.glob("v*.md"))}

NOT_WRITTEN = "_(not written yet: `steps/lessons/{sid}.md` has no \"{section}\" section)_"


def _lesson(step_id: str, key: str, section: str) -> str:
    n = NARRATIVE.get(step_id, {})
    return n[key] if n.get(key) else NOT_WRITTEN.format(sid=step_id, section=section)


# --------------------------------------------------------------------------------------
# notebook assembly
# --------------------------------------------------------------------------------------
def _slug(step_id: str) -> str:
    if NARRATIVE.get(step_id, {}).get("slug"):
        return NARRATIVE[step_id]["slug"]
    from tirx_gemm import registry
    lesson = next(s.lesson for s in registry.STEPS if s.id == step_id)
    words = [w for w in "".join(c if c.isalnum() else " " for c in lesson.split(":")[0].lower()
                                ).split()][:3]
    return "_".join(words) or "step"


def notebook_names() -> dict[str, str]:
    """step id -> notebook file name, for every step id in the registry."""
    from tirx_gemm import registry
    return {sid: f"{int(sid.lstrip('v')):02d}_{_slug(sid)}.ipynb" for sid in registry.step_ids()}


def _cells(stem: str, specs: list[tuple[str, str]]):
    cells = []
    for i, (kind, src) in enumerate(specs):
        cell = v4.new_markdown_cell(src) if kind == "md" else v4.new_code_cell(src)
        cell["id"] = f"{stem}-{i:02d}"
        cells.append(cell)
    return cells


def _notebook(stem: str, specs: list[tuple[str, str]]) -> str:
    nb = v4.new_notebook()
    nb.nbformat_minor = NBFORMAT_MINOR
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    nb.cells = _cells(stem, specs)
    nbformat.validate(nb)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _nav(step_id: str, names: dict[str, str]) -> str:
    ids = list(names)
    i = ids.index(step_id)
    parts = []
    if i > 0:
        parts.append(f"[<- {ids[i - 1]}]({names[ids[i - 1]]})")
    parts.append(f"[overview]({OVERVIEW})")
    if i + 1 < len(ids):
        parts.append(f"[{ids[i + 1]} ->]({names[ids[i + 1]]})")
    return " · ".join(parts)


def _title(step_id: str) -> str:
    from tirx_gemm import registry
    n = NARRATIVE.get(step_id, {})
    return n.get("title") or next(s.lesson for s in registry.STEPS if s.id == step_id).split(":")[0]


def _code_cells(step_id: str) -> list[tuple[str, str]]:
    """The source of both arches, the code-only diff against the step it extends, and the
    twin diff: every text read from steps/ when the notebook runs (tirx_gemm.notebook)."""
    from tirx_gemm import notebook as nbm
    from tirx_gemm import registry
    bases = {a: nbm.diff_base(step_id, a) for a in nbm.arches(step_id)}
    known = sorted({b for b in bases.values() if b}, key=registry.step_ids().index)
    pointer = NARRATIVE.get(step_id, {}).get("code") or (
        "the step card (the docstring at the top of each source) lists what changed; the "
        "hunk headers below name the part of the builder each change sits in.")
    if known:
        diff_head = (f"## The diff against {' / '.join(known)}, code only\n\n"
                     + ("" if known == [nbm.previous_step_id(step_id)] or len(known) != 1 else
                        f"The step card names {known[0]} as the step this one extends, so "
                        f"the diff is against {known[0]}, not the step before it.\n\n"))
    else:
        diff_head = ("## The diff, code only\n\nThis is the first step: there is no earlier "
                     "step to diff against, so the source above is the whole lesson.\n\n")
    return [
        ("md", "## The code\n\nThe step's TIRx builder on each arch, read from `steps/` when "
               "this cell runs (the registry's `Step.source_file`), so it is always the code "
               "that the builds below compile. The docstring at the top of the builder is the "
               "step card; the kernel is the `@T.prim_func` nested in the builder (or an inlined "
               "function it calls), its body cut into `# --- allocate / load / compute / "
               "writeback / free ---` sections."),
        ("code", "nb.step_source(STEP, \"sm_100a\")"),
        ("code", "nb.step_source(STEP, \"sm_90a\")"),
        ("md", diff_head
               + "What changed, as code: comments, docstrings and blank lines are stripped "
               "from both files before the diff, so every `+`/`-` line is code. Each hunk "
               "header gives the line numbers in both files and the part of the builder it "
               "touches (host side, or a `# ---` section of the kernel).\n\n"
               "**Where the lesson is:** " + pointer),
        ("code", "nb.step_diff(STEP, \"sm_100a\")"),
        ("code", "nb.step_diff(STEP, \"sm_90a\")"),
        ("md", "## The twin diff: sm_100a against sm_90a\n\nThe same step on the two arches, "
               "code only: what is Blackwell's (tcgen05 MMA into tensor memory, TMEM "
               "allocation and loads) and what is Hopper's (wgmma into registers, "
               "descriptors, register budgets), and what the two tracks share through "
               "`tirx_gemm.helpers` (identical lines, so they do not appear)."),
        ("code", "nb.twin_diff(STEP)"),
    ]


def _suite_cells(step_id: str, names: dict[str, str]) -> list[tuple[str, str]]:
    """The shape suite, before and after: only in the notebook of the step tirx_gemm.matmul
    uses to split K (matmul.SPLIT_K), against the step it falls back to (DATA_PARALLEL)."""
    from tirx_gemm import matmul
    if step_id != matmul.SPLIT_K:
        return []
    edges = next((sid for sid, n in NARRATIVE.items() if "TMA" in n.get("title", "")), None)
    link = f" ([{edges}]({names[edges]}))" if edges in names else ""
    return [
        ("md", "## Every shape a model has: edges and split-K over the shape suite\n\n"
               "Two things let the steps take real models' shapes. **Edges** (the TMA "
               f"step's lesson{link}): from the first TMA step on, every step takes any M and "
               "N, K multiples of 8; TMA zero-fills loads past the tensor's edge and clips "
               "stores, and tile counts are ceil-divisions. **Split-K** (this step): when the "
               "output tiles are fewer than the SMs, K is cut across CTAs and the partial "
               "sums reduced. `tirx_gemm.matmul` picks between them per shape; the public "
               "shape suite (`tirx_gemm/op/suites/models.json`) lists the shapes and why each is "
               "there. Below: what `matmul` would run for each, decided now from the shape "
               "alone."),
        ("code", "nb.suite_cases()"),
        ("md", f"**Before and after**, measured: the ratio to `torch.matmul` (timed in the "
               f"same run) for every suite case, before = `{matmul.DATA_PARALLEL}` alone (the "
               f"last data-parallel step), after = what `tirx_gemm.matmul` runs (split-K where "
               "the tiles are too few). Drawn from the recorded suite runs in "
               "`results/suites/*.jsonl` only; where there are none, the cell says so."),
        ("code", "nb.suite_plot()"),
    ]


def _chooser_cells(step_id: str) -> list[tuple[str, str]]:
    """The tile menu's notebook: per suite shape, what matmul's chooser picks, what its
    model predicted, what was measured on the H200 and what cuBLAS launched."""
    from tirx_gemm import matmul
    if step_id != matmul.TILE_MENU:
        return []
    return [
        ("md", "## The chooser over the shape suite: picked, predicted, measured\n\n"
               "`tirx_gemm.matmul` picks a kernel per shape with `tirx_gemm/op/chooser.py`: a "
               "cost model fitted to H200 sweeps of the menu, and rules beside it where "
               "the model has no term (swap-AB for few tokens, CTA pairs on misaligned K, "
               "ping-pong for a short K, `SPLIT_K` for few tiles with a deep K). Each row: "
               "the pick (decided now from the shape), which part of the chooser made it, "
               "the model's prediction (a rule's pick has none), the recorded H200 time "
               "and the kernel torch.matmul ran, read from its profiler record."),
        ("code", "nb.chooser_table()"),
        ("md", "The same table over 21 real-model shapes that the chooser was never fitted "
               "or tuned on (Qwen2-7B, Phi-3-mini, Llama-2-13B, Llama-3-70B, ViT-B/16, "
               "Mixtral, Gemma-2-2B, Whisper): how its model and rules do where they were not "
               "tuned. Its weak rows are still open (torch.matmul's kernels "
               "were not profiled at these shapes)."),
        ("code", "nb.chooser_table(run=nb.HELDOUT_RUN)"),
        ("md", "Why a row got its kernel: `matmul.explain` (the CLI's `tirx-gemm choose "
               "M,N,K`) prints the pick and, one line per rule that decided it, the figures "
               "it went by. Try your own shapes: a decode step clustered along the weight, "
               "a deep K split, a mid-size square on the model's tile."),
        ("code", "from tirx_gemm import matmul\n"
                 "for mnk in ((72, 4608, 4096), (128, 128, 65536), (2304, 2304, 2304)):\n"
                 "    print(matmul.explain(*mnk, \"bfloat16\"), end=\"\\n\\n\")"),
    ]


def _timeline_cells(step_id: str) -> list[tuple[str, str]]:
    """From v4 on (TMA, barriers): the timeline recorded on a Hopper GPU; the sm_100a
    call says why there is none (NumSim has no clock)."""
    if int(step_id.lstrip("v")) < 4:
        return []
    return [
        ("md", "## Timeline: who waited, when\n\nAn instrumented build "
               "(`tirx-gemm export --timeline`, then `tirx-gemm trace`) records, in "
               "the kernel, when each role of each CTA waited for data or a free stage, "
               "issued its loads and wgmmas, and ran its epilogue (the GPU's global "
               "timer, an extra operand after D; the verbs emit the events, the step "
               "file has no line for it). The chart shows the first two clusters' "
               "CTAs around the first tile boundary; the text under it summarises "
               "the whole run and what recording cost."),
        ("code", "nb.timeline(STEP, \"sm_90a\")"),
        ("code", "nb.timeline(STEP, \"sm_100a\")"),
    ]


def step_notebook(step_id: str, names: dict[str, str]) -> str:
    from tirx_gemm import notebook as nbm
    from tirx_gemm import registry
    n = NARRATIVE.get(step_id, {})
    lesson = next(s.lesson for s in registry.STEPS if s.id == step_id)
    prev = nbm.previous_step_id(step_id)
    lines = n.get("lines") or 70
    S = repr(step_id)

    specs: list[tuple[str, str]] = [
        ("md", f"# {step_id}: {_title(step_id)}\n\n{_nav(step_id, names)}\n\n"
               f"**Lesson (registry):** {lesson}\n\n{TRACKS_NOTE}\n\n"
               "This notebook is generated by `scripts/make_notebooks.py` and holds no kernel "
               "code: every cell calls the package (`tirx_gemm.notebook`, which reads the "
               "registry, the step sources, the build harness and `results/`)."),
        ("code", f"from tirx_gemm import notebook as nb\n\nSTEP = {S}\nnb.step_overview(STEP)"),
        ("md", "## What changes" + (f" from {prev}" if prev else "") + ", and why\n\n"
               + _lesson(step_id, "changes", "What changes")),
        *_code_cells(step_id),
        ("md", "## Barriers and phases\n\nOne row per synchronisation object: who arrives, "
               "who waits, the phase the waiters start from and when that phase flips. (An "
               "mbarrier wait for parity p returns once the barrier's phase with parity p has "
               "completed; a fresh barrier is in phase 0.)\n\n"
               "### sm_100a\n\n" + _lesson(step_id, "barriers_sm100a", "Barriers: sm_100a")
               + "\n\n### sm_90a\n\n" + _lesson(step_id, "barriers_sm90a", "Barriers: sm_90a")),
        ("md", "## Build it\n\nThe package's builder for every arch the registry lists, at the "
               "step's canonical shape. `tirx_gemm.compile.api.build` compiles in a worker process "
               "(TVM -> CUDA -> nvcc -> cubin -> SASS) and caches the result on disk under "
               "`$TIRX_GEMM_CACHE` (default `~/.cache/tirx-gemm`): a repeat is a file read."),
        ("code", "builds = nb.build_step(STEP)  # arch -> tirx_gemm.compile.api.BuildResult\n"
                 "nb.build_summary(builds)"),
        ("md", "## The generated CUDA\n\nThe kernel body TVM generated, as a *skeleton*: "
               "control flow, barriers, MMA issue, TMA and fences kept, everything else "
               "dropped, runs of identical calls folded, long lines cut. "
               "(`nb.cuda_excerpt(..., skeleton=False)` shows the verbatim text; "
               "`tirx-gemm show " + step_id + " --cuda` prints all of it.)"),
        ("code", f"nb.cuda_excerpt(STEP, \"sm_100a\", lines={lines})"),
        ("code", f"nb.cuda_excerpt(STEP, \"sm_90a\", lines={lines})"),
        ("md", "## SASS: " + (f"{prev} vs {step_id}" if prev else "what the step compiles to")
               + "\n\nCounts of the opcodes the lessons talk about (prefix match on the "
               "mnemonic; the K-loops are kept rolled, so counts are per loop body, not per K) "
               "and the total instruction count.\n\n" + (n.get("sass") or "")),
        ("code", "nb.sass_compare(STEP)"),
        ("md", "## Registers and shared memory\n\nFrom `ptxas -v` (registers, static shared "
               "memory, spills) and the launch parameters (dynamic shared memory per CTA)"
               + (f", this step next to {prev}" if prev else "") + "."),
        ("code", "nb.resource_table(STEP)"),
        ("md", "## Run it, or read the recorded results\n\nWhere a GPU of an arch is present "
               "(and the build or a bundle in `$TIRX_GEMM_BUNDLE` is available), the step is "
               "checked against the fp32 torch reference and timed here via "
               "`tirx_gemm.run.runner`; otherwise the recorded results from `results/` are shown "
               "with the GPU they ran on. sm_100a has no recorded run: no Blackwell GPU was "
               "available."),
        ("code", "nb.measure_or_recorded(STEP)"),
        *_timeline_cells(step_id),
        ("md", "## Simulate it on a CPU model of Blackwell\n\nNo Blackwell GPU was available, "
               "so the sm_100a step is executed on tirx-harness NumSim, a CPU model of sm_100a "
               "(tcgen05/TMEM, TMA, mbarrier phases and byte counts), at the registry's "
               "simulation shapes, and checked by synccheck (deadlocks, phase overtaking) and "
               "racecheck (races, missing proxy fences). It runs live where the simulator is "
               "installed (Python >= 3.12, `pip install -e \".[sim]\"`); otherwise the latest "
               "recorded simulation is shown. It proves numbers and synchronization on a "
               "model: no timing, not silicon."),
        ("code", "nb.simulation(STEP)"),
        *_suite_cells(step_id, names),
        *_chooser_cells(step_id),
        ("code", "nb.results_table(STEP)"),
        ("md", "Every step's recorded result at its canonical shape, this one highlighted "
               "(a matplotlib plot with the `plot` extra installed, a table otherwise)."),
        ("code", "nb.plot_results(highlight=STEP)"),
    ]
    return _notebook(names[step_id].removesuffix(".ipynb"), specs)


def _step_list(names: dict[str, str], link_prefix: str = "") -> str:
    """One line per registry step: its notebook, title and arches (generated, never typed)."""
    from tirx_gemm import notebook as nbm
    return "\n".join(f"- [`{name}`]({link_prefix}{name}): **{sid}**, {_title(sid)} "
                     f"({', '.join(nbm.arches(sid))})" for sid, name in names.items())


def overview_notebook(names: dict[str, str]) -> str:
    from tirx_gemm import registry
    ids = registry.step_ids()
    mapping = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in names.items()) + "}"
    specs: list[tuple[str, str]] = [
        ("md", f"# tirx-gemm: the path from one tile ({ids[0]}) to {ids[-1]}\n\n"
               "A stepwise fp16/bf16 GEMM, `D = A @ B.T` (A is MxK, B is NxK, fp16 or bf16 "
               "in, fp32 accumulate, output in the input dtype), written in Apache TVM's "
               f"TIRx. Each step changes one contract; each of the registry's {len(ids)} "
               "steps has a notebook:\n\n" + _step_list(names) + "\n\n" + TRACKS_NOTE + "\n\n"
               "**How these notebooks work.** They are generated by "
               "`scripts/make_notebooks.py` and committed without outputs; they hold narrative "
               "and calls into `tirx_gemm.notebook`, never kernel code (each step notebook "
               "shows its step's source as read from `steps/`). Builds use the "
               "canonical shapes and are cached on disk (`$TIRX_GEMM_CACHE`). To run them: "
               "`pip install -e '.[test,plot]'` plus Jupyter, then open this folder. No GPU is "
               "needed: without one the notebooks show the recorded results."),
        ("code", "from tirx_gemm import notebook as nb\n\n"
                 f"NOTEBOOKS = {mapping}\n"
                 "nb.path_table(NOTEBOOKS)"),
        ("md", "## What can run here"),
        ("code", "nb.device_status()"),
        ("md", "## mbarriers in one paragraph\n\n"
               "An mbarrier lives in shared memory and counts arrivals (and, for TMA, "
               "transaction bytes: `arrive.expect_tx` announces them, the copy engine "
               "completes them). When the expected arrivals and bytes are in, the current "
               "*phase* completes and the next begins. Waiters name the *parity* (0 or 1) of "
               "the phase they wait for; the wait returns once that phase has completed. A "
               "fresh barrier is in phase 0, so a wait for parity 1 returns at once: that is "
               "how v7's producers start with every stage empty. A barrier reused in a loop "
               "completes one phase per use, so the waiter flips its parity per use (v2), per "
               "trip around a ring (v5), and carries it across tiles (v6, v7). Only a warp "
               "that cannot fall a whole phase behind may watch a barrier: in sm_100a v4-v6 "
               "that is warp 0 alone, in v7 each role's own warp. Each step notebook has the "
               "table for its step."),
        ("md", "## Every step, compiled\n\nRegisters, shared memory, spills and size of every "
               "registered step at its canonical shape (built in parallel worker processes on "
               "a cache miss)."),
        ("code", "nb.resource_overview()"),
        ("code", "nb.sass_overview(\"sm_100a\")"),
        ("code", "nb.sass_overview(\"sm_90a\")"),
        ("md", "## Recorded results\n\nFrom `results/*.jsonl` (the same data as the README "
               "table), with the GPU named; sm_100a: not measured, no sm_100a GPU available."),
        ("code", "nb.results_table()"),
        ("code", "nb.plot_results()"),
    ]
    return _notebook(OVERVIEW.removesuffix(".ipynb"), specs)


# --------------------------------------------------------------------------------------
# notebooks/README.md: its list of notebooks is generated between two markers
# --------------------------------------------------------------------------------------
README = "README.md"
README_BEGIN = "<!-- notebooks:begin (generated by scripts/make_notebooks.py) -->"
README_END = "<!-- notebooks:end -->"


def readme_text(names: dict[str, str], current: str) -> str:
    """``current`` (notebooks/README.md) with the list between the markers regenerated."""
    if README_BEGIN not in current or README_END not in current:
        raise ValueError(f"notebooks/{README} lacks the markers {README_BEGIN!r} and "
                         f"{README_END!r} around its list of notebooks")
    head, rest = current.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    body = (f"- [`{OVERVIEW}`]({OVERVIEW}): the whole path, every step compiled, the "
            "recorded results\n" + _step_list(names))
    return head + README_BEGIN + "\n" + body + "\n" + README_END + tail


def render() -> dict[str, str]:
    """File name -> exact file text, for every notebook this script writes."""
    names = notebook_names()
    out = {OVERVIEW: overview_notebook(names)}
    for sid, name in names.items():
        out[name] = step_notebook(sid, names)
    return out


def render_readme() -> str:
    """notebooks/README.md as this script writes it (its generated list updated)."""
    return readme_text(notebook_names(), (NB_DIR / README).read_text(encoding="utf-8"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if notebooks/ differs from what would be written")
    args = ap.parse_args(argv)
    files = render() | {README: render_readme()}
    stale = sorted(p.name for p in NB_DIR.glob("*.ipynb") if p.name not in files)
    differ = sorted(n for n, text in files.items()
                    if not (NB_DIR / n).exists()
                    or (NB_DIR / n).read_text(encoding="utf-8") != text)
    if args.check:
        for n in differ:
            print(f"differs from the generator: notebooks/{n}")
        for n in stale:
            print(f"not produced by the generator: notebooks/{n}")
        return 1 if (differ or stale) else 0
    NB_DIR.mkdir(exist_ok=True)
    for n in differ:
        (NB_DIR / n).write_text(files[n], encoding="utf-8")
        print(f"wrote notebooks/{n}")
    for n in stale:
        print(f"note: notebooks/{n} is not produced by the generator (remove it?)")
    if not differ:
        print(f"notebooks/ is up to date ({len(files) - 1} notebooks and {README})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
