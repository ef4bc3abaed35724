"""What the subcommands share: step and shape arguments and checks, the build table, the way on."""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from tirx_gemm import registry
from tirx_gemm.compile.sass import HEADLINE_SASS, meaning
from tirx_gemm.numerics import DTYPES
from tirx_gemm.progress import Progress
from tirx_gemm.report import tables


def suggest(word: str, choices) -> str:
    """" (did you mean 'build'?)" for the closest of ``choices``, or ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""




def get_step(step_id: str, arch: str) -> registry.Step:
    """registry.get, with the closest step id suggested for an unknown one."""
    try:
        return registry.get(step_id, arch)
    except ValueError as exc:
        if arch not in registry.ARCHES:
            raise
        ids = [s.id for s in registry.all_steps(arch)]
        # the id as typed (registry.get's message names it after its own normalising)
        raise ValueError(f"no step {step_id!r} for {arch} (steps for {arch}: {', '.join(ids)})"
                         f"{suggest(str(step_id).strip().lower(), ids)}") from None


def _mnk(text: str) -> tuple[int, int, int]:
    from tirx_gemm.compile.api import check_shape_limits
    try:
        parts = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants M,N,K integers (e.g. 4096,4096,4096), "
                                         f"got {text!r}") from None
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"wants three integers M,N,K (e.g. 4096,4096,4096), "
                                         f"got {text!r}")
    try:
        check_shape_limits(*parts)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return parts


# the registry's constraint phrases ("M = N = 128", "K a multiple of 64", "N, K multiples of
# 8", "any M >= 1"), read as plain Python so that a shape a step cannot take is refused
# before TVM loads; a phrase not matched here is left to the builder, which enforces all
_EQUAL = re.compile(r"(?<![\w])([MNK](?:\s*=\s*[MNK])*)\s*=\s*(\d+)\b")
_MULTIPLE = re.compile(r"(?<![\w])([MNK](?:,\s*[MNK])*)\s+(?:a\s+)?multiples?\s+of\s+(\d+)")
_AT_LEAST = re.compile(r"(?<![\w])any\s+([MNK])\s*>=\s*(\d+)")


def shape_breaks(step: registry.Step, mnk) -> str | None:
    """The clause of ``step.constraints`` that shape ``mnk`` breaks, or None (pure Python:
    the registry's words, no builder, no TVM)."""
    dims = dict(zip("MNK", mnk))
    for clause in re.split(r";", step.constraints):
        if " when " in clause:  # holds under a builder keyword the shape alone does not show
            continue
        for m in _EQUAL.finditer(clause):
            names, n = re.findall(r"[MNK]", m.group(1)), int(m.group(2))
            if any(dims[d] != n for d in names):
                return m.group(0)
        for m in _MULTIPLE.finditer(clause):
            names, n = re.findall(r"[MNK]", m.group(1)), int(m.group(2))
            if any(dims[d] % n for d in names):
                return m.group(0)
        for m in _AT_LEAST.finditer(clause):
            if dims[m.group(1)] < int(m.group(2)):
                return m.group(0)
    return None


def check_step_shape(step: registry.Step, mnk) -> None:
    """ValueError, before anything is built, when ``mnk`` breaks the step's constraints."""
    broken = shape_breaks(step, mnk)
    if broken:
        M, N, K = mnk
        raise ValueError(f"{step.key} cannot take {M}x{N}x{K}: it needs {broken} "
                         f"({step.constraints}); its canonical shape is "
                         f"{','.join(map(str, step.canonical))} (`tirx-gemm list -v` shows "
                         "every step's constraints)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1) (0.15 allows 15% "
                                         f"below the baseline), got {text!r}")
    return value


SHAPE_LISTS = ("bench", "test", "all", "canonical")


def _shapes(text: str):
    """A registry shape list name, or explicit shapes 'M,N,K;M,N,K'."""
    if text in SHAPE_LISTS:
        return text
    if not any(c.isdigit() for c in text):
        raise argparse.ArgumentTypeError(
            f"unknown shape list {text!r}: use {', '.join(SHAPE_LISTS)} or 'M,N,K;M,N,K'")
    return [_mnk(part) for part in text.split(";")]


def _steps_arg(args) -> list[registry.Step]:
    if getattr(args, "all", False) and args.step:
        raise ValueError(f"name a step ({args.step}) or pass --all, not both")
    if getattr(args, "all", False):
        steps = registry.all_steps(args.arch)
        if not steps:
            raise ValueError(f"no steps registered for {args.arch}")
        return steps
    if not args.step:
        raise ValueError("name a step (e.g. v4) or pass --all")
    return [get_step(args.step, args.arch)]


def _fmt_bytes(n) -> str:
    if n is None:
        return "?"
    return f"{n / 1024:.1f}K" if n >= 1024 else str(n)



BUILD_HEAD = ("step", "arch", "M x N x K", "build", "regs", "smem", "spills", "key SASS")
BUILD_ALIGN = "<<<>>>><"


def _shape_dtype(mnk, dtype: str | None) -> str:
    """"MxNxK", with the dtype after it unless float16 (the default)."""
    return tables.shape(tuple(mnk)) + ("" if dtype in (None, "float16") else f" {dtype}")


def _build_row(r) -> list:
    sass = r.key_sass()
    keys = " ".join(f"{k}x{sass[k]}" for k in HEADLINE_SASS if k in sass)
    t = "cached" if r.cached else f"{r.times.get('total', 0):.1f}s"
    return [r.step, r.arch, _shape_dtype((r.M, r.N, r.K), (r.kwargs or {}).get("dtype")), t,
            r.registers or "?",
            _fmt_bytes(r.smem_bytes), r.spill_stores + r.spill_loads, keys]


def _build_table(rows) -> str:
    return tables.text(BUILD_HEAD, rows, BUILD_ALIGN)


def build_legend(results) -> str:
    """What the build table's columns mean, and each SASS opcode it shows (sass.py's
    glossary)."""
    shown = [k for k in HEADLINE_SASS
             if any(not isinstance(r, Exception) and k in r.key_sass() for r in results)]
    lines = ["columns: build = seconds to compile (cached: read from the build cache); "
             "regs = registers per thread; smem = dynamic shared memory per CTA (K = KiB); "
             "spills = bytes spilled to local memory (stores + loads, ptxas); key SASS = "
             "OPCODExN, N instructions of that opcode in the kernel's SASS:"]
    lines += [f"  {k:10} {meaning(k)}" for k in shown]
    return "\n".join(lines)


def _build_progress(n: int, quiet: bool, what: str = "building", reqs_label: str = ""):
    """(Progress, build_many callback): one line per build when there are several, and a
    heartbeat at least every 10 s."""
    prog = Progress(what if n > 1 else f"{what} {reqs_label}", n if n > 1 else None,
                    enabled=not quiet)

    def callback(done, total, req, res):
        if n > 1:
            prog.build_done(req, res)

    return prog, callback



def _cache_note() -> str:
    from tirx_gemm.compile.api import cache_root
    return str(cache_root())



SUITE_CONFLICTS = (("step", "a step name"), ("all", "--all"), ("mnk", "--mnk"),
                   ("shapes", "--shapes"), ("dtype", "--dtype"), ("timeline", "--timeline"),
                   ("no_time", "--no-time"))


def _suite_conflicts(args, cmd: str) -> None:
    """ValueError when ``cmd --suite`` is given an option the suite decides itself; the
    same for --target without --suite."""
    if args.suite is None:
        if getattr(args, "target_given", False):
            raise ValueError(f"--target chooses what `{cmd} --suite` runs; without --suite "
                             "name a step instead")
        return
    given = [label for attr, label in SUITE_CONFLICTS
             if getattr(args, attr, None) not in (None, False)]
    if given:
        raise ValueError(f"{cmd} --suite decides its own shapes, dtypes (fp16 and bf16) and "
                         f"builds, so {', '.join(given)} would be ignored: drop "
                         f"{'it' if len(given) == 1 else 'them'}, or {cmd} a step without "
                         "--suite")


def _device_or_reason(arch):
    from tirx_gemm.run import device
    from tirx_gemm.run import launcher
    launcher.kernel_timeout()  # a bad TIRX_GEMM_KERNEL_TIMEOUT fails before any build
    return device.device_or_reason(arch)


def way_on(arch: str, step: str | None = None, bundle_args: str = "", cmd: str = "run") -> str:
    """The commands that can do what needs a GPU of ``arch`` from this machine: NumSim for
    sm_100a; for sm_90a an export here and ``cmd`` (run, bench) with --bundle on a GPU host."""
    name = step or ("vN" if cmd == "run" else "")
    if arch == "sm_100a":
        return (f"instead, run it on NumSim, a CPU model of sm_100a: `tirx-gemm sim {step or '--all'}` "
                "(correctness and synchronization, no TFLOP/s; needs the Python 3.12 sim "
                "venv, README 'Running the Blackwell steps on a CPU model')")
    what = step or "--all"
    there = f"python -m tirx_gemm.cli {cmd} {name} --arch {arch}".replace("  ", " ")
    return (f"to run it on a Hopper GPU host: `tirx-gemm export {what} --arch {arch}"
            f"{bundle_args} --ffi-wheel 3.12 --out build/bundle` here, copy build/bundle and "
            f"this checkout there, then `pip install $(python -m tirx_gemm.cli bundle "
            f"build/bundle --wheels)` (the apache-tvm-ffi wheel, checked first) and "
            f"`{there} --bundle build/bundle`")


def _cannot_run(what: str, arch: str, why: str, step: str | None = None,
                extra: str = "", cmd: str = "run") -> int:
    print(f"\ncannot run {what}: {why}", file=sys.stderr)
    print(way_on(arch, step, extra, cmd), file=sys.stderr)
    if arch == "sm_100a":
        print("No TFLOP/s is reported: sm_100a results exist only where a Blackwell GPU ran "
              "them.", file=sys.stderr)
    return 2



# ---------------------------------------------------------------------------------------
# the arguments several subcommands take
# ---------------------------------------------------------------------------------------
def add_step_args(sp, step: bool = True, all_: bool = True) -> None:
    """The step, --all, --arch, --mnk, --dtype and -q arguments of build, show, export, run, bench."""
    if step:
        sp.add_argument("step", nargs="?" if all_ else None, help="step id, e.g. v4")
    if all_:
        sp.add_argument("--all", action="store_true", help="every step of --arch")
    sp.add_argument("--arch", default="sm_100a", choices=registry.ARCHES)
    sp.add_argument("--mnk", type=_mnk, help="problem shape M,N,K (default: the step's canonical shape)")
    sp.add_argument("--dtype", choices=DTYPES, default=DTYPES[0],
                    help=f"operand and output dtype, fp32 accumulation (default {DTYPES[0]})")
    sp.add_argument("-q", "--quiet", action="store_true")


def add_watchdog(sp) -> None:
    sp.add_argument("--watchdog-ms", type=_positive_int, default=None, metavar="MS",
                    help="build with bounded barrier waits: a wait longer than MS ms "
                         "prints which barrier stalled and traps (a debugging build)")


def add_suite_args(sp) -> None:
    sp.add_argument("--suite", nargs="?", const="", default=None, metavar="FILE",
                    help="the shape suite (default: the packaged model shapes, "
                         "tirx_gemm/op/suites/models.json), every shape in fp16 and bf16")
    sp.add_argument("--target", default=None,
                    help="with --suite: 'matmul' (the step tirx_gemm.matmul picks per "
                         "shape) or a step id (default matmul)")


def add_expect_sha256(sp) -> None:
    sp.add_argument("--expect-sha256", metavar="HEX", default=None,
                    help="with --bundle: refuse the bundle unless its manifest's sha256 "
                         "is HEX (the digest `tirx-gemm export` printed)")

