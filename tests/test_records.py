"""CPU tests of tirx_gemm.report.records and scripts/render_results.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tirx_gemm.report.records import (
    BEGIN_MARKER,
    END_MARKER,
    NO_SM100_GPU,
    PATH_BEGIN,
    PATH_END,
    SUMMARY_BEGIN,
    SUMMARY_END,
    append_record,
    device_slug,
    latest_by_key,
    record_dtype,
    record_key,
    load_records,
    path_cells,
    render_summary,
    render_table,
    replace_between_markers,
    update_readme,
)

ROOT = Path(__file__).resolve().parent.parent

STEPS = [
    ("v1", "sm_100a", "single tile"),
    ("v2", "sm_100a", "K-loop"),
    ("v1", "sm_90a", "single tile"),
    ("v2", "sm_90a", "K-loop"),
]


def rec(step="v1", arch="sm_90a", M=4096, N=4096, K=4096, device="NVIDIA H200",
        ts="2026-05-01T10:00:00+00:00", tflops=400.0, ratio=0.55, verified=True, **kw):
    r = {
        "step": step, "arch": arch, "M": M, "N": N, "K": K, "device": device,
        "capability": "9.0", "sm_count": 132, "timestamp": ts, "tflops": tflops,
        "ratio_to_torch": ratio, "verified": verified, "checked": True,
        "torch_version": "2.11.0+cu130", "tvm_version": "0.27.0.post1",
        "driver_version": "580.65.06", "git_sha": "abcdef1234567890",
        "clocks": {"sm_mhz": 1980, "mem_mhz": 3201, "max_sm_mhz": 1980},
    }
    r.update(kw)
    return r


def test_device_slug():
    assert device_slug("NVIDIA H200") == "nvidia-h200"
    assert device_slug("NVIDIA B200 (SXM)") == "nvidia-b200-sxm"


def test_round_trip(tmp_path):
    a = rec()
    b = rec(step="v2", rel_err=float("nan"), device="NVIDIA B200", arch="sm_100a")
    p1 = append_record(a, tmp_path)
    p2 = append_record(b, tmp_path)
    append_record(rec(ts="2026-05-02T10:00:00+00:00"), tmp_path)
    assert p1.name == "nvidia-h200.jsonl" and p2.name == "nvidia-b200.jsonl"
    assert len(p1.read_text().splitlines()) == 2  # append-only, one line per record
    got = load_records(tmp_path)
    assert len(got) == 3
    assert a in got
    b_loaded = next(r for r in got if r["device"] == "NVIDIA B200")
    assert b_loaded["rel_err"] is None  # NaN stored as null: the file stays valid JSON
    for line in p2.read_text().splitlines():
        json.loads(line)


def test_append_requires_key_fields(tmp_path):
    with pytest.raises(ValueError, match="device"):
        append_record({"step": "v1", "arch": "sm_90a", "M": 1, "N": 1, "K": 1}, tmp_path)


def test_load_records_reports_damaged_line(tmp_path):
    (tmp_path / "x.jsonl").write_text(json.dumps(rec()) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"x.jsonl:2"):
        load_records(tmp_path)
    assert load_records(tmp_path / "missing") == []


def _without(key):
    r = rec()
    del r[key]
    return r


@pytest.mark.parametrize("line,why", [
    (json.dumps(_without("device")).encode(), "record lacks device"),
    (json.dumps(_without("M")).encode(), "record lacks M"),
    (json.dumps(rec(M="4096")).encode(), "M must be positive integers, got '4096'"),
    (json.dumps([1, 2]).encode(), "a record must be a JSON object"),
    (b"\x89PNG\r\n\x1a\n\xff\xfe garbage", "not UTF-8 text"),
], ids=["no-device", "no-M", "string-M", "list", "binary"])
def test_load_records_names_file_and_line_of_a_bad_record(tmp_path, line, why):
    (tmp_path / "dev.jsonl").write_bytes(json.dumps(rec()).encode() + b"\n\n" + line + b"\n")
    with pytest.raises(ValueError) as exc:
        load_records(tmp_path)
    assert str(exc.value).startswith(f"{tmp_path / 'dev.jsonl'}:3: {why}")
    assert "\n" not in str(exc.value)


def test_latest_by_key():
    old = rec(ts="2026-05-01T10:00:00+00:00", tflops=100.0)
    new = rec(ts="2026-05-03T10:00:00+00:00", tflops=300.0)
    mid = rec(ts="2026-05-02T10:00:00Z", tflops=200.0)
    other_shape = rec(M=8192, N=8192, K=8192, tflops=50.0)
    other_dev = rec(device="NVIDIA H100 80GB HBM3", tflops=70.0)
    latest = latest_by_key([old, new, mid, other_shape, other_dev])
    assert len(latest) == 3
    assert latest[("v1", "sm_90a", 4096, 4096, 4096, "NVIDIA H200", "float16")]["tflops"] == 300.0
    # tie on timestamp: the later record wins
    a, b = rec(tflops=1.0), rec(tflops=2.0)
    assert list(latest_by_key([a, b]).values())[0]["tflops"] == 2.0


def test_dtype_is_part_of_the_key_and_old_records_are_float16():
    old = rec(tflops=100.0)  # a record from before bfloat16: no "dtype"
    fp16 = rec(ts="2026-05-03T10:00:00+00:00", tflops=300.0, dtype="float16")
    bf16 = rec(ts="2026-05-04T10:00:00+00:00", tflops=350.0, dtype="bfloat16")
    assert record_dtype(old) == "float16" and record_key(old) == record_key(fp16)
    assert record_key(bf16) != record_key(fp16)
    latest = latest_by_key([old, fp16, bf16])
    # the newer bf16 run does not supersede the fp16 one, the newer fp16 run the older
    assert sorted(r["tflops"] for r in latest.values()) == [300.0, 350.0]


def test_render_table_never_mixes_dtypes_in_a_cell():
    fp16_only = render_table([rec(), rec(step="v2", tflops=450.0)], STEPS,
                             shapes=[(4096, 4096, 4096)])
    assert "| dtype |" not in fp16_only and "bf16" not in fp16_only  # as it always was
    records = [rec(tflops=400.0, ratio=0.55), rec(tflops=300.0, ratio=0.5, dtype="bfloat16"),
               rec(step="v2", tflops=450.0, ratio=0.6),
               rec(step="v2", M=8192, N=8192, K=8192, verified=False, tflops=None,
                   ratio=None, dtype="bfloat16")]
    md = render_table(records, STEPS, shapes=[(4096, 4096, 4096)])
    lines = md.splitlines()
    assert lines[0].startswith("| step | arch | dtype | GPU | simulated on CPU (NumSim) |")
    rows = {tuple(c.strip() for c in ln.strip("|").split("|")[:3]): ln for ln in lines
            if ln.startswith("| v")}
    assert "400.0 (0.55×) ✓" in rows[("v1", "sm_90a", "fp16")]
    assert "300.0" not in rows[("v1", "sm_90a", "fp16")]
    assert "300.0 (0.50×) ✓" in rows[("v1", "sm_90a", "bf16")]
    assert "400.0" not in rows[("v1", "sm_90a", "bf16")]
    # checked shapes count per dtype: v2's bf16 row has its own (failed) check only
    assert "| 1/1 ✓ |" in rows[("v2", "sm_90a", "fp16")]
    assert "0/1 ✓, 1 ✗ failed check" in rows[("v2", "sm_90a", "bf16")]
    # fp16 first; an unmeasured step keeps one row with no dtype
    order = [k for k in rows if k[:2] == ("v1", "sm_90a")]
    assert order == [("v1", "sm_90a", "fp16"), ("v1", "sm_90a", "bf16")]
    assert rows[("v1", "sm_100a", "—")].count(NO_SM100_GPU) == 1
    assert "never mixed" in md


def test_render_table_marks_missing_sm100a_rows():
    records = [rec(), rec(step="v2", tflops=450.0, ratio=0.6),
               rec(step="v2", ts="2026-04-01T00:00:00+00:00", tflops=1.0)]
    md = render_table(records, STEPS, shapes=[(4096, 4096, 4096), (8192, 8192, 8192)])
    lines = md.splitlines()
    assert lines[0].startswith("| step | arch | GPU | simulated on CPU (NumSim) | checked shapes |")
    assert "4096³" in lines[0] and "8192³" in lines[0]
    sm100_rows = [ln for ln in lines if "| sm_100a |" in ln]
    assert len(sm100_rows) == 2
    for ln in sm100_rows:
        assert f"| {NO_SM100_GPU} |" in ln
    v2 = next(ln for ln in lines if ln.startswith("| v2 | sm_90a |"))
    assert "450.0 (0.60×) ✓" in v2  # the latest record, not the older one
    assert "1.0" not in v2.split("|")[6]
    assert v2.rstrip(" |").endswith("—")  # 8192³ not measured for this step
    assert "NVIDIA H200: compute capability 9.0" in md


def test_render_table_sm90a_unmeasured_and_failed():
    records = [rec(step="v1", verified=False, tflops=None, ratio=None)]
    md = render_table(records, STEPS)
    v1 = next(ln for ln in md.splitlines() if ln.startswith("| v1 | sm_90a |"))
    assert "✗ failed check" in v1
    v2 = next(ln for ln in md.splitlines() if ln.startswith("| v2 | sm_90a |"))
    assert "| not measured |" in v2 and NO_SM100_GPU not in v2


def test_render_table_sm100a_partially_measured_says_not_measured():
    records = [rec(step="v1", arch="sm_100a", device="NVIDIA B200", capability="10.0")]
    md = render_table(records, STEPS)
    assert NO_SM100_GPU not in md
    v2 = next(ln for ln in md.splitlines() if ln.startswith("| v2 | sm_100a |"))
    assert "| not measured |" in v2


def test_render_table_is_deterministic_and_escapes_pipes():
    steps = [("v1", "sm_90a", "lesson")]
    r = rec()
    r["device"] = "GPU a | b"
    md1 = render_table([r], steps)
    md2 = render_table([r], steps)
    assert md1 == md2
    assert "GPU a \\| b" in md1


README = f"""# tirx-gemm

