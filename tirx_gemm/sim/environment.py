"""NumSim's set-up here: the vendored crates cargo builds from, Rust, the opt level, why it cannot run."""

from __future__ import annotations

import hashlib
import contextlib
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from tirx_gemm import settings

HARNESS_VERSION = "0.1.2.post2"


class SimUnavailable(RuntimeError):
    """The simulator cannot run in this interpreter (Python version, package missing)."""


class SimEnvironmentError(SimUnavailable):
    """A failure of this machine's NumSim set-up (cargo, its crates, the engine build) that
    every case would meet again: the run stops at the first case."""

# --------------------------------------------------------------------------------------
# the crates cargo builds NumSim's engines from: vendored in this checkout
# --------------------------------------------------------------------------------------
# NumSim turns each kernel into Rust and builds its engines with cargo, which needs a few
# crates (pyo3, syn, libc, ...). They are vendored in the repository (vendor/numsim: the
# archive, each crate's source commit in PROVENANCE.tsv), so `tirx-gemm sim` builds offline
# on a fresh clone. Unless the user set CARGO_HOME (or TIRX_GEMM_NUMSIM_CRATES=registry),
# cargo is always pointed at them, online or not: the crates are the ones tirx-harness
# HARNESS_VERSION's lockfile names, so the build is the same everywhere and never waits on
# a registry that cannot be reached.
VENDOR_DIR = Path(__file__).resolve().parents[2] / "vendor" / "numsim"
VENDOR_ARCHIVE = VENDOR_DIR / "cargo-vendor.tgz"
VENDOR_SHA256 = "485e83cd6358548750ef73a955e806b0bd87527094b74ca8a3f0433c247630e4"
CRATES_ENV = "TIRX_GEMM_NUMSIM_CRATES"  # "vendored" (the default) or "registry"
_VENDORED_HOME: dict = {"path": None}


def crates_dir() -> Path:
    """Where the vendored crates are unpacked: the build cache's numsim-crates/<digest>/
    (cargo-home/ with a config.toml that points at cargo-vendor/ beside it)."""
    from tirx_gemm.compile.cache import cache_root
    return cache_root() / "numsim-crates" / VENDOR_SHA256[:16]


