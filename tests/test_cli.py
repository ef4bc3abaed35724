"""CLI smoke tests: what a user types, what they see, and the exit status; the guidance a
newcomer on a CPU machine gets from each README command."""
import io
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import support
from tirx_gemm import registry

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, timeout=600):
    return support.cli(*args, timeout=timeout)


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
    # the legend: the columns' units and each SASS opcode shown (from tirx_gemm/compile/sass.py)
    assert "regs = registers per thread" in out.stdout and "K = KiB" in out.stdout
    assert re.search(r"^  UTCHMMA +tcgen05\.mma", out.stdout, re.M), out.stdout


def test_build_all_reports_progress_and_every_step():
    out = cli("build", "--all", "--arch", "sm_100a")
    assert out.returncode == 0, out.stderr
    steps = registry.all_steps("sm_100a")
    n = len(steps)
    # one plain line per build: "built 5/10 (v5@sm_100a 4096x4096x4096 12.3 s) elapsed 40 s"
    assert re.search(rf"^(built|cached) {n}/{n} \(v\d+@sm_100a \d+x\d+x\d+( [\d.]+ s)?\) "
                     r"elapsed \d+ s$", out.stderr, re.M), out.stderr
    assert "\r" not in out.stderr and "\x1b" not in out.stderr  # piped: no control characters
    for s in steps:
        assert any(line.startswith(f"{s.id} ") for line in out.stdout.splitlines())


@pytest.mark.parametrize("what,needle", [("--cuda", "__global__"), ("--sass", "UTCHMMA"),
                                         ("--tir", "T.prim_func")])
def test_show(what, needle):
    out = cli("show", "v2", what)
    assert out.returncode == 0, out.stderr
    assert needle in out.stdout


def test_show_cuda_starts_at_the_kernel():
    short, full = cli("show", "v2", "--cuda"), cli("show", "v2", "--cuda", "--full")
    assert short.returncode == full.returncode == 0, short.stderr + full.stderr
    assert "__global__" in short.stdout.splitlines()[0]
    assert "prelude skipped" in short.stderr and "--full" in short.stderr
    assert full.stdout.endswith(short.stdout) and len(full.stdout) > len(short.stdout)
    assert "__global__" not in full.stdout.splitlines()[0]


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
    assert "--dtype 'float32' is not one of float16, bfloat16" in out.stderr


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
    out = cli("build", "v1", "--mnk", "256,128,64")  # refused from the registry's words
    assert out.returncode == 2 and "cannot take 256x128x64: it needs M = N = 128" in out.stderr
    out = cli("build", "v99")
    assert out.returncode == 2 and "no step 'v99'" in out.stderr
    out = cli("build", "v77")
    assert out.returncode == 2 and "(did you mean 'v7'?)" in out.stderr
    out = cli("build", "v3", "--mnk", "1,2")
    assert out.returncode == 2 and "three integers" in out.stderr


