"""Weight-streaming shapes (M <= 128 tokens, a wide weight) on the H200 under the
interleaved graph timing: matmul's 64-row picks there slow down more than torch's kernels
once the GPU is settled (README, "order bias"). This times, per shape, torch.mm and a set of
v12 kernels (other tiles, two consumer warpgroups, more wgmma groups in flight, pairs,
swap-AB) as CUDA graphs replayed alternately after a warm-up, each checked first.

    python scripts/lab/streaming_sweep.py export --out .gpu/stream          # here
    python scripts/lab/streaming_sweep.py run --bundle .gpu/stream --out FILE.jsonl  # GPU host

One JSON line per (shape, dtype): torch's time and each kernel's time and ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from v12_sweep import _check, _graphs_interleaved, _inputs  # noqa: E402

SHAPES = ((128, 6144, 4096), (64, 6144, 4096), (128, 8192, 28672), (128, 4096, 4096),
          (128, 14336, 4096), (128, 4096, 14336), (128, 10240, 8192))
BASE = {"SM_COUNT": 132, "RUNTIME_M": True, "RUNTIME_NK": True}
PF = {"PREFETCH_MAPS": True}
# label -> v12 keywords (beside BASE and the dtype)
KERNELS = {
    "64x64": {"BLK_M": 64, "BLK_N": 64, **PF},
    "64x64p": {"BLK_M": 64, "BLK_N": 64, "PDL": True, **PF},
    "64x96": {"BLK_M": 64, "BLK_N": 96, **PF},
    "64x128": {"BLK_M": 64, "BLK_N": 128, **PF},
    "64x160": {"BLK_M": 64, "BLK_N": 160, **PF},
    "64x224": {"BLK_M": 64, "BLK_N": 224, **PF},
    "64x96L2": {"BLK_M": 64, "BLK_N": 96, "MMA_LAG": 2, **PF},
    "64x128L2": {"BLK_M": 64, "BLK_N": 128, "MMA_LAG": 2, **PF},
    "128x48": {"BLK_M": 128, "BLK_N": 48, **PF},
    "128x64": {"BLK_M": 128, "BLK_N": 64, **PF},
    "128x96": {"BLK_M": 128, "BLK_N": 96, **PF},
    "64x96c2": {"BLK_M": 64, "BLK_N": 96, "CLUSTER": 2},
    "64x128c2": {"BLK_M": 64, "BLK_N": 128, "CLUSTER": 2},
    "64x64w": {"BLK_M": 64, "BLK_N": 64, "SWAP_AB": True, **PF},
    "64x128w": {"BLK_M": 64, "BLK_N": 128, "SWAP_AB": True, **PF},
}


def export(out: Path, dtypes) -> int:
    from tirx_gemm import registry
    from tirx_gemm.compile import bundle
    step = registry.get("v12", "sm_90a")
    reqs = []
    for dt in dtypes:
        for kw in KERNELS.values():
            k = {**BASE, **kw}
            if dt != "float16":
                k["dtype"] = dt
            reqs.append((step, (128, 256, 256), k))
    bundle.export(reqs, out, ffi_wheel_python="3.12")
    return 0


def _label(kw: dict) -> str | None:
    core = {k: v for k, v in kw.items() if k not in BASE and k != "dtype"}
    return next((name for name, want in KERNELS.items() if want == core), None)


def run(bundle: Path, out: Path, dtypes, budget_s: float) -> int:
    import torch
    from tirx_gemm.bundle_format import code_git_sha
    from tirx_gemm.compile.bundle import load_manifest
    from tirx_gemm.gitinfo import git_sha
    from tirx_gemm.run.launcher import synchronize
    from tirx_gemm.run.loader import load_kernel
    t0 = time.time()
    kernels = {}
    for e in load_manifest(bundle):
        kw = e.get("kwargs") or {}
        name = _label(kw)
        if e["step"] == "v12" and name:
            kernels[(kw.get("dtype", "float16"), name)] = load_kernel(str(bundle / e["lib"]))
    dev = torch.cuda.get_device_name()
    sha = code_git_sha(bundle) or git_sha()
    bad = 0
    for M, N, K in SHAPES:
        for dtype in dtypes:
            if time.time() - t0 > budget_s:
                print(f"budget of {budget_s:.0f} s spent: stopping before {M}x{N}x{K}")
                return 1 if bad else 0
            ins, ref, pick, _ = _inputs(M, N, K, dtype, time_torch=False)
            names, fns = ["torch"], [[lambda a=a, b=b, d=d: torch.mm(a, b.t(), out=d)
                                      for a, b, d in pick]]
            rec = {"M": M, "N": N, "K": K, "dtype": dtype, "device": dev,
                   "torch": torch.__version__, "git_sha": sha, "timing": "interleaved",
                   "date": time.strftime("%Y-%m-%d"), "candidates": {}}
            for (dt, name), kern in sorted(kernels.items()):
                if dt != dtype:
                    continue
                a, b, d = ins[0]
                d.fill_(float("nan"))
                try:
                    kern(a, b, d)
                    synchronize(f"v12 {name} {M}x{N}x{K}")
                except Exception as exc:  # noqa: BLE001 - recorded
                    rec["candidates"][name] = {"error": str(exc).splitlines()[0]}
                    bad += 1
                    continue
                ok, rel = _check(d, ref, dtype)
                rec["candidates"][name] = {"ok": ok, "rel_err": rel}
                if not ok:
                    bad += 1
                    continue
                names.append(name)
                fns.append([lambda a=a, b=b, d=d, k=kern: k(a, b, d) for a, b, d in pick])
            times = _graphs_interleaved(fns)
            rec["torch_ms"] = times[0]
            for name, t in zip(names[1:], times[1:]):
                rec["candidates"][name].update(ms=t, ratio=times[0] / t)
            line = " ".join(f"{n}:{times[0] / t:.2f}" for n, t in zip(names[1:], times[1:]))
            print(f"{M}x{N}x{K:<6} {dtype:8} torch {times[0] * 1e3:7.1f} us | {line}",
                  flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            del ins, ref, fns
    print(f"done in {time.time() - t0:.0f} s; device {dev}; {bad} wrong or failed")
    return 1 if bad else 0


def main(argv) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--dtypes", default="bfloat16")
    r = sub.add_parser("run")
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--dtypes", default="bfloat16")
    r.add_argument("--budget-s", type=float, default=300)
    a = p.parse_args(argv)
    if a.cmd == "export":
        return export(a.out, a.dtypes.split(","))
    return run(a.bundle, a.out, a.dtypes.split(","), a.budget_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
