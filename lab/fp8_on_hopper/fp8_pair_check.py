"""On a Hopper GPU host: v13's CTA pair (CLUSTER=2) checked before it is timed, per scale kind, at
edge shapes (an odd number of 128-row tiles, so the last pair's second CTA lies wholly past M; N
and K off the tile; M just past the small-M rule's 128): the pair and the pick it pairs against
torch's dequantized product (fp8_bench.check), and the pair against the pick element by element
(the same sums in the same order: expected to agree exactly, reported as pair_equals_pick). One
JSON line per (shape, kind); the exit status is 1 if any pick or pair is outside the tolerance.

  TIRX_GEMM_BUNDLE=B python3 lab/fp8_on_hopper/fp8_pair_check.py --out F.jsonl [--variant stagger]
      [--suite FILE ...]

--variant stagger: the same check of the pick with STAGGER=True (its second consumer's stage pairs offset by
one; the same sums in the same order, so equal to the pick), records of kind "stagger_check", with one more
shape of a single K stage (the offset consumer's first and last stages are the same pair).
--variant wide: the pick and the 128 x 192 tile promoted every stage (fp8_lab_variants.wide_check_kwargs), at the
stagger check's shapes (N off the tile: with block scales a tile straddles two blocks of B), kind "wide_check";
--variant wide144: the same of the overlapped 128 x 144 tile (per tensor and rowwise), kind "wide144_check".
--variant interval: the pick promoted every second stage, overlapped (fp8_lab_variants.interval_check_kwargs;
per tensor and rowwise) at the stagger check's shapes (K of 1, 3, 8 and 9 stages: 3, 1, 0 and 3 zero stages
past K), kind "interval_check"; with --suite FILE [FILE ...] then also at each fp8 case of those suites (its
own scale kinds), the case's pick and that pick promoted every second stage (fp8_lab_variants.interval_case_kwargs:
what fp8_suite_run.py --candidates interval times there), each record naming its suite, model and layer.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from tirx_gemm import numerics
from tirx_gemm.op import fp8, fp8_bench

from fp8_lab_variants import (interval_case_kwargs, interval_check_kwargs,  # this folder (sys.path[0])
                              pair_check_kwargs, stagger_check_kwargs, wide_check_kwargs)

# (M, N, K): 33 row tiles (17 pairs, the last half past M), N and K off the tile (9 K stages:
# the overlapped promotion's zero stage), two row tiles (one pair) at M just over 128
SHAPES = ((4200, 4096, 1024), (2100, 1000, 1152), (129, 264, 384), (4096, 4096, 4096))
STAGGER_SHAPES = SHAPES[:3] + ((300, 520, 128),) + SHAPES[3:]


def check_one(M, N, K, mode, pick, variant_kw, variant, kind, device, extra=None) -> dict:
    """One check record: the pick and the variant against torch's dequantized product
    (fp8_bench.check, the fp8 tolerance of each one's PROMOTE), then the variant against the pick
    element by element; ok when both are within the tolerance."""
    rec = {"kind": kind, "M": M, "N": N, "K": K, "scale": mode, **(extra or {}),
           "device": device, "pick_kwargs": pick, f"{variant}_kwargs": variant_kw}
    inputs = None
    try:
        inputs = fp8_bench.make_inputs(M, N, K, mode, 3)
        for tag, kw in (("pick", pick), (variant, variant_kw)):
            ok, rel, why = fp8_bench.check(M, N, K, mode, torch.bfloat16, kw, 3, inputs=inputs)
            rec.update({f"{tag}_ok": ok, f"{tag}_rel_err": rel, f"{tag}_why": why})
        want = fp8.matmul_fp8(*inputs, _kwargs=pick, out_dtype=torch.bfloat16)
        got = fp8.matmul_fp8(*inputs, _kwargs=variant_kw, out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        rec[f"{variant}_equals_pick"] = bool(torch.equal(got, want))
        rec["max_abs_diff"] = float((got.float() - want.float()).abs().max())
    except Exception as exc:  # noqa: BLE001 - a launch error is this case's result
        rec["error"] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    # ok: both within the fp8 tolerance; <variant>_equals_pick is reported beside it
    rec["ok"] = bool(rec.get("pick_ok") and rec.get(f"{variant}_ok"))
    del inputs
    torch.cuda.empty_cache()
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", choices=("pair", "stagger", "wide", "wide144", "interval"),
                    default="pair")
    ap.add_argument("--suite", nargs="+", default=(),
                    help="--variant interval: also check at each fp8 case of these suites")
    a = ap.parse_args(argv)
    if a.suite and a.variant != "interval":
        ap.error("--suite is for --variant interval")
    kwargs_of, shapes, kind = {"pair": (pair_check_kwargs, SHAPES, "pair_check"),
                               "stagger": (stagger_check_kwargs, STAGGER_SHAPES, "stagger_check"),
                               "wide": (wide_check_kwargs, STAGGER_SHAPES, "wide_check"),
                               "wide144": (lambda m, n: wide_check_kwargs(m, n, 144), STAGGER_SHAPES,
                                           "wide144_check"),
                               "interval": (interval_check_kwargs, STAGGER_SHAPES,
                                            "interval_check")}[a.variant]
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    todo = []  # (M, N, K, mode, pick, variant keywords, extra record fields)
    for M, N, K in shapes:
        for mode in numerics.FP8_SCALES:
            if kwargs_of(mode, sms) is None:  # (wide144, interval: not block-scale candidates)
                continue
            todo.append((M, N, K, mode, *kwargs_of(mode, sms), None))
    if a.suite:
        from tirx_gemm.op import suite as suites
        for path in a.suite:
            s = suites.load_suite(path)
            for e, dt, mode in s.fp8_cases():
                both = interval_case_kwargs(e.M, e.N, e.K, mode, dt, sms)
                if both is None:
                    print(f"{e.M}x{e.N}x{e.K} {mode}: no interval candidate, not checked", flush=True)
                    continue
                todo.append((e.M, e.N, e.K, mode, *both,
                             {"suite": path, "model": e.model, "layer": e.layer}))
    bad = 0
    with open(a.out, "a", encoding="utf-8") as f:
        for M, N, K, mode, pick, pair, extra in todo:
            rec = check_one(M, N, K, mode, pick, pair, a.variant, kind, name, extra)
            bad += not rec["ok"]
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
            print(f"{M}x{N}x{K} {mode}: {'ok' if rec['ok'] else 'FAILED'} "
                  f"({a.variant} rel {rec.get(a.variant + '_rel_err')}, equal "
                  f"{rec.get(a.variant + '_equals_pick')}"
                  f"{', ' + rec['error'] if 'error' in rec else ''})", flush=True)
    print(f"{a.variant} check: {bad} failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
