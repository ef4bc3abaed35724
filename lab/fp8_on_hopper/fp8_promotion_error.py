"""Emulate Hopper's fp8 wgmma accumulation and the promotion of partial sums.

No GPU: a numpy model. What it models, and where that comes from:
- e4m3 inputs: randn rows quantized per tensor to float8_e4m3fn (ml_dtypes), scale =
  amax / 448; the reference is the fp32 (here float64) product of the *dequantized*
  inputs, so the error below is the accumulation's alone, not the quantization's.
- the tensor core's accumulator: NVIDIA does not document the fp8 wgmma's accumulation
  precision. The DeepSeek-V3 technical report (arXiv 2412.19437, section 3.3.2) measured
  on H800 that it "is limited to retaining around 14 bits". The model: each m64nNk32
  wgmma adds its 32 products exactly and the running accumulator (previous value + that
  sum) keeps ``--bits`` significant bits, truncated toward zero (``--round nearest``
  rounds instead). This is a model of a measured behaviour, not a specification.
- promotion every P wgmmas (PROMOTE=P): the partial sum of P wgmmas (started from 0 in
  the limited accumulator) is added to an fp32 accumulator with an fp32 add; PROMOTE=0
  never promotes (the whole K stays in the limited accumulator).
Output: the relative Frobenius error of the fp32 result against the reference, per K and
PROMOTE, as a markdown table (what v13's card quotes) and, with --json, one JSON line each.

  .venv/bin/python lab/fp8_on_hopper/fp8_promotion_error.py [--bits 14] [--json out.jsonl]
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

E4M3_MAX = 448.0
WGMMA_K = 32


def quantize_e4m3(x: np.ndarray) -> tuple[np.ndarray, float]:
    """(x / scale rounded to e4m3, as float64; scale) with scale = amax / 448."""
    import ml_dtypes
    scale = float(np.abs(x).max()) / E4M3_MAX
    q = (x / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return q, scale


def keep_bits(x: np.ndarray, bits: int, mode: str) -> np.ndarray:
    """x with ``bits`` significant bits (the implicit one included): truncated toward zero
    or rounded to nearest."""
    m, e = np.frexp(x)                 # x = m * 2**e, 0.5 <= |m| < 1
    scaled = m * 2.0 ** bits
    scaled = np.trunc(scaled) if mode == "trunc" else np.round(scaled)
    return np.ldexp(scaled / 2.0 ** bits, e)


def emulate(Aq: np.ndarray, Bq: np.ndarray, promote: int, bits: int, mode: str) -> np.ndarray:
    """D = Aq @ Bq.T with the limited accumulator and promotion every ``promote`` wgmmas."""
    M, K = Aq.shape
    N = Bq.shape[0]
    acc32 = np.zeros((M, N), np.float32)    # the promoted fp32 accumulator
    tmp = np.zeros((M, N), np.float64)      # the tensor core's accumulator
    steps = (K + WGMMA_K - 1) // WGMMA_K
    for i in range(steps):
        k0 = i * WGMMA_K
        part = Aq[:, k0:k0 + WGMMA_K] @ Bq[:, k0:k0 + WGMMA_K].T   # exact: <= 32 e4m3 products
        tmp = keep_bits(tmp + part, bits, mode)
        if promote and ((i + 1) % promote == 0 or i == steps - 1):
            acc32 = (acc32 + tmp.astype(np.float32)).astype(np.float32)
            tmp = np.zeros_like(tmp)
    if not promote:
        acc32 = tmp.astype(np.float32)
    return acc32


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=14)
    ap.add_argument("--round", choices=("trunc", "nearest"), default="trunc")
    ap.add_argument("--mn", type=int, default=128, help="M = N of the emulated block")
    ap.add_argument("--ks", default="4096,16384")
    ap.add_argument("--promote", default="0,4,8,16,32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if not 4 <= a.bits <= 24:
        ap.error(f"--bits={a.bits} must be in [4, 24]")
    ks = [int(k) for k in a.ks.split(",")]
    promotes = [int(p) for p in a.promote.split(",")]
    rng = np.random.default_rng(a.seed)
    rows = []
    for K in ks:
        A = rng.standard_normal((a.mn, K))
        B = rng.standard_normal((a.mn, K))
        Aq, sa = quantize_e4m3(A)
        Bq, sb = quantize_e4m3(B)
        ref = Aq @ Bq.T  # float64: exact enough for a reference of the dequantized inputs
        for P in promotes:
            out = emulate(Aq, Bq, P, a.bits, a.round).astype(np.float64)
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            rows.append({"K": K, "PROMOTE": P, "rel_fro_err": err, "bits": a.bits,
                         "round": a.round, "mn": a.mn, "seed": a.seed,
                         "device": "none (numpy emulation)"})
            print(f"K={K} PROMOTE={P}: {err:.2e}", file=sys.stderr, flush=True)
    print(f"| K | " + " | ".join(f"PROMOTE={p}" for p in promotes) + " |")
    for K in ks:
        print(f"| {K} | " + " | ".join(f"{r['rel_fro_err']:.1e}" for r in rows
                                       if r["K"] == K) + " |")
    if a.json:
        with open(a.json, "a", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
