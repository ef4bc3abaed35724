#!/usr/bin/env python
"""Export the variants gelu_vs_cublaslt.py times beside matmul's picks into a bundle: bias + gelu (erf, tanh).

The suite (suites/gelu_tokens.json) exports matmul's picks, v12 for a fused epilogue. gelu_vs_cublaslt.py
also times the same epilogues on v10's ping-pong (``matmul(..., step="v10")``; its kernels take M at run
time: one kernel per activation serves every token count of the 4096 x 1024 layer) and on matmul's v12
tile with EPI_DEFER=True (the activation on the packed tile, under the next tile's wgmmas) and with
ACT_APPROX=True (gelu with one tanh.approx), one kernel per activation and tile of --tokens;
--variants bias_smem instead: matmul's v12 tile for each activation and for the bias alone, with
BIAS_SMEM=True (the bias staged in shared memory) and the bias alone without it (no patch needed);
approx_smem: ACT_APPROX and BIAS_SMEM together. ACT_APPROX's tanh form (gelu_tanh) is a builder keyword;
its erf form (gelu) needs act_approx.patch applied (epilogue.APPROX_ACTS then names both). no_bias: gelu_tanh
without a bias on matmul's tile for it, exact and with ACT_APPROX.

    git apply lab/fused_epilogues/patches/epi_defer.patch lab/fused_epilogues/patches/act_approx.patch
    python lab/fused_epilogues/export_gelu_variants.py BUNDLE [--tokens 512,2048,8192] [--num-sms 132]
        [--ffi-wheel 3.12] [--variants v10,defer,approx | --variants bias_smem]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import lab_patches  # noqa: E402  (EPI_DEFER, ACT_APPROX: their patches applied first)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--num-sms", type=int, default=132)
    ap.add_argument("--ffi-wheel", default=None)
    ap.add_argument("--variants", default="v10,defer,approx",
                    help="comma list: v10, defer (EPI_DEFER), approx (ACT_APPROX), bias_smem, "
                         "approx_smem (ACT_APPROX and BIAS_SMEM), no_bias (gelu_tanh, no bias)")
    args = ap.parse_args()
    from tirx_gemm import registry
    from tirx_gemm.compile.bundle import export
    from tirx_gemm.op.matmul import build_shape
    from tirx_gemm.op.rules import choose, choose_epilogue_on
    from tirx_gemm import epilogue as E
    variants = set(args.variants.split(","))
    reqs, seen = [], set()
    for act in ("gelu", "gelu_tanh"):
        epi = {"BIAS": "bfloat16", "ACT": act}
        picks = [choose_epilogue_on("v10", 8192, args.n, args.k, "bfloat16", "sm_90a",
                                    args.num_sms, epi)] if "v10" in variants else []
        for M in (int(m) for m in args.tokens.split(",")):
            step, kw = choose(M, args.n, args.k, "bfloat16", "sm_90a", args.num_sms, epi)
            if "defer" in variants:
                picks.append((step, {**kw, "EPI_DEFER": True}))
            tile = {k: v for k, v in kw.items() if k not in E.WITH_EPILOGUE}
            if "approx" in variants and act in E.APPROX_ACTS:
                picks.append((step, {**tile, **epi, "ACT_APPROX": True}))
            if "approx_smem" in variants and act in E.APPROX_ACTS:
                picks.append((step, {**tile, **epi, "ACT_APPROX": True, "BIAS_SMEM": True}))
            if "no_bias" in variants and act in E.APPROX_ACTS:
                step_nb, kw_nb = choose(M, args.n, args.k, "bfloat16", "sm_90a", args.num_sms,
                                        {"ACT": act})
                tile_nb = {k: v for k, v in kw_nb.items() if k not in E.WITH_EPILOGUE}
                picks.append((step_nb, {**tile_nb, "ACT": act}))
                picks.append((step_nb, {**tile_nb, "ACT": act, "ACT_APPROX": True}))
            if "bias_smem" in variants:  # (the tile's kernel without it: the suite's)
                picks.append((step, {**tile, **epi, "BIAS_SMEM": True}))
                if act == "gelu":  # the bias alone, with and without
                    picks.append((step, {**tile, "BIAS": "bfloat16"}))
                    picks.append((step, {**tile, "BIAS": "bfloat16", "BIAS_SMEM": True}))
        for step, kw in picks:
            shape = build_shape((8192, args.n, args.k), kw)
            key = (step, shape, tuple(sorted(kw.items())))
            if key not in seen:
                seen.add(key)
                reqs.append((registry.get(step, "sm_90a"), shape, kw))
    lab_patches.require([kw for _, _, kw in reqs])
    print(f"{len(reqs)} kernels", flush=True)
    export(reqs, Path(args.bundle), jobs=1, ffi_wheel_python=args.ffi_wheel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
