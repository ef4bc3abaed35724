"""Time a whole MoE MLP block: transformers' module against the same module after patch_moe.

    python lab/moe_grouped_gemm/bench_moe_mlp.py --out records/FILE.jsonl [--tokens 1 16 4096]
        [--models mixtral qwen3moe] [--budget-s S] [--peers grouped_mm batched_mm]

The blocks are transformers' MixtralSparseMoeBlock (E 8, top-2, hidden 4096, FFN 14336) and
Qwen3MoeSparseMoeBlock (E 128, top-8, hidden 2048, FFN 768), built from a config with random
weights (bf16, no download); without transformers, a copy of their structure (router, stacked
experts, a loop over the experts hit). The same input runs through the block as it is (its
loop over experts: a host sync to find them) and through the patched block (routing, permute,
two grouped launches, unpermute, no sync): both eagerly (CUDA events around the forward,
median of 7 after 3 warm-ups) and the patched one under a CUDA graph as well. The outputs are
compared first (max relative error). A record per (model, tokens), saying whether the patched
block's SwiGLU (gate/up) and row scale (down) ran fused in v14's epilogue or as torch ops.

Two transformers peers. A block built on its own from a config has
``config._experts_implementation`` None, and transformers then runs the experts' own forward:
the Python loop over the experts hit (``ms_module``). A model built through PreTrainedModel
gets "grouped_mm" by default where torch has it (transformers 5.x, ``ExpertsInterface``):
sort, one ``torch.nn.functional.grouped_mm`` per projection, no host sync. With
``--peers grouped_mm`` (the default) the same block runs that way too, eager and under a CUDA
graph (``ms_grouped_mm_eager``, ``ms_grouped_mm_graph``, ``rel_err_grouped_mm`` against the
loop), and ``speedup_vs_grouped_mm_graph`` is its graphed time over the patched block's.
``--swap-swiglu`` times the patched block a second time with SwiGLU fused on the swap-AB decode
tiles (grouped_epilogue.SWAP_FUSED): ``ms_swap_swiglu_eager``, ``ms_swap_swiglu_graph``,
``rel_err_swap_swiglu``, ``speedup_vs_<peer>_<mode>_swap_swiglu``.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CONFIGS = {"mixtral": ("Mixtral-8x7B", 8, 2, 4096, 14336, True),
           "qwen3moe": ("Qwen3-30B-A3B", 128, 8, 2048, 768, False)}


class _Router(torch.nn.Module):
    def __init__(self, E, H, k, norm):
        super().__init__()
        self.top_k, self.norm = k, norm
        self.weight = torch.nn.Parameter(torch.empty(E, H))

    def forward(self, x):
        probs = F.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm:
            top = top / top.sum(dim=-1, keepdim=True)
        return None, top.to(x.dtype), idx


class _Experts(torch.nn.Module):
    def __init__(self, E, H, I):
        super().__init__()
        self.num_experts = E
        self.gate_up_proj = torch.nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = torch.nn.Parameter(torch.empty(E, H, I))
        self.act_fn = torch.nn.SiLU()

    def forward(self, x, top_k_index, top_k_weights):
        final = torch.zeros_like(x)
        mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            e = e[0]
            pos, tok = torch.where(mask[e])
            gate, up = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            h = F.linear(self.act_fn(gate) * up, self.down_proj[e])
            final.index_add_(0, tok, (h * top_k_weights[tok, pos, None]).to(final.dtype))
        return final


class _Block(torch.nn.Module):
    def __init__(self, E, k, H, I, norm):
        super().__init__()
        self.gate, self.experts = _Router(E, H, k, norm), _Experts(E, H, I)

    def forward(self, x):
        b, s, h = x.shape
        flat = x.view(-1, h)
        _, w, idx = self.gate(flat)
        return self.experts(flat, idx, w).reshape(b, s, h)


def build(key):
    """(block, where it came from) in bf16 on the GPU, weights N(0, 0.02), seeded."""
    name, E, k, H, I, norm = CONFIGS[key]
    torch.manual_seed(0)
    try:
        if key == "mixtral":
            from transformers import MixtralConfig
            from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
            block = MixtralSparseMoeBlock(MixtralConfig(
                hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=k))
        else:
            from transformers import Qwen3MoeConfig
            from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
            block = Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(
                hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k,
                norm_topk_prob=norm))
        source = f"transformers {__import__('transformers').__version__}"
    except ImportError:
        block, source = _Block(E, k, H, I, norm), "a copy of transformers' structure"
    block = block.to("cuda", torch.bfloat16).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02)
    return block, source


def _out(y):
    return y[0] if isinstance(y, tuple) else y


def eager_ms(fn, warm=3, reps=7):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_ms(fn, reps=7):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return eager_ms(g.replay, warm=3, reps=reps)


def time_peer(hf, x, want, peer, rec):
    """transformers' block with ``config._experts_implementation = peer`` (its
    ExpertsInterface), eager and graphed, into rec as ``*_<peer>*`` fields; put back after.
    A block without that setting (a copy of the structure, an older transformers) or a peer
    that fails gets ``<peer>_note`` instead."""
    cfg = getattr(hf.experts, "config", None)
    if cfg is None or not hasattr(cfg, "_experts_implementation"):
        rec[f"{peer}_note"] = "this block has no experts_implementation setting"
        return
    before = cfg._experts_implementation
    try:
        cfg._experts_implementation = peer
        with torch.no_grad():
            got = _out(hf(x)).float()
            rec[f"rel_err_{peer}"] = float((got - want).abs().max() / want.abs().max())
            rec[f"ms_{peer}_eager"] = eager_ms(lambda: hf(x))
            rec[f"speedup_vs_{peer}_eager"] = rec[f"ms_{peer}_eager"] / rec["ms_patched_eager"]
            rec[f"ms_{peer}_graph"] = graph_ms(lambda: hf(x))
            rec[f"speedup_vs_{peer}_graph"] = rec[f"ms_{peer}_graph"] / rec["ms_patched_graph"]
    except Exception as exc:  # noqa: BLE001 -- recorded beside the loop's figures
        rec[f"{peer}_note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        cfg._experts_implementation = before


def time_swap_swiglu(ours, x, want, rec):
    """The patched block again with grouped_epilogue.SWAP_FUSED on (SwiGLU in the epilogue of the
    swap-AB gate/up tiles at decode), eager and graphed, into rec as ``*_swap_swiglu*``
    fields; put back after. A failure is recorded as ``swap_swiglu_note``."""
    from tirx_gemm.op import grouped as G, grouped_epilogue as GE, grouped_swiglu as GS
    before = GE.SWAP_FUSED
    try:
        GE.SWAP_FUSED = True
        G._calls.clear()
        GS._calls.clear()
        with torch.no_grad():
            got = _out(ours(x)).float()
            rec["fused_swiglu_swap_swiglu"] = any(k is not None for k in GS._calls.values())
            rec["rel_err_swap_swiglu"] = float((got - want).abs().max() / want.abs().max())
            rec["ms_swap_swiglu_eager"] = eager_ms(lambda: ours(x))
            rec["ms_swap_swiglu_graph"] = graph_ms(lambda: ours(x))
    except Exception as exc:  # noqa: BLE001 -- recorded beside the default path's figures
        rec["swap_swiglu_note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        GE.SWAP_FUSED = before
        G._calls.clear()
        GS._calls.clear()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", nargs="*", type=int, default=[1, 16, 4096])
    ap.add_argument("--models", nargs="*", default=list(CONFIGS))
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--peers", nargs="*", default=["grouped_mm"],
                    help="transformers experts implementations timed beside its loop "
                         "(ExpertsInterface names, e.g. grouped_mm batched_mm; none: the loop only)")
    ap.add_argument("--fused", action="store_true", help="v14's fused SwiGLU and row scale "
                    "(tirx_gemm.op.grouped_epilogue.ENABLED, the op's default); without it the "
                    "bench turns them off: torch ops after the launches")
    ap.add_argument("--swap-swiglu", action="store_true", help="also time the patched block "
                    "with grouped_epilogue.SWAP_FUSED on (SwiGLU fused on the swap-AB decode tiles)")
    args = ap.parse_args(argv)
    from tirx_gemm.op import grouped as G, grouped_epilogue as GE, grouped_swiglu as GS
    GE.ENABLED = args.fused
    from tirx_gemm.op.moe import patch_moe
    t0 = time.monotonic()
    for key in args.models:
        hf, source = build(key)
        ours, _ = build(key)
        report = patch_moe(ours)
        print(f"{CONFIGS[key][0]} ({source}): {report}", flush=True)
        for T in args.tokens:
            if time.monotonic() - t0 > args.budget_s:
                print(f"budget of {args.budget_s:g} s spent", flush=True)
                return 0
            x = torch.randn(1, T, CONFIGS[key][3], device="cuda", dtype=torch.bfloat16)
            impl = getattr(getattr(hf.experts, "config", None), "_experts_implementation", None)
            rec = {"model": CONFIGS[key][0], "block": source, "experts_implementation": impl,
                   "tokens": T, "dtype": "bfloat16", "fused_enabled": args.fused,
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "swapped": report.replaced}
            G._calls.clear()
            GS._calls.clear()
            try:
                with torch.no_grad():
                    want, got = _out(hf(x)).float(), _out(ours(x)).float()
                    # which epilogues ran fused in v14 (grouped_epilogue, grouped_swiglu)
                    rec["fused_swiglu"] = any(k is not None for k in GS._calls.values())
                    rec["fused_row_scale"] = any(c[3].get("ROW_SCALE")
                                                 for c in G._calls.values())
                    rec["rel_err"] = float((got - want).abs().max() / want.abs().max())
                    rec["ms_module"] = eager_ms(lambda: hf(x))
                    rec["ms_patched_eager"] = eager_ms(lambda: ours(x))
                    rec["ms_patched_graph"] = graph_ms(lambda: ours(x))
                rec["speedup_eager"] = rec["ms_module"] / rec["ms_patched_eager"]
                rec["speedup_graph"] = rec["ms_module"] / rec["ms_patched_graph"]
                if args.swap_swiglu:
                    time_swap_swiglu(ours, x, want, rec)
                for peer in args.peers:
                    time_peer(hf, x, want, peer, rec)
                    for mode in ("eager", "graph") if "ms_swap_swiglu_graph" in rec else ():
                        if f"ms_{peer}_{mode}" in rec:
                            rec[f"speedup_vs_{peer}_{mode}_swap_swiglu"] = \
                                rec[f"ms_{peer}_{mode}"] / rec[f"ms_swap_swiglu_{mode}"]
            except Exception as exc:  # noqa: BLE001 -- recorded, the next case runs
                rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(json.dumps(rec), flush=True)
        del hf, ours
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
