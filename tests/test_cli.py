"""CLI smoke tests: what a user types, what they see, and the exit status."""
import subprocess
import sys
from pathlib import Path

import pytest

from tirx_gemm import registry

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "tirx_gemm.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_list_shows_every_step():
    out = cli("list", "-v")
    assert out.returncode == 0, out.stderr
    for s in registry.STEPS:
        assert any(line.startswith(f"{s.id} ") and s.arch in line for line in out.stdout.splitlines())
    assert "constraints:" in out.stdout
    assert "dtypes: float16, bfloat16" in out.stdout
    assert "--dtype float16 or bfloat16" in out.stdout


def test_build_prints_resource_table():
    out = cli("build", "v1")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("v1 "))
    assert "sm_100a" in row and "UTCHMMA" in row and "128x128x64" in row
    assert "not run" in out.stdout  # honest about sm_100a


def test_build_all_reports_progress_and_every_step():
    out = cli("build", "--all", "--arch", "sm_100a")
    assert out.returncode == 0, out.stderr
    steps = registry.all_steps("sm_100a")
    assert f"[{len(steps)}/{len(steps)}]" in out.stderr
    for s in steps:
        assert any(line.startswith(f"{s.id} ") for line in out.stdout.splitlines())


@pytest.mark.parametrize("what,needle", [("--cuda", "__global__"), ("--sass", "UTCHMMA"),
                                         ("--tir", "T.prim_func")])
def test_show(what, needle):
    out = cli("show", "v2", what)
    assert out.returncode == 0, out.stderr
    assert needle in out.stdout


def test_dtype_reaches_build_and_show():
    out = cli("build", "v1", "--dtype", "bfloat16")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("v1 "))
    assert "128x128x64 bfloat16" in row
    kernel = next(line for line in cli("show", "v1", "--cuda", "--dtype", "bfloat16")
                  .stdout.splitlines() if "__global__" in line)
    assert "nv_bfloat16* __restrict__ A" in kernel and "half*" not in kernel
    kernel = next(line for line in cli("show", "v1", "--cuda").stdout.splitlines()
                  if "__global__" in line)
    assert "half* __restrict__ A" in kernel  # float16 stays the default
    out = cli("run", "v1", "--dtype", "float32")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "invalid choice: 'float32'" in out.stderr


def test_export_takes_explicit_edge_shapes_and_bfloat16(tmp_path):
    out = cli("export", "v4", "--arch", "sm_90a", "--dtype", "bfloat16", "--shapes",
              "1,264,72;200,136,200", "--out", str(tmp_path / "b"), "-q")
    assert out.returncode == 0, out.stderr
    assert "--dtype bfloat16 --bundle" in out.stdout
    import json
    kernels = json.loads((tmp_path / "b" / "manifest.json").read_text())["kernels"]
    assert sorted((k["M"], k["N"], k["K"], k["dtype"]) for k in kernels) == [
        (1, 264, 72, "bfloat16"), (200, 136, 200, "bfloat16")]


def test_run_without_gpu_builds_then_refuses():
    out = cli("run", "v3", "--mnk", "256,384,512")
    assert out.returncode == 2
    assert "v3" in out.stdout and "UTCHMMA" in out.stdout  # it did build
    assert "cannot run v3@sm_100a" in out.stderr
    assert "compute capability 10.x" in out.stderr
    assert "TFLOP/s" not in out.stdout


def test_invalid_shape_and_step_errors():
    out = cli("build", "v1", "--mnk", "256,128,64")
    assert out.returncode == 2 and "M=256 must equal 128" in out.stderr
    out = cli("build", "v99")
    assert out.returncode == 2 and "no step 'v99'" in out.stderr
    out = cli("build", "v3", "--mnk", "1,2")
    assert out.returncode == 2 and "three integers" in out.stderr


def test_readme_results_table_is_current():
    out = subprocess.run([sys.executable, "scripts/render_results.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
