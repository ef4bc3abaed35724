"""v12's tile menu on the H200: every menu entry at every suite shape, checked and timed
against torch.matmul in the same run; the data the chooser's cost model is fitted to.

v12 built with RUNTIME_M and RUNTIME_NK takes the whole shape at run time, so one kernel per
(menu entry, dtype) serves every suite shape:

    python lab/tools/v12_sweep.py export --out .gpu/v12 [--dtypes bfloat16] [--cluster]  # here
    python lab/tools/v12_sweep.py run --bundle .gpu/v12 --out FILE.jsonl           # GPU host
        [--suite tirx_gemm/op/suites/models.json] [--dtypes bfloat16] [--budget-s 300]

CTA pairs with PDL (`export --pairpdl`): PAIR_PDL_MENU's tiles as one CTA with
PDL, as a pair and as a pair with PDL, run over PAIR_PDL_SUITE (lab/pdl_exit_trigger/h200_pairpdl.sh;
lab/pdl_exit_trigger/records/v12_pairpdl_h200.jsonl).

Stream-K (STREAM_K=True): `export --streamk` builds, per tile of SK_TILES, the
RUNTIME_M + RUNTIME_NK kernel with and without STREAM_K, and STREAM_K at the static shape
for SK_STATIC; `streamk --bundle .gpu/v12sk --out FILE.jsonl` runs SK_SHAPES on the tiles
whose plan is on there (tirx_gemm.streamk): every kernel checked against torch, each
stream-K kernel run twice and compared bit for bit, its counters zero after, then timed
beside the STREAM_K=False kernel and torch.mm in the same run.

Per shape: inputs rotated over enough sets to exceed the 60 MiB L2 (the weights of a
decode shape are read from HBM, as in a model), D poisoned with NaN, each candidate
checked against F.linear in fp32 with tirx_gemm.numerics' rules, then timed as CUDA-graph
replays of 20 launches (GPU time per call, no host cost), torch.mm the same way in the
same run. One JSON line per (shape, dtype): torch's time and each candidate's time or why
it has none.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

MENU = ((64, 16), (64, 32), (64, 48), (64, 64), (64, 96), (64, 128), (64, 256),
        (128, 64), (128, 96), (128, 128), (128, 192), (128, 256))
# CLUSTER=2 (a CTA pair along M sharing the B tile by multicast): `export --cluster`
CLUSTER_MENU = ((64, 64), (64, 96), (64, 128), (64, 192), (64, 256),
                (128, 96), (128, 128), (128, 192), (128, 256))
# the widths between MENU's (`export --widths`): BLK_N any multiple of 16, so that a
# shape's column tiles can fill a wave (1536 = 10.7 x 144: 11 x 12 = 132 tiles)
WIDTHS_MENU = tuple((bm, bn) for bm in (64, 128) for bn in (80, 112, 144, 160, 176, 208, 224, 240))
# `export --widths8`: the odd multiples of 8 (wgmma's N step) between them, so that a tile
# can end near N (2304 = 14 x 164.6: 168-column tiles compute 2% past N, 176 7%)
WIDTHS8_MENU = (tuple((64, bn) for bn in (72, 88, 104, 120))
                + tuple((128, bn) for bn in range(136, 256, 16)))
# stream-K: shapes whose tail wave is under half full on some tile (640^3: 10 K steps,
# too shallow for two units of 8: off on every tile), the tiles their kernels take, and
# the (shape, tile) pairs also built at the static shape (the plan folded at build time)
SK_SHAPES = ((1024, 1024, 1024), (1000, 1000, 1000), (2304, 2304, 2304), (2048, 2048, 2048),
             (1536, 1536, 1536), (640, 640, 4096), (128, 128, 65536), (256, 256, 16384),
             (4096, 4096, 4096), (333, 4096, 14336), (2049, 3584, 3584), (3072, 3072, 3072))
SK_TILES = ((128, 256), (128, 192), (128, 176), (128, 128), (64, 256), (128, 64), (64, 176),
            (64, 128), (64, 64))
SK_PER_SHAPE = 3
SK_STATIC = (((1024, 1024, 1024), (128, 128)), ((2304, 2304, 2304), (128, 256)),
             ((1000, 1000, 1000), (64, 256)), ((128, 128, 65536), (128, 64)),
             ((333, 4096, 14336), (64, 176)), ((2049, 3584, 3584), (128, 192)))
# programmatic dependent launch (PDL=True, tirx_gemm/pdl.py): `export --pdl` builds these
# entries with and without it; `run` then times both (label "BMxBNp" for PDL), as CUDA
# graphs and as eager back-to-back launches, into a file of its own (not a chooser sweep)
PDL_MENU = ((64, 16), (64, 64), (64, 112), (64, 128), (128, 128), (128, 144), (128, 192))
# CTA pairs with PDL (CLUSTER=2 and PDL=True: the cluster size compiled into the kernel,
# tirx_gemm/pdl.py): `export --pairpdl` builds each entry three ways, one CTA with PDL,
# a pair without it (today's pair) and a pair with it ("BMxBNc2p"), for PAIR_PDL_SUITE's
# shapes (the pairs' weak spots: 1000^3, the mid-size squares, M <= 128)
PAIR_PDL_MENU = ((64, 64), (64, 96), (64, 128), (128, 128), (128, 144), (128, 176),
                 (128, 192), (128, 240))
PAIR_PDL_SUITE = "lab/pdl_exit_trigger/suites/pairpdl.json"
L2_BYTES = 60 << 20
LAUNCHES = 20


def label(bm, bn, cluster=1, pdl=False):
    return f"{bm}x{bn}" + ("" if cluster == 1 else f"c{cluster}") + ("p" if pdl else "")


def export(out: Path, dtypes, cluster: bool = False, widths: bool = False,
           pdl: bool = False, widths8: bool = False, pairpdl: bool = False) -> int:
    from tirx_gemm import registry
    from tirx_gemm.compile import bundle
    step = registry.get("v12", "sm_90a")
    reqs = []
    for dt in dtypes if pairpdl else ():
        for bm, bn in PAIR_PDL_MENU:
            for extra in ({"PDL": True}, {"CLUSTER": 2}, {"CLUSTER": 2, "PDL": True}):
                kw = {"BLK_M": bm, "BLK_N": bn, "SM_COUNT": 132, "RUNTIME_M": True,
                      "RUNTIME_NK": True, **extra}
                if dt != "float16":
                    kw["dtype"] = dt
                reqs.append((step, (128, 256, 256), kw))
    for dt in () if pairpdl else dtypes:
        for bm, bn in (WIDTHS_MENU if widths else WIDTHS8_MENU if widths8 else
                       PDL_MENU if pdl else MENU):
            for with_pdl in ((False, True) if pdl else (False,)):
                kw = {"BLK_M": bm, "BLK_N": bn, "SM_COUNT": 132, "RUNTIME_M": True,
                      "RUNTIME_NK": True}
                if dt != "float16":
                    kw["dtype"] = dt
                if with_pdl:
                    kw["PDL"] = True
                reqs.append((step, (128, 256, 256), kw))
        for bm, bn in CLUSTER_MENU if cluster else ():
            kw = {"BLK_M": bm, "BLK_N": bn, "SM_COUNT": 132, "RUNTIME_M": True,
                  "RUNTIME_NK": True, "CLUSTER": 2}
            if dt != "float16":
                kw["dtype"] = dt
            reqs.append((step, (128, 256, 256), kw))
    bundle.export(reqs, out, jobs=1 if pdl or pairpdl else None, ffi_wheel_python="3.12")
    return 0


def sk_tiles_for(shape, sm_count=132):
    """The first SK_PER_SHAPE tiles of SK_TILES whose stream-K plan is on at ``shape``, and
    the tile SK_STATIC builds at it."""
    from tirx_gemm import streamk
    tiles = [t for t in SK_TILES if streamk.shape_plan(*shape, *t, sm_count).on]
    return tiles[:SK_PER_SHAPE] + [t for s, t in SK_STATIC
                                   if s == shape and t not in tiles[:SK_PER_SHAPE]]


def export_streamk(out: Path, dtypes) -> int:
    from tirx_gemm import registry
    from tirx_gemm.compile import bundle
    step = registry.get("v12", "sm_90a")
    reqs = []
    used = sorted({t for s in SK_SHAPES for t in sk_tiles_for(s)})
    for dt in dtypes:
        extra = {} if dt == "float16" else {"dtype": dt}
        for bm, bn in used:
            for on in (False, True):
                kw = {"BLK_M": bm, "BLK_N": bn, "SM_COUNT": 132, "RUNTIME_M": True,
                      "RUNTIME_NK": True, **extra}
                if on:
                    kw["STREAM_K"] = True
                reqs.append((step, (128, 256, 256), kw))
        for shape, (bm, bn) in SK_STATIC:
            reqs.append((step, shape, {"BLK_M": bm, "BLK_N": bn, "SM_COUNT": 132,
                                       "STREAM_K": True, **extra}))
    print(f"{len(reqs)} kernels; tiles {used}")
    bundle.export(reqs, out, jobs=1, ffi_wheel_python="3.12")  # one build at a time
    return 0


def _check(d, ref, dtype):
    """(ok, rel_err) by the rules of tirx_gemm.numerics.compare_np, on the GPU."""
    import torch
    from tirx_gemm import numerics
    tol = numerics.tolerances(dtype)
    o = d.float()
    if not bool(torch.isfinite(o).all()):
        return False, math.nan
    diff = (o - ref).double()
    rel = float(diff.norm() / ref.double().norm())
    atol = tol.atol_scale * float(ref.double().pow(2).mean().sqrt())
    elem = bool((diff.abs() <= atol + tol.rtol * ref.double().abs()).all())
    return elem and rel <= tol.max_rel_err, rel


def check_twice(kern, a, b, d, ws, ref, dtype, what, runs=2):
    """Run ``kern`` ``runs`` times (D, and the workspace's slabs, poisoned with NaN first),
    check the first result against ``ref``, compare the runs bit for bit and, with a
    workspace, its counters zero after: (the record's fields, whether all held). A launch
    error propagates (the caller records it)."""
    import torch
    from tirx_gemm.run.launcher import synchronize
    outs = []
    for _ in range(runs):
        d.fill_(float("nan"))
        if ws:
            ws[0].fill_(float("nan"))  # scratch: read only after written
        kern(a, b, d, *ws)
        synchronize(what)
        outs.append(d.clone())
    ok, rel = _check(outs[0], ref, dtype)
    r = {"ok": ok, "rel_err": rel}
    if runs > 1:
        r["bitwise_repeat"] = bool(torch.equal(outs[0].view(torch.int16),
                                               outs[-1].view(torch.int16)))
    if ws:
        r["counters_zero"] = bool((ws[1] == 0).all())
    return r, ok and r.get("bitwise_repeat", True) and r.get("counters_zero", True)


def _graph_time(fn_list):
    """GPU ms per launch: a CUDA graph of the launches, replayed; median of 5 (one graph
    after another: see _graphs_interleaved for timing one against another)."""
    g = _capture(fn_list)
    return sorted(_replay_ms(g) / len(fn_list) for _ in range(5))[2]


def _capture(fn_list):
    """A CUDA graph of the launches (three run first on a side stream), replayed once."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fn_list[:3]:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fn_list:
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def _replay_ms(g):
    import torch
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


# The H200 boosts for the first tens of ms of load, then settles at its power-limited
# clock (tirx_gemm/run/timing.py). _graph_time times one graph after another: on a kernel
# of hundreds of microseconds the first one timed (torch.mm, in _inputs) can run in the
# boost and the next at the settled clock. _graphs_interleaved warms up past the boost and
# alternates the graphs (A B, B A, ...), as the eager bench alternates launches.
GRAPH_ROUNDS = 7
GRAPH_WARM_MS = 200.0


def _graphs_interleaved(fn_lists, rounds=GRAPH_ROUNDS, warm_ms=GRAPH_WARM_MS):
    """GPU ms per launch of each list's CUDA graph: at least ``warm_ms`` of replays of all
    of them first, then ``rounds`` replays of each in alternating order; the medians."""
    import statistics
    graphs = [_capture(f) for f in fn_lists]
    spent, n = 0.0, 0
    while spent < warm_ms and n < 4000:
        for g in graphs:
            spent += _replay_ms(g)
        n += 1
    times = [[] for _ in graphs]
    for r in range(rounds):
        for i in (range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))):
            times[i].append(_replay_ms(graphs[i]) / len(fn_lists[i]))
    return [statistics.median(t) for t in times]


