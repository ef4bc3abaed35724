"""Time the MoE expert GEMMs of a grouped suite under CUDA graphs, three ways in one run.

    python lab/moe_grouped_gemm/bench_grouped.py \
        --suite lab/moe_grouped_gemm/suites/moe_experts.json --dtype bfloat16 \
        --out records/FILE.jsonl [--models Mixtral-8x7B ...] [--tokens 1 16 ...] [--no-tirx]
        [--budget-s S]

For each entry and token count T: rows = T x top_k routed by a seeded skewed draw (ROUTING:
experts ranked by a Zipf law of exponent ``zipf`` over a seeded permutation, a share
``empty_share`` of them never chosen; each token takes top_k distinct experts), three routings
(seeds seed, seed+1, seed+2) that the launches of a graph rotate over, so a decode call's
experts change from one launch to the next and their weights come from HBM. Timed, each as a
CUDA graph of L launches (L from the expected time: about 2 ms of work per replay, 1 to 8):

- ``torch_grouped_mm``: torch._grouped_mm(a, w.transpose(1, 2), offs=offs), where torch runs
  it on the GPU without a host sync (bf16 on sm_90a/sm_100a: its CUTLASS kernel); for fp16 its
  fallback reads offs on the host, which a graph cannot capture: recorded as null, with why;
- ``loop``: a per-expert loop of torch.mm into slices of one output (what transformers' loop of
  F.linear does, without its allocations), captured with each routing's counts read on the host
  before the capture (the loop's sync is outside the timed region);
- ``tirx``: tirx_gemm.op.grouped.grouped_mm (v14, the pick of choose_grouped), offs on the GPU.

The graphs are warmed up together for 100 ms, then replayed alternately 5 times each
(medians). Each result is first checked against the loop in fp32 (max relative error).
A record per case: times (us), TFLOP/s counting only the real rows, ratios (tirx over
torch's grouped_mm and over the loop), the share of 795 TFLOP/s (torch.matmul's best bf16
shape on an H100 or H200), and the floor: the active experts' weight bytes plus the
activations' at the card's HBM bandwidth (tirx_gemm.op.cards), with tirx's time over it.
"""
import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_bundle import variant_keywords  # noqa: E402 (no torch, no TVM)
from tirx_gemm import registry  # noqa: E402

CEILING = 795.0  # TFLOP/s: torch.matmul's best bf16 shape on an H100 and an H200
WORK_MS = 2.0    # the work per graph replay the launch count aims at
WARM_MS, ROUNDS = 100.0, 5
# the skewed routing: experts ranked by a Zipf law over a seeded permutation, a share of them
# never chosen (at most E - top_k), each token taking top_k distinct experts
ROUTING = {"seed": 0, "zipf": 1.2, "empty_share": 0.125}


def routings(T, E, k, spec, n=3):
    """n routings (T, k) of T tokens over E experts: a skewed, seeded draw (module docstring)."""
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(spec["seed"] + i)
        rank = torch.randperm(E, generator=g).double() + 1
        p = rank ** -spec["zipf"]
        empty = torch.randperm(E, generator=g)[: min(E - k, int(E * spec["empty_share"]))]
        p[empty] = 0
        out.append(torch.multinomial(p.expand(T, E), k, replacement=False, generator=g))
    return out


def _replay_ms(g):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def _capture(fns):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fns[0]()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def interleaved(graphs, launches):
    spent, n = 0.0, 0
    while spent < WARM_MS and n < 2000:
        for g in graphs:
            spent += _replay_ms(g)
        n += 1
    times = [[] for _ in graphs]
    for r in range(ROUNDS):
        for i in (range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))):
            times[i].append(_replay_ms(graphs[i]) / launches)
    return [statistics.median(t) * 1e3 for t in times]  # us per launch


def rel_err(got, want) -> float:
    got, want = got.float(), want.float()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


