"""`tirx-gemm run|bench|regress|bundle`: check and time kernels on this GPU, check a bundle."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.cli.common import (_build_row, _build_table, _cannot_run, _device_or_reason,
                                  _fraction, _shape_dtype, _shapes, _steps_arg,
                                  _suite_conflicts, add_expect_sha256, add_step_args,
                                  add_suite_args, add_watchdog, check_step_shape, get_step,
                                  _build_progress)
from tirx_gemm.kernels import kernel_for
from tirx_gemm.numerics import DTYPES
from tirx_gemm.progress import Progress
from tirx_gemm.report import tables
from tirx_gemm.report.regress import DEFAULT_TOLERANCE, EXPECTATIONS
from tirx_gemm.run.measure import measure_plan, plan as _plan


def register(sub) -> None:
    sp = sub.add_parser("run", help="run one step on this machine's GPU: check against torch, time it")
    add_step_args(sp, all_=False)
    sp.add_argument("--bundle", help="run from an exported bundle instead of building here")
    add_expect_sha256(sp)
    sp.add_argument("--no-time", action="store_true", help="check correctness only")
    sp.add_argument("--record", action="store_true", help="append the record to results/")
    sp.add_argument("--results", default="results", help="results directory")
    add_watchdog(sp)
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser("bench", help="check + time steps against torch.matmul on this GPU")
    add_step_args(sp)
    sp.add_argument("--shapes", default="bench", type=_shapes,
                    help="bench | test | all | canonical | 'M,N,K;M,N,K' (default: bench)")
    sp.add_argument("--bundle", help="run from an exported bundle instead of building here")
    add_expect_sha256(sp)
    sp.add_argument("--no-time", action="store_true", help="check correctness only")
    sp.add_argument("--record", action="store_true",
                    help="append the records (failed checks too) to results/")
    sp.add_argument("--results", default="results", help="results directory")
    add_suite_args(sp)
    add_watchdog(sp)
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
    add_expect_sha256(sp)
    sp.add_argument("--tolerance", type=_fraction, default=DEFAULT_TOLERANCE,
                    help=f"GPU: allowed drop below baseline TFLOP/s (default {DEFAULT_TOLERANCE})")
    sp.add_argument("--baseline", help="GPU: baseline file (default goldens/baselines/<device>.json)")
    sp.add_argument("--update-baseline", action="store_true",
                    help="GPU: rewrite the baseline from this run (only if all steps pass)")
    sp.add_argument("--record", action="store_true", help="GPU: append the records")
    sp.add_argument("--results", default="results")
    sp.add_argument("-q", "--quiet", action="store_true")
    add_watchdog(sp)
    sp.set_defaults(fn=cmd_regress)

    sp = sub.add_parser("bundle", help="check an exported bundle as a GPU host does; print "
                                       "its digest or its verified wheels")
    sp.add_argument("dir", help="the bundle folder")
    add_expect_sha256(sp)
    sp.add_argument("--wheels", action="store_true",
                    help="print the bundle's wheels, each checked, for `pip install` (an "
                         "unlisted or changed wheel is refused)")
    sp.set_defaults(fn=cmd_bundle)


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
    torch.matmul in the same run (tirx_gemm.op.suite.bench_suite)."""
    from tirx_gemm.op import suite
    suite.load_suite(args.suite or None)  # a bad suite file fails before the GPU probe
    if args.target != suite.MATMUL:
        suite.target_step(args.target, args.arch)
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
    from tirx_gemm.op import cards
    import torch  # noqa: F401 - cards.from_device asks an imported torch for the GPU
    log = _progress_log(args)
    with cards.present() as card:  # matmul's picks for this GPU's card, not the fitted one's
        if args.target == suite.MATMUL:
            log(f"card: {(cards.assumed(args.bundle) if args.bundle else card).line()}")
        out = suite.bench_suite(args.suite or None, args.target, bundle=args.bundle,
                                log=log, results_dir=args.results, record=args.record)
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
    path = Path(args.expectations)
    old = regress.load_expectations(path)  # a bad file is refused before any build or write
    if old is None and not args.update:
        print(f"no expectations file {path}: create it with `tirx-gemm regress --cpu --update`")
        return 1
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
    if args.update:
        old = {**(old or {}), **actual}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(actual)} expectations to {path}")
        return 0
    expected = {k: v for k, v in old.items() if k in actual or not args.arch_given
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


