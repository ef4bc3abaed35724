"""The adoption rule of v14's TAIL_SPLIT, applied to bench_grouped.py records (standard library).

    python lab/moe_grouped_gemm/tail_split.py records/tail_split_rule_h100_bfloat16.jsonl
    python lab/moe_grouped_gemm/tail_split.py --heldout records/tail_split_heldout_h100_bfloat16.jsonl

The rule (set before its run; lab/moe_grouped_gemm/README.md, "The last wave cut along K"):
TAIL_SPLIT=4 goes into choose_grouped for plain 16-bit tiles with K >= 4096 if, in one run
on a card with the suite's routing and a held-out one, at every case of suites/tail_split_rule.json
the variant's result is within 1e-2 of the loop's (largest error over the largest value; a
K split sums in another order, so a bf16 result may round one step, 2^-8, away), the
geomean of the pick's time over the variant's is at least 1.01, and no case is more than 2%
slower than the pick (the spread between two earlier runs). It did not pass.

``--heldout`` (the rule of the predicted-gain condition, set before its run): in one run of
suites/tail_split_heldout.json with --routing-seed 200, every result within 1e-2 of the loop's;
at the cases where the condition cut the last wave in at least two of the three routings
(each record's ``tail_split_engaged``) a geomean of the pick's time over the variant's of at
least 1.02; and no case, the controls included, more than 2% slower than the pick.
"""
from __future__ import annotations

import json
import math
import sys

VARIANT = "variant:pick tail split 4"
GEOMEAN, WORST, TOL = 1.01, 1.02, 1e-2


def rows(records):
    """(model, layer, tokens, routing seed, pick us, variant us, both correct) per record."""
    out = []
    for r in records:
        t, err = r.get("t_us") or {}, r.get("check_rel_err") or {}
        if VARIANT not in t or not t.get("tirx") or not t.get(VARIANT):
            continue
        ok = err.get(VARIANT, 1.0) <= TOL
        out.append((r["model"], r["layer"], r["tokens"], (r.get("routing") or {}).get("seed", 0),
                    t["tirx"], t[VARIANT], ok))
    return out


def verdict(table) -> tuple[bool, float, float]:
    """(passes, geomean gain, worst slowdown) over the rows."""
    gains = [p / v for *_, p, v, _ in table]
    gm = math.exp(sum(map(math.log, gains)) / len(gains))
    worst = max(v / p for *_, p, v, _ in table)
    seeds = {row[3] for row in table}
    ok = all(row[-1] for row in table) and gm >= GEOMEAN and worst <= WORST and len(seeds) >= 2
    return ok, gm, worst


HELDOUT_GEOMEAN = 1.02


def heldout(records) -> tuple[bool, float, float, int]:
    """(passes, geomean gain at the engaged cases, worst slowdown, engaged cases)."""
    records = list(records)
    table = rows(records)
    cut = [sum((r.get("tail_split_engaged") or {}).get(VARIANT, [])) >= 2 for r in records
           if VARIANT in (r.get("t_us") or {})]
    gains = [p / v for (*_, p, v, _), c in zip(table, cut) if c]
    gm = math.exp(sum(map(math.log, gains)) / len(gains)) if gains else 0.0
    worst = max(v / p for *_, p, v, _ in table)
    ok = all(row[-1] for row in table) and gm >= HELDOUT_GEOMEAN and worst <= WORST
    return ok, gm, worst, len(gains)


def main(argv) -> int:
    if argv[:1] == ["--heldout"]:
        ok, gm, worst, n = heldout(json.loads(x) for p in argv[1:] for x in open(p) if x.strip())
        print(f"{n} cases cut: geomean gain {gm:.3f}; worst over all cases {worst:.3f}x the pick's "
              f"time -> " + ("passes" if ok else "does not pass") + f" (at least {HELDOUT_GEOMEAN}, "
              f"none over {WORST}x, every result checked)")
        return 0
    table = rows(json.loads(x) for p in argv for x in open(p) if x.strip())
    if not table:
        print("no record with the pick and TAIL_SPLIT=4 both timed")
        return 1
    for model, layer, T, seed, p, v, ok in table:
        print(f"{model:14} {layer[:22]:22} T={T:6d} routing seed {seed:3d}: pick {p:9.1f} us, "
              f"split {v:9.1f} us, gain {p / v:.3f}{'' if ok else ', CHECK FAILED'}")
    ok, gm, worst = verdict(table)
    print(f"{len(table)} cases: geomean gain {gm:.3f}, worst {worst:.3f}x the pick's time -> "
          + ("passes" if ok else "does not pass") + f" (geomean >= {GEOMEAN}, none over "
          f"{WORST}x, every result checked, two routings)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
