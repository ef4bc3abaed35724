"""On a Hopper GPU host: the fp8 cases of a suite (tirx_gemm.op.fp8_bench, what `tirx-gemm bench
--suite` runs) with, per case, the tile candidates of fp8.tile_candidates timed beside the pick;
one JSON line per case, then a summary line per scale kind.

  TIRX_GEMM_BUNDLE=B python3 lab/fp8_on_hopper/fp8_suite_run.py SUITE --out F.jsonl \
      [--candidates tiles|split|early|previous|thin|cluster|promotion|wide|interval ...] [--budget-s S]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from tirx_gemm.op import fp8, fp8_bench
from tirx_gemm.op import suite as suites


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite")
    ap.add_argument("--out", required=True)
    ap.add_argument("--candidates", nargs="+",
                    choices=("tiles", "split", "early", "previous", "thin", "cluster", "promotion",
                             "wide", "interval"),
                    default=(), help="time beside each pick: the tile candidates "
                    "(fp8.tile_candidates), its K splits (fp8.split_candidates), for block "
                    "scales at large M the EARLY_SCALES=True tile (early), the pick before "
                    "the mid-M rule (mid_m_tile) where it changed it (previous), at M <= 16 "
                    "the pick with the other A stages (thin: fp8_lab_variants.thin_candidates), at "
                    "M > 128 the pick on a CTA pair (cluster: fp8_lab_variants.cluster_candidates), "
                    "the staggered pick and the promotion's isolating variants (promotion: "
                    "fp8_lab_variants.promotion_candidates), the widest promoted tiles (wide: "
                    "fp8_lab_variants.wide_candidates), the promotion every second stage and the "
                    "L2 groups (interval: fp8_lab_variants.interval_candidates); several may be named")
    ap.add_argument("--budget-s", type=float, default=None)
    a = ap.parse_args(argv)
    s = suites.load_suite(a.suite)
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{name} ({sms} SMs), torch {torch.__version__}, suite {s.name}: "
          f"{len(s.fp8_cases())} fp8 cases", flush=True)
    def early(M, N, K, mode, dt, n):
        return [c for c in fp8.tile_candidates(M, N, K, mode, dt, n) if "EARLY_SCALES" in c[1]]
    def previous(M, N, K, mode, dt, n):
        # "previous": the pick before the mid-M rule (128 x 128 at M > 128), one name so that
        # a record's candidates.previous can be aggregated
        kw = fp8.choose_fp8(M, mode, False, dt, n, N=N, K=K)
        if M > fp8.SMALL_M and (kw["BLK_M"], kw["BLK_N"]) != (128, 128):
            return [("previous", {**kw, "BLK_M": 128, "BLK_N": 128})]
        return []
    from fp8_lab_variants import (cluster_candidates, interval_candidates,  # this folder (sys.path[0])
                                  promotion_candidates, thin_candidates, wide_candidates)
    fns = [{"tiles": fp8.tile_candidates, "split": fp8.split_candidates, "early": early,
            "previous": previous, "thin": thin_candidates,
            "cluster": cluster_candidates, "promotion": promotion_candidates,
            "wide": wide_candidates, "interval": interval_candidates}[c] for c in a.candidates]
    extra = (lambda M, N, K, mode: [c for fn in fns for c in fn(M, N, K, mode, "bfloat16", sms)]) \
        if fns else None
    t0 = time.time()
    with open(a.out, "a", encoding="utf-8") as f:
        def emit(rec):
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
        recs, failed = fp8_bench.bench_cases(s, device_name=name, sm_count=sms, extra_fn=extra,
                                             budget_s=a.budget_s, on_record=emit,
                                             file_fields=suites.suite_file_fields(s.path),
                                             log=lambda m: print(m, flush=True))
        for label, why in failed:
            f.write(json.dumps({"kind": "not_run", "case": label, "reason": why,
                                "device": name}) + "\n")
        for scale in suites.FP8_SCALES:
            part = [r for r in recs if r["suite"]["scale"] == scale and r["verified"]
                    and r.get("ratio_to_torch")]
            if not part:
                continue
            rs = [r["ratio_to_torch"] for r in part]
            summ = {"kind": "summary", "scale": scale, "device": name, "n": len(rs),
                    "geomean_ratio_to_torch": math.exp(sum(map(math.log, rs)) / len(rs)),
                    "min_ratio_to_torch": min(rs)}
            big = [r["ratio_to_torch_tensor"] for r in part if r["M"] >= 2048
                   and r.get("ratio_to_torch_tensor")]
            if big:
                summ["geomean_ratio_to_torch_tensor_m2048"] = \
                    math.exp(sum(map(math.log, big)) / len(big))
            f.write(json.dumps(summ) + "\n")
            print(json.dumps(summ), flush=True)
    bad = [r for r in recs if not r["verified"]]
    print(f"done in {time.time() - t0:.0f} s: {len(recs)} cases, {len(bad)} failed checks, "
          f"{len(failed)} not run", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
