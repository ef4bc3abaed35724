"""`tirx-gemm list|build|choose|doctor|show`: the steps, what a build of them is, and the
kernel matmul picks for a shape (no GPU)."""

from __future__ import annotations

import sys
import time

from tirx_gemm import registry
from tirx_gemm.cli.common import (_build_progress, _build_row, _build_table, _cache_note,
                                  _mnk, _positive_int, _shape_dtype, _steps_arg, add_step_args,
                                  add_watchdog, build_legend, check_step_shape, get_step)
from tirx_gemm.kernels import dtype_kwargs
from tirx_gemm.numerics import DTYPES
from tirx_gemm.op.cards import CARDS
from tirx_gemm.progress import Progress


def register(sub) -> None:
    sp = sub.add_parser("list", help="list the steps")
    sp.add_argument("--arch", default=None, choices=registry.ARCHES)
    sp.add_argument("-v", "--verbose", action="store_true", help="also show constraints")
    sp.set_defaults(fn=cmd_list)

    sp = sub.add_parser("build", help="compile steps; print registers, smem, spills, key SASS")
    add_step_args(sp)
    sp.add_argument("--jobs", type=_positive_int, default=None,
                    help="parallel build processes (default: cores)")
    sp.add_argument("--no-cache", action="store_true", help="rebuild and replace cached builds")
    add_watchdog(sp)
    sp.set_defaults(fn=cmd_build)

    sp = sub.add_parser("choose", help="the kernel tirx_gemm.matmul runs for a shape, and "
                                       "why (no GPU, no TVM)")
    sp.add_argument("mnk", type=_mnk, metavar="M,N,K", help="the GEMM: D[M,N] = A[M,K] @ B[N,K].T")
    sp.add_argument("--dtype", choices=DTYPES, default=DTYPES[0],
                    help=f"operand dtype (default {DTYPES[0]})")
    sp.add_argument("--arch", default="sm_90a", choices=registry.ARCHES,
                    help="the GPU's arch (default sm_90a: the H200 the cost model was fitted on)")
    sp.add_argument("--sm-count", type=_positive_int, default=None,
                    help="the GPU's SMs (default: the card's, 132 on sm_90a)")
    sp.add_argument("--card", default=None, choices=sorted(CARDS) + ["auto"],
                    help="the card whose bandwidth the cost model takes (default: h200, the "
                         "card the model was fitted on; auto: the GPU present)")
    sp.add_argument("--layout", default="NN", choices=("NN", "NT", "TN", "TT"),
                    help="a's and b's layout: N row-major (K-major), T the transposed view of a "
                         "row-major tensor (v15 reads it in place on sm_90a; default NN)")
    sp.set_defaults(fn=cmd_choose)

    sp = sub.add_parser("doctor", help="show the CUDA toolchain a build uses (paths, versions)")
    sp.set_defaults(fn=cmd_doctor)

    sp = sub.add_parser("show", help="print a step's generated CUDA, SASS or TIR")
    add_step_args(sp, all_=False)
    g = sp.add_mutually_exclusive_group()
    for w in ("cuda", "sass", "tir"):
        g.add_argument(f"--{w}", dest="what", action="store_const", const=w)
    sp.add_argument("--full", action="store_true",
                    help="--cuda: the whole file (default: from the kernel on, without the "
                         "NVRTC/TVM prelude)")
    sp.set_defaults(fn=cmd_show)


def cmd_choose(args) -> int:
    from tirx_gemm.op.layouts import explain
    print(explain(*args.mnk, args.dtype, args.arch, args.sm_count, card=args.card,
                  layout=args.layout))
    return 0


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

