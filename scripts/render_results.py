#!/usr/bin/env python
"""Render the README's path table and results summary, and the site's full results table,
from the JSONL records in results/.

    python scripts/render_results.py [--results results/] [--readme README.md]
                                     [--page docs/pages/results.md] [--check]

Writes, in the README: the path table (one row per step: its idea from tirx_gemm/registry.py,
the sm_100a NumSim verdict, the sm_90a ratio to torch.matmul; records.path_table) between the
path markers, a short summary of the records (records.render_summary) between the
results-summary markers and the shape suite's summary between the suite markers; in the
site's results page (--page): the full table, every step at every shape (records.render_table),
between <!-- results:begin --> and <!-- results:end -->.
With --check nothing is written: the exit status is 1 when the README or the page is stale
(2 when their markers are missing or broken). With --print the full table goes to stdout.

A missing results folder, one without records, or a bad record (named by file and line)
is an error (exit 2) and leaves the README untouched: a table of "not measured" rows made
from nothing would erase the measurements it shows.

The list of steps (rows) and bench shapes (columns) comes from tirx_gemm.registry; where that
cannot be imported (e.g. on a GPU host without the TVM compiler) the steps found in the
records are used (and the path table is left as it is). Records carry their operand dtype
(none: float16); once a bfloat16 record exists the table gets a dtype column and separate
bf16 rows (records.render_table), so fp16 and bf16 results never share a cell.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tirx_gemm.report.records import (  # noqa: E402
    PATH_BEGIN,
    PATH_END,
    SUMMARY_BEGIN,
    SUMMARY_END,
    load_records,
    render_summary,
    render_table,
    replace_between_markers,
)


def _step_sort_key(step_id: str):
    digits = "".join(c for c in step_id if c.isdigit())
    return (int(digits) if digits else 0, step_id)


def _steps_in_records(records: list[dict]) -> list[tuple]:
    rows: dict[tuple, str] = {}
    for r in records:
        key = (r["step"], r["arch"])
        rows[key] = rows.get(key) or r.get("lesson") or ""
    return [(s, a, lesson) for (s, a), lesson in
            sorted(rows.items(), key=lambda kv: (kv[0][1], _step_sort_key(kv[0][0])))]


def steps_and_shapes(records: list[dict]):
    """((step_id, arch, lesson) rows, (M, N, K) columns, where the rows came from).

    Rows: the registry's steps in its order, then any (step, arch) that has records but is
    not in the registry (a measurement is never hidden). Columns: the registry's bench shapes
    plus every shape that has a record.
    """
    record_shapes = {(int(r["M"]), int(r["N"]), int(r["K"])) for r in records
                     if r.get("tflops") is not None}
    try:
        from tirx_gemm.registry import STEPS  # lazy: imports the builders (and tvm)
    except Exception as e:  # ImportError, or tvm failing to initialise
        return (_steps_in_records(records), sorted(record_shapes),
                f"steps from the records (registry not importable: {e})")
    steps = [(s.id, s.arch, s.lesson) for s in STEPS]
    known = {(s, a) for s, a, _ in steps}
    steps += [row for row in _steps_in_records(records) if row[:2] not in known]
    shapes = set(record_shapes)
    for s in STEPS:
        for shape in getattr(s, "bench_shapes", ()) or ():
            shapes.add(tuple(int(x) for x in shape))
    return steps, sorted(shapes), "steps from tirx_gemm.registry"


def _with_suite_summary(text: str, results: Path) -> str:
    """The README with its shape-suite summary (between the suite markers, when present)
    rendered from results/suites/*.jsonl by tirx_gemm.op.suite.render_summary."""
    from tirx_gemm.op import suite
    a, b = text.find(suite.SUMMARY_BEGIN), text.find(suite.SUMMARY_END)
    if a < 0 and b < 0:
        return text
    if a < 0 or b < a:
        raise ValueError(f"the suite markers {suite.SUMMARY_BEGIN} ... {suite.SUMMARY_END} "
                         "are broken")
    body = "\n".join(line for raw in suite.render_summary(results).split("\n")
                     for line in _wrap_list_item(raw))
    return text[:a + len(suite.SUMMARY_BEGIN)] + "\n" + body + "\n" + text[b:]


def _wrap_list_item(line: str, width: int = 200) -> list[str]:
    """A Markdown list item ("- a; b; c") over ``width`` characters, broken after its "; "
    separators into continuation lines indented by two (the rendered page is the same); any
    other line as it is. No line of README.md is over 200 characters."""
    if len(line) <= width or not line.startswith("- "):
        return [line]
    out, cur = [], ""
    for part in line.split("; "):
        piece = part if not cur else cur + "; " + part
        if cur and len(piece) + 1 > width:
            out.append(cur + ";")
            cur = "  " + part
        else:
            cur = piece
    return out + [cur]


def path_table(records, sim_records) -> str | None:
    """The README's path table from the registry and the records, or None where the registry
    cannot be imported (a GPU host without TVM's compiler: the block is then left as it is)."""
    try:
        from tirx_gemm.registry import STEPS
    except Exception:  # noqa: BLE001 - ImportError, or tvm failing to initialise
        return None
    from tirx_gemm.report.records import path_table as render
    return render(STEPS, records, sim_records)


def _with_path_table(text: str, records, sim_records) -> str:
    table = path_table(records, sim_records)
    if table is None or (PATH_BEGIN not in text and PATH_END not in text):
        return text
    return replace_between_markers(text, table, PATH_BEGIN, PATH_END)


def _page_link(page: Path, readme: Path) -> str:
    """The results page as the README links it (relative to the README's folder)."""
    try:
        return page.resolve().relative_to(readme.resolve().parent).as_posix()
    except ValueError:
        return page.resolve().as_posix()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--results", default=str(ROOT / "results"), help="folder of *.jsonl records")
    ap.add_argument("--readme", default=str(ROOT / "README.md"), help="README to update")
    ap.add_argument("--page", default=str(ROOT / "docs" / "pages" / "results.md"),
                    help="the site's results page: the full table")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the README or the page is stale")
    ap.add_argument("--print", dest="print_only", action="store_true",
                    help="print the full table instead of writing the README and the page")
    args = ap.parse_args(argv)

    results = Path(args.results)
    try:
        if not results.is_dir():
            raise ValueError(f"results folder {results} does not exist: pass --results FOLDER, "
                             f"a folder of *.jsonl records (tirx-gemm run --record)")
        records = load_records(results)
        if not records:
            raise ValueError(f"no records in {results}/*.jsonl: nothing to render the table "
                             f"from; pass --results FOLDER, a folder of *.jsonl records "
                             f"(tirx-gemm run --record)")
        # the sm_100a steps' CPU simulations (tirx-gemm sim --record); may be absent
        sim_records = load_records(results / "sim")
    except ValueError as e:
        print(f"render_results: error: {e}; README not changed", file=sys.stderr)
        return 2
    steps, shapes, source = steps_and_shapes(records)
    table = render_table(records, steps, shapes=shapes, sim_records=sim_records)
    if args.print_only:
        sys.stdout.write(table)
        return 0

    readme, page = Path(args.readme), Path(args.page)
    for f in (readme, page):
        if not f.is_file():
            print(f"{f} does not exist", file=sys.stderr)
            return 2
    try:
        texts = {f: f.read_text(encoding="utf-8") for f in (readme, page)}
        summary = render_summary(records, sim_records, page=_page_link(page, readme))
        text = texts[readme]
        new = {readme: _with_path_table(_with_suite_summary(
                   replace_between_markers(text, summary, SUMMARY_BEGIN, SUMMARY_END), results),
                   records, sim_records),
               page: replace_between_markers(texts[page], table)}
    except ValueError as e:  # markers missing or broken
        print(f"render_results: {e}", file=sys.stderr)
        return 2
    stale = [f for f in new if new[f] != texts[f]]
    what = f"{len(records)} records; {source}"
    if args.check:
        if stale:
            print(f"{', '.join(map(str, stale))}: path table, results summary, suite summary or "
                  "full results table is stale: run python scripts/render_results.py",
                  file=sys.stderr)
            return 1
        print(f"{readme} and {page} are up to date ({what})")
        return 0
    for f in stale:
        f.write_text(new[f], encoding="utf-8")
        print(f"updated {f} from {what}")
    if not stale:
        print(f"{readme} and {page} already up to date ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