intro

{BEGIN_MARKER}
old table
{END_MARKER}

tail
"""


def test_update_readme_replaces_between_markers(tmp_path):
    p = tmp_path / "README.md"
    p.write_text(README)
    assert update_readme(p, "| new | table |\n")
    text = p.read_text()
    assert "old table" not in text
    assert f"{BEGIN_MARKER}\n| new | table |\n{END_MARKER}" in text
    assert text.startswith("# tirx-gemm\n\nintro\n") and text.endswith("\ntail\n")
    assert not update_readme(p, "| new | table |")  # unchanged: False, file untouched


def test_replace_between_markers_errors():
    with pytest.raises(ValueError, match="exactly one"):
        replace_between_markers("no markers", "x")
    with pytest.raises(ValueError, match="comes before"):
        replace_between_markers(f"{END_MARKER}\n{BEGIN_MARKER}", "x")


FRONT = f"""# tirx-gemm

{PATH_BEGIN}
old path
{PATH_END}

{SUMMARY_BEGIN}
old summary
{SUMMARY_END}
"""


def test_render_results_script(tmp_path):
    """The README gets the path table and the summary, the results page the full table;
    --check fails on either until they are written, then passes; broken markers: exit 2."""
    results = tmp_path / "results"
    append_record(rec(), results)
    readme, page = tmp_path / "README.md", tmp_path / "results.md"
    readme.write_text(FRONT)
    page.write_text(README)
    script = ROOT / "scripts" / "render_results.py"
    base = [sys.executable, str(script), "--results", str(results), "--readme", str(readme),
            "--page", str(page)]
    r = subprocess.run(base + ["--check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stale" in r.stderr
    r = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    front, full = readme.read_text(), page.read_text()
    assert "old table" not in full and "| v1 | sm_90a |" in full and "400.0 (0.55×) ✓" in full
    assert "old path" not in front and "old summary" not in front
    assert "| v1 | " in front and "0.55× at 4096³ (H200) |" in front  # the path table
    assert "NVIDIA H200, 132 SMs" in front and "(results.md)" in front  # summary, link
    assert "400.0" not in front  # the per-shape figures live on the page
    r = subprocess.run(base + ["--check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    page.write_text("no markers\n")
    r = subprocess.run(base + ["--check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert readme.read_text() == front


def test_the_repository_readme_and_results_page_are_fresh():
    """README's path table and summary and the site's full results table (every figure per
    shape) are what the records give today."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "render_results.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    page = (ROOT / "docs" / "pages" / "results.md").read_text(encoding="utf-8")
    assert "TFLOP/s (× torch)" in page.split(BEGIN_MARKER)[1].split(END_MARKER)[0]


