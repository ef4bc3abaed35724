#!/usr/bin/env python
"""Per-call cost of tirx_gemm.matmul against F.linear on the same tensors.

For each shape (bf16 by default: 1x4096x4096, 16x14336x4096, 77x7168x2048 and a few more)
it times, interleaved in one process, the median over --reps bursts of --calls back-to-back
calls of:

  F.linear           torch.nn.functional.linear(a, b): the target
  tirx_gemm.matmul   the callable module, eager (calls tirx_gemm.matmul.matmul directly)
  torch_op.matmul    tirx_gemm.torch_op.matmul: what tirx_gemm.nn.Linear calls (eager: direct)
  torch.ops          torch.ops.tirx_gemm.matmul(a, b): the custom op through the dispatcher
                     (the path torch.compile's graph takes)
  matmul(out=)       tirx_gemm.matmul into a preallocated output (the call path alone)
  new_empty          the output's allocation alone (what matmul adds to matmul(out=))
  bare launch        the loaded kernel called with prepared arguments, no checks (when it can
                     be reached: tirx_gemm.matmul.bare_launch, else the loaded handle)

eagerly, and inside CUDA graphs (--graph-calls calls captured per graph, replayed back to back)
for F.linear, tirx_gemm.matmul and torch.ops. Per call it reports the wall time of the burst
(host enqueue to GPU done), the host time to enqueue, and the GPU span from CUDA events; the
ratio is tirx wall time / F.linear wall time (the issue's target: <= 1.15 eagerly).

Every GPU wait spins on a CUDA event against a deadline (TIRX_GEMM_KERNEL_TIMEOUT, default
60 s) and ends the process with one line instead of hanging. Needs a CUDA GPU of arch sm_90a
or sm_100a and kernels: a bundle (TIRX_GEMM_BUNDLE=DIR, exported for these shapes) or TVM.

  TIRX_GEMM_BUNDLE=DIR python scripts/bench_overhead.py [--shapes 1x4096x4096,...]
      [--dtype bfloat16] [--calls 200] [--reps 15] [--graph-calls 50] [--no-record]
  python scripts/bench_overhead.py --print-suite > overhead_suite.json   # for the export

Records (one JSON line per shape and mode) are appended to lab/model_layers_in_torch/records/overhead.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_SHAPES = ("1x4096x4096,16x14336x4096,77x7168x2048,1x1024x4096,1x4096x14336,"
                  "128x6144x4096,1000x4096x4096,4096x4096x4096")
RESULTS = REPO / "lab" / "model_layers_in_torch" / "records"
HANG_EXIT = 3


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------
# waits that cannot hang, timing
# --------------------------------------------------------------------------------------
def timeout_s() -> float:
    try:
        from tirx_gemm.run.launcher import kernel_timeout
        return kernel_timeout()
    except Exception:  # noqa: BLE001 - a bad setting: the default, said once by the launcher
        return 60.0


def wait_event(ev, what: str) -> None:
    """Spin until ``ev`` completes; past the deadline, one line and exit (the GPU context is
    unusable after a hang, so nothing else is attempted)."""
    limit = timeout_s()
    deadline = time.monotonic() + limit
    while not ev.query():
        if time.monotonic() > deadline:
            print(f"{what}: the GPU did not finish within {limit:g} s (kernel hang?); exiting "
                  "(TIRX_GEMM_KERNEL_TIMEOUT sets the limit)", file=sys.stderr, flush=True)
            os._exit(HANG_EXIT)
    import torch
    torch.cuda.synchronize()  # returns at once now; raises a pending asynchronous error


def sync(what: str = "wait") -> None:
    import torch
    ev = torch.cuda.Event()
    ev.record()
    wait_event(ev, what)


def burst(fn, n: int, what: str) -> tuple[float, float, float]:
    """(wall, host, gpu) microseconds per call of ``n`` back-to-back calls of ``fn``."""
    import torch
    sync(what)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t_host = time.perf_counter() - t0
    e1.record()
    wait_event(e1, what)
    t_wall = time.perf_counter() - t0
    return t_wall * 1e6 / n, t_host * 1e6 / n, e0.elapsed_time(e1) * 1e3 / n


def interleaved(fns: dict, n: int, reps: int, what: str) -> dict:
    """{name: (wall, host, gpu) medians in us per call}: each rep runs one burst of each
    function, in a rotated order, so drift hits all of them alike."""
    names = list(fns)
    samples = {k: [] for k in names}
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            samples[k].append(burst(fns[k], n, f"{what} {k}"))
    return {k: tuple(statistics.median(s[i] for s in v) for i in range(3))
            for k, v in samples.items()}


def graphed(fn, calls: int, what: str):
    """A CUDA graph of ``calls`` calls of ``fn`` (warmed up on a side stream first, as
    torch.cuda.graphs asks), and a zero-argument replay."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    sync(f"{what} warm-up")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    sync(f"{what} capture")
    return g, g.replay


