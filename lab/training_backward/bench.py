"""Forward plus backward of Llama-3-8B's and Qwen2.5-7B's projection GEMMs, tirx vs torch, bf16.

Per layer (N x K weight) and token count M, in one run on one card, each timed with CUDA
events (median of REPS after WARM):

* ``fwd``: y = x @ w.T (tirx_gemm.matmul, choose's pick; torch: F.linear);
* ``dgrad``: dx = dy @ w (tirx: matmul(dy, w.T) on a K-major copy of w.T; torch: dy @ w);
* ``wgrad``: dw = dy.T @ x, reduction over the M tokens (tirx: matmul(dy.T, x.T) on K-major
  copies; torch: dy.T @ x);
* ``copies``: the three layout copies tirx's dgrad and wgrad need today (w.T, dy.T, x.T),
  the cost the operand-layout step removes; tirx's dgrad and wgrad figures exclude them,
  ``bwd`` (dgrad + wgrad + copies) and ``block`` (fwd + bwd) include them;
* ``autograd``: the whole forward and backward through tirx_gemm.op.autograd.linear against
  torch's F.linear (Python and autograd overheads included);
* ``dgrad_v15``, ``wgrad_v15``, ``bwd_v15``, ``block_v15``: the same GEMMs on the operand-layout
  step v15, which reads w, dy and x as they lie (no copies), and the totals with them.

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
TOL = 2e-2
V15 = os.environ.get("TRAIN_BENCH_V15", "1") == "1"  # 0: skip the v15 rows (not verified here)


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
    # v15: dgrad (dy K-major, w MN-major), wgrad (dy and x MN-major)
    rec += [("layout", M, K, N, "bfloat16", False, True, None, "v15")
            for _, _, M, N, K in cases(tokens)]
    rec += [("layout", N, K, M, "bfloat16", True, True, None, "v15")
            for _, _, M, N, K in cases(tokens)]
    return C.requests(rec, sm_count)


def _time(fn, torch):
    for _ in range(WARM):
        fn()
    ts = []
    for _ in range(REPS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]


def _check(name, got, want):
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    if not err <= TOL * scale:
        raise AssertionError(f"{name}: max error {err:.3g} vs max |torch| {scale:.3g}")


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
            _check(f"{layer} dgrad", matmul(dy, wt), dy @ w)
            _check(f"{layer} wgrad", matmul(dyt, xt), dy.t() @ x)
            if V15:
                _check(f"{layer} dgrad v15", AG._gemm_layout(dy, False, w, True), dy @ w)
                _check(f"{layer} wgrad v15", AG._gemm_layout(dy, True, x, True), dy.t() @ x)
            synchronize()

            def copies():
                w.t().contiguous(), dy.t().contiguous(), x.t().contiguous()

            def ours_bwd():
                a, b, c = w.t().contiguous(), dy.t().contiguous(), x.t().contiguous()
                matmul(dy, a), matmul(b, c)

            xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
            times = {
                "fwd": (_time(lambda: matmul(x, w), torch), _time(lambda: F.linear(x, w), torch)),
                "dgrad": (_time(lambda: matmul(dy, wt), torch), _time(lambda: dy @ w, torch)),
                "wgrad": (_time(lambda: matmul(dyt, xt), torch),
                          _time(lambda: dy.t() @ x, torch)),
                "copies": (_time(copies, torch), None),
                "bwd": (_time(ours_bwd, torch), _time(lambda: (dy @ w, dy.t() @ x), torch)),
                "autograd": (_time(lambda: AG.linear(xs, ws).backward(dy), torch),
                             _time(lambda: F.linear(xs, ws).backward(dy), torch)),
            }
            times["block"] = (times["fwd"][0] + times["bwd"][0],
                              times["fwd"][1] + times["bwd"][1])
            if V15:
                times["dgrad_v15"] = (_time(lambda: AG._gemm_layout(dy, False, w, True), torch),
                                      times["dgrad"][1])
                times["wgrad_v15"] = (_time(lambda: AG._gemm_layout(dy, True, x, True), torch),
                                      times["wgrad"][1])
                times["bwd_v15"] = (times["dgrad_v15"][0] + times["wgrad_v15"][0],
                                    times["bwd"][1])
                times["block_v15"] = (times["fwd"][0] + times["bwd_v15"][0], times["block"][1])
            flop = {"fwd": 2 * M * N * K, "dgrad": 2 * M * N * K, "wgrad": 2 * M * N * K,
                    "bwd": 4 * M * N * K, "block": 6 * M * N * K, "autograd": 6 * M * N * K,
                    "copies": 0, "dgrad_v15": 2 * M * N * K, "wgrad_v15": 2 * M * N * K,
                    "bwd_v15": 4 * M * N * K, "block_v15": 6 * M * N * K}
            for gemm, (ours, theirs) in times.items():
                rec = {"date": date, "card": card, "model": model, "layer": layer, "M": M,
                       "N": N, "K": K, "dtype": "bfloat16", "gemm": gemm,
                       "ms_tirx": round(ours, 4),
                       "ms_torch": None if theirs is None else round(theirs, 4)}
                if flop[gemm]:
                    rec["tflops_tirx"] = round(flop[gemm] / ours / 1e9, 1)
                    rec["tflops_torch"] = round(flop[gemm] / theirs / 1e9, 1)
                    rec["ratio"] = round(theirs / ours, 3)
                    rec["of_ceiling"] = round(rec["tflops_tirx"] / CEILING_TFLOPS, 3)
                else:
                    rec["share_of_bwd"] = round(ours / times["bwd"][0], 3)
                f.write(json.dumps(rec) + "\n")
                f.flush()
            v15 = (f" (v15: block x{times['block_v15'][1] / times['block_v15'][0]:.3f}, wgrad "
                   f"x{times['wgrad_v15'][1] / times['wgrad_v15'][0]:.3f})" if V15 else "")
            print(f"{model} {layer} M={M}: block x{times['block'][1] / times['block'][0]:.3f} "
                  f"wgrad x{times['wgrad'][1] / times['wgrad'][0]:.3f} copies "
                  f"{times['copies'][0] / times['bwd'][0]:.1%} of bwd{v15}", flush=True)
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