@pytest.mark.parametrize("case", ["missing", "empty", "bad-record"])
def test_render_results_never_rewrites_the_readme_from_nothing(tmp_path, case):
    results = tmp_path / "results"
    if case != "missing":
        results.mkdir()
    if case == "bad-record":
        append_record(rec(), results)
        with open(results / "nvidia-h200.jsonl", "ab") as f:
            f.write(b"\xff\xfe\x00\x01\n")
    readme = tmp_path / "README.md"
    readme.write_text(README)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "render_results.py"),
                        "--results", str(results), "--readme", str(readme)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert readme.read_text() == README
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0].endswith("README not changed")
    assert {"missing": "does not exist", "empty": "no records in",
            "bad-record": "nvidia-h200.jsonl:2: not UTF-8 text"}[case] in lines[0]
    if case != "bad-record":  # a folder without records: say what to pass
        assert "pass --results FOLDER, a folder of *.jsonl records" in lines[0]


def _sim_rec(step="v4", ok=True, sha="abc1234def", ts="2026-11-29T12:00:00+00:00", M=256):
    return {"kind": "numsim", "step": step, "arch": "sm_100a", "M": M, "N": 128, "K": 192,
            "kwargs": {}, "device": "NumSim, CPU model of sm_100a", "verified": ok,
            "numsim": "correct" if ok else "WRONG", "synccheck": "clean",
            "racecheck": "clean", "checks": ["numsim", "sync", "race"], "git_sha": sha,
            "timestamp": ts}


