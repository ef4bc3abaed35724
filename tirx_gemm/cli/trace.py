"""`tirx-gemm trace`: record a timeline (run/), write its files (report/), or redraw a PNG."""

from __future__ import annotations

from pathlib import Path

from tirx_gemm import registry, spec
from tirx_gemm.cli.common import _mnk
from tirx_gemm.report import timeline_files as TF
from tirx_gemm.report import timeline_view as TV


def register(sub) -> None:
    p = sub.add_parser(
        "trace", help="record an in-kernel timeline on this GPU (sm_90a): Perfetto JSON, "
                      "Gantt PNG, summary",
        description="Check an instrumented build of a step once on this GPU, launch it again "
                    "and write <out>/<step>_<arch>_<M>x<N>x<K>.json (Chrome trace events of "
                    "the first CTAs around the first tile boundary: ui.perfetto.dev opens "
                    "it), .png (its Gantt chart) and .txt (the whole run summarised, with "
                    "the instrumented kernel's time against the plain build's when there is "
                    "one). sm_100a has no timeline: its steps run only on NumSim, which has "
                    "no clock. Given a recorded .json instead of a step, draw its Gantt PNG "
                    "beside it (where matplotlib is installed; no GPU).")
    last = registry.all_steps("sm_90a")[-1].id  # sm_90a v4 on publish the set-up a trace needs
    p.add_argument("step", help=f"step id, v4 .. {last} (or a recorded trace .json: redraw "
                                "its PNG)")
    p.add_argument("--arch", default="sm_90a", choices=registry.ARCHES)
    p.add_argument("--mnk", type=_mnk, default=None,
                   help="problem shape M,N,K (default: the step's canonical shape)")
    p.add_argument("--dtype", default="float16", choices=spec.DTYPES)
    p.add_argument("--out", default=str(TF.TIMELINES_DIR),
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
    p.set_defaults(fn=cmd_trace)


def cmd_trace(args) -> int:
    """`tirx-gemm trace vN`: :func:`trace_main` (torch, a Hopper GPU); `tirx-gemm trace
    FILE.json`: the Gantt PNG of a recorded trace, written beside it."""
    if str(args.step).endswith(".json"):
        trace = TV.load_chrome_trace(args.step)
        other = trace.get("otherData", {})
        win = other.get("window_us")
        print(TF.gantt_png(trace, Path(args.step).with_suffix(".png"), window=win,
                           title=TF._title(other, win) if win else None))
        return 0
    return trace_main(args)


def trace_main(args) -> int:
    """`tirx-gemm trace vN`: record the step's timeline on this GPU (run.trace.record_step:
    check, launch, time), decode the buffer and write the JSON, PNG and summary
    (report.timeline_files.write_outputs); print the summary. Returns the exit status."""
    from tirx_gemm.run import trace  # timeline + registry at import; torch when it runs
    got = trace.record_step(args)
    if got is None:
        return 1
    words, meta, timing = got
    tl = TV.decode(words)
    stem = TF.trace_name(meta["step"], meta["arch"], meta["M"], meta["N"], meta["K"],
                         meta["dtype"])
    js, png, txt = TF.write_outputs(tl, Path(args.out), stem, meta, timing=timing,
                                    ctas=args.ctas)
    print(Path(txt).read_text())
    print(f"wrote {js} (open it in ui.perfetto.dev), " + (f"{png} and " if png else "")
          + f"{txt}")
    return 0
