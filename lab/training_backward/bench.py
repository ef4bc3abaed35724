"""Forward plus backward of Llama-3-8B's and Qwen2.5-7B's projection GEMMs, tirx vs torch, bf16.

Per layer (N x K weight) and token count M, in one run on one card, each GEMM timed as the GPU
runs it: GRAPH_CALLS calls captured in one CUDA graph, the median of REPS replays after WARM
(``timing`` in every record; "events" where a capture failed: back-to-back calls between two
CUDA events):

* ``fwd``: y = x @ w.T (tirx_gemm.matmul, choose's pick; torch: F.linear);
* ``dgrad_v15``, ``wgrad_v15``: dx = dy @ w and dw = dy.T @ x (the reduction over the M tokens)
  on the operand-layout step v15, reading w, dy and x as they lie, built with one CTA per tile
  and PDL; ``*_v15rk``: the same with K at run time (RUNTIME_K, one kernel per layer:
  autograd's build, its LAYOUT_TUNE); ``*_v15pair``: the lesson's build (v9's CTA pair);
  ``bwd_*``, ``block_*``: each build's two GEMMs, and with ``fwd`` the whole block;
  ``dgrad_v15kk``: the v15 build on a K-major copy of w (both operands K-major), so its
  difference to ``dgrad_v15`` is what reading w MN-major costs;
* ``dgrad``, ``wgrad``: the same GEMMs on v12 from K-major copies made beforehand (the
  kernels alone); ``copies``: the three copies that path needs (w.T, dy.T, x.T); ``wcopy``:
  the weight's alone (what a dgrad on v12 would add); ``bwd`` and ``block``: the copy path
  with its copies;
* ``autograd``: the whole forward and backward through tirx_gemm.op.autograd.linear against
  torch's F.linear, Python and autograd included (events, not a graph).

TRAIN_BENCH_SET=runtime_k times fwd and the v15 and v15rk builds only (``set`` in the records).

Each tirx result is checked against torch's (max error <= 2e-2 of max |torch|) before timing.
Records: one JSON line per (layer, M, gemm) with ms, TFLOP/s, the ratio torch/tirx time and
the share of the bf16 dense ceiling (CEILING_TFLOPS), the card as torch names it.

    python lab/training_backward/bench.py --out records/bench.jsonl [--budget-s 60]
    python lab/training_backward/bench.py --requests   # the kernels, for the bundle
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

# (name, N, K): the weight of each projection (q, k, v fused; gate and up fused)
MODELS = {
    "llama3_8b": (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                  ("down", 4096, 14336)),
    "qwen2.5_7b": (("qkv", 4608, 3584), ("o", 3584, 3584), ("gate_up", 37888, 3584),
                   ("down", 3584, 18944)),
}
TOKENS = (4096, 8192, 16384)
CEILING_TFLOPS = 795.0  # bf16 dense, the ceiling
WARM, REPS = 2, 5
GRAPH_CALLS = 5  # calls per captured graph (and per event pair in the fallback)
TOL = 2e-2
V15 = os.environ.get("TRAIN_BENCH_V15", "1") == "1"  # 0: skip the v15 rows (not verified here)
# v15's builds: the backward's (autograd.LAYOUT_TUNE: one CTA per tile, PDL) and the lesson's
# (v9's CTA pair), as autograd.layout_kwargs' ``tune``
# v15's builds, as autograd.layout_kwargs' ``tune``: one CTA per tile and PDL, the same with K
# at run time (RUNTIME_K: autograd's LAYOUT_TUNE), the lesson's (v9's CTA pair)
VARIANTS = {"v15": {"CLUSTER": 1, "PDL": True},
            "v15rk": {"CLUSTER": 1, "PDL": True, "RUNTIME_K": True}, "v15pair": {}}
# TRAIN_BENCH_SET=runtime_k: only fwd and the v15 and v15rk builds (no copy path, no pair)
FULL = os.environ.get("TRAIN_BENCH_SET", "all") != "runtime_k"
if not FULL:
    VARIANTS.pop("v15pair")


def cases(tokens=TOKENS):
    """Every (model, layer, M, N, K), token counts outermost: a run cut short by its budget
    has every layer at the smaller counts."""
    for M in tokens:
        for model, layers in MODELS.items():
            for layer, N, K in layers:
                yield model, layer, M, N, K


def gemm_calls(M, N, K):
    """The tirx GEMMs (M, N, K) of one layer's forward and backward: fwd, dgrad, wgrad."""
    return [(M, N, K), (M, K, N), (N, K, M)]


