"""One home per fact: every copy of a fact in prose is generated from its home or
checked against it here, so a drifted copy fails a test.

- the README's path table: generated from tirx_gemm/registry.py (records.path_table);
- published figures we did not measure (the book's and the article series' B200 TFLOP/s,
  fast.cu's): tirx_gemm/report/published.py;
- shared memory per CTA and register figures (compiled counts, setmaxnreg splits, the
  cap at a launch's thread count) from the build expectations, goldens/expectations/
  build.json (`tirx-gemm regress --cpu --update`): generated into the lessons by
  scripts/render_docs.py (fresh: its --check); what prose still types by hand (arithmetic,
  a builder's defaults) is checked against the build here, and a card quotes no SMEM figure;
- each lesson's barrier table: the mbarriers the step's kernels declare; the arrival
  counts are generated from the declarations by scripts/render_docs.py;
- no prose cites a Markdown file that does not exist, or counts the steps by hand."""
import ast
import functools
import glob
import json
import os
import re
from pathlib import Path

import pytest
from support import load_script

from tirx_gemm import registry
from tirx_gemm.report import published
from tirx_gemm.report.records import PATH_BEGIN, PATH_END, between_markers
from tirx_gemm.report.records import path_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LESSONS = sorted((ROOT / "steps" / "lessons").glob("v*.md"))
CARDS = sorted((ROOT / "steps").glob("sm*/hgemm_v*.py"))
EXPECTATIONS = json.loads((ROOT / "goldens" / "expectations" / "build.json").read_text())


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_readme_path_table_is_generated_from_the_registry():
    block = between_markers(README.read_text(encoding="utf-8"), PATH_BEGIN, PATH_END)
    assert block == path_table(registry.STEPS), (
        "README's path table differs from the registry: run python scripts/render_results.py")


def test_path_table_lists_every_step_once_with_each_arch_lesson():
    rows = path_table(registry.STEPS).splitlines()[2:]
    ids = [r.split("|")[1].strip() for r in rows]
    assert ids == sorted(set(ids), key=lambda i: int(i[1:]))
    for s in registry.STEPS:
        row = rows[ids.index(s.id)]
        assert s.idea in row, (s.key, row)


# --------------------------------------------------------------------------------------
# published figures
# --------------------------------------------------------------------------------------
def _sentences(text: str) -> list[str]:
    """Sentences, with each table cell and paragraph apart."""
    out = []
    for block in re.split(r"\n\s*\n|\|", text):
        out += re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", re.sub(r"\s+", " ", block))
    return out


# a throughput figure: "1460 TFLOP/s", "1328 and 1460 TFLOP/s", "cuBLAS 1460", "vs 1328 for
# v8", "against 607 for step 7"
_NUMBER = re.compile(r"\b(\d{3,4})(?= TFLOP/s| and \d{3,4} TFLOP/s)|(?<=cuBLAS )(\d{3,4})\b"
                     r"|(?<=vs )(\d{3,4})(?= for)|(?<=against )(\d{3,4})(?= for)")
_PROSE = [README, *LESSONS, *CARDS]


def _b200_quotes():
    """(file, sentence, number) for every throughput figure in a sentence that quotes B200
    throughput (mentions B200 and TFLOP/s)."""
    for path in _PROSE:
        for s in _sentences(path.read_text(encoding="utf-8")):
            if "B200" in s and "TFLOP/s" in s:
                for m in _NUMBER.finditer(s):
                    yield path, s, int(next(g for g in m.groups() if g))


def test_b200_figures_in_prose_are_the_published_ones():
    quotes = list(_b200_quotes())
    assert len(quotes) >= 5, quotes  # the README, lessons v4/v7/v8/v9 and the cards quote them
    wrong = [f"{_rel(p)}: {n} in '{s[:160]}'" for p, s, n in quotes
             if n not in published.B200_TFLOPS]
    assert not wrong, ("figures that are not in tirx_gemm/report/published.py "
                       f"({sorted(published.B200_TFLOPS)}):\n" + "\n".join(wrong))


def test_each_quoted_figure_says_whose_it_is():
    """A sentence that quotes a B200 figure names its source (the book, the article series,
    published) or says it was not measured here: never passed off as ours."""
    for p, s, n in _b200_quotes():
        assert re.search(r"book|article series|published|not measured", s), (_rel(p), s)


