"""Run the sm_100a steps on a CPU model of Blackwell: tirx-harness NumSim + its checkers.

There is no Blackwell GPU here, and compiling proves nothing about synchronization. NumSim
(PyPI ``tirx-harness``) executes a TIRx PrimFunc on a numerical model of sm_100a (tcgen05
MMA and TMEM, TMA, mbarrier phases and tx-counts) and two checkers run the same execution:
synccheck (deadlocks, barrier misuse, phase overtaking) and racecheck (races on
global/shared/TMEM, missing proxy fences).

For each simulation case of a step (``Step.sim_cases`` in the registry: shapes chosen to
exercise its protocol) this module builds the PrimFunc, runs it on random inputs and on
small-integer inputs of the case's dtype (float16, or bfloat16 where the case's kwargs say
so) with D poisoned with NaN and the step's workspace operands (if any) zero-filled,
compares with the fp32 numpy reference under the runner's rules
(:mod:`tirx_gemm.numerics`), then runs synccheck and racecheck. A case with epilogue
keywords (BIAS, ACT, OUT_DTYPE, SWIGLU: :mod:`tirx_gemm.epilogue`) also gets its ``bias``
operand, D in its out dtype and SwiGLU's interleaved gate/up weight, and is compared with
``epilogue.reference_np`` under ``epilogue.tolerance``. An fp8 case (``Step.fp8``: v13)
gets one input set instead: randn quantized to e4m3 with its SCALE mode's fp32 scales
(``numerics.make_fp8_inputs_np``), A and B passed as their uint8 bytes, ``SA`` and ``SB``
after D, compared with the fp32 product of the dequantized inputs under
``numerics.compare_fp8_np`` (``input_kinds``, ``case_inputs_np``, ``check_output_np``).
A row passes only if every input set is correct and both checkers say ``clean``; a ``review``
finding passes only where the registry accepts its kind for that step with a written
reason; ``incomplete`` and ``error`` always fail.

What a pass means: the kernel computes the right numbers on the model and its barrier and
proxy protocol is free of the hazards the checkers look for, for that execution. It says
nothing about speed (the model has no timing) and it is a model, not silicon.

Needs Python >= 3.12 and ``tirx-harness`` (``pip install -e ".[sim]"``); no torch. The first
use builds the engines with cargo (minutes; cached under ``NUMSIM_BUILD_CACHE_DIR``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import io
import json
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from tirx_gemm import epilogue as E
from tirx_gemm import numerics, registry, settings
from tirx_gemm.gitinfo import git_sha
from tirx_gemm.progress import Progress
from tirx_gemm.registry import Step
from tirx_gemm.stepshape import StepShape

ARCH = "sm_100a"
CHECKS = ("numsim", "sync", "race")
DEVICE = "NumSim, CPU model of sm_100a"
HARNESS_VERSION = "0.1.2.post2"
RECORDS_FILE = "numsim-cpu.jsonl"  # under results/sim/


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
    if (home / "config.toml").is_file():
        return home
    h = hashlib.sha256()
    with open(archive, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != digest:
        raise SimEnvironmentError(
            f"{archive} does not match its sha256 in tirx_gemm/sim/gate.py (changed or "
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
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (home / "config.toml").is_file():  # else a concurrent unpack won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return home


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


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SimCase:
    step: Step
    M: int
    N: int
    K: int
    kwargs: tuple[tuple[str, object], ...] = ()
    mutant: str | None = None  # a deliberately broken variant (tirx_gemm.mutants)

    def build(self):
        extra = {"mutant": self.mutant} if self.mutant else {}
        return self.step.build_primfunc(self.M, self.N, self.K, **dict(self.kwargs), **extra)

    @property
    def shape(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"

    @property
    def dtype(self) -> str:
        return self.step.dtype(dict(self.kwargs))

    @property
    def kwargs_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.kwargs) or "-"

    @property
    def label(self) -> str:
        kw = f" {self.kwargs_text}" if self.kwargs else ""
        mut = f" [mutant {self.mutant}]" if self.mutant else ""
        return f"{self.step.id}@{self.step.arch} {self.shape}{kw}{mut}"


def _with_dtype(kwargs, dtype: str | None) -> tuple:
    """Case keywords in ``dtype`` (None: as given): the dtype keyword replaced, and written
    only for bfloat16 (float16 is every builder's default)."""
    kw = tuple(kwargs)
    if dtype is None:
        return kw
    numerics.check_dtype(dtype)
    kw = tuple((k, v) for k, v in kw if k != "dtype")
    return kw + ((("dtype", dtype),) if dtype != "float16" else ())


def cases_for(step: Step, mnk: tuple[int, int, int] | None = None,
              dtype: str | None = None) -> list[SimCase]:
    """The registry's simulation cases of ``step`` (or one case at ``mnk``). ``dtype`` None:
    the cases as the registry lists them (float16, and one bfloat16 case per step); a dtype:
    every case in that dtype (duplicates dropped), or the ``mnk`` case in it."""
    if step.arch != ARCH:
        raise ValueError(f"{step.key}: NumSim models sm_100a only (run sm_90a steps on a GPU)")
    if mnk is not None:
        return [SimCase(step, *mnk, _with_dtype((), dtype))]
    if not step.sim_cases:
        raise ValueError(f"{step.key} has no sim_cases in the registry")
    cases = [SimCase(step, *shape, _with_dtype(kwargs, dtype)) for shape, kwargs in step.sim_cases]
    return list(dict.fromkeys(cases))


def mutant_case(name: str, mnk=None, dtype: str | None = None) -> SimCase:
    """The case a mutant is simulated at: ``mnk``, else the mutant's own case, else the
    first simulation case of its step; in ``dtype`` when given."""
    from tirx_gemm import mutants
    m = mutants.get(name)
    if m.arch != ARCH:
        raise ValueError(f"mutant {name} breaks {m.step}@{m.arch}: NumSim models sm_100a only "
                         "(that one is for the GPU watchdog)")
    step = registry.get(m.step, ARCH)
    if mnk is not None:
        return SimCase(step, *mnk, _with_dtype((), dtype), mutant=name)
    shape, kwargs = m.case or step.sim_cases[0]
    return SimCase(step, *shape, _with_dtype(kwargs, dtype), mutant=name)


# --------------------------------------------------------------------------------------
# one case
# --------------------------------------------------------------------------------------
@dataclasses.dataclass
class SimRow(StepShape):
    """One simulated case's verdicts (stepshape.StepShape: step, arch, M, N, K first)."""
    kwargs: dict
    mutant: str | None = None
    numsim: str = "skipped"   # "correct" | "WRONG" | "failed" | "skipped"
    rel_err: float | None = None
    sync: str = "skipped"     # a checker verdict, "accepted review", or "skipped"
    race: str = "skipped"
    seconds: float = 0.0
    ok: bool = False
    problems: list = dataclasses.field(default_factory=list)  # one line each
    checks: tuple = CHECKS  # the checks this case ran (gate.checks_for)

    def to_record(self, seed: int, checks: tuple[str, ...]) -> dict:
        import tvm  # the version only; tvm is already imported to build the kernel
        return {
            "kind": "numsim", "step": self.step, "arch": self.arch, "M": self.M, "N": self.N,
            "K": self.K, "kwargs": self.kwargs, "dtype": self.kwargs.get("dtype", "float16"),
            "device": DEVICE, "numsim": self.numsim,
            "rel_err": self.rel_err if self.rel_err is not None and np.isfinite(self.rel_err)
            else None, "synccheck": self.sync, "racecheck": self.race,
            "checks": list(checks), "verified": self.ok, "seed": seed,
            "seconds": round(self.seconds, 1), "tvm_version": tvm.__version__,
            "tirx_harness_version": _harness_version(), "git_sha": git_sha(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }


def _harness_version() -> str | None:
    import importlib.metadata
    try:
        return importlib.metadata.version("tirx-harness")
    except importlib.metadata.PackageNotFoundError:
        return None


def _checker_verdict(name: str, report, step: Step, row: SimRow, log) -> str:
    """Verdict text for the table; appends a problem line unless the verdict passes."""
    text = report.format()
    log(f"--- {name} ({row.step}@{row.arch} {row.M}x{row.N}x{row.K} {row.kwargs}) ---\n{text}\n")
    verdict = report.verdict
    if verdict == "clean":
        return "clean"
    findings = list(report.findings)
    if verdict == "review":
        accepted = dict(step.sim_accept)
        open_ = [f for f in findings if f.status == "review" and f.kind not in accepted]
        if not open_ and all(f.status in ("review", "info") for f in findings):
            for f in findings:
                if f.kind in accepted:
                    log(f"accepted review {f.kind}: {accepted[f.kind]}\n")
            return "accepted review"
    worst = [f for f in findings if f.status == verdict] or findings
    first = f"{worst[0].kind}: {str(worst[0].message).splitlines()[0]}" if worst else ""
    row.problems.append(f"{name} {verdict}" + (f" ({first})" if first else ""))
    return verdict


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0][:300] if text else type(e).__name__
    if type(e).__name__ == "NumSimBuildError":  # the engines are Rust crates built by cargo
        line += " (the full error is in the log)"
    return line


def workspace_specs(case: SimCase) -> tuple:
    """((name, shape, dtype), ...) of the case's workspace operands; () for most steps."""
    return tuple((str(n), tuple(int(x) for x in shape), str(dt)) for n, shape, dt in
                 case.step.workspace_specs(case.M, case.N, case.K, dict(case.kwargs)))


def _np_workspace_dtype(dt: str):
    return numerics.np_dtype(dt) if dt in numerics.DTYPES else np.dtype(dt)


def make_workspace_np(specs, poison: bool = False) -> dict:
    """{name: numpy array} for workspace ``specs``: zero-filled; with ``poison`` the
    floating-point (scratch) buffers are NaN instead, so a kernel that reads an element it
    did not write first fails (the contract: registry.Step.workspace)."""
    out = {}
    for name, shape, dt in specs:
        a = np.zeros(shape, dtype=_np_workspace_dtype(dt))
        if poison and (a.dtype.kind == "f" or a.dtype.name in numerics.DTYPES):
            a[...] = np.nan
        out[name] = a
    return out


def workspace_dirt_np(specs, outputs) -> str:
    """"" when every integer workspace buffer (tile counters) the simulator handed back is
    all zeros, else what is left in which (the contract: the kernel leaves its counters
    zero-filled; floating-point buffers are scratch)."""
    dirty = []
    for name, _, dt in specs:
        a = _np_workspace_dtype(dt)
        if name in outputs and a.kind in "iub":
            n = int(np.count_nonzero(np.asarray(outputs[name])))
            if n:
                dirty.append(f"{name!r} has {n} nonzero element(s)")
    if not dirty:
        return ""
    return "workspace " + ", ".join(dirty) + " after the kernel returned (it must leave its "\
        "counters zero-filled)"


# A PrimFunc attribute (v10, Cluster Launch Control): how many clusters a GPU would keep
# resident. The whole launch (every cluster resident) takes CLC's fail path only; the
# cancel path needs the others pending, i.e. a run of the first `resident` clusters.
RESIDENT_ATTR = "tirx_gemm.resident_clusters"


def _cancel_path_ok(engine, module, resident: int, operands, inputs, dtype, case, row,
                    log) -> bool:
    """NumSim on the first ``resident`` clusters only: the pending ones are the clusters
    their try_cancel requests take over, so the resident ones must compute every tile.
    Numbers only: the checkers certify no subset run (they answer "incomplete")."""
    from tirx_harness.numsim.api import ExecutionSubset
    A, B, D = inputs
    res = engine.run(module, operands(A, B, D),
                     subset=ExecutionSubset(cluster_ids=tuple(range(resident))))
    cmp = numerics.compare_np(np.asarray(res.outputs["D"]), numerics.reference_np(A, B),
                              dtype=dtype)
    log(f"--- numsim cancel path: {resident} resident clusters, random inputs "
        f"({case.label}) ---\n{cmp.summary()}\ndiagnostics: {res.diagnostics}\n")
    if not cmp.ok:
        row.problems.append(f"numsim cancel path ({resident} resident clusters): "
                            f"{cmp.summary()}")
    if res.verdict != "clean":
        row.problems.append(f"numsim cancel path ({resident} resident clusters) diagnostics "
                            f"{res.verdict}: {res.diagnostics}")
    return cmp.ok and res.verdict == "clean"


_CRATES: dict = {"note": None}

# NumSim turns each kernel into Rust and compiles it three times per case (numbers,
# synccheck, racecheck); at rustc's -O3 that compile is most of a case's time. The gate
# compiles them at -O0 unless the user set NUMSIM_GENERATED_OPT_LEVEL (0, 1 or 3): the same
# model and checks, compiled faster, the gate's small shapes simulated a little slower
# (measured on this project's 2-core CPU machine, engines built, each kernel's first run:
# v7 at 384x256x320, all three checks, 52 s at -O1 against 24 s at -O0 (simulation 3.0 s
# against 5.0 s of that); v9 at 512x256x192 109 s at -O1 against 267 s at -O3, other work
# beside it). The engines' dependencies do not depend on the level below 3.
OPT_LEVEL_ENV = "NUMSIM_GENERATED_OPT_LEVEL"
GATE_OPT_LEVEL = "0"


def use_gate_opt_level(environ=None) -> str:
    """Set NumSim's generated-code opt level to GATE_OPT_LEVEL unless the user chose one;
    one line saying which."""
    env = os.environ if environ is None else environ
    if env.get(OPT_LEVEL_ENV):
        return f"kernels compiled at rustc -O{env[OPT_LEVEL_ENV]} ({OPT_LEVEL_ENV}, yours)"
    env[OPT_LEVEL_ENV] = GATE_OPT_LEVEL
    return f"kernels compiled at rustc -O{GATE_OPT_LEVEL} (the gate's default; {OPT_LEVEL_ENV} overrides)"


def crates_note() -> str:
    """use_vendored_crates() and use_gate_opt_level() once per process: the line saying
    which crates cargo uses and at which level NumSim compiles the kernels."""
    if _CRATES["note"] is None:
        _CRATES["note"] = f"{use_vendored_crates()}; {use_gate_opt_level()}"
    return _CRATES["note"]


def case_inputs_np(case: SimCase, kind: str, seed: int):
    """(A, B, D, extra) of one case for input ``kind``: as numerics.make_inputs_np, and with
    the case's epilogue keywords (tirx_gemm.epilogue): B is the fused gate/up weight (2N, K)
    under SWIGLU (its gate and up halves interleaved by epilogue.interleave_gate_up_np),
    D (all NaN) has the out dtype, and ``extra`` holds the ``bias`` operand (N,) of the
    BIAS dtype (the kernel takes it by name after D)."""
    kw = dict(case.kwargs)
    if case.step.fp8 and kw.get("SCALE") == "mx":  # v13 MXFP8: UE8M0 SFs, blocked order
        Aq, Bq, sfa, sfb, D = numerics.make_mx_inputs_np(case.M, case.N, case.K, seed,
                                                         case.dtype)
        return (numerics.fp8_bytes_np(Aq), numerics.fp8_bytes_np(Bq), D,
                {"SFA": numerics.mx_block_sf_np(sfa, case.K),
                 "SFB": numerics.mx_block_sf_np(sfb, case.K)})
    if case.step.fp8:  # v13: e4m3 A, B as their uint8 bytes; fp32 scales SA, SB after D
        Aq, Bq, sa, sb, D = numerics.make_fp8_inputs_np(
            case.M, case.N, case.K, kw.get("SCALE", "tensor"), seed, case.dtype)
        return (numerics.fp8_bytes_np(Aq), numerics.fp8_bytes_np(Bq), D,
                {"SA": sa, "SB": sb})
    epi = E.validate(kw)
    dtype = case.dtype
    if epi["SWIGLU"]:
        A, B2, _ = numerics.make_inputs_np(case.M, 2 * case.N, case.K, kind, seed, dtype)
        B = E.interleave_gate_up_np(B2[:case.N], B2[case.N:])
    else:
        A, B, _ = numerics.make_inputs_np(case.M, case.N, case.K, kind, seed, dtype)
    od = E.out_dtype(epi, dtype)
    D = np.full((case.M, case.N), np.nan,
                dtype=np.float32 if od == "float32" else numerics.np_dtype(od))
    extra = {"bias": E.make_bias_np(case.N, epi["BIAS"], seed)} if epi["BIAS"] else {}
    return A, B, D, extra


def input_kinds(case: SimCase) -> tuple[str, ...]:
    """The input kinds a case runs: numerics.INPUT_KINDS (random, small integers); an fp8
    case (registry.Step.fp8) runs one set, randn quantized to e4m3 with its scales
    (numerics.make_fp8_inputs_np): the exact small-integer check has no fp8 twin here."""
    return ("random",) if case.step.fp8 else numerics.INPUT_KINDS


def check_output_np(case: SimCase, out, A, B, extra: dict, kind: str):
    """The compare of one case's output: a plain case by numerics' rules (exact for the
    small-integer inputs); an epilogue case against epilogue.reference_np under
    epilogue.tolerance (its functions are not exact even on integer inputs)."""
    kw = dict(case.kwargs)
    if case.step.fp8 and kw.get("SCALE") == "mx":  # 2**(sf - 127) per 32 of K, fp32 sums
        ref = numerics.reference_mx_np(
            numerics.fp8_from_bytes_np(A), numerics.fp8_from_bytes_np(B),
            numerics.mx_unblock_sf_np(extra["SFA"], case.M, case.K),
            numerics.mx_unblock_sf_np(extra["SFB"], case.N, case.K))
        return numerics.compare_fp8_np(out, ref, out_dtype=case.dtype, K=case.K,
                                       promote=numerics.fp8_promote(kw))
    if case.step.fp8:  # the fp32 product of the dequantized e4m3 inputs, fp8 tolerances
        ref = numerics.reference_fp8_np(numerics.fp8_from_bytes_np(A),
                                        numerics.fp8_from_bytes_np(B), extra["SA"],
                                        extra["SB"], kw.get("SCALE", "tensor"))
        return numerics.compare_fp8_np(out, ref, out_dtype=case.dtype, K=case.K,
                                       promote=numerics.fp8_promote(kw))
    if E.is_plain(kw):
        return numerics.compare_np(out, numerics.reference_np(A, B), dtype=case.dtype,
                                   exact=kind == "int")
    ref = E.reference_np(A, B, kw, extra.get("bias"))
    return E.compare_np(out, ref, kw, case.dtype, K=case.K)


def run_case(case: SimCase, *, checks=CHECKS, seed: int = 0, log=lambda s: None,
             engine=None) -> SimRow:
    """Simulate one case; never raises for a kernel problem (it goes into the row). A
    failure of the machine's NumSim set-up that every case would repeat (no cargo, the
    engines' build failing) raises SimEnvironmentError naming the cause."""
    from tirx_harness.numsim import Engine, transpile
    from tirx_harness.numsim.checkers import racecheck, synccheck
    crates_note()  # cargo builds from the vendored crates unless the user chose otherwise

    step = case.step
    row = SimRow(step.id, step.arch, case.M, case.N, case.K, dict(case.kwargs), case.mutant)
    t0 = time.time()
    func = case.build()
    dtype = case.dtype
    full = {kind: case_inputs_np(case, kind, seed + i)
            for i, kind in enumerate(input_kinds(case))}
    inputs = {kind: v[:3] for kind, v in full.items()}
    extras = {kind: v[3] for kind, v in full.items()}
    specs = workspace_specs(case)

    def operands(A, B, D, extra=None):
        """The kernel's arguments by name: A, B, a fresh copy of D, the epilogue's bias
        (when the case has BIAS), then each workspace operand
        (registry.Step.workspace_specs): counters zero-filled, scratch poisoned with NaN,
        as the GPU check passes them."""
        return {"A": A, "B": B, "D": D.copy(), **(extra or {}),
                **make_workspace_np(specs, poison=True)}

    if "numsim" in checks:
        try:
            module = transpile(func)
            engine = engine or Engine(max_workers="auto")
            rels, verdicts = [], []
            for kind, (A, B, D) in inputs.items():
                res = engine.run(module, operands(A, B, D, extras[kind]))
                out = np.asarray(res.outputs["D"])
                cmp = check_output_np(case, out, A, B, extras[kind], kind)
                log(f"--- numsim {kind} inputs ({case.label}, seed {seed}) ---\n"
                    f"{cmp.summary()}\ndiagnostics: {res.diagnostics}\n")
                if kind == "random":
                    rels.append(cmp.rel_frobenius_error)
                dirt = workspace_dirt_np(specs, res.outputs)
                if not cmp.ok:
                    row.problems.append(f"numsim {kind} inputs: {cmp.summary()}")
                if dirt:
                    row.problems.append(f"numsim {kind} inputs: {dirt}")
                if res.verdict != "clean":
                    row.problems.append(f"numsim diagnostics {res.verdict}: {res.diagnostics}")
                verdicts.append(cmp.ok and not dirt and res.verdict == "clean")
            attrs = getattr(func, "attrs", None)  # a PrimFunc's; None for a stand-in
            resident = attrs.get(RESIDENT_ATTR) if attrs is not None else None
            if resident is not None:
                verdicts.append(_cancel_path_ok(engine, module, int(resident), operands,
                                                inputs["random"], dtype, case, row, log))
            row.rel_err = rels[0] if rels else None
            row.numsim = "correct" if all(verdicts) else "WRONG"
        except Exception as e:  # noqa: BLE001 - a model or tool failure fails the row
            log(f"--- numsim ({case.label}) raised ---\n{traceback.format_exc()}\n")
            cause = environment_failure(e)
            if cause:  # every case would fail the same way: stop here
                raise SimEnvironmentError(cause) from e
            row.numsim = "failed"
            row.problems.append(f"numsim {type(e).__name__}: {_first_line(e)}")
    A, B, D = inputs["random"]
    for name, fn in (("sync", synccheck), ("race", racecheck)):
        if name not in checks:
            continue
        try:
            report = fn(func, operands(A, B, D, extras["random"]))
        except Exception as e:  # noqa: BLE001 - a model or tool failure fails the row
            log(f"--- {name}check ({case.label}) raised ---\n{traceback.format_exc()}\n")
            cause = environment_failure(e)
            if cause:
                raise SimEnvironmentError(cause) from e
            setattr(row, name, "failed")
            row.problems.append(f"{name}check {type(e).__name__}: {_first_line(e)}")
            continue
        setattr(row, name, _checker_verdict(f"{name}check", report, step, row, log))
    row.seconds = time.time() - t0
    row.checks = tuple(checks)
    # the check names are the row's field names: numsim, sync, race
    row.ok = not row.problems and all(
        getattr(row, c) in ("correct", "clean", "accepted review") for c in checks)
    return row


# --------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------
HEAD = (f"{'step':4} {'shape':13} {'kwargs':24} {'result':8} {'rel err':>8} "
        f"{'synccheck':15} {'racecheck':15} {'seconds':>7}")


def format_row(r: SimRow) -> str:
    kw = " ".join(f"{k}={v}" for k, v in r.kwargs.items()) or "-"
    if r.mutant:
        kw = f"MUTANT {r.mutant} " + ("" if kw == "-" else kw)
    rel = f"{r.rel_err:.1e}" if r.rel_err is not None else "-"
    return (f"{r.step:4} {f'{r.M}x{r.N}x{r.K}':13} {kw:24} {r.numsim:8} {rel:>8} "
            f"{r.sync:15} {r.race:15} {r.seconds:7.1f}")


def default_log_path() -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("build") / "sim" / f"sim-{stamp}.txt"


def _descendant_commands(root: int | None = None) -> set[str]:
    """The command names (``comm``) of this process's descendants, read from /proc: how the
    heartbeat tells cargo building the engines from a kernel's own compile or simulation.
    Empty where there is no /proc."""
    root = os.getpid() if root is None else root
    try:
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return set()
    parent, comm = {}, {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        left, right = stat.find("("), stat.rfind(")")
        fields = stat[right + 2:].split()
        if left < 0 or right < 0 or len(fields) < 2:
            continue
        comm[pid], parent[pid] = stat[left + 1:right], int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        kids = {p for p, pp in parent.items() if pp in frontier and p not in found}
        found |= kids
        frontier = kids
    return {comm[p] for p in found}


class SimProgress(Progress):
    """What the heartbeat says while a case runs: "building NumSim engines" while cargo
    builds them (the first use on a machine: minutes), "compiling" while rustc builds the
    kernel's module, else the case running."""

    def heartbeat_line(self) -> str:
        tools = self.tools()
        took = f"elapsed {self.elapsed():.0f} s"
        if "cargo" in tools:
            return (f"building NumSim engines (cargo; first use on this machine, cached "
                    f"after) for {self.current or 'the first case'}: {self._count()} cases "
                    f"done, {took}")
        if "rustc" in tools and self.current:
            return f"{self.what}: {self._count()} done, compiling {self.current} for NumSim (rustc), {took}"
        return super().heartbeat_line()

    def tools(self) -> set[str]:
        return _descendant_commands()


@contextlib.contextmanager
def _quiet_native():
    """The engines print cargo progress on stdout; keep it out of the table (it is logged)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield buf


def mutant_missed(row: SimRow) -> str | None:
    """For a mutant's row: None when the gate caught it as the mutant says it must (the row
    fails, each check in ``must_flag`` flags it, and a ``numbers_right`` mutant's numbers are
    still right, so only the checkers saw it); else why the gate missed it, in one line."""
    from tirx_gemm import mutants
    m = mutants.get(row.mutant)
    passed = {"numsim": row.numsim == "correct", "sync": row.sync == "clean",
              "race": row.race == "clean"}
    if row.ok:
        return f"mutant {m.name} ({m.bug}) passed the gate"
    quiet = [w for w in m.must_flag if passed[w]]
    if quiet:
        return f"mutant {m.name}: {', '.join(quiet)} did not flag it"
    if m.numbers_right and row.numsim != "correct":
        return f"mutant {m.name}: its numbers should be right (only the checkers see it), got {row.numsim}"
    return None


def mutant_cases() -> list[SimCase]:
    """One case per sm_100a mutant (tirx_gemm.mutants): `sim --all --mutants` runs them
    beside the real cases, and passes only if the gate catches every one."""
    from tirx_gemm import mutants
    return [mutant_case(m.name) for m in mutants.MUTANTS.values() if m.arch == ARCH]


def row_verdict(row: SimRow) -> bool:
    """A real case passes when it is correct and clean; a mutant's when the gate caught it."""
    return mutant_missed(row) is None if row.mutant else row.ok


def checks_for(case: SimCase, cases: list[SimCase], checks=CHECKS) -> tuple[str, ...]:
    """The checks a gate run gives ``case`` (a subset of ``checks``), so that CI's 2 cores
    spend no NumSim compile on a verdict that cannot change:
    - a mutant: the checks its verdict reads (``must_flag``, and numsim where its numbers
      must stay right): mutant_missed looks at nothing else;
    - a bfloat16 case whose float16 twin (same step, shape and other keywords) is in the
      same run: numsim only. Its barrier and proxy protocol is the twin's, which synccheck
      and racecheck check: the builders differ by the element type alone, both 2 bytes, so
      the TMA byte counts, barriers and MMA issue order are the same.
    Every other case gets every check."""
    from tirx_gemm import mutants
    if case.mutant:
        m = mutants.get(case.mutant)
        need = set(m.must_flag) | ({"numsim"} if m.numbers_right else set())
        return tuple(c for c in checks if c in need)
    if case.dtype == "bfloat16" and "numsim" in checks:
        plain = tuple((k, v) for k, v in case.kwargs if k != "dtype")
        if any(c is not case and not c.mutant and c.step == case.step
               and (c.M, c.N, c.K) == (case.M, case.N, case.K) and c.dtype == "float16"
               and tuple(c.kwargs) == plain for c in cases):
            return ("numsim",)
    return tuple(checks)


def _case_in_worker(case: SimCase, checks, seed: int):
    """One case in a pool worker: (row, its log text, the engines' own output)."""
    buf = io.StringIO()
    with _quiet_native() as native:
        row = run_case(case, checks=checks, seed=seed, log=buf.write)
    return row, buf.getvalue(), native.getvalue()


def _worker_init() -> None:
    """A pool worker inherits CARGO_HOME from the run that unpacked the vendored crates:
    know it as ours, so the worker's notes and error texts say "vendored" as the run's do."""
    home = os.environ.get("CARGO_HOME")
    if home and home == str(crates_dir() / "cargo-home"):
        _VENDORED_HOME["path"] = home


def _pool(jobs: int):
    import concurrent.futures
    import multiprocessing
    # spawn: a fresh interpreter per worker (TVM and the engines hold threads and locks a
    # fork would copy mid-use)
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init)


