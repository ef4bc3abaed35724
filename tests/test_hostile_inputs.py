"""Hostile inputs found by a probe: JSON nested past Python's recursion limit in
every reader, a meta.json field of the wrong type, suite records that claim a check with a
string, options that `--suite` would silently ignore, suite records naming this machine's
paths. Each is refused in one line (or the cache entry rebuilt), never a traceback."""
import json
from pathlib import Path

import pytest

from tirx_gemm import cli

from tirx_gemm.op import suite
from tirx_gemm.compile import bundle, cache
from tirx_gemm.report import records, regress

DEEP = "[" * 200_000 + "]" * 200_000


def test_a_deep_manifest_is_refused(tmp_path):
    (tmp_path / bundle.MANIFEST).write_text(DEEP)
    with pytest.raises(bundle.BundleError, match="nests too deeply"):
        bundle.verify(tmp_path)


def test_a_deep_meta_json_is_an_invalid_entry(tmp_path):
    (tmp_path / cache.META).write_text(DEEP)
    with pytest.raises(cache.InvalidEntry, match="nests too deeply"):
        cache.read_entry(tmp_path, "0" * 20)


def test_a_deep_suite_is_refused(tmp_path):
    path = tmp_path / "suite.json"
    path.write_text(DEEP)
    with pytest.raises(ValueError, match="nests too deeply"):
        suite.load_suite(path)


def test_a_deep_results_line_is_refused(tmp_path):
    (tmp_path / "x.jsonl").write_text(DEEP + "\n")
    with pytest.raises(ValueError, match=r"x.jsonl:1: nests too deeply"):
        records.load_records(tmp_path)