def test_readme_quotes_the_books_figures():
    text = re.sub(r"\s+", " ", README.read_text(encoding="utf-8"))
    f = published.get
    assert (f"book measured {f('b200_step8').value:g} and {f('b200_step9').value:g} TFLOP/s "
            f"on a B200 at 4096³, cuBLAS {f('b200_cublas').value:g}") in text


def test_readme_quotes_the_tirx_kernel_librarys_ratio():
    text = re.sub(r"\s+", " ", README.read_text(encoding="utf-8"))
    ratio = published.get("tirx_kernels_b200_ratio").value
    assert f"library reports {ratio:g}x cuBLAS at bf16 4096³ on a B200: its figure" in text
    assert len(re.findall(r"\b0\.98\dx cuBLAS", text)) == 1  # quoted once, never retyped


def test_fast_cu_figures_agree():
    f = published.get
    split = f"{f('h100_producer_regs').value:g}/{f('h100_consumer_regs').value:g} register split"
    assert split in re.sub(r"\s+", " ", README.read_text(encoding="utf-8"))
    card = re.sub(r"\s+", " ", (ROOT / "steps" / "sm90a" / "hgemm_v8.py").read_text())
    gain = f"+{f('h100_multicast_gain_low').value:g}-{f('h100_multicast_gain_high').value:g}%"
    assert f"fast.cu reports {gain}" in card


# --------------------------------------------------------------------------------------
# shared memory per CTA against the build expectations
# --------------------------------------------------------------------------------------
# a per-CTA total: "65 KiB SMEM per CTA", "33 KiB of SMEM", "(97 KiB per CTA)", "~208 KiB of
# SMEM each", "(161 KiB SMEM)", "(66 KB SMEM, ..."; not a stage, a tile or a load ("48 KiB
# stages", "32 KB of loads", "16 KiB each", "32 KiB per stage")
_SMEM = re.compile(r"(~?)(\d+) (KiB|KB) (?:of )?(?:SMEM|shared memory)(?! per stage)"
                   r"|\((~?)(\d+) (KiB|KB) per CTA\)")


def _expect(step_id: str, arch: str) -> dict | None:
    """The build expectations of the step at its canonical shape."""
    s = registry.get(step_id, arch)
    return EXPECTATIONS.get(f"{s.key}:{'x'.join(map(str, s.canonical))}")


def _expected_kib(step_id: str, arch: str) -> int | None:
    entry = _expect(step_id, arch)
    return None if entry is None else round(entry["smem_bytes"] / 1024)


def _arches_of_line(path: Path, line: str, header: list[str] | None) -> dict[int, str]:
    """{character offset where a cell starts: arch} for a lesson's two-arch table row."""
    if not line.startswith("|") or not header:
        return {}
    out, pos = {}, 0
    for i, cell in enumerate(line.split("|")):
        if i < len(header) and header[i] in registry.ARCHES:
            out[pos] = header[i]
        pos += len(cell) + 1
    return out


def _with_next_line(lines: list[str], i: int) -> str:
    """Line ``i`` of prose and, when neither is a table row, the next line joined to it with
    one space (its indentation dropped): a figure that wraps ("~160 KiB" at a line's end,
    "of SMEM" on the next) is matched whole, from the line where it starts."""
    line = lines[i]
    if i + 1 < len(lines) and line.strip() and not line.lstrip().startswith("|"):
        nxt = lines[i + 1].strip()
        if nxt and not nxt.startswith("|"):
            return line.rstrip() + " " + nxt
    return line


def _quotes(pattern: re.Pattern, files=None):
    """(file, line number, match, arches it may refer to, step id) for every match of
    ``pattern`` in a lesson or a step card (``files``: (path, text) pairs, default all of
    them): a lesson's two-arch table cell names its arch, "... on sm_90a" right after a
    figure names it, a card is its own arch's. A match may run on into the next line (a
    wrapped figure); it is reported once, at the line where it starts."""
    if files is None:
        files = [(path, path.read_text(encoding="utf-8")) for path in LESSONS + CARDS]
    for path, text in files:
        step_id = re.search(r"v\d+", path.stem).group(0)
        if path.suffix == ".py":
            default_arches = [path.parent.name[:2] + "_" + path.parent.name[2:]]
        else:
            default_arches = list(registry.ARCHES)
        header = None
        lines = text.splitlines()
        for i, line in enumerate(lines):
            n = i + 1
            if line.startswith("|") and "sm_100a" in line and "sm_90a" in line:
                header = [c.strip().strip("*") for c in line.split("|")]
            elif not line.startswith("|"):
                header = None
            cells = _arches_of_line(path, line, header)
            window = _with_next_line(lines, i)
            for m in pattern.finditer(window):
                if m.start() >= len(line.rstrip()):
                    continue  # it starts on the next line: reported there
                arch = [a for start, a in sorted(cells.items()) if start <= m.start()]
                inline = re.match(r"[^,;)]{0,20}?\bon (sm_100a|sm_90a)", window[m.end():])
                if inline:
                    arch = [inline.group(1)]
                yield path, n, m, ([arch[-1]] if arch else default_arches), step_id


