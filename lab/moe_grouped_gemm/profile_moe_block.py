"""Where the patched MoE block's time goes at decode, piece by piece, on the GPU and on the host.

    python lab/moe_grouped_gemm/profile_moe_block.py --out records/FILE.jsonl --log FILE.log
        [--models qwen3moe mixtral] [--tokens 1 16] [--budget-s S]

The blocks are bench_moe_mlp.py's (transformers' Qwen3-MoE and Mixtral blocks from a config,
random bf16 weights; fused epilogues on, the op's default). The experts module's inputs are
caught by a forward pre-hook, then the pieces of tirx_gemm Experts.forward run alone on them:
``permute`` (sort by expert, offs), ``gather`` (the rows and their routing weights in expert
order), ``gate_up`` (grouped_swiglu.swiglu_mm), ``down`` (grouped_mm with the row scale),
``unpermute``; and whole: ``experts`` (the patched module), ``block`` (router and experts).
The host path's changes are timed beside their baselines on the same inputs: ``permute`` /
``permute_before`` (argsort, scatter_add counts, cumsum), ``unpermute`` / ``unpermute_before``
(an fp32 copy before the sum), ``swiglu_rows`` / ``swiglu_rows_before`` (five launches); and
with ``--swap-swiglu``, ``gate_up_swap_fused``: the gate/up with grouped_epilogue.SWAP_FUSED on
(SwiGLU in the epilogue of the swap-AB decode tile: one launch).
For each piece:

- ``us_graph``: the piece alone captured in a CUDA graph, median replay time (a lone graph's
  launch included), events around the replay;
- ``us_host``: the wall time of issuing it eagerly (perf_counter over REPS calls after a
  sync, no sync inside): what Python, torch's dispatcher and the launches cost the host;
- ``kernels``: the GPU kernels one eager call launches (torch.profiler).

transformers' grouped_mm experts implementation (``config._experts_implementation =
"grouped_mm"``, what a model built through PreTrainedModel runs) gets the same ``experts`` and
``block`` rows (``peer_experts``, ``peer_block``). The log holds, per case, torch.profiler's
table of one eager experts call (ours and the peer's) and a cProfile of eager block calls
(ours), the top functions by own time.
"""
import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import bench_moe_mlp as BM  # noqa: E402

REPS = 50


def catch_inputs(module, call):
    """The (args, kwargs) ``module``'s forward got during ``call()``."""
    seen = {}

    def hook(_, args, kwargs):
        seen.setdefault("in", (args, kwargs))
    h = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        call()
    finally:
        h.remove()
    return seen["in"]