def test_render_table_shows_the_latest_simulation_never_as_tflops():
    steps = [("v4", "sm_100a", "TMA"), ("v5", "sm_100a", "ring"), ("v4", "sm_90a", "TMA")]
    sims = [_sim_rec(ok=False, sha="old0000000", ts="2026-11-01T00:00:00+00:00"),
            _sim_rec(), _sim_rec(M=128)]
    md = render_table([], steps, shapes=[(4096, 4096, 4096)], sim_records=sims)
    v4 = next(ln for ln in md.splitlines() if ln.startswith("| v4 | sm_100a |"))
    cells = [c.strip() for c in v4.strip("|").split("|")]
    assert cells[2] == NO_SM100_GPU
    # the latest revision's two cases passed; the older failing revision does not count
    assert cells[3] == "✓ 2/2 cases correct, sync/race clean (2026-11-29)"  # a date, no hash
    assert cells[5] == "—"  # no TFLOP/s from a simulation
    v5 = next(ln for ln in md.splitlines() if ln.startswith("| v5 | sm_100a |"))
    assert "not simulated" in v5
    hopper = next(ln for ln in md.splitlines() if ln.startswith("| v4 | sm_90a |"))
    assert "n/a (a GPU runs it)" in hopper
    failing = render_table([], steps[:1], shapes=[(4096, 4096, 4096)],
                           sim_records=[_sim_rec(), _sim_rec(M=128, ok=False)])
    assert "✗ 1 of 2 cases failed" in failing


