"""On a GPU host: tirx_gemm.matmul against torch.mm at every shape of a suite, both as CUDA
graphs of 20 calls (GPU time per call, no host cost: what a CUDA-graphed model sees), on
inputs rotated past the 60 MiB L2; each result first checked against F.linear in fp32.

    TIRX_GEMM_BUNDLE=B python lab/tools/matmul_graph_times.py SUITE --out FILE.jsonl [--step v10]

``--step``: matmul(..., step=STEP) at every shape instead of its own pick (a bundle from
``tirx-gemm export --suite SUITE --target STEP``): a step's times on the same scale as the
chooser's sweeps, e.g. v10's ping-pong for the model.

One line per (shape, dtype) with the step matmul picked, the times and the ratio
torch / tirx (> 1: tirx_gemm faster); the geomean and minimum at the end.

Timing (``--timing``): "interleaved" (the default, records ``"timing": "interleaved"``)
replays both graphs for at least 200 ms, then each 7 times in alternating order, and takes
the medians; "sequential" (the earlier suite runs' method) timed torch's graph first, then
matmul's, 5 replays each, which on the longest shapes put torch in the GPU's first-50-ms
boost and matmul after it (v12_sweep._graphs_interleaved).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from v12_sweep import _check, _graph_time, _graphs_interleaved, _inputs  # noqa: E402


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("suite")
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=200)
    p.add_argument("--step", default=None, help="force this step (matmul's step=)")
    p.add_argument("--timing", choices=("interleaved", "sequential"), default="interleaved")
    args = p.parse_args(argv)
    import torch
    import tirx_gemm
    from tirx_gemm.op import suite as suites
    from tirx_gemm import settings
    from tirx_gemm.bundle_format import code_git_sha
    from tirx_gemm.gitinfo import git_sha
    s = suites.load_suite(args.suite)
    # the code the kernels came from: the bundle's export, not this copy's git state
    bundle = settings.get("TIRX_GEMM_BUNDLE")
    sha = (code_git_sha(Path(bundle)) if bundle else None) or git_sha()
    dev = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0, ratios, bad = time.time(), [], 0
    forced = args.step
    for entry, dtype in s.cases():
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: stopping before {entry.label} {dtype}")
            break
        M, N, K = entry.shape
        ins, ref, pick, _ = _inputs(M, N, K, dtype, time_torch=False)
        if forced:
            step, kw = forced, {}
        else:
            step, kw = tirx_gemm.matmul.choose(M, N, K, dtype, "sm_90a", sms)
        a0, b0, d0 = ins[0]
        d0.fill_(float("nan"))
        try:
            tirx_gemm.matmul(a0, b0, out=d0, sync=True, step=forced)
        except Exception as exc:  # noqa: BLE001 - a refusal is a result
            print(f"REFUSED {entry.label} {dtype}: {str(exc).splitlines()[0]}", flush=True)
            bad += 1
            continue
        ok, rel = _check(d0, ref, dtype)
        fns = [[lambda a=a, b=b, d=d: torch.mm(a, b.t(), out=d) for a, b, d in pick],
               [lambda a=a, b=b, d=d: tirx_gemm.matmul(a, b, out=d, step=forced)
                for a, b, d in pick]]
        if args.timing == "interleaved":  # alternately, after a warm-up past the GPU's boost
            t_torch, t_ours = _graphs_interleaved(fns)
        else:  # torch's graph, then matmul's (the runs before the interleaved timing)
            t_torch, t_ours = _graph_time(fns[0]), _graph_time(fns[1])
        r = t_torch / t_ours
        bad += not ok
        if ok:
            ratios.append(r)
        tile = f" {kw['BLK_M']}x{kw['BLK_N']}" if "BLK_M" in kw else (
            f" split {kw['SPLIT_K']}" if "SPLIT_K" in kw else "")
        print(f"{entry.label:18} {dtype:8} {step}{tile:10} {'ok' if ok else 'WRONG'} "
              f"torch {t_torch * 1e3:8.1f} us  tirx {t_ours * 1e3:8.1f} us  {r:.3f}", flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps({"M": M, "N": N, "K": K, "dtype": dtype, "step": step,
                                "kwargs": kw, "ok": ok, "rel_err": rel, "torch_ms": t_torch,
                                "ms": t_ours, "ratio": r, "mode": "cuda_graph",
                                "timing": args.timing,
                                "device": dev, "torch": torch.__version__,
                                "git_sha": sha, "date": time.strftime("%Y-%m-%d"),
                                "suite": s.name, "model": entry.model,
                                "layer": entry.layer}) + "\n")
        del ins
    if ratios:
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"geomean {gm:.3f}, min {min(ratios):.3f} over {len(ratios)} checked cases; "
              f"{bad} refused or wrong; device {dev}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
