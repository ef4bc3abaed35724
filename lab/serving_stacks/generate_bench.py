"""Greedy generation with transformers, patched (tirx_gemm.patch) against not patched, in one run.

Models are built locally from their configs with random weights (no download; bf16 on the GPU):
a Qwen2.5-0.5B-, a Llama-3.2-1B- and a Qwen2.5-7B-sized config. For each model, batch (1, 8, 32)
and mode it generates --new-tokens (128) tokens greedily from a fixed prompt (--prompt-tokens
token ids, the same for every row) and records tokens/s (batch x new tokens / wall time of
generate), the prefill time (generate with one new token) and whether the patched run's token ids
equal torch's (else the first differing step). Each timed generate runs --reps times per model,
the two models alternating and the order flipping each repeat (torch, tirx, then tirx, torch, ...)
after both were warmed up (torch's warm-up as long as a timed run, so that what is set up once per
sequence length, shared by both models, is not charged to the first one), so neither side is always first; the record keeps every run's tokens/s
(``*_runs``, in run order) and their median. --layers N builds the configs with N decoder layers
instead of the model's count (the record says so); --compiled-layers N only for the compiled mode,
whose compile time grows with the layer count, so that it fits a short budget. --no-cudnn-sdp turns
cuDNN's attention off for both models (the record's ``cudnn_sdp``); ``tirx_fallbacks`` counts the
patched model's calls that ran F.linear instead of a kernel (tirx_gemm.nn.Linear's ``fallbacks``);
``*_graphs_compiled`` and ``*_cudagraph_skips`` what dynamo compiled and the inductor's CUDA-graph
skips during each model's warm-up. --profile-tokens N: after a mode's timed runs, one more generate of N
new tokens per model under torch.profiler; a ``kind: profile`` record per model gives the GPU kernels
(count, busy time, the span from the first kernel's start to the last one's end, so span - busy = the
GPU's idle gaps), cudaGraphLaunch calls on the host, and the kernels that took the most time.
--cpu-profile-tokens N: one more generate of N new tokens per model under cProfile (the host's Python
time, function by function); a ``kind: cpu_profile`` record per model gives the functions with the
most own time and, in the patched model's, the functions whose own time exceeds torch's run the most.
--tirx-bias unfused: the patched layers add their bias after the GEMM instead of in v12's epilogue.
Modes:

  eager        the default dynamic cache, no compile
  static       cache_implementation="static" with the forward's compile turned off (disable_compile)
  compiled     cache_implementation="static": transformers compiles the decoding forward itself
               (its CompileConfig: torch.compile(mode="reduce-overhead", fullgraph=True))

The transformers package is a bench extra (not a core dependency). Kernels: a bundle exported for
the models' layers (--print-suite writes the suite: the token counts of TOKENS):

    python lab/serving_stacks/generate_bench.py --print-suite > generate_suite.json
    tirx-gemm export --suite generate_suite.json --arch sm_90a --num-sms 132 --out B
    TIRX_GEMM_BUNDLE=B python3 lab/serving_stacks/generate_bench.py --out F.jsonl [--models qwen0.5b]
        [--batches 1,8,32] [--modes eager,static,compiled] [--reps 2] [--layers N]
        [--compiled-layers 4] [--compiled-batches 1] [--budget-s 600]
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (family, hidden, intermediate, layers, heads, kv heads, vocab, tied embeddings)
MODELS = {
    "qwen0.5b": ("qwen2", 896, 4864, 24, 14, 2, 151936, True),
    "llama1b": ("llama", 2048, 8192, 16, 32, 8, 128256, True),
    "qwen7b": ("qwen2", 3584, 18944, 28, 28, 4, 152064, False),
}
# configs timed only Linear by Linear (decode_linears.py), never generated: held-out Qwen2.5 sizes
LINEARS_ONLY = {
    "qwen1.5b": ("qwen2", 1536, 8960, 28, 12, 2, 151936, True),
    "qwen3b": ("qwen2", 2048, 11008, 36, 16, 2, 151936, True),
    "qwen14b": ("qwen2", 5120, 13824, 48, 40, 8, 152064, False),
}


def layer_shapes(name):
    """(N, K, layer, bias) of every Linear of one decoder layer and the LM head."""
    fam, h, inter, _, heads, kv, vocab, _ = {**MODELS, **LINEARS_ONLY}[name]
    d = h // heads
    bias = fam == "qwen2"
    return [(heads * d, h, "q_proj", bias), (kv * d, h, "k_proj / v_proj", bias),
            (h, heads * d, "o_proj", False), (inter, h, "gate_proj / up_proj", False),
            (h, inter, "down_proj", False), (vocab, h, "lm_head", False)]


TOKENS = (1, 8, 32, 256, 1024)  # decode at batch 1, 8, 32; prefill of 32 tokens at batch 1, 8, 32


def print_suite(models) -> None:
    shapes = {}
    for name in models:
        for (N, K, layer, bias), M in ((s, M) for s in layer_shapes(name) for M in TOKENS):
            e = shapes.setdefault((M, N, K), {
                "M": M, "N": N, "K": K, "model": f"{name}-sized config", "layer": layer,
                "why": "greedy generation's token counts (decode at batch 1, 8, 32; prefill "
                       "of 32 tokens at each batch)", "all_m": False})
            if layer not in e["layer"]:
                e["layer"] += f"; {layer}"
            if bias:
                e["epilogues"] = [{"BIAS": "bfloat16"}]
    shapes = list(shapes.values())
    json.dump({"name": "generate", "description": "The Linear layers of the generation "
               "benchmark's models (lab/serving_stacks/generate_bench.py), bf16, every M.",
               "dtypes": ["bfloat16"], "shapes": shapes}, sys.stdout, indent=1)


def build(name, torch, layers=None):
    import transformers as tf
    fam, h, inter, full, heads, kv, vocab, tied = MODELS[name]
    layers = layers or full
    cfg_cls, model_cls = ((tf.Qwen2Config, tf.Qwen2ForCausalLM) if fam == "qwen2"
                          else (tf.LlamaConfig, tf.LlamaForCausalLM))
    cfg = cfg_cls(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                  tie_word_embeddings=tied, max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_cls(cfg).to(torch.bfloat16).eval()
    return model


def generate(model, ids, new, mode, torch):
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    if mode in ("static", "compiled"):
        kw["cache_implementation"] = "static"
    if mode == "static":
        kw["disable_compile"] = True
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    torch.cuda.synchronize()
    return out[:, ids.shape[1]:], time.perf_counter() - t


def profile_generate(model, ids, new, mode, torch, top=12) -> dict:
    """One generate of ``new`` tokens under torch.profiler: its GPU kernels and host launches."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _, wall = generate(model, ids, new, mode, torch)
    cuda = torch.autograd.DeviceType.CUDA
    try:  # kineto's raw list: every GPU activity (kernels, copies, sets) and runtime call
        raw = [(e.device_type(), e.start_ns() / 1e3, e.duration_ns() / 1e3, e.name())
               for e in prof.profiler.kineto_results.events()]
    except AttributeError:  # (another torch's profiler: its parsed events)
        raw = [(e.device_type, e.time_range.start, e.time_range.elapsed_us(), e.name)
               for e in prof.events()]
    return {"wall_ms": round(wall * 1e3, 3), **summarize_events(raw, cuda, top)}


