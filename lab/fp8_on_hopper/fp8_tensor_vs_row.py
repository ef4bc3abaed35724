"""Why per-tensor scales trail torch more than rowwise ones: from one suite run's records (the
same shapes timed with both scale kinds), the time of our per-tensor kernel over our rowwise
one, and torch's per-tensor time over its rowwise time, as geomeans over M <= 128 and M > 128.
If ours are equal and torch's per-tensor is faster than its rowwise, the difference between
the two ratios is torch's baseline, not extra work on our scalar-scale path.

  python lab/fp8_on_hopper/fp8_tensor_vs_row.py SUITE_RECORDS.jsonl [--out F.jsonl]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

SMALL_M = 128


def compare(records: list[dict]) -> list[dict]:
    """One record per M range ("M<=128", "M>128", "all") with the geomeans (module docstring)."""
    by: dict = {}
    for r in records:
        if r.get("kind") == "fp8_case" and r.get("verified") and r.get("ratio_to_torch"):
            by.setdefault((r["M"], r["N"], r["K"]), {})[r["suite"]["scale"]] = r
    rows = []
    for (M, N, K), d in by.items():
        if "tensor" in d and "row" in d:
            t, r = d["tensor"], d["row"]
            ours = t["median_ms"] / r["median_ms"]
            torch = (t["median_ms"] * t["ratio_to_torch"]) / (r["median_ms"] * r["ratio_to_torch"])
            rows.append((M, ours, torch, t["ratio_to_torch"], r["ratio_to_torch"], t["device"]))

    def gm(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs))
    out = []
    for name, keep in (("M<=128", lambda m: m <= SMALL_M), ("M>128", lambda m: m > SMALL_M),
                       ("all", lambda m: True)):
        part = [x for x in rows if keep(x[0])]
        if part:
            out.append({"kind": "tensor_vs_row", "range": name, "shapes": len(part),
                        "device": part[0][5],
                        "ours_tensor_over_row_time": gm([x[1] for x in part]),
                        "torch_tensor_over_row_time": gm([x[2] for x in part]),
                        "ratio_to_torch_tensor": gm([x[3] for x in part]),
                        "ratio_to_torch_row": gm([x[4] for x in part])})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    with open(a.records, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    res = compare(recs)
    for r in res:
        print(json.dumps(r, sort_keys=True))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            for r in res:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
