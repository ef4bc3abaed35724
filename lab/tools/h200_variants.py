"""Lab work on the H200: check (and time) a list of step variants against torch in one run.

A variant is a step, a shape, builder keywords (SM_COUNT, SPLIT_K, PIPE_DEPTH, ...) and a
dtype, listed in a JSON spec (e.g. lab/split_k_deep_k/suites/splitk_variants.json; a v12 variant
with a keyword that left the builder, such as lab/mma_lag_and_l2_hints/suites/l2.json's L2_PROMO
and B_HINT or mmalag.json's MMA_LAG, needs its study's patch applied first: export stops with a
one-line error naming it, lab/tools/lab_patches.py). The registry's
bundles hold one kernel per step, shape and dtype; a lab question (does a CTA pair with one
CTA wholly past M still complete its barriers? which split count is fastest at
256x256x16384?) needs others, so this script exports them here and runs them there:

    python lab/tools/h200_variants.py export SPEC --out build/bundle-lab          # here
    python lab/tools/h200_variants.py run --bundle build/bundle-lab \\
        --records lab/steps_on_h200/records/h200.jsonl [--passes 3]                              # GPU host

Every variant is checked first (random and exact small-integer inputs, D poisoned with
NaN); a variant whose spec says "time" is then timed with torch.matmul in the same run,
launch by launch in alternation, over ``--passes`` passes (medians printed). Records go to
their own file, never to results/<device>.jsonl: a variant must not replace the registry
kernel's record in the README table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lab_patches  # noqa: E402

NUM_SMS = 132  # the H200


def load_spec(path: Path) -> list[dict]:
    """[{step, arch, shape, kwargs, time, label}] from the spec's groups, validated."""
    from tirx_gemm import registry
    out = []
    for i, g in enumerate(json.loads(Path(path).read_text())["groups"]):
        where = f"{path} group {i}"
        arch = g.get("arch", "sm_90a")
        dtypes = g.get("dtypes", ["float16"])
        for sid in g["steps"]:
            step = registry.get(sid, arch)
            for shape in g["shapes"]:
                if len(shape) != 3:
                    raise ValueError(f"{where}: shape {shape} is not [M, N, K]")
                for dt in dtypes:
                    kw = {**step.with_sm_count(NUM_SMS), **g.get("kwargs", {})}
                    if dt != "float16":
                        kw["dtype"] = dt
                    out.append({"step": step, "shape": tuple(shape), "kwargs": kw,
                                "time": bool(g.get("time", False)),
                                "label": g.get("label", "")})
    return out


def export(spec: Path, out: Path) -> int:
    from tirx_gemm.compile import bundle
    variants = load_spec(spec)
    reqs = [(v["step"], v["shape"], v["kwargs"]) for v in variants]
    lab_patches.require([kw for step, _, kw in reqs if step.id == "v12"])
    bundle.export(reqs, out, ffi_wheel_python="3.12")
    (out / "lab_spec.json").write_text(json.dumps(
        [{"step": v["step"].id, "arch": v["step"].arch, "shape": v["shape"],
          "kwargs": v["kwargs"], "time": v["time"], "label": v["label"]} for v in variants],
        indent=1))
    print(f"exported {len(reqs)} variant kernels to {out}")
    return 0


def _kw_text(kw: dict) -> str:
    kw = {k: v for k, v in kw.items() if not (k == "SM_COUNT" and v == NUM_SMS) and k != "dtype"}
    return " ".join(f"{k}={v}" for k, v in kw.items()) or "default"


def run(bundle_dir: Path, records_path: Path, passes: int) -> int:
    from tirx_gemm import registry
    from tirx_gemm.compile import bundle
    from tirx_gemm.run import loader
    from tirx_gemm.run import runner
    variants = json.loads((bundle_dir / "lab_spec.json").read_text())
    records_path.parent.mkdir(parents=True, exist_ok=True)
    bad, rows = 0, {}
    for p in range(passes):
        for v in variants:
            if p and not v["time"]:
                continue
            step = registry.get(v["step"], v["arch"])
            e = dict(bundle.find(bundle_dir, step, tuple(v["shape"]), kwargs=v["kwargs"]))
            kernel = loader.load_kernel(str(bundle_dir / e["lib"]))
            rec = runner.run_step(kernel, e, check=(p == 0), time=v["time"],
                                  time_unverified=(p > 0), git_sha=e.get("git_sha"), log=None)
            rec.update(variant=_kw_text(v["kwargs"]), kwargs=v["kwargs"], lab=v["label"],
                       lab_pass=p)
            with open(records_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
            key = (v["step"], tuple(v["shape"]), v["kwargs"].get("dtype", "float16"),
                   _kw_text(v["kwargs"]))
            rows.setdefault(key, []).append(rec)
            if p == 0 and not rec.get("verified"):
                bad += 1
            M, N, K = v["shape"]
            print(f"pass {p} {v['step']:4} {M}x{N}x{K:<7} {key[2]:9} {key[3]:30} "
                  + ("ok   " if rec.get("verified") else ("     " if p else "FAIL "))
                  + (f"{rec.get('tflops') or 0:8.1f} TFLOP/s torch {rec.get('torch_tflops') or 0:8.1f}"
                     f" x{rec.get('ratio_to_torch') or 0:.3f}" if v["time"] else ""),
                  flush=True)
    print("\nmedians over passes (ratio to torch.matmul timed in the same run):")
    for (sid, shape, dt, kw), recs in rows.items():
        timed = [r for r in recs if r.get("ratio_to_torch")]
        if not timed:
            continue
        print(f"{sid:4} {'x'.join(map(str, shape)):18} {dt:9} {kw:30} "
              f"{statistics.median(r['tflops'] for r in timed):8.1f} TFLOP/s "
              f"x{statistics.median(r['ratio_to_torch'] for r in timed):.3f}")
    print(f"{bad} variant(s) failed their check; records appended to {records_path}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("spec")
    e.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bundle", required=True)
    r.add_argument("--records", default="lab/steps_on_h200/records/h200.jsonl")
    r.add_argument("--passes", type=int, default=3)
    args = ap.parse_args(argv)
    from tirx_gemm.compile.procs import BuildError
    try:
        if args.cmd == "export":
            return export(Path(args.spec), Path(args.out))
        if args.passes < 1:
            raise ValueError("--passes must be >= 1")
        return run(Path(args.bundle), Path(args.records), args.passes)
    except (ValueError, KeyError, OSError, BuildError) as e:
        print(f"h200_variants: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