def _smem_quotes(files=None):
    """(file, line number, quoted KiB, approximate?, arches it may refer to, step id)."""
    for path, n, m, arches, step_id in _quotes(_SMEM, files):
        approx = m.group(1) or m.group(4)
        yield path, n, int(m.group(2) or m.group(5)), bool(approx), arches, step_id


def _smem_problems(quotes) -> list[str]:
    wrong = []
    for path, n, kib, approx, arches, step_id in quotes:
        if not any(registry.get(step_id, a) for a in arches if _has(step_id, a)):
            continue
        expected = {a: _expected_kib(step_id, a) for a in arches if _has(step_id, a)}
        if kib not in expected.values():
            wrong.append(f"{_rel(path)}:{n}: {'~' if approx else ''}{kib} KiB, the build "
                         f"(goldens/expectations/build.json) has "
                         + ", ".join(f"{step_id}@{a} {v} KiB" if v is not None else
                                     f"{step_id}@{a} no expectation recorded"
                                     for a, v in expected.items()))
    return wrong


def test_smem_figures_in_lessons_and_cards_are_generated():
    """A lesson's per-CTA shared memory is a generated figure (<!-- build:smem_kib vN@arch -->,
    scripts/render_docs.py, fresh: test_generated_lesson_figures_are_fresh); a card points at
    its lesson. A hand-typed one is reported with what the build has."""
    marked = sum(len(re.findall(r"<!-- build:smem_kib ", p.read_text(encoding="utf-8")))
                 for p in LESSONS)
    assert marked >= 5, marked
    quotes = list(_smem_quotes())
    assert not quotes, ("shared memory typed by hand in prose (use a <!-- build:smem_kib --> "
                        "marker in the lesson):\n" + "\n".join(
                            f"{_rel(p)}:{n}: {kib} KiB" for p, n, kib, *_ in quotes)
                        + "\n" + "\n".join(_smem_problems(quotes)))


def test_a_figure_that_wraps_across_a_line_is_still_checked():
    # "~160 KiB" at the end of a card line and "of SMEM" on the next slipped past
    # a line-by-line match; the same text must now be found, and fail against the 161 KiB built
    card = ROOT / "steps" / "sm100a" / "hgemm_v11.py"
    text = ("    one CTA per SM (all of TMEM and ~160 KiB\n"
            "        of SMEM each), and SM_COUNT no larger than the GPU's SM count.\n")
    quotes = list(_smem_quotes([(card, text)]))
    assert [(n, kib, approx) for _, n, kib, approx, _, _ in quotes] == [(1, 160, True)], quotes
    assert any("~160 KiB" in w and "161 KiB" in w for w in _smem_problems(quotes))
    # a figure split inside its own words, and a register count split from its noun
    assert [kib for _, _, kib, *_ in _smem_quotes([(card, "(161\n KiB per CTA) and 161\nKiB of SMEM")])] \
        == [161, 161]
    regs = [m.group(1) for _, _, m, _, _ in _quotes(_REG_ANY, [(card, "holds 224\n  registers")])]
    assert regs == ["224"], regs