def test_a_deep_baseline_is_refused(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(DEEP)
    with pytest.raises(ValueError, match="not a baseline file"):
        regress.load_baseline(path)


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    path = tmp_path / "suite.json"
    path.write_text(DEEP)
    rc = cli.main(["export", "--suite", str(path), "--arch", "sm_90a", "--out",
                   str(tmp_path / "b")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "nests too deeply" in err[0], err


# --------------------------------------------------------------------------------------
# meta.json fields of the wrong type: the entry is rebuilt, not served
# --------------------------------------------------------------------------------------
def _meta(**change) -> dict:
    good = {"step": "v1", "arch": "sm_100a", "M": 128, "N": 128, "K": 64, "kwargs": {},
            "key": "k" * 20, "registers": 40, "smem_bytes": 1024, "static_smem_bytes": 0,
            "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0,
            "sass_counts": {"UTCHMMA": 4}, "times": {"total": 1.5}, "tvm_version": "0.27",
            "nvcc_version": "13.0", "watchdog_ms": None, "sha256": {}}
    return {**good, **change}


@pytest.mark.parametrize("change", [{"registers": "many"}, {"spill_stores": None},
                                    {"sass_counts": []}, {"times": {"total": "slow"}},
                                    {"M": True}, {"kwargs": "dtype=float16"},
                                    {"sass_counts": {"UTCHMMA": "4"}}])
def test_a_meta_json_field_of_the_wrong_type_is_an_invalid_entry(tmp_path, change):
    meta = _meta(**change)
    (tmp_path / cache.META).write_text(json.dumps(meta))
    with pytest.raises(cache.InvalidEntry, match=f"meta.json's {next(iter(change))}"):
        cache.read_entry(tmp_path, meta["key"])


def test_a_well_typed_meta_json_gets_past_the_type_check(tmp_path):
    meta = _meta()
    (tmp_path / cache.META).write_text(json.dumps(meta))
    with pytest.raises(cache.InvalidEntry) as exc:  # the artefacts are missing, nothing else
        cache.read_entry(tmp_path, meta["key"])
    assert "missing or empty" in str(exc.value)


# --------------------------------------------------------------------------------------
# suite records validated on load
# --------------------------------------------------------------------------------------
def _suite_record(**change) -> dict:
    rec = {"step": "v9", "arch": "sm_90a", "M": 128, "N": 128, "K": 64, "device": "H200",
           "verified": True, "tflops": 10.0, "ratio_to_torch": 0.9,
           "timestamp": "2026-12-01T00:00:00+00:00",
           "suite": {"name": "models", "file": "tirx_gemm/op/suites/models.json",
                     "target": "matmul", "model": "m", "layer": "l", "dtype": "float16"}}
    rec.update(change)
    return rec


@pytest.mark.parametrize("change,needle", [
    ({"verified": "false"}, "verified must be true or false"),
    ({"suite": "models"}, "suite must be an object"),
    ({"suite": {"target": "matmul", "dtype": "fp8"}}, "suite.dtype"),
    ({"suite": {"dtype": "float16"}}, "suite.target"),
])
def test_a_bad_suite_record_is_refused_by_the_summary(tmp_path, change, needle):
    d = tmp_path / suite.RECORDS_SUBDIR
    d.mkdir()
    (d / "h200.jsonl").write_text(json.dumps(_suite_record()) + "\n"
                                  + json.dumps(_suite_record(**change)) + "\n")
    with pytest.raises(ValueError, match=rf"h200.jsonl:2: .*{needle}"):
        suite.render_summary(tmp_path)


def test_a_good_suite_record_is_summarised(tmp_path):
    d = tmp_path / suite.RECORDS_SUBDIR
    d.mkdir()
    (d / "h200.jsonl").write_text(json.dumps(_suite_record()) + "\n")
    assert "| H200 | matmul |" in suite.render_summary(tmp_path)


def test_suite_records_name_their_file_without_this_machines_path(tmp_path):
    fields = suite.suite_file_fields(suite.DEFAULT_SUITE)
    assert fields["file"] == "tirx_gemm/op/suites/models.json"
    assert len(fields["file_sha256"]) == 64
    mine = tmp_path / "deep" / "my_suite.json"
    mine.parent.mkdir()
    mine.write_text("{}")
    assert suite.suite_file_fields(mine)["file"] == "my_suite.json"


# --------------------------------------------------------------------------------------
# --suite refuses what it would ignore
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,needle", [
    (["--timeline"], "--timeline"), (["--dtype", "bfloat16"], "--dtype"),
    (["--dtype", "float16"], "--dtype"), (["v4"], "a step name"), (["--all"], "--all"),
    (["--mnk", "128,128,64"], "--mnk"), (["--shapes", "bench"], "--shapes"),
])
def test_export_suite_refuses_an_option_it_would_ignore(tmp_path, capsys, extra, needle):
    rc = cli.main(["export", "--suite", "--arch", "sm_90a", "--out", str(tmp_path / "b"),
                   *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0] and "ignored" in err[0], err
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("extra,needle", [(["--no-time"], "--no-time"), (["v9"], "a step"),
                                          (["--dtype", "bfloat16"], "--dtype")])
def test_bench_suite_refuses_an_option_it_would_ignore(capsys, extra, needle):
    rc = cli.main(["bench", "--suite", "--arch", "sm_90a", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_target_without_suite_is_refused(tmp_path, capsys):
    rc = cli.main(["export", "v4", "--arch", "sm_90a", "--target", "v9", "--out",
                   str(tmp_path / "b")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--target" in err[0], err


def test_bench_suite_on_the_default_arch_points_at_a_gpu_not_the_simulator(capsys,
                                                                           tmp_path):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    mine = tmp_path / "s.json"
    mine.write_text(json.dumps({"name": "s", "dtypes": ["float16"], "shapes": [
        {"M": 128, "N": 128, "K": 64, "model": "m", "layer": "l", "why": "w"}]}))
    rc = cli.main(["bench", "--suite", str(mine)])
    err = capsys.readouterr().err
    assert rc == 2 and "sim --all" not in err
    assert "--arch sm_90a" in err and "measures no time" in err
