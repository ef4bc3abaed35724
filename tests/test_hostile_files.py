"""Files a user hands the tools: build expectations (`regress --cpu`), a recorded trace
(`tirx-gemm trace FILE.json`), a results folder (render_results.py, the site build). Each
bad one is refused in one line naming the file, before anything is built or written."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tirx_gemm import cli
from tirx_gemm.report import records, regress
from tirx_gemm.report import timeline_view as TV

ROOT = Path(__file__).resolve().parent.parent
DEEP = "[" * 100000 + "]" * 100000
TRACE = ROOT / "results" / "timelines" / "v4_sm_90a_4096x4096x4096.json"
ONE_EXPECTATION = {"v4@sm_90a:4096x4096x4096": {
    "registers": 154, "smem_bytes": 66560, "spills": 0, "threads": 384,
    "setmaxnreg": None, "sass": {"HGMMA": 8}}}

FILES = [
    (DEEP, "it nests too deeply"),
    ('"x"', "the top level is a JSON string, not an object"),
    ("[1, 2]", "the top level is a JSON list, not an object"),
    (b"\xff\xfe", "not UTF-8 text"),
    ("{not json", "not valid JSON"),
]


def write(path: Path, content) -> Path:
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


@pytest.mark.parametrize("content, needle", FILES + [
    ({"v4": {}}, "entry 'v4' is not step@arch:MxNxK"),
    ({"v4@sm_90a:1x1x1": {"registers": "x"}}, "needs registers, smem_bytes, spills as counts"),
    ({"v4@sm_90a:1x1x1": {**ONE_EXPECTATION["v4@sm_90a:4096x4096x4096"], "sass": [1]}},
     "has sass that is not {opcode: count}"),
])
def test_bad_build_expectations_are_refused_in_one_line_naming_the_file(tmp_path, content,
                                                                         needle):
    path = write(tmp_path / "build.json",
                 json.dumps(content) if isinstance(content, dict) else content)
    with pytest.raises(ValueError) as exc:
        regress.load_expectations(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: ") and needle in msg and "\n" not in msg


def test_the_committed_expectations_pass_their_own_check():
    assert regress.load_expectations(ROOT / regress.EXPECTATIONS)


def test_regress_update_on_a_bad_file_is_refused_before_building_or_writing(tmp_path,
                                                                            capsys, monkeypatch):
    path = write(tmp_path / "build.json", "[1, 2]")
    from tirx_gemm.compile import api
    monkeypatch.setattr(api, "build_many", lambda *a, **k: pytest.fail("built"))
    rc = cli.main(["regress", "--cpu", "--update", "--expectations", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not a build expectations file" in err[0], err
    assert path.read_text() == "[1, 2]"


@pytest.mark.parametrize("content, needle", FILES + [
    ({"traceEvents": [1]}, r"traceEvents[0] is not an object"),
    ({"traceEvents": [], "otherData": "x"}, "otherData is not an object"),
    ({"traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "ts": "soon"}]}, "lacks a number ts"),
    ({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0}]},
     "names a CTA without args.name"),
    ({"traceEvents": [], "otherData": {"window_us": [1]}}, "window_us is not two numbers"),
])
def test_a_bad_trace_file_is_refused_in_one_line_naming_it(tmp_path, capsys, content, needle):
    """`tirx-gemm trace FILE.json` (nested far too deep once ended in a traceback)."""
    path = write(tmp_path / "t.json",
                 json.dumps(content) if isinstance(content, dict) else content)
    rc = cli.main(["trace", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"tirx-gemm: error: {path}: "), err
    assert needle in err[0]
    assert not (tmp_path / "t.png").exists()


def test_a_recorded_trace_passes_the_check():
    assert TV.load_chrome_trace(TRACE)["traceEvents"]


@pytest.mark.parametrize("change, needle", [
    (lambda rec: rec.update(clocks="boost"), "clocks must be an object, got 'boost'"),
    (lambda rec: rec.update(clocks_after_timing=[1]), "clocks_after_timing must be an object"),
])
def test_render_results_refuses_a_record_field_of_the_wrong_type(tmp_path, change, needle):
    rec = json.loads((ROOT / "results" / "nvidia-h200.jsonl").read_text().splitlines()[0])
    change(rec)
    (tmp_path / "r.jsonl").write_text(json.dumps(rec) + "\n")
    out = subprocess.run([sys.executable, "scripts/render_results.py", "--results",
                          str(tmp_path), "--print"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"r.jsonl:1: {needle}" in out.stderr


def test_a_folder_named_like_a_records_file_is_refused_naming_it(tmp_path):
    (tmp_path / "x.jsonl").mkdir()
    with pytest.raises(ValueError, match=r"x.jsonl: not a records file \(a folder"):
        records.load_records(tmp_path)


def _build_site():
    spec = importlib.util.spec_from_file_location("build_site_t", ROOT / "scripts" / "build_site.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_site_build_refuses_an_empty_results_folder_naming_it(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setenv("TIRX_GEMM_RESULTS", str(tmp_path))
    assert _build_site().main(["--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert f"the results folder {tmp_path} holds no records" in err


def test_the_site_build_names_the_folder_it_reads(monkeypatch):
    monkeypatch.delenv("TIRX_GEMM_RESULTS", raising=False)
    folder, n = _build_site().results_read()
    assert folder == ROOT / "results" and n > 0


def test_a_pipe_in_place_of_a_json_file_is_refused_not_waited_on(tmp_path):
    """A FIFO named like a suite, expectations or trace file: reading it blocks until a
    writer closes it (for ever, here); each reader refuses it in one line instead."""
    import os
    fifo = tmp_path / "suite.json"
    os.mkfifo(fifo)
    code = ("import sys\nfrom tirx_gemm.op import suite\nfrom tirx_gemm.report import jsonfile\n"
            "for call in (lambda: suite.load_suite(sys.argv[1]),\n"
            "             lambda: jsonfile.load_object(sys.argv[1], 'a baseline file')):\n"
            "    try:\n        call()\n    except ValueError as exc:\n        print(exc)\n")
    try:
        out = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True,
                             text=True, timeout=60, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading the pipe {fifo} did not return in 60 s")
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and all(str(fifo) in ln and "not a regular file" in ln
                                   for ln in lines), out.stdout + out.stderr
