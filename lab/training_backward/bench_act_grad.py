"""The activation gradient of a Linear with gelu, silu or SwiGLU, fused into one kernel or not.

For y = act(x @ w.T) at the up projections of Llama-3-8B's and Qwen2.5-7B's MLPs (as a
non-gated MLP would run them), and for SwiGLU (tirx_gemm::swiglu, y = silu(x @ gate.T) *
(x @ up.T) from the fused gate/up weight) at their gate/up projections, 4096 to 16384
tokens, bf16, in one run on one card:

* ``dz_fused``: dz = dy * act'(x @ w.T) by v15 with ACT_GRAD (tirx_gemm.op.act_grad) built
  without ACT_GRAD_PREFETCH: the recompute GEMM, dy loaded and dz formed in its epilogue, dz
  stored in bf16;
* ``dz_prefetch``: the same kernel built with ACT_GRAD_PREFETCH (dy's loads issued before the
  tile's last wgmma wait, so they complete under those wgmmas; act_grad.PREFETCH, the default
  for gelu and silu; SwiGLU has no such build);
* ``dz_unfused``: what the backward ran before: the recompute GEMM writing z in fp32 (the
  chooser's kernel), then torch's elementwise act'(z) and dy * act'(z), rounded to bf16
  (autograd.act_dz_unfused; SwiGLU: autograd.swiglu_dz_unfused);
  the same inputs, the results compared (max error <= 2e-2 of max |unfused|);
* ``fwdbwd_fused``, ``fwdbwd_unfused``: forward and backward through tirx_gemm.op.autograd
  (y = act(x @ w.T), then dx and dw: the three backward kernels with the fused dz, or the
  recompute + elementwise + the same dgrad and wgrad), act_grad.ENABLED switched between them,
  the fused dz as act_grad.PREFETCH picks (``act_grad_prefetch`` in the record);
  ``fwdbwd_torch``: torch's F.linear + activation, forward and backward; the forward that
  keeps z (tirx_gemm.op.act_save) is off in these arms;
* ``--save`` (run_save): forward + backward with the saved pre-activation (``fwdbwd_save``:
  v15's ACT_SAVE forward, torch's elementwise act backward, dgrad and wgrad on v15) against
  the recompute (``fwdbwd_fused``) and torch, and the forwards alone, gelu and silu only;
  ``fwd_save_pair`` / ``fwdbwd_save_pair``: the same with the save kernel on v15's CTA pair;
* ``--compiled`` (run_compiled): the forward torch.compile'd (inductor, fullgraph) and its
  compiled backward: ``cfwdbwd_save`` (the saved z), ``cfwdbwd_fused`` (the recompute),
  ``cfwdbwd_torch`` (torch's F.linear + activation compiled), ``fwdbwd_torch`` (eager).

dz_* are timed in CUDA graphs (GRAPH_CALLS calls a graph, the median of REPS replays: GPU
time), fwdbwd_* with back-to-back calls between CUDA events (autograd's host work included
where it is longer than the GPU's), as bench.py. Records: one JSON line per (layer, act, M,
what) with ms, the method, TFLOP/s (2MNK for dz, 6MNK for fwdbwd), ``speedup`` (unfused /
fused time) on the fused and prefetch rows and ``vs_torch`` (torch's fwdbwd time / this one)
on the fwdbwd_fused and fwdbwd_unfused rows; a case that fails leaves a ``what: "error"`` row.

    python lab/training_backward/bench_act_grad.py --out records/act_grad.jsonl [--budget-s 60]
    python lab/training_backward/bench_act_grad.py --save --out records/act_save.jsonl
    python lab/training_backward/bench_act_grad.py --compiled --out records/act_save_compiled.jsonl
    python lab/training_backward/bench_act_grad.py --requests   # the kernels, for the bundle
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

LAYERS = (("llama3_8b", "up", 14336, 4096), ("qwen2.5_7b", "up", 18944, 3584))
ACTS = ("gelu", "silu")
# SwiGLU: the fused gate/up weight (2 x intermediate rows), tirx_gemm::swiglu's backward
SWIGLU_LAYERS = (("llama3_8b", "gate_up", 28672, 4096), ("qwen2.5_7b", "gate_up", 37888, 3584))
TOKENS = (4096, 8192, 16384)


def cases(tokens=TOKENS, swiglu: bool = True):
    """(model, layer, act, M, N, K): per M, LAYERS with each of ACTS, then (``swiglu``)
    SWIGLU_LAYERS."""
    for M in tokens:
        for model, layer, N, K in LAYERS:
            for act in ACTS:
                yield model, layer, act, M, N, K
        if swiglu:
            for model, layer, N, K in SWIGLU_LAYERS:
                yield model, layer, "swiglu", M, N, K


def _todo(torch, budget_s: float, tokens, swiglu: bool = True):
    """The cases a run times (:func:`cases`) until ``budget_s`` from now is spent (the first one
    left out said), each as (its records' head: date, card and the case, the case)."""
    card = torch.cuda.get_device_name(0)
    date = datetime.date.today().isoformat()
    t_end = time.monotonic() + budget_s

    def each():
        for model, layer, act, M, N, K in cases(tokens, swiglu):
            if time.monotonic() > t_end:
                print(f"budget spent: stopped before {model} {layer} {act} M={M}")
                return
            yield ({"date": date, "card": card, "model": model, "layer": layer, "act": act,
                    "M": M, "N": N, "K": K}, (model, layer, act, M, N, K))
    return each()


def _inputs(torch, M: int, N: int, K: int, dy_cols: int):
    """x (M x K), w (N x K, over sqrt(K)) and dy (M x dy_cols), bf16 on the GPU, seeded by the
    shape: every run draws the same ones for a case."""
    bf = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    x = torch.randn(M, K, device="cuda", dtype=bf, generator=g)
    w = torch.randn(N, K, device="cuda", dtype=bf, generator=g) / K ** 0.5
    return x, w, torch.randn(M, dy_cols, device="cuda", dtype=bf, generator=g)


def _row(head: dict, what: str, timing: str, ms: float, flop: int) -> dict:
    """A timed row: the case's ``head`` fields, then what, how, ms and TFLOP/s."""
    return {**head, "dtype": "bfloat16", "what": what, "timing": timing, "ms": round(ms, 4),
            "tflops": round(flop / ms / 1e9, 1)}


def _write(f, rec: dict) -> None:
    f.write(json.dumps(rec) + "\n")
    f.flush()


def _failed(f, head: dict, what: str, e: Exception) -> None:
    """A case that failed: said, and its row (``what``, the error) written."""
    why = f"{type(e).__name__}: {str(e)[:300]}"
    print(f"{head['model']} {head['layer']} {head['act']} M={head['M']} FAILED: {why}",
          flush=True)
    _write(f, {**head, "what": what, "error": why})


def requests(sm_count: int = 132, tokens=TOKENS) -> list:
    """The kernels the run calls: the forward with the activation, the fp32 recompute, the
    fused kernel, dgrad and wgrad on v15 (autograd's builds), as calls.requests names them."""
    import torch

    import calls as C
    bf = torch.bfloat16
    rec = []
    for _model, _layer, act, M, N, K in cases(tokens):
        fwd = (("swiglu", M, N, K, bf, None, None, None, None) if act == "swiglu" else
               ("matmul", M, N, K, bf, None, act, None, None))
        rec += [fwd, ("matmul", M, N, K, bf, None, None, torch.float32, None),
                ("act_grad", M, N, K, bf, False, act, None, "v15")]
        if act != "swiglu":
            rec.append(("act_grad", M, N, K, bf, False, act, None, "v15_prefetch"))
        rec += [
                ("layout", M, K, N, bf, False, True, None, "v15"),
                ("layout", N, K, M, bf, True, True, None, "v15")]
    return C.requests(rec, sm_count)


SAVE_PAIR_TUNE: dict = {}  # act_save.TUNE of the fwd_save_pair arm: v15's CTA pair (v9's build)
# the GPU tests of the saved pre-activation (tests/test_gpu_autograd.py: test_act_save_grads)
SAVE_TEST_LAYER = (256, 512)
SAVE_TEST_CASES = (("gelu", "bfloat16", True), ("gelu_tanh", "bfloat16", True),
                   ("silu", "bfloat16", True), ("gelu", "float16", False),
                   ("gelu_tanh", "float16", False), ("silu", "float16", False))


def save_requests(sm_count: int = 132) -> list:
    """The v15 ACT_SAVE kernels (tirx_gemm.op.act_save, M at run time): the GPU tests' and
    the ``--save`` run's (gelu, silu at LAYERS, bf16, no bias); the backward's dgrad and
    wgrad kernels are :func:`requests`' and the tests' own."""
    from tirx_gemm.op import act_save as AS
    N, K = SAVE_TEST_LAYER
    reqs = [AS.request(4096, N, K, dt, act, bias, sm_count, tune=tune)
            for act, dt, bias in SAVE_TEST_CASES for tune in (None, SAVE_PAIR_TUNE)]
    reqs += [AS.request(4096, N, K, "bfloat16", act, False, sm_count, tune=tune)
             for _model, _layer, N, K in LAYERS for act in ACTS
             for tune in (None, SAVE_PAIR_TUNE)]
    return reqs


def run(out: Path, budget_s: float, tokens=TOKENS) -> int:
    import torch
    import torch.nn.functional as F

    import bench as B
    from tirx_gemm.matmul import fuse_gate_up
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import act_save as AS
    from tirx_gemm.op import autograd as AG
    todo = _todo(torch, budget_s, tokens)
    torch_act = {"gelu": F.gelu, "silu": F.silu}
    default = AGR.PREFETCH
    n = 0
    with out.open("a") as f:
        for head, (model, layer, act, M, N, K) in todo:
            try:
                sw = act == "swiglu"  # w: the fused gate/up weight, dy: M x N/2
                x, w, dy = _inputs(torch, M, N, K, N // 2 if sw else N)
                if sw:  # tirx_gemm::swiglu takes only a weight fuse_gate_up made (marked)
                    w = fuse_gate_up(w[:N // 2], w[N // 2:])
                arch = AG._arch(x.device)

                def fused():
                    return AGR.dz(x, w, dy, None, act, arch)

                def plain():  # the build without ACT_GRAD_PREFETCH
                    AGR.PREFETCH = False
                    try:
                        return fused()
                    finally:
                        AGR.PREFETCH = default

                def unfused():
                    return (AG.swiglu_dz_unfused(x, w, dy) if sw else
                            AG.act_dz_unfused(x, w, dy, None, act))

                got = plain()
                if got is None:
                    raise RuntimeError("the fused kernel does not apply here (not sm_90a?)")
                B._check(f"{layer} {act} M={M} dz", got, unfused())
                del got
                times, how = {}, {}
                for name, fn in (("dz_fused", plain), ("dz_unfused", unfused)):
                    times[name], how[name] = B._time(fn, torch)
                if not sw:  # the prefetch build (none for SwiGLU): checked first, not timed
                    AGR.PREFETCH = True  # where it fails
                    try:
                        B._check(f"{layer} {act} M={M} dz prefetch", fused(), unfused())
                        times["dz_prefetch"], how["dz_prefetch"] = B._time(fused, torch)
                    except Exception as e:  # noqa: BLE001 (printed; the other rows stand)
                        print(f"  prefetch FAILED: {type(e).__name__}: {str(e)[:200]}")
                    finally:
                        AGR.PREFETCH = default
                # (a detached copy of the fused weight would lose fuse_gate_up's mark)
                xs, ws = x.detach().requires_grad_(), (w.requires_grad_() if sw else
                                                       w.detach().requires_grad_())

                def step():
                    (AG.swiglu(xs, ws) if sw else AG.matmul(xs, ws, None, act)).backward(dy)

                def torch_step():
                    y = F.linear(xs, ws)
                    if sw:
                        v = y.view(M, N // 16, 2, 8)
                        y = F.silu(v[:, :, 0]) * v[:, :, 1]
                    else:
                        y = torch_act[act](y)
                    y.reshape(M, -1).backward(dy)

                for name, on in (("fwdbwd_fused", True), ("fwdbwd_unfused", False)):
                    AGR.set_enabled(on)
                    AS.set_enabled(False)  # the recompute (run_save times the saved z)
                    try:
                        times[name] = B._time_events(step, torch, B.GRAPH_CALLS)
                    finally:
                        AGR.set_enabled(True)
                        AS.set_enabled(True)
                    how[name] = "events"
                times["fwdbwd_torch"] = B._time_events(torch_step, torch, B.GRAPH_CALLS)
                how["fwdbwd_torch"] = "events"
                for what, ms in times.items():
                    flop = (2 if what.startswith("dz") else 6) * M * N * K  # N: the weight's rows
                    rec = _row(head, what, how[what], ms, flop)
                    if what.endswith("_fused") or what == "dz_prefetch":
                        base = "dz_unfused" if what == "dz_prefetch" else what.replace("fused",
                                                                                       "unfused")
                        rec["speedup"] = round(times[base] / ms, 3)
                    if what in ("fwdbwd_fused", "fwdbwd_unfused"):
                        rec["vs_torch"] = round(times["fwdbwd_torch"] / ms, 3)
                    if what == "fwdbwd_fused":
                        rec["act_grad_prefetch"] = default and not sw
                    _write(f, rec)
                speedup = times["dz_unfused"] / times["dz_fused"]
                pf = times.get("dz_prefetch")
                print(f"{model} {layer} {act} M={M}: dz fused {times['dz_fused']:.3f} ms "
                      f"(prefetch {pf if pf is None else round(pf, 3)}) vs "
                      f"unfused {times['dz_unfused']:.3f} ms (x{speedup:.2f}); "
                      f"fwd+bwd fused {times['fwdbwd_fused']:.3f} vs unfused "
                      f"{times['fwdbwd_unfused']:.3f} vs torch {times['fwdbwd_torch']:.3f} ms",
                      flush=True)
            except Exception as e:  # noqa: BLE001 (recorded; the next case runs)
                _failed(f, head, "error", e)
                torch.cuda.empty_cache()
                continue
            n += 1
            del x, w, dy, xs, ws
            torch.cuda.empty_cache()
    return n


def run_save(out: Path, budget_s: float, tokens=TOKENS) -> int:
    """``--save``: forward + backward with the saved pre-activation against the recompute path
    and torch, gelu and silu at LAYERS (bf16, no bias), CUDA events as run()'s fwdbwd rows:

    * ``fwdbwd_save``: tirx_gemm.op.autograd's default where the save kernel is found (v15's
      ACT_SAVE forward writing y and z, torch's elementwise act backward, dgrad and wgrad on v15);
    * ``fwdbwd_fused``: the same with act_save off (the recompute with dz in its epilogue, the
      build act_grad.PREFETCH picks: the previous default);
    * ``fwdbwd_torch``: F.linear + activation, forward and backward;
    * ``fwd_save``, ``fwd_infer``, ``fwd_torch``: the forward alone (with grad recorded: the save
      kernel; without: the inference kernel, y only; torch's GEMM + activation with grad);
      ``fwd_save_pair``: the save kernel built on v15's CTA pair (act_save.TUNE = {}), y checked.

    Each case first checks dx and dw of fwdbwd_save against torch's (TOL of max |torch|).
    Records: ms, TFLOP/s (6MNK fwdbwd, 2MNK fwd), ``vs_torch`` (torch's time / this one) on the
    tirx rows of each kind, ``speedup`` (fwdbwd_fused / fwdbwd_save) on fwdbwd_save."""
    import torch
    import torch.nn.functional as F

    import bench as B
    from tirx_gemm.op import act_save as AS
    from tirx_gemm.op import autograd as AG
    todo = _todo(torch, budget_s, tokens, swiglu=False)
    torch_act = {"gelu": F.gelu, "silu": F.silu}
    n = 0
    with out.open("a") as f:
        for head, (model, layer, act, M, N, K) in todo:
            try:
                x, w, dy = _inputs(torch, M, N, K, N)
                xs, ws = x.requires_grad_(), w.requires_grad_()
                if not AS.applies(xs, ws, None, act, None, AG._arch(xs.device)):
                    raise RuntimeError("the save kernel does not apply here")

                def step():
                    AG.matmul(xs, ws, None, act).backward(dy)

                def torch_step():
                    torch_act[act](F.linear(xs, ws)).backward(dy)

                def check_grads(what=""):  # dx and dw of step() against torch_step()'s
                    xs.grad = ws.grad = None
                    step()
                    got = (xs.grad.clone(), ws.grad.clone())
                    xs.grad = ws.grad = None
                    torch_step()
                    B._check(f"{layer} {act} M={M} dx{what}", got[0], xs.grad)
                    B._check(f"{layer} {act} M={M} dw{what}", got[1], ws.grad)

                check_grads()
                times = {"fwdbwd_save": B._time_events(step, torch, B.GRAPH_CALLS)}
                AS.set_enabled(False)
                try:
                    times["fwdbwd_fused"] = B._time_events(step, torch, B.GRAPH_CALLS)
                finally:
                    AS.set_enabled(True)
                times["fwdbwd_torch"] = B._time_events(torch_step, torch, B.GRAPH_CALLS)
                times["fwd_save"] = B._time_events(
                    lambda: AG.matmul(xs, ws, None, act), torch, B.GRAPH_CALLS)

                def infer():
                    with torch.no_grad():
                        AG.matmul(xs, ws, None, act)
                times["fwd_infer"] = B._time_events(infer, torch, B.GRAPH_CALLS)
                times["fwd_torch"] = B._time_events(
                    lambda: torch_act[act](F.linear(xs, ws)), torch, B.GRAPH_CALLS)
                prev, AS.TUNE = AS.TUNE, SAVE_PAIR_TUNE  # the same on v15's CTA pair
                try:
                    if not AS.applies(xs, ws, None, act, None, AG._arch(xs.device)):
                        raise RuntimeError("the CTA-pair save kernel is not loaded")
                    B._check(f"{layer} {act} M={M} y pair", AG.matmul(xs, ws, None, act),
                             torch_act[act](F.linear(xs, ws)))
                    times["fwd_save_pair"] = B._time_events(
                        lambda: AG.matmul(xs, ws, None, act), torch, B.GRAPH_CALLS)
                    check_grads(" pair")  # forward + backward with the pair's forward
                    times["fwdbwd_save_pair"] = B._time_events(step, torch, B.GRAPH_CALLS)
                except Exception as e:  # noqa: BLE001 (printed; the other rows stand)
                    print(f"  save_pair FAILED: {type(e).__name__}: {str(e)[:200]}")
                finally:
                    AS.TUNE = prev
                xs.grad = ws.grad = None
            except Exception as e:  # noqa: BLE001 (recorded; the next case runs)
                _failed(f, head, "error", e)
                torch.cuda.empty_cache()
                continue
            for what, ms in times.items():
                flop = (6 if what.startswith("fwdbwd") else 2) * M * N * K
                rec = _row(head, what, "events", ms, flop)
                kind = what.split("_")[0]
                if not what.endswith("_torch"):
                    rec["vs_torch"] = round(times[f"{kind}_torch"] / ms, 3)
                if what == "fwdbwd_save":
                    rec["speedup"] = round(times["fwdbwd_fused"] / ms, 3)
                _write(f, rec)
            ratio = times["fwdbwd_torch"] / times["fwdbwd_save"]
            print(f"{model} {layer} {act} M={M}: fwd+bwd save {times['fwdbwd_save']:.3f}"
                  f" recompute {times['fwdbwd_fused']:.3f} torch "
                  f"{times['fwdbwd_torch']:.3f} ms (x{ratio:.3f} torch); "
                  f"fwd save {times['fwd_save']:.3f} infer "
                  f"{times['fwd_infer']:.3f} torch {times['fwd_torch']:.3f} ms; pair fwd "
                  f"{times.get('fwd_save_pair', float('nan')):.3f} fwd+bwd "
                  f"{times.get('fwdbwd_save_pair', float('nan')):.3f} ms", flush=True)
            n += 1
            del x, w, dy, xs, ws
            torch.cuda.empty_cache()
    return n


def run_compiled(out: Path, budget_s: float, tokens=TOKENS) -> int:
    """torch.compile (inductor, fullgraph) of the forward of act(x @ w.T) with its backward
    (autograd's compiled backward graph): with the saved z (cfwdbwd_save), with the recompute
    (cfwdbwd_fused, the save path off) and torch's own compiled (cfwdbwd_torch), torch eager
    as a reference (fwdbwd_torch); dx, dw of the save arm checked against torch's first."""
    import torch
    import torch.nn.functional as F

    import bench as B
    from tirx_gemm.op import act_save as AS
    from tirx_gemm.op import autograd as AG
    todo = _todo(torch, budget_s, tokens, swiglu=False)
    torch_act = {"gelu": F.gelu, "silu": F.silu}
    n = 0
    with out.open("a") as f:
        for head, (model, layer, act, M, N, K) in todo:
            times = {}
            try:
                x, w, dy = _inputs(torch, M, N, K, N)
                xs, ws = x.requires_grad_(), w.requires_grad_()

                def ours(x, w):
                    return AG.matmul(x, w, None, act)

                def theirs(x, w):
                    return torch_act[act](F.linear(x, w))

                def arm(fn, reset=True):  # (a reset re-reads act_save.ENABLED)
                    if reset:
                        torch._dynamo.reset()
                    c = torch.compile(fn, fullgraph=True)

                    def step():
                        c(xs, ws).backward(dy)
                    step()
                    return step
                saved = []
                real = AS.OP
                AS.OP = lambda *a: saved.append(a[-1]) or real(*a)
                try:
                    step = arm(ours)
                finally:
                    AS.OP = real
                if saved != [act]:
                    raise RuntimeError(f"the compiled step did not trace the save op: {saved}")
                got = (xs.grad.clone(), ws.grad.clone())
                xs.grad = ws.grad = None
                torch_step = arm(theirs, reset=False)
                B._check(f"{layer} {act} M={M} compiled dx", got[0], xs.grad)
                B._check(f"{layer} {act} M={M} compiled dw", got[1], ws.grad)
                del got
                times["cfwdbwd_save"] = B._time_events(step, torch, B.GRAPH_CALLS)
                times["cfwdbwd_torch"] = B._time_events(torch_step, torch, B.GRAPH_CALLS)
                times["fwdbwd_torch"] = B._time_events(
                    lambda: theirs(xs, ws).backward(dy), torch, B.GRAPH_CALLS)
                AS.set_enabled(False)
                try:
                    times["cfwdbwd_fused"] = B._time_events(arm(ours), torch, B.GRAPH_CALLS)
                finally:
                    AS.set_enabled(True)
                    torch._dynamo.reset()
                xs.grad = ws.grad = None
            except Exception as e:  # noqa: BLE001 (recorded; the next case runs)
                _failed(f, head, "compiled_error", e)
                torch.cuda.empty_cache()
                if "cfwdbwd_torch" not in times:
                    continue
            for what, ms in times.items():
                rec = {**_row(head, what, "events", ms, 6 * M * N * K),
                       "compile": "inductor, fullgraph"}
                if what != "cfwdbwd_torch":
                    rec["vs_torch"] = round(times["cfwdbwd_torch"] / ms, 3)
                _write(f, rec)
            print(f"{model} {layer} {act} M={M} compiled: " + " ".join(
                f"{k} {v:.3f}" for k, v in times.items()) + " ms", flush=True)
            n += 1
            del x, w, dy, xs, ws
            torch.cuda.empty_cache()
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--tokens", default=None, help="comma-separated (default: all)")
    ap.add_argument("--requests", action="store_true", help="print the kernels and exit")
    ap.add_argument("--save", action="store_true",
                    help="forward + backward with the saved pre-activation (run_save) only")
    ap.add_argument("--compiled", action="store_true",
                    help="torch.compile'd forward + backward against torch compiled (run_compiled)")
    args = ap.parse_args(argv)
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else TOKENS
    if args.requests:
        for st, shape, kw in requests(tokens=tokens):
            print(st.key, shape, kw)
        return 0
    if args.out is None:
        ap.error("--out is required")
    n = (run_compiled if args.compiled else run_save if args.save else run)(
        args.out, args.budget_s, tokens)
    print(f"{n} cases recorded in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