# --------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------
def environment() -> dict:
    import torch
    from tirx_gemm import settings
    from tirx_gemm.bundle_format import code_git_sha
    from tirx_gemm.gitinfo import git_sha
    bundle = settings.get("TIRX_GEMM_BUNDLE")
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_sha": (code_git_sha(Path(bundle)) if bundle else None) or git_sha(),
            "bundle": None if bundle is None else str(bundle)}


def append(records: list, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def max_rel_err(got, want) -> float:
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    out = []
    for part in text.split(","):
        try:
            m, n, k = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: {part!r} is not MxNxK") from None
        out.append((m, n, k))
    return out


def suite_json(shapes, dtype: str, name: str, model: str, layer_of=None) -> str:
    """A suite file (tirx_gemm/op/suite.py's format) listing ``shapes``, for `tirx-gemm export
    --suite FILE`."""
    entries = [{"M": m, "N": n, "K": k, "model": model,
                "layer": (layer_of(n, k) if layer_of else f"{n}x{k} weight"),
                "why": f"{m} tokens: a case {name} times"} for m, n, k in shapes]
    return json.dumps({"name": name, "description": f"the GEMMs scripts/{name}.py runs",
                       "dtypes": [dtype], "shapes": entries}, indent=1)


# --------------------------------------------------------------------------------------
# the bare launch of the loaded kernel
# --------------------------------------------------------------------------------------
def bare_launcher(a, b):
    """(zero-argument launch of the kernel tirx_gemm.matmul runs for (a, b), with prepared
    arguments and no checks, how it was reached) or (None, why not). Prefers
    tirx_gemm.matmul.bare_launch(a, b, out) if the module has one; else, after one call,
    takes the prepared call that matmul keeps for this shape (its _calls cache: the kernel
    and its workspace) and calls ``kernel(a, b, out, *workspace)``, as matmul's launch does.
    The result is checked against F.linear before the launch is trusted."""
    import torch
    import torch.nn.functional as F
    import tirx_gemm.matmul as mm
    out = torch.empty((a.shape[0], b.shape[0]), dtype=a.dtype, device=a.device)
    try:
        if hasattr(mm, "bare_launch"):
            launch, how = mm.bare_launch(a, b, out), "tirx_gemm.matmul.bare_launch"
        else:
            mm.matmul(a, b, sync=False)
            sync("bare launch probe")
            call = mm._calls[mm._fast_key(a, b, None, None)]
            kernel, ws = call.kernel, tuple(call.workspace)

            def launch():
                kernel(a, b, out, *ws)
            how = "the kernel and workspace of tirx_gemm.matmul's prepared call"
        out.fill_(float("nan"))
        launch()
        sync("bare launch check")
        err = max_rel_err(out, F.linear(a, b))
        if not err < 2e-2:
            return None, f"the bare call's result is off (max rel err {err:.3g})"
        return launch, how
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        return None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


# --------------------------------------------------------------------------------------
# the benchmark
# --------------------------------------------------------------------------------------
def bench_shape(shape, dtype_name: str, args, env: dict) -> list[dict]:
    import torch
    import torch.nn.functional as F
    import tirx_gemm
    import tirx_gemm.matmul as mm
    from tirx_gemm import torch_op
    M, N, K = shape
    dtype = getattr(torch, dtype_name)
    g = torch.Generator(device="cuda").manual_seed(M * 31 + N * 7 + K)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(N, K, device="cuda", dtype=dtype, generator=g) / K ** 0.5
    label = f"{M}x{N}x{K} {dtype_name}"
    t0 = time.perf_counter()
    ours = tirx_gemm.matmul(a, b)
    sync(f"{label} first call")
    err = max_rel_err(ours, F.linear(a, b))
    err_op = max_rel_err(torch_op.OP(a, b), F.linear(a, b))
    cap = torch.cuda.get_device_capability()
    arch = "sm_90a" if cap[0] == 9 else "sm_100a"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    step, kw = mm.choose(M, N, K, dtype_name, arch, sms)
    log(f"{label}: {step} {kw}, first call {1e3 * (time.perf_counter() - t0):.1f} ms, max rel "
        f"err {err:.2e} (op {err_op:.2e})")
    ok = err < 2e-2 and err_op < 2e-2
    base = {**env, "kind": "op_overhead", "M": M, "N": N, "K": K, "dtype": dtype_name,
            "step": step, "kwargs": kw, "max_rel_err": max(err, err_op), "verified": ok,
            "calls": args.calls, "reps": args.reps}
    if not ok:
        log(f"  {label}: result differs from F.linear: not timed")
        return [{**base, "mode": "none"}]

    pre = a.new_empty((M, N))  # the output of the two rows that show where the time goes
    fns = {"F.linear": lambda: F.linear(a, b),
           "tirx_gemm.matmul": lambda: tirx_gemm.matmul(a, b),
           "torch_op.matmul": lambda: torch_op.matmul(a, b),
           "torch.ops": lambda: torch_op.OP(a, b),
           # the call path without the output's allocation, and that allocation alone
           "matmul(out=)": lambda: tirx_gemm.matmul(a, b, out=pre),
           "new_empty": lambda: a.new_empty((M, N))}
    bare, how = bare_launcher(a, b)
    if bare is not None:
        fns["bare launch"] = bare
    else:
        log(f"  bare launch: not measured ({how})")
    for f in fns.values():  # warm-up
        for _ in range(10):
            f()
    sync(f"{label} warm-up")
    eager = interleaved(fns, args.calls, args.reps, label)
    records = [{**base, "mode": "eager", "bare_launch": how if bare else None,
                "us_per_call": {k: v[0] for k, v in eager.items()},
                "host_us_per_call": {k: v[1] for k, v in eager.items()},
                "gpu_us_per_call": {k: v[2] for k, v in eager.items()},
                "ratio_to_linear": {k: v[0] / eager["F.linear"][0] for k, v in eager.items()}}]
    print_rows(label, "eager", eager)

    if args.graph_calls:
        graphs, keep = {}, []
        for k in ("F.linear", "tirx_gemm.matmul", "torch.ops"):
            try:
                gr, replay = graphed(fns[k], args.graph_calls, f"{label} {k}")
            except Exception as exc:  # noqa: BLE001 - reported in the table
                log(f"  graph capture of {k} failed: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}")
                continue
            keep.append(gr)
            graphs[k] = replay
        reps_n = max(1, args.calls // args.graph_calls)
        per = interleaved(graphs, reps_n, args.reps, f"{label} graph")
        per = {k: tuple(x / args.graph_calls for x in v) for k, v in per.items()}
        lin = per.get("F.linear", (float("nan"),))[0]
        records.append({**base, "mode": "cuda_graph", "graph_calls": args.graph_calls,
                        "us_per_call": {k: v[0] for k, v in per.items()},
                        "host_us_per_call": {k: v[1] for k, v in per.items()},
                        "gpu_us_per_call": {k: v[2] for k, v in per.items()},
                        "ratio_to_linear": {k: v[0] / lin for k, v in per.items()}})
        print_rows(label, "graph", per)
        del keep
    return records


def print_rows(label: str, mode: str, res: dict) -> None:
    lin = res.get("F.linear", (float("nan"),))[0]
    for k, (wall, host, gpu) in res.items():
        log(f"  {label:<24} {mode:<6} {k:<17} wall {wall:8.2f} us  host {host:8.2f} us  "
            f"gpu {gpu:8.2f} us  x F.linear {wall / lin:6.3f}")


def table(records: list[dict]) -> str:
    head = ("shape", "dtype", "step", "mode", "F.linear us", "tirx_gemm.matmul", "torch_op",
            "torch.ops", "bare launch", "ratio tirx/F.linear")
    rows = [head]
    for r in records:
        if r["mode"] == "none":
            rows.append((f"{r['M']}x{r['N']}x{r['K']}", r["dtype"], r["step"], "WRONG RESULT",
                         "", "", "", "", "", ""))
            continue
        us = r["us_per_call"]

        def f(k):
            return f"{us[k]:.2f}" if k in us else "-"
        ratio = us.get("tirx_gemm.matmul", float("nan")) / us.get("F.linear", float("nan"))
        rows.append((f"{r['M']}x{r['N']}x{r['K']}", r["dtype"], r["step"], r["mode"],
                     f("F.linear"), f("tirx_gemm.matmul"), f("torch_op.matmul"),
                     f("torch.ops"), f("bare launch"), f"{ratio:.3f}"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated MxNxK")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--calls", type=int, default=200, help="back-to-back calls per burst")
    p.add_argument("--reps", type=int, default=15, help="bursts per variant (median)")
    p.add_argument("--graph-calls", type=int, default=50,
                   help="calls captured per CUDA graph (0: no graph timing)")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--out", default=str(RESULTS / "overhead.jsonl"))
    p.add_argument("--print-suite", "--print-shapes", dest="print_suite", action="store_true",
                   help="print the shapes as a suite file (tirx-gemm export --suite) and exit")
    args = p.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    if args.print_suite:
        print(suite_json(shapes, args.dtype, "bench_overhead", "bench_overhead"))
        return 0
    import torch
    if not torch.cuda.is_available():
        log("bench_overhead: no CUDA GPU here; run it on a GPU host (sm_90a or sm_100a)")
        return 2
    env = environment()
    log(f"{env['device']}, torch {env['torch']}, git {env['git_sha']}, bundle "
        f"{env['bundle'] or '(none: building here)'}")
    records = []
    t0 = time.perf_counter()
    for shape in shapes:
        try:
            records += bench_shape(shape, args.dtype, args, env)
        except (ValueError, TypeError, RuntimeError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log(f"{'x'.join(map(str, shape))}: not run: {msg}")
        log(f"  ({time.perf_counter() - t0:.0f} s so far)")
    log("\nper call, median of bursts of back-to-back calls (wall time: host enqueue to GPU "
        "done)\n" + table(records))
    if records and not args.no_record:
        append(records, Path(args.out))
        log(f"{len(records)} record(s) appended to {args.out}")
    return 0 if all(r.get("verified") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