# --------------------------------------------------------------------------------------
# register figures against the build expectations
# --------------------------------------------------------------------------------------
# Every "N registers" in a lesson or a card, and every setmaxnreg split, is one of:
# - a setmaxnreg split: "down to 56 registers, the epilogue up to 224", "`setmaxnreg` 40
#   (producer) / 232 (consumers)", "default v8's 40/232", "128 x 56 + 256 x 224 =
#   384 x 168", "128*40 + 256*232" -> the build's setmaxnreg dec/inc (and threads);
# - the register cap of a launch: "168 registers at 384 threads" -> 64K / threads rounded
#   down to 8, at the build's thread count;
# - loads in flight: "8 chunks (32 registers)", "IN_FLIGHT = 8 ... (32 registers)" -> the
#   step's CHUNK floats per chunk; "BLK_N / 4 = 32 registers for 128x128" -> the arithmetic;
# - otherwise a compiled count ("142 registers"), which must be the build's.
_REG_SPLIT = re.compile(
    r"down to (?P<dec>\d+) registers, the epilogue up to (?P<inc>\d+)"
    r"|`setmaxnreg` (?P<dec2>\d+) \(producer\) / (?P<inc2>\d+) \(consumers\)"
    r"|setmaxnreg, default v\d+'s (?P<dec3>\d+)/(?P<inc3>\d+)"
    r"|128 ?[x*] ?(?P<dec4>\d+) \+ 256 ?[x*] ?(?P<inc4>\d+)(?: = (?P<thr>\d+) x (?P<cap>\d+))?")
_REG_CAP = re.compile(r"(?P<regs>\d+) registers at (?P<threads>\d+) threads")
_REG_INFLIGHT = re.compile(r"(?P<chunks>\d+) chunks \((?P<regs>\d+) registers\)"
                           r"|IN_FLIGHT = (?P<chunks2>\d+) .*\((?P<regs2>\d+) registers\)"
                           r"|BLK_N / (?P<div>\d+) = (?P<regs3>\d+) registers for (?P<n>\d+)x")
_REG_ANY = re.compile(r"\b(\d+) registers\b")


def _chunk_floats(step_id: str, arch: str) -> int | None:
    """fp32 values per slab chunk: the step's own CHUNK (v11), from its builder."""
    step = registry.get(step_id, arch)
    src = (ROOT / "steps" / arch.replace("_", "") / f"hgemm_{step_id}.py").read_text()
    return _builder_constants(src, step.builder()).get("CHUNK")


def _cap(threads: int) -> int:
    return 65536 // threads // 8 * 8


def _register_problems():
    """(problems, how many figures were checked)."""
    wrong, checked, claimed = [], 0, set()

    def where(path, n):
        return f"{_rel(path)}:{n}"

    def span_claim(path, n, m):
        claimed.add((path, n, m.start(), m.end()))

    for path, n, m, arches, step_id in _quotes(_REG_SPLIT):
        span_claim(path, n, m)
        g = {k: v for k, v in m.groupdict().items() if v is not None}
        dec = int(g.get("dec") or g.get("dec2") or g.get("dec3") or g.get("dec4"))
        inc = int(g.get("inc") or g.get("inc2") or g.get("inc3") or g.get("inc4"))
        builds = {a: _expect(step_id, a) for a in arches if _has(step_id, a)}
        ok = [a for a, e in builds.items()
              if e and e.get("setmaxnreg") == {"dec": [dec], "inc": [inc]}
              and ("thr" not in g or (int(g["thr"]) == e["threads"]
                                      and int(g["cap"]) == e["registers"]))]
        checked += 1
        if not ok:
            wrong.append(f"{where(path, n)}: setmaxnreg {m.group(0)!r}, the build has "
                         + ", ".join(f"{step_id}@{a} {e and e.get('setmaxnreg')}, "
                                     f"{e and e.get('threads')} threads, "
                                     f"{e and e.get('registers')} registers"
                                     for a, e in builds.items()))
    for path, n, m, arches, step_id in _quotes(_REG_CAP):
        span_claim(path, n, m)
        regs, threads = int(m.group("regs")), int(m.group("threads"))
        builds = {a: _expect(step_id, a) for a in arches if _has(step_id, a)}
        checked += 1
        if regs != _cap(threads) or not any(e and e["threads"] == threads
                                            for e in builds.values()):
            wrong.append(f"{where(path, n)}: {m.group(0)!r}: the cap at {threads} threads is "
                         f"{_cap(threads)}, the build launches "
                         + ", ".join(f"{a} {e and e['threads']}" for a, e in builds.items()))
    for path, n, m, arches, step_id in _quotes(_REG_INFLIGHT):
        span_claim(path, n, m)
        g = {k: v for k, v in m.groupdict().items() if v is not None}
        checked += 1
        if "div" in g:
            good = int(g["n"]) // int(g["div"]) == int(g["regs3"])
        else:
            chunks = int(g.get("chunks") or g["chunks2"])
            regs = int(g.get("regs") or g["regs2"])
            good = any(chunks * _chunk_floats(step_id, a) == regs
                       for a in arches if _has(step_id, a) and _chunk_floats(step_id, a))
        if not good:
            wrong.append(f"{where(path, n)}: {m.group(0)!r} does not add up")
    for path, n, m, arches, step_id in _quotes(_REG_ANY):
        if any(p == path and ln == n and a <= m.start() < b for p, ln, a, b in claimed):
            continue
        builds = {a: _expect(step_id, a) for a in arches if _has(step_id, a)}
        checked += 1
        if not any(e and e["registers"] == int(m.group(1)) for e in builds.values()):
            wrong.append(f"{where(path, n)}: {m.group(0)!r}, the build has "
                         + ", ".join(f"{step_id}@{a} {e and e['registers']}"
                                     for a, e in builds.items()))
    return wrong, checked


