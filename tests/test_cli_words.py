"""The CLI's words for a mistaken input: each names what was typed (as typed), the flag and
the form it wants, in one line, before anything is built or run."""
import subprocess
import sys
from pathlib import Path

import pytest

from tirx_gemm import cli

ROOT = Path(__file__).resolve().parent.parent
DIGEST = "ab" * 32


def error_of(capsys, *argv) -> str:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_a_negative_m_is_said_to_need_to_be_positive_not_a_missing_argument(capsys):
    assert "M=-5 must be a positive integer" in error_of(capsys, "choose", "-5,128,128")


def test_trace_mnk_that_is_not_numbers_names_the_flag_and_the_form(capsys):
    err = error_of(capsys, "trace", "v9", "--mnk", "a,b,c")
    assert "--mnk" in err and "M,N,K integers" in err and "'a,b,c'" in err
    assert "_parse_mnk" not in err


def test_a_step_id_is_echoed_as_typed(capsys):
    err = error_of(capsys, "build", " v1")
    assert "no step ' v1' for sm_100a" in err and "did you mean 'v1'" in err


@pytest.mark.parametrize("cmd", ["bench", "export"])
def test_a_target_that_is_no_step_is_echoed_and_named_as_the_target(capsys, cmd):
    err = error_of(capsys, cmd, "--suite", "--target", "bogus", "--arch", "sm_90a")
    assert "--target 'bogus' is neither 'matmul' nor a step of sm_90a" in err


@pytest.mark.parametrize("argv", [["run", "v4", "--arch", "sm_90a"], ["trace", "v9"],
                                  ["bench", "--arch", "sm_90a"]])
def test_a_digest_pin_without_a_bundle_is_refused(capsys, monkeypatch, argv):
    """--expect-sha256 with kernels built here would check nothing against the digest."""
    monkeypatch.delenv("TIRX_GEMM_BUNDLE", raising=False)
    err = error_of(capsys, *argv, "--expect-sha256", DIGEST)
    assert "--expect-sha256 pins the digest of a bundle, but no bundle is given" in err


def test_the_old_trace_entry_says_what_replaced_it(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tirx_gemm.run.trace", "png",
                          str(tmp_path / "t.json")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out
    assert "is now `tirx-gemm trace`: run `tirx-gemm trace " + str(tmp_path / "t.json") \
        in out.stderr and len(out.stderr.splitlines()) == 1


def test_the_cli_piped_into_a_reader_that_stops_ends_without_an_error():
    p = subprocess.Popen([sys.executable, "-m", "tirx_gemm.cli", "list"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    assert p.wait(timeout=120) == 0 and p.stderr.read() == b""
