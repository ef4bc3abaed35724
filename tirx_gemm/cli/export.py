"""`tirx-gemm export`: build kernels into a bundle for a GPU host without TVM."""

from __future__ import annotations

from pathlib import Path

from tirx_gemm.cli.common import (_positive_int, _shapes, _steps_arg, _suite_conflicts,
                                  add_step_args, add_suite_args, add_watchdog, check_step_shape)
from tirx_gemm.numerics import DTYPES


def _python_version(text: str) -> str:
    """--ffi-wheel's PYVER, checked before any build (pip download runs after them)."""
    import re
    m = re.fullmatch(r"3\.(\d{1,2})", text.strip())
    if m is None or int(m.group(1)) < 9:
        import argparse
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPython version of the GPU "
                                         f"host's python3 (3.9 or later, e.g. 3.12)")
    return text.strip()


def register(sub) -> None:
    sp = sub.add_parser("export", help="build + bundle kernels for a GPU host without TVM")
    add_step_args(sp)
    sp.add_argument("--shapes", default="canonical", type=_shapes,
                    help="canonical | test | bench | all (registry shape lists) or explicit "
                         "shapes 'M,N,K;M,N,K' (default: canonical; ignored with --mnk)")
    sp.add_argument("--out", default="build/bundle", help="bundle directory")
    sp.add_argument("--jobs", type=_positive_int, default=None)
    sp.add_argument("--num-sms", type=_positive_int, default=None,
                    help="SM count for persistent steps (default: the step's default)")
    sp.add_argument("--ffi-wheel", metavar="PYVER", default=None, type=_python_version,
                    help="also download the apache-tvm-ffi wheel for this Python (e.g. 3.12) "
                         "into the bundle, for a GPU host without network")
    sp.add_argument("--timeline", action="store_true",
                    help="instrumented builds for `tirx-gemm trace` (sm_90a v4 on): "
                         "every role records its event times into an extra operand; "
                         "never picked by run/bench/regress")
    add_suite_args(sp)
    add_watchdog(sp)
    sp.set_defaults(fn=cmd_export, dtype=None, shapes=None)  # None: not given (cmd_export)


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
        from tirx_gemm.op import suite
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
