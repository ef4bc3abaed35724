"""Check and time variants of the Hopper steps (builder keywords) against torch in one run.

Tuning needs several builds of one step at one shape, which the registry's bundles (one
kernel per step and shape) do not hold. This script exports a list of variants (step,
keywords, watchdog) here, and on the GPU host checks and times each of them, torch.matmul
timed in the same run for every row, over two passes so the spread is visible:

    python lab/steps_on_h200/sweep_variants.py export --out build/bundle-sweep          # here
    python lab/steps_on_h200/sweep_variants.py run --bundle build/bundle-sweep \\
        --records lab/steps_on_h200/records/h200_sweep.jsonl                                    # GPU host

Records go to their own file (not results/*.jsonl): a variant must not replace the
registry kernel's record in the README table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))
NUM_SMS = 132  # the H200
# (step, builder keywords beyond SM_COUNT, watchdog_ms)
VARIANTS = (
    # this round: same-run baselines, then what fast.cu does differently from
    # v9 -- a 128-SM pool (64 clusters: 4096^3's 256 cluster tiles make exactly 4 per
    # cluster) and a 24/240 register split. The earlier round (L2 group, depth, staging
    # buffers, watchdog cost) is in lab/steps_on_h200/logs/h200_sweep.log and this file's history.
    ("v7", {}, None),
    ("v8", {}, None),
    ("v9", {}, None),
    ("v7", {"SM_COUNT": 128}, None),
    ("v8", {"SM_COUNT": 128}, None),
    ("v9", {"SM_COUNT": 128}, None),
    ("v9", {"PRODUCER_REGS": 24, "CONSUMER_REGS": 240}, None),
    ("v9", {"SM_COUNT": 128, "PRODUCER_REGS": 24, "CONSUMER_REGS": 240}, None),
)


def export(out: Path) -> int:
    from tirx_gemm import registry
    from tirx_gemm.compile import bundle
    for wd in sorted({w for _, _, w in VARIANTS}, key=lambda w: w or 0):
        reqs = []
        for sid, kw, w in VARIANTS:
            if w != wd:
                continue
            step = registry.get(sid, "sm_90a")
            for shape in SHAPES:
                reqs.append((step, shape, {**step.with_sm_count(NUM_SMS), **kw}))
        bundle.export(reqs, out, watchdog_ms=wd, ffi_wheel_python="3.12")
    print(f"exported {len(VARIANTS) * len(SHAPES)} variant kernels to {out}")
    return 0


def _label(e: dict) -> str:
    kw = {k: v for k, v in e["kwargs"].items() if k != "SM_COUNT" or v != NUM_SMS}
    text = " ".join(f"{k}={v}" for k, v in kw.items()) or "default"
    return text + (f" wd{e['watchdog_ms']}" if e.get("watchdog_ms") else "")


def run(bundle_dir: Path, records_path: Path, passes: int) -> int:
    from tirx_gemm.compile import bundle
    from tirx_gemm.run import loader
    from tirx_gemm.run import runner
    entries = sorted(bundle.load_manifest(bundle_dir),
                     key=lambda e: (e["M"], e["step"], _label(e)))
    records_path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for p in range(passes):
        for e in entries:
            kernel = loader.load_kernel(str(bundle_dir / e["lib"]))
            # pass 0 checks (a failed check is not timed); later passes only time, the
            # kernel having passed its check in pass 0
            rec = runner.run_step(kernel, e, check=(p == 0), time=True,
                                  time_unverified=(p > 0), git_sha=e.get("git_sha"), log=None)
            rec.update(variant=_label(e), kwargs=e["kwargs"], watchdog_ms=e.get("watchdog_ms"),
                       sweep_pass=p)
            with open(records_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
            rows.append(rec)
            print(f"pass {p} {e['step']} {e['M']}^3 {_label(e):28} "
                  f"{rec.get('tflops') or 0:7.1f} TFLOP/s  torch {rec.get('torch_tflops') or 0:7.1f}"
                  f"  x{rec.get('ratio_to_torch') or 0:.3f}"
                  + ("" if p or rec.get("verified") else "  CHECK FAILED"), flush=True)
    print("\nmedian over passes (ratio to torch timed in the same run):")
    print(f"{'step':4} {'shape':6} {'variant':28} {'TFLOP/s':>8} {'x torch':>8} {'spread':>7}")
    keys = sorted({(r["step"], r["M"], r["variant"]) for r in rows})
    bad = 0
    for sid, M, var in keys:
        mine = [r for r in rows if (r["step"], r["M"], r["variant"]) == (sid, M, var)]
        bad += sum(1 for r in mine if r.get("sweep_pass") == 0 and not r.get("verified"))
        ratios = sorted(r.get("ratio_to_torch") or 0 for r in mine)
        tf = sorted(r.get("tflops") or 0 for r in mine)
        print(f"{sid:4} {M:<6} {var:28} {tf[len(tf) // 2]:8.1f} {ratios[len(ratios) // 2]:8.3f} "
              f"{ratios[-1] - ratios[0]:7.3f}")
    print(f"records appended to {records_path}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bundle", required=True)
    r.add_argument("--records", default="lab/steps_on_h200/records/h200_sweep.jsonl")
    r.add_argument("--passes", type=int, default=2)
    args = ap.parse_args(argv)
    if args.cmd == "export":
        from tirx_gemm.compile.api import BuildError
        try:
            return export(Path(args.out))
        except (ValueError, BuildError) as e:
            print(f"sweep_variants: error: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
    if args.passes < 1:
        print("sweep_variants: error: --passes must be >= 1", file=sys.stderr)
        return 2
    return run(Path(args.bundle), Path(args.records), args.passes)


if __name__ == "__main__":
    sys.exit(main())
