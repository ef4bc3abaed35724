"""`tirx-gemm`: list, build, show, export and run the steps.

Building needs the TVM compiler and nvcc (no GPU). Running needs a GPU of the step's arch
and either TVM in-process or a bundle made by `tirx-gemm export` (torch + apache-tvm-ffi
+ TVM's runtime libraries are enough there). tvm is imported only by the commands that
compile.

Errors a user can cause (bad values, a missing or hung tool, a failed build) print one line,
``tirx-gemm: error: ...``, and exit 2; TIRX_GEMM_DEBUG=1 prints the traceback too.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.report import tables
from tirx_gemm.progress import Progress
from tirx_gemm.kernels import dtype_kwargs, kernel_for
from tirx_gemm.run.measure import measure_plan, plan as _plan  # noqa: F401 (API)
from tirx_gemm.numerics import DTYPES
from tirx_gemm.report.regress import DEFAULT_TOLERANCE, EXPECTATIONS
from tirx_gemm.compile.sass import HEADLINE_SASS, meaning


DEBUG_ENV = "TIRX_GEMM_DEBUG"


class _Parser(argparse.ArgumentParser):
    """Usage mistakes in one line (``-h`` shows the usage), exit 2; a mistyped choice gets
    the closest valid one."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {_friendly(message)}\n")


