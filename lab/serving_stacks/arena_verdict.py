"""The rule of lab/serving_stacks' "Split-K counters in a captured graph" applied to decode_linears.py records
(``--between --rotate --arena-ab``).

    python lab/serving_stacks/arena_verdict.py records/capture_arena_h100.jsonl

Per record whose matmul pick is a K split (its ``explain`` line says SPLIT_K > 1): gain = the call captured with a
fill of its own counters ("tirx fill") over the call captured with the capture arena ("tirx"; > 1: the arena
faster). The arena stays when every record is correct and the gains have a geomean of at least GAIN with no case
under WORST. Standard library only.
"""
from __future__ import annotations

import json
import sys

from split_bias_verdict import geomean, split_pick

GAIN, WORST = 1.02, 0.98


def gains(records) -> list[tuple[str, float]]:
    out = []
    for r in records:
        us = r.get("us") or {}
        if "tirx fill" in us and split_pick(r):
            out.append((f"{r['model']} {r['layer']} M={r['M']} bias={r['bias']}", us["tirx fill"] / us["tirx"]))
    return out


def passes(records) -> bool:
    g = [x for _, x in gains(records)]
    return bool(g) and all("error" not in r for r in records) and geomean(g) >= GAIN and min(g) >= WORST


def main(argv) -> int:
    records = [json.loads(line) for p in argv for line in open(p) if line.strip()]
    g = gains(records)
    for case, x in g:
        print(f"  {case}: {x:.3f}")
    xs = [x for _, x in g]
    print(f"{len(xs)} split calls, fill over arena geomean {geomean(xs):.3f}, worst {min(xs):.3f}: the arena "
          f"{'stays' if passes(records) else 'does not meet the bar'} ({records[0].get('card') if records else None})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
