"""The regression checks catch what they exist to catch: a wrong result, a step below its
baseline floor, and a compiled step whose resources or SASS drifted."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tirx_gemm.report import regress

ROOT = Path(__file__).resolve().parent.parent


def rec(step="v4", tflops=500.0, verified=True, M=4096):
    return {"step": step, "arch": "sm_90a", "M": M, "N": M, "K": M, "tflops": tflops,
            "ratio_to_torch": 0.7, "verified": verified,
            "check": [{"kind": "random", "ok": verified, "reason": None if verified else
                       "3 NaN/unwritten elements", "n_mismatch": 0 if verified else 3}]}


def baseline(tflops):
    return {"entries": {"v4@sm_90a:4096x4096x4096": {"tflops": tflops}}}


def test_within_tolerance_passes():
    (v,) = regress.evaluate([rec(tflops=450.0)], baseline(500.0), 0.15)
    assert v["status"] == "ok" and v["floor"] == pytest.approx(425.0)


def test_baseline_raised_above_what_the_step_reaches_fails():
    (v,) = regress.evaluate([rec(tflops=500.0)], baseline(700.0), 0.15)
    assert v["status"] == "FAIL" and "< floor 595.0" in v["why"]
    assert "FAIL" in regress.format_verdicts([v])


def test_wrong_result_fails_even_when_fast():
    (v,) = regress.evaluate([rec(tflops=900.0, verified=False)], baseline(500.0), 0.15)
    assert v["status"] == "FAIL" and "wrong result" in v["why"] and "NaN" in v["why"]


def test_missing_entry_is_new_and_baseline_roundtrip(tmp_path):
    (v,) = regress.evaluate([rec()], None, 0.15)
    assert v["status"] == "new"
    b = regress.baseline_from_records([rec(), rec(verified=False, M=8192)], {"name": "X"})
    assert list(b["entries"]) == ["v4@sm_90a:4096x4096x4096"]  # unverified runs set no floor
    p = tmp_path / "b.json"
    p.write_text(json.dumps(b))
    assert regress.load_baseline(p)["entries"]["v4@sm_90a:4096x4096x4096"]["tflops"] == 500.0
    with pytest.raises(ValueError):
        regress.evaluate([rec()], b, 1.5)


@pytest.mark.parametrize("content", [b"garbage{", b"\xff\xfe\x00", b"[1, 2]", b"{}"])
def test_damaged_baseline_names_the_file(tmp_path, content):
    p = tmp_path / "nvidia-h200.json"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=f"^{re.escape(str(p))}: not a baseline file"):
        regress.load_baseline(p)


def test_snapshot_diff_is_readable():
    exp = {"v7@sm_100a:4096x4096x4096": {"registers": 224, "smem_bytes": 164864, "spills": 0,
                                         "sass": {"UTCHMMA": 16, "USETMAXREG": 2}}}
    act = {"v7@sm_100a:4096x4096x4096": {"registers": 255, "smem_bytes": 164864, "spills": 8,
                                         "sass": {"UTCHMMA": 16}}}
    diff = regress.diff_snapshot(exp, act)
    assert "v7@sm_100a:4096x4096x4096: registers 224 -> 255" in diff
    assert "v7@sm_100a:4096x4096x4096: spills 0 -> 8" in diff
    assert "v7@sm_100a:4096x4096x4096: SASS USETMAXREG x2 -> x0" in diff
    assert regress.diff_snapshot(exp, exp) == []


def test_cpu_regression_matches_committed_expectations():
    out = subprocess.run([sys.executable, "-m", "tirx_gemm.cli", "regress", "--cpu", "-q"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "match" in out.stdout


def test_cpu_regression_catches_a_drifted_expectation(tmp_path):
    exp = json.loads((ROOT / regress.EXPECTATIONS).read_text())
    key = next(k for k in exp if k.startswith("v4@sm_100a"))
    exp[key]["sass"]["UTMALDG"] = exp[key]["sass"].get("UTMALDG", 0) + 1
    bad = tmp_path / "build.json"
    bad.write_text(json.dumps(exp))
    out = subprocess.run([sys.executable, "-m", "tirx_gemm.cli", "regress", "--cpu", "-q",
                          "--arch", "sm_100a", "--expectations", str(bad)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 1
    assert f"{key}: SASS UTMALDG" in out.stdout


def test_gpu_regress_without_gpu_says_why():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, "-m", "tirx_gemm.cli", "regress"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no CUDA GPU visible" in out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
