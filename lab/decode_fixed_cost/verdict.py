"""The rule of lab/decode_fixed_cost applied to `error_classes.py run --between` records.

    python lab/decode_fixed_cost/verdict.py records/fixed_cost_h100.jsonl
    python lab/decode_fixed_cost/verdict.py --pair records/public_decode_pdl_h100.jsonl
    python lab/decode_fixed_cost/verdict.py --max-n 4096 FILE.jsonl [...]   # only cases with N <= 4096
    python lab/decode_fixed_cost/verdict.py --check-run FILE.jsonl          # a held-out check run

For each changed keyword (a candidate ``pick+KEY=VALUE[+...]``, named by what follows the pick's
label): in each class (``suite``, ``held_out``), the share of cases where it is at least 2% faster
than the pick (pick's time / its time >= 1.02), its worst slowdown (its time / the pick's), and
whether every result checked. It passes on the card when, in both classes, every candidate is
correct, three quarters or more of the cases are at least 2% faster, and none is more than 1%
slower. ``--pair``: records of one alternative beside the pick (the no-regression run): the
geomean of the alternative's time over the pick's and the pick's lowest ratio to torch (the
README's bar: at least 0.98 and 0.93). Standard library only.
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict

FASTER, SLOWER, SHARE = 1.02, 1.01, 0.75


def tally(records):
    """{change: {class: (cases, faster, worst slowdown, all correct)}} and the card."""
    acc = defaultdict(lambda: defaultdict(list))
    card = None
    for r in records:
        card = card or r.get("card")
        cands = r["candidates"]
        pick = cands[r["pick"]]
        for label, c in cands.items():
            if label == r["pick"]:
                continue
            change = label[len(r["pick"]) + 1:] if label.startswith(r["pick"] + "+") else label
            ok = bool(c.get("ok")) and bool(pick.get("ok"))
            ratio = c["ms"] / pick["ms"] if ok and c.get("ms") and pick.get("ms") else None
            acc[change][r["class"]].append((ok, ratio))
    out = {}
    for change, by_class in acc.items():
        out[change] = {}
        for cls, rows in by_class.items():
            ratios = [x for _, x in rows if x is not None]
            out[change][cls] = (len(rows), sum(1 / x >= FASTER for x in ratios),
                                max(ratios) if ratios else float("inf"), all(ok for ok, _ in rows))
    return out, card


def passes(by_class, classes=("suite", "held_out")) -> bool:
    """The rule: each of ``classes`` present and in every class all correct, >= 3/4 of the
    cases 2% faster, none 1% slower (a held-out check run: ``classes=("held_out",)``)."""
    return all(ok and n and faster >= SHARE * n and worst <= SLOWER
               for n, faster, worst, ok in by_class.values()) and set(classes) <= set(by_class)


def pair(records) -> tuple[float, float]:
    """(geomean of the alternative's time over the pick's, the pick's lowest torch time over
    its own) over records holding the pick and one alternative."""
    logs, lowest = [], float("inf")
    for r in records:
        pick = r["candidates"][r["pick"]]
        (alt,) = [c for label, c in r["candidates"].items() if label != r["pick"]]
        logs.append(math.log(alt["ms"] / pick["ms"]))
        lowest = min(lowest, r["torch_ms"] / pick["ms"])
    return math.exp(sum(logs) / len(logs)), lowest


def main(argv) -> int:
    if argv[:1] == ["--pair"]:
        gm, lowest = pair([json.loads(line) for p in argv[1:] for line in open(p) if line.strip()])
        print(f"the alternative's time over the pick's: geomean {gm:.3f}; the pick's lowest ratio "
              f"to torch {lowest:.3f}")
        return 0
    classes = ("suite", "held_out")
    if argv[:1] == ["--check-run"]:  # a held-out check run: that class alone
        classes, argv = ("held_out",), argv[1:]
    max_n = None
    if argv[:1] == ["--max-n"]:  # a rule's scope: the cases whose weight has at most N rows
        max_n, argv = int(argv[1]), argv[2:]
    records = [r for r in (json.loads(line) for p in argv for line in open(p) if line.strip())
               if max_n is None or r["N"] <= max_n]
    table, card = tally(records)
    for change, by_class in table.items():
        cells = ", ".join(f"{cls}: {faster}/{n} faster by 2%, worst {worst:.3f}x the pick's time"
                          + ("" if ok else ", NOT all correct")
                          for cls, (n, faster, worst, ok) in sorted(by_class.items(), reverse=True))
        print(f"{change:24} {cells} -> {'passes' if passes(by_class, classes) else 'does not pass'} on {card}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
