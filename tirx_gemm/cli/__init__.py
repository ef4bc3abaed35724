"""`tirx-gemm`: list, build, show, export and run the steps.

Building needs the TVM compiler and nvcc (no GPU). Running needs a GPU of the step's arch
and either TVM in-process or a bundle made by `tirx-gemm export` (torch + apache-tvm-ffi
+ TVM's runtime libraries are enough there). tvm is imported only by the commands that
compile.

Errors a user can cause (bad values, a missing or hung tool, a failed build) print one line,
``tirx-gemm: error: ...``, and exit 2; TIRX_GEMM_DEBUG=1 prints the traceback too.

main() builds the parser from one module per group of subcommands, each exposing
``register(sub)`` (its parsers, each bound to its handler): build.py (list, build, choose,
doctor, show), export.py (export), gpu.py (run, bench, regress, bundle), sim.py (sim), trace.py
(trace); common.py holds what they share. ``python -m tirx_gemm.cli`` runs main().
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
import traceback

from tirx_gemm.cli import build, export, gpu, sim, trace
from tirx_gemm.cli.common import suggest, way_on
# names callers reach as tirx_gemm.cli.X (tests, scripts/benchmark.py, lab/)
from tirx_gemm.cli.common import shape_breaks  # noqa: F401
from tirx_gemm.cli.gpu import (BENCH_HEAD, _bench_row, cmd_bench, cmd_regress,  # noqa: F401
                               cmd_run, measure_plan)
from tirx_gemm.cli.export import cmd_export  # noqa: F401

# the subcommands, in the order `tirx-gemm -h` lists them
GROUPS = (build, export, gpu, sim, trace)


DEBUG_ENV = "TIRX_GEMM_DEBUG"


class _Parser(argparse.ArgumentParser):
    """Usage mistakes in one line (``-h`` shows the usage), exit 2; a mistyped choice gets
    the closest valid one."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        # "-5,128,128" is a shape with a negative M (refused by the shape's own check, which
        # says M must be positive), not an unknown option; argparse takes only "-5" as a number
        self._negative_number_matcher = re.compile(r"^-\d+([.,x]-?\d*)*$|^-\d*\.\d+$")

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {_friendly(message)}\n")


def _friendly(message: str) -> str:
    """argparse's message without its internal names, with a did-you-mean."""
    m = re.match(r"argument (\S+): invalid choice: '?([^' ]*)'? \(choose from (.*)\)$", message)
    if m:
        arg, word, choices = m.groups()
        options = [c.strip(" '\"") for c in choices.split(",")]
        if arg in ("COMMAND", "cmd"):
            return (f"unknown command {word!r}{suggest(word, options)}; the commands are "
                    f"{', '.join(options)} (`tirx-gemm -h` says what each does)")
        return (f"{arg} {word!r} is not one of {', '.join(options)}"
                f"{suggest(word, options)}")
    return message.replace("argument COMMAND", "command").replace("COMMAND", "command")