def test_register_figures_in_lessons_and_cards_match_the_build():
    wrong, checked = _register_problems()
    assert checked >= 5, checked  # what is still typed: arithmetic, builder defaults, v12
    assert not wrong, "register figures in prose differ from the build:\n" + "\n".join(wrong)


def test_the_register_check_fails_on_a_drifted_figure(monkeypatch):
    # the same check against a build whose sm_90a v9 split moved: the split its card quotes
    # (the builder's defaults, v8's 40/232) must fail
    key = next(k for k in EXPECTATIONS if k.startswith("v9@sm_90a:"))
    drifted = {**EXPECTATIONS, key: {**EXPECTATIONS[key],
                                     "setmaxnreg": {"dec": [48], "inc": [232]}}}
    monkeypatch.setitem(globals(), "EXPECTATIONS", drifted)
    wrong, _ = _register_problems()
    assert any("hgemm_v9.py" in w and "setmaxnreg" in w for w in wrong), wrong


# --------------------------------------------------------------------------------------
# each lesson's barrier table: generated from the barriers its kernels declare
# --------------------------------------------------------------------------------------
# scripts/render_docs.py fills every count cell (<!-- count -->...<!-- /count -->) from the
# builder's declaration (H.Ring's two counts, H.Barriers' .init(n), W.ClusterLaunchControl);
# here: every declared mbarrier has a row, no count is hand-typed, and the files are fresh.
RENDER_DOCS = load_script("scripts/render_docs.py")


def _builder_constants(src: str, builder) -> dict:
    return RENDER_DOCS.builder_constants(src, builder)


def _barrier_table(step_id: str, arch: str) -> tuple[str, list[list[str]]]:
    """(the lesson's "Barriers: <arch>" section, its table rows as lists of cells)."""
    text = (ROOT / "steps" / "lessons" / f"{step_id}.md").read_text(encoding="utf-8")
    m = re.search(rf"^## Barriers: {arch}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    section = m.group(1) if m else ""
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in section.splitlines()
            if ln.startswith("| ") and not ln.startswith("| barrier")]
    return section, rows


def _barrier_problems(step) -> list[str]:
    counts = RENDER_DOCS.declared_counts(step)
    # the names every builder of the file declares (a second one for another mode: hgemm_v14_mx)
    names_ = {n for b in RENDER_DOCS.builders(step) for n in RENDER_DOCS.declared_counts(step, b)}
    section, rows = _barrier_table(step.id, step.arch)
    where = f"steps/lessons/{step.id}.md (Barriers: {step.arch})"
    problems = []
    if not section:
        return [f"{where}: no such section"]
    for name in names_:
        if f"`{name}`" not in section and f"`{name}[" not in section:
            problems.append(f"{where}: the kernel declares mbarrier {name!r}; the table "
                            f"does not name it")
    for cells in rows:
        names = re.findall(r"`(\w+)(?:\[[^\]]*\])?`", cells[0])
        mbarriers = [n for n in names if n in counts]
        for n in names:
            if n not in names_ and re.fullmatch(r"[a-z][a-z0-9]*_?[a-z0-9]*", n) and (
                    "mbarrier" in cells[0] or "(full)" in cells[0] or "(empty)" in cells[0]):
                problems.append(f"{where}: row {cells[0]!r} names {n!r}, which the kernel "
                                f"does not declare")
        count = cells[1] if len(cells) > 1 else ""
        typed = _count_cell(count) if "<!-- count -->" not in count else None
        if len(mbarriers) == 1 and typed is not None:
            # a count still typed by hand (v12's lesson, not yet on markers): it must be the
            # declared one; better, a <!-- count --><!-- /count --> cell render_docs fills
            expr = counts[mbarriers[0]]
            value = RENDER_DOCS.count_value(step, expr) if expr is not None else None
            if value != typed:
                problems.append(f"{where}: {mbarriers[0]} arrival count {typed} in the "
                                f"table, the kernel initialises it with {expr} = {value}")
    return problems