def requests(sm_count=132, tokens=TOKENS):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import calls as C
    rec = [("matmul", m, n, k, "bfloat16", None, None, None, None)
           for _, _, M, N, K in cases(tokens) for m, n, k in gemm_calls(M, N, K)]
    # v15, each build of VARIANTS: dgrad (dy K-major, w MN-major), wgrad (dy and x MN-major)
    rec += [("layout", M, K, N, "bfloat16", False, True, tune, "v15")
            for _, _, M, N, K in cases(tokens) for tune in VARIANTS.values()]
    rec += [("layout", N, K, M, "bfloat16", True, True, tune, "v15")
            for _, _, M, N, K in cases(tokens) for tune in VARIANTS.values()]
    # dgrad_v15kk: the backward's v15 build on the K-major copy of w (both operands K-major)
    rec += [("layout", M, K, N, "bfloat16", False, False, VARIANTS["v15"], "v15")
            for _, _, M, N, K in cases(tokens)]
    return C.requests(rec, sm_count)


def _time_events(fn, torch, calls: int = 1):
    """ms per call of ``calls`` back-to-back calls between two CUDA events (host work
    included where it is longer than the GPU's), the median of REPS after WARM."""
    for _ in range(WARM):
        fn()
    ts = []
    for _ in range(REPS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / calls)
    return sorted(ts)[len(ts) // 2]


def _time(fn, torch):
    """(ms per call, method): ``fn`` captured GRAPH_CALLS times in one CUDA graph, replayed
    REPS times after WARM (the median): GPU time only, as a training step replayed by a graph
    or queued ahead of the GPU sees it. Falls back to back-to-back calls between events."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # loads the kernel: no module load inside a capture
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(GRAPH_CALLS):
                fn()
        return _time_events(g.replay, torch) / GRAPH_CALLS, "cuda_graph"
    except Exception as e:  # noqa: BLE001 (the method is recorded with every figure)
        print(f"  graph capture failed ({type(e).__name__}: {str(e)[:120]}): events")
        torch.cuda.synchronize()
        return _time_events(fn, torch, GRAPH_CALLS), "events"


def _check(name, got, want):
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    if not err <= TOL * scale:
        raise AssertionError(f"{name}: max error {err:.3g} vs max |torch| {scale:.3g}")


FLOPS = {"fwd": 2, "dgrad": 2, "wgrad": 2, "bwd": 4, "block": 6, "autograd": 6,
         "copies": 0, "wcopy": 0}  # x M*N*K; *_v15, *_v15pair as their GEMM


def run(out: Path, budget_s: float, tokens=TOKENS) -> int:
    import torch
    import torch.nn.functional as F
    from tirx_gemm.matmul import matmul, synchronize
    from tirx_gemm.op import autograd as AG
    card = torch.cuda.get_device_name(0)
    date = datetime.date.today().isoformat()
    t_end = time.monotonic() + budget_s
    bf = torch.bfloat16
    n = 0
    with out.open("a") as f:
        for model, layer, M, N, K in cases(tokens):
            if time.monotonic() > t_end:
                print(f"budget spent: stopped before {model} {layer} M={M}")
                break
            g = torch.Generator(device="cuda").manual_seed(M + N + K)
            x = torch.randn(M, K, device="cuda", dtype=bf, generator=g)
            w = torch.randn(N, K, device="cuda", dtype=bf, generator=g) / K ** 0.5
            dy = torch.randn(M, N, device="cuda", dtype=bf, generator=g)
            wt, dyt, xt = w.t().contiguous(), dy.t().contiguous(), x.t().contiguous()
            _check(f"{layer} fwd", matmul(x, w), F.linear(x, w))
            variants = {}  # the v15 builds whose results match torch's here: timed
            for tag, tune in (VARIANTS.items() if V15 else ()):
                try:
                    _check(f"{layer} dgrad {tag}", AG._gemm_layout(dy, False, w, True, tune),
                           dy @ w)
                    _check(f"{layer} wgrad {tag}", AG._gemm_layout(dy, True, x, True, tune),
                           dy.t() @ x)
                    variants[tag] = tune
                except Exception as e:  # noqa: BLE001 (recorded, and the build is not timed)
                    print(f"  {tag} FAILED its check: {type(e).__name__}: {str(e)[:200]}")
                    f.write(json.dumps({"date": date, "card": card, "model": model,
                                        "layer": layer, "M": M, "N": N, "K": K,
                                        "gemm": f"check_{tag}", "ok": False,
                                        "error": str(e)[:300]}) + "\n")
            if FULL:
                _check(f"{layer} dgrad", matmul(dy, wt), dy @ w)
                _check(f"{layer} wgrad", matmul(dyt, xt), dy.t() @ x)
            synchronize()

            def copies():
                w.t().contiguous(), dy.t().contiguous(), x.t().contiguous()

            times, how = {}, {}

            def put(name, ours, theirs=None):
                times[name] = (ours[0], None if theirs is None else theirs[0])
                how[name] = ours[1]

            put("fwd", _time(lambda: matmul(x, w), torch), _time(lambda: F.linear(x, w), torch))
            t_dgrad = _time(lambda: dy @ w, torch)
            t_wgrad = _time(lambda: dy.t() @ x, torch)
            if V15:
                for tag, tune in variants.items():
                    put(f"dgrad_{tag}", _time(lambda: AG._gemm_layout(dy, False, w, True, tune),
                                              torch), t_dgrad)
                    put(f"wgrad_{tag}", _time(lambda: AG._gemm_layout(dy, True, x, True, tune),
                                              torch), t_wgrad)
            if FULL and "v15" in variants:  # v15 on wt, K-major: what reading w MN-major costs
                _check(f"{layer} dgrad v15kk", AG._gemm_layout(dy, False, wt, False,
                                                               VARIANTS["v15"]), dy @ w)
                put("dgrad_v15kk", _time(lambda: AG._gemm_layout(dy, False, wt, False,
                                                                 VARIANTS["v15"]), torch),
                    t_dgrad)
            torch_bwd = t_dgrad[0] + t_wgrad[0]
            torch_block = times["fwd"][1] + torch_bwd
            if FULL:
                put("dgrad", _time(lambda: matmul(dy, wt), torch), t_dgrad)
                put("wgrad", _time(lambda: matmul(dyt, xt), torch), t_wgrad)
                put("copies", _time(copies, torch))
                put("wcopy", _time(lambda: w.t().contiguous(), torch))
                # the copy path: copies + v12's two GEMMs, and the block (+ fwd)
                times["bwd"] = (times["copies"][0] + times["dgrad"][0] + times["wgrad"][0],
                                torch_bwd)
                times["block"] = (times["fwd"][0] + times["bwd"][0], torch_block)
            for tag in variants:
                times[f"bwd_{tag}"] = (times[f"dgrad_{tag}"][0] + times[f"wgrad_{tag}"][0],
                                       torch_bwd)
                times[f"block_{tag}"] = (times["fwd"][0] + times[f"bwd_{tag}"][0], torch_block)
            xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
            # autograd end to end, Python included (no graph: backward() is host-driven)
            times["autograd"] = (
                _time_events(lambda: AG.linear(xs, ws).backward(dy), torch, GRAPH_CALLS),
                _time_events(lambda: F.linear(xs, ws).backward(dy), torch, GRAPH_CALLS))
            how["autograd"] = "events"
            for gemm, (ours, theirs) in times.items():
                rec = {"date": date, "card": card, "model": model, "layer": layer, "M": M,
                       "N": N, "K": K, "dtype": "bfloat16", "gemm": gemm,
                       "set": "all" if FULL else "runtime_k",
                       "timing": how.get(gemm, "sum"), "ms_tirx": round(ours, 4),
                       "ms_torch": None if theirs is None else round(theirs, 4)}
                flop = FLOPS.get(gemm.split("_")[0], 0) * M * N * K
                if flop:
                    rec["tflops_tirx"] = round(flop / ours / 1e9, 1)
                    rec["tflops_torch"] = round(flop / theirs / 1e9, 1)
                    rec["ratio"] = round(theirs / ours, 3)
                    rec["of_ceiling"] = round(rec["tflops_tirx"] / CEILING_TFLOPS, 3)
                elif "bwd" in times:
                    rec["share_of_bwd"] = round(ours / times["bwd"][0], 3)
                f.write(json.dumps(rec) + "\n")
                f.flush()
            r = {k: v[1] / v[0] for k, v in times.items() if v[1]}
            v15 = " | ".join(f"{t}: block x{r[f'block_{t}']:.3f} dgrad x{r[f'dgrad_{t}']:.3f} "
                             f"wgrad x{r[f'wgrad_{t}']:.3f}" for t in variants)
            copy = (f" | copies: block x{r['block']:.3f} dgrad x{r['dgrad']:.3f} wgrad "
                    f"x{r['wgrad']:.3f}, copies {times['copies'][0] / times['bwd'][0]:.1%} of "
                    f"bwd, w copy {times['wcopy'][0]:.3f} ms" if FULL else "")
            print(f"{model} {layer} M={M} ({how['fwd']}): fwd x{r['fwd']:.3f}{copy} | "
                  f"{v15}", flush=True)
            n += 1
            del x, w, dy, wt, dyt, xt, xs, ws
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=120)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--requests", action="store_true", help="list the kernels and exit")
    args = ap.parse_args(argv)
    tokens = tuple(int(t) for t in args.tokens.split(","))
    if args.requests:
        for st, shape, kw in requests(tokens=tokens):
            print(st.key, shape, kw)
        return 0
    n = run(args.out, args.budget_s, tokens)
    print(f"{n} cases recorded in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
