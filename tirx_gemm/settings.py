"""The environment settings, once: every ``TIRX_GEMM_*`` variable with its default, limits
and meaning (``SETTINGS``), and the one way to read them (``get``). Standard library only
(build side and run side); imports nothing of the package but ``spec``.

A reader asks ``settings.get("TIRX_GEMM_KERNEL_TIMEOUT")``: the value parsed and checked
against the limits, the default when the variable is unset or empty, or a one-line
ValueError naming the variable and what it allows. CONTRIBUTING.md's table of the settings
is rendered from ``SETTINGS`` (``python -m tirx_gemm.settings --write``;
tests/test_settings.py checks it and that no module reads an undeclared name).
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from tirx_gemm import spec

__all__ = ["MAX_SECONDS", "SETTINGS", "Setting", "UnknownSettingWarning", "env_seconds", "get",
           "markdown_table", "warn_unknown"]

# the longest limit any wait of this project accepts from the environment: one day. A limit
# is there to end a hang, so "never" (inf, or a number so large it overflows a timer) is
# refused rather than silently switching the limit off
MAX_SECONDS = 86400.0

_ON = ("1", "yes", "true", "on")
_OFF = ("0", "no", "false", "off")


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str          # "seconds" | "path" | "flag" | "choice" | "sha256" | "revision"
    default: object    # the value when unset (None: none; a path may start with ~)
    meaning: str       # one line
    maximum: float | None = None     # seconds: the largest value accepted
    choices: tuple[str, ...] = ()    # choice: the values accepted (the first is the default)
    scope: str = "package"           # "package": read by tirx_gemm/; "tests": by tests/ only

    @property
    def limits(self) -> str:
        """What a value may be, in words (the error message and the table say it)."""
        if self.kind == "seconds":
            return f"a positive number of seconds, at most {self.maximum:g}"
        if self.kind == "flag":
            return f"{'/'.join(_ON)} (on) or {'/'.join(_OFF)} (off)"
        if self.kind == "choice":
            return " or ".join(repr(c) for c in self.choices)
        if self.kind == "sha256":
            return "64 hex digits (a manifest's sha256)"
        if self.kind == "revision":
            return "a git commit (7 to 40 hex digits), optionally followed by -dirty"
        return "a path"

    @property
    def default_text(self) -> str:
        if self.default is None:
            return "unset"
        if self.kind == "flag":
            return "on" if self.default else "off"
        if self.kind == "seconds":
            return f"{self.default:g}"
        return str(self.default)


SETTINGS: tuple[Setting, ...] = (
    Setting("TIRX_GEMM_KERNEL_TIMEOUT", "seconds", 60.0,
            "seconds the host waits for the GPU (each wait) before it reports a hang and "
            "exits 3; the way to widen the hang guard, never to switch it off",
            maximum=3600.0),
    Setting("TIRX_GEMM_TOOL_TIMEOUT", "seconds", 300.0,
            "seconds an external tool (nvcc, cuobjdump, TVM's lowering in a worker) may "
            "run; a version probe waits 30 unless this is set", maximum=MAX_SECONDS),
    Setting("TIRX_GEMM_CACHE", "path", "~/.cache/tirx-gemm",
            "the build cache (builds/, logs/, the libcuda stub, NumSim's unpacked crates)"),
    Setting("TIRX_GEMM_BUNDLE", "path", None,
            "a bundle folder (`tirx-gemm export`) that matmul, the notebooks and the "
            "benchmark scripts take kernels from instead of building them"),
    Setting("TIRX_GEMM_BUNDLE_SHA256", "sha256", None,
            "the manifest digest a bundle must have (as --expect-sha256): any other bundle "
            "is refused before it is loaded"),
    Setting("TIRX_GEMM_SYSTEM_CUDA", "flag", False,
            "compile with a system CUDA (CUDA_HOME, CUDA_PATH or PATH) instead of the "
            "nvidia-* wheels"),
    Setting("TIRX_GEMM_TVM_RUNTIME_DIR", "path", None,
            "the folder of TVM's runtime libraries on a GPU host without TVM (else "
            "runtime/ beside a bundle, then the installed TVM)"),
    Setting("TIRX_GEMM_RESULTS", "path", None,
            f"where the notebooks read records from (unset: the checkout's "
            f"{spec.RESULTS_DIR}/)"),
    Setting("TIRX_GEMM_NUMSIM_CRATES", "choice", "vendored",
            "the crates cargo builds NumSim from: vendor/numsim's, offline (vendored), or "
            "your cargo configuration and crates.io (registry)",
            choices=("vendored", "registry")),
    Setting("TIRX_GEMM_TVM_FRAMES", "choice", "walk",
            "how TVM's script parser finds its calling frames: a walk along f_back, same "
            "result in about half the parse time (walk; TVM 0.27.0.post1 only, "
            "tirx_gemm/tvm_frames.py), or TVM's own inspect calls (inspect)",
            choices=("walk", "inspect")),
    Setting("TIRX_GEMM_DEBUG", "flag", False,
            "the CLI prints the traceback under its one-line error"),
    Setting("TIRX_GEMM_CHECK", "flag", False,
            "checks needing a device sync: fp8 scales, grouped offs and counts (not in a capture)"),
    Setting("TIRX_GEMM_GIT_SHA", "revision", None,
            "the revision records name as their code (git_sha) instead of the checkout's "
            "git state: for a copy whose .git is not its files' (a GPU host's copy)"),
    # read by the test suite only (tests/conftest.py, tests/test_site.py)
    Setting("TIRX_GEMM_TEST_CACHE", "path", "build/test-cache",
            "the tests' build cache, kept across sessions", scope="tests"),
    Setting("TIRX_GEMM_GATE_FOLLOWS", "flag", False,
            "set by .ci/run: the simulation gate runs after the tests in the same CI run, so "
            "the tests leave building every simulation case to it", scope="tests"),
    Setting("TIRX_GEMM_TEST_FRESH", "flag", False,
            "the tests build everything from scratch (a new cache for the session)",
            scope="tests"),
    Setting("TIRX_GEMM_SITE", "path", "build/site",
            "the built website folder the site tests serve and check",
            scope="tests"),
    Setting("TIRX_GEMM_SITE_REQUIRED", "flag", False,
            "the site tests fail instead of skipping what cannot run here (CI)",
            scope="tests"),
    Setting("TIRX_GEMM_CHROMIUM", "path", None,
            "the headless browser the site tests render pages with (unset: chromium "
            "looked up in the usual places)", scope="tests"),
)
TABLE = {s.name: s for s in SETTINGS}
_UNSET = object()


def setting(name: str) -> Setting:
    try:
        return TABLE[name]
    except KeyError:
        raise ValueError(f"{name} is not a setting of tirx-gemm (tirx_gemm/settings.py "
                         f"declares {', '.join(TABLE)})") from None


def _refuse(s: Setting, text: str) -> ValueError:
    return ValueError(f"{s.name}={text!r} must be {s.limits}")


class UnknownSettingWarning(UserWarning):
    """A ``TIRX_GEMM_*`` variable is set that no setting declares (a typo of one, most
    likely: ``TIRX_GEMM_BUNDLE_SHA`` pins nothing)."""


_warned_unknown = False


def unknown_names(environ=None) -> list[str]:
    """The ``TIRX_GEMM_*`` names set in ``environ`` (default: os.environ) that SETTINGS does
    not declare, sorted."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith("TIRX_GEMM_") and k not in TABLE)


