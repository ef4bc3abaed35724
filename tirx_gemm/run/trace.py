"""``tirx-gemm trace``: record an in-kernel timeline on a Hopper GPU, and export the bundles
it runs from.

The build side (the hooks the verbs call, the buffer format) and everything that turns a
buffer into files (decode, the window kept, Chrome trace JSON, Gantt PNG, summary) are in
:mod:`tirx_gemm.timeline`, which imports no other tirx_gemm module. This module is the part
that needs the registry, bundles and the run side (torch when it runs, never TVM on a
bundle): :func:`trace_main` checks an instrumented build once against the fp32 reference,
launches it again on a zeroed timeline buffer, decodes it, times it against the plain build
(alternating launches, CUDA events, inputs rotated past L2) and writes the three files.

``python -m tirx_gemm.run.trace`` has three subcommands: ``trace`` (as ``tirx-gemm trace``),
``export`` (instrumented and plain builds of steps into one bundle; TVM, here) and ``png``
(draw a recorded JSON's chart where matplotlib is installed).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tirx_gemm import spec
from tirx_gemm import timeline as TL
from tirx_gemm.timeline import KWARG, buffer_specs, decode, plain_kwargs


def _trace_arguments(p):
    from tirx_gemm import registry
    p.add_argument("step", help="step id, v4 .. v10")
    p.add_argument("--arch", default="sm_90a", choices=registry.ARCHES)
    p.add_argument("--mnk", type=_parse_mnk, default=None,
                   help="problem shape M,N,K (default: the step's canonical shape)")
    p.add_argument("--dtype", default="float16", choices=spec.DTYPES)
    p.add_argument("--out", default=str(TL.TIMELINES_DIR),
                   help="folder for the .json, .png and .txt (default: results/timelines)")
    p.add_argument("--bundle", default=None,
                   help="take the kernels from a bundle exported with --timeline (no TVM "
                        "needed here); without it the step is built here")
    p.add_argument("--expect-sha256", metavar="HEX", default=None,
                   help="with --bundle: refuse the bundle unless its manifest's sha256 is HEX "
                        "(the digest `tirx-gemm export` printed)")
    p.add_argument("--ctas", type=int, default=4,
                   help="CTAs kept in the JSON and drawn (default 4: the first two clusters)")
    p.add_argument("--no-timing", action="store_true",
                   help="skip timing the instrumented kernel against the plain one")
    p.set_defaults(fn=trace_main)
    return p


def add_trace_parser(subparsers):
    """The ``trace`` subcommand (cli.make_parser adds it next to the others)."""
    p = subparsers.add_parser(
        "trace", help="record an in-kernel timeline on this GPU (sm_90a): Perfetto JSON, "
                      "Gantt PNG, summary",
        description="Check an instrumented build of a step once on this GPU, launch it again "
                    "and write <out>/<step>_<arch>_<M>x<N>x<K>.json (Chrome trace events of "
                    "the first CTAs around the first tile boundary: ui.perfetto.dev opens "
                    "it), .png (its Gantt chart) and .txt (the whole run summarised, with "
                    "the instrumented kernel's time against the plain build's when there is "
                    "one). sm_100a has no timeline: its steps run only on NumSim, which has "
                    "no clock.")
    return _trace_arguments(p)


def _parse_mnk(value):
    if isinstance(value, (tuple, list)):
        mnk = tuple(int(x) for x in value)
    else:
        try:
            mnk = tuple(int(x) for x in str(value).split(","))
        except ValueError:
            mnk = ()
    if len(mnk) != 3 or min(mnk) < 1:
        raise ValueError(f"--mnk {value!r}: expected three positive integers M,N,K")
    return mnk


def trace_main(args) -> int:
    """``tirx-gemm trace vN``: check the instrumented kernel once (fresh inputs, D poisoned,
    compared with the fp32 reference), launch it again on a zeroed timeline buffer, decode
    the buffer; time it against the plain build (the bundle's, or built here) unless
    --no-timing; write the JSON, PNG and summary. Returns the exit status."""
    from tirx_gemm import registry
    if args.arch == "sm_100a":
        raise ValueError("trace: sm_100a runs only on NumSim here, which has no clock: there "
                         "is no timeline to record (use --arch sm_90a on a Hopper GPU)")
    step = registry.get(args.step, args.arch)
    M, N, K = _parse_mnk(args.mnk) if args.mnk else step.canonical
    import torch
    from tirx_gemm.run import device
    from tirx_gemm.run import loader
    info = device.check_device(step.arch, None)
    dev = torch.device("cuda", info["index"])
    lib, plain_lib, kwargs = _kernels(step, (M, N, K), args.dtype, args.bundle,
                                      info["sm_count"], timed=not args.no_timing)
    kernel = loader.load_kernel(str(lib))
    plain = None if (plain_lib is None or args.no_timing) else loader.load_kernel(str(plain_lib))
    got = record(kernel, step, M, N, K, kwargs, dev, plain=plain, timed=not args.no_timing)
    if got is None:
        return 1
    tl, timing = got
    meta = {"step": step.id, "arch": step.arch, "M": M, "N": N, "K": K,
            "dtype": step.dtype(kwargs), "build_kwargs": kwargs, "device": info["name"],
            "sm_count": info["sm_count"], "lesson": step.lesson}
    stem = TL.trace_name(step.id, step.arch, M, N, K, step.dtype(kwargs))
    js, png, txt = TL.write_outputs(tl, Path(args.out), stem, meta, timing=timing,
                                    ctas=args.ctas)
    print(Path(txt).read_text())
    print(f"wrote {js} (open it in ui.perfetto.dev), " + (f"{png} and " if png else "")
          + f"{txt}")
    return 0


def _inputs_for_timing(M, N, K, dtype, dev):
    from tirx_gemm.run import checking
    from tirx_gemm.run import timing
    from tirx_gemm.run.device import l2_bytes
    n = timing.n_sets_for_l2(2 * (M * K + N * K + M * N), l2_bytes(dev))
    sets = []
    for _ in range(n):
        inp = checking.make_inputs(M, N, K, kind="random", device=dev, dtype=dtype)
        sets.append((inp.A, inp.B, inp.D))
    return sets


def record(kernel, step, M: int, N: int, K: int, kwargs: dict, dev, *, plain=None,
           timed: bool = True, warm: int = 3, iters: int = 40):
    """Check the instrumented ``kernel`` once (fresh random inputs, D poisoned, compared with
    the fp32 reference; None and a line on stderr when it fails), warm it up, launch it
    once more on a zeroed timeline buffer and decode that buffer. ``timed``: then time it
    (CUDA events, inputs rotated past L2), alternating with ``plain`` (the same step's
    normal build) when given. The step's own workspace operands (if any) come first, the
    timeline buffer last. Returns (Timeline, timing dict)."""
    import torch
    from tirx_gemm.run import checking
    from tirx_gemm.run import launcher
    meta = launcher.BuildMeta(step=step.id, arch=step.arch, M=M, N=N, K=K,
                              kwargs=plain_kwargs(kwargs))
    workspace = launcher.make_workspace(launcher.workspace_specs(meta, step), dev)
    ws = tuple(t for _, t in workspace)
    (_, shape, _), = buffer_specs(M, N, K, plain_kwargs(kwargs),
                                  persistent=step.sm_count_kwarg is not None)
    tlbuf = torch.zeros(shape, dtype=torch.int64, device=dev)

    def run(A, B, D):
        launcher.validate_inputs(A, B, D, M, N, K, dtype=meta.dtype)
        tlbuf.zero_()
        kernel(A, B, D, *ws, tlbuf)

    label = launcher.label(meta) + " (timeline build)"
    with launcher.hang_label(label):
        rep = checking.check(kernel, M, N, K, launch=run, kinds=("random",), device=dev,
                             dtype=meta.dtype, workspace=workspace)
        if not rep["ok"]:
            print(f"{label}: failed its check; no trace written", file=sys.stderr)
            return None
        inp = checking.make_inputs(M, N, K, kind="random", device=dev, dtype=meta.dtype)
        for _ in range(warm):  # clocks up, code and TMA descriptors cached
            run(inp.A, inp.B, inp.D)
        launcher.synchronize(label, dev)
        run(inp.A, inp.B, inp.D)
        launcher.synchronize(label, dev)
        tl = decode(tlbuf)
        timing = {}
        if timed:
            from tirx_gemm.run import timing as TM
            sets = _inputs_for_timing(M, N, K, meta.dtype, dev)
            fns = {"timeline": lambda A, B, D: kernel(A, B, D, *ws, tlbuf)}
            if plain is not None:  # the timeline buffer is rewritten, not re-zeroed: the
                fns["plain"] = lambda A, B, D: plain(A, B, D, *ws)  # cursors restart at 0
            res = TM.bench_interleaved(fns, sets, iters=iters, rounds=2)
            launcher.synchronize(label, dev)
            timing = {"timeline_ms": res["timeline"].median_ms, "iters": iters,
                      "plain_ms": res["plain"].median_ms if "plain" in res else None}
    return tl, timing


def _kernels(step, mnk, dtype: str, bundle, sm_count: int, *, timed: bool):
    """(the instrumented build of step at mnk and dtype, its plain build or None, the
    instrumented build's keywords): from the bundle (tirx_gemm.kernels.kernel_for, which
    verifies it first; the plain build only if the bundle has it) or built here."""
    from tirx_gemm.bundle_format import KernelNotInBundle
    from tirx_gemm.kernels import kernel_for
    if not bundle:
        lib, meta, _ = kernel_for(step, mnk, sm_count=sm_count, dtype=dtype, timeline=True)
        plain = None if not timed else kernel_for(step, mnk, sm_count=sm_count, dtype=dtype)[0]
        return lib, plain, dict(meta["kwargs"])
    try:
        lib, entry, _ = kernel_for(step, mnk, bundle, dtype=dtype, timeline=True)
    except KernelNotInBundle:
        raise ValueError(f"bundle {bundle} has no timeline build of {step.key} at "
                         f"{'x'.join(map(str, mnk))} {dtype} (export it with "
                         f"`tirx-gemm export {step.id} --arch {step.arch} --mnk "
                         f"{','.join(map(str, mnk))} --timeline ...`)") from None
    try:
        plain = kernel_for(step, mnk, bundle, kwargs=plain_kwargs(entry.get("kwargs")))[0]
    except KernelNotInBundle:
        plain = None
    return lib, plain, dict(entry["kwargs"])


# ---------------------------------------------------------------------------------------
# `python -m tirx_gemm.run.trace`: trace (as tirx-gemm trace), export (TVM, here), png
# ---------------------------------------------------------------------------------------
def export_bundle(step_ids, mnk, out, *, arch: str = "sm_90a", num_sms: int = spec.SM_COUNT["sm_90a"],
                  dtype: str = "float16", plain: bool = True, jobs=None,
                  ffi_wheel_python: str | None = None, progress: bool = True) -> int:
    """Export the instrumented builds of ``step_ids`` at ``mnk`` (and, with ``plain``, their
    normal builds, for the cost figure) into the bundle ``out`` for `trace --bundle`."""
    from tirx_gemm import registry
    from tirx_gemm.compile import bundle
    reqs = []
    for sid in step_ids:
        step = registry.get(sid, arch)
        kw = step.with_sm_count(num_sms)
        if dtype != "float16":
            kw["dtype"] = dtype
        reqs.append((step, tuple(mnk), {**kw, KWARG: True}))
        if plain:
            reqs.append((step, tuple(mnk), dict(kw)))
    return bundle.export(reqs, Path(out), jobs=jobs, progress=progress,
                         ffi_wheel_python=ffi_wheel_python)


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m tirx_gemm.run.trace")
    sub = p.add_subparsers(dest="cmd", required=True)
    _trace_arguments(sub.add_parser("trace", help="as `tirx-gemm trace`"))
    ex = sub.add_parser("export", help="instrumented + plain builds of steps into a bundle")
    ex.add_argument("steps", nargs="+")
    ex.add_argument("--mnk", type=_parse_mnk, default=(4096, 4096, 4096))
    ex.add_argument("--arch", default="sm_90a")
    ex.add_argument("--num-sms", type=int, default=spec.SM_COUNT["sm_90a"])
    ex.add_argument("--dtype", default="float16", choices=spec.DTYPES)
    ex.add_argument("--no-plain", action="store_true")
    ex.add_argument("--out", required=True)
    ex.add_argument("--jobs", type=int, default=None)
    ex.add_argument("--ffi-wheel", metavar="PYVER", default=None,
                    help="also put the apache-tvm-ffi wheel for this Python into the bundle")
    ex.add_argument("-q", "--quiet", action="store_true")
    pn = sub.add_parser("png", help="draw the Gantt PNG of a recorded trace JSON beside it")
    pn.add_argument("json", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "trace":
        return trace_main(args)
    if args.cmd == "png":
        for js in args.json:
            trace = TL.load_chrome_trace(js)
            other = trace.get("otherData", {})
            win = other.get("window_us")
            print(TL.gantt_png(trace, Path(js).with_suffix(".png"), window=win,
                               title=TL._title(other, win) if win else None))
        return 0
    n = export_bundle(args.steps, args.mnk, args.out, arch=args.arch, num_sms=args.num_sms,
                      dtype=args.dtype, plain=not args.no_plain, jobs=args.jobs,
                      ffi_wheel_python=args.ffi_wheel, progress=not args.quiet)
    print(f"exported {n} kernels to {args.out}")
    return 0


__all__ = ["add_trace_parser", "trace_main", "record", "export_bundle", "main"]

if __name__ == "__main__":
    sys.exit(main())
