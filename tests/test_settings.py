"""tirx_gemm/settings.py is the one table of the environment settings: every
TIRX_GEMM_* name the package, the scripts or the tests use is declared there, CONTRIBUTING.md's
table is rendered from it, and each kind of value is checked with a one-line error."""
import re
from pathlib import Path

import pytest

from tirx_gemm import settings

ROOT = Path(settings.__file__).resolve().parent.parent
# a setting's name in source: TIRX_GEMM_ and capitals (not _TIRX_GEMM_..., conftest's private
# hand-over to its workers)
NAME = re.compile(r"(?<![A-Za-z0-9_])TIRX_GEMM_[A-Z0-9_]*[A-Z0-9]")
HERE = Path(__file__).name


def _names_in(*folders) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for folder in folders:
        for p in sorted((ROOT / folder).rglob("*.py")):
            if p.name == HERE or p.name == "settings.py":
                continue
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                for name in NAME.findall(line):
                    found.setdefault(name, []).append(f"{p.relative_to(ROOT)}:{n}")
    return found


def test_every_name_read_is_declared():
    used = _names_in("tirx_gemm", "scripts", "tests")
    missing = {k: v[:3] for k, v in used.items() if k not in settings.TABLE}
    assert not missing, ("TIRX_GEMM_* names used but not declared in tirx_gemm/settings.py "
                         f"SETTINGS: {missing}")


def test_every_declared_setting_is_read_where_its_scope_says():
    package, tests = _names_in("tirx_gemm", "scripts"), _names_in("tests")
    for s in settings.SETTINGS:
        assert s.name in (package if s.scope == "package" else tests), (s.name, s.scope)
        assert s.meaning and "\n" not in s.meaning and s.limits


def test_contributing_holds_the_table_rendered_from_settings():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert settings.render_into(text) == text, (
        "CONTRIBUTING.md's settings table is not SETTINGS': run "
        "`python -m tirx_gemm.settings --write`")
    block = text[text.index(settings.BEGIN):text.index(settings.END)]
    documented = re.findall(r"^\| `(TIRX_GEMM_[A-Z0-9_]+)` \|", block, re.M)
    assert documented == [s.name for s in settings.SETTINGS]


def test_the_readme_names_only_declared_settings():
    readme = set(NAME.findall((ROOT / "README.md").read_text(encoding="utf-8")))
    assert readme <= set(settings.TABLE), readme - set(settings.TABLE)


def test_readers_that_keep_a_copy_agree_with_the_table():
    """Modules being refactored elsewhere still name their variable (and the launcher its
    default and maximum) themselves: the copies must be the table's."""
    from tirx_gemm import bundle_format, matmul
    from tirx_gemm.compile import procs, toolchain
    from tirx_gemm.run import launcher, loader
    from tirx_gemm.sim import gate
    from tirx_gemm.notebook import results
    t = settings.setting("TIRX_GEMM_KERNEL_TIMEOUT")
    assert (launcher.KERNEL_TIMEOUT_ENV, launcher.KERNEL_TIMEOUT_S,
            launcher.KERNEL_TIMEOUT_MAX_S) == (t.name, t.default, t.maximum)
    assert procs.TOOL_TIMEOUT_S == settings.setting(procs.TOOL_TIMEOUT_ENV).default
    for name in (matmul.BUNDLE_ENV, bundle_format.EXPECT_SHA256_ENV, loader.RUNTIME_DIR_ENV,
                 toolchain.SYSTEM_CUDA_ENV, gate.CRATES_ENV, results.RESULTS_ENV):
        assert name in settings.TABLE, name


@pytest.mark.parametrize("name,text", [
    ("TIRX_GEMM_KERNEL_TIMEOUT", "3601"), ("TIRX_GEMM_KERNEL_TIMEOUT", "0"),
    ("TIRX_GEMM_TOOL_TIMEOUT", "inf"), ("TIRX_GEMM_TOOL_TIMEOUT", "soon"),
    ("TIRX_GEMM_SYSTEM_CUDA", "maybe"), ("TIRX_GEMM_NUMSIM_CRATES", "sometimes"),
    ("TIRX_GEMM_BUNDLE_SHA256", "abc"),
])
def test_a_value_out_of_its_limits_is_one_line_naming_variable_and_range(name, text):
    with pytest.raises(ValueError) as e:
        settings.get(name, environ={name: text})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{name}={text!r} must be ")
    assert settings.setting(name).limits.split(",")[0].split(" (")[0] in msg


