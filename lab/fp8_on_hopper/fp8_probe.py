"""On a Hopper GPU host: why matmul_fp8 trails torch's per-tensor kernel where it does. Per shape,
choose_fp8's pick timed beside variants of it that each remove one suspect (fp8_bench.time_case:
CUDA graphs, inputs rotated past the L2, the variants checked against the pick first):

* small M (one 64-row tile, one consumer warpgroup): "fast" (PROMOTE=0: no promotion, no
  wait_group 0 per pair of stages), "depth 4" (PIPE_DEPTH=4: a quarter of the loads in
  flight), "serial" (PROMOTE_OVERLAP=False: wait_group 0 after every stage); if the time
  follows the loads in flight and not the waits, the mainloop waits on memory. Then what might
  put more loads in flight: "thin A" (M <= 16: v13's A_ROWS 8 or 16, more stages of B in the
  same shared memory; "full A" where choose_fp8 picks thin A), "2/SM" and "2/SM half" (a grid of twice the SMs, a 6-stage ring, at
  most 64 wide, and half that width: two CTAs share an SM).
* M > 128 with fewer 128 x 128 tiles than half the SMs, in every scale kind (--small-only:
  none): of 128 x 128 (the tile before mid_m_tile), 128 x 64 and 64 x 64 those the pick is
  not, and 128 x 128 split along K (SPLIT_K 2 or 4, 128 or 64 wide; block: 64 wide).

One JSON line per shape ("kind": "fp8_probe"). probe_requests(): the kernels it needs beyond
the picks (lab/fp8_on_hopper/fp8_export.py --probe adds them to a bundle).

  TIRX_GEMM_BUNDLE=B python3 lab/fp8_on_hopper/fp8_probe.py --out F.jsonl [--budget-s S]
      [--small-only]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from tirx_gemm.op import fp8

SMALL = ((1, 8192, 28672), (1, 6144, 4096), (16, 4096, 14336), (128, 8192, 28672))
FILL = ((512, 576, 7168), (512, 1536, 7168))
SMS = 132
# two CTAs per SM (a grid of 2 x the SMs): at most 64 wide (128 registers x 256 threads each) and
# a 6-stage ring (107.5 KiB of shared memory at 64 wide, two of them within the SM's 228 KiB)
TWO_PER_SM_BLK_N_MAX, TWO_PER_SM_DEPTH = 64, 6


def variants(M: int, N: int, K: int, mode: str = "tensor", sms: int = SMS):
    """(name, v13 keywords) timed beside the pick at (M, N, K) (module docstring)."""
    pick = fp8.choose_fp8(M, mode, False, "bfloat16", sms, N=N, K=K)
    if M <= fp8.SMALL_M:
        w = min(pick["BLK_N"], TWO_PER_SM_BLK_N_MAX)
        two = {**pick, "SM_COUNT": 2 * sms, "PIPE_DEPTH": TWO_PER_SM_DEPTH}
        full = {k: v for k, v in pick.items() if k != "A_ROWS"}  # choose_fp8 picks thin A
        thin = [("full A", full)] if "A_ROWS" in pick else \
            [("thin A", {**pick, "A_ROWS": 8 if M <= 8 else 16})] if M <= 16 else []
        return thin + [("fast", {**pick, "PROMOTE": 0}), ("depth 4", {**pick, "PIPE_DEPTH": 4}),
                       ("serial", {**pick, "PROMOTE_OVERLAP": False}),
                       ("2/SM", {**two, "BLK_N": w}),
                       ("2/SM half", {**two, "BLK_N": max(16, w // 2)})]
    from tirx_gemm import splitk
    big = {**pick, "BLK_M": 128, "BLK_N": 128}  # the tile before mid_m_tile
    out = [(n, kw) for n, kw in (("128x128", big), ("64x64", {**big, "BLK_M": 64, "BLK_N": 64}),
                                 ("128x64", {**big, "BLK_N": 64})) if kw != pick]
    for bn, S in ((128, 2), (64, 2), (64, 4)) if mode != "block" else ((64, 2), (64, 4)):
        out.append((f"128x{bn} split{S}", {**big, "BLK_N": bn, "SPLIT_K": S,
                                           "L2_GROUP": splitk.l2_group_for(S)}))
    return out


def cases():
    """(M, N, K, scale kind) probed: the small-M shapes per tensor, the mid-M ones in every kind."""
    return [(*mnk, "tensor") for mnk in SMALL] + [(*mnk, mode) for mnk in FILL
                                                   for mode in ("tensor", "row", "block")]


def probe_requests(sms: int = SMS):
    """(step, build shape, keywords) of every variant (runtime-shape kernels)."""
    from tirx_gemm import registry
    from tirx_gemm.op.matmul import build_shape
    step = registry.get(fp8.FP8_STEP, fp8.ARCH)
    seen, reqs = set(), []
    probed = [kw for M, N, K, mode in cases() for _, kw in variants(M, N, K, mode, sms)]
    for kw in probed:
        key = tuple(sorted(kw.items()))
        if key not in seen:
            seen.add(key)
            reqs.append((step, build_shape((kw["BLK_M"], 256, 256), kw), kw))
    return reqs


def main(argv=None) -> int:
    import torch
    from tirx_gemm.op import fp8_bench
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=None)
    ap.add_argument("--small-only", action="store_true", help="only the small-M shapes")
    a = ap.parse_args(argv)
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.monotonic()
    with open(a.out, "a", encoding="utf-8") as f:
        for M, N, K, mode in cases():
            if a.small_only and M > fp8.SMALL_M:
                continue
            if a.budget_s is not None and time.monotonic() - t0 > a.budget_s:
                print(f"{M}x{N}x{K} {mode}: time budget spent", flush=True)
                continue
            pick = fp8.choose_fp8(M, mode, False, "bfloat16", sms, N=N, K=K)
            extra = variants(M, N, K, mode, sms)
            try:
                ms, errors = fp8_bench.time_case(M, N, K, mode, torch.bfloat16, pick,
                                                 extra=extra)
            except (ValueError, TypeError, RuntimeError) as exc:
                print(f"{M}x{N}x{K} {mode}: not run: {str(exc).splitlines()[0][:300]}", flush=True)
                continue
            rec = {"kind": "fp8_probe", "M": M, "N": N, "K": K, "scale": mode,
                   "device": name, "torch": torch.__version__, "pick": pick,
                   "timing": "cuda_graph_interleaved", "ms": ms, "errors": errors,
                   "variants": {n: kw for n, kw in extra}}
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
            times = "  ".join(f"{n} {v * 1e3:.1f} us" for n, v in ms.items())
            print(f"{M}x{N}x{K} {mode}: {times}"
                  + "".join(f"  {n}: {e}" for n, e in errors.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
