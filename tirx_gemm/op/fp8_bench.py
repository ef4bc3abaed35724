"""The fp8 half of ``tirx-gemm bench --suite``: each fp8 case of a suite (entry, out dtype,
scale kind) checked, then timed against ``torch._scaled_mm`` with the same scale kind.

Inputs (:func:`make_inputs`): real-scale activations, not plain randn: a few outlier channels
(columns of A) 30x the rest, each token's row scaled by its own power of two, and weights
whose rows differ in scale as a trained Linear's do; quantized by :func:`fp8.quantize` per
tensor, per row (token / output channel) or per block (1x128 of A, 128x128 of B).

Check: the output poisoned with NaN, then compared on up to CHECK_ROWS rows (evenly spaced,
the last included: every column of every checked row) with the dequantized fp32 product
and the project's fp8 tolerance (numerics.fp8_tolerances, promoted accumulation).

Timing: CUDA graphs of LAUNCHES calls (GPU time per call, no host cost, what a graphed
model sees), on input sets rotated past the L2 (a weight comes from HBM, as in a model),
both graphs warmed together, then replayed alternately and the medians taken. The
baseline is ``torch._scaled_mm`` with the same scales (use_fast_accum=False: promoted
accumulation, as matmul_fp8's default): per tensor, rowwise, and for block scales torch's
blockwise 1x128 x 128x128 form where the installed torch runs it on this GPU (else the
record says why in ``torch_error``); block cases are also timed against torch's per-tensor
kernel (``ratio_to_torch_tensor``), the speed block scaling is held to.

Records (one dict per case): M, N, K, step "v13", build_kwargs, verified, rel_err, tflops,
torch_tflops, ratio_to_torch (> 1: ours faster), fp8 ceiling ratio, device, and "suite"
(name, file, target "matmul_fp8", scale, model, layer, dtype). Imports torch when called.
"""

from __future__ import annotations

import math
import statistics
import time

from tirx_gemm import numerics
from tirx_gemm.op import fp8

__all__ = ["make_inputs", "torch_scaled_mm", "bench_cases", "graph_times", "FP8_CEILING"]

CHECK_ROWS = 256
LAUNCHES_MAX, GRAPH_MS = 20, 4.0      # calls per graph: up to 20, about 4 ms of work
ROUNDS, WARM_MS = 5, 60.0
L2_BYTES = 60 << 20                   # the H200's L2 (50 MB on the H100): rotate past it
FP8_CEILING = {"H100": 1400.0, "H200": 1450.0}  # TFLOP/s: torch's best fp8 shapes (issue text)
OUTLIER_EVERY, OUTLIER_GAIN = 97, 30.0
CANDIDATE_AGREE = 1e-2                # rel. difference a tile candidate may have from the pick


def ceiling(device_name: str) -> float | None:
    """The fp8 ceiling (TFLOP/s) of the card ``device_name`` names, or None."""
    return next((v for k, v in FP8_CEILING.items() if k in device_name), None)


