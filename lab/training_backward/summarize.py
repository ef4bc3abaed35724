"""Print bench.py's records as one table: per layer and token count, torch time / ours for the
whole block (forward + backward), for wgrad alone, with the layout copies' share of our
backward, and the same with v15 where recorded; then the geomean per gemm.

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
    print("| card | model | layer | M | block | wgrad | copies / bwd | block v15 | wgrad v15 | "
          "TFLOP/s block (ours / torch) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = defaultdict(list)
    for (card, model, layer, M), g in by.items():
        def ratio(name):
            r = g.get(name)
            if r is None or r.get("ratio") is None:
                return "-"
            ratios[name].append(r["ratio"])
            return f"{r['ratio']:.3f}"
        share = g.get("copies", {}).get("share_of_bwd")
        blk = g.get("block", {})
        print(f"| {card} | {model} | {layer} | {M} | {ratio('block')} | {ratio('wgrad')} | "
              f"{'-' if share is None else f'{share:.1%}'} | {ratio('block_v15')} | "
              f"{ratio('wgrad_v15')} | {blk.get('tflops_tirx', '-')} / "
              f"{blk.get('tflops_torch', '-')} |")
    print()
    for name, xs in sorted(ratios.items()):
        gm = math.exp(sum(math.log(x) for x in xs) / len(xs))
        print(f"{name}: geomean torch/ours {gm:.3f}, min {min(xs):.3f}, max {max(xs):.3f} "
              f"over {len(xs)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
