"""NumSim from the repository alone: cargo builds the engines from the crates
vendored in vendor/numsim (checked, unpacked once, refused when tampered), the heartbeat says
"building NumSim engines" while cargo builds them, and a failure every case would repeat
stops the run at the first case with one line and exit 2. No simulator needed: the engine
build is faked where it would run."""
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

from tirx_gemm import cli, registry
from tirx_gemm.sim import batch, environment, gate


@pytest.fixture
def crates_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIRX_GEMM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(environment._VENDORED_HOME, "path", None)
    return tmp_path / "cache"


def test_the_vendored_archive_is_the_one_the_gate_trusts():
    assert gate.VENDOR_ARCHIVE.is_file(), gate.VENDOR_ARCHIVE
    import hashlib
    assert hashlib.sha256(gate.VENDOR_ARCHIVE.read_bytes()).hexdigest() == gate.VENDOR_SHA256
    provenance = (gate.VENDOR_DIR / "PROVENANCE.tsv").read_text().splitlines()
    with tarfile.open(gate.VENDOR_ARCHIVE) as tar:
        crates = {n.split("/")[1] for n in tar.getnames()
                  if n.startswith("cargo-vendor/") and n.count("/") >= 1 and n.split("/")[1]}
    listed = {f"{row.split(chr(9))[0]}-{row.split(chr(9))[1]}" for row in provenance[1:]}
    assert listed == crates - {"PROVENANCE.tsv"}, "PROVENANCE.tsv must list every crate"


def test_unpacks_once_into_the_cache(crates_cache):
    home = gate.unpack_crates()
    assert home == crates_cache / "numsim-crates" / gate.VENDOR_SHA256[:16] / "cargo-home"
    assert "replace-with" in (home / "config.toml").read_text()
    assert (home.parent / "cargo-vendor" / "pyo3-0.29.0" / "Cargo.toml").is_file()
    stamp = (home / "config.toml").stat().st_mtime_ns
    assert gate.unpack_crates() == home and (home / "config.toml").stat().st_mtime_ns == stamp
    assert not [p for p in home.parent.parent.iterdir() if p.name.startswith(".")]