def _count_cell(cell: str) -> int | None:
    m = re.match(r"(\d+)(?: x (\d+))?\b", cell.replace("*", ""))
    return None if m is None else int(m.group(1)) * int(m.group(2) or 1)


@pytest.mark.parametrize("step", registry.all_steps(), ids=lambda s: s.key)
def test_lesson_barrier_table_names_every_declared_mbarrier(step):
    """Every mbarrier the kernel declares has a row (or a mention) in its lesson's barrier
    table for that arch; a count cell is generated (render_docs), or, where still typed by
    hand, the count the kernel declares."""
    problems = _barrier_problems(step)
    assert not problems, "\n".join(problems)


def test_a_hand_typed_count_is_checked(monkeypatch):
    step = registry.get("v7", "sm_100a")
    real = _barrier_table

    def typed(step_id, arch):  # v7's generated ld2mma cell replaced by a wrong typed one
        section, rows = real(step_id, arch)
        return section, [[c if i != 1 or "ld2mma" not in r[0] else "64"
                          for i, c in enumerate(r)] for r in rows]

    monkeypatch.setitem(globals(), "_barrier_table", typed)
    assert any("ld2mma arrival count 64" in p for p in _barrier_problems(step))


def test_a_measured_figure_comes_from_its_record(tmp_path):
    """A rec marker holds the last matching record's field, formatted; --check's staleness
    follows the record, and a marker no record fills is an error naming the file."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text('{"M": 8, "shape": "a", "c": {"x": {"ratio": 0.5}}}\n'
                    '{"M": 8, "shape": "a", "c": {"x": {"ratio": 0.9449}}}\n'
                    '{"M": 16, "shape": "a", "c": {"x": {"ratio": 2.0}}}\n')
    marker = "<!-- rec:runs.jsonl M=8,shape=a c.x.ratio .2f -->{}<!-- /rec -->"
    text = "v12 ran at " + marker.format("0.50") + " x torch"
    assert RENDER_DOCS._render_records(text, root=tmp_path) == (
        "v12 ran at " + marker.format("0.94") + " x torch")
    with pytest.raises(RENDER_DOCS.RenderError, match="runs.jsonl"):
        RENDER_DOCS._render_records(marker.replace("M=8", "M=4").format("1"), root=tmp_path)
    with pytest.raises(RENDER_DOCS.RenderError, match="no c.y.ratio"):
        RENDER_DOCS._render_records(marker.replace("c.x", "c.y").format("1"), root=tmp_path)
    # a marker without its selector field would be skipped, its typed figure never checked
    with pytest.raises(RENDER_DOCS.RenderError, match="SELECTORS '-'"):
        RENDER_DOCS._render_records(marker.replace("M=8,shape=a ", "").format("1"),
                                    root=tmp_path)


def test_a_measured_figure_can_aggregate_and_select_by_path(tmp_path):
    """rec markers select by nested keys, exclusion, prefix and %-decoded values, take a
    quotient of two fields, and aggregate over every matching record (min, max, median,
    geomean, count); a pct format prints a ratio as a change in percent; a one-line JSON
    file is one record."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text(
        '{"sha": "abc1", "impl": "v13 tensor", "kw": {"SWAP": true}, "r": {"a.b": 2.0}, "ms": {"x": 1.0, "y": 4.0}}\n'
        '{"sha": "abc1", "impl": "v13 tensor", "kw": {}, "r": {"a.b": 0.5}, "ms": {"x": 2.0, "y": 4.0}}\n'
        '{"sha": "abc1", "impl": "v13 row", "kw": {}, "r": {"a.b": 8.0}, "ms": {"x": 3.0, "y": 4.0}}\n'
        '{"sha": "def2", "impl": "v13 tensor", "kw": {}, "r": {"a.b": 100.0}, "ms": {"x": 1.0, "y": 1.0}}\n')
    fig = lambda sel, field, fmt=".2f": RENDER_DOCS.record_figure("runs.jsonl", sel, field, fmt,
                                                                 root=tmp_path)
    assert fig("sha^=abc,kw.SWAP=true", "r.a.b") == "2.00"          # nested key, dotted key
    assert fig("sha^=abc,kw.SWAP!=true", "r.a.b") == "8.00"         # absent key: not excluded
    assert fig("impl=v13%20tensor,sha^=abc", "median:r.a.b") == "1.25"
    assert fig("sha^=abc", "min:r.a.b") == "0.50" and fig("sha^=abc", "max:r.a.b") == "8.00"
    assert fig("sha^=abc", "geomean:r.a.b") == "2.00"
    assert fig("sha^=abc", "count", "d") == "3"
    assert fig("sha=def2", "ms.y/ms.x") == "1.00" and fig("sha^=abc", "ms.y/ms.x") == "1.33"
    with pytest.raises(RENDER_DOCS.RenderError, match="unknown aggregate"):
        fig("-", "mode:r.a.b")
    with pytest.raises(RENDER_DOCS.RenderError, match="bad selector"):
        fig("sha", "r.a.b")
    assert fig("sha=def2", "r.a%2Eb") == "100.00"                  # %-decoded field
    assert fig("sha=def2", "ms.x/ms.y", "pct.0f") == "0"            # (1/1 - 1) * 100
    assert fig("impl=v13%20row", "ms.x/ms.y", "pct+.0f") == "-25"   # 3/4: -25%
    assert fig("impl=v13%20row", "ms.x/ms.y", "-pct.0f") == "25"    # what 0.75 costs
    assert fig("sha^=abc", "max:ms.y/ms.x", "pct.0f") == "300"      # aggregate of quotients
    assert fig("sha=def2", "ms.x", "us.0f") == "1000"                   # ms as microseconds
    one = tmp_path / "timeline.json"
    one.write_text('{"otherData": {"timing": {"timeline_ms": 0.374, "plain_ms": 0.194}}}')
    assert RENDER_DOCS.record_figure("timeline.json", "-", "otherData.timing.timeline_ms/"
                                     "otherData.timing.plain_ms", ".1f", root=tmp_path) == "1.9"


