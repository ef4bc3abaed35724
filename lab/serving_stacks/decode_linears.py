"""Each Linear of a generation model's decode step under CUDA graphs: tirx_gemm.matmul's pick against F.linear.

For every (N, K) of one decoder layer and the LM head of a model of generate_bench.py (``layer_shapes``), at
M = --tokens (decode at batch 1, 8, 32), bf16: the CUDA-graph time per call of F.linear and of
tirx_gemm.matmul, without a bias and, for the layers that have one (Qwen's q/k/v projections), with it
(F.linear's bias, cuBLASLt's epilogue; matmul's fused v12 epilogue; and matmul then a separate add, what the
patched layer runs where the epilogue is not fused). Each path's graph holds --calls back-to-back calls; the
graphs are replayed in alternating order (tirx_gemm.op.fp8_bench.graph_times, median of its rounds). Before
timing, one eager call per path runs under torch.profiler with a gap after it, so the record names the GPU
kernels each path launched (cuBLAS's nvjet / cutlass names, tirx's ``tirx_v12_...``) and matmul's
``explain`` line. A record per (model, M, layer, bias): ``us`` per path and ``tirx_over_torch``
(F.linear's time / matmul's: above 1 where tirx is faster). --bias-tile adds, with a bias, v12's non-swap
bias tile (``matmul(..., step="v12")``: the epilogue rule's model-best one-CTA tile), which matmul's
swap-AB bias kernel (rule swap_ab_bias) replaced at decode; a bundle holds it where its suite lists
``"epilogue_steps": ["v12"]`` (suites/decode_bias_tiles.json). --rotate: each call of a graph reads the next of
enough copies of the weight to hold ROTATE_BYTES (twice an H100's 50 MB L2), as a model's decode step reads
each layer's weight from HBM; without it one weight is repeated and stays in the L2 where it fits. --arena-ab adds
matmul's call captured without the capture arena of tirx_gemm/run/workspace.py ("tirx fill").

    TIRX_GEMM_BUNDLE=B python3 lab/serving_stacks/decode_linears.py --models qwen0.5b --out F.jsonl
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

ROTATE_BYTES = 100 * 2**20  # --rotate: the weight copies a graph cycles through, in bytes
GAP_S = 0.002  # host sleep between the profiled calls: their kernels fall in separate time windows


def kernel_names(torch, paths: dict) -> dict:
    """{path: [kernel names]}: one eager call per path under torch.profiler, grouped by time gaps."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for fn in paths.values():
            fn()
            torch.cuda.synchronize()
            time.sleep(GAP_S)
    cuda = torch.autograd.DeviceType.CUDA
    try:
        ev = sorted((e.start_ns() / 1e3, e.duration_ns() / 1e3, e.name())
                    for e in prof.profiler.kineto_results.events() if e.device_type() == cuda)
    except AttributeError:
        ev = sorted((e.time_range.start, e.time_range.elapsed_us(), e.name)
                    for e in prof.events() if e.device_type == cuda)
    return group_by_gaps(ev, list(paths), GAP_S * 1e6 / 2)


def without_arena(f, w):
    """f(w) with the device's capture arena out of reach (run/workspace.py), so that a call
    captured here zeroes its counters by a fill in the graph; the arena put back after."""
    import warnings
    from tirx_gemm.run import workspace as W
    import torch
    dev = torch.cuda.current_device()
    held = W._arenas.get(dev)
    W._arenas[dev] = W.Arena(torch.empty(0, dtype=torch.int32, device="cuda"))
    W._spent_warned.add(dev)  # (no warning: this empty arena is the point)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return f(w)
    finally:
        if held is not None:
            W._arenas[dev] = held
        else:  # none was made yet: the next eager call makes the real one
            W._arenas.pop(dev, None)
        W._spent_warned.discard(dev)


