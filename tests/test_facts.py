"""One home per fact (issue 20): every copy of a fact in prose is generated from its home or
checked against it here, so a drifted copy fails a test.

- the README's path table: generated from tirx_gemm/registry.py (tables.path_table);
- published figures we did not measure (the book's and the article series' B200 TFLOP/s,
  fast.cu's): tirx_gemm/report/published.py;
- shared memory per CTA quoted in steps/lessons/*.md and the step cards: the build
  expectations, goldens/expectations/build.json (`tirx-gemm regress --cpu --update`);
- no prose cites a Markdown file that does not exist, or counts the steps by hand."""
import glob
import json
import re
from pathlib import Path

import pytest

from tirx_gemm import registry
from tirx_gemm.report import published
from tirx_gemm.report.records import PATH_BEGIN, PATH_END, between_markers
from tirx_gemm.report.tables import path_table

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
        assert s.lesson.replace("|", "\\|") in row, (s.key, row)


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


def _expected_kib(step_id: str, arch: str) -> int | None:
    s = registry.get(step_id, arch)
    entry = EXPECTATIONS.get(f"{s.key}:{'x'.join(map(str, s.canonical))}")
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


def _smem_quotes():
    """(file, line number, quoted KiB, approximate?, arches it may refer to, step id)."""
    for path in LESSONS + CARDS:
        step_id = re.search(r"v\d+", path.stem).group(0)
        if path.suffix == ".py":
            default_arches = [path.parent.name[:2] + "_" + path.parent.name[2:]]
        else:
            default_arches = list(registry.ARCHES)
        header = None
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("|") and "sm_100a" in line and "sm_90a" in line:
                header = [c.strip().strip("*") for c in line.split("|")]
            elif not line.startswith("|"):
                header = None
            cells = _arches_of_line(path, line, header)
            for m in _SMEM.finditer(line):
                approx = m.group(1) or m.group(4)
                kib = int(m.group(2) or m.group(5))
                arch = [a for start, a in sorted(cells.items()) if start <= m.start()]
                inline = re.match(r"[^,;)]{0,20}?\bon (sm_100a|sm_90a)", line[m.end():])
                if inline:
                    arch = [inline.group(1)]
                yield path, n, kib, bool(approx), ([arch[-1]] if arch else default_arches), \
                    step_id


def test_smem_figures_in_lessons_and_cards_match_the_build():
    quotes = list(_smem_quotes())
    assert len(quotes) >= 5, quotes
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
    assert not wrong, "shared memory quoted in prose differs from the build:\n" + "\n".join(wrong)


def _has(step_id: str, arch: str) -> bool:
    try:
        registry.get(step_id, arch)
        return True
    except (KeyError, ValueError):
        return False


# --------------------------------------------------------------------------------------
# drift the review found: citations of missing files, hand counts of the steps
# --------------------------------------------------------------------------------------
_OURS = ([README, ROOT / "CONTRIBUTING.md", ROOT / "notebooks" / "README.md", ROOT / ".ci" / "run"]
         + [Path(p) for p in sorted(glob.glob(str(ROOT / "tirx_gemm" / "*.py")))]
         + [Path(p) for p in sorted(glob.glob(str(ROOT / "scripts" / "*.py")))]
         + [Path(p) for p in sorted(glob.glob(str(ROOT / "tests" / "*.py")))])


@pytest.mark.parametrize("path", _OURS, ids=_rel)
def test_cited_markdown_files_exist(path):
    text = path.read_text(encoding="utf-8")
    for name in set(re.findall(r"\b([A-Z][A-Z_]+\.md)\b", text)):
        hits = [p for p in ROOT.rglob(name) if ".venv" not in p.parts and "build" not in p.parts]
        assert hits, f"{_rel(path)} cites {name}, which does not exist"


@pytest.mark.parametrize("path", _OURS, ids=_rel)
def test_no_hand_count_of_the_steps(path):
    if path.name == "test_facts.py":
        pytest.skip("this file names the patterns")
    text = path.read_text(encoding="utf-8")
    for stale in (r"\bseven lessons\b", r"\bv1 \.\. v7\b", r"\b01 \.\. 07\b", r"\bnine steps\b"):
        assert not re.search(stale, text), f"{_rel(path)}: {stale} (count from the registry)"