def test_readme_and_lab_quote_h200_figures_from_their_records():
    """The README and the lab's studies (the rules' evidence, the stream-K, epilogue, fp8 and
    model figures) quote their H200 figures through rec markers (filled from the records by
    render_docs), not typed by hand."""
    text = "\n".join(p.read_text(encoding="utf-8")
                     for p in [ROOT / "README.md", *sorted((ROOT / "lab").glob("*/README.md"))])
    used = set(RENDER_DOCS.REC.findall(text))
    files = {m[0] for m in used}
    assert {"lab/cost_model_fit/records/v10_suite_graph_h200.jsonl", "lab/cost_model_fit/records/v12_pdl_sweep_h200.jsonl",
            "lab/stream_k_tail/records/v12_streamk_h200.jsonl", "lab/steps_on_h200/records/h200.jsonl",
            "lab/model_layers_in_torch/records/model.jsonl", "lab/fused_epilogues/records/epilogue_h200_2.jsonl",
            "lab/fp8_on_hopper/records/fp8_h200_2.jsonl", "lab/steps_on_h200/records/fastcu_h200.jsonl",
            "lab/ncu_profiles/records/ncu_h200.jsonl", "lab/hang_guard/records/watchdog_h200.jsonl"} <= files
    assert len(used) >= 150


def test_generated_lesson_figures_are_fresh():
    """scripts/render_docs.py --check: every count cell and build figure in the lessons
    holds what the builders declare and goldens/expectations/build.json records."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "scripts/render_docs.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_records_read_from_logs_are_fresh():
    """lab/tools/logs_to_records.py --check: the records of figures that exist only in H200
    logs (fast.cu, Nsight Compute, notebook 07, the watchdog demo) hold what the logs say."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "lab/tools/logs_to_records.py", "--check"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_changed_ring_count_makes_its_lesson_stale(monkeypatch):
    step = registry.get("v7", "sm_100a")
    real = RENDER_DOCS.declared_counts

    def drifted(s):
        counts = real(s)
        return {**counts, "ld2mma": "64"} if s.key == step.key else counts

    monkeypatch.setattr(RENDER_DOCS, "declared_counts", drifted)
    lesson = ROOT / "steps" / "lessons" / "v7.md"
    rendered = RENDER_DOCS.render_lesson(lesson, EXPECTATIONS)
    assert rendered != lesson.read_text(encoding="utf-8")
    assert "<!-- count -->64<!-- /count -->" in rendered


