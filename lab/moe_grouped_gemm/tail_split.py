"""The adoption rule of v14's TAIL_SPLIT, applied to bench_grouped.py records (standard library).

    python lab/moe_grouped_gemm/tail_split.py records/tail_split_rule_h100_bfloat16.jsonl
    python lab/moe_grouped_gemm/tail_split.py --heldout records/tail_split_heldout_h100_bfloat16.jsonl
    python lab/moe_grouped_gemm/tail_split.py --deep-k records/tail_split_deep_k_CARD_bfloat16.jsonl

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

``--deep-k`` (the cut bounded to deep K, set before its run; README "The cut at deep K only"):
TAIL_SPLIT=4 goes into choose_grouped for plain 16-bit 128x256 contiguous tiles only where
K >= 8192 if, in one run of suites/tail_split_deep_k.json with --routing-seed 400 (every case
of the suite recorded), every result of the variant is within 1e-2 of the loop's, the geomean
of the pick's time over the variant's at the cases where the cut engages (each record's
``tail_split_engaged`` true in every routing) is at least 1.02, and no case, the controls
included, has the pick's time over the variant's under 0.98. :func:`deep_k` applies it.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

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


DEEP_K_SUITE = Path(__file__).resolve().parent / "suites" / "tail_split_deep_k.json"
DEEP_K_SEED, DEEP_K_MIN = 400, 8192
DEEP_K_GEOMEAN, DEEP_K_WORST = 1.02, 0.98  # pick's time over the variant's: geomean at the cut cases, floor


def deep_k_cases(suite=DEEP_K_SUITE):
    """(model, N, K, tokens) of every case of the deep-K suite, in its order."""
    return [(s["model"], s["N"], s["K"], t) for s in json.loads(Path(suite).read_text())["shapes"]
            for t in s["tokens"]]


def deep_k_table(records, seed=DEEP_K_SEED):
    """{(model, N, K, tokens): (pick us, variant us, variant's error, engaged per routing)} of the
    records of routing ``seed`` with the pick and the variant both timed; the last record of a
    case wins."""
    out = {}
    for r in records:
        t, err = r.get("t_us") or {}, r.get("check_rel_err") or {}
        if (r.get("routing") or {}).get("seed", 0) != seed or not t.get("tirx") or not t.get(VARIANT):
            continue
        out[(r["model"], r["N"], r["K"], r["tokens"])] = (
            t["tirx"], t[VARIANT], err.get(VARIANT, math.inf),
            list((r.get("tail_split_engaged") or {}).get(VARIANT, [])))
    return out


def deep_k(records, suite=DEEP_K_SUITE) -> tuple[str, dict, list[str]]:
    """The deep-K rule over bench_grouped.py records: ("passes" | "does not pass" | "undecided",
    the figures, the reasons). Undecided while a case of the suite is not in the records (with
    --routing-seed 400). Figures: cut (the cases where the cut engaged in every routing),
    geomean (the pick's time over the variant's there), worst (its least value over every case)
    and worst_case, max_err (the variant's largest error against the loop), cases."""
    tab, need = deep_k_table(records), deep_k_cases(suite)
    missing = [c for c in need if c not in tab]
    if missing:
        return "undecided", {"cases": len(need) - len(missing)}, [
            f"not timed with routing seed {DEEP_K_SEED}: {m} N={n} K={k} tokens={t}" for m, n, k, t in missing]
    why = [f"{c}: K under {DEEP_K_MIN}" for c in need if c[2] < DEEP_K_MIN]
    for c in need:
        p, v, err, _ = tab[c]
        if not err <= TOL:
            why.append(f"{c}: the variant's result {err:.3g} from the loop's (over {TOL})")
        if p / v < DEEP_K_WORST:
            why.append(f"{c}: the pick's time over the variant's {p / v:.3f} (under {DEEP_K_WORST})")
    cut = [c for c in need if tab[c][3] and all(tab[c][3])]
    gm = math.exp(sum(math.log(tab[c][0] / tab[c][1]) for c in cut) / len(cut)) if cut else 0.0
    if gm < DEEP_K_GEOMEAN:
        why.append(f"geomean of the pick's time over the variant's at the {len(cut)} cut cases {gm:.3f} "
                   f"(under {DEEP_K_GEOMEAN})")
    worst_case = min(need, key=lambda c: tab[c][0] / tab[c][1])
    figures = {"cases": len(need), "cut": len(cut), "geomean": gm,
               "worst": tab[worst_case][0] / tab[worst_case][1], "worst_case": worst_case,
               "max_err": max(tab[c][2] for c in need)}
    return ("does not pass" if why else "passes"), figures, why


def main(argv) -> int:
    if argv[:1] == ["--deep-k"]:
        records = [json.loads(x) for p in argv[1:] for x in open(p) if x.strip()]
        tab = deep_k_table(records)
        for (model, n, k, t), (p, v, err, eng) in tab.items():
            print(f"{model:14} N={n:5d} K={k:5d} T={t:5d}: pick {p:9.1f} us, split {v:9.1f} us, "
                  f"gain {p / v:.3f}, error {err:.4f}, cut in {sum(eng)} of {len(eng)} routings")
        result, fig, why = deep_k(records)
        if "geomean" in fig:
            print(f"{fig['cut']} cut cases of {fig['cases']}: geomean gain {fig['geomean']:.3f} (at least "
                  f"{DEEP_K_GEOMEAN}); least gain {fig['worst']:.3f} at {fig['worst_case']} (none under "
                  f"{DEEP_K_WORST}); largest error {fig['max_err']:.4f} (at most {TOL})")
        print(f"-> {result}" + "".join(f"\n   {w}" for w in why))
        return 0
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