def warn_unknown(environ=None, report=None) -> list[str]:
    """Warn, once per process, about every ``TIRX_GEMM_*`` variable set that SETTINGS does
    not declare, with the closest declared name: a misspelt setting is otherwise ignored
    without a word (a misspelt digest pin would pin nothing). Returns the names warned
    about (empty after the first call). ``report`` (a callable taking the line) instead of
    a UnknownSettingWarning: the CLI's ``tirx-gemm: warning: ...``."""
    global _warned_unknown
    if _warned_unknown:
        return []
    _warned_unknown = True
    names = unknown_names(environ)
    for name in names:
        near = difflib.get_close_matches(name, list(TABLE), n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]}?)" if near else ""
        line = (f"{name} is set but is not a setting of tirx-gemm, so it is ignored{hint}; "
                "`python -m tirx_gemm.settings` lists the settings")
        if report is not None:
            report(line)
        else:
            warnings.warn(line, UnknownSettingWarning, stacklevel=3)
    return names


def parse(s: Setting, text: str, maximum: float | None = None):
    """``text`` (set, non-empty) as ``s``'s value, or the one-line ValueError."""
    if s.kind == "seconds":
        top = s.maximum if maximum is None else maximum
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= top):
            raise ValueError(f"{s.name}={text!r} must be a positive number of seconds, at "
                             f"most {top:g}")
        return value
    if s.kind == "flag":
        word = text.strip().lower()
        if word in _ON or word in _OFF:
            return word in _ON
        raise _refuse(s, text)
    if s.kind == "choice":
        word = text.strip().lower()
        if word in s.choices:
            return word
        raise _refuse(s, text)
    if s.kind == "sha256":
        if re.fullmatch(r"[0-9a-fA-F]{64}", text.strip()):
            return text.strip().lower()
        raise _refuse(s, text)
    if s.kind == "revision":
        if re.fullmatch(r"[0-9a-fA-F]{7,40}(-dirty)?", text.strip()):
            return text.strip()
        raise _refuse(s, text)
    return _path(s, text)


