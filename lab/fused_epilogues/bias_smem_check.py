"""Correctness of v12's BIAS_SMEM kernels (the bias staged in shared memory by a producer warp) before
any timing: each against float64 within the epilogue's tolerance, and bit for bit against the same tile's
kernel without BIAS_SMEM (the same fp32 math in the same order: only where the bias values come from differs).

The kernels are matmul's v12 tiles for bias + gelu on a 4096 x 1024 layer (128 x 128 at 512 tokens,
128 x 256 at 2048 and 8192; M, N, K at run time), so each runs here at shapes with edges too: M not a
multiple of 128, N past the last full tile (bias columns past N read as 0), a single K step.
One JSON line per (tile, epilogue, shape) in --out (``kind: check``). --approx adds the kernels built with
ACT_APPROX too (gelu_tanh with one tanh.approx, the builder's; the erf form with act_approx.patch applied,
epilogue.APPROX_ACTS): bit for bit against the ACT_APPROX register-bias kernel, and the tanh form (as accurate
as cuBLASLt's epilogue, matmul's pick) within the epilogue's tolerance of float64 F.gelu(approximate="tanh")
too (``strict``); the erf form's error is recorded only (it is a tanh-form gelu in accuracy).

Made here (TVM): python lab/fused_epilogues/export_gelu_variants.py B --variants bias_smem
Run on the GPU host: TIRX_GEMM_BUNDLE=B python3 lab/fused_epilogues/bias_smem_check.py --out F.jsonl
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

SHAPES = ((777, 1000, 2056), (300, 4104, 64), (1000, 4096, 1024), (1, 264, 128))
EPILOGUES = ({"BIAS": "bfloat16", "ACT": "gelu"}, {"BIAS": "bfloat16", "ACT": "gelu_tanh"},
             {"BIAS": "bfloat16"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="2048,512", help="token counts whose v12 tile to check")
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=30.0)
    ap.add_argument("--approx", action="store_true",
                    help="also the ACT_APPROX + BIAS_SMEM kernels (bits against ACT_APPROX's)")
    args = ap.parse_args()
    import torch
    import tirx_gemm.matmul as mm
    from tirx_gemm import epilogue as E
    from tirx_gemm import registry
    from tirx_gemm.op.rules import choose
    from gpu_host import linear_operands, start

    t0 = time.time()
    p, card, out = start(torch, args.out)
    step = registry.get("v12", "sm_90a")
    tiles = {}
    for M in (int(m) for m in args.tokens.split(",")):
        _, kw = choose(M, 4096, 1024, "bfloat16", "sm_90a", p.multi_processor_count,
                       EPILOGUES[0])
        tile = {k: v for k, v in kw.items() if k not in E.WITH_EPILOGUE}
        tiles[f"{tile['BLK_M']}x{tile['BLK_N']}"] = tile
    fails = {"bias_smem": 0, "approx_smem": 0}  # failing cases, strict / ACT_APPROX

    def verdict(note=""):  # one line per kind (run.sh reads them), the exit status
        for kind, n in fails.items():
            print(f"{kind}: {'FAILED' if n else 'all ok'}: {n} failing{note}", flush=True)
        return 1 if any(fails.values()) else 0
    cases = [(epi, {}) for epi in EPILOGUES]
    if args.approx:
        cases += [(epi, {"ACT_APPROX": True}) for epi in EPILOGUES if epi.get("ACT") in E.APPROX_ACTS]
    for epi, extra in cases:  # (the strict cases first, each on both tiles)
        for tname, tile in tiles.items():
            for (M, N, K) in SHAPES:
                if time.time() - t0 > args.budget_s:
                    return verdict(" (budget spent: the rest not checked)")
                a, w, bias = linear_operands(torch, M, N, K, M * 7 + N)
                ys = {}
                for smem in (False, True):
                    kern = mm._load(step, (M, N, K), {**tile, **epi, **extra, "BIAS_SMEM": smem}
                                    if smem else {**tile, **epi, **extra}).kernel
                    y = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
                    kern(a, w, y, bias)
                    ys[smem] = y
                torch.cuda.synchronize()
                ref = a.double() @ w.double().t() + bias.double()  # float64, on the GPU
                if epi.get("ACT"):  # torch's definitions (epilogue.act_np's), in float64
                    ref = torch.nn.functional.gelu(
                        ref, approximate="tanh" if epi["ACT"] == "gelu_tanh" else "none")
                got = ys[True].float().cpu().numpy()
                res = E.compare_np(got, ref.float().cpu().numpy(), epi, "bfloat16", K=K)
                same = bool(torch.equal(ys[True], ys[False]))
                strict = not extra or epi["ACT"] == "gelu_tanh"  # the erf form: the bits decide
                fails["approx_smem" if extra else "bias_smem"] += not ((res.ok or not strict)
                                                                        and same)
                name = E.tag(epi) + ("+approx" if extra else "")
                rec = {"card": card, "torch": torch.__version__, "kind": "check", "tile": tname,
                       "epilogue": name, "strict": strict, "M": M, "N": N, "K": K,
                       "ok": bool(res.ok),
                       "max_abs_error": res.max_abs_error, "atol": res.atol,
                       "bitwise_equal_to_register_bias": same,
                       "reason": res.reason}
                print(f"  {tname} {name:<29} {M}x{N}x{K}: ok={res.ok} "
                      f"max abs err {res.max_abs_error:.2e} (atol {res.atol:.2e}), "
                      f"same bits as the register-bias kernel: {same}"
                      + (f" ({res.reason})" if res.reason else ""), flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
    return verdict()


if __name__ == "__main__":
    raise SystemExit(main())
