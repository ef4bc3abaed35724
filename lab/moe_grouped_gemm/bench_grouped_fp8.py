"""Check and time the fp8 grouped GEMM (v14 FP8_BLOCK) at the suite's Mixtral and Qwen3-MoE layers.

    python lab/moe_grouped_gemm/bench_grouped_fp8.py --out records/FILE.jsonl \
        [--models Mixtral-8x7B Qwen3-30B-A3B] [--tokens 16 4096] [--budget-s S]

Each entry of suites/moe_experts.json (the models asked for) at each token count T, routed as
bench_grouped.py routes (ROUTING: three seeded skewed draws that the graph's launches rotate
over). Operands: activations and weights drawn in fp32, quantized with DeepGEMM's block scales
(tirx_gemm.op.grouped_fp8: 1x128 per token, 128x128 per expert weight block); their
dequantized values in bf16 feed the bf16 peers, so every method multiplies the same numbers.

Check: tirx's fp8 result for routing 0 against the fp32 product of the dequantized operands
(max relative error). Timed under CUDA graphs in one run (bench_grouped's interleaved medians):

- ``tirx_fp8``: tirx_gemm.grouped_mm(a_q, w_q.transpose(1, 2), offs, scale_a=, scale_b=);
- ``tirx_bf16``: tirx_gemm.grouped_mm on the bf16 operands (v14's pick);
- ``torch_grouped_mm``: torch._grouped_mm on the bf16 operands;
- ``loop_scaled_mm``: a per-expert loop of torch._scaled_mm with the same block scales
  (tirx_gemm.op.fp8_bench.torch_scaled_mm's blockwise form; counts read on the host before the
  capture), where the installed torch runs it (else the record says why).

A record per case: times (us), TFLOP/s over the real rows, ratios of tirx_fp8 over each peer.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grouped import ROUTING, _capture, interleaved, rel_err, routings  # noqa: E402
from export_bundle import FP8_BENCH  # noqa: E402 (the layers the export builds kernels for)

WORK_MS = 2.0
DEFAULT_MODELS, DEFAULT_TOKENS = FP8_BENCH["models"], FP8_BENCH["tokens"]


def dequant_rows(q, s):
    return (q.float().reshape(q.shape[0], -1, 128) * s[:, :, None]).reshape(q.shape)


def dequant_experts(q, s):
    E, N, K = q.shape
    full = s.repeat_interleave(128, dim=1)[:, :N].repeat_interleave(128, dim=2)
    return q.float() * full


def bench_case(entry, T, card_name):
    from tirx_gemm.op import grouped as G
    from tirx_gemm.op import grouped_fp8 as GF
    E, k, N, K = entry["E"], entry["top_k"], entry["N"], entry["K"]
    rows = T * k
    routes = routings(T, E, k, ROUTING)
    counts = [torch.bincount(r.reshape(-1), minlength=E) for r in routes]
    offs = [c.cumsum(0).to(torch.int32).cuda() for c in counts]
    bounds = [[0] + c.cumsum(0).tolist() for c in counts]
    g = torch.Generator(device="cuda").manual_seed(T * 7 + N)
    a32 = torch.randn(rows, K, device="cuda", generator=g)
    w32 = torch.randn(E, N, K, device="cuda", generator=g) * K ** -0.5
    qa, sa = GF.quantize_rows(a32)
    qw, sw = GF.quantize_experts(w32)
    del a32, w32
    a16 = dequant_rows(qa, sa).to(torch.bfloat16)
    w16 = dequant_experts(qw, sw).to(torch.bfloat16)
    qw_t, w16_t = qw.transpose(1, 2), w16.transpose(1, 2)
    flops = 2.0 * rows * N * K
    L = max(1, min(8, int(WORK_MS / max(flops / 1000e12 * 1e3, 1e-3))))
    out8 = torch.full((rows, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    out16 = torch.empty(rows, N, device="cuda", dtype=torch.bfloat16)
    fns = {"tirx_fp8": [lambda i=i: G.grouped_mm(qa, qw_t, offs[i % 3], scale_a=sa, scale_b=sw,
                                                  out=out8) for i in range(L)],
           "tirx_bf16": [lambda i=i: G.grouped_mm(a16, w16_t, offs[i % 3], out=out16)
                         for i in range(L)]}
    if hasattr(torch, "_grouped_mm"):
        fns["torch_grouped_mm"] = [lambda i=i: torch._grouped_mm(a16, w16_t, offs=offs[i % 3])
                                   for i in range(L)]
    loop_note = None
    try:
        from tirx_gemm.op.fp8_bench import torch_scaled_mm
        calls = []
        for i in range(3):
            b = bounds[i]
            calls.append([torch_scaled_mm(qa[b[e]:b[e + 1]], qw[e], sa[b[e]:b[e + 1]], sw[e],
                                          "block", torch.bfloat16)
                          for e in range(E) if b[e + 1] > b[e]])
        for c in calls[0]:
            c()
        torch.cuda.synchronize()
        fns["loop_scaled_mm"] = [lambda i=i: [c() for c in calls[i % 3]] for i in range(L)]
    except Exception as exc:  # noqa: BLE001 -- torch's blockwise form missing here: say why
        loop_note = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    # check: routing 0, fp32 product of the dequantized operands, rows of experts only
    fns["tirx_fp8"][0]()
    torch.cuda.synchronize()
    ref = torch.empty(rows, N, device="cuda")
    deq_a, b = dequant_rows(qa, sa), bounds[0]
    for e in range(E):
        if b[e + 1] > b[e]:
            w_e = dequant_experts(qw[e:e + 1], sw[e:e + 1])[0]
            ref[b[e]:b[e + 1]] = deq_a[b[e]:b[e + 1]] @ w_e.T
    err = rel_err(out8[:b[E]], ref[:b[E]])
    nan_rows = int(torch.isnan(out8[:b[E]].float()).any(dim=1).sum())
    del ref, deq_a
    names = list(fns)
    times = dict(zip(names, interleaved([_capture(fns[m]) for m in names], L)))
    tf = {m: flops / (v * 1e-6) / 1e12 for m, v in times.items()}
    _, kw = GF.choose_grouped_fp8(rows, E, N, K)
    rec = {"model": entry["model"], "layer": entry["layer"], "E": E, "top_k": k, "N": N, "K": K,
           "tokens": T, "rows": rows, "dtype": "float8_e4m3fn", "out_dtype": "bfloat16",
           "scales": "block 1x128 / 128x128", "device": card_name, "torch": torch.__version__,
           "active_experts": [int((c > 0).sum()) for c in counts], "launches_per_graph": L,
           "t_us": times, "tflops": tf, "rel_err_vs_dequant_fp32": err, "nan_rows": nan_rows,
           "kernel": kw, "loop_scaled_mm_note": loop_note,
           "ratios": {m: times[m] / times["tirx_fp8"] for m in times if m != "tirx_fp8"}}
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(Path(__file__).parent / "suites" / "moe_experts.json"))
    ap.add_argument("--models", nargs="*", default=list(DEFAULT_MODELS))
    ap.add_argument("--tokens", nargs="*", type=int, default=list(DEFAULT_TOKENS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=1e9)
    args = ap.parse_args(argv)
    suite = json.loads(Path(args.suite).read_text())
    name = torch.cuda.get_device_name()
    t0 = time.monotonic()
    print(f"{name}; torch {torch.__version__}", flush=True)
    for entry in suite["shapes"]:
        if entry["model"] not in args.models:
            continue
        for T in args.tokens:
            if time.monotonic() - t0 > args.budget_s:
                print(f"budget of {args.budget_s:g} s spent", flush=True)
                return 0
            try:
                rec = bench_case(entry, T, name)
            except Exception as exc:  # noqa: BLE001 -- recorded, the next case still runs
                rec = {"model": entry["model"], "layer": entry["layer"], "tokens": T,
                       "dtype": "float8_e4m3fn", "device": name,
                       "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            t = rec.get("t_us", {})
            print(f"{entry['model']:14s} {entry['layer'][:24]:24s} T={T:6d} "
                  + " ".join(f"{m}={v:9.1f}" for m, v in t.items())
                  + (f" err={rec['rel_err_vs_dequant_fp32']:.2e}" if "t_us" in rec else "")
                  + (f" ERROR {rec['error']}" if "error" in rec else ""), flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
