"""The models suite in fp8 ("the suite runs in fp8 too"), on a GPU host.

For every shape of a suite file (default tirx_gemm/op/suites/models.json) that fp8 can take
(K a multiple of 16, N of 8): ``tirx_gemm.matmul_fp8`` with per-tensor and rowwise scales,
promoted (the default), checked against the dequantized fp32 reference with the project's
fp8 tolerance (D poisoned with NaN first); then timed in the same run, CUDA events, median
of --reps after warm-up, L2 flushed before each launch, against ``torch._scaled_mm`` with
the same scales and the same accumulation setting (promoted against use_fast_accum=False,
fast against True), and against bf16 ``torch.matmul``. One JSON line per result, a geomean
summary at the end; exit 1 if a check fails.

    TIRX_GEMM_BUNDLE=.gpu/fp8 python lab/fp8_on_hopper/fp8_suite.py --out fp8_suite.jsonl

It reuses fp8_h200.py's inputs, check and timer (same folder), so the two agree on what
"checked" and "timed" mean.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_h200 as lab  # noqa: E402  (lab/fp8_on_hopper/fp8_h200.py)

from tirx_gemm.op import fp8  # noqa: E402
from tirx_gemm.matmul import use_bundle  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "tirx_gemm" / "op" / "suites" / "models.json"))
    ap.add_argument("--bundle", default=os.environ.get("TIRX_GEMM_BUNDLE", ".gpu/fp8"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="start no new shape after this many seconds (the rest are listed as skipped)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    use_bundle(args.bundle)
    suite = json.loads(Path(args.suite).read_text())
    shapes = []
    for s in suite["shapes"]:
        mnk = (int(s["M"]), int(s["N"]), int(s["K"]))
        if mnk[2] % fp8.K_MULTIPLE or mnk[1] % fp8.N_MULTIPLE:
            continue
        if mnk not in shapes:
            shapes.append(mnk)
    name = torch.cuda.get_device_name(dev)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)  # > the H200's 60 MB L2
    t0 = time.time()
    failed, ratios = 0, {"promoted": [], "fast": []}
    with open(args.out, "a", encoding="utf-8") as f:
        def emit(rec):
            rec = {"device": name, "torch": torch.__version__, "issue": 29, "suite": suite["name"],
                   **rec}
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
        lab.log(f"{name}: {len(shapes)} fp8 shapes of suite {suite['name']}")
        for i, (M, N, K) in enumerate(shapes):
            if time.time() - t0 > args.budget_s:
                emit({"kind": "skipped", "M": M, "N": N, "K": K, "reason": "time budget"})
                lab.log(f"skipped {M}x{N}x{K} (time budget)")
                continue
            for mode in ("tensor", "row"):
                res, kw, max_abs = lab.check_one(M, N, K, mode, False, dev, 1000 + i)
                failed += not res.ok
                emit({"kind": "check", "M": M, "N": N, "K": K, "scale": mode, "ok": res.ok,
                      "rel_err": res.rel_frobenius_error, "max_abs": max_abs, "kwargs": kw})
                if not res.ok:
                    lab.log(f"  FAILED check {M}x{N}x{K} {mode}: {res.summary()}")
            qa, qb, sa, sb = lab.make_inputs(M, N, K, "tensor", 7, dev)
            out = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
            bt = qb.t()
            a16 = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            b16 = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
            times = {}
            for fast in (False, True):
                kern = fp8._kernel(fp8.choose_fp8(M, "tensor", fast), (M, N, K))[0]
                kargs = (qa.view(torch.uint8), qb.view(torch.uint8), out,
                         *fp8.kernel_scales(sa, sb, "tensor"))
                times[("v13", fast)] = lab.timed(lambda: kern(*kargs), args.reps, args.warmup,
                                                 flush, dev, f"v13 {M}x{N}x{K}")[0]
                times[("torch", fast)] = lab.timed(
                    lambda fast=fast: torch._scaled_mm(qa, bt, scale_a=sa, scale_b=sb,
                                                       out_dtype=torch.bfloat16,
                                                       use_fast_accum=fast),
                    args.reps, args.warmup, flush, dev, f"_scaled_mm {M}x{N}x{K}")[0]
            times["bf16"] = lab.timed(lambda: torch.matmul(a16, b16.t()), args.reps, args.warmup,
                                      flush, dev, f"bf16 {M}x{N}x{K}")[0]
            for fast, label in ((False, "promoted"), (True, "fast")):
                r = times[("torch", fast)] / times[("v13", fast)]  # > 1: v13 faster
                ratios[label].append(r)
                emit({"kind": "ratio", "M": M, "N": N, "K": K, "accumulation": label,
                      "v13_ms": times[("v13", fast)], "scaled_mm_ms": times[("torch", fast)],
                      "bf16_matmul_ms": times["bf16"], "ratio_to_scaled_mm": r})
            lab.log(f"{M}x{N}x{K}: v13 {times[('v13', False)]:.4f} ms (fast "
                    f"{times[('v13', True)]:.4f}), _scaled_mm {times[('torch', False)]:.4f} "
                    f"(fast {times[('torch', True)]:.4f}), bf16 matmul {times['bf16']:.4f}: "
                    f"x_scaled_mm {times[('torch', False)] / times[('v13', False)]:.3f} "
                    f"(fast {times[('torch', True)] / times[('v13', True)]:.3f})")
        summary = {"kind": "summary", "shapes": len(shapes), "failed_checks": failed}
        for label, rs in ratios.items():
            if rs:
                summary[f"geomean_{label}"] = math.exp(sum(map(math.log, rs)) / len(rs))
                summary[f"min_{label}"] = min(rs)
                summary[f"timed_{label}"] = len(rs)
        emit(summary)
        lab.log(f"summary: {summary}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
