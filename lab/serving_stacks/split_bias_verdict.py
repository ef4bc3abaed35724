"""The rule of lab/serving_stacks' "A bias on the decode K split" applied to decode_linears.py records
(``--between --rotate --bias-tile``, the bias layers of suites/decode_split_bias.json).

    python lab/serving_stacks/split_bias_verdict.py records/split_bias_h100.jsonl
    python lab/serving_stacks/split_bias_verdict.py --min-k 3072 FILE.jsonl [...]   # only cases with K >= 3072
    python lab/serving_stacks/split_bias_verdict.py --check-run FILE.jsonl          # a held-out check run

Per record with a bias, the non-swap bias tile timed and matmul's pick a K split (its ``explain`` line
says SPLIT_K > 1; the rule's scope, with ``--min-k``: K at least that): gain = the bias tile's time / matmul's (the
split with the bias; > 1: the split faster) and over the split then an add (``tirx+add``). Class
``suite``: the Qwen2.5-7B-sized k/v projections (the layer that lost); ``held_out``: the other sizes.
The rule passes when every record is correct (max_abs_err at most MAX_ERR) and, in both classes, the
geomean gain over the bias tile is at least GAIN with no case under WORST, and the geomean over the
split then an add at least 1. Standard library only.
"""
from __future__ import annotations

import json
import math
import sys

GAIN, WORST, MAX_ERR = 1.05, 0.98, 0.0625  # MAX_ERR: two bf16 steps at outputs of 4-8
SUITE_MODELS = ("qwen7b",)


def geomean(xs) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def split_pick(r: dict) -> bool:
    """Whether matmul's pick of the record is a K split (SPLIT_K=S, S > 1, in its explain line)."""
    words = [w for w in r.get("explain", "").split() if w.startswith("SPLIT_K=")]
    return bool(words) and int(words[0][len("SPLIT_K="):]) > 1


def tally(records) -> dict:
    """{class: {"tile": [gains], "add": [gains], "ok": bool, "cases": [...]}}."""
    out: dict = {}
    for r in records:
        us = r.get("us") or {}
        if not r.get("bias") or "tirx bias tile" not in us or not split_pick(r):
            continue
        c = out.setdefault("suite" if r["model"] in SUITE_MODELS else "held_out",
                           {"tile": [], "add": [], "ok": True, "cases": []})
        g_tile, g_add = us["tirx bias tile"] / us["tirx"], us["tirx+add"] / us["tirx"]
        c["tile"].append(g_tile)
        c["add"].append(g_add)
        c["ok"] &= r.get("max_abs_err", float("inf")) <= MAX_ERR
        c["cases"].append(f"{r['model']} {r['layer']} M={r['M']}: {g_tile:.3f} / {g_add:.3f}")
    return out


def passes(t: dict, classes=("suite", "held_out")) -> bool:
    """The bar in every class, each of ``classes`` present (a held-out check run:
    ``classes=("held_out",)``)."""
    return set(classes) <= set(t) and all(
        c["ok"] and geomean(c["tile"]) >= GAIN and min(c["tile"]) >= WORST and geomean(c["add"]) >= 1
        for c in t.values())


def main(argv) -> int:
    classes = ("suite", "held_out")
    if argv[:1] == ["--check-run"]:  # a held-out check run: that class alone
        classes, argv = ("held_out",), argv[1:]
    min_k = None
    if argv[:1] == ["--min-k"]:
        min_k, argv = int(argv[1]), argv[2:]
    records = [r for r in (json.loads(line) for p in argv for line in open(p) if line.strip())
               if min_k is None or r["K"] >= min_k]
    t = tally(records)
    card = next((r.get("card") for r in records), None)
    for cls, c in sorted(t.items(), reverse=True):
        print(f"{cls}: {len(c['tile'])} cases, over the bias tile geomean {geomean(c['tile']):.3f} "
              f"(worst {min(c['tile']):.3f}), over split+add {geomean(c['add']):.3f}, "
              f"{'all correct' if c['ok'] else 'NOT all correct'}")
        for line in c["cases"]:
            print(f"  {line}")
    print(f"rule split_bias {'passes' if passes(t, classes) else 'does not pass'} on {card}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
