"""v12's tile menu on the H200: every menu entry at every suite shape, checked and timed
against torch.matmul in the same run; the data the chooser's cost model is fitted to.

v12 built with RUNTIME_M and RUNTIME_NK takes the whole shape at run time, so one kernel per
(menu entry, dtype) serves every suite shape:

    python scripts/lab/v12_sweep.py export --out .gpu/v12 [--dtypes bfloat16] [--cluster]  # here
    python scripts/lab/v12_sweep.py run --bundle .gpu/v12 --out FILE.jsonl           # GPU host
        [--suite tirx_gemm/suites/models.json] [--dtypes bfloat16] [--budget-s 300]

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
L2_BYTES = 60 << 20
LAUNCHES = 20


def label(bm, bn, cluster=1):
    return f"{bm}x{bn}" + ("" if cluster == 1 else f"c{cluster}")


def export(out: Path, dtypes, cluster: bool = False, widths: bool = False) -> int:
    from tirx_gemm import registry
    from tirx_gemm.compile import bundle
    step = registry.get("v12", "sm_90a")
    reqs = []
    for dt in dtypes:
        for bm, bn in (WIDTHS_MENU if widths else MENU):
            kw = {"BLK_M": bm, "BLK_N": bn, "SM_COUNT": 132, "RUNTIME_M": True,
                  "RUNTIME_NK": True}
            if dt != "float16":
                kw["dtype"] = dt
            reqs.append((step, (128, 256, 256), kw))
        for bm, bn in CLUSTER_MENU if cluster else ():
            kw = {"BLK_M": bm, "BLK_N": bn, "SM_COUNT": 132, "RUNTIME_M": True,
                  "RUNTIME_NK": True, "CLUSTER": 2}
            if dt != "float16":
                kw["dtype"] = dt
            reqs.append((step, (128, 256, 256), kw))
    bundle.export(reqs, out, ffi_wheel_python="3.12")
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


def _graph_time(fn_list):
    """GPU ms per launch: a CUDA graph of the launches, replayed; median of 5."""
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
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / len(fn_list))
    return sorted(times)[2]


def run(bundle: Path, out: Path, suite_path, dtypes, budget_s: float) -> int:
    import torch
    from tirx_gemm import suite as suites
    from tirx_gemm.compile.bundle import load_manifest
    from tirx_gemm.run.loader import load_kernel
    from tirx_gemm.gitinfo import git_sha
    from tirx_gemm.run.launcher import synchronize
    t0 = time.time()
    kernels = {}
    for e in load_manifest(bundle):
        kw = e.get("kwargs") or {}
        if e["step"] == "v12":
            kernels[(kw.get("dtype", "float16"), kw["BLK_M"], kw["BLK_N"],
                     kw.get("CLUSTER", 1))] = \
                load_kernel(str(bundle / e["lib"]))
    s = suites.load_suite(suite_path)
    dev = torch.cuda.get_device_name()
    rows = 0
    for entry in s.entries:
        for dtype in dtypes:
            if time.time() - t0 > budget_s:
                print(f"budget of {budget_s:.0f} s spent: stopping before {entry.label}")
                return 0
            M, N, K = entry.shape
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
                                   for a, b, d in pick])
            rec = {"M": M, "N": N, "K": K, "dtype": dtype, "model": entry.model,
                   "layer": entry.layer, "device": dev, "torch": torch.__version__,
                   "git_sha": git_sha(), "date": time.strftime("%Y-%m-%d"),
                   "torch_ms": t_torch, "candidates": {}}
            line = []
            for (dt, bm, bn, cl), kern in sorted(kernels.items()):
                if dt != dtype:
                    continue
                name = label(bm, bn, cl)
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
    r = sub.add_parser("run")
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--suite", default=None)
    r.add_argument("--dtypes", default="bfloat16")
    r.add_argument("--budget-s", type=float, default=300)
    a = p.parse_args(argv)
    if a.cmd == "export":
        return export(a.out, a.dtypes.split(","), a.cluster, a.widths)
    return run(a.bundle, a.out, a.suite, a.dtypes.split(","), a.budget_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
