#!/usr/bin/env python
"""Each gelu path's error against float64 over every bfloat16 input in [-10, 10], on the GPU.

The GEMM is made exact: a (M x K, bf16) holds one 1 per row (a[m, m % K] = 1), so each output
D[m, n] = W[n, m % K] + bias[n] with a zero bias: the activation's input is exactly a weight
value. W (N x K) holds every bfloat16 value in [-10, 10] (cycled), so each path's output is
compared with float64 gelu of every such value. Per path, one JSON line: the largest absolute
error, the largest error in units of the output's bfloat16 half-ulp at the exact value where
|gelu| >= 1e-3 (1.0 = what rounding the exact result to bfloat16 costs at most; the same figures
for the exact result rounded, ``bf16 rounding``, are the floor) and the input where each is
largest. Paths as in
gelu_vs_cublaslt.py: tirx fused erf / tanh (matmul's), tirx approx erf / tanh (ACT_APPROX, if the
bundle has them), torch unfused erf / tanh (bf16 F.gelu of the bf16 GEMM), torch addmm_act (tanh
form), each form against its own float64 reference.

``--form-gap`` (CPU, no GPU or bundle): the same figures for the tanh form itself (float64, and
rounded to bfloat16) against the erf form's float64 reference: how far a gelu_tanh stands from
F.gelu's erf gelu, the yardstick for an approximate erf gelu.

    TIRX_GEMM_BUNDLE=B python3 lab/fused_epilogues/gelu_error_sweep.py [--m 2048] [--out F.jsonl]
    python lab/fused_epilogues/gelu_error_sweep.py --form-gap [--out F.jsonl]
"""
import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def bf16_values(lo=-10.0, hi=10.0):
    """Every finite bfloat16 value in [lo, hi], ascending, as float64 (CPU torch)."""
    import torch
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    v = bits.view(torch.bfloat16).double()
    v = v[torch.isfinite(v) & (v >= lo) & (v <= hi)]
    return torch.unique(v)


def gelu64(x, form):
    """float64 gelu: x Phi(x) (erf) or 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))."""
    import torch
    if form == "erf":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def half_ulp_bf16(y):
    """Half a bfloat16 ulp at each float64 value (the smallest normal's for tiny ones)."""
    import torch
    e = torch.floor(torch.log2(y.abs().clamp_min(2.0 ** -126)))
    return 2.0 ** (e - 8)  # 8 significant bits: ulp 2^(e-7), half of it 2^(e-8)


def errors(got, want, floor=1e-3):
    """(largest |got - want|, its index, largest |got - want| / half_ulp(want) where
    |want| >= floor, its index)."""
    d = (got - want).abs()
    u = torch_where(want.abs() >= floor, d / half_ulp_bf16(want), 0.0)
    i, j = int(d.argmax()), int(u.argmax())
    return float(d[i]), i, float(u[j]), j


def torch_where(cond, a, b):
    import torch
    return torch.where(cond, a, torch.as_tensor(b, dtype=a.dtype))


def record(card, torch_version, name, form, got, want, xs):
    """One sweep record: ``got`` against ``want`` over the inputs ``xs`` (flat float64)."""
    ab, i, ulp, j = errors(got, want)
    return {"card": card, "torch": torch_version, "kind": "error_sweep", "path": name,
            "form": form, "inputs": len(xs), "range": [-10, 10], "max_abs_err": ab,
            "x_at_max_abs": float(xs[i]), "max_err_half_ulps_gelu_1e-3": round(ulp, 3),
            "x_at_max_half_ulps": float(xs[j])}