def suggest(word: str, choices) -> str:
    """" (did you mean 'build'?)" for the closest of ``choices``, or ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


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


def get_step(step_id: str, arch: str) -> registry.Step:
    """registry.get, with the closest step id suggested for an unknown one."""
    try:
        return registry.get(step_id, arch)
    except ValueError as exc:
        ids = [s.id for s in registry.all_steps(arch)] if arch in registry.ARCHES else []
        raise ValueError(f"{exc}{suggest(str(step_id).lower(), ids)}") from None


def _mnk(text: str) -> tuple[int, int, int]:
    from tirx_gemm.compile.api import check_shape_limits
    try:
        parts = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mnk wants M,N,K integers, got {text!r}") from None
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"--mnk wants three integers M,N,K, got {text!r}")
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


# ---------------------------------------------------------------------------------------
def cmd_list(args) -> int:
    steps = registry.all_steps(args.arch)
    print(f"{'step':5} {'arch':8} {'canonical M,N,K':17} lesson")
    for s in steps:
        print(f"{s.id:5} {s.arch:8} {','.join(map(str, s.canonical)):17} {s.lesson}")
        if args.verbose:
            print(f"{'':32}constraints: {s.constraints}")
            print(f"{'':32}dtypes: {', '.join(DTYPES)}")
    arches = sorted({s.arch for s in steps})
    print(f"\n{len(steps)} steps ({', '.join(arches)}). Every step takes --dtype "
          f"{' or '.join(DTYPES)} (default {DTYPES[0]}; fp32 accumulation, the output in the "
          "input dtype). sm_100a steps compile here and run on "
          "NumSim, a CPU model of Blackwell (`tirx-gemm sim`); timing them needs a Blackwell "
          "GPU. sm_90a twins run on Hopper (H100/H200).")
    return 0


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


def cmd_build(args) -> int:
    from tirx_gemm.compile.api import build_many

    steps = _steps_arg(args)
    reqs = [(s, args.mnk or s.canonical, dtype_kwargs(args.dtype)) for s in steps]
    for s, mnk, _ in reqs:
        check_step_shape(s, mnk)
    t0 = time.perf_counter()
    prog, progress = _build_progress(len(reqs), args.quiet, reqs_label=reqs[0][0].key)
    with prog:
        results = build_many(reqs, jobs=args.jobs, use_cache=not args.no_cache,
                             progress=progress, watchdog_ms=args.watchdog_ms)
    rows = [[step.id, step.arch, _shape_dtype(mnk, args.dtype), f"FAILED: {r}"]
            if isinstance(r, Exception) else _build_row(r)
            for (step, mnk, _), r in zip(reqs, results)]
    failed = sum(isinstance(r, Exception) for r in results)
    print(_build_table(rows))
    if not args.quiet:
        print(build_legend(results))
    print(f"\n{len(reqs) - failed}/{len(reqs)} built in {time.perf_counter() - t0:.1f}s "
          f"(cache: {_cache_note()})")
    if any(s.arch == "sm_100a" for s in steps):
        print("sm_100a kernels are compiled here, not run on a GPU (no Blackwell GPU was "
              "used); `tirx-gemm sim` executes them on NumSim, a CPU model of sm_100a.")
    return 1 if failed else 0


def _cache_note() -> str:
    from tirx_gemm.compile.api import cache_root
    return str(cache_root())


def cmd_doctor(args) -> int:
    """Which CUDA toolchain a build uses: nvcc, the ptxas and headers nvcc picks (from
    ``nvcc --dryrun``), cuobjdump, nvdisasm, the host compiler, with paths and versions."""
    from tirx_gemm.compile.api import toolchain_report
    lines = toolchain_report()
    for label, text in lines:
        print(f"{label + ':':15}{text}")
    print(f"{'cache:':15}{_cache_note()}")
    return 1 if any(label == "warning" or "missing" in text or "not found" in text
                    for label, text in lines) else 0


def kernel_start(cuda: str) -> int:
    """Index of the line where the generated CUDA's first kernel (``__global__``) starts,
    after NVRTC's and TVM's prelude (headers, type shims, helpers); 0 if there is none."""
    lines = cuda.splitlines()
    for i, line in enumerate(lines):
        if "__global__" in line:
            while i > 0 and lines[i - 1].lstrip().startswith(("//", "template")):
                i -= 1
            return i
    return 0


def cmd_show(args) -> int:
    from tirx_gemm.compile.api import build

    step = get_step(args.step, args.arch)
    check_step_shape(step, args.mnk or step.canonical)
    with Progress(f"building {step.key}", enabled=not args.quiet):
        r = build(step.id, *(args.mnk or step.canonical), arch=step.arch,
                  **dtype_kwargs(args.dtype))
    what = args.what or "cuda"
    text = {"cuda": r.cuda_source, "sass": r.sass, "tir": r.tir}[what]
    if what == "cuda" and not args.full:
        start = kernel_start(text)
        if start:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[start:])
            if not args.quiet:
                print(f"// {start} lines of NVRTC/TVM prelude skipped (headers, type shims, "
                      "helpers): --full shows them", file=sys.stderr, flush=True)
    sys.stdout.write(text)
    if what == "sass" and not args.quiet:
        summary = ", ".join(f"{k} x{v}" for k, v in r.key_sass().items())
        print(f"\n// key SASS: {summary}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------
def cmd_export(args) -> int:
    """Build steps and put their libraries, a manifest and TVM's runtime into a bundle that
    a GPU host without the TVM compiler can run."""
    from tirx_gemm import bundle_format
    from tirx_gemm.compile import bundle

    _suite_conflicts(args, "export")
    args.dtype = args.dtype or DTYPES[0]
    args.shapes = args.shapes or "canonical"
    steps = [] if args.suite is not None else _steps_arg(args)
    if args.all and args.mnk:
        raise ValueError("--mnk names one shape, which not every step accepts (v1 is "
                         "128x128x64 only): export one step with --mnk, or --all with --shapes")
    out = Path(args.out)
    bundle.check_out_dir(out)
    if args.suite is not None:  # the kernels `bench --suite` / tirx_gemm.matmul will ask for
        from tirx_gemm import splitk
        from tirx_gemm import suite
        sms = args.num_sms or splitk.DEFAULT_SM_COUNT[args.arch]
        reqs = suite.export_requests(suite.load_suite(args.suite or None), args.target,
                                     args.arch, sms)
        n = bundle.export(reqs, out, jobs=args.jobs, progress=not args.quiet,
                          ffi_wheel_python=args.ffi_wheel, watchdog_ms=args.watchdog_ms)
        digest = bundle_format.manifest_sha256(out)
        print(f"exported {n} kernels for the suite ({args.target}, {sms} SMs) to {out}/ "
              f"(manifest sha256 {digest}). On the GPU host: python -m tirx_gemm.cli bench "
              f"--suite {args.suite or ''} --target {args.target} --arch {args.arch} --bundle "
              f"{out} --expect-sha256 {digest}".replace("  ", " "))
        return 0
    reqs = []
    for s in steps:
        shapes = bundle_format.shapes_for(s, args.shapes, args.mnk)
        for mnk in shapes:
            check_step_shape(s, mnk)
        reqs += [(s, mnk, bundle.build_kwargs(s, args)) for mnk in shapes]
    n = bundle.export(reqs, out, jobs=args.jobs, progress=not args.quiet,
                      ffi_wheel_python=args.ffi_wheel, watchdog_ms=args.watchdog_ms)
    dt = "" if args.dtype == "float16" else f" --dtype {args.dtype}"
    digest = bundle_format.manifest_sha256(out)
    print(f"exported {n} kernels to {out}/ (manifest.json, runtime/; manifest sha256 "
          f"{digest}). On the GPU host: python -m tirx_gemm.cli "
          f"{'trace' if getattr(args, 'timeline', False) else 'run'} <step> --arch "
          f"{args.arch}{dt} --bundle {out} --expect-sha256 {digest}")
    return 0


def cmd_bundle(args) -> int:
    """`tirx-gemm bundle DIR`: check a bundle as a GPU host would before loading anything
    from it; print its digest, or (--wheels) the verified wheels for pip."""
    from tirx_gemm import bundle_format as bundle
    kernels = bundle.verify(Path(args.dir), args.expect_sha256 or None)
    if args.wheels:
        wheels = bundle.verified_wheels(Path(args.dir), args.expect_sha256 or None)
        if not wheels:
            raise ValueError(f"bundle {args.dir} holds no wheels (export with --ffi-wheel "
                             "3.12 to ship the apache-tvm-ffi wheel)")
        print(" ".join(str(w) for w in wheels))
        return 0
    print(f"bundle {args.dir}: {len(kernels)} kernels, every file matches its sha256, "
          f"nothing unlisted; manifest sha256 {bundle.manifest_sha256(Path(args.dir))}")
    return 0


# what the suite decides itself (its shapes, both dtypes, plain builds), so an option that
# would choose it is refused with --suite instead of being silently ignored
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


def cmd_run(args) -> int:
    step = get_step(args.step, args.arch)
    mnk = tuple(args.mnk or step.canonical)
    check_step_shape(step, mnk)
    device, why = _device_or_reason(step.arch)
    # build (or find in the bundle) even without a GPU, so the compile side is shown/checked
    with Progress(f"building {step.key}", enabled=not args.quiet and not args.bundle):
        lib, meta, built = kernel_for(step, mnk, args.bundle,
                                      sm_count=device["sm_count"] if device else None,
                                      watchdog_ms=args.watchdog_ms, dtype=args.dtype)
    if built is not None:
        print(_build_table([_build_row(built)]))
    if device is None:
        extra = ("" if args.dtype == "float16" else f" --dtype {args.dtype}") + (
            "" if not args.mnk else f" --mnk {','.join(map(str, mnk))}")
        return _cannot_run(step.key, step.arch, why, step.id, extra)
    from tirx_gemm.run import loader
    from tirx_gemm.run import runner
    kernel = loader.load_kernel(str(lib))
    rec = runner.run_step(kernel, meta, check=True, time=not args.no_time,
                          git_sha=meta.get("git_sha"))
    if args.record:  # a failed check is recorded too (verified=false)
        from tirx_gemm.report import records
        print(f"record appended to {records.append_record(rec, args.results)}")
    return 0 if rec.get("verified") else 1


BENCH_HEAD = ("step", "arch", "M x N x K", "check", "rel err", "ms", "TFLOP/s", "torch",
              "ratio")


def _bench_row(rec) -> list:
    f = tables.fmt
    return [rec["step"], rec["arch"], _shape_dtype((rec["M"], rec["N"], rec["K"]), rec.get("dtype")),
            "ok" if rec["verified"] else "FAIL", f(rec.get("rel_err"), ".1e"),
            f(rec.get("median_ms"), ".3f"), f(rec.get("tflops"), ".1f"),
            f(rec.get("torch_tflops"), ".1f"), f(rec.get("ratio_to_torch"), ".3f")]


def _progress_log(args):
    """Full detail by default; with -q only the one-line-per-kernel progress."""
    if not args.quiet:
        return print
    return lambda m: None if m.startswith("    ") else print(m, flush=True)


def cmd_bench(args) -> int:
    _suite_conflicts(args, "bench")
    args.dtype = args.dtype or DTYPES[0]
    args.shapes = args.shapes or "bench"
    if args.suite is not None:
        return _bench_suite(args)
    steps = _steps_arg(args) if (args.step or args.all) else registry.all_steps(args.arch)
    if args.mnk and len(steps) == 1:
        check_step_shape(steps[0], args.mnk)
    device, why = _device_or_reason(args.arch)
    if device is None:
        one = steps[0].id if len(steps) == 1 else None
        return _cannot_run(f"{args.arch} steps", args.arch, why, one,
                           " --shapes bench", cmd="bench")
    recs = measure_plan(_plan(steps, args.mnk and [args.mnk] or args.shapes),
                        bundle=args.bundle, check_only=args.no_time, log=_progress_log(args),
                        watchdog_ms=args.watchdog_ms, dtype=args.dtype)
    print("\n" + tables.text(BENCH_HEAD, [_bench_row(r) for r in recs], "<<<<>>>>>"))
    print(f"device: {device['name']} (cc {device['capability']}, {device['sm_count']} SMs)")
    if args.record:
        from tirx_gemm.report import records
        # failed checks are recorded too (verified=false): the table must show them
        paths = {str(records.append_record(r, args.results)) for r in recs}
        print(f"records appended to {', '.join(sorted(paths))}")
    return 0 if all(r["verified"] for r in recs) else 1


def _bench_suite(args) -> int:
    """`bench --suite [FILE] --target matmul|vN`: every suite shape in fp16 and bf16 against
    torch.matmul in the same run (tirx_gemm.suite.bench_suite)."""
    from tirx_gemm import suite
    suite.load_suite(args.suite or None)  # a bad suite file fails before the GPU probe
    if args.target != suite.MATMUL:
        get_step(args.target, args.arch)
    device, why = _device_or_reason(args.arch)
    if device is None:
        # the suite is a timing against torch.matmul: NumSim (sm_100a here) times nothing,
        # so the way on is a Hopper GPU host, whatever arch was asked for
        note = ("" if args.arch == "sm_90a" else " (the suite times kernels against "
                "torch.matmul; NumSim, the only place sm_100a steps run here, measures no "
                "time, so the way on is the sm_90a twins on a Hopper GPU)")
        target = args.target
        print(f"\ncannot run the suite ({args.target}): {why}{note}\nto run it on a Hopper "
              f"GPU host: `tirx-gemm export --suite {args.suite or ''} --target {target} "
              f"--arch sm_90a --ffi-wheel 3.12 --out build/bundle` here, then there "
              f"`python -m tirx_gemm.cli bench --suite {args.suite or ''} --target "
              f"{target} --arch sm_90a --bundle build/bundle`".replace("  ", " "),
              file=sys.stderr)
        return 2
    out = suite.bench_suite(args.suite or None, args.target, bundle=args.bundle,
                            log=_progress_log(args), results_dir=args.results,
                            record=args.record)
    recs = out["records"]
    return 0 if not out["failed"] and recs and all(r.get("verified") for r in recs) else 1


def cmd_regress(args) -> int:
    from tirx_gemm.report import regress
    if args.cpu:
        return _regress_cpu(args)
    from tirx_gemm.run import device
    from tirx_gemm.run import launcher
    launcher.kernel_timeout()  # a bad TIRX_GEMM_KERNEL_TIMEOUT fails before any build
    arch, why = device.gpu_arch()
    if arch is None:
        print(f"cannot run the GPU regression: {why}\nhere: `tirx-gemm regress --cpu` (build "
              "expectations) or `tirx-gemm sim --all` (sm_100a on NumSim); on a Hopper GPU "
              "host: `tirx-gemm export --all --arch sm_90a --shapes bench --ffi-wheel 3.12 "
              "--out build/bundle` here, then there `python -m tirx_gemm.cli regress --bundle "
              "build/bundle`", file=sys.stderr)
        return 2
    device, _ = _device_or_reason(arch)
    path = Path(args.baseline) if args.baseline else regress.baseline_path(device["name"])
    base = regress.load_baseline(path)  # a bad baseline fails before any GPU work
    plan = regress.bench_plan(registry.all_steps(arch))
    print(f"regression on {device['name']} ({arch}): {len(plan)} step/shape pairs, "
          f"tolerance {args.tolerance:.0%}")
    recs = measure_plan(plan, bundle=args.bundle, log=_progress_log(args),
                        watchdog_ms=args.watchdog_ms)
    verdicts = regress.evaluate(recs, None if args.update_baseline else base, args.tolerance)
    print("\n" + regress.format_verdicts(verdicts))
    if args.record:
        from tirx_gemm.report import records
        for r in recs:
            records.append_record(r, args.results)
    wrong = [v for v in verdicts if v["status"] == "FAIL"]
    if (base is None or args.update_baseline) and not wrong:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(regress.baseline_from_records(recs, device), indent=1) + "\n")
        print(f"\n{'no baseline for ' + device['name'] + ': ' if base is None else ''}"
              f"recorded the baseline {path} from this run")
    elif base is None:
        print(f"\nno baseline for {device['name']}, and none recorded: the run had failures")
    print(f"\n{len(wrong)} failure(s)" if wrong else "\nregression: all steps pass")
    return 1 if wrong else 0


def _regress_cpu(args) -> int:
    from tirx_gemm.report import regress
    from tirx_gemm.compile.api import build_many
    steps = registry.all_steps(args.arch if args.arch_given else None)
    reqs = regress.cpu_requests(steps)
    prog, progress = _build_progress(len(reqs), args.quiet)
    with prog:
        res = build_many(reqs, watchdog_ms=args.watchdog_ms, progress=progress)
    bad = [(req, r) for req, r in zip(reqs, res) if isinstance(r, Exception)]
    for req, r in bad:
        print(f"{req[0].key}: build failed: {r}")
    if bad:
        return 1
    actual = regress.build_snapshot(res)
    path = Path(args.expectations)
    if args.update:
        old = json.loads(path.read_text()) if path.exists() else {}
        old.update(actual)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(actual)} expectations to {path}")
        return 0
    if not path.exists():
        print(f"no expectations file {path}: create it with `tirx-gemm regress --cpu --update`")
        return 1
    expected = json.loads(path.read_text())
    expected = {k: v for k, v in expected.items() if k in actual or not args.arch_given
                or k.split("@")[1].startswith(args.arch + ":")}
    diff = regress.diff_snapshot(expected, actual)
    if diff:
        print("build regression: compiled steps differ from " + str(path) + "\n  "
              + "\n  ".join(diff) + "\n(if intended, run `tirx-gemm regress --cpu --update` "
              "and commit the file)")
        return 1
    print(f"build regression: {len(actual)} step builds match {path} (registers, shared "
          f"memory, spills, key SASS counts)")
    return 0


# ---------------------------------------------------------------------------------------
def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tirx-gemm", description=__doc__.split("\n")[0],
                epilog="Start with `tirx-gemm list`, then `tirx-gemm build v4`; "
                       "`tirx-gemm COMMAND -h` explains a command.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def common(sp, step=True, all_=True):
        if step:
            sp.add_argument("step", nargs="?" if all_ else None, help="step id, e.g. v4")
        if all_:
            sp.add_argument("--all", action="store_true", help="every step of --arch")
        sp.add_argument("--arch", default="sm_100a", choices=registry.ARCHES)
        sp.add_argument("--mnk", type=_mnk, help="problem shape M,N,K (default: the step's canonical shape)")
        sp.add_argument("--dtype", choices=DTYPES, default=DTYPES[0],
                        help=f"operand and output dtype, fp32 accumulation (default {DTYPES[0]})")
        sp.add_argument("-q", "--quiet", action="store_true")

    def watchdog(sp):
        sp.add_argument("--watchdog-ms", type=_positive_int, default=None, metavar="MS",
                        help="build with bounded barrier waits: a wait longer than MS ms "
                             "prints which barrier stalled and traps (a debugging build)")

    def suite_args(sp):
        sp.add_argument("--suite", nargs="?", const="", default=None, metavar="FILE",
                        help="the shape suite (default: the packaged model shapes, "
                             "tirx_gemm/suites/models.json), every shape in fp16 and bf16")
        sp.add_argument("--target", default=None,
                        help="with --suite: 'matmul' (the step tirx_gemm.matmul picks per "
                             "shape) or a step id (default matmul)")

    sp = sub.add_parser("list", help="list the steps")
    sp.add_argument("--arch", default=None, choices=registry.ARCHES)
    sp.add_argument("-v", "--verbose", action="store_true", help="also show constraints")
    sp.set_defaults(fn=cmd_list)

    sp = sub.add_parser("build", help="compile steps; print registers, smem, spills, key SASS")
    common(sp)
    sp.add_argument("--jobs", type=_positive_int, default=None,
                    help="parallel build processes (default: cores)")
    sp.add_argument("--no-cache", action="store_true", help="rebuild and replace cached builds")
    watchdog(sp)
    sp.set_defaults(fn=cmd_build)

    sp = sub.add_parser("doctor", help="show the CUDA toolchain a build uses (paths, versions)")
    sp.set_defaults(fn=cmd_doctor)

    sp = sub.add_parser("show", help="print a step's generated CUDA, SASS or TIR")
    common(sp, all_=False)
    g = sp.add_mutually_exclusive_group()
    for w in ("cuda", "sass", "tir"):
        g.add_argument(f"--{w}", dest="what", action="store_const", const=w)
    sp.add_argument("--full", action="store_true",
                    help="--cuda: the whole file (default: from the kernel on, without the "
                         "NVRTC/TVM prelude)")
    sp.set_defaults(fn=cmd_show)

    sp = sub.add_parser("export", help="build + bundle kernels for a GPU host without TVM")
    common(sp)
    sp.add_argument("--shapes", default="canonical", type=_shapes,
                    help="canonical | test | bench | all (registry shape lists) or explicit "
                         "shapes 'M,N,K;M,N,K' (default: canonical; ignored with --mnk)")
    sp.add_argument("--out", default="build/bundle", help="bundle directory")
    sp.add_argument("--jobs", type=_positive_int, default=None)
    sp.add_argument("--num-sms", type=_positive_int, default=None,
                    help="SM count for persistent steps (default: the step's default)")
    sp.add_argument("--ffi-wheel", metavar="PYVER", default=None,
                    help="also download the apache-tvm-ffi wheel for this Python (e.g. 3.12) "
                         "into the bundle, for a GPU host without network")
    sp.add_argument("--timeline", action="store_true",
                    help="instrumented builds for `tirx-gemm trace` (sm_90a v4 on): "
                         "every role records its event times into an extra operand; "
                         "never picked by run/bench/regress")
    suite_args(sp)
    watchdog(sp)
    sp.set_defaults(fn=cmd_export, dtype=None, shapes=None)  # None: not given (cmd_export)

    def expect_sha256(sp):
        sp.add_argument("--expect-sha256", metavar="HEX", default=None,
                        help="with --bundle: refuse the bundle unless its manifest's sha256 "
                             "is HEX (the digest `tirx-gemm export` printed)")

    sp = sub.add_parser("run", help="run one step on this machine's GPU: check against torch, time it")
    common(sp, all_=False)
    sp.add_argument("--bundle", help="run from an exported bundle instead of building here")
    expect_sha256(sp)
    sp.add_argument("--no-time", action="store_true", help="check correctness only")
    sp.add_argument("--record", action="store_true", help="append the record to results/")
    sp.add_argument("--results", default="results", help="results directory")
    watchdog(sp)
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser("bench", help="check + time steps against torch.matmul on this GPU")
    common(sp)
    sp.add_argument("--shapes", default="bench", type=_shapes,
                    help="bench | test | all | canonical | 'M,N,K;M,N,K' (default: bench)")
    sp.add_argument("--bundle", help="run from an exported bundle instead of building here")
    expect_sha256(sp)
    sp.add_argument("--no-time", action="store_true", help="check correctness only")
    sp.add_argument("--record", action="store_true",
                    help="append the records (failed checks too) to results/")
    sp.add_argument("--results", default="results", help="results directory")
    suite_args(sp)
    watchdog(sp)
    sp.set_defaults(fn=cmd_bench, dtype=None, shapes=None)  # None: not given (cmd_bench)

    sp = sub.add_parser("regress", help="per-step regression: GPU (vs baseline) or --cpu (vs "
                                        "committed build expectations)")
    sp.add_argument("--cpu", action="store_true",
                    help="compile every step and compare resources/SASS with the expectations")
    sp.add_argument("--arch", choices=registry.ARCHES, default=None,
                    help="--cpu: only this arch (default: both)")
    sp.add_argument("--update", action="store_true", help="--cpu: rewrite the expectations")
    sp.add_argument("--expectations", default=str(EXPECTATIONS))
    sp.add_argument("--bundle", help="GPU: run from an exported bundle")
    expect_sha256(sp)
    sp.add_argument("--tolerance", type=_fraction, default=DEFAULT_TOLERANCE,
                    help=f"GPU: allowed drop below baseline TFLOP/s (default {DEFAULT_TOLERANCE})")
    sp.add_argument("--baseline", help="GPU: baseline file (default goldens/baselines/<device>.json)")
    sp.add_argument("--update-baseline", action="store_true",
                    help="GPU: rewrite the baseline from this run (only if all steps pass)")
    sp.add_argument("--record", action="store_true", help="GPU: append the records")
    sp.add_argument("--results", default="results")
    sp.add_argument("-q", "--quiet", action="store_true")
    watchdog(sp)
    sp.set_defaults(fn=cmd_regress)

    sp = sub.add_parser("bundle", help="check an exported bundle as a GPU host does; print "
                                       "its digest or its verified wheels")
    sp.add_argument("dir", help="the bundle folder")
    expect_sha256(sp)
    sp.add_argument("--wheels", action="store_true",
                    help="print the bundle's wheels, each checked, for `pip install` (an "
                         "unlisted or changed wheel is refused)")
    sp.set_defaults(fn=cmd_bundle)

    _add_sim_parser(sub)
    from tirx_gemm.run import trace  # timeline + registry at import; torch when it runs
    trace.add_trace_parser(sub)
    return p


# --------------------------------------------------------------------------------------
# `tirx-gemm sim` (tirx_gemm/sim/gate.py: numpy + registry at import; NumSim loads when it runs)
# --------------------------------------------------------------------------------------
def _add_sim_parser(sub) -> None:
    from tirx_gemm.sim.gate import CHECKS
    p = sub.add_parser(
        "sim", help="run sm_100a steps on a CPU model of Blackwell (NumSim) + sync/race checks",
        description="Simulate sm_100a steps with tirx-harness NumSim at the registry's "
                    "simulation shapes (or --mnk), check numbers against an fp32 reference "
                    "and run synccheck and racecheck. Exit 0 only if every row is correct "
                    "and clean. Proves correctness and protocol on a model, never speed.")
    p.add_argument("step", nargs="?", help="step id, e.g. v4")
    p.add_argument("--all", action="store_true", help="every sm_100a step")
    p.add_argument("--mnk", type=_mnk,
                   help="one shape M,N,K instead of the registry's sim cases")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="operand dtype of the --mnk case; without --mnk, every registry case "
                        "in this dtype (default: the registry's cases as listed, float16 and "
                        "one bfloat16 case per step)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--check", default=",".join(CHECKS),
                   help=f"comma list of {','.join(CHECKS)} (default: all)")
    p.add_argument("--log", help="file for the full checker text (default build/sim/...)")
    p.add_argument("--mutant", help="simulate a deliberately broken variant instead "
                   "(tirx_gemm/mutants.py; the gate must fail); names the step itself")
    p.add_argument("--mutants", action="store_true",
                   help="with --all: also simulate every sm_100a mutant (tirx_gemm/mutants.py); "
                        "the run passes only if the gate catches each one as it must")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="cases simulated at once, each in its own process (default: the "
                        "machine's cores, at most 4; 1 runs them one by one in this process)")
    p.add_argument("--record", action="store_true",
                   help="append the rows to results/sim/numsim-cpu.jsonl (README table)")
    p.set_defaults(fn=cmd_sim)


def _sim_jobs(requested: int | None, n_cases: int) -> int:
    """Worker processes for `sim`: --jobs, else the cores (at most 4), never more than the
    cases after the first (which runs alone: it builds the engines on a fresh machine)."""
    if requested is not None and requested < 1:
        raise ValueError(f"--jobs {requested} must be >= 1")
    jobs = requested if requested is not None else min(os.cpu_count() or 1, 4)
    return max(1, min(jobs, n_cases - 1))


def _parse_checks(text: str) -> tuple[str, ...]:
    from tirx_gemm.sim.gate import CHECKS
    checks = tuple(c.strip() for c in text.split(",") if c.strip())
    bad = [c for c in checks if c not in CHECKS]
    if bad or not checks:
        raise ValueError(f"--check {text!r}: choose from {','.join(CHECKS)}")
    return checks


def cmd_sim(args) -> int:
    """`tirx-gemm sim`: the registry's simulation cases (or --mnk, or a mutant) on NumSim."""
    from tirx_gemm.sim.gate import (ARCH, CHECKS, SimUnavailable, append_records, cases_for,
                                    crates_note, default_log_path, mutant_case, simulate,
                                    unavailable_reason)
    checks = _parse_checks(args.check)
    mnk = args.mnk
    if args.mutant:
        from tirx_gemm import mutants
        mutant_case(args.mutant)  # an sm_90a mutant is refused here
        m = mutants.get(args.mutant)
        if args.all or (args.step and registry.get(args.step, ARCH).id != m.step):
            raise ValueError(f"--mutant {m.name} breaks step {m.step}; name that step or none")
        if args.record:
            raise ValueError("--record keeps results of the real steps only, not of mutants")
        args.step = m.step
    if args.all and args.step:
        raise ValueError("name one step or pass --all, not both")
    if getattr(args, "mutants", False) and not args.all:
        raise ValueError("--mutants goes with --all (one mutant: --mutant NAME)")
    if getattr(args, "mutants", False) and args.record:
        raise ValueError("--record keeps results of the real steps only, not of mutants")
    if args.all and mnk:
        raise ValueError("--mnk needs one step (the steps accept different shapes)")
    if args.all:
        steps = registry.all_steps(ARCH)
    elif args.step:
        steps = [get_step(args.step, ARCH)]
    else:
        raise ValueError("name a step (e.g. v4) or pass --all")
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed} must be >= 0")
    dtype = getattr(args, "dtype", None)
    cases = [c for s in steps for c in cases_for(s, mnk, dtype)]
    if args.mutant:
        cases = [mutant_case(args.mutant, mnk, dtype)]
    if getattr(args, "mutants", False):
        from tirx_gemm.sim.gate import mutant_cases
        cases += mutant_cases()
    jobs = _sim_jobs(getattr(args, "jobs", None), len(cases))
    if mnk:  # a shape (or dtype) the step rejects fails here, before any simulation starts
        check_step_shape(steps[0], mnk)  # the registry's words first: no TVM for that
        steps[0].build_primfunc(*mnk, **dict(cases[0].kwargs))
    why = unavailable_reason()
    if why:
        raise SimUnavailable(why)
    log_path = Path(args.log) if args.log else default_log_path()
    note = crates_note()  # which crates cargo builds the engines from (vendored: offline)
    at_once = f", {jobs} at a time after the first" if jobs > 1 else ""
    print(f"simulating {len(cases)} case(s){at_once} on NumSim (CPU model of sm_100a). The first run "
          "on a machine builds NumSim's engines with cargo first (minutes: 5 or more on 2 "
          "busy cores; cached after; the heartbeat says \"building NumSim engines\" until "
          f"they are); {note}. Each row prints as its case finishes; the full checker text "
          f"goes to {log_path}", flush=True)
    from tirx_gemm.sim.gate import checks_for
    fewer = [c for c in cases if checks_for(c, cases, checks) != tuple(checks)]
    if fewer:
        print(f"{len(fewer)} case(s) run fewer checks (gate.checks_for): a bfloat16 case whose "
              "float16 twin is in this run checks its numbers (its barrier protocol is the "
              "twin's, which synccheck and racecheck check); a mutant, the checks its verdict "
              "reads", flush=True)
    t0 = time.time()
    from tirx_gemm.progress import HEARTBEAT_S
    rows = simulate(cases, checks=checks, seed=args.seed, log_path=log_path,
                    heartbeat_s=HEARTBEAT_S, jobs=jobs,
                    out=lambda s: print(s, flush=True))
    from tirx_gemm.sim.gate import row_verdict
    if args.mutant:  # one mutant, as a user simulates it: the gate's own verdict (it fails)
        bad, real = [r for r in rows if not r.ok], rows
    else:  # with --mutants, a mutant's row counts as passing when the gate caught it
        bad = [r for r in rows if not row_verdict(r)]
        real = [r for r in rows if not r.mutant]
    passed = ("correct and clean" if checks == CHECKS
              else f"passed {', '.join(checks)} (not run: {', '.join(c for c in CHECKS if c not in checks)})")
    caught = ""
    if not args.mutant and len(real) < len(rows):
        muts = [r for r in rows if r.mutant]
        caught = (f"; mutants caught by the gate: {sum(row_verdict(r) for r in muts)}/"
                  f"{len(muts)}")
    print(f"\n{sum(r.ok for r in real)}/{len(real)} {passed}{caught} in "
          f"{time.time() - t0:.0f} s; full checker text: {log_path}")
    print("A pass proves numbers and synchronization on a CPU model of sm_100a; it measures "
          "no speed and is not silicon.")
    if args.record:
        print(f"records appended to {append_records(rows, args.seed, checks)}")
    return 1 if bad else 0


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
  doctor    the CUDA toolchain a build uses      tirx-gemm doctor

