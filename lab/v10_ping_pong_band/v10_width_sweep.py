"""v10's ping-pong with other tile widths against matmul's pick, on the H200.

The 2304^3 profile (README, "Where the targets stand") points at v12's epilogue,
which its two consumer warpgroups run with the tensor pipe idle; a ping-pong kernel (v10)
hides it, but v10 has one tile per warpgroup shape (128x128, or 64x256). This sweep asks
whether other widths would serve the mid-size shapes: v10 patched to take BLK_N
(lab/v10_ping_pong_band/patches/v10_blk_n.patch: a multiple of 64 up to 128 x 128 / BLK_M; not applied to
the step), at 64x128, 64x192, 64x256 and its own 128x128, beside matmul's pick (v12 or v9,
N and K fixed), bf16, CUDA-graph replays against torch.mm in the same run, every kernel
checked and run twice bit for bit, three passes. 128x64 is left out: ptxas gives it 111
registers at entry, too few for v10's 40/232 setmaxnreg split.

    git apply lab/v10_ping_pong_band/patches/v10_blk_n.patch
    python lab/v10_ping_pong_band/v10_width_sweep.py export .gpu/v10lab/bundle     # here
    git checkout steps/sm90a/hgemm_v10.py
    python lab/v10_ping_pong_band/v10_width_sweep.py run .gpu/v10lab/bundle OUT.jsonl   # GPU host
(the record: lab/v10_ping_pong_band/records/v10_widths_h200.jsonl)
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

SHAPES = [(2304, 2304, 2304), (2049, 3584, 3584), (1536, 1536, 1536), (1500, 3840, 1280),
          (3152, 768, 3072), (1536, 4608, 3584), (1000, 10240, 8192), (1024, 1024, 1024),
          (4096, 4096, 4096), (1000, 6144, 4096)]
V10 = [(64, 128), (64, 192), (64, 256), (128, 128)]  # (BLK_M, BLK_N) per consumer warpgroup
PASSES = 3


def label(step: str, kw: dict) -> str:
    if step == "v10":
        return f"v10_{kw['BLK_M']}x{kw['BLK_N']}"
    s = "v9" if step == "v9" else f"v12_{kw.get('BLK_M')}x{kw.get('BLK_N')}"
    return "pick_" + s + ("c2" if kw.get("CLUSTER") else "") + ("q" if kw.get("PDL") else "")


def export(out: str) -> None:
    sys.path.insert(0, ".")
    from tirx_gemm.op import rules as mc
    from tirx_gemm import registry
    from tirx_gemm.compile import bundle
    reqs = []
    v10 = registry.get("v10", "sm_90a")
    for M, N, K in SHAPES:
        for bm, bn in V10:
            kw = {"BLK_M": bm, "BLK_N": bn, "RUNTIME_M": True, "SM_COUNT": 132,
                  "dtype": "bfloat16"}
            if (bn // 64) % 2:
                kw["EPI_BUFS"] = 1  # the staging tiles must divide the 64-column chunks
            reqs.append((v10, (M, N, K), kw))
        step, kw = mc.choose(M, N, K, "bfloat16", "sm_90a", 132)
        kw = {k: v for k, v in kw.items() if k != "RUNTIME_NK"}
        reqs.append((registry.get(step, "sm_90a"), (M, N, K), kw))
    bundle.export(reqs, Path(out), ffi_wheel_python="3.12")


def run(bundle: str, out: str) -> None:
    sys.path.insert(0, "lab/tools")
    import torch
    import v12_sweep as V
    from tirx_gemm.compile.bundle import load_manifest
    from tirx_gemm.run.loader import load_kernel
    kernels = {}
    for e in load_manifest(Path(bundle)):
        kernels.setdefault((e["M"], e["N"], e["K"]), []).append(
            (label(e["step"], e["kwargs"]), load_kernel(str(Path(bundle) / e["lib"]))))
    dev = torch.cuda.get_device_name()
    for _ in range(PASSES):
        for M, N, K in SHAPES:
            ins, ref, pick, t_torch = V._inputs(M, N, K, "bfloat16")
            rec = {"M": M, "N": N, "K": K, "dtype": "bfloat16", "device": dev,
                   "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                   "torch_ms": t_torch, "candidates": {}}
            line = []
            for name, kern in sorted(kernels[(M, N, K)]):
                a, b, d = ins[0]
                try:
                    r, ok = V.check_twice(kern, a, b, d, (), ref, "bfloat16",
                                          f"{name} {M}x{N}x{K}")
                except Exception as exc:  # noqa: BLE001 - recorded
                    rec["candidates"][name] = {"error": str(exc).splitlines()[0]}
                    line.append(f"{name}:ERROR")
                    continue
                if not ok:
                    rec["candidates"][name] = r
                    line.append(f"{name}:WRONG")
                    continue
                fns = [lambda a=a, b=b, d=d, k=kern: k(a, b, d) for a, b, d in pick]
                r["ms"] = V._graph_time(fns)
                r["ratio"] = t_torch / r["ms"]
                rec["candidates"][name] = r
                line.append(f"{name}:{r['ratio']:.2f}")
            print(f"{M}x{N}x{K} torch {t_torch * 1e3:.1f} us | {' '.join(line)}", flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["export"] and len(sys.argv) == 3:
        export(sys.argv[2])
    elif sys.argv[1:2] == ["run"] and len(sys.argv) == 4:
        run(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: v10_width_sweep.py export OUT | run BUNDLE OUT.jsonl")