def _path(s: Setting, text: str) -> Path:
    """``text`` as a path, ``~`` and ``~user`` expanded the way a shell would; a ``~user``
    that names no user is refused (it would become a folder literally named ``~user``)."""
    path = Path(os.path.expanduser(text))
    if str(path).startswith("~"):
        user = text[1:].split("/", 1)[0]
        raise ValueError(f"{s.name}={text!r}: there is no user {user!r} for ~{user} to "
                         f"expand to; give the folder as a full path")
    return path


def get(name: str, environ=None, default=_UNSET):
    """The value of setting ``name`` from ``environ`` (default: os.environ): parsed and
    checked against its limits; its default (or ``default``, where a caller has its own:
    a version probe's shorter limit) when unset or empty."""
    s = setting(name)
    if environ is None:
        warn_unknown()
    text = (os.environ if environ is None else environ).get(name)
    if not text:
        value = s.default if default is _UNSET else default
        if s.kind == "path" and isinstance(value, str):
            return Path(value).expanduser()
        return value
    return parse(s, text)


def env_seconds(name: str, default: float, maximum: float = MAX_SECONDS) -> float:
    """Seconds from ``$name`` if set, else ``default``. A value that is not a finite number
    of seconds in (0, ``maximum``] (text, 0, a negative number, nan, inf, 1e400) raises a
    one-line ValueError naming the variable and the range. ``name`` must be declared in
    SETTINGS (a reader that keeps its own default and maximum: run/launcher.py)."""
    s = setting(name)
    warn_unknown()
    text = os.environ.get(name)
    return parse(s, text, maximum) if text else default


def markdown_table() -> str:
    """The settings as the Markdown table CONTRIBUTING.md holds between its markers."""
    rows = ["| variable | default | allowed | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        meaning = s.meaning + (" (tests only)" if s.scope == "tests" else "")
        rows.append(f"| `{s.name}` | {s.default_text} | {s.limits} | {meaning} |")
    return "\n".join(rows)


BEGIN = "<!-- settings: generated by `python -m tirx_gemm.settings --write`; do not edit -->"
END = "<!-- settings: end -->"


def render_into(text: str) -> str:
    """``text`` (CONTRIBUTING.md) with the block between BEGIN and END made from SETTINGS."""
    i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:i] + "\n" + markdown_table() + "\n" + text[j:]


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="print the settings table, or --write it into "
                                             "CONTRIBUTING.md")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    if not args.write:
        try:
            print(markdown_table(), flush=True)
        except BrokenPipeError:  # `| head` stopped reading: what it shows is all it wants
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    path = Path(__file__).resolve().parent.parent / "CONTRIBUTING.md"
    path.write_text(render_into(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