def test_a_tampered_archive_is_refused(crates_cache, tmp_path):
    bad = tmp_path / "cargo-vendor.tgz"
    data = bytearray(gate.VENDOR_ARCHIVE.read_bytes())
    data[len(data) // 2] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(gate.SimEnvironmentError, match="does not match its sha256"):
        gate.unpack_crates(bad)
    assert not (crates_cache / "numsim-crates" / gate.VENDOR_SHA256[:16]).exists()


@pytest.mark.parametrize("member", ["link", "../escape"])
def test_an_archive_with_a_link_or_an_escape_is_refused(crates_cache, tmp_path, member):
    import hashlib
    evil = tmp_path / "evil.tgz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo(member if member != "link" else "cargo-home/config.toml")
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    digest = hashlib.sha256(evil.read_bytes()).hexdigest()
    with pytest.raises(gate.SimEnvironmentError, match="refused"):
        gate.unpack_crates(evil, digest)
    assert not (tmp_path / "escape").exists()


def test_cargo_points_at_the_vendored_crates_unless_the_user_chose(crates_cache, monkeypatch):
    monkeypatch.setattr(environment, "_harness_version", lambda: gate.HARNESS_VERSION)
    env = {}
    note = gate.use_vendored_crates(env)
    assert env["CARGO_HOME"] == str(gate.crates_dir() / "cargo-home") and "offline" in note
    assert gate.vendored_home_in_use(env)
    mine = {"CARGO_HOME": "/home/me/.cargo"}
    assert "your CARGO_HOME" in gate.use_vendored_crates(mine)
    assert mine == {"CARGO_HOME": "/home/me/.cargo"}
    reg = {gate.CRATES_ENV: "registry"}
    assert "registry" in gate.use_vendored_crates(reg) and "CARGO_HOME" not in reg
    with pytest.raises(ValueError, match=gate.CRATES_ENV):
        gate.use_vendored_crates({gate.CRATES_ENV: "sometimes"})
    monkeypatch.setattr(environment, "_harness_version", lambda: "0.2.0")
    other = {}
    assert "0.2.0" in gate.use_vendored_crates(other) and "CARGO_HOME" not in other


def _cargo():
    cargo = shutil.which("cargo") or str(os.path.expanduser("~/.cargo/bin/cargo"))
    return cargo if os.path.isfile(cargo) else None


@pytest.mark.skipif(_cargo() is None, reason="no cargo on this machine")
def test_cargo_resolves_a_pinned_crate_offline_from_the_vendored_home(crates_cache, tmp_path):
    """The unpacked config really replaces crates.io: a crate that needs pyo3 0.29.0 gets
    its lockfile with no network (CARGO_NET_OFFLINE as well, so nothing is fetched)."""
    home = gate.unpack_crates()
    crate = tmp_path / "probe"
    (crate / "src").mkdir(parents=True)
    (crate / "src" / "lib.rs").write_text("")
    (crate / "Cargo.toml").write_text('[package]\nname = "probe"\nversion = "0.0.0"\n'
                                      'edition = "2021"\n[dependencies]\n'
                                      'pyo3 = "=0.29.0"\n')
    out = subprocess.run([_cargo(), "generate-lockfile", "--offline"], cwd=crate,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CARGO_HOME": str(home), "CARGO_NET_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    assert 'name = "pyo3"\nversion = "0.29.0"' in (crate / "Cargo.lock").read_text()


class NumSimBuildError(Exception):
    """Stands in for tirx_harness's (matched by name, as the gate does)."""


OFFLINE_LOG = ("NumSim Rust dependency build failed:\n"
               "    Updating crates.io index\n"
               "warning: spurious network error (3 tries remaining): [6] Could not resolve "
               "host: index.crates.io\n"
               "error: failed to get `pyo3` as a dependency of package `numsim_engine`\n")


def test_environment_failures_are_told_from_kernel_failures():
    cause = gate.environment_failure(NumSimBuildError(OFFLINE_LOG))
    assert "Could not resolve host: index.crates.io" in cause and "vendor/numsim" in cause
    assert "\n" not in cause
    other = gate.environment_failure(NumSimBuildError(
        "NumSim Rust dependency build failed:\nerror: linker `cc` not found\n"))
    assert other.endswith("error: linker `cc` not found")
    assert gate.environment_failure(NumSimBuildError("native frontend has no rule")) is None
    assert gate.environment_failure(ValueError("wrong numbers")) is None
    tool = FileNotFoundError("cannot resolve NumSim Rust tool 'cargo' from 'cargo'")
    assert gate.environment_failure(tool)


def test_a_failure_every_case_would_repeat_stops_at_the_first_case(monkeypatch, tmp_path):
    calls = []

    def run_case(case, **_):
        calls.append(case)
        raise gate.SimEnvironmentError(gate.environment_failure(NumSimBuildError(OFFLINE_LOG)))

    monkeypatch.setattr(batch, "run_case", run_case)  # where simulate calls it
    cases = gate.cases_for(registry.get("v4", "sm_100a"))
    assert len(cases) > 1
    with pytest.raises(gate.SimEnvironmentError, match="stopped at the first case"):
        gate.simulate(cases, log_path=tmp_path / "log.txt", out=lambda s: None)
    assert len(calls) == 1


def test_the_cli_says_it_in_one_line_with_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(environment, "unavailable_reason", lambda: None)
    monkeypatch.setattr(environment, "crates_note", lambda: "cargo: test")

    def run_case(case, **_):
        raise gate.SimEnvironmentError(gate.environment_failure(NumSimBuildError(OFFLINE_LOG)))

    monkeypatch.setattr(batch, "run_case", run_case)  # where simulate calls it
    rc = cli.main(["sim", "v4", "--log", str(tmp_path / "log.txt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("tirx-gemm: error: ") and "Could not resolve host" in err[0]
    assert "stopped at the first case" in err[0] and str(tmp_path / "log.txt") in err[0]


def test_the_heartbeat_says_building_engines_while_cargo_runs():
    prog = gate.SimProgress("simulating", 3, stream=io.StringIO(), enabled=False)
    prog.current = "v1@sm_100a 128x128x64"
    prog.tools = lambda: {"cargo", "rustc"}
    line = prog.heartbeat_line()
    assert line.startswith("building NumSim engines") and "running" not in line
    prog.tools = lambda: {"rustc"}
    assert "compiling v1@sm_100a 128x128x64 for NumSim" in prog.heartbeat_line()
    prog.tools = lambda: set()
    assert prog.heartbeat_line().endswith("v1@sm_100a 128x128x64 running, elapsed 0 s")


def test_descendants_are_seen_through_proc():
    if not os.path.isdir("/proc"):
        pytest.skip("no /proc")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(c.startswith("python") for c in gate._descendant_commands()):
                break
            time.sleep(0.05)
        assert any(c.startswith("python") for c in gate._descendant_commands())
    finally:
        child.kill()
        child.wait()


def test_no_cargo_is_named_before_any_case(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NUMSIM_CARGO", raising=False)
    monkeypatch.delenv("NUMSIM_RUSTC", raising=False)
    why = gate._rust_tool_missing()
    assert why and "cargo and rustc are not found" in why and "install Rust" in why


def test_nothing_outside_the_repository_is_sourced():
    """CI and the README use the repository's vendored crates, never ../shared."""
    root = gate.VENDOR_DIR.parents[1]
    for name in (".ci/run", "README.md", "scripts/numsim_env.sh"):
        assert "../shared" not in (root / name).read_text(), name


@pytest.mark.skipif(_cargo() is None, reason="no cargo on this machine")
def test_the_installed_engines_lockfile_resolves_offline(crates_cache, tmp_path):
    """Every crate NumSim's engine locks is in the vendored archive (needs tirx-harness)."""
    numsim = pytest.importorskip("tirx_harness.numsim")
    from pathlib import Path
    engine = Path(numsim.__file__).parent / "engine-rs"
    work = tmp_path / "engine-rs"
    shutil.copytree(engine, work, ignore=shutil.ignore_patterns("target"))
    out = subprocess.run([_cargo(), "fetch", "--locked", "--offline"], cwd=work,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CARGO_HOME": str(gate.unpack_crates())})
    assert out.returncode == 0, out.stderr


def test_the_gate_picks_rustcs_level_per_step_and_leaves_the_users_alone():
    """-O0 for most steps, -O1 for the simulation-bound v1-v3, set around one case and
    removed after (a spawned worker must not read the gate's choice as the user's); a
    level the user set is kept and named as theirs."""
    from tirx_gemm.sim import environment as env_mod
    env = {}
    with env_mod.opt_level_for("v7", env) as level:
        assert level == env["NUMSIM_GENERATED_OPT_LEVEL"] == "0"
    assert "NUMSIM_GENERATED_OPT_LEVEL" not in env
    with env_mod.opt_level_for("v3", env) as level:
        assert level == "1"
    assert env == {}
    assert "-O0, -O1 for v1, v2, v3" in env_mod.use_gate_opt_level(env)
    env = {"NUMSIM_GENERATED_OPT_LEVEL": "3"}
    with env_mod.opt_level_for("v7", env) as level:
        assert level == "3"
    assert env == {"NUMSIM_GENERATED_OPT_LEVEL": "3"}
    assert "yours" in env_mod.use_gate_opt_level(env)


def test_an_unpacked_folder_without_its_stamp_is_unpacked_again(crates_cache):
    """A stamp with the archive's digest is written last: a folder without it (an unpack
    cut short, a damaged copy) is moved aside and unpacked again, not used."""
    home = gate.unpack_crates()
    dest = home.parent
    assert (dest / environment.STAMP).read_text().strip() == gate.VENDOR_SHA256
    (dest / environment.STAMP).unlink()
    shutil.rmtree(dest / "cargo-vendor" / "pyo3-0.29.0")  # what a cut-short unpack lacks
    assert gate.unpack_crates() == home
    assert (dest / "cargo-vendor" / "pyo3-0.29.0" / "Cargo.toml").is_file()
    assert (dest / environment.STAMP).is_file()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]


CHECKSUM_LOG = ("NumSim Rust dependency build failed:\n"
                "error: the listed checksum of `{path}` has changed:\n"
                "expected: 0123\nactual:   4567\n\n"
                "directory sources are not intended to be edited, if modifications are "
                "required then it is recommended that `[patch]` is used with a forked copy "
                "of the source\n")


def test_a_cargo_checksum_failure_moves_the_crates_aside_and_unpacks_them_again(
        crates_cache, monkeypatch):
    monkeypatch.setattr(environment, "_harness_version", lambda: gate.HARNESS_VERSION)
    gate.use_vendored_crates({})
    monkeypatch.setenv("CARGO_HOME", environment._VENDORED_HOME["path"])
    dest = gate.crates_dir()
    edited = dest / "cargo-vendor" / "pyo3-0.29.0" / "Cargo.toml"
    edited.write_text("edited")
    line = gate.environment_failure(NumSimBuildError(CHECKSUM_LOG.format(path=edited)))
    assert line == (f"cargo found a vendored crate's file changed ({edited}): the crates in "
                    f"{dest} were damaged, so they were moved aside and unpacked again; run "
                    f"again")
    assert edited.read_text() != "edited"
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]


def test_crates_that_cannot_be_moved_aside_name_the_folder_to_delete(crates_cache,
                                                                     monkeypatch):
    monkeypatch.setattr(environment, "_harness_version", lambda: gate.HARNESS_VERSION)
    gate.use_vendored_crates({})
    monkeypatch.setenv("CARGO_HOME", environment._VENDORED_HOME["path"])
    dest = gate.crates_dir()

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(environment.os, "rename", refuse)
    line = gate.environment_failure(NumSimBuildError(CHECKSUM_LOG.format(path="x/lib.rs")))
    assert line.endswith(f"delete {dest}, then run again") and "\n" not in line
