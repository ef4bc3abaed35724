"""The README's commands as a newcomer types them: CI runs the same ones, their
set-up installs only when something changed, and every step prints progress at least every
10 s in plain lines. The CLI paths the commands reach (build --all's per-build lines and
legend, sim's and run's guidance on a CPU machine) are tested in tests/test_cli.py."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
CI = (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def _bash_blocks() -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", README, re.S)]


def _command(needle: str) -> str:
    hits = [b for b in _bash_blocks() if needle in b and "\n" not in b]
    assert len(hits) == 1, f"one README command with {needle!r}, found {hits}"
    return hits[0]


BUILD = _command("tirx-gemm build --all")
TESTS = _command("python -m pytest")
SIM = _command("tirx-gemm sim --all")


def _parts(cmd: str) -> list[str]:
    return [p.strip() for p in cmd.split("&&")]


def test_each_readme_command_sets_up_through_the_stamped_installer():
    for cmd in (BUILD, TESTS, SIM):
        setup = _parts(cmd)[0]
        assert "scripts/setup_venv.py" in setup, cmd
        assert (ROOT / "scripts" / "setup_venv.py").is_file()
    assert "find_python312.sh" in _parts(SIM)[0]


def test_ci_runs_the_readme_commands():
    """.ci/run is the README's test and NumSim commands on fresh venvs (plus the gate's log
    file and the mutant tests), never a variant of them."""
    venv_args = _parts(TESTS)[0].split("setup_venv.py", 1)[1].split(None, 1)[1]
    assert f'scripts/setup_venv.py "$VENV" {venv_args}' in CI
    sim_args = _parts(SIM)[0].split("setup_venv.py", 1)[1].split(None, 1)[1]
    assert f'scripts/setup_venv.py "$SIMVENV" {sim_args}' in CI
    assert _parts(TESTS)[-1] in CI  # python -m pytest -q -n 2 --dist loadfile
    assert _parts(SIM)[-1] in CI    # tirx-gemm sim --all
    # every long CI step runs under the heartbeat
    for line in CI.splitlines():
        if re.search(r"\b(pytest|tirx-gemm sim)\b", line) and not line.lstrip().startswith("#"):
            assert line.lstrip().startswith("beat "), line


def _fake_venv(tmp_path: Path, pip_sleep: float = 0.0, fail: bool = False) -> Path:
    """A folder that looks like a venv to setup_venv.py; its 'python' logs each pip call."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> "{tmp_path}/pip-calls"
        echo "fake pip: $*"
        sleep {pip_sleep}
        mkdir -p "{site}/tirx_gemm-0.1.0.dist-info"
        exit {1 if fail else 0}
        """))
    py.chmod(0o755)
    return venv


def _setup(venv: Path, root: Path, *extra: str):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "setup_venv.py"), str(venv),
                           "--extra", "test", "--torch", "torch==2.13.0", "--root", str(root),
                           *extra], capture_output=True, text=True, timeout=120)


def _calls(tmp_path: Path) -> list[str]:
    f = tmp_path / "pip-calls"
    return f.read_text().splitlines() if f.exists() else []


def test_setup_installs_once_then_only_when_something_changed(tmp_path):
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    venv = _fake_venv(tmp_path, pip_sleep=0.7)
    first = _setup(venv, root, "--every", "0.2")
    assert first.returncode == 0, first.stdout + first.stderr
    assert _calls(tmp_path) == ["-m pip install torch==2.13.0", "-m pip install -e .[test]"]
    # pip's output passes through, and a silent pip gets heartbeat lines (plain lines)
    assert "fake pip: -m pip install torch==2.13.0" in first.stdout
    assert re.search(r"^installing torch==2\.13\.0: still running, elapsed \d+ s "
                     r"\(last output: fake pip: ", first.stdout, re.M), first.stdout
    assert "\r" not in first.stdout and "\x1b" not in first.stdout
    assert (venv / ".tirx-gemm-setup").is_file()

    warm = _setup(venv, root)  # nothing changed: nothing installed, and it says so
    assert warm.returncode == 0 and len(_calls(tmp_path)) == 2, warm.stdout
    assert "up to date" in warm.stdout and "nothing to install" in warm.stdout

    (venv / "lib" / "python3.11" / "site-packages" / "extra-1.0.dist-info").mkdir()
    assert _setup(venv, root).returncode == 0 and len(_calls(tmp_path)) == 4  # venv changed
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '2'\n")
    assert _setup(venv, root).returncode == 0 and len(_calls(tmp_path)) == 6  # project changed
    assert _setup(venv, root).returncode == 0 and len(_calls(tmp_path)) == 6
    assert _setup(venv, root, "--force").returncode == 0 and len(_calls(tmp_path)) == 8


def test_the_readmes_two_commands_alternate_without_reinstalling(tmp_path):
    """The main job's set-up (no extra) after the tests' (test extra + torch) must not find
    the stamp "changed" and reinstall, nor back again. A request whose extras were
    installed is served as it is; one that adds extras installs the union."""
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    venv = _fake_venv(tmp_path)

    def plain(*args):
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "setup_venv.py"),
                               str(venv), "--root", str(root), *args],
                              capture_output=True, text=True, timeout=120)
    assert _setup(venv, root).returncode == 0 and len(_calls(tmp_path)) == 2
    main_job = plain()  # the README's first command after the second: nothing to install
    assert main_job.returncode == 0 and len(_calls(tmp_path)) == 2, main_job.stdout
    assert "nothing to install" in main_job.stdout and "['test']" in main_job.stdout
    assert _setup(venv, root).returncode == 0 and len(_calls(tmp_path)) == 2
    assert plain("--extra", "sim").returncode == 0  # a new extra: the union, torch kept
    assert _calls(tmp_path)[2:] == ["-m pip install -e .[sim,test]"]
    assert _setup(venv, root).returncode == 0 and plain().returncode == 0
    assert len(_calls(tmp_path)) == 3


def test_a_failed_install_is_not_stamped(tmp_path):
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    venv = _fake_venv(tmp_path, fail=True)
    out = _setup(venv, root)
    assert out.returncode == 1 and "failed (exit 1)" in out.stdout, out.stdout
    assert not (venv / ".tirx-gemm-setup").exists()
    assert _setup(venv, root).returncode == 1 and len(_calls(tmp_path)) == 2  # tried again


def test_heartbeat_passes_output_through_and_keeps_the_exit_status():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "heartbeat.py"), "--every",
                          "0.2", "demo", "--", "sh", "-c", "printf ...; sleep 0.7; echo done; "
                          "exit 3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3
    assert out.stdout.startswith("...\n")  # a heartbeat after a partial line starts a new one
    assert re.search(r"^demo: still running, elapsed \d+ s \(last output: \.\.\.\)$",
                     out.stdout, re.M), out.stdout
    assert out.stdout.rstrip().endswith("done")
    assert "\r" not in out.stdout and "\x1b" not in out.stdout


def test_the_test_commands_set_up_prints_progress():
    """The README's test command builds what the suite uses before its tests start, with a
    line per build (cache hits counted) and a closing line; a run of one other test file
    builds nothing up front. It runs where the batch is already in the session's cache (a
    full run's own set-up put it there), so that it reads back instead of compiling again."""
    import conftest
    from tirx_gemm.compile.cache import load_cached
    missing = [r for r in conftest._setup_requests()
               if load_cached(r[0], *r[1], r[2], None) is None]
    if missing:
        pytest.skip(f"{len(missing)} set-up builds are not in the session's cache (the whole "
                    "suite's set-up builds them)")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_build.py", "-k", "invalid_shape"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert re.search(r"^test set-up: \d+ builds of every step", text, re.M), text[-2000:]
    assert re.search(r"^test set-up: done in \d+ s \(\d+ built, \d+ read from the cache\)",
                     text, re.M), text[-2000:]
    assert "\r" not in text and "\x1b" not in text
    other = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/test_readme_commands.py", "-k", "heartbeat_passes"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert other.returncode == 0 and "test set-up" not in other.stdout + other.stderr