def form_gap_records():
    """The tanh form (float64, then rounded to bfloat16) against the erf form's float64
    gelu over every bfloat16 input in [-10, 10] (CPU)."""
    import torch
    xs = bf16_values()
    erf, tanh = gelu64(xs, "erf"), gelu64(xs, "tanh")
    return [record("CPU, float64", torch.__version__, name, "erf", got, erf, xs)
            for name, got in (("tanh form vs erf", tanh),
                              ("bf16 tanh form vs erf", tanh.to(torch.bfloat16).double()))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--out", default=None)
    ap.add_argument("--form-gap", action="store_true",
                    help="CPU only: the tanh form against the erf form's float64 gelu")
    args = ap.parse_args()
    if args.form_gap:
        recs = form_gap_records()
        for rec in recs:
            print(json.dumps(rec), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.writelines(json.dumps(rec) + "\n" for rec in recs)
        return 0
    import torch
    import torch.nn.functional as F
    import tirx_gemm.matmul as mm
    from tirx_gemm import registry
    from tirx_gemm import epilogue as E
    from tirx_gemm.op.rules import choose
    M, N, K, bf = args.m, args.n, args.k, torch.bfloat16
    p = torch.cuda.get_device_properties(0)
    card = f"{p.name} ({p.multi_processor_count} SMs)"
    print(card, "torch", torch.__version__, flush=True)
    vals = bf16_values()
    w = vals.repeat(N * K // len(vals) + 1)[:N * K].view(N, K).to(bf).cuda()
    a = torch.zeros(M, K, dtype=bf, device="cuda")
    a[torch.arange(M), torch.arange(M) % K] = 1
    bias = torch.zeros(N, dtype=bf, device="cuda")
    x = w.t()[torch.arange(M) % K].double()  # D's exact input: x[m, n] = w[n, m % K]
    want = {f: gelu64(x, f) for f in ("erf", "tanh")}

    def approx(act):
        step, kw = choose(M, N, K, "bfloat16", "sm_90a", p.multi_processor_count,
                          {"BIAS": "bfloat16", "ACT": act})
        kw = {k: v for k, v in kw.items() if k not in E.WITH_EPILOGUE}
        kern = mm._load(registry.get(step, "sm_90a"), (M, N, K),
                        {**kw, "BIAS": "bfloat16", "ACT": act, "ACT_APPROX": True}).kernel
        y = torch.empty(M, N, device="cuda", dtype=bf)
        return lambda: (kern(a, w, y, bias), y)[1]
    paths = {
        "tirx fused erf": ("erf", lambda: mm.matmul(a, w, bias, "gelu")),
        "tirx fused tanh": ("tanh", lambda: mm.matmul(a, w, bias, "gelu_tanh")),
        "torch unfused erf": ("erf", lambda: F.gelu(F.linear(a, w, bias))),
        "torch unfused tanh": ("tanh", lambda: F.gelu(F.linear(a, w, bias), approximate="tanh")),
        "torch addmm_act": ("tanh", lambda: torch._addmm_activation(bias, a, w.t(), use_gelu=True)),
    }
    for name, act in (("tirx approx erf", "gelu"), ("tirx approx tanh", "gelu_tanh")):
        try:
            paths[name] = ("erf" if act == "gelu" else "tanh", approx(act))
        except (ValueError, RuntimeError, TypeError) as exc:
            print(f"  {name}: not run ({str(exc).splitlines()[0][:160]})", flush=True)
    out = open(args.out, "a") if args.out else None
    rows = []
    for form in ("erf", "tanh"):
        rows.append((f"bf16 rounding {form}", form, want[form].to(bf).double()))
    for name, (form, fn) in paths.items():
        try:
            y = fn()
            mm.synchronize()
        except (ValueError, RuntimeError) as exc:
            print(f"  {name}: not run ({str(exc).splitlines()[0][:160]})", flush=True)
            continue
        rows.append((name, form, y.double()))
    xs = x.flatten().cpu()
    for name, form, got in rows:
        rec = record(card, torch.__version__, name, form, got.flatten().cpu(),
                     want[form].flatten().cpu(), xs)
        rec["inputs"] = len(vals)
        print(json.dumps(rec), flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
