"""The cost model's error on every plain v12 kernel matmul has timed on a card, grouped by
what the model has no term for: K whose rows are not whole 128-byte lines (TMA boxes
straddle two L2 lines), one CTA or a CTA pair.

    python lab/cost_model_error_classes/model_error.py [--card h200] [--write] [--check]

Reads every ``lab/*/records/matmul_graph_<card>*.jsonl`` record (matmul's pick timed under
CUDA graphs against torch) and this study's ``records/error_classes*_<card>.jsonl`` (each
candidate timed beside the pick); keeps the plain v12 kernels the model rates (one CTA or a
CTA pair, no split, swap or epilogue) and, per (shape, dtype, tile), the median of the
measured times. Per group: how many, and the geometric mean of model / measured. The
slowdown of a misaligned group is the aligned one-CTA group's mean over its own: what
tirx_gemm.op.cost_model.MISALIGNED_SLOWDOWN holds. ``--write`` writes the groups to
``records/model_error_<card>.jsonl``; ``--check`` fails when that file differs from what the
records give now.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CARD_NAMES = {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3"}


def _kernels(card: str) -> dict:
    """{(M, N, K, dtype, candidate): [measured us, ...]} of the plain v12 kernels."""
    from tirx_gemm.op import cost_model as cm
    out: dict = {}

    def add(M, N, K, dtype, kw, ms):
        if any(kw.get(k) for k in ("SWAP_AB", "STREAM_K", "BIAS", "ACT", "SWIGLU", "OUT_DTYPE")):
            return
        if "SPLIT_K" in kw or kw.get("CLUSTER", 1) not in (1, 2):
            return
        name = cm.name(kw["BLK_M"], kw["BLK_N"], kw.get("CLUSTER", 1))
        if name in cm.params():
            out.setdefault((M, N, K, dtype, name), []).append(ms * 1e3)

    for path in sorted(glob.glob(str(ROOT / "lab" / "*" / "records" / f"matmul_graph_{card}*.jsonl"))):
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if r.get("ok") and r.get("step") == "v12" and r.get("device") == CARD_NAMES[card]:
                add(r["M"], r["N"], r["K"], r["dtype"], r.get("kwargs") or {}, r["ms"])
    for own in sorted((HERE / "records").glob(f"error_classes*_{card}.jsonl")):
        for line in own.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            for x in r["candidates"].values():
                if x.get("ok") and "ms" in x and x["step"] == "v12":
                    add(r["M"], r["N"], r["K"], r["dtype"], x["kwargs"], x["ms"])
    return out


def groups(card: str) -> list[dict]:
    from tirx_gemm.op import cost_model as cm
    from tirx_gemm.op.cost_model import misaligned_rows
    by: dict = {}
    for (M, N, K, dtype, name), times in _kernels(card).items():
        pred = cm.predict(name, M, N, K)  # the model as fitted: no term for the K's rows
        key = ("misaligned" if misaligned_rows(K) else "aligned",
               "pair" if cm.tile(name)[2] == 2 else "one_cta")
        by.setdefault(key, []).append(pred / statistics.median(times))
    out = []
    for (rows, kind), xs in sorted(by.items()):
        out.append({"card": CARD_NAMES[card], "rows": rows, "kind": kind, "kernels": len(xs),
                    "model_over_measured": math.exp(sum(map(math.log, xs)) / len(xs))})
    base = next(g["model_over_measured"] for g in out if g["rows"] == "aligned"
                and g["kind"] == "one_cta")
    for g in out:
        g["slowdown"] = round(base / g["model_over_measured"], 4)
        g["model_over_measured"] = round(g["model_over_measured"], 4)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--card", choices=sorted(CARD_NAMES), default="h200")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    rows = groups(a.card)
    for g in rows:
        print(f"{g['rows']:10} {g['kind']:7} {g['kernels']:4} kernels: model / measured "
              f"{g['model_over_measured']:.3f}, slowdown {g['slowdown']:.3f}")
    path = HERE / "records" / f"model_error_{a.card}.jsonl"
    text = "".join(json.dumps(g) + "\n" for g in rows)
    if a.write:
        path.write_text(text, encoding="utf-8")
    if a.check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            print(f"{path.relative_to(ROOT)} is stale: run with --write")
            return 1
        print("ok: the groups hold what the records give")
    return 0


if __name__ == "__main__":
    sys.exit(main())
