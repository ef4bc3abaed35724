"""On a Hopper GPU host: Fp8Linear (tirx_gemm.op.fp8_nn) per scale kind against the bf16 layer it
came from, on real-scale activations: the relative error (Frobenius, against the fp32 product of
the bf16 operands) and the time per call under a CUDA graph, activation quantization included,
beside bf16 F.linear and torch's own fp8 path (the same torch quantization, then
torch._scaled_mm with the same scale kind; block: its 1x128 x 128x128 recipe where it runs).

  TIRX_GEMM_BUNDLE=B python3 lab/fp8_on_hopper/fp8_layer.py --out F.jsonl [--budget-s S]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

from tirx_gemm.op import fp8_bench, fp8_nn

LAYERS = (("Llama-3-8B", "q_proj+k_proj+v_proj fused", 4096, 6144),
          ("Llama-3-8B", "down_proj", 14336, 4096))
TOKENS = (1, 128, 2048)


def activations(M, K, seed):
    """randn with every 97th channel 30x (outlier channels) and per-token powers of two."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=g)
    x[:, ::fp8_bench.OUTLIER_EVERY] *= fp8_bench.OUTLIER_GAIN
    x *= torch.exp2(torch.randint(-3, 4, (M, 1), device="cuda", generator=g).float())
    return x.to(torch.bfloat16)


def torch_fp8(layer, x):
    """torch's fp8 path for the layer: fp8_nn's quantization, then torch._scaled_mm."""
    qa, sa = fp8_nn.quantize_activation(x, layer.scale)
    ws = fp8_nn._kernel_scale(layer.weight_scale, layer.scale)
    return fp8_bench.torch_scaled_mm(qa, layer.weight, sa, ws, layer.scale, torch.bfloat16)()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=30)
    a = ap.parse_args(argv)
    dev = torch.cuda.get_device_name()
    t0 = time.time()
    with open(a.out, "a", encoding="utf-8") as f, torch.no_grad():
        for model, layer_name, K, N in LAYERS:
            torch.manual_seed(K + N)
            lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
            lin.weight *= torch.exp2(torch.rand(N, 1, device="cuda") * 2 - 1).to(torch.bfloat16)
            for M in TOKENS:
                if time.time() - t0 > a.budget_s:
                    print("budget spent", flush=True)
                    return 0
                x = activations(M, K, M)
                ref = x.float() @ lin.weight.float().t()
                rec = {"kind": "layer", "model": model, "layer": layer_name, "M": M, "N": N,
                       "K": K, "device": dev, "torch": torch.__version__,
                       "activations": "randn, every 97th channel x30, per-token 2^[-3,3]",
                       "rel_err_bf16_linear": fp8_bench_rel(lin(x), ref)}
                fns, names = [[lambda: lin(x)]], ["bf16 F.linear"]
                for scale in fp8_nn.LAYER_SCALES:
                    layer = fp8_nn.Fp8Linear.from_linear(lin, scale, strict=True)
                    rec[f"rel_err_fp8_{scale}"] = fp8_bench_rel(layer(x), ref)
                    fns.append([lambda layer=layer: layer(x)])
                    names.append(f"Fp8Linear {scale}")
                    try:
                        torch_fp8(layer, x)
                        torch.cuda.synchronize()
                        fns.append([lambda layer=layer: torch_fp8(layer, x)])
                        names.append(f"torch fp8 {scale}")
                    except Exception as exc:  # noqa: BLE001 - torch refusing is a result
                        rec[f"torch_fp8_{scale}_error"] = str(exc).splitlines()[0][:200]
                ms = fp8_bench.graph_times(fns)
                rec["ms"] = dict(zip(names, ms))
                f.write(json.dumps(rec, sort_keys=True) + "\n")
                f.flush()
                print(json.dumps(rec), flush=True)
    return 0


def fp8_bench_rel(y, ref) -> float:
    return float((y.float() - ref).norm() / ref.norm())


if __name__ == "__main__":
    sys.exit(main())