def unpack_crates(archive: Path = VENDOR_ARCHIVE, digest: str = VENDOR_SHA256) -> Path:
    """The cargo home of the vendored crates, unpacked once (sha256 checked first, members
    that are not plain files or folders below the target refused, renamed into place whole
    so a concurrent or killed unpack never leaves half a folder in use)."""
    dest = crates_dir() if digest == VENDOR_SHA256 else crates_dir().parent / digest[:16]
    home = dest / "cargo-home"
    if _stamp(dest) == digest:
        return home
    if os.path.lexists(dest):  # no stamp: an unpack cut short, or older: unpack again
        move_aside(dest)
    h = hashlib.sha256()
    with open(archive, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != digest:
        raise SimEnvironmentError(
            f"{archive} does not match its sha256 in tirx_gemm/sim/environment.py (changed or "
            f"truncated): restore it with `git checkout -- {archive.name}` in {archive.parent}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for m in tar.getmembers():
                if not (m.isfile() or m.isdir()) or m.name.startswith("/") \
                        or ".." in Path(m.name).parts:
                    raise SimEnvironmentError(f"{archive} holds {m.name!r}, which is not a "
                                              "plain file or folder below it: refused")
            tar.extractall(tmp, filter="data")
        if not (tmp / "cargo-home" / "config.toml").is_file():
            raise SimEnvironmentError(f"{archive} holds no cargo-home/config.toml")
        (tmp / STAMP).write_text(digest + "\n")  # last: a folder without it is unfinished
        try:
            os.rename(tmp, dest)
        except OSError:
            if _stamp(dest) != digest:  # else a concurrent unpack won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home


STAMP = "unpacked.sha256"  # the archive's digest, written last into an unpacked folder


def _stamp(dest: Path) -> str | None:
    try:
        return (dest / STAMP).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def move_aside(dest: Path) -> None:
    """Rename the unpacked folder ``dest`` out of the way and remove it (another process
    still reading it keeps its renamed copy until it is done); a SimEnvironmentError naming
    the folder to delete when it cannot be moved."""
    aside = dest.parent / f".{dest.name}.damaged-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(dest, aside)
    except OSError as exc:
        raise SimEnvironmentError(
            f"the unpacked NumSim crates in {dest} are damaged and cannot be moved aside "
            f"({exc.strerror or exc}): delete {dest}, then run again") from None
    shutil.rmtree(aside, ignore_errors=True)


_CHECKSUM = re.compile(r"the listed checksum of `([^`]+)` has changed")


def mend_crates(text: str) -> str | None:
    """When cargo's failure ``text`` is a vendored crate whose files no longer match their
    checksums (the unpacked folder edited or damaged): move that folder aside and unpack
    the crates again; the line saying so (or naming the folder to delete). Else None."""
    m = _CHECKSUM.search(text)
    if not m or not vendored_home_in_use():
        return None
    dest = Path(_VENDORED_HOME["path"]).parent
    try:
        move_aside(dest)
        unpack_crates()
    except (SimEnvironmentError, OSError) as exc:
        return (f"cargo found a vendored crate's file changed ({m.group(1)}), and the crates "
                f"could not be unpacked again ({exc}): delete {dest}, then run again")
    return (f"cargo found a vendored crate's file changed ({m.group(1)}): the crates in "
            f"{dest} were damaged, so they were moved aside and unpacked again; run again")


def use_vendored_crates(environ=None) -> str:
    """Point cargo (``CARGO_HOME`` in ``environ``, default os.environ) at the vendored
    crates unless the user chose otherwise; one line saying which crates cargo uses."""
    env = os.environ if environ is None else environ
    mine = _VENDORED_HOME["path"]
    if env.get("CARGO_HOME") and env.get("CARGO_HOME") != mine:
        return f"cargo uses your CARGO_HOME={env['CARGO_HOME']} (its config and registry)"
    mode = settings.get(CRATES_ENV, environ=env)  # 'vendored' (default) or 'registry'
    if mode == "registry":
        return f"cargo uses the crates registry ({CRATES_ENV}=registry)"
    version = _harness_version()
    if version is None:  # nothing here runs cargo
        return "tirx-harness is not installed: no engine to build"
    if version != HARNESS_VERSION:
        return (f"cargo uses the crates registry: vendor/numsim holds the crates of "
                f"tirx-harness {HARNESS_VERSION}, this is {version}")
    if not VENDOR_ARCHIVE.is_file():
        return (f"cargo uses the crates registry: there is no {VENDOR_ARCHIVE} (tirx-gemm "
                "installed from a wheel, not a checkout)")
    home = unpack_crates()
    env["CARGO_HOME"] = _VENDORED_HOME["path"] = str(home)
    return f"cargo builds offline from the crates vendored in vendor/numsim (unpacked in {home.parent})"


def vendored_home_in_use(environ=None) -> bool:
    env = os.environ if environ is None else environ
    return bool(_VENDORED_HOME["path"]) and env.get("CARGO_HOME") == _VENDORED_HOME["path"]


def _rust_tool_missing() -> str | None:
    """Why NumSim would not find cargo and rustc (as it looks: $NUMSIM_CARGO, ~/.cargo/bin,
    PATH), or None."""
    missing = []
    for name in ("cargo", "rustc"):
        explicit = os.environ.get(f"NUMSIM_{name.upper()}")
        home = Path.home() / ".cargo" / "bin" / name
        cand = explicit or (str(home) if home.is_file() else name)
        if shutil.which(str(Path(cand).expanduser())) is None:
            missing.append(name)
    if not missing:
        return None
    verb = "are" if len(missing) > 1 else "is"
    return (f"NumSim builds its engines with Rust, and {' and '.join(missing)} {verb} not found "
            "($NUMSIM_CARGO/$NUMSIM_RUSTC, ~/.cargo/bin, PATH): install Rust (rustup.rs or "
            "your package manager's cargo and rustc), then run again")


_NETWORK = re.compile(r"Could not resolve host|failed to download|failed to query replaced "
                      r"source|network failure|Couldn't resolve|spurious network error|"
                      r"failed to get `[^`]+` as a dependency", re.I)


def environment_failure(exc: BaseException) -> str | None:
    """One line naming the cause when ``exc`` is a failure of this machine's NumSim set-up
    that every case would hit again (no cargo, a failed engine build, an unusable cache),
    else None (a failure of this kernel: the row records it)."""
    text = str(exc)
    if isinstance(exc, FileNotFoundError) and "NumSim Rust tool" in text:
        return _rust_tool_missing() or text.splitlines()[0]
    if type(exc).__name__ != "NumSimBuildError":
        return None
    if "compile cache" in text and ("owned" in text or "writable" in text):
        return f"{text.splitlines()[0]} (NUMSIM_CACHE_DIR / NUMSIM_BUILD_CACHE_DIR move it)"
    if not text.startswith("NumSim Rust dependency build failed"):
        return None
    lines = [ln.strip() for ln in text.splitlines()[1:] if ln.strip()]
    net = next((ln for ln in lines if _NETWORK.search(ln)), None)
    host = next((ln for ln in lines if "resolve host" in ln.lower()), None)
    mended = mend_crates(text)
    if mended:
        return mended
    if net or host:
        cause = f"cargo could not fetch its crates ({(host or net)[:200]})"
        if vendored_home_in_use():
            return (f"{cause} although CARGO_HOME points at the vendored crates: "
                    f"vendor/numsim lacks a crate this tirx-harness needs")
        return (f"{cause}: unset CARGO_HOME and {CRATES_ENV} so that tirx-gemm sim builds "
                "from the crates vendored in vendor/numsim, or give cargo a reachable registry")
    first = next((ln for ln in lines if ln.startswith("error")), lines[0] if lines else "")
    return f"NumSim's engine build (cargo) failed: {first[:300]}"


def unavailable_reason() -> str | None:
    """Why NumSim cannot run here, or None when it can."""
    if sys.version_info < (3, 12):
        return (f"NumSim needs Python >= 3.12 (this is {platform.python_version()}): make a "
                "3.12 venv with `\"$(scripts/find_python312.sh)\" scripts/setup_venv.py "
                ".simvenv --extra sim` (the README's NumSim command), then run "
                "`.simvenv/bin/tirx-gemm sim ...`")
    try:
        import tirx_harness.numsim  # noqa: F401
    except ImportError as e:
        return (f"tirx-harness is not installed ({e}): `python scripts/setup_venv.py "
                f"\"$VIRTUAL_ENV\" --extra sim` or `pip install -e \".[sim]\"`")
    return _rust_tool_missing()


def _harness_version() -> str | None:
    import importlib.metadata
    try:
        return importlib.metadata.version("tirx-harness")
    except importlib.metadata.PackageNotFoundError:
        return None


_CRATES: dict = {"note": None}

# NumSim turns each kernel into Rust and compiles it three times per case (numbers,
# synccheck, racecheck); at rustc's -O3 that compile is most of a case's time. Unless the
# user set NUMSIM_GENERATED_OPT_LEVEL (0, 1 or 3), the gate compiles each case's kernels at
# the level that costs it the least CPU: -O0 (compiled fastest), but -O1 for the steps
# whose simulation outweighs their compile (v1-v3: thread copies, every thread simulated).
# The same model and checks at any level. CPU seconds per case (this project's 2-core
# machine, engines built, each kernel's first run, all three checks), -O0 against -O1:
# v3 256x384x192 131 / 75; v5 136x264x392 28 / 68; v7 384x256x384 47 / 96; v9 512x768x384
# 53 / 98; v11 256x256x704 SPLIT_K=3 62 / 116. The engines' dependencies are the same
# below -O3. The level is set around each case (opt_level_for) and put back after, so a
# worker process never mistakes the gate's choice for the user's.
OPT_LEVEL_ENV = "NUMSIM_GENERATED_OPT_LEVEL"
GATE_OPT_LEVEL = "0"
SIM_BOUND_STEPS = ("v1", "v2", "v3")  # compiled at -O1: their simulation dominates
SIM_BOUND_OPT_LEVEL = "1"


def gate_opt_level(step_id: str) -> str:
    """The gate's rustc level for a step's kernels (without the user's choice)."""
    return SIM_BOUND_OPT_LEVEL if step_id in SIM_BOUND_STEPS else GATE_OPT_LEVEL


@contextlib.contextmanager
def opt_level_for(step_id: str, environ=None):
    """Within: NUMSIM_GENERATED_OPT_LEVEL is the user's, else :func:`gate_opt_level`'s
    (removed again on the way out). Yields the level."""
    env = os.environ if environ is None else environ
    if env.get(OPT_LEVEL_ENV):
        yield env[OPT_LEVEL_ENV]
        return
    env[OPT_LEVEL_ENV] = gate_opt_level(step_id)
    try:
        yield env[OPT_LEVEL_ENV]
    finally:
        env.pop(OPT_LEVEL_ENV, None)


def use_gate_opt_level(environ=None) -> str:
    """One line saying at which rustc level the gate compiles the kernels."""
    env = os.environ if environ is None else environ
    if env.get(OPT_LEVEL_ENV):
        return f"kernels compiled at rustc -O{env[OPT_LEVEL_ENV]} ({OPT_LEVEL_ENV}, yours)"
    return (f"kernels compiled at rustc -O{GATE_OPT_LEVEL}, -O{SIM_BOUND_OPT_LEVEL} for "
            f"{', '.join(SIM_BOUND_STEPS)} (the gate's default, the least CPU per case; "
            f"{OPT_LEVEL_ENV} overrides)")


def crates_note() -> str:
    """use_vendored_crates() and use_gate_opt_level() once per process: the line saying
    which crates cargo uses and at which level NumSim compiles the kernels."""
    if _CRATES["note"] is None:
        _CRATES["note"] = f"{use_vendored_crates()}; {use_gate_opt_level()}"
    return _CRATES["note"]
