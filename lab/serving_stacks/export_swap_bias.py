"""Export v12's swap-AB tiles with the bias in their epilogue (BIAS on SWAP_AB) for the decode step's bias layers.

matmul's plain pick at a decode token count is a swap-AB tile (the MMA's rows walk N); with a bias it runs the
non-swap 64 x 16 bias tile instead, 1.2-1.4 us slower than cuBLAS's bias kernel at Qwen's q/k/v projections
(records/decode_linears_h100.jsonl). This exports, for each token count, matmul's plain pick with the bias added
(the keywords a bias epilogue refuses dropped: SHIFT_LAST, PDL_TRIGGER), so decode_linears.py can time them.
Run-time N and K: one kernel per tile serves every layer. v12 takes a bias on a swap-AB tile only with the study's
patch applied (not yet timed, so not in the step):

    git apply lab/serving_stacks/patches/swap_bias.patch
    python lab/serving_stacks/export_swap_bias.py BUNDLE [--tokens 1,8,32] [--num-sms 132]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DROP = ("SHIFT_LAST", "PDL_TRIGGER")  # refused with a fused epilogue (hgemm_v12's checks)


def swap_bias_kwargs(M: int, N: int, K: int, num_sms: int, bias: str = "bfloat16"):
    """(step, keywords) of matmul's plain bf16 pick at M x N x K with BIAS added, or None when
    that pick is not a one-split swap-AB v12 tile."""
    from tirx_gemm.op.rules import choose
    step, kw = choose(M, N, K, "bfloat16", "sm_90a", num_sms)
    if step != "v12" or not kw.get("SWAP_AB") or (kw.get("SPLIT_K") or 1) > 1:
        return None
    return step, {**{k: v for k, v in kw.items() if k not in DROP}, "BIAS": bias}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--tokens", default="1,8,32")
    ap.add_argument("--n", type=int, default=896)
    ap.add_argument("--k", type=int, default=896)
    ap.add_argument("--num-sms", type=int, default=132)
    ap.add_argument("--ffi-wheel", default=None)
    args = ap.parse_args()
    from tirx_gemm import registry
    from tirx_gemm.compile.bundle import export
    from tirx_gemm.op.matmul import build_shape
    reqs, seen = [], set()
    for M in (int(m) for m in args.tokens.split(",")):
        got = swap_bias_kwargs(M, args.n, args.k, args.num_sms)
        if got is None:
            print(f"M={M}: the plain pick is not a one-split swap-AB tile; skipped", flush=True)
            continue
        step, kw = got
        key = tuple(sorted(kw.items()))
        if key not in seen:
            seen.add(key)
            reqs.append((registry.get(step, "sm_90a"), build_shape((M, args.n, args.k), kw), kw))
    print(f"{len(reqs)} kernels: {[r[2] for r in reqs]}", flush=True)
    export(reqs, Path(args.bundle), jobs=1, ffi_wheel_python=args.ffi_wheel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