def _inputs(M, N, K, dtype, time_torch=True):
    """(input sets, the fp32 reference of the first, LAUNCHES picks rotating over the sets,
    torch.mm's graph time, None unless ``time_torch``): enough (A, B, D) sets to exceed the L2 (a decode shape's weights
    come from HBM, as in a model), seeded by the shape."""
    import torch
    tdt = getattr(torch, dtype)
    per_set = 2 * (M * K + N * K + M * N)
    sets = max(1, min(LAUNCHES, math.ceil(3 * L2_BYTES / per_set)))
    g = torch.Generator(device="cuda").manual_seed(M * 31 + N * 7 + K)
    ins = [((torch.randn(M, K, device="cuda", generator=g) * K ** -0.25).to(tdt),
            (torch.randn(N, K, device="cuda", generator=g) * K ** -0.25).to(tdt),
            torch.empty(M, N, device="cuda", dtype=tdt)) for _ in range(sets)]
    ref = torch.nn.functional.linear(ins[0][0].float(), ins[0][1].float())
    pick = [ins[i % sets] for i in range(LAUNCHES)]
    t_torch = _graph_time([lambda a=a, b=b, d=d: torch.mm(a, b.t(), out=d)
                           for a, b, d in pick]) if time_torch else None
    return ins, ref, pick, t_torch


