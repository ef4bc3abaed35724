"""Fused bias + gelu (erf and tanh forms) against torch's unfused sequence and cuBLASLt's fused
epilogue (``torch._addmm_activation(bias, a, w.t(), use_gelu=True)``, the tanh form), in one run.

Per token count M (default 512, 2048, 8192) of a 4096 x 1024 layer (bf16; the 6304 x 4096
x 1024 family): every path is checked once against float32 torch, then timed, interleaved, as the
median of --reps CUDA-graph replays of --calls back-to-back calls (CUDA events; the host's launch
cost out of the figure) and the same eagerly. Paths: tirx fused erf (``matmul(a, w, bias, "gelu")``),
tirx fused tanh (``"gelu_tanh"``), tirx plain v12 (``step="v12"``: the fused kernel's tile without
the epilogue), torch unfused erf (``F.gelu(F.linear(a, w, bias))``), torch unfused tanh
(``approximate="tanh"``), torch addmm_act (cuBLASLt GELU_BIAS) and torch linear (``F.linear`` with
the bias: the GEMM with no activation). One JSON line per (M, path, mode) in --out; the ratios
(torch / tirx: the targets are >= 1.05 against unfused and >= 1.0 against addmm_act) are printed.

Made here (TVM): tirx-gemm export --suite lab/fused_epilogues/suites/gelu_tokens.json --arch sm_90a
    --num-sms 132 --out B
Run on the GPU host: TIRX_GEMM_BUNDLE=B python3 lab/fused_epilogues/gelu_vs_cublaslt.py --out F.jsonl
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    import tirx_gemm.matmul as mm

    t0 = time.time()
    p = torch.cuda.get_device_properties(0)
    card = f"{p.name} ({p.multi_processor_count} SMs)"
    print(card, "torch", torch.__version__, flush=True)
    out = open(args.out, "a") if args.out else None
    N, K, bf = args.n, args.k, torch.bfloat16
    for M in (int(m) for m in args.tokens.split(",")):
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: M={M} and later not run", flush=True)
            break
        g = torch.Generator(device="cuda").manual_seed(M)
        a = torch.randn(M, K, device="cuda", dtype=bf, generator=g)
        w = (torch.randn(N, K, device="cuda", dtype=bf, generator=g) / K ** 0.5).contiguous()
        bias = torch.randn(N, device="cuda", dtype=bf, generator=g) * 0.5
        wt = w.t()
        paths = {
            "tirx fused erf": lambda: mm.matmul(a, w, bias, "gelu"),
            "tirx fused tanh": lambda: mm.matmul(a, w, bias, "gelu_tanh"),
            "tirx plain v12": lambda: mm.matmul(a, w, step="v12"),
            "torch unfused erf": lambda: F.gelu(F.linear(a, w, bias)),
            "torch unfused tanh": lambda: F.gelu(F.linear(a, w, bias), approximate="tanh"),
            "torch addmm_act": lambda: torch._addmm_activation(bias, a, wt, use_gelu=True),
            "torch linear": lambda: F.linear(a, w, bias),
        }
        ref = F.linear(a.float(), w.float(), bias.float())
        refs = {"erf": F.gelu(ref), "tanh": F.gelu(ref, approximate="tanh")}
        errs = {}
        for name, fn in list(paths.items()):
            try:
                y = fn()
                mm.synchronize()
            except ValueError as exc:  # a kernel the bundle lacks: said, and the path dropped
                print(f"  {name}: not run ({str(exc).splitlines()[0][:160]})", flush=True)
                del paths[name]
                continue
            form = "erf" if "erf" in name else "tanh" if ("tanh" in name or "addmm" in name) else None
            if form:
                errs[name] = float((y.float() - refs[form]).abs().max() / refs[form].abs().max())
        graphs = {}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for fn in paths.values():
                fn()
        torch.cuda.current_stream().wait_stream(side)
        mm.synchronize()
        for name, fn in paths.items():
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                for _ in range(args.calls):
                    fn()
            graphs[name] = gr
        times = {(n, m): [] for n in paths for m in ("graph", "eager")}
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        for _ in range(args.reps):
            for name, fn in paths.items():
                for mode in ("graph", "eager"):
                    ev[0].record()
                    if mode == "graph":
                        graphs[name].replay()
                    else:
                        for _ in range(args.calls):
                            fn()
                    ev[1].record()
                    mm.synchronize()
                    times[(name, mode)].append(ev[0].elapsed_time(ev[1]) * 1e3 / args.calls)
        med = {key: statistics.median(v) for key, v in times.items()}
        print(f"\n{M}x{N}x{K} bf16 + bias: median us per call ({args.reps} x {args.calls})")
        for name in paths:
            e = errs.get(name)
            print(f"  {name:<20} graph {med[(name, 'graph')]:8.2f}  eager {med[(name, 'eager')]:8.2f}"
                  + (f"  max rel err {e:.2e}" if e is not None else ""))
            if out:
                for mode in ("graph", "eager"):
                    out.write(json.dumps({"card": card, "torch": torch.__version__, "M": M, "N": N,
                                          "K": K, "dtype": "bfloat16", "path": name, "mode": mode,
                                          "us": round(med[(name, mode)], 3), "max_rel_err": e,
                                          "calls": args.calls, "reps": args.reps}) + "\n")
        for mode in ("graph", "eager"):
            for form, unfused in (("erf", "torch unfused erf"), ("tanh", "torch unfused tanh")):
                if (f"tirx fused {form}", mode) not in med or ("tirx plain v12", mode) not in med:
                    continue
                ours = med[(f"tirx fused {form}", mode)]
                print(f"  {mode} {form}: unfused / tirx {med[(unfused, mode)] / ours:.3f}, "
                      f"addmm_act / tirx {med[('torch addmm_act', mode)] / ours:.3f}, "
                      f"tirx / plain v12 {ours / med[('tirx plain v12', mode)]:.3f}")
        if out:
            out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
