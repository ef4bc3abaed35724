"""Fused bias + gelu (erf and tanh forms) against torch's unfused sequence and cuBLASLt's fused
epilogue (``torch._addmm_activation(bias, a, w.t(), use_gelu=True)``, the tanh form), in one run.

Per token count M (default 512, 2048, 8192) of a 4096 x 1024 layer (bf16; the 6304 x 4096
x 1024 family): every path is checked once against float32 torch, then timed, interleaved, as the
median of --reps CUDA-graph replays of --calls back-to-back calls (CUDA events; the host's launch
cost out of the figure) and the same eagerly. Paths: tirx fused erf (``matmul(a, w, bias, "gelu")``),
tirx fused tanh (``"gelu_tanh"``), tirx plain v12 (``step="v12"``: the fused kernel's tile without
the epilogue), the same three on v10's ping-pong (``step="v10"``: each warpgroup's epilogue runs under
the other's mainloop), tirx deferred erf / tanh (matmul's v12 kernel built with EPI_DEFER=True: the
activation on the packed 16-bit tile, a quarter per K step of the next tile, under its wgmmas), torch
unfused erf (``F.gelu(F.linear(a, w, bias))``), torch unfused tanh
(``approximate="tanh"``), torch addmm_act (cuBLASLt GELU_BIAS) and torch linear (``F.linear`` with
the bias: the GEMM with no activation). One JSON line per (M, path, mode) in --out, then one "summary" line per (M, mode) with every path's
median (``us``: path -> microseconds); the ratios
(torch / tirx: the targets are >= 1.05 against unfused and >= 1.0 against addmm_act) are printed.

Made here (TVM): tirx-gemm export --suite lab/fused_epilogues/suites/gelu_tokens.json --arch sm_90a
    --num-sms 132 --out B, and the variants (v10's, v12 EPI_DEFER's): python
    lab/fused_epilogues/export_gelu_variants.py B
Run on the GPU host: TIRX_GEMM_BUNDLE=B python3 lab/fused_epilogues/gelu_vs_cublaslt.py --out F.jsonl
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--variants", default="v10,deferred",
                    help="comma list of the extra paths: v10 (v10's ping-pong), deferred (v12 "
                         "EPI_DEFER, lab/fused_epilogues/patches/epi_defer.patch applied), approx "
                         "(v12 ACT_APPROX: gelu with one tanh.approx, patches/act_approx.patch), "
                         "decompose (matmul's v12 tile with the bias alone, bias + relu, gelu "
                         "without the bias), bias_smem (matmul's v12 tile built with BIAS_SMEM=True: "
                         "the bias staged in shared memory by a producer warp; erf, tanh and the bias "
                         "alone, beside the same kernels without it called the same way), "
                         "approx_smem (ACT_APPROX and BIAS_SMEM together), no_bias (gelu_tanh "
                         "without a bias on matmul's tile for it: exact, ACT_APPROX, torch unfused). "
                         "ACT_APPROX's erf form runs only with act_approx.patch applied "
                         "(epilogue.APPROX_ACTS)")
    ap.add_argument("--clock-probe-ms", type=float, default=0,
                    help="after the first M's timing, replay each path's graph for this long in "
                         "turn and write its wall window (time.time()) to --out, for an SM clock "
                         "sampler running beside (nvidia-smi --query-gpu=timestamp,clocks.sm,...)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    import tirx_gemm.matmul as mm
    from tirx_gemm import epilogue as E
    from tirx_gemm.op.rules import explain
    from gpu_host import linear_operands, start

    t0 = time.time()
    p, card, out = start(torch, args.out)
    N, K, bf = args.n, args.k, torch.bfloat16
    for M in (int(m) for m in args.tokens.split(",")):
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: M={M} and later not run", flush=True)
            break
        a, w, bias = linear_operands(torch, M, N, K, M)
        wt = w.t()

        def on_gelu_tile(epi, extra=None, tile_of=None):  # matmul's v12 tile for bias + gelu
            # (or for the epilogue tile_of), built with `epi` and `extra`
            from tirx_gemm import registry
            from tirx_gemm.op.rules import choose
            step, kw = choose(M, N, K, "bfloat16", "sm_90a", p.multi_processor_count,
                              tile_of or {"BIAS": "bfloat16", "ACT": "gelu"})
            kw = {k: v for k, v in kw.items() if k not in E.WITH_EPILOGUE}
            kern = mm._load(registry.get(step, "sm_90a"), (M, N, K),
                            {**kw, **epi, **(extra or {})}).kernel
            y = torch.empty(M, N, device="cuda", dtype=bf)
            if epi.get("BIAS"):
                return lambda: (kern(a, w, y, bias), y)[1]
            return lambda: (kern(a, w, y), y)[1]

        def deferred(act):  # matmul's v12 kernel for this call, built with EPI_DEFER=True
            return on_gelu_tile({"BIAS": "bfloat16", "ACT": act}, {"EPI_DEFER": True})
        paths = {
            "tirx fused erf": lambda: mm.matmul(a, w, bias, "gelu"),
            "tirx fused tanh": lambda: mm.matmul(a, w, bias, "gelu_tanh"),
            "tirx plain v12": lambda: mm.matmul(a, w, step="v12"),
            "tirx v10 fused erf": lambda: mm.matmul(a, w, bias, "gelu", step="v10"),
            "tirx v10 fused tanh": lambda: mm.matmul(a, w, bias, "gelu_tanh", step="v10"),
            "tirx plain v10": lambda: mm.matmul(a, w, step="v10"),
            "torch unfused erf": lambda: F.gelu(F.linear(a, w, bias)),
            "torch unfused tanh": lambda: F.gelu(F.linear(a, w, bias), approximate="tanh"),
            "torch addmm_act": lambda: torch._addmm_activation(bias, a, wt, use_gelu=True),
            "torch linear": lambda: F.linear(a, w, bias),
        }
        variants = args.variants.split(",")
        if "v10" not in variants:
            for name in ("tirx v10 fused erf", "tirx v10 fused tanh", "tirx plain v10"):
                del paths[name]
        extra = {}
        if "deferred" in variants:
            extra["tirx deferred erf"] = lambda: deferred("gelu")
            extra["tirx deferred tanh"] = lambda: deferred("gelu_tanh")
        forms = [(f, a) for f, a in (("erf", "gelu"), ("tanh", "gelu_tanh")) if a in E.APPROX_ACTS]
        if "approx" in variants:
            for form, act in forms:
                extra[f"tirx approx {form}"] = lambda act=act: on_gelu_tile(
                    {"BIAS": "bfloat16", "ACT": act}, {"ACT_APPROX": True})
        if "bias_smem" in variants:  # A/B: the same tile, called the same way, with and without
            for form, act in (("erf", "gelu"), ("tanh", "gelu_tanh")):
                epi = {"BIAS": "bfloat16", "ACT": act}
                extra[f"tirx direct {form}"] = lambda epi=epi: on_gelu_tile(epi)
                extra[f"tirx smem {form}"] = lambda epi=epi: on_gelu_tile(epi, {"BIAS_SMEM": True})
            extra["tirx bias only"] = lambda: on_gelu_tile({"BIAS": "bfloat16"})
            extra["tirx smem bias only"] = lambda: on_gelu_tile({"BIAS": "bfloat16"},
                                                                {"BIAS_SMEM": True})
        if "approx_smem" in variants:  # ACT_APPROX's one-MUFU gelu with the bias in shared memory
            for form, act in forms:
                extra[f"tirx approx smem {form}"] = lambda act=act: on_gelu_tile(
                    {"BIAS": "bfloat16", "ACT": act}, {"ACT_APPROX": True, "BIAS_SMEM": True})
        if "decompose" in variants:
            extra["tirx bias only"] = lambda: on_gelu_tile({"BIAS": "bfloat16"})
            extra["tirx bias relu"] = lambda: on_gelu_tile({"BIAS": "bfloat16", "ACT": "relu"})
            extra["tirx gelu no bias"] = lambda: on_gelu_tile({"ACT": "gelu"})
        if "no_bias" in variants:  # gelu_tanh without a bias, on matmul's tile for it
            nb = {"ACT": "gelu_tanh"}
            extra["tirx tanh no bias"] = lambda: on_gelu_tile(nb, tile_of=nb)
            extra["tirx approx tanh no bias"] = lambda: on_gelu_tile(nb, {"ACT_APPROX": True},
                                                                     tile_of=nb)
            extra["torch unfused tanh no bias"] = lambda: lambda: F.gelu(F.linear(a, w),
                                                                        approximate="tanh")
            extra["tirx fused tanh no bias"] = lambda: lambda: mm.matmul(a, w, None, "gelu_tanh")
        for name, make in extra.items():
            try:
                paths[name] = make()
            except (ValueError, RuntimeError, TypeError) as exc:  # not in the bundle: not run
                print(f"  {name}: not run ({str(exc).splitlines()[0][:160]})", flush=True)
        ref = F.linear(a.float(), w.float(), bias.float())
        refs = {"erf": F.gelu(ref), "tanh": F.gelu(ref, approximate="tanh"),
                "tanh no bias": F.gelu(F.linear(a.float(), w.float()), approximate="tanh")}
        for epi in ({"BIAS": "bfloat16", "ACT": "gelu"}, {"BIAS": "bfloat16", "ACT": "gelu_tanh"},
                    {"ACT": "gelu_tanh"}):  # what matmul's own paths ran (its pick, by name)
            pick = explain(M, N, K, "bfloat16", "sm_90a", p.multi_processor_count, epi)
            kernel = pick.splitlines()[1].split()[-1]
            print(f"  matmul's pick for {E.tag(epi)}: {kernel}", flush=True)
            if out:
                out.write(json.dumps({"card": card, "kind": "pick", "M": M, "N": N, "K": K,
                                      "epilogue": E.tag(epi), "kernel": kernel}) + "\n")
        errs = {}
        for name, fn in list(paths.items()):
            try:
                y = fn()
                mm.synchronize()
            except (ValueError, RuntimeError) as exc:  # a kernel the bundle lacks: said, dropped
                print(f"  {name}: not run ({str(exc).splitlines()[0][:160]})", flush=True)
                del paths[name]
                continue
            form = "erf" if "erf" in name else "tanh" if ("tanh" in name or "addmm" in name) else None
            if form and name.endswith("no bias"):
                form += " no bias"
            if form in refs:
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
                for step, fused in (("v12", f"tirx fused {form}"), ("v12", f"tirx deferred {form}"),
                                    ("v12", f"tirx approx {form}"), ("v12", f"tirx smem {form}"),
                                    ("v12", f"tirx approx smem {form}"),
                                    ("v10", f"tirx v10 fused {form}")):
                    plain = f"tirx plain {step}"
                    if (fused, mode) not in med or (plain, mode) not in med:
                        continue
                    ours = med[(fused, mode)]
                    print(f"  {mode} {fused[5:]}: unfused / tirx {med[(unfused, mode)] / ours:.3f}, "
                          f"addmm_act / tirx {med[('torch addmm_act', mode)] / ours:.3f}, "
                          f"tirx / plain {step} {ours / med[(plain, mode)]:.3f}")
            for form in ("erf", "tanh"):
                for fast in (f"tirx approx smem {form}", f"tirx approx {form}"):
                    if (fast, mode) in med and (f"tirx smem {form}", mode) in med:
                        print(f"  {mode} {fast[5:]}: / smem {form} "
                              f"{med[(fast, mode)] / med[(f'tirx smem {form}', mode)]:.3f}, "
                              f"addmm_act / it {med[('torch addmm_act', mode)] / med[(fast, mode)]:.3f}")
                smem, base = (f"tirx smem {form}", mode), (f"tirx direct {form}", mode)
                if smem in med and base in med:
                    print(f"  {mode} smem {form}: smem / direct {med[smem] / med[base]:.3f}, "
                          f"addmm_act / smem {med[('torch addmm_act', mode)] / med[smem]:.3f}, "
                          f"unfused / smem {med[(f'torch unfused {form}', mode)] / med[smem]:.3f}")
            for name in ("tirx bias only", "tirx smem bias only", "tirx bias relu",
                         "tirx gelu no bias", "tirx tanh no bias", "tirx approx tanh no bias"):
                if (name, mode) in med and ("tirx plain v12", mode) in med:
                    print(f"  {mode} {name[5:]}: tirx / plain v12 "
                          f"{med[(name, mode)] / med[('tirx plain v12', mode)]:.3f}")
            nb = ("tirx approx tanh no bias", mode), ("tirx tanh no bias", mode)
            if all(k in med for k in nb) and ("torch unfused tanh no bias", mode) in med:
                print(f"  {mode} no bias: approx / exact {med[nb[0]] / med[nb[1]]:.3f}, torch unfused / "
                      f"approx {med[('torch unfused tanh no bias', mode)] / med[nb[0]]:.3f}")
        if args.clock_probe_ms and M == int(args.tokens.split(",")[0]):
            for name, gr in graphs.items():
                t_start, n = time.time(), 0
                while (time.time() - t_start) * 1e3 < args.clock_probe_ms:
                    for _ in range(20):
                        gr.replay()
                    torch.cuda.synchronize()
                    n += 20 * args.calls
                t_end = time.time()
                print(f"  clock probe {name}: {t_start:.3f} to {t_end:.3f}, "
                      f"{(t_end - t_start) / n * 1e6:.2f} us per call", flush=True)
                if out:
                    out.write(json.dumps({"card": card, "kind": "clock_probe", "M": M, "N": N,
                                          "K": K, "path": name, "t_start": round(t_start, 3),
                                          "t_end": round(t_end, 3), "calls": n,
                                          "local_start": time.strftime(
                                              "%Y/%m/%d %H:%M:%S", time.localtime(t_start))
                                          + f".{int(t_start * 1000) % 1000:03d}",
                                          "us": round((t_end - t_start) / n * 1e6, 3)}) + "\n")
        if out:  # one line per mode with every path's median: READMEs quote its quotients
            for mode in ("graph", "eager"):
                out.write(json.dumps({"card": card, "torch": torch.__version__, "kind": "summary",
                                      "M": M, "N": N, "K": K, "dtype": "bfloat16", "mode": mode,
                                      "us": {n: round(med[(n, mode)], 3) for n in paths}}) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
