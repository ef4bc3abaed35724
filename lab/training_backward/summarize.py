"""Print bench.py's records as one table: per layer and token count, torch time / ours for the
forward, the whole block (forward + backward) on the copy path and on v15, each backward GEMM
on v15's builds and on v12 (kernels alone), with the layout copies' share of the copy
path's backward; then the geomean (and the least) per gemm.

    python lab/training_backward/summarize.py records/bench_h100.jsonl
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict


def main(path: str) -> int:
    recs = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    by = defaultdict(dict)
    for r in recs:
        by[(r["card"], r["model"], r["layer"], r["M"])][r["gemm"]] = r
    cols = ("fwd", "block", "block_v15", "dgrad_v15", "wgrad_v15", "dgrad_v15rk", "wgrad_v15rk",
            "dgrad_v15pair", "wgrad_v15pair", "dgrad_v15kk", "dgrad", "wgrad")
    print("| card | model | layer | M | " + " | ".join(cols) + " | copies / bwd | "
          "TFLOP/s block v15 (ours / torch) |")
    print("|---|---|---|---|" + "---|" * len(cols) + "---|---|")
    ratios = defaultdict(list)
    for (card, model, layer, M), g in by.items():
        def ratio(name):
            r = g.get(name)
            if r is None or r.get("ratio") is None:
                return "-"
            ratios[name].append(r["ratio"])
            return f"{r['ratio']:.3f}"
        share = g.get("copies", {}).get("share_of_bwd")
        blk = g.get("block_v15", {})
        print(f"| {card} | {model} | {layer} | {M} | " + " | ".join(ratio(c) for c in cols)
              + f" | {'-' if share is None else f'{share:.1%}'} | "
              f"{blk.get('tflops_tirx', '-')} / {blk.get('tflops_torch', '-')} |")
    print()
    for name, xs in sorted(ratios.items()):
        gm = math.exp(sum(math.log(x) for x in xs) / len(xs))
        print(f"{name}: geomean torch/ours {gm:.3f}, min {min(xs):.3f}, max {max(xs):.3f} "
              f"over {len(xs)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