def test_readme_results_table_is_current():
    out = subprocess.run([sys.executable, "scripts/render_results.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------------------------
# a newcomer's first hour: the README's commands on a CPU machine
# --------------------------------------------------------------------------------------
def _one_line(out):
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_bare_command_prints_the_short_help():
    out = cli()
    assert out.returncode == 0 and not out.stderr, out.stderr
    for command in ("list", "build", "show", "sim", "export", "run", "bench", "regress",
                    "doctor"):
        assert re.search(rf"^  {command} ", out.stdout, re.M), out.stdout
    assert "cmd" not in out.stdout


def test_unknown_command_suggests_the_closest_and_names_no_internals():
    line = _one_line(cli("buidl", "v1"))
    assert "unknown command 'buidl' (did you mean 'build'?)" in line and "cmd" not in line
    line = _one_line(cli("build", "v1", "--arch", "sm90"))
    assert "(did you mean 'sm_90a'?)" in line
    out = cli("--version-please")
    assert out.returncode == 2 and "cmd" not in out.stderr


def test_cannot_run_here_names_the_command_that_can():
    """run/bench/regress without a GPU: what to do instead, on this machine or another."""
    out = cli("run", "v3", "--mnk", "256,384,512")  # sm_100a: NumSim
    assert out.returncode == 2 and "`tirx-gemm sim v3`" in out.stderr
    out = cli("bench", "--arch", "sm_90a")  # Hopper: an export here, a GPU host there
    assert out.returncode == 2, out.stderr
    assert "`tirx-gemm export --all --arch sm_90a --shapes bench --ffi-wheel 3.12" in out.stderr
    assert "bench --arch sm_90a --bundle build/bundle`" in out.stderr
    out = cli("bench", "v4", "--arch", "sm_90a", "--dtype", "bfloat16")
    assert "`tirx-gemm export v4 --arch sm_90a --shapes bench --ffi-wheel 3.12" in out.stderr
    out = cli("regress")
    assert out.returncode == 2 and "`tirx-gemm regress --cpu`" in out.stderr
    assert "`tirx-gemm sim --all`" in out.stderr and "--bundle build/bundle" in out.stderr


def test_sim_in_the_wrong_python_names_the_venv_to_make():
    if sys.version_info >= (3, 12):
        pytest.skip("this interpreter can run NumSim")
    line = _one_line(cli("sim", "v1"))
    assert "scripts/setup_venv.py .simvenv --extra sim" in line and "find_python312" in line


def test_toolchain_errors_point_at_doctor():
    from tirx_gemm.compile.api import BuildError
    from tirx_gemm.cli import _doctor_hint
    assert "tirx-gemm doctor" in _doctor_hint(BuildError("nvcc did not finish within 1 s"))
    assert _doctor_hint(BuildError("v4@sm_90a 1x8x8: the kernel failed")) == ""
    assert _doctor_hint(ValueError("nvcc")) == ""


def test_progress_heartbeat_and_items_are_plain_lines():
    from tirx_gemm.progress import Progress
    buf = io.StringIO()
    with Progress("building", 3, stream=buf, every=0.2) as p:
        p.current = "v7@sm_90a"
        time.sleep(0.55)
        p.item("built", "v7@sm_90a 4096x4096x4096", 12.3)
    text = buf.getvalue()
    assert re.search(r"^building: 0/3 done, v7@sm_90a running, elapsed 0 s$", text, re.M), text
    assert re.search(r"^built 1/3 \(v7@sm_90a 4096x4096x4096 12\.3 s\) elapsed 1 s$", text,
                     re.M) or re.search(r"^built 1/3 \(.*12\.3 s\) elapsed 0 s$", text, re.M)
    assert "\r" not in text and "\x1b" not in text
    quiet = io.StringIO()
    with Progress("building", 1, stream=quiet, every=0.05, enabled=False) as p:
        time.sleep(0.2)
        p.item("built", "x")
    assert quiet.getvalue() == ""


# --------------------------------------------------------------------------------------
# the README's CLI block against the parser
# --------------------------------------------------------------------------------------
def _readme_cli_block() -> str:
    """The command block of docs/cli.md (the README's CLI section links it)."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    body = text[text.index("\n## Every command\n"):]
    return body[body.index("```\n") + 4:body.index("\n```", body.index("```\n") + 4)]


def _subparsers():
    import argparse
    from tirx_gemm import cli as cli_mod
    parser = cli_mod.make_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_readme_cli_block_names_every_command_and_option_the_parser_has():
    """Every subcommand has a synopsis line (``tirx-gemm CMD ...``) in the README's CLI block,
    every option of it appears on one of those lines, and every option written there exists
    (help aside)."""
    block = _readme_cli_block()
    problems = []
    for name, sp in _subparsers().items():
        synopsis = " ".join(ln for ln in block.splitlines()
                            if re.match(rf"tirx-gemm {re.escape(name)}(\s|$)", ln))
        if not synopsis:
            problems.append(f"{name}: no synopsis line")
            continue
        options = {o for a in sp._actions for o in a.option_strings} - {"-h", "--help"}
        for action in sp._actions:
            strings = set(action.option_strings) - {"-h", "--help"}
            if strings and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", synopsis)
                                   for o in strings):
                problems.append(f"{name}: {'/'.join(sorted(strings))} missing")
        for written in set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", synopsis)):
            if written not in options:
                problems.append(f"{name}: README writes {written}, which it does not take")
    assert not problems, "\n".join(problems)


def test_bare_call_and_help_say_what_they_print(capsys):
    from tirx_gemm import cli as cli_mod
    assert cli_mod.main([]) == 0
    short = capsys.readouterr().out
    for name in _subparsers():
        assert re.search(rf"^  {name} ", short, re.M), f"bare tirx-gemm lacks {name}"
    assert "lists every option." not in short  # -h lists the commands, not every option
    with pytest.raises(SystemExit) as exc:
        cli_mod.main(["-h"])
    assert exc.value.code == 0
    helptext = capsys.readouterr().out
    for name in _subparsers():
        assert name in helptext
    assert "COMMAND -h" in helptext
