#!/usr/bin/env python
"""One decode step of a stack of decoder layers under a CUDA graph, torch against the op's
PDL modes (tirx_gemm/op/launch_site.py): "always", "site" and "never".

A model's layers are built here from a config (random bf16 weights, RMSNorm, rotate-half RoPE,
GQA attention over a KV cache of --past tokens, SwiGLU MLP; q, k and v biases where the model
has them), --layers of them, and patched with tirx_gemm.patch. For each model and batch one
decode step is captured as a CUDA graph per arm (the mode set before the warm-up, so each
graph holds the kernels its mode launches) and the graphs are replayed interleaved: a sample
is --replays replays between CUDA events, the figure the median of --reps samples in us per
step. Every arm's output is checked against torch's (max relative error of the stack's update,
bf16 tolerance --tol) before it is timed.

  python lab/pdl_launch_site/decode_stack.py --print-suite > S.json   # the suite to export
  TIRX_GEMM_BUNDLE=B python lab/pdl_launch_site/decode_stack.py --out F.jsonl [--models ...]
  python lab/pdl_launch_site/decode_stack.py --verdict F.jsonl         # the rule of the README
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

# name: (hidden, heads, kv heads, head dim, MLP width, qkv bias, class)
MODELS = {
    "llama1b": (2048, 32, 8, 64, 8192, False, "suite"),      # Llama-3.2-1B-sized
    "qwen7b": (3584, 28, 4, 128, 18944, True, "suite"),      # Qwen2.5-7B-sized
    "llama3b": (3072, 24, 8, 128, 8192, False, "held_out"),  # Llama-3.2-3B-sized
    "mistral7b": (4096, 32, 8, 128, 14336, False, "held_out"),  # Mistral-7B-sized
}
BATCHES = (1, 8)
ARMS = ("always", "site", "never")


def linears(name: str) -> dict:
    h, heads, kv, hd, ffn, bias, _ = MODELS[name]
    return {"q_proj": (heads * hd, h, bias), "k_proj": (kv * hd, h, bias),
            "v_proj": (kv * hd, h, bias), "o_proj": (h, heads * hd, False),
            "gate_proj": (ffn, h, False), "up_proj": (ffn, h, False), "down_proj": (h, ffn, False)}


def suite(models, batches) -> dict:
    shapes = {}  # (M, N, K): an entry, its layers' names joined
    for name in models:
        for layer, (n, k, bias) in linears(name).items():
            for m in batches:
                e = shapes.setdefault((m, n, k), {
                    "M": m, "N": n, "K": k, "model": f"{name}-sized config", "layer": layer,
                    "why": "a Linear of the decode stack lab/pdl_launch_site times", "all_m": False})
                if layer not in e["layer"]:
                    e["layer"] += f", {layer}"
                if bias:
                    e["epilogues"] = [{"BIAS": "bfloat16"}]
    return {"name": "decode_stack", "description": "the Linear layers of "
            "lab/pdl_launch_site/decode_stack.py at its batches", "dtypes": ["bfloat16"],
            "shapes": list(shapes.values())}


def build(name: str, layers: int, seed: int = 0):
    import torch
    from torch import nn
    import torch.nn.functional as F
    h, heads, kv, hd, ffn, bias, _ = MODELS[name]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):
            f = x.float()
            return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)
                    * self.weight.float()).to(x.dtype)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q_proj = nn.Linear(h, heads * hd, bias=bias)
            self.k_proj = nn.Linear(h, kv * hd, bias=bias)
            self.v_proj = nn.Linear(h, kv * hd, bias=bias)
            self.o_proj = nn.Linear(heads * hd, h, bias=False)
            self.gate_proj = nn.Linear(h, ffn, bias=False)
            self.up_proj = nn.Linear(h, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, h, bias=False)

        def forward(self, x, cos, sin, cache, pos):
            B, T, _ = x.shape
            y = self.n1(x)
            q = self.q_proj(y).view(B, T, heads, hd).transpose(1, 2)
            k = self.k_proj(y).view(B, T, kv, hd).transpose(1, 2)
            v = self.v_proj(y).view(B, T, kv, hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            kc, vc = cache
            kc[:, :, pos:pos + T] = k
            vc[:, :, pos:pos + T] = v
            o = F.scaled_dot_product_attention(q, kc[:, :, :pos + T], vc[:, :, :pos + T],
                                               enable_gqa=True)
            x = x + self.o_proj(o.transpose(1, 2).reshape(B, T, heads * hd))
            y = self.n2(x)
            return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    def rope(x, cos, sin):
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, x, cos, sin, caches, pos):
            for layer, cache in zip(self.layers, caches):
                x = layer(x, cos, sin, cache, pos)
            return x

    torch.manual_seed(seed)
    with torch.device("cuda"):
        stack = Stack().to(torch.bfloat16)
    with torch.no_grad():
        for p in stack.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
            else:
                p.uniform_(0.8, 1.2) if p.shape[0] == h else p.normal_(0.0, 0.02)
    return stack.eval().requires_grad_(False)


def step_inputs(name: str, batch: int, layers: int, past: int):
    import torch
    h, heads, kv, hd, *_ = MODELS[name]
    g = torch.Generator(device="cuda").manual_seed(batch)
    x = torch.randn(batch, 1, h, device="cuda", dtype=torch.bfloat16, generator=g)
    inv = 1.0 / 1e6 ** (torch.arange(0, hd, 2, device="cuda").float() / hd)
    ang = torch.outer(torch.tensor([float(past)], device="cuda"), inv)
    ang = torch.cat((ang, ang), dim=-1)
    caches = [tuple(torch.randn(batch, kv, past + 1, hd, device="cuda", dtype=torch.bfloat16,
                                generator=g) for _ in range(2)) for _ in range(layers)]
    return x, ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16), caches


def time_graphs(replays: dict, n: int, reps: int, what: str) -> dict:
    """{arm: median us per replay}: each sample ``n`` replays between CUDA events, the arms
    rotated from sample to sample."""
    import torch
    from bench_overhead import sync, wait_event
    names, samples = list(replays), {k: [] for k in replays}
    for r in range(reps):
        for k in names[r % len(names):] + names[:r % len(names)]:
            sync(f"{what} {k}")
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(n):
                replays[k]()
            e1.record()
            wait_event(e1, f"{what} {k}")
            samples[k].append(e0.elapsed_time(e1) * 1e3 / n)
    return {k: statistics.median(v) for k, v in samples.items()}


def run_case(name, batch, base, patched, args, env) -> dict:
    import torch
    from bench_overhead import graphed, max_rel_err, sync
    from tirx_gemm.op import launch_site
    x, cos, sin, caches = step_inputs(name, batch, args.layers, args.past)
    own = {k: [tuple(c.clone() for c in cache) for cache in caches] for k in ("torch", *ARMS)}
    want = base(x, cos, sin, own["torch"], args.past)
    replays, errs = {}, {}
    _, replays["torch"] = graphed(lambda: base(x, cos, sin, own["torch"], args.past), 1,
                                  f"{name} b{batch} torch")
    for arm in ARMS:
        launch_site.set_mode(arm)
        got = patched(x, cos, sin, own[arm], args.past)
        sync(f"{name} b{batch} {arm}")
        errs[arm] = max_rel_err(got - x, want - x)
        _, replays[arm] = graphed(lambda: patched(x, cos, sin, own[arm], args.past), 1,
                                  f"{name} b{batch} {arm}")
    us = time_graphs(replays, args.replays, args.reps, f"{name} b{batch}")
    rec = {**env, "kind": "decode_stack", "model": name, "class": MODELS[name][6],
           "batch": batch, "layers": args.layers, "past": args.past, "reps": args.reps,
           "replays": args.replays, "us": {k: round(v, 2) for k, v in us.items()},
           "max_rel_err": {k: float(f"{v:.3g}") for k, v in errs.items()},
           "verified": all(v <= args.tol for v in errs.values())}
    print(f"{name} b{batch}: " + "  ".join(f"{k} {v:.1f} us" for k, v in us.items())
          + f"  always/site {us['always'] / us['site']:.3f}  never/site "
          f"{us['never'] / us['site']:.3f}  errors {rec['max_rel_err']}", flush=True)
    del replays
    torch.cuda.empty_cache()
    return rec


def verdict(path: str) -> int:
    """The README's rule over a record file: "site" on by default if every arm is within the
    tolerance and, in each class, always/site has a geomean of at least 1.01 with no case
    under 0.995."""
    recs = [json.loads(line) for line in open(path) if line.strip()]
    ok = bool(recs) and all(r["verified"] for r in recs)
    for cls in ("suite", "held_out"):
        rs = [r for r in recs if r["class"] == cls]
        gains = [r["us"]["always"] / r["us"]["site"] for r in rs]
        never = [r["us"]["never"] / r["us"]["site"] for r in rs]
        if not gains:
            print(f"{cls}: no records")
            ok = False
            continue
        gm = math.exp(sum(map(math.log, gains)) / len(gains))
        gn = math.exp(sum(map(math.log, never)) / len(never))
        passed = gm >= 1.01 and min(gains) >= 0.995
        ok = ok and passed
        print(f"{cls}: {len(rs)} cases, always/site geomean {gm:.3f} (min {min(gains):.3f}), "
              f"never/site geomean {gn:.3f}: {'pass' if passed else 'fail'}")
    print("verdict:", "adopt" if ok else "keep always")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--past", type=int, default=512)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--tol", type=float, default=3e-2)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--print-suite", action="store_true")
    ap.add_argument("--verdict", metavar="RECORDS")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    bad = [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"--models: unknown {', '.join(bad)} (known: {', '.join(MODELS)})")
    batches = [int(b) for b in args.batches.split(",")]
    if args.print_suite:
        print(json.dumps(suite(models, batches), indent=1))
        return 0
    if args.verdict:
        return verdict(args.verdict)
    import torch
    if not torch.cuda.is_available():
        print("decode_stack: no CUDA GPU here", file=sys.stderr)
        return 2
    import tirx_gemm
    from bench_overhead import environment
    env, t0, recs = environment(), time.monotonic(), []
    torch.set_grad_enabled(False)
    with torch.inference_mode():
        for name in models:
            base = build(name, args.layers)
            patched = copy.deepcopy(base)
            tirx_gemm.patch(patched)
            for b in batches:
                if time.monotonic() - t0 > args.budget_s:
                    print(f"budget spent: {name} b{b} not run", flush=True)
                    continue
                recs.append(run_case(name, b, base, patched, args, env))
            del base, patched
    if args.out and recs:
        with open(args.out, "a") as f:
            for r in recs:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    return 0 if recs and all(r["verified"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