def make_inputs(M: int, N: int, K: int, mode: str, seed: int, device="cuda"):
    """(a_q, b_q, scale_a, scale_b) of real-scale operands (module docstring), in
    matmul_fp8's layouts."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(M, K, device=device, generator=g)
    a[:, ::OUTLIER_EVERY] *= OUTLIER_GAIN
    a *= torch.exp2(torch.randint(-3, 4, (M, 1), device=device, generator=g).float())
    b = torch.randn(N, K, device=device, generator=g) * K ** -0.5
    b *= torch.exp2(torch.rand(N, 1, device=device, generator=g) * 2 - 1)
    qa, sa = fp8.quantize(a, mode, "a")
    del a
    qb, sb = fp8.quantize(b, mode, "b")
    return qa, qb, sa, sb


def torch_scaled_mm(qa, qb, sa, sb, mode: str, out_dtype):
    """A callable running torch._scaled_mm on matmul_fp8's operands with the same scale
    kind: per tensor and rowwise as they are (b.t() is _scaled_mm's mat2), block as torch's
    blockwise 1x128 x 128x128 recipe (both scale tensors in column-major order); torch
    allocates its output (from the graph's pool under capture)."""
    import torch
    bt = qb.t()
    if mode == "block":
        sa_t = torch.empty_strided(sa.shape, (1, sa.shape[0]), dtype=sa.dtype,
                                   device=sa.device).copy_(sa)  # (M, K/128), column-major
        sb_t = sb.t()                          # (K/128, N/128), column-major: sb's bytes
        return lambda: torch._scaled_mm(qa, bt, scale_a=sa_t, scale_b=sb_t,
                                        out_dtype=out_dtype)
    return lambda: torch._scaled_mm(qa, bt, scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                                    use_fast_accum=False)


def _capture(fns):
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fns[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def _replay_ms(g) -> float:
    import torch
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def graph_times(fn_lists, rounds: int = ROUNDS, warm_ms: float = WARM_MS) -> list[float]:
    """ms per call of each list's CUDA graph: ``warm_ms`` of replays of all of them, then
    ``rounds`` replays of each in alternating order; the medians."""
    graphs = [_capture(f) for f in fn_lists]
    spent, n = 0.0, 0
    while spent < warm_ms and n < 200:
        for g in graphs:
            spent += _replay_ms(g)
        n += 1
    times = [[] for _ in graphs]
    for r in range(rounds):
        for i in (range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))):
            times[i].append(_replay_ms(graphs[i]) / len(fn_lists[i]))
    return [statistics.median(t) for t in times]


def check(M, N, K, mode, out_dtype, kwargs, seed, device="cuda", inputs=None):
    """(ok, rel_err, reason): matmul_fp8 on real-scale inputs (``inputs``, or fresh ones),
    NaN-poisoned output, compared on up to CHECK_ROWS rows with the fp8 tolerance."""
    import torch
    from tirx_gemm.run.checking import compare
    qa, qb, sa, sb = inputs if inputs is not None else make_inputs(M, N, K, mode, seed, device)
    device = qa.device
    out = torch.full((M, N), float("nan"), dtype=out_dtype, device=device)
    fp8.matmul_fp8(qa, qb, sa, sb, out=out, _kwargs=kwargs, sync=True)
    rows = torch.unique(torch.linspace(0, M - 1, min(M, CHECK_ROWS), device=device).round()
                        .long())
    sa_r = sa if mode == "tensor" else sa[rows]
    ref = fp8.reference(qa[rows], qb, sa_r, sb, mode)
    t = numerics.fp8_tolerances(str(out_dtype).removeprefix("torch."), K,
                                numerics.fp8_promote(kwargs))
    res = compare(out[rows], ref, rtol=t.rtol, atol_scale=t.atol_scale,
                  max_rel_err=t.max_rel_err)
    return res.ok, res.rel_frobenius_error, ("" if res.ok else res.reason)


def input_sets(M, N, K, mode, device="cuda", n=None, seed=7):
    """Enough real-scale input sets (up to 4) that a rotation over them passes the L2."""
    if n is None:
        n = max(1, min(4, math.ceil(2 * L2_BYTES / (M * K + N * K + 2 * M * N))))
    return [make_inputs(M, N, K, mode, seed + i, device) for i in range(n)]


def time_case(M, N, K, mode, out_dtype, kwargs, device="cuda", extra=(), sets=None):
    """{name: ms per call} of matmul_fp8 (``kwargs``), torch._scaled_mm with the same
    scales ("torch"), for block also torch per tensor ("torch tensor"), and each of
    ``extra`` ((name, v13 keywords): lab tile candidates); a torch refusal is kept as
    {"torch_error": text}."""
    import torch
    sets = sets or input_sets(M, N, K, mode, device)
    device = sets[0][0].device
    outs = [torch.empty(M, N, dtype=out_dtype, device=device) for _ in sets]
    flops_ms = 2.0 * M * N * K / 1e9 / 1300.0  # a guess of ms per call, to size the graph
    launches = max(2, min(LAUNCHES_MAX, int(GRAPH_MS / max(flops_ms, 1e-3))))
    pick = [(sets[i % len(sets)], outs[i % len(sets)]) for i in range(launches)]

    def ours(kw):
        return [lambda s=s, o=o: fp8.matmul_fp8(*s, out=o, _kwargs=kw) for s, o in pick]

    lists, names, errors = [ours(kwargs)], ["ours"], {}
    if extra:  # a candidate must give the pick's answer before its time counts
        want = fp8.matmul_fp8(*sets[0], _kwargs=kwargs, out_dtype=out_dtype).float()
    for name, kw in extra:
        try:  # a candidate the bundle lacks is a result of the candidate, not of the case
            got = fp8.matmul_fp8(*sets[0], _kwargs=kw, out_dtype=out_dtype).float()
        except (ValueError, TypeError, RuntimeError) as exc:
            errors[name] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            continue
        err = float((got - want).norm() / want.norm().clamp_min(1e-30))
        if not err < CANDIDATE_AGREE:
            errors[name] = f"disagrees with the pick: rel. difference {err:.2e}"
            continue
        lists.append(ours(kw))
        names.append(name)
    torch_kinds = [("torch", mode)] + ([("torch tensor", "tensor")] if mode == "block" else [])
    for name, kind in torch_kinds:
        tsets = sets if kind == mode else input_sets(M, N, K, kind, device, len(sets))
        fns = [torch_scaled_mm(*tsets[i % len(tsets)], kind, out_dtype)
               for i in range(len(tsets))]
        try:
            fns[0]()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - torch refusing a recipe is a result
            errors[name] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            continue
        lists.append([fns[i % len(fns)] for i in range(launches)])  # torch allocates its out
        names.append(name)
    ms = graph_times(lists)
    return dict(zip(names, ms)), errors


def bench_cases(suite, *, device_name: str, sm_count: int, log=print, extra_fn=None,
                budget_s: float | None = None, on_record=None,
                file_fields: dict | None = None) -> tuple[list[dict], list]:
    """Check and time every fp8 case of ``suite`` (a Suite); returns (records, failed
    [(label, reason)]). ``extra_fn(M, N, K, mode)`` -> [(name, keywords)]: tile candidates
    timed beside the pick (the fp8 study's runs). ``budget_s``: start no case after it.
    ``on_record(rec)``: called with each record as it is made (a run cut short keeps them).
    ``file_fields``: how the records name the suite file (op.suite.suite_file_fields)."""
    import torch
    t0 = time.monotonic()
    ceil = ceiling(device_name)
    recs, failed = [], []
    cases = suite.fp8_cases()
    for i, (e, dt, mode) in enumerate(cases, 1):
        label = f"{e.label} {dt} {mode}"
        if budget_s is not None and time.monotonic() - t0 > budget_s:
            failed.append((label, "time budget spent"))
            continue
        odt = getattr(torch, dt)
        kw = fp8.choose_fp8(e.M, mode, False, dt, sm_count, N=e.N, K=e.K)
        log(f"[{i}/{len(cases)}] fp8 {label} v13 BLK {kw['BLK_M']}x{kw['BLK_N']} "
            f"({e.model}, {e.layer})")
        try:
            sets = input_sets(e.M, e.N, e.K, mode, seed=1000 + 7 * i)
            ok, rel, reason = check(e.M, e.N, e.K, mode, odt, kw, 0, inputs=sets[0])
            extra = extra_fn(e.M, e.N, e.K, mode) if extra_fn else ()
            ms, errors = time_case(e.M, e.N, e.K, mode, odt, kw, extra=extra, sets=sets)
        except (ValueError, TypeError, RuntimeError) as exc:
            reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            log(f"    not run: {reason}")
            failed.append((label, reason))
            continue
        flop = 2.0 * e.M * e.N * e.K
        tf = flop / ms["ours"] / 1e9
        rec = {"kind": "fp8_case", "M": e.M, "N": e.N, "K": e.K, "step": fp8.FP8_STEP,
               "arch": fp8.ARCH, "build_kwargs": kw, "verified": ok, "rel_err": rel,
               "median_ms": ms["ours"], "tflops": tf, "device": device_name,
               "torch": torch.__version__, "timing": "cuda_graph_interleaved",
               "suite": {"name": suite.name, **(file_fields or {}),
                         "target": "matmul_fp8", "scale": mode, "model": e.model,
                         "layer": e.layer, "dtype": dt}}
        if reason:
            rec["reason"] = reason
        if ceil:
            rec["ceiling_tflops"], rec["ratio_to_ceiling"] = ceil, tf / ceil
        for name, key in (("torch", "ratio_to_torch"), ("torch tensor", "ratio_to_torch_tensor")):
            if name in ms:
                rec[key] = ms[name] / ms["ours"]
                rec[key.replace("ratio_to_", "") + "_tflops"] = flop / ms[name] / 1e9
            elif name in errors:
                rec[key.replace("ratio_to_", "") + "_error"] = errors[name]
        rec["against"] = f"torch._scaled_mm {mode}" + (" (1x128 x 128x128)" if mode == "block"
                                                       else "")
        if extra:
            rec["candidates"] = {n: ({"kwargs": k, "ms": ms[n], "ratio_to_pick": ms["ours"] / ms[n]}
                                     if n in ms else {"kwargs": k, "error": errors.get(n, "?")})
                                 for n, k in extra}
        recs.append(rec)
        if on_record is not None:
            on_record(rec)
        tt = rec.get("torch_tflops")
        ratio = rec.get("ratio_to_torch", 0.0)
        log(f"    {'ok' if ok else 'FAIL'} rel {rel:.1e}  {tf:.0f} TFLOP/s  torch "
            f"{'%.0f' % tt if tt else errors.get('torch', '-')}  x{ratio:.3f}"
            + (f"  x torch tensor {rec['ratio_to_torch_tensor']:.3f}"
               if "ratio_to_torch_tensor" in rec else "")
            + "".join(f"  {n} x{c['ratio_to_pick']:.2f}" if "ms" in c else f"  {n} {c['error']}"
                      for n, c in rec.get("candidates", {}).items()))
        torch.cuda.empty_cache()
    return recs, failed