def host_us(fn, reps=REPS):
    """Median over 3 rounds of the wall time to issue fn() (us per call), GPU idle first."""
    fn()
    out = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def graph_us(fn):
    try:
        return BM.graph_ms(fn) * 1e3
    except Exception as exc:  # noqa: BLE001 -- a piece that cannot be captured says so
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def kernels_and_table(fn, rows=20):
    """(GPU kernels one eager fn() launches, torch.profiler's table sorted by own CPU time)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 -- no profiler here: the timings still run
        return None, f"torch.profiler failed: {type(exc).__name__}: {exc}"
    n = sum(1 for e in prof.events() if str(e.device_type).endswith("CUDA"))
    return n, prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def cprofile_top(fn, calls=30, rows=25):
    fn()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(rows)
    return s.getvalue()


def permute_before(top_k_index, num_experts):
    """permute as it was before the sort + searchsorted form (the baseline of the A/B)."""
    flat = top_k_index.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return order, torch.cumsum(counts, 0, dtype=torch.int32)


def unpermute_before(rows, order, tokens, k):
    back = torch.empty_like(rows)
    back.index_copy_(0, order, rows)
    return back.view(tokens, k, rows.shape[-1]).float().sum(1).to(rows.dtype)


def swiglu_rows_before(h):
    gate, up = h.chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(h.dtype)


def swap_fused(fn):
    """fn() with grouped_epilogue.SWAP_FUSED on (SwiGLU in the swap-AB decode tile's epilogue)."""
    from tirx_gemm.op import grouped_epilogue as GE
    before, GE.SWAP_FUSED = GE.SWAP_FUSED, True
    try:
        return fn()
    finally:
        GE.SWAP_FUSED = before


def pieces(experts, x, idx, w, swap_swiglu=False):
    """[(name, fn)] of Experts.forward's steps on (x, idx, w), each fn on fixed inputs."""
    from tirx_gemm.op import grouped as G
    from tirx_gemm.op import grouped_swiglu as GS
    from tirx_gemm.op import moe
    T, k = idx.shape
    order, offs = moe.permute(idx, experts.num_experts)
    rows = x.index_select(0, torch.div(order, k, rounding_mode="floor"))
    w_rows = w.reshape(-1).index_select(0, order)
    gu, dn = experts.gate_up_proj.transpose(1, 2), experts.down_proj.transpose(1, 2)
    h = GS.swiglu_mm(rows, gu, offs, gate_up="halves")
    hh = moe.grouped_mm(rows, gu, offs)  # the unfused gate/up result (2I wide)
    y = moe.grouped_mm(h, dn, offs, scale=w_rows.float())
    return [("permute", lambda: moe.permute(idx, experts.num_experts)),
            ("gather", lambda: (x.index_select(0, torch.div(order, k, rounding_mode="floor")),
                                w.reshape(-1).index_select(0, order))),
            ("gate_up", lambda: GS.swiglu_mm(rows, gu, offs, gate_up="halves")),
            ("down", lambda: moe.grouped_mm(h, dn, offs, scale=w_rows.float())),
            ("unpermute", lambda: moe.unpermute(y, order, T, k)),
            # the host path's changes, each beside its baseline (same inputs)
            ("permute_before", lambda: permute_before(idx, experts.num_experts)),
            ("unpermute_before", lambda: unpermute_before(y, order, T, k)),
            ("swiglu_rows", lambda: G.swiglu_rows(hh, interleaved=False)),
            ("swiglu_rows_before", lambda: swiglu_rows_before(hh))] + [
            ("gate_up_swap_fused", lambda: swap_fused(lambda: GS.swiglu_mm(
                rows, gu, offs, gate_up="halves")))] * swap_swiglu


def measure(fn, log, title):
    n, table = kernels_and_table(fn)
    print(f"--- {title}: torch.profiler, one eager call ({n} GPU kernels)\n{table}", file=log,
          flush=True)
    return {"us_graph": graph_us(fn), "us_host": host_us(fn), "kernels": n}


def profile_case(key, T, hf, ours, log, swap_swiglu=False):
    from tirx_gemm.op import moe
    x = torch.randn(1, T, BM.CONFIGS[key][3], device="cuda", dtype=torch.bfloat16)
    rec = {"model": BM.CONFIGS[key][0], "tokens": T, "dtype": "bfloat16",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "pieces": {}}
    with torch.no_grad():
        args, kwargs = catch_inputs(ours.experts, lambda: ours(x))
        assert isinstance(ours.experts, moe.Experts), "patch_moe did not swap the experts"
        xe, idx, w = (list(args) + [kwargs.get(n) for n in
                                    ("hidden_states", "top_k_index", "top_k_weights")])[:3]
        for name, fn in pieces(ours.experts, xe, idx, w, swap_swiglu):
            rec["pieces"][name] = measure(fn, log, f"{rec['model']} T={T} ours {name}")
        rec["experts"] = measure(lambda: ours.experts(*args, **kwargs), log,
                                 f"{rec['model']} T={T} ours experts")
        rec["block"] = {"us_graph": graph_us(lambda: ours(x)), "us_host": host_us(lambda: ours(x))}
        print(f"--- {rec['model']} T={T} ours block: cProfile of 30 eager calls\n"
              f"{cprofile_top(lambda: ours(x))}", file=log, flush=True)
        cfg = getattr(hf.experts, "config", None)
        if cfg is None or not hasattr(cfg, "_experts_implementation"):
            rec["peer_note"] = "this block has no experts_implementation setting"
            return rec
        before = cfg._experts_implementation
        try:
            cfg._experts_implementation = "grouped_mm"
            pa, pk = catch_inputs(hf.experts, lambda: hf(x))
            rec["peer_experts"] = measure(lambda: hf.experts(*pa, **pk), log,
                                          f"{rec['model']} T={T} peer experts")
            rec["peer_block"] = {"us_graph": graph_us(lambda: hf(x)),
                                 "us_host": host_us(lambda: hf(x))}
        except Exception as exc:  # noqa: BLE001 -- recorded beside ours
            rec["peer_note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        finally:
            cfg._experts_implementation = before
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--models", nargs="*", default=["qwen3moe", "mixtral"])
    ap.add_argument("--tokens", nargs="*", type=int, default=[1, 16])
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--swap-swiglu", action="store_true",
                    help="also the gate/up with grouped_epilogue.SWAP_FUSED on")
    args = ap.parse_args(argv)
    from tirx_gemm.op.moe import patch_moe
    t0, done = time.monotonic(), 0
    with open(args.log, "a") as log:
        for key in args.models:
            hf, _ = BM.build(key)
            ours, _ = BM.build(key)
            patch_moe(ours)
            for T in args.tokens:
                if done and time.monotonic() - t0 > args.budget_s:  # the first case always runs
                    print(f"budget of {args.budget_s:g} s spent", flush=True)
                    return 0
                try:
                    rec = profile_case(key, T, hf, ours, log, args.swap_swiglu)
                except Exception as exc:  # noqa: BLE001 -- recorded, the next case runs
                    rec = {"model": BM.CONFIGS[key][0], "tokens": T,
                           "device": torch.cuda.get_device_name(),
                           "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(json.dumps(rec), flush=True)
                done += 1
            del hf, ours
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