def test_values_and_defaults(tmp_path):
    g = settings.get
    assert g("TIRX_GEMM_KERNEL_TIMEOUT", environ={}) == 60.0
    assert g("TIRX_GEMM_KERNEL_TIMEOUT", environ={"TIRX_GEMM_KERNEL_TIMEOUT": "3600"}) == 3600
    assert g("TIRX_GEMM_TOOL_TIMEOUT", environ={"TIRX_GEMM_TOOL_TIMEOUT": ""}) == 300.0
    assert g("TIRX_GEMM_TOOL_TIMEOUT", environ={}, default=30.0) == 30.0
    assert g("TIRX_GEMM_SYSTEM_CUDA", environ={}) is False
    assert g("TIRX_GEMM_SYSTEM_CUDA", environ={"TIRX_GEMM_SYSTEM_CUDA": " Yes"}) is True
    assert g("TIRX_GEMM_SYSTEM_CUDA", environ={"TIRX_GEMM_SYSTEM_CUDA": "off"}) is False
    assert g("TIRX_GEMM_NUMSIM_CRATES", environ={}) == "vendored"
    assert g("TIRX_GEMM_CACHE", environ={}) == Path.home() / ".cache" / "tirx-gemm"
    assert g("TIRX_GEMM_CACHE", environ={"TIRX_GEMM_CACHE": str(tmp_path)}) == tmp_path
    assert g("TIRX_GEMM_BUNDLE", environ={}) is None
    with pytest.raises(ValueError, match="TIRX_GEMM_NOPE is not a setting"):
        g("TIRX_GEMM_NOPE")


def test_env_seconds_keeps_its_callers_maximum(monkeypatch):
    monkeypatch.setenv("TIRX_GEMM_KERNEL_TIMEOUT", "7200")
    with pytest.raises(ValueError, match=r"='7200' must be a positive number of seconds, at "
                                         r"most 3600$"):
        settings.env_seconds("TIRX_GEMM_KERNEL_TIMEOUT", 60.0, maximum=3600.0)
    with pytest.raises(ValueError, match="not a setting"):
        settings.env_seconds("TIRX_GEMM_UNDECLARED", 1.0)


def test_an_undeclared_tirx_gemm_variable_is_warned_about_once_with_did_you_mean(monkeypatch):
    """A misspelt pin (TIRX_GEMM_BUNDLE_SHA) would pin nothing: it is named, with the
    setting meant, once per process."""
    monkeypatch.setattr(settings, "_warned_unknown", False)
    monkeypatch.setenv("TIRX_GEMM_BUNDLE_SHA", "ab" * 32)
    with pytest.warns(settings.UnknownSettingWarning,
                      match=r"TIRX_GEMM_BUNDLE_SHA is set but is not a setting.*did you mean "
                            r"TIRX_GEMM_BUNDLE_SHA256\?"):
        settings.get("TIRX_GEMM_BUNDLE")
    lines = []
    assert settings.warn_unknown(report=lines.append) == [] and lines == []  # once


def test_the_cli_warns_about_an_undeclared_variable_in_one_line(monkeypatch, capsys):
    from tirx_gemm import cli
    monkeypatch.setattr(settings, "_warned_unknown", False)
    monkeypatch.setenv("TIRX_GEMM_KERNL_TIMEOUT", "5")
    assert cli.main(["list"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("tirx-gemm: warning: TIRX_GEMM_KERNL_TIMEOUT is set but") \
        and "did you mean TIRX_GEMM_KERNEL_TIMEOUT?" in err and err.count("\n") == 1


def test_a_path_with_an_unknown_tilde_user_is_refused_not_made_a_literal_folder(tmp_path):
    with pytest.raises(ValueError, match=r"^TIRX_GEMM_CACHE='~nosuchuser/c': there is no "
                                         r"user 'nosuchuser'"):
        settings.get("TIRX_GEMM_CACHE", environ={"TIRX_GEMM_CACHE": "~nosuchuser/c"})
    got = settings.get("TIRX_GEMM_CACHE", environ={"TIRX_GEMM_CACHE": "~/c"})
    assert got == Path.home() / "c"  # a quoted ~ is expanded as the shell would


def test_the_table_piped_into_a_reader_that_stops_ends_without_a_traceback():
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "tirx_gemm.settings"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # `| head` that has read what it wants
    assert p.wait(timeout=60) == 0
    assert p.stderr.read() == b""
