"""``tirx-gemm trace``'s run side: record an in-kernel timeline on a Hopper GPU (raw buffer).

The build side (the hooks the verbs call, the buffer format) is :mod:`tirx_gemm.timeline`,
which imports no other tirx_gemm module; what turns a buffer into files (decode, the
window kept, Chrome trace JSON, Gantt PNG, summary) is in report/
(:mod:`tirx_gemm.report.timeline_view`, :mod:`tirx_gemm.report.timeline_files`), which
this module does not import (run/ and report/ stay apart). This module is the part that
needs the registry, bundles and the run side (torch when it runs, never TVM on a bundle):
:func:`record_step` checks an instrumented build once against the fp32 reference,
launches it again on a zeroed timeline buffer, keeps a copy of that buffer, times it
against the plain build (alternating launches, CUDA events, inputs rotated past L2) and
returns the raw buffer, the run's metadata and the timing.

The command line is tirx_gemm/cli/trace.py (``tirx-gemm trace``: it decodes what this
returns and writes the three files; its kernels are exported with ``tirx-gemm export
--timeline``, their plain builds for the cost figure by the same export without
--timeline; ``tirx-gemm trace FILE.json`` redraws a recorded trace's PNG).
"""

from __future__ import annotations

import sys

from tirx_gemm.timeline import buffer_specs, plain_kwargs


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


def record_step(args):
    """``tirx-gemm trace vN``'s recording: check the instrumented kernel once (fresh inputs,
    D poisoned, compared with the fp32 reference), launch it again on a zeroed timeline
    buffer; time it against the plain build (the bundle's, or built here) unless
    --no-timing. Returns None when the check failed (a line on stderr), else (the timeline
    buffer's words on the CPU, the run's metadata, the timing dict)."""
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
        return None
    words, timing = got
    meta = {"step": step.id, "arch": step.arch, "M": M, "N": N, "K": K,
            "dtype": step.dtype(kwargs), "build_kwargs": kwargs, "device": info["name"],
            "sm_count": info["sm_count"], "lesson": step.lesson}
    return words, meta, timing


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
    once more on a zeroed timeline buffer and copy that buffer to the CPU. ``timed``: then
    time it (CUDA events, inputs rotated past L2), alternating with ``plain`` (the same
    step's normal build) when given; those launches rewrite the buffer, not the copy. The
    step's own workspace operands (if any) come first, the timeline buffer last. Returns
    (the copy: an int64 CPU tensor, which report.timeline_view.decode reads; timing dict)."""
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
        words = tlbuf.detach().cpu().clone()  # the launch above, before timing rewrites it
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
    return words, timing


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


__all__ = ["record_step", "record"]



if __name__ == "__main__":
    # the entry before `tirx-gemm trace` (`python -m tirx_gemm.run.trace png PATH`):
    # say what replaced it (run/ does not import the command line above it)
    _argv = sys.argv[1:]
    _argv = _argv[1:] if _argv[:1] == ["png"] else _argv
    print(f"tirx-gemm: error: `python -m tirx_gemm.run.trace` is now `tirx-gemm trace`: run "
          f"`tirx-gemm trace {' '.join(_argv) or 'PATH'}` (PATH a recorded .json: its Gantt "
          f"PNG is drawn beside it; a step id: record its timeline on this GPU)",
          file=sys.stderr)
    raise SystemExit(2)