# --------------------------------------------------------------------------------------
# one typed record for a step at a shape
# --------------------------------------------------------------------------------------
def test_build_sim_and_run_records_share_one_step_at_a_shape():
    """cache.BuildResult, sim.SimRow and launcher.BuildMeta declare step, arch, M, N, K once
    (stepshape.StepShape) and keep them first, so meta.json and results/sim/*.jsonl keep
    their keys; BuildMeta stays read-only."""
    import dataclasses

    from tirx_gemm.compile.cache import BuildResult
    from tirx_gemm.run.launcher import BuildMeta
    from tirx_gemm.sim.gate import SimRow
    from tirx_gemm.stepshape import StepShape
    head = [f.name for f in dataclasses.fields(StepShape)]
    assert head == ["step", "arch", "M", "N", "K"]
    for cls in (BuildResult, SimRow, BuildMeta):
        assert issubclass(cls, StepShape)
        assert [f.name for f in dataclasses.fields(cls)][:5] == head
        own = {n for n, v in vars(cls).get("__annotations__", {}).items()}
        assert not own & set(head), f"{cls.__name__} declares {own & set(head)} again"
    assert [f.name for f in dataclasses.fields(BuildResult)][:6] == head + ["kwargs"]
    m = BuildMeta.from_any({"step": "v4", "arch": "sm_90a", "M": 8, "N": 16, "K": 32,
                            "kwargs": {"dtype": "bfloat16"}})
    assert (m.shape, m.dtype, m.label) == ((8, 16, 32), "bfloat16", "v4@sm_90a 8x16x32")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.M = 9
    row = SimRow("v7", "sm_100a", 128, 128, 64, {})
    row.numsim = "correct"  # a simulation row is filled in as its checks run
    assert row.label == "v7@sm_100a 128x128x64" and row.dtype == "float16"


class _Row:
    def __init__(self, id, arch, fp8=False):
        self.id, self.arch, self.fp8 = id, arch, fp8


def test_path_cells_name_the_card_the_shape_and_the_verdict():
    """sm_90a: the ratio at 4096³ where timed there (fp16, passed), else the largest timed
    shape; a failed check or bf16 never counts; sm_100a: the NumSim verdict."""
    steps = [_Row("v4", "sm_100a"), _Row("v4", "sm_90a"), _Row("v5", "sm_90a"),
             _Row("v6", "sm_90a"), _Row("v13", "sm_90a", fp8=True)]
    records = [rec(step="v4", ratio=0.72), rec(step="v4", M=8192, N=8192, K=8192, ratio=0.8),
               rec(step="v5", M=128, N=128, K=64, ratio=0.3),
               rec(step="v5", M=256, N=256, K=64, ratio=0.4),
               rec(step="v5", M=8192, N=8192, K=8192, ratio=0.9, verified=False),
               rec(step="v5", M=4096, N=4096, K=4096, ratio=0.95, dtype="bfloat16"),
               rec(step="v13", ratio=1.5)]
    cells = path_cells(steps, records, [_sim_rec(), _sim_rec(M=128)])
    assert cells["v4"] == ("✓ 2/2 correct, sync/race clean", "0.72× at 4096³ (H200)")
    assert cells["v5"] == ("no sm_100a step", "0.40× at 256×256×64 (H200)")
    assert cells["v6"] == ("no sm_100a step", "not measured")
    assert cells["v13"][1] == "1.50× at 4096³ (H200; fp8 vs fp16 torch)"
    failing = path_cells(steps[:1], [], [_sim_rec(), _sim_rec(M=128, ok=False)])
    assert failing["v4"] == ("✗ 1 of 2 failed", "no sm_90a step")


def test_summary_and_full_table_are_short_dated_and_carry_no_commit():
    records = [rec(git_sha="abc1234def0", driver_version="580.1", torch_version="2.11"),
               rec(step="v2", ts="2026-05-03T10:00:00+00:00", git_sha="abc1234def0")]
    summary = render_summary(records, [_sim_rec()], page="docs/pages/results.md")
    full = render_table(records, STEPS, sim_records=[_sim_rec()])
    assert "NVIDIA H200, 132 SMs" in summary and "2026-05-03" in summary
    assert "NumSim, a CPU model of sm_100a | 1 | 1/1 cases ✓ | 2026-11-29" in summary
    assert "[docs/pages/results.md](docs/pages/results.md)" in summary
    for text in (summary, full):
        assert "abc1234" not in text and "git " not in text
    assert "latest run 2026-05-03" in full
    assert all(len(line) <= 200 for line in summary.splitlines())
    assert all(len(line) <= 200 for line in full.splitlines() if not line.startswith("|"))
