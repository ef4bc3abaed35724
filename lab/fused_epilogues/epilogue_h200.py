"""On the H200: check and time the fused epilogues of sm_90a v12 through the public
API (tirx_gemm.matmul's bias / activation / out_dtype, tirx_gemm.swiglu), from a bundle.

Made here (a build machine with TVM):
    tirx-gemm export --suite tirx_gemm/op/suites/epilogue-h200.json --arch sm_90a \\
        --out .gpu/epilogue --ffi-wheel 3.12
Run on the GPU host (torch, no TVM), from the checkout with .gpu/epilogue carried:
    python3 lab/fused_epilogues/epilogue_h200.py --bundle .gpu/epilogue --out $OUT/epilogue.jsonl

What it does, every result one JSON line in --out (and a progress line on stdout):
(a) "check": every (entry, dtype, epilogue) of the suite: random inputs (randn * K**-0.25,
    as numerics' "random"), a bias (randn * 0.5) in its dtype, the output poisoned with
    NaN, compared with a float64 reference (act(A @ B.T + bias); SwiGLU from the unfused
    w_gate / w_up, so the interleave layout is checked too) under
    tirx_gemm.epilogue.tolerance(kwargs, dtype, K).
(b) "time" (bf16 entries with 2 epilogues or fewer, the timing shapes): CUDA events, 5
    warm-ups, the median of 25 single-call timings; every wait through tirx_gemm's hang
    guard (matmul.synchronize). Per case: fused; v12 plain with the same tile
    (matmul(..., step="v12"): the epilogue's own cost); matmul plain (what a user gets
    unfused, v9 where it wins); torch's unfused sequence (F.linear then the activation;
    SwiGLU: two F.linear, silu, mul); torch.compile of that function (skipped once the
    compile budget is spent). Ratios are written as fused / plain and torch / fused.
--budget-s (default 270) stops starting new work past it, so the run ends within 5 minutes.
--plan-only (no GPU needed): resolve every kernel the run will call in the bundle, as an
H200 (sm_90a, 132 SMs) would pick it, and print what is missing (exit 1 if anything is).

--v10 (with --suite tirx_gemm/op/suites/epilogue-v10.json; the bundle made by the two export
commands below): the ping-pong comparison instead of (a) and (b). Per shape one set of
inputs and bias; every kernel is first checked once (its output poisoned with NaN, against
the float64 reference under epilogue.tolerance), then timed only if it passed, all in one
run: v12 plain (``matmul(a, w, step="v12")``, the tile v12's fused call gets), v10 plain
(``step="v10"``), then per activation v12 fused and v10 fused (``matmul(a, w, bias, act,
step=...)``), then both plain kernels again (their drift across the shape's timings).
Records: "v10check" and "v10time" lines (ratios v10 fused / v12 fused, fused / plain of
each step). Export (here, with TVM):
    rm -rf .gpu/epilogue
    tirx-gemm export --suite tirx_gemm/op/suites/epilogue-h200.json --arch sm_90a \
        --out .gpu/epilogue --ffi-wheel 3.12
    tirx-gemm export --suite tirx_gemm/op/suites/epilogue-v10.json --arch sm_90a \
        --out .gpu/epilogue --ffi-wheel 3.12
Run: python3 lab/fused_epilogues/epilogue_h200.py --v10 --suite tirx_gemm/op/suites/epilogue-v10.json \
        --bundle .gpu/epilogue --out $OUT/epilogue_v10.jsonl
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tirx_gemm  # noqa: E402
from tirx_gemm import epilogue as E  # noqa: E402
from tirx_gemm import matmul as mm  # noqa: E402
from tirx_gemm.op import suite as suites  # noqa: E402

TORCH_ACT = {None: lambda x: x, "relu": F.relu, "gelu": F.gelu,
             "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}
WARMUP, REPS = 5, 25
TIME_DTYPE = "bfloat16"
COMPILE_BUDGET_S = 120.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(what: str) -> None:
    mm.synchronize(what=what)  # the hang guard: a hung kernel ends the run in one line


def inputs(M, N, K, dtype, seed, swiglu):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    s = K ** -0.25
    a = (torch.randn(M, K, generator=g, device="cuda") * s).to(dt)
    if swiglu:
        wg = (torch.randn(N, K, generator=g, device="cuda") * s).to(dt)
        wu = (torch.randn(N, K, generator=g, device="cuda") * s).to(dt)
        return a, (wg, wu)
    return a, (torch.randn(N, K, generator=g, device="cuda") * s).to(dt)


def make_bias(N, bias_dtype, seed):
    if not bias_dtype:
        return None
    g = torch.Generator(device="cuda").manual_seed(seed + 7919)
    return (torch.randn(N, generator=g, device="cuda") * 0.5).to(getattr(torch, bias_dtype))


def reference(a, w, bias, kw):
    a64 = a.double()
    if kw.get("SWIGLU"):
        wg, wu = w
        return F.silu(a64 @ wg.double().T) * (a64 @ wu.double().T)
    y = a64 @ w.double().T
    if bias is not None:
        y = y + bias.double()
    return TORCH_ACT[kw.get("ACT")](y)


def compare(out, ref, kw, dtype, K) -> dict:
    tol = E.tolerance(kw, dtype, K)
    o, r = out.double(), ref.double()
    n_nan = int(torch.isnan(o).sum())
    n_inf = int(torch.isinf(o).sum())
    rms = float(r.square().mean().sqrt())
    diff = (o - r).abs()
    bad = ~(diff <= tol.atol_scale * rms + tol.rtol * r.abs())
    rel = float((o - r).norm() / r.norm()) if float(r.norm()) > 0 else float("nan")
    ok = n_nan == 0 and n_inf == 0 and int(bad.sum()) == 0 and rel <= tol.max_rel_err
    first = []
    if int(bad.sum()):
        idx = bad.nonzero()[:3].tolist()
        first = [(i, j, float(o[i, j]), float(r[i, j])) for i, j in idx]
    return {"ok": bool(ok), "rel_frobenius_error": rel, "max_abs_error": float(diff.max()),
            "n_mismatch": int(bad.sum()), "n_nan": n_nan, "n_inf": n_inf,
            "rtol": tol.rtol, "atol": tol.atol_scale * rms, "max_rel_err": tol.max_rel_err,
            "first_mismatches": first}


def call_fused(a, w, bias, kw, out=None, fused=None):
    od = torch.float32 if kw.get("OUT_DTYPE") == "float32" else None
    if kw.get("SWIGLU"):
        return mm.swiglu(a, fused=fused, out_dtype=od, out=out)
    return mm.matmul(a, w, bias, kw.get("ACT"), od, out=out)


def check_case(e, dtype, epi, seed, write):
    kw = dict(epi)
    M, N, K = e.M, e.N, e.K
    a, w = inputs(M, N, K, dtype, seed, kw.get("SWIGLU"))
    bias = make_bias(N, kw.get("BIAS"), seed)
    fused = tirx_gemm.fuse_gate_up(*w) if kw.get("SWIGLU") else None
    out_dt = torch.float32 if kw.get("OUT_DTYPE") == "float32" else a.dtype
    out = torch.full((M, N), float("nan"), dtype=out_dt, device="cuda")
    t0 = time.time()
    err = None
    try:
        call_fused(a, w, bias, kw, out=out, fused=fused)
        sync(f"check {e.label} {dtype} {E.tag(kw)}")
    except Exception as exc:  # one line per failure; the run goes on
        err = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    rec = {"kind": "check", "M": M, "N": N, "K": K, "dtype": dtype, "epilogue": E.tag(kw),
           "kwargs": kw, "entry": e.layer, "device": torch.cuda.get_device_name()}
    if err:
        rec.update(ok=False, error=err)
    else:
        rec.update(compare(out, reference(a, w, bias, kw), kw, dtype, K))
    rec["seconds"] = round(time.time() - t0, 3)
    write(rec)
    log(f"check {e.label} {dtype} {E.tag(kw):32s} "
        + ("ok" if rec["ok"] else "FAILED") + (f" rel={rec['rel_frobenius_error']:.3g}"
                                               if "rel_frobenius_error" in rec else f" {err}"))
    return rec["ok"]


def time_fn(fn, label) -> float:
    """Median milliseconds of REPS single calls (CUDA events), after WARMUP calls."""
    for _ in range(WARMUP):
        fn()
    sync(f"warm-up {label}")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for s, t in zip(starts, ends):
        s.record()
        fn()
        t.record()
    sync(f"timing {label}")
    ms = sorted(s.elapsed_time(t) for s, t in zip(starts, ends))
    return ms[len(ms) // 2]


class CompileGuard:
    spent = 0.0

    @classmethod
    def compiled(cls, fn, example_args, label):
        """torch.compile(fn), or None when the compile budget is spent (first call timed)."""
        if cls.spent > COMPILE_BUDGET_S:
            log(f"torch.compile skipped for {label}: {cls.spent:.0f} s of compiles spent")
            return None
        t0 = time.time()
        try:
            c = torch.compile(fn)
            c(*example_args)
            sync(f"torch.compile {label}")
        except Exception as exc:
            log(f"torch.compile failed for {label}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}")
            c = None
        cls.spent += time.time() - t0
        return c


def time_case(e, epi, seed, write):
    kw = dict(epi)
    M, N, K = e.M, e.N, e.K
    dtype = TIME_DTYPE
    a, w = inputs(M, N, K, dtype, seed, kw.get("SWIGLU"))
    bias = make_bias(N, kw.get("BIAS"), seed)
    act = kw.get("ACT")
    rec = {"kind": "time", "M": M, "N": N, "K": K, "dtype": dtype, "epilogue": E.tag(kw),
           "kwargs": kw, "entry": e.layer, "device": torch.cuda.get_device_name(),
           "warmup": WARMUP, "reps": REPS, "stat": "median ms"}
    if kw.get("SWIGLU"):
        wg, wu = w
        fused = tirx_gemm.fuse_gate_up(wg, wu)
        gemm_b = fused
        fns = {"fused": lambda: mm.swiglu(a, fused=fused),
               "v12_plain_same_tile": lambda: mm.matmul(a, fused, step="v12"),
               "matmul_plain": lambda: mm.matmul(a, fused)}

        def unfused(x, g, u):
            return F.silu(F.linear(x, g)) * F.linear(x, u)
        uargs = (a, wg, wu)
    else:
        gemm_b = w
        fns = {"fused": lambda: mm.matmul(a, w, bias, act),
               "v12_plain_same_tile": lambda: mm.matmul(a, w, step="v12"),
               "matmul_plain": lambda: mm.matmul(a, w)}

        def unfused(x, b, bb):
            return TORCH_ACT[act](F.linear(x, b, bb))
        uargs = (a, w, bias)
    fns["torch_unfused"] = lambda: unfused(*uargs)
    comp = CompileGuard.compiled(unfused, uargs, f"{e.label} {E.tag(kw)}")
    if comp is not None:
        fns["torch_compile_unfused"] = lambda: comp(*uargs)
    times = {}
    for name, fn in fns.items():
        try:
            times[name] = time_fn(fn, f"{e.label} {E.tag(kw)} {name}")
        except Exception as exc:
            times[name] = None
            rec.setdefault("errors", {})[name] = (
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    rec["ms"] = times
    f = times.get("fused")
    kn = gemm_b.shape[0]
    if f:
        rec["fused_tflops"] = 2.0 * M * kn * K / (f * 1e-3) / 1e12
        for base in ("v12_plain_same_tile", "matmul_plain"):
            if times.get(base):
                rec[f"fused_over_{base}"] = f / times[base]
        for base in ("torch_unfused", "torch_compile_unfused"):
            if times.get(base):
                rec[f"{base}_over_fused"] = times[base] / f
    rec["compile_seconds_so_far"] = round(CompileGuard.spent, 1)
    write(rec)
    show = " ".join(f"{k}={v:.3f}" for k, v in times.items() if v)
    log(f"time {e.label} {E.tag(kw)}: {show}")


V10_STEPS = ("v12", "v10")  # the --v10 stage's steps, each fused and plain


def v10_check(label, fn, ref, kw, dtype, K, rec_base, write) -> bool:
    """One kernel of the --v10 stage, checked: fn(out) writes into a NaN-poisoned out."""
    out = torch.full(ref.shape, float("nan"), dtype=getattr(torch, dtype), device="cuda")
    rec = {**rec_base, "kind": "v10check", "kernel": label}
    try:
        fn(out)
        sync(f"check {label}")
        rec.update(compare(out, ref, kw, dtype, K))
    except Exception as exc:  # one line per failure; the run goes on
        rec.update(ok=False, error=f"{type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else ''}")
    write(rec)
    log(f"check {rec_base['shape']} {label:28s} " + ("ok" if rec["ok"] else
        f"FAILED {rec.get('error', '')} rel={rec.get('rel_frobenius_error')}"))
    return rec["ok"]


def v10_shape(e, seed, write, t_start, budget_s) -> int:
    """The --v10 stage at one suite entry: returns the number of failed checks."""
    M, N, K = e.M, e.N, e.K
    dtype = TIME_DTYPE
    a, w = inputs(M, N, K, dtype, seed, False)
    acts = [dict(epi) for epi in e.epilogues]
    bias_dt = {kw.get("BIAS") for kw in acts}
    if len(bias_dt) != 1:
        raise ValueError(f"{e.label}: the --v10 stage wants one bias dtype per entry, got "
                         f"{sorted(map(str, bias_dt))}")
    bias = make_bias(N, bias_dt.pop(), seed)
    y = a.double() @ w.double().T
    base = {"M": M, "N": N, "K": K, "shape": e.label, "dtype": dtype, "entry": e.layer,
            "device": torch.cuda.get_device_name()}
    fns, failed = {}, 0
    for step in V10_STEPS:  # plain kernels
        label = f"{step}_plain"
        f = (lambda st: lambda out=None: mm.matmul(a, w, step=st, out=out))(step)
        if v10_check(label, f, y, {}, dtype, K, {**base, "epilogue": "plain"}, write):
            fns[label] = f
        else:
            failed += 1
    for kw in acts:
        ref = TORCH_ACT[kw.get("ACT")](y + bias.double()) if kw.get("BIAS") else \
            TORCH_ACT[kw.get("ACT")](y)
        for step in V10_STEPS:
            label = f"{step}_fused_{kw.get('ACT')}"
            f = (lambda st, act, b: lambda out=None: mm.matmul(a, w, b, act, step=st,
                                                               out=out))(
                step, kw.get("ACT"), bias if kw.get("BIAS") else None)
            if v10_check(label, f, ref, kw, dtype, K, {**base, "epilogue": E.tag(kw)},
                         write):
                fns[label] = f
            else:
                failed += 1
    del y
    order = [f"{st}_plain" for st in V10_STEPS]
    order += [f"{st}_fused_{kw.get('ACT')}" for kw in acts for st in V10_STEPS]
    times = {}
    for label in order + [f"{st}_plain" for st in V10_STEPS]:
        if label not in fns or time.time() - t_start > budget_s:
            continue
        key = label if label not in times else f"{label}_again"
        try:
            times[key] = time_fn(fns[label], f"{e.label} {label}")
        except Exception as exc:
            times[key] = None
            log(f"timing {e.label} {label} failed: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}")
    rec = {**base, "kind": "v10time", "ms": times, "warmup": WARMUP, "reps": REPS,
           "stat": "median ms"}
    for kw in acts:
        act = kw.get("ACT")
        f10, f12 = times.get(f"v10_fused_{act}"), times.get(f"v12_fused_{act}")
        if f10 and f12:
            rec[f"v10_over_v12_fused_{act}"] = f10 / f12
        for st, f in (("v10", f10), ("v12", f12)):
            if f and times.get(f"{st}_plain"):
                rec[f"{st}_fused_over_plain_{act}"] = f / times[f"{st}_plain"]
    write(rec)
    log(f"time {e.label}: " + " ".join(f"{k}={v:.3f}" for k, v in times.items() if v))
    return failed


def v10_calls(s):
    """(label, M, N, K, dtype, epilogue kwargs, step) of every kernel the --v10 stage calls."""
    calls = []
    for e in s.entries:
        for step in V10_STEPS:
            calls.append((f"{e.label} {step} plain", e.M, e.N, e.K, TIME_DTYPE, {}, step))
            for epi in e.epilogues:
                calls.append((f"{e.label} {step} {E.tag(dict(epi))}", e.M, e.N, e.K,
                              TIME_DTYPE, dict(epi), step))
    return calls


def plan_only(s, bundle, v10=False) -> int:
    """Every kernel the run calls, looked up in the bundle as an H200 picks it."""
    from tirx_gemm import registry
    arch, sms = "sm_90a", 132
    calls = v10_calls(s) if v10 else []
    for e in ([] if v10 else s.entries):
        for dtype in e.dtypes:
            for epi in e.epilogues:
                kw = dict(epi)
                calls.append((f"{e.label} {dtype} {E.tag(kw)}", e.M, e.N, e.K, dtype, kw, None))
                if dtype == TIME_DTYPE and e.dtypes == (TIME_DTYPE,):
                    kn = E.kernel_n(e.N, kw)
                    calls.append((f"{e.label} plain v12 (M x {kn} x K)", e.M, kn, e.K, dtype,
                                  {}, "v12"))
                    calls.append((f"{e.label} plain matmul (M x {kn} x K)", e.M, kn, e.K,
                                  dtype, {}, None))
    missing = 0
    for label, M, N, K, dtype, kw, step in calls:
        if kw:
            step_id, kwargs = (mm.choose(M, N, K, dtype, arch, sms, kw) if step is None
                               else mm.choose_epilogue_on(step, M, N, K, dtype, arch, sms,
                                                          kw))
            st = registry.get(step_id, arch)
        else:
            st, kwargs = mm._pick(M, N, K, dtype, arch, sms, step)
        try:
            mm.kernel_source(st, (M, N, K), kwargs, bundle=Path(bundle))
            log(f"found   {label}: {st.id} {mm._describe(st, (M, N, K), kwargs)}")
        except ValueError as exc:
            missing += 1
            log(f"MISSING {label}: {str(exc).splitlines()[0]}")
    log(f"{len(calls) - missing}/{len(calls)} kernels found in {bundle}")
    return 1 if missing else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--suite", default=str(ROOT / "tirx_gemm/op/suites/epilogue-h200.json"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=270.0)
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--plan-only", action="store_true")
    ap.add_argument("--v10", action="store_true",
                    help="the v10 (ping-pong) vs v12 comparison (suite epilogue-v10.json)")
    args = ap.parse_args(argv)
    t_start = time.time()
    if args.plan_only:
        return plan_only(suites.load_suite(args.suite), args.bundle, args.v10)
    if not torch.cuda.is_available():
        print("no CUDA GPU: run this on the H200", file=sys.stderr)
        return 2
    mm.use_bundle(args.bundle)
    s = suites.load_suite(args.suite)
    out = open(args.out, "a", encoding="utf-8")

    def write(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()
    if args.v10:
        log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, suite {s.name}: "
            f"v10 vs v12, {len(v10_calls(s))} kernels")
        failed = 0
        for i, e in enumerate(s.entries):
            if time.time() - t_start > args.budget_s:
                log("budget spent: stopping")
                return 1
            failed += v10_shape(e, 100 + i, write, t_start, args.budget_s)
        write({"kind": "v10summary", "failed_checks": failed, "kernels": len(v10_calls(s)),
               "seconds": round(time.time() - t_start, 1),
               "device": torch.cuda.get_device_name()})
        log(f"done in {time.time() - t_start:.0f} s, {failed} failed checks")
        return 0 if failed == 0 else 1
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, suite {s.name}, "
        f"{sum(len(e.epilogues) * len(e.dtypes) for e in s.entries)} checks")
    n_ok = n_all = 0
    seed = 0
    for e in s.entries:
        for dtype in e.dtypes:
            for epi in e.epilogues:
                if time.time() - t_start > args.budget_s:
                    log("budget spent: stopping")
                    return 1
                seed += 1
                n_all += 1
                n_ok += bool(check_case(e, dtype, epi, seed, write))
    log(f"checks: {n_ok}/{n_all} ok")
    if not args.no_time:
        for e in s.entries:
            if e.dtypes != (TIME_DTYPE,):
                continue
            for epi in e.epilogues:
                if time.time() - t_start > args.budget_s:
                    log("budget spent: stopping")
                    return 1
                seed += 1
                time_case(e, epi, seed, write)
    write({"kind": "summary", "checks_ok": n_ok, "checks": n_all,
           "seconds": round(time.time() - t_start, 1),
           "device": torch.cuda.get_device_name()})
    log(f"done in {time.time() - t_start:.0f} s")
    return 0 if n_ok == n_all else 1


if __name__ == "__main__":
    sys.exit(main())