def simulate(cases: list[SimCase], *, checks=CHECKS, seed: int = 0, log_path: Path,
             out=print, heartbeat_s: float | None = None, stream=None,
             jobs: int = 1) -> list[SimRow]:
    """Run every case, print one table row per case as it finishes, log the full text.
    With ``heartbeat_s`` (the CLI passes progress.HEARTBEAT_S), while a case runs a line
    ("simulating: 3/24 done, v4@sm_100a 256x128x192 running, elapsed 40 s") goes to
    ``stream`` (default stdout) whenever nothing was printed for that long.

    ``jobs`` > 1 runs cases in that many worker processes at once (NumSim compiles each
    kernel with one rustc and simulates it mostly on one core, so two cores take two cases).
    The first case always runs alone, here: on a fresh machine it builds NumSim's engines
    (every later case needs them; two cargo builds of the same engines would only wait on
    each other), and a set-up failure stops the run there. Rows print as cases finish; the
    rows returned and the log are in the cases' order."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rows: list = [None] * len(cases)
    texts: list = [None] * len(cases)
    prog = SimProgress(
        "simulating", len(cases), stream=stream or sys.stdout, every=heartbeat_s or 1.0,
        enabled=heartbeat_s is not None)
    running: dict[int, str] = {}

    def finish(i: int, row: SimRow) -> None:
        rows[i] = row
        running.pop(i, None)
        prog.current = ", ".join(running.values()) or None
        prog.done += 1
        line = format_row(row)
        if row.mutant:
            missed = mutant_missed(row)
            line += "  caught" if missed is None else "  MISSED"
            problems = [missed] if missed else []
        else:
            problems = row.problems
        out(line)  # the row, as it finishes
        for p in problems:
            out(f"     ! {p}")
        prog.touch()

    def stopped(exc, case):
        where = "the first case, " if case is cases[0] else ""
        return SimEnvironmentError(
            f"{exc} (stopped at {where}{case.label}, since every case would fail the same "
            f"way; the full output is in {log_path})")

    with open(log_path, "w", encoding="utf-8") as logf:
        def log(s: str) -> None:
            logf.write(s)
            logf.flush()
        log(f"tirx-gemm sim: {len(cases)} case(s), checks {','.join(checks)}, seed {seed}"
            f"{f', {jobs} at a time' if jobs > 1 else ''}\n")
        out(HEAD)
        with prog:
            first = 1 if jobs > 1 else len(cases)
            for i, case in enumerate(cases[:first]):
                running[i] = case.label
                prog.current = case.label
                try:
                    with _quiet_native() as buf:
                        row = run_case(case, checks=checks_for(case, cases, checks),
                                       seed=seed, log=log)
                except SimEnvironmentError as exc:
                    raise stopped(exc, case) from exc
                finally:
                    if buf.getvalue():
                        log(f"--- engine output ({case.label}) ---\n{buf.getvalue()}\n")
                finish(i, row)
            rest = list(enumerate(cases))[first:]
            if rest:
                with _pool(jobs) as pool:
                    futures = {}
                    for i, case in rest:
                        futures[pool.submit(_case_in_worker, case,
                                            checks_for(case, cases, checks), seed)] = i
                    import concurrent.futures
                    pending = set(futures)
                    while pending:
                        # what runs now: the first `jobs` unfinished cases in submission order
                        waiting = sorted(futures[f] for f in pending)
                        for i in waiting[:jobs]:
                            running[i] = cases[i].label
                        prog.current = ", ".join(running.values())
                        done, pending = concurrent.futures.wait(
                            pending, return_when=concurrent.futures.FIRST_COMPLETED)
                        for f in sorted(done, key=futures.get):
                            i = futures[f]
                            try:
                                row, text, native = f.result()
                            except SimEnvironmentError as exc:
                                for g in pending:
                                    g.cancel()
                                raise stopped(exc, cases[i]) from exc
                            texts[i] = text + (f"--- engine output ({cases[i].label}) ---\n"
                                               f"{native}\n" if native else "")
                            finish(i, row)
                for text in texts[first:]:  # the workers' text, in the cases' order
                    log(text or "")
    return rows


def append_records(rows: list[SimRow], seed: int, checks, results_dir="results") -> Path:
    path = Path(results_dir) / "sim" / RECORDS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    from tirx_gemm.report.records import record_problem
    recs = [r.to_record(seed, tuple(c for c in checks if c in r.checks)) for r in rows]
    for rec in recs:  # a record names the checkers that ran, and claims nothing else
        problem = record_problem(rec)
        if problem:
            raise ValueError(f"refusing to record {rec['step']} {rec['M']}x{rec['N']}x"
                             f"{rec['K']}: {problem}")
    with open(path, "a", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    return path
