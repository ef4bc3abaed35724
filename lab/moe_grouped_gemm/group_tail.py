"""The rule for GROUP 16 with TAIL_SPLIT 4 on v14's 128x256 pick, applied to bench_grouped.py records
(standard library; the rule is set in lab/moe_grouped_gemm/README.md, "GROUP 16 with the last wave cut").

    python lab/moe_grouped_gemm/group_tail.py records/group_tail_h100_bfloat16.jsonl

Every case of suites/group_tail.json must be in the records (else: undecided). The candidate passes
if every result of it is within TOL of the loop's, at Mixtral-8x7B down at 4096 tokens the pick's
time over its time is at least GAP_GAIN and the loop's over its at least GAP_LOOP, no case has the
pick's time over its under WORST, and over the held-out cases (every model but Mixtral-8x7B) the
geomean of the pick's time over its is at least HELDOUT_GEOMEAN.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "suites" / "group_tail.json"
CANDIDATE = "variant:pick group 16 tail split 4"
SUITE_MODEL = "Mixtral-8x7B"
GAP = ("Mixtral-8x7B", 4096, 4096)  # model, N, tokens: the down projection behind the loop
TOL, GAP_GAIN, GAP_LOOP, WORST, HELDOUT_GEOMEAN = 1e-2, 1.05, 1.00, 0.98, 1.00


def cases(suite=SUITE):
    """(model, N, tokens) of every case the rule needs, in the suite's order."""
    return [(s["model"], s["N"], t) for s in json.loads(Path(suite).read_text())["shapes"]
            for t in s["tokens"]]


def table(records):
    """{(model, N, tokens): (pick us, candidate us, loop us, candidate's error)}, the last
    record of a case winning."""
    out = {}
    for r in records:
        t, err = r.get("t_us") or {}, r.get("check_rel_err") or {}
        if t.get("tirx") and t.get(CANDIDATE) and t.get("loop"):
            out[(r["model"], r["N"], r["tokens"])] = (t["tirx"], t[CANDIDATE], t["loop"],
                                                      err.get(CANDIDATE, math.inf))
    return out


def verdict(records, suite=SUITE) -> tuple[str, list[str]]:
    """("passes" | "does not pass" | "undecided", the reasons)."""
    tab, need = table(records), cases(suite)
    missing = [c for c in need if c not in tab]
    if missing:
        return "undecided", [f"not timed: {m} N={n} tokens={t}" for m, n, t in missing]
    why = []
    for c in need:
        p, v, _, err = tab[c]
        if err > TOL:
            why.append(f"{c}: candidate's result {err:.3g} from the loop's (over {TOL})")
        if p / v < WORST:
            why.append(f"{c}: pick's time over the candidate's {p / v:.3f} (under {WORST})")
    p, v, loop, _ = tab[GAP]
    if p / v < GAP_GAIN:
        why.append(f"{GAP}: pick's time over the candidate's {p / v:.3f} (under {GAP_GAIN})")
    if loop / v < GAP_LOOP:
        why.append(f"{GAP}: loop's time over the candidate's {loop / v:.3f} (under {GAP_LOOP})")
    held = [tab[c][0] / tab[c][1] for c in need if c[0] != SUITE_MODEL]
    gm = math.exp(sum(map(math.log, held)) / len(held))
    if gm < HELDOUT_GEOMEAN:
        why.append(f"held-out geomean of the pick's time over the candidate's {gm:.3f} "
                   f"(under {HELDOUT_GEOMEAN})")
    return ("does not pass" if why else "passes"), why


def main(argv) -> int:
    records = [json.loads(x) for p in argv for x in open(p) if x.strip()]
    tab = table(records)
    for (model, n, t), (p, v, loop, err) in tab.items():
        print(f"{model:18} N={n:6d} T={t:6d}: pick {p:9.1f} us, candidate {v:9.1f} us, "
              f"loop {loop:9.1f} us; pick/candidate {p / v:.3f}, loop/candidate {loop / v:.3f}, "
              f"error {err:.4f}")
    result, why = verdict(records)
    print(f"-> {result}" + "".join(f"\n   {w}" for w in why))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
