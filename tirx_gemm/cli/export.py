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


def _cards_arg(text: str) -> tuple[str, ...]:
    """--card's value (tirx_gemm.op.cards.card_keys), checked before any build."""
    import argparse
    from tirx_gemm.op import cards
    if "auto" in text.lower():  # the GPU here: torch, if this machine has it, sees it
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
    try:
        return cards.card_keys(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--card ")) from None


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
    sp.add_argument("--card", default=None, type=_cards_arg, metavar="CARDS",
                    help="with --suite: the cards whose picks the bundle gets, comma-separated: "
                         "h100, h200, all, auto (the GPU here); default h200, the card matmul "
                         "assumes unless told. The bundle records them (cards.json): on a GPU "
                         "of a card every suite export was made for, matmul chooses for it")
    sp.add_argument("--pdl-twins", action="store_true",
                    help="with --suite: also each short kernel's twin without PDL's launch "
                         "attribute, for tirx_gemm.op.launch_site's modes 'site' and 'never' "
                         "(off by default: matmul launches the picks as built)")
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
    if args.card is not None and args.suite is None:
        raise ValueError("--card adds the kernels the chooser picks on a card for a suite: "
                         "use it with --suite FILE (named steps export exactly those)")
    from tirx_gemm.op.keywords import MENU_ARCHES
    if args.card is not None and args.arch not in MENU_ARCHES:
        raise ValueError(f"--card names {', '.join(MENU_ARCHES)} cards (the H100, the H200); "
                         f"on --arch {args.arch} the chooser has no card: leave --card out")
    if args.suite is not None:  # the kernels `bench --suite` / tirx_gemm.matmul will ask for
        from tirx_gemm import splitk
        from tirx_gemm.op import cards
        sms = args.num_sms or splitk.DEFAULT_SM_COUNT[args.arch]
        keys = args.card or (cards.FITTED_ON,)
        reqs = suite_requests(args.suite or None, args.target, args.arch, sms, keys,
                              twins=args.pdl_twins)
        previous = cards.read_record(out)
        had_kernels = (out / bundle_format.MANIFEST).exists()
        n = bundle.export(reqs, out, jobs=args.jobs, progress=not args.quiet,
                          ffi_wheel_python=args.ffi_wheel, watchdog_ms=args.watchdog_ms)
        what = {"suite": str(args.suite or "tirx_gemm/op/suites/models.json"),
                "target": args.target, "arch": args.arch, "sm_count": sms, "kernels": n}
        cards.record_export(out, keys, what, previous, had_kernels)
        digest = bundle_format.manifest_sha256(out)
        held = ", ".join(cards.bundle_cards(out)) or "no one card"
        print(f"exported {n} kernels for the suite ({args.target}, {sms} SMs, the picks of "
              f"{', '.join(keys)}; the bundle is for {held}) to {out}/ "
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


def suite_requests(path, target: str, arch: str, sm_count: int, keys,
                   twins: bool = False) -> list[tuple]:
    """suite.export_requests of the suite at ``path`` (None: the packaged one) for each card
    of ``keys`` (tirx_gemm.op.cards.CARDS: each card's picks, planned as if matmul assumed it),
    each kernel once, in order; with ``twins`` a kernel with a launch-site twin
    (tirx_gemm.op.launch_site) is followed by its twin."""
    from tirx_gemm.op import cards, launch_site, suite
    loaded = suite.load_suite(path)
    out, seen = [], set()
    for key in keys:
        with cards.assuming(key):
            for step, mnk, kwargs in suite.export_requests(loaded, target, arch, sm_count):
                for kw in (kwargs, twins and launch_site.twin_kwargs(step.id, kwargs)):
                    ident = kw and (step.key, tuple(mnk), tuple(sorted(kw.items())))
                    if ident and ident not in seen:
                        seen.add(ident)
                        out.append((step, mnk, kw))
    return out