def test_a_drifted_build_makes_its_lesson_stale():
    key = next(k for k in EXPECTATIONS if k.startswith("v7@sm_100a:"))
    drifted = {**EXPECTATIONS, key: {**EXPECTATIONS[key],
                                     "setmaxnreg": {"dec": [48], "inc": [232]},
                                     "smem_bytes": 100 * 1024}}
    stale = [p.name for p in RENDER_DOCS.stale(drifted)]
    assert stale == ["v7.md"], stale
    text = RENDER_DOCS.render_lesson(ROOT / "steps" / "lessons" / "v7.md", drifted)
    assert "<!-- build:setmaxnreg_dec v7@sm_100a -->48<!-- /build -->" in text
    assert "<!-- build:smem_kib v7@sm_100a -->100<!-- /build -->" in text


def _has(step_id: str, arch: str) -> bool:
    try:
        registry.get(step_id, arch)
        return True
    except (KeyError, ValueError):
        return False


# --------------------------------------------------------------------------------------
# step cards: what changed, the contract, why and the constraints, nothing more
# --------------------------------------------------------------------------------------
CARD_MAX_LINES = 30


def _cards():
    """(file, builder name, docstring) of every step builder (hgemm_*) in steps/sm*/."""
    for path in CARDS:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("hgemm_"):
                yield path, node.name, ast.get_docstring(node) or ""


def test_every_card_is_at_most_30_lines():
    """A card says what changed, the contract, why and the constraints; measurements,
    verification reports and long explanations live in the step's lesson."""
    cards = list(_cards())
    assert len(cards) >= len(registry.all_steps()), len(cards)
    long = [f"{_rel(p)}:{name}: {len(doc.splitlines())} lines" for p, name, doc in cards
            if len(doc.splitlines()) > CARD_MAX_LINES]
    assert not long, f"cards over {CARD_MAX_LINES} lines (move the rest to the lesson):\n" \
        + "\n".join(long)


# --------------------------------------------------------------------------------------
# drift the review found: citations of missing files, hand counts of the steps
# --------------------------------------------------------------------------------------
# the package with its subpackages (compile/, run/, sim/, report/): a fact that moved with a
# module is still checked where it now lives
_OURS = ([README, ROOT / "CONTRIBUTING.md", ROOT / "notebooks" / "README.md", ROOT / ".ci" / "run"]
         + [Path(p) for p in sorted(glob.glob(str(ROOT / "tirx_gemm" / "**" / "*.py"),
                                              recursive=True))]
         + [Path(p) for p in sorted(glob.glob(str(ROOT / "scripts" / "*.py")))]
         + [Path(p) for p in sorted(glob.glob(str(ROOT / "tests" / "*.py")))])


def test_the_drift_checks_read_every_subpackage():
    read = {p.parent.name for p in _OURS if p.suffix == ".py"}
    subpackages = {p.parent.name for p in (ROOT / "tirx_gemm").glob("*/__init__.py")}
    assert {"compile", "run", "sim", "report"} <= subpackages <= read, (subpackages, read)


@functools.lru_cache(maxsize=None)
def _markdown_names() -> frozenset:
    """The names of the repository's Markdown files, venvs, builds and .git left out; a folder
    that another test removes while this walk runs is passed over, not an error."""
    names = set()
    for folder, dirs, files in os.walk(ROOT, onerror=lambda e: None):
        dirs[:] = [d for d in dirs if d != "build" and d != ".git" and "venv" not in d]
        names.update(f for f in files if f.endswith(".md"))
    return frozenset(names)


@pytest.mark.parametrize("path", _OURS, ids=_rel)
def test_cited_markdown_files_exist(path):
    text = path.read_text(encoding="utf-8")
    for name in set(re.findall(r"\b([A-Z][A-Z_]+\.md)\b", text)):
        assert name in _markdown_names(), f"{_rel(path)} cites {name}, which does not exist"


@pytest.mark.parametrize("path", _OURS, ids=_rel)
def test_no_hand_count_of_the_steps(path):
    if path.name == "test_facts.py":
        pytest.skip("this file names the patterns")
    text = path.read_text(encoding="utf-8")
    for stale in (r"\bseven lessons\b", r"\bv1 \.\. v7\b", r"\b01 \.\. 07\b", r"\bnine steps\b"):
        assert not re.search(stale, text), f"{_rel(path)}: {stale} (count from the registry)"
