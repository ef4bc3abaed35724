"""``tirx-gemm trace``'s run side: record an in-kernel timeline on a Hopper GPU.

The build side (the hooks the verbs call, the buffer format) and everything that turns a
buffer into files (decode, the window kept, Chrome trace JSON, Gantt PNG, summary) are in
:mod:`tirx_gemm.timeline`, which imports no other tirx_gemm module. This module is the part
that needs the registry, bundles and the run side (torch when it runs, never TVM on a
bundle): :func:`trace_main` checks an instrumented build once against the fp32 reference,
launches it again on a zeroed timeline buffer, decodes it, times it against the plain build
(alternating launches, CUDA events, inputs rotated past L2) and writes the three files.

The command line is tirx_gemm/cli/trace.py (``tirx-gemm trace``; its kernels are exported
with ``tirx-gemm export --timeline``, their plain builds for the cost figure by the same
export without --timeline; ``tirx-gemm trace FILE.json`` redraws a recorded trace's PNG).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tirx_gemm import timeline as TL
from tirx_gemm.timeline import buffer_specs, decode, plain_kwargs


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


__all__ = ["trace_main", "record"]