def torch_grouped_why(dtype) -> str | None:
    """None where torch._grouped_mm runs on the GPU without a host sync, else why not."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no _grouped_mm"
    if dtype != torch.bfloat16:
        return (f"torch {torch.__version__}'s grouped_mm for {dtype} is its fallback (offs read "
                f"on the host, a loop of mm): not capturable in a CUDA graph")
    if torch.cuda.get_device_capability()[0] not in (9, 10):
        return "torch's grouped_mm kernel runs on sm_90a / sm_100a only"
    return None


def variant_name(v: dict) -> str:
    tile = (f"{v['BLK_M']}x{v['BLK_N']}" if "BLK_M" in v or "BLK_N" in v else "pick")
    return (tile + (" swap" if v.get("SWAP_AB") else "")
            + (f" group {v['GROUP']}" if "GROUP" in v else "")
            + (f" stores over {v['STORE_STEPS']} steps" if v.get("STORE_STEPS", 1) > 1 else "")
            + (" tma store" if v.get("TMA_STORE") else "")
            + (f" cluster {v['CLUSTER']}" if v.get("CLUSTER", 1) > 1 else "")
            + (f" tail split {v['TAIL_SPLIT']}" if v.get("TAIL_SPLIT", 1) > 1 else ""))


def bench_case(entry, T, dtype, w, spec, tirx, card, variants=()):
    from tirx_gemm.op.grouped import choose_grouped, grouped_mm
    E, k, N, K = entry["E"], entry["top_k"], entry["N"], entry["K"]
    rows = T * k
    routes = routings(T, E, k, spec)
    counts = [torch.bincount(r.reshape(-1), minlength=E) for r in routes]
    offs = [c.cumsum(0).to(torch.int32).cuda() for c in counts]
    bounds = [[0] + c.cumsum(0).tolist() for c in counts]  # the loop's host-side slices
    g = torch.Generator(device="cuda").manual_seed(T * 7 + N)
    a = (torch.randn(rows, K, device="cuda", generator=g) * K ** -0.25).to(dtype)
    w_t = w.transpose(1, 2)
    outs = {m: torch.empty(rows, N, device="cuda", dtype=dtype)
            for m in ("torch_grouped_mm", "loop", "tirx")}
    flops = 2.0 * rows * N * K
    active = [int((c > 0).sum()) for c in counts]
    weight_bytes = statistics.mean(active) * N * K * w.element_size()
    moved = weight_bytes + rows * (N + K) * w.element_size()
    floor_us = moved / (card.hbm_tb_s * 1e12) * 1e6
    est_ms = max(flops / 600e12, moved / (card.hbm_tb_s * 1e12)) * 1e3
    L = max(1, min(8, int(WORK_MS / max(est_ms, 1e-3))))

    def loop_fn(i):
        b, out = bounds[i % 3], outs["loop"]
        return lambda: [torch.mm(a[b[e]:b[e + 1]], w[e].t(), out=out[b[e]:b[e + 1]])
                        for e in range(E) if b[e + 1] > b[e]]

    fns = {"loop": [loop_fn(i) for i in range(L)]}
    why_torch = torch_grouped_why(dtype)
    if why_torch is None:
        fns["torch_grouped_mm"] = [lambda i=i: torch._grouped_mm(a, w_t, offs=offs[i % 3])
                                   for i in range(L)]
    kernel = None
    if tirx:
        _, kernel = choose_grouped(rows, E, N, K, str(dtype).removeprefix("torch."))
        fns["tirx"] = [lambda i=i: grouped_mm(a, w_t, offs[i % 3], out=outs["tirx"])
                       for i in range(L)]
    variant_errors, engaged = {}, {}
    for v in variants if tirx else ():  # the pick's keywords with the variant's
        from tirx_gemm.op import grouped as G
        kw = variant_keywords(kernel, v)  # export_bundle's: what the export built
        name = "variant:" + variant_name(v)
        try:
            vk, _ = G._load("v14", "sm_90a", N, K, kw)
        except ValueError as exc:  # not in the bundle: said in the record, the rest still run
            variant_errors[name] = str(exc).splitlines()[0][:200]
            continue
        if kw.get("TAIL_SPLIT", 1) > 1:  # per routing: did the device cut the last wave?
            from tirx_gemm import splitk
            tiles = [sum(-(-int(c) // kw["BLK_M"]) for c in cs) * -(-N // kw["BLK_N"]) for cs in counts]
            engaged[name] = [splitk.tail_split_plan(t, kw["SM_COUNT"], kw["TAIL_SPLIT"])[1] != t
                             for t in tiles]
        outs[name] = torch.empty(rows, N, device="cuda", dtype=dtype)
        ws = [torch.zeros(shape, dtype=getattr(torch, dt), device="cuda") for _, shape, dt
              in registry.get("v14", "sm_90a").workspace_specs(rows, N, K, kw)]  # TAIL_SPLIT's
        fns[name] = [lambda i=i, vk=vk, o=outs[name], ws=ws: vk(a, w, o, offs[i % 3], *ws)
                     for i in range(L)]
    # checks: each method's result for routing 0 against the loop's (fp32 accumulate both)
    fns["loop"][0]()
    ref = outs["loop"].clone()
    check = {}
    if "torch_grouped_mm" in fns:
        check["torch_grouped_mm"] = rel_err(fns["torch_grouped_mm"][0](), ref)
    tirx_error = None
    for name in [m for m in fns if m.startswith("variant:")]:
        fns[name][0]()
        check[name] = rel_err(outs[name], ref)
    if tirx:
        try:
            fns["tirx"][0]()
            torch.cuda.synchronize()
            check["tirx"] = rel_err(outs["tirx"], ref)
        except Exception as exc:  # noqa: BLE001 -- no kernel: torch's times still count
            tirx_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            del fns["tirx"]
    torch.cuda.synchronize()
    names = list(fns)
    times = dict(zip(names, interleaved([_capture(fns[m]) for m in names], L)))
    t = {m: times.get(m) for m in ["torch_grouped_mm", "loop", "tirx"] + [
        m for m in names if m.startswith("variant:")]}
    tf = {m: (flops / (v * 1e-6) / 1e12 if v else None) for m, v in t.items()}
    rec = {"model": entry["model"], "layer": entry["layer"], "E": E, "top_k": k, "N": N, "K": K,
           "tokens": T, "rows": rows, "dtype": str(dtype).removeprefix("torch."),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "active_experts": active, "max_rows": [int(c.max()) for c in counts],
           "launches_per_graph": L, "t_us": t, "tflops": tf, "check_rel_err": check,
           "torch_grouped_mm_note": why_torch, "floor_us": floor_us,
           "tokens_per_active_expert": rows / max(1, statistics.mean(active)),
           "kernel": kernel, "tirx_error": tirx_error, "routing": spec}
    if variants:
        rec["variant_errors"] = variant_errors
        rec["tail_split_engaged"] = engaged
    if t["tirx"]:
        rec["ratio_vs_torch_grouped_mm"] = t["torch_grouped_mm"] / t["tirx"] \
            if t["torch_grouped_mm"] else None
        rec["ratio_vs_loop"] = t["loop"] / t["tirx"]
        rec["share_of_795"] = tf["tirx"] / CEILING
        rec["over_floor"] = t["tirx"] / floor_us
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(Path(__file__).parent / "suites" / "moe_experts.json"))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--tokens", nargs="*", type=int)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-tirx", action="store_true")
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--routing-seed", type=int, default=ROUTING["seed"],
                    help="the routing draw's seed (another seed: a held-out routing)")
    ap.add_argument("--variants", help="a tile-variants file (suites/tile_variants.json): only "
                    "its cases run, each variant timed beside the pick")
    args = ap.parse_args(argv)
    cases = json.loads(Path(args.variants).read_text())["cases"] if args.variants else None
    from tirx_gemm.op import cards
    card = cards.from_device()
    suite = json.loads(Path(args.suite).read_text())
    dtype = getattr(torch, args.dtype)
    t0, done = time.monotonic(), 0
    print(f"{card.name}: {card.hbm_tb_s} TB/s; torch {torch.__version__}", flush=True)
    for entry in suite["shapes"]:
        if args.models and entry["model"] not in args.models:
            continue
        E, N, K = entry["E"], entry["N"], entry["K"]
        if cases is not None and not any(c["model"] == entry["model"] and entry["layer"].startswith(
                c["layer"]) for c in cases):
            continue
        w = (torch.randn(E, N, K, device="cuda", dtype=dtype) * K ** -0.5)
        for T in entry["tokens"]:
            if args.tokens and T not in args.tokens:
                continue
            variants = ()
            if cases is not None:
                hit = [c for c in cases if c["model"] == entry["model"]
                       and entry["layer"].startswith(c["layer"]) and T in c["tokens"]]
                if not hit:
                    continue
                variants = hit[0]["variants"]
            if time.monotonic() - t0 > args.budget_s:
                print(f"budget of {args.budget_s:g} s spent after {done} cases", flush=True)
                return 0
            try:
                rec = bench_case(entry, T, dtype, w, {**ROUTING, "seed": args.routing_seed},
                                 not args.no_tirx, card, variants)
            except Exception as exc:  # noqa: BLE001 -- one case's failure is recorded, not fatal
                rec = {"model": entry["model"], "layer": entry["layer"], "tokens": T,
                       "dtype": args.dtype, "device": torch.cuda.get_device_name(),
                       "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            done += 1
            t = rec.get("t_us", {})
            print(f"{entry['model']:14s} {entry['layer'][:22]:22s} T={T:6d} "
                  + " ".join(f"{m}={v:9.1f}" if v else f"{m}=     n/a" for m, v in t.items())
                  + (f" x_gmm={rec['ratio_vs_torch_grouped_mm']:.2f}"
                     if rec.get("ratio_vs_torch_grouped_mm") else "")
                  + (f" x_loop={rec['ratio_vs_loop']:.2f} floor={rec['over_floor']:.2f}"
                     if rec.get("ratio_vs_loop") else "")
                  + (f" ERROR {rec['error']}" if "error" in rec else "")
                  + (f" tirx: {rec['tirx_error']}" if rec.get("tirx_error") else ""), flush=True)
        del w
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
