"""On a GPU host: which kernels torch.matmul (cuBLAS) launches at every shape of a suite,
recorded once with torch.profiler, beside what tirx_gemm.matmul.choose picks there.

    python lab/cublas_kernels/cublas_kernels.py [SUITE] --out lab/cublas_kernels/records/cublas_kernels_h200.jsonl

cuBLAS's nvjet kernel names read as tile MxN _ BK x stages _ cluster (e.g.
nvjet_..._128x64_64x8_1x2_...); a split-K run adds a separate reduce kernel. One JSON line
per (shape, dtype): the kernel names and their count per call, and matmul's pick.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def kernels_of(fn, reps: int = 3) -> list[str]:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_call = {}
    for n in names:
        per_call[n] = per_call.get(n, 0) + 1
    return [f"{n} x{c // reps}" for n, c in sorted(per_call.items())]


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("suite", nargs="?", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--dtypes", default="bfloat16")
    a = p.parse_args(argv)
    from tirx_gemm.op import suite as suites
    from tirx_gemm.matmul import choose
    s = suites.load_suite(a.suite)
    dev = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for e in s.entries:
        for dt in a.dtypes.split(","):
            M, N, K = e.shape
            tdt = getattr(torch, dt)
            x = torch.randn(M, K, device="cuda", dtype=tdt)
            w = torch.randn(N, K, device="cuda", dtype=tdt)
            ks = kernels_of(lambda: torch.matmul(x, w.t()))
            step, kw = choose(M, N, K, dt, "sm_90a", sms)
            pick = step + (f" {kw['BLK_M']}x{kw['BLK_N']}" if "BLK_M" in kw else
                           f" split {kw['SPLIT_K']}" if "SPLIT_K" in kw else "")
            print(f"{e.label:18} {dt:8} tirx {pick:14} cuBLAS {' + '.join(ks)}", flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps({"M": M, "N": N, "K": K, "dtype": dt, "kernels": ks,
                                    "tirx_pick": pick, "device": dev,
                                    "torch": torch.__version__,
                                    "date": time.strftime("%Y-%m-%d")}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