def _eager_time(fn_list):
    """ms per launch of the launches queued back to back from the host (no graph): what a
    model's eager forward sees when one GEMM follows another; median of 5 passes."""
    import torch
    for fn in fn_list[:3]:
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for fn in fn_list:
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / len(fn_list))
    return sorted(times)[2]


def run(bundle: Path, out: Path, suite_path, dtypes, budget_s: float) -> int:
    import torch
    from tirx_gemm.op import suite as suites
    from tirx_gemm.compile.bundle import load_manifest
    from tirx_gemm.run.loader import load_kernel
    from tirx_gemm.gitinfo import git_sha
    from tirx_gemm.bundle_format import code_git_sha
    from tirx_gemm.run.launcher import synchronize
    t0 = time.time()
    kernels = {}
    for e in load_manifest(bundle):
        kw = e.get("kwargs") or {}
        if e["step"] == "v12" and not kw.get("STREAM_K"):
            kernels[(kw.get("dtype", "float16"), kw["BLK_M"], kw["BLK_N"],
                     kw.get("CLUSTER", 1), bool(kw.get("PDL")))] = \
                load_kernel(str(bundle / e["lib"]))
    with_pdl = any(k[4] for k in kernels)
    s = suites.load_suite(suite_path)
    dev = torch.cuda.get_device_name()
    rows = 0
    for entry in s.entries:
        for dtype in dtypes:
            if time.time() - t0 > budget_s:
                print(f"budget of {budget_s:.0f} s spent: stopping before {entry.label}")
                return 0
            M, N, K = entry.shape
            ins, ref, pick, t_torch = _inputs(M, N, K, dtype)
            if with_pdl:  # the PDL sweep: eager back-to-back launches too
                t_torch_eager = _eager_time([lambda a=a, b=b, d=d: torch.mm(a, b.t(), out=d)
                                             for a, b, d in pick])
            rec = {"M": M, "N": N, "K": K, "dtype": dtype, "model": entry.model,
                   "layer": entry.layer, "device": dev, "torch": torch.__version__,
                   "git_sha": code_git_sha(bundle) or git_sha(), "date": time.strftime("%Y-%m-%d"),
                   "torch_ms": t_torch, "candidates": {}}
            line = []
            if with_pdl:
                rec["torch_eager_ms"] = t_torch_eager
            for (dt, bm, bn, cl, pd), kern in sorted(kernels.items()):
                if dt != dtype:
                    continue
                name = label(bm, bn, cl, pd)
                a, b, d = ins[0]
                d.fill_(float("nan"))
                try:
                    kern(a, b, d)
                    synchronize(f"v12 {name} {entry.label}")
                except Exception as exc:  # noqa: BLE001 - recorded
                    rec["candidates"][name] = {"error": str(exc).splitlines()[0]}
                    continue
                ok, rel = _check(d, ref, dtype)
                if not ok:
                    rec["candidates"][name] = {"ok": False, "rel_err": rel}
                    line.append(f"{name}:WRONG")
                    continue
                t = _graph_time([lambda a=a, b=b, d=d, k=kern: k(a, b, d) for a, b, d in pick])
                rec["candidates"][name] = {"ok": True, "rel_err": rel, "ms": t,
                                           "ratio": t_torch / t}
                if with_pdl:
                    te = _eager_time([lambda a=a, b=b, d=d, k=kern: k(a, b, d)
                                      for a, b, d in pick])
                    rec["candidates"][name].update(eager_ms=te,
                                                   eager_ratio=t_torch_eager / te)
                line.append(f"{name}:{t_torch / t:.2f}")
            best = max((v["ratio"], k) for k, v in rec["candidates"].items() if v.get("ok")) \
                if any(v.get("ok") for v in rec["candidates"].values()) else (0, "-")
            print(f"{entry.label:18} {dtype:8} torch {t_torch * 1e3:8.1f} us  best {best[1]:7} "
                  f"{best[0]:.2f}  | {' '.join(line)}", flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            rows += 1
            del ins, ref
    print(f"{rows} shape rows in {time.time() - t0:.0f} s; device {dev}")
    return 0


def run_streamk(bundle: Path, out: Path, dtypes, budget_s: float) -> int:
    """The stream-K check and timing on the GPU (see the module's docstring)."""
    import torch
    from tirx_gemm import registry, streamk
    from tirx_gemm.compile.bundle import load_manifest
    from tirx_gemm.run.loader import load_kernel
    from tirx_gemm.gitinfo import git_sha
    from tirx_gemm.bundle_format import code_git_sha
    t0 = time.time()
    step = registry.get("v12", "sm_90a")
    rt, static = {}, {}
    for e in load_manifest(bundle):
        kw = e.get("kwargs") or {}
        if e["step"] != "v12":
            continue
        key = (kw.get("dtype", "float16"), kw["BLK_M"], kw["BLK_N"])
        entry = (load_kernel(str(bundle / e["lib"])), kw)
        if kw.get("RUNTIME_M"):
            rt[key + (bool(kw.get("STREAM_K")),)] = entry
        else:
            static[key + ((e["M"], e["N"], e["K"]),)] = entry
    dev = torch.cuda.get_device_name()
    bad = 0
    for (M, N, K) in SK_SHAPES:
        for dtype in dtypes:
            if time.time() - t0 > budget_s:
                print(f"budget of {budget_s:.0f} s spent: stopping before {M}x{N}x{K}")
                return 1 if bad else 0
            ins, ref, pick, t_torch = _inputs(M, N, K, dtype)
            line = []
            for bm, bn in sk_tiles_for((M, N, K)):
                rec = {"M": M, "N": N, "K": K, "dtype": dtype, "tile": label(bm, bn),
                       "plan": streamk.describe(M, N, K, bm, bn, 132), "device": dev,
                       "torch": torch.__version__, "git_sha": code_git_sha(bundle) or git_sha(),
                       "date": time.strftime("%Y-%m-%d"), "torch_ms": t_torch}
                cands = {"off": rt.get((dtype, bm, bn, False)),
                         "on": rt.get((dtype, bm, bn, True)),
                         "on_static": static.get((dtype, bm, bn, (M, N, K)))}
                for name, got in cands.items():
                    if got is None:
                        continue
                    kern, kw = got
                    ws = tuple(torch.zeros(shape, dtype=getattr(torch, dt), device="cuda")
                               for _, shape, dt in step.workspace_specs(M, N, K, kw))
                    a, b, d = ins[0]
                    try:
                        r, ok = check_twice(kern, a, b, d, ws, ref, dtype,
                                            f"v12 {name} {label(bm, bn)} {M}x{N}x{K}",
                                            runs=2 if ws else 1)
                    except Exception as exc:  # noqa: BLE001 - recorded
                        rec[name] = {"error": str(exc).splitlines()[0]}
                        line.append(f"{label(bm, bn)}/{name}:ERROR")
                        bad += 1
                        continue
                    if not ok:
                        rec[name] = r
                        line.append(f"{label(bm, bn)}/{name}:WRONG")
                        bad += 1
                        continue
                    r["ms"] = _graph_time([lambda a=a, b=b, d=d, k=kern, ws=ws: k(a, b, d, *ws)
                                           for a, b, d in pick])
                    r["ratio"] = t_torch / r["ms"]
                    rec[name] = r
                    line.append(f"{label(bm, bn)}/{name}:{r['ratio']:.2f}")
                with open(out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            print(f"{M}x{N}x{K:<6} {dtype:8} torch {t_torch * 1e3:8.1f} us | {' '.join(line)}",
                  flush=True)
            del ins, ref
    print(f"done in {time.time() - t0:.0f} s; device {dev}; {bad} wrong or failed")
    return 1 if bad else 0


def main(argv) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--dtypes", default="bfloat16")
    e.add_argument("--cluster", action="store_true",
                   help="also the CLUSTER=2 entries (CLUSTER_MENU)")
    e.add_argument("--widths", action="store_true",
                   help="WIDTHS_MENU instead of MENU (the one-CTA widths between MENU's)")
    e.add_argument("--widths8", action="store_true",
                   help="WIDTHS8_MENU instead of MENU (widths of an odd multiple of 8)")
    e.add_argument("--streamk", action="store_true",
                   help="the stream-K bundle instead (SK_TILES with and without STREAM_K)")
    e.add_argument("--pdl", action="store_true",
                   help="PDL_MENU with and without PDL=True (programmatic dependent launch)")
    e.add_argument("--pairpdl", action="store_true",
                   help="PAIR_PDL_MENU as one CTA with PDL, a pair, and a pair with PDL")
    r = sub.add_parser("run")
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--suite", default=None)
    r.add_argument("--dtypes", default="bfloat16")
    r.add_argument("--budget-s", type=float, default=300)
    k = sub.add_parser("streamk")
    k.add_argument("--bundle", type=Path, required=True)
    k.add_argument("--out", type=Path, required=True)
    k.add_argument("--dtypes", default="bfloat16")
    k.add_argument("--budget-s", type=float, default=300)
    a = p.parse_args(argv)
    if a.cmd == "export":
        if a.streamk:
            return export_streamk(a.out, a.dtypes.split(","))
        return export(a.out, a.dtypes.split(","), a.cluster, a.widths, a.pdl, a.widths8,
                      a.pairpdl)
    if a.cmd == "streamk":
        return run_streamk(a.bundle, a.out, a.dtypes.split(","), a.budget_s)
    return run(a.bundle, a.out, a.suite, a.dtypes.split(","), a.budget_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