def group_by_gaps(events, names, gap_us: float) -> dict:
    """(start us, duration us, kernel name) events sorted by start -> {names[i]: the kernels of
    the i-th run of activity, runs split where the GPU idled over ``gap_us``}; every name "?"
    when the runs do not number one per name (nothing is guessed)."""
    groups, last = [], None
    for start, dur, name in events:
        if last is None or start - last > gap_us:
            groups.append([])
        groups[-1].append(name[:120])
        last = start + dur
    if len(groups) != len(names):
        return {n: ["?"] for n in names}
    return dict(zip(names, groups))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen0.5b")
    ap.add_argument("--tokens", default="1,8,32")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--between", action="store_true",
                    help="a one-element torch add after every call in the graphs (and alone, "
                         "timed the same way and subtracted: ``us``): each GEMM then follows a "
                         "kernel that does not overlap its start (programmatic dependent launch), "
                         "as in a model's decode step, not its own previous call")
    ap.add_argument("--bias-tile", action="store_true",
                    help="with a bias, also v12's non-swap bias tile (matmul(..., step='v12')), "
                         "if the bundle holds it")
    ap.add_argument("--bias-only", action="store_true", help="only the layers with a bias")
    ap.add_argument("--suite", default=None,
                    help="time a suite's shapes (model, layer, M, N, K; a bias where it lists an "
                         "epilogue) instead of --models x --tokens")
    ap.add_argument("--arena-ab", action="store_true",
                    help="also matmul's call captured without the capture arena (its counters "
                         "zeroed by a fill in the graph, as before the arena): 'tirx fill'")
    ap.add_argument("--rotate", action="store_true",
                    help="each call reads the next of ROTATE_BYTES of weight copies (from HBM)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    import tirx_gemm.matmul as mm
    from tirx_gemm.op.fp8_bench import graph_times
    from generate_bench import layer_shapes
    from gpu_host import linear_operands, start

    t0 = time.time()
    _, card, out = start(torch, args.out)
    if args.suite:  # the suite's shapes, in its order: (model, M, [(N, K, layer, bias)])
        doc = json.loads(Path(args.suite).read_text())
        work = [(e["model"], e["M"], [(e["N"], e["K"], e["layer"], bool(e.get("epilogues")))])
                for e in doc["shapes"]]
    else:
        work = [(model, int(M), layer_shapes(model)) for model in args.models.split(",")
                for M in args.tokens.split(",")]
    for model, M, shapes in work:
        for N, K, layer, has_bias in shapes:
            if args.bias_only and not has_bias:
                continue
            if time.time() - t0 > args.budget_s:
                print(f"budget spent: {model} M={M} {layer} and later not run", flush=True)
                return 0
            a, w, b = linear_operands(torch, M, N, K, M * 7 + N)
            copies = -(-ROTATE_BYTES // (N * K * 2)) if args.rotate else 1
            ws = [w] + [linear_operands(torch, M, N, K, M * 7 + N + j)[1] for j in range(1, copies)]
            calls = max(args.calls, copies)
            for bias in ((False, True) if has_bias else (False,)):
                rec = {"card": card, "torch": torch.__version__, "kind": "decode_linear",
                       "between": args.between, "weights": copies,
                       "model": model, "layer": layer, "M": M, "N": N, "K": K, "bias": bias,
                       "calls": calls}
                if bias:
                    paths = {"F.linear": lambda w: F.linear(a, w, b),
                             "tirx": lambda w: mm.matmul(a, w, b),
                             "tirx+add": lambda w: mm.matmul(a, w).add_(b)}
                    if args.bias_tile:  # v12's non-swap bias tile, if exported
                        try:
                            y = mm.matmul(a, w, b, step="v12", sync=True)
                            paths["tirx bias tile"] = lambda w: mm.matmul(a, w, b, step="v12")
                            rec["bias_tile_max_abs_err"] = round(float(
                                (y.float() - F.linear(a, w, b).float()).abs().max()), 5)
                        except Exception as e:  # noqa: BLE001 - not in the bundle: noted
                            print(f"bias tile not run: {str(e).splitlines()[0][:200]}")
                else:
                    paths = {"F.linear": lambda w: F.linear(a, w), "tirx": lambda w: mm.matmul(a, w)}
                if args.arena_ab:  # the same call, captured with a fill of its own counters
                    paths["tirx fill"] = lambda w, f=paths["tirx"]: without_arena(f, w)
                # each path's calls, the i-th reading weight copy i mod copies
                seqs = [[(lambda f=f, w=ws[i % copies]: f(w)) for i in range(calls)]
                        for f in paths.values()]
                try:
                    ref = F.linear(a, w, b if bias else None).float()
                    err = (mm.matmul(a, w, b if bias else None, sync=True).float() - ref).abs().max()
                    rec["max_abs_err"] = round(float(err), 5)
                    rec["explain"] = mm.explain(M, N, K, "bfloat16", epilogue=(
                        {"BIAS": "bfloat16"} if bias else None)).splitlines()[0]
                    try:
                        rec["kernels"] = kernel_names(torch, {n: q[0] for n, q in zip(paths, seqs)})
                    except Exception as e:  # noqa: BLE001 - the names are a side dish
                        rec["kernels"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                    if args.between:
                        tiny = torch.zeros(1, device="cuda")
                        gap = lambda: tiny.add_(1)  # noqa: E731
                        lists = [[f for fn in q for f in (fn, gap)]
                                 for q in seqs] + [[gap, gap] * calls]
                        ts = graph_times(lists)  # per list entry: (GEMM + add) / 2; add
                        rec["between_add_us"] = round(ts[-1] * 1e3, 3)
                        ts = [2 * t - ts[-1] for t in ts[:-1]]  # per GEMM, the add's time out
                    else:
                        ts = graph_times(seqs)
                except Exception as e:  # noqa: BLE001 - a record of what failed, then on
                    rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    print(json.dumps(rec), flush=True)
                    if out:
                        out.write(json.dumps(rec) + "\n")
                    continue
                rec["us"] = {n: round(t * 1e3, 3) for n, t in zip(paths, ts)}
                rec["tirx_over_torch"] = round(ts[0] / ts[1], 4)
                print(f"{model} M={M:<3} {layer:<20} {N}x{K} bias={bias!s:<5} "
                      + "  ".join(f"{n} {v:7.2f}" for n, v in rec["us"].items())
                      + f"  x{rec['tirx_over_torch']:.3f}  {rec['kernels']}", flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