def make_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand: each group's register(sub) adds its own."""
    p = _Parser(prog="tirx-gemm", description=__doc__.split("\n")[0],
                epilog="Start with `tirx-gemm list`, then `tirx-gemm build v4`; "
                       "`tirx-gemm COMMAND -h` explains a command.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return p


SHORT_HELP = """tirx-gemm: a stepwise GEMM tutorial compiler (TIRx, D = A @ B.T)

commands:
  list      the steps and their lessons          tirx-gemm list
  build     compile steps, show resources/SASS   tirx-gemm build v4 [--arch sm_90a]
  show      a step's generated CUDA, SASS, TIR   tirx-gemm show v4 --cuda
  sim       run sm_100a steps on NumSim (CPU)    tirx-gemm sim v4
  export    bundle kernels for a GPU host        tirx-gemm export v4 --arch sm_90a
  run       check + time one step on this GPU    tirx-gemm run v4 --arch sm_90a
  trace     in-kernel timeline: JSON, PNG, text  tirx-gemm trace v9 --arch sm_90a
  bench     check + time steps vs torch.matmul   tirx-gemm bench --arch sm_90a
  regress   GPU floors, or --cpu build checks    tirx-gemm regress --cpu
  bundle    check a bundle, its digest, wheels   tirx-gemm bundle build/bundle
  choose    matmul's kernel for a shape, why     tirx-gemm choose 72,4608,4096
  doctor    the CUDA toolchain a build uses      tirx-gemm doctor

`tirx-gemm COMMAND -h` lists and explains every option of that command;
`tirx-gemm -h` prints these commands again with argparse's usage line."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from tirx_gemm import settings
    # a misspelt TIRX_GEMM_* variable would be ignored without a word
    settings.warn_unknown(report=lambda line: print(f"tirx-gemm: warning: {line}",
                                                    file=sys.stderr))
    if not argv:  # a bare call asks what the tool does: the short help, exit 0
        print(SHORT_HELP)
        return 0
    args = make_parser().parse_args(argv)
    if args.cmd == "regress":
        args.arch_given = args.arch is not None
    if getattr(args, "expect_sha256", None):  # every bundle this process verifies is pinned
        from tirx_gemm.bundle_format import EXPECT_SHA256_ENV, check_sha256_text
        try:
            _bundle_given(args)
            os.environ[EXPECT_SHA256_ENV] = check_sha256_text(args.expect_sha256)
        except ValueError as exc:
            print(f"tirx-gemm: error: {exc}", file=sys.stderr)
            return 2
    if hasattr(args, "target"):  # export, bench: --target given or not (default matmul)
        args.target_given = args.target is not None
        args.target = args.target or "matmul"
    from tirx_gemm.compile.api import BuildError
    from tirx_gemm.sim.environment import SimUnavailable
    try:
        return args.fn(args)
    except BrokenPipeError:  # `| head` stopped reading: what it shows is all it wants
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, BuildError, OSError, SimUnavailable, *_runner_errors()) as exc:
        if _debug():
            traceback.print_exc()
        print(f"tirx-gemm: error: {_one_line(exc)}{_doctor_hint(exc)}{_gpu_hint(exc, args)}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _bundle_given(args) -> None:
    """--expect-sha256 pins a bundle: without one (no --bundle, no $TIRX_GEMM_BUNDLE) the
    kernels are built here and nothing would be checked against the digest."""
    from tirx_gemm import settings
    if args.cmd == "bundle" or getattr(args, "bundle", None) \
            or settings.get("TIRX_GEMM_BUNDLE") is not None:
        return
    raise ValueError(f"--expect-sha256 pins the digest of a bundle, but no bundle is given: "
                     f"add --bundle DIR (the bundle `tirx-gemm export` wrote), or drop "
                     f"--expect-sha256 to build the kernels here")


def _debug() -> bool:
    """$TIRX_GEMM_DEBUG through the settings table (an on/off word; "0" is off). A value
    that is neither prints the traceback too, and says so."""
    from tirx_gemm import settings
    try:
        return bool(settings.get(DEBUG_ENV))
    except ValueError as exc:
        print(f"tirx-gemm: note: {exc}; printing the traceback", file=sys.stderr)
        return True


def _runner_errors() -> tuple:
    """The run side's errors a user meets (no GPU of the arch, no runtime libraries, a
    kernel that faulted), imported by name from the torch-free run/errors.py (device,
    loader and launcher raise these very classes)."""
    from tirx_gemm.run.errors import RUN_ERRORS
    return RUN_ERRORS


def _gpu_hint(exc: BaseException, args) -> str:
    """"; to run it on a Hopper GPU host: ..." for `trace` on a machine without the GPU
    (run and bench say their way on themselves)."""
    from tirx_gemm.run.errors import DeviceMismatchError
    if not isinstance(exc, DeviceMismatchError) or args.cmd != "trace" \
            or getattr(args, "bundle", None):
        return ""
    return "; " + way_on("sm_90a", args.step, " --timeline", cmd="trace")


TOOLCHAIN_WORDS = ("nvcc", "ptxas", "cuobjdump", "nvdisasm", "cicc", "libcuda", "toolchain",
                   "CUDA headers", "host compiler")


def _doctor_hint(exc: BaseException) -> str:
    """"; `tirx-gemm doctor` ..." for a build error about the toolchain (a tool missing,
    failing or hung), unless the message already names a way on."""
    from tirx_gemm.compile.api import BuildError
    first = (str(exc).strip().splitlines() or [""])[0]
    if not isinstance(exc, BuildError) or "doctor" in first:
        return ""
    if any(w in first for w in TOOLCHAIN_WORDS):
        return " (`tirx-gemm doctor` shows the toolchain a build uses)"
    return ""


def _one_line(exc: BaseException) -> str:
    """The error's first line; a tool's output after it (nvcc diagnostics) is kept
    indented below, because that is what the learner has to read."""
    text = str(exc).strip() or type(exc).__name__
    first, _, rest = text.partition("\n")
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        first = f"{exc.filename}: {exc.strerror}"
        if exc.errno == errno.ENOSPC:  # which file system, and how much a build needs
            from tirx_gemm.compile.cache import disk_full
            first += f" ({disk_full(exc.filename) or 'its file system is full'})"
    return first + "".join(f"\n    {line}" for line in rest.splitlines())