`tirx-gemm COMMAND -h` lists and explains every option of that command;
`tirx-gemm -h` prints these commands again with argparse's usage line."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # a bare call asks what the tool does: the short help, exit 0
        print(SHORT_HELP)
        return 0
    args = make_parser().parse_args(argv)
    if args.cmd == "regress":
        args.arch_given = args.arch is not None
    if getattr(args, "expect_sha256", None):  # every bundle this process verifies is pinned
        from tirx_gemm.bundle_format import EXPECT_SHA256_ENV, check_sha256_text
        try:
            os.environ[EXPECT_SHA256_ENV] = check_sha256_text(args.expect_sha256)
        except ValueError as exc:
            print(f"tirx-gemm: error: {exc}", file=sys.stderr)
            return 2
    if hasattr(args, "target"):  # export, bench: --target given or not (default matmul)
        args.target_given = args.target is not None
        args.target = args.target or "matmul"
    from tirx_gemm.compile.api import BuildError
    from tirx_gemm.sim.gate import SimUnavailable
    try:
        return args.fn(args)
    except (ValueError, BuildError, OSError, SimUnavailable, *_runner_errors()) as exc:
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        print(f"tirx-gemm: error: {_one_line(exc)}{_doctor_hint(exc)}{_gpu_hint(exc, args)}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


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
    return first + "".join(f"\n    {line}" for line in rest.splitlines())


if __name__ == "__main__":
    sys.exit(main())