def cpu_profile_generate(model, ids, new, mode, torch, top=25) -> dict:
    """One generate of ``new`` tokens under cProfile: wall time and, per function
    (``file:line(name)``), calls, own time and cumulative time in ms; the ``top`` by own time
    and by cumulative time, and ``_own`` (every function's own ms) for the comparison."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    _, wall = generate(model, ids, new, mode, torch)
    prof.disable()
    rows = {f"{Path(f).name}:{line}({fn})": (nc, tt * 1e3, ct * 1e3)
            for (f, line, fn), (_cc, nc, tt, ct, _callers) in pstats.Stats(prof).stats.items()}

    def table(key):
        best = sorted(rows.items(), key=lambda kv: -kv[1][key])[:top]
        return [{"fn": n[:160], "calls": c, "own_ms": round(t, 2), "cum_ms": round(u, 2)}
                for n, (c, t, u) in best]
    return {"wall_ms": round(wall * 1e3, 3), "own_ms_total": round(sum(r[1] for r in rows.values()), 1),
            "top_own": table(1), "top_cum": table(2), "_own": {n: r[1] for n, r in rows.items()},
            "_calls": {n: r[0] for n, r in rows.items()}}


def own_time_over(ours: dict, theirs: dict, top=25) -> list:
    """The functions whose own time in ``ours`` exceeds that in ``theirs`` the most (ms)."""
    extra = {n: t - theirs["_own"].get(n, 0.0) for n, t in ours["_own"].items()}
    best = sorted(extra.items(), key=lambda kv: -kv[1])[:top]
    return [{"fn": n[:160], "extra_ms": round(d, 2), "calls": ours["_calls"][n],
             "calls_torch": theirs["_calls"].get(n, 0)} for n, d in best]


def summarize_events(raw, cuda, top=12) -> dict:
    """(device type, start us, duration us, name) events -> the GPU activities' count, busy
    time (their durations summed: one stream, no overlap), span (first start to last end),
    idle = span - busy, the host's cudaGraphLaunch calls and their CPU time, and the ``top``
    activity names by total time."""
    kernels, graph_launches, launch_us = [], 0, 0.0
    for dev, start, dur, name in raw:
        if dev == cuda:
            kernels.append((start, start + dur, name))
        elif name == "cudaGraphLaunch":
            graph_launches += 1
            launch_us += dur
    kernels.sort()
    busy = sum(b - a for a, b, _ in kernels)
    span = (kernels[-1][1] - kernels[0][0]) if kernels else 0.0
    by_name: dict = {}
    for a, b, n in kernels:
        c, t = by_name.get(n, (0, 0.0))
        by_name[n] = (c + 1, t + b - a)
    heavy = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {"kernels": len(kernels), "kernel_busy_us": round(busy, 1),
            "kernel_span_us": round(span, 1), "gpu_idle_us": round(span - busy, 1),
            "graph_launches": graph_launches, "graph_launch_cpu_us": round(launch_us, 1),
            "top_kernels": [{"name": n[:160], "count": c, "us": round(t, 1)}
                            for n, (c, t) in heavy]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--modes", default="eager,static,compiled")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--compiled-layers", type=int, default=None,
                    help="the decoder layers of the compiled mode's models (default: --layers)")
    ap.add_argument("--compiled-batches", default=None,
                    help="the batches of the compiled mode (default: --batches)")
    ap.add_argument("--no-cudnn-sdp", action="store_true",
                    help="cuDNN's attention off for both models (torch.backends.cuda."
                         "enable_cudnn_sdp(False)); the record's cudnn_sdp says which ran")
    ap.add_argument("--budget-s", type=float, default=600.0)
    ap.add_argument("--profile-tokens", type=int, default=0,
                    help="after each mode's timed runs, profile one generate of this many new "
                         "tokens per model (a kind=profile record each; 0: none)")
    ap.add_argument("--cpu-profile-tokens", type=int, default=0,
                    help="after each mode's timed runs, one generate of this many new tokens per "
                         "model under cProfile (a kind=cpu_profile record each; 0: none)")
    ap.add_argument("--tirx-bias", choices=("fused", "unfused"), default="fused",
                    help="unfused: the patched layers add the bias after the GEMM (one torch add, "
                         "which torch.compile may fuse into the next pointwise kernel) instead of "
                         "v12's fused epilogue, eagerly and while torch.compile traces (the "
                         "record's tirx_bias)")
    ap.add_argument("--print-suite", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    models = args.models.split(",")
    if args.print_suite:
        print_suite(models)
        return 0
    import copy
    import statistics
    import torch
    import transformers
    from torch._dynamo.utils import counters
    import tirx_gemm

    def cudagraph_skips() -> int:  # what the inductor counted as CUDA-graph skips so far
        return sum(v for k, v in counters["inductor"].items() if "cudagraph_skip" in k)
    t0 = time.time()
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    if args.tirx_bias == "unfused":  # the layers' per-device answer, set before any call asks
        from tirx_gemm.op import nn as tnn
        tnn._fused_bias[torch.cuda.current_device()] = False
    p = torch.cuda.get_device_properties(0)
    card = f"{p.name} ({p.multi_processor_count} SMs)"
    print(card, "torch", torch.__version__, "transformers", transformers.__version__, flush=True)
    out = open(args.out, "a") if args.out else None
    modes = args.modes.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    compiled_batches = ([int(b) for b in args.compiled_batches.split(",")]
                        if args.compiled_batches else batches)
    last = 0.0
    for name in models:
        built = {}

        def models_of(layers):  # (torch's, patched) at this layer count, built once
            if layers not in built:
                built.clear()  # one pair on the GPU at a time
                torch.cuda.empty_cache()
                ref = build(name, torch, layers)
                ours = copy.deepcopy(ref)
                report = tirx_gemm.patch(ours)
                print(f"{name} ({ref.config.num_hidden_layers} layers): {len(report.replaced)} "
                      f"layers patched, {len(report.kept)} kept; attention "
                      f"{getattr(ref.config, '_attn_implementation', None)}, cuDNN SDPA "
                      f"{torch.backends.cuda.cudnn_sdp_enabled()}", flush=True)
                built[layers] = (ref, ours)
            return built[layers]
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(1, 1000, (1, args.prompt_tokens), generator=g)
        for mode in modes:
            ref, ours = models_of(args.compiled_layers if mode == "compiled" and
                                  args.compiled_layers else args.layers)
            layers = ref.config.num_hidden_layers
            for batch in (compiled_batches if mode == "compiled" else batches):
                if time.time() - t0 + last > args.budget_s:  # the last one's time as a guess
                    print(f"budget: {mode} batch {batch} not run ({time.time() - t0:.0f} s spent,"
                          f" the last one took {last:.0f} s)", flush=True)
                    continue
                start = time.time()
                ids = prompt.repeat(batch, 1).to("cuda")
                rec = {"card": card, "torch": torch.__version__, "transformers":
                       transformers.__version__, "model": name, "layers": layers,
                       "full_layers": MODELS[name][3], "batch": batch, "mode": mode,
                       "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens,
                       "reps": args.reps, "tirx_bias": args.tirx_bias,
                       "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled()}
                pair = {"torch": ref, "tirx": ours}
                # warm-up (and the compile) of both first; torch's as long as a timed run:
                # what is set up once per sequence length for both models (attention plans,
                # lazily loaded kernels) is then not charged to whichever model runs first
                # (graphs: what dynamo compiled meanwhile, 0 where nothing was compiled; cudagraph skips:
                # the inductor's count of decoding steps CUDA graphs could not capture)
                for who, n in (("torch", args.new_tokens), ("tirx", 4)):
                    w0, g0 = time.perf_counter(), counters["stats"]["unique_graphs"]
                    s0 = cudagraph_skips()
                    generate(pair[who], ids, n, mode, torch)
                    rec[f"{who}_warmup_s"] = round(time.perf_counter() - w0, 3)
                    rec[f"{who}_graphs_compiled"] = counters["stats"]["unique_graphs"] - g0
                    rec[f"{who}_cudagraph_skips"] = cudagraph_skips() - s0
                    print(f"  {mode} batch {batch}: {who} warmed up in {rec[f'{who}_warmup_s']} s"
                          f" ({rec[f'{who}_graphs_compiled']} graphs compiled)", flush=True)
                toks, runs, pre = {}, {"torch": [], "tirx": []}, {"torch": [], "tirx": []}
                for r in range(args.reps):
                    order = ("torch", "tirx") if r % 2 == 0 else ("tirx", "torch")
                    for who in order:
                        pre[who].append(generate(pair[who], ids, 1, mode, torch)[1])
                    for who in order:
                        toks[who], wall = generate(pair[who], ids, args.new_tokens, mode, torch)
                        runs[who].append(round(batch * args.new_tokens / wall, 2))
                for who in ("torch", "tirx"):
                    rec[f"{who}_tokens_per_s_runs"] = runs[who]
                    rec[f"{who}_tokens_per_s"] = round(statistics.median(runs[who]), 2)
                    rec[f"{who}_prefill_ms"] = round(statistics.median(pre[who]) * 1e3, 3)
                same = toks["torch"] == toks["tirx"]
                rec["identical"] = bool(same.all())
                diff = (~same).any(0).nonzero()
                rec["first_divergence_step"] = int(diff[0]) if len(diff) else None
                rec["speedup"] = round(rec["tirx_tokens_per_s"] / rec["torch_tokens_per_s"], 4)
                # calls the kernels could not serve, run by F.linear instead (tirx_gemm.nn.Linear);
                # while torch.compile traces, a fallback is traced as F.linear and not counted
                rec["tirx_fallbacks"] = sum(getattr(m, "fallbacks", 0) for m in ours.modules())
                rec["elapsed_s"] = round(time.time() - t0, 1)
                last = time.time() - start
                print(json.dumps(rec), flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                if args.profile_tokens > 0:
                    for who in ("torch", "tirx"):
                        prof = {k: rec[k] for k in ("card", "torch", "transformers", "model",
                                                    "layers", "batch", "mode", "cudnn_sdp")}
                        prof.update({"kind": "profile", "who": who,
                                     "new_tokens": args.profile_tokens},
                                    **profile_generate(pair[who], ids, args.profile_tokens,
                                                       mode, torch))
                        print(json.dumps(prof), flush=True)
                        if out:
                            out.write(json.dumps(prof) + "\n")
                            out.flush()
                if args.cpu_profile_tokens > 0:
                    got = {who: cpu_profile_generate(pair[who], ids, args.cpu_profile_tokens,
                                                     mode, torch) for who in ("torch", "tirx")}
                    for who in ("torch", "tirx"):
                        prof = {k: rec[k] for k in ("card", "torch", "transformers", "model",
                                                    "layers", "batch", "mode", "cudnn_sdp",
                                                    "tirx_bias")}
                        prof.update({"kind": "cpu_profile", "who": who,
                                     "new_tokens": args.cpu_profile_tokens},
                                    **{k: v for k, v in got[who].items() if not k.startswith("_")})
                        if who == "tirx":
                            prof["own_over_torch"] = own_time_over(got["tirx"], got["torch"])
                        print(json.dumps(prof)[:4000], flush=True)
                        if out:
                            out.write(json.dumps(prof) + "\n")
                            out.flush()
        built.clear()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
