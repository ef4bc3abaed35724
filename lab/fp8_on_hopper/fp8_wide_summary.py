"""On CPU: the wide promoted tiles' A/B (v13 128 x 192 promoted every stage, 128 x 144 overlapped) summed up
per scale kind, and the study's rule applied.

Reads fp8_suite_run.py --candidates wide records and `fp8_pair_check.py --variant wide|wide144` records. The
rule is the README's "Rule (set before the run)" of the section on wide promoted tiles: a candidate (ADOPTABLE)
becomes choose_fp8's pick at M >= 2048 for a kind only if every check of it in that kind passed (within the fp8
tolerance) and over every A/B case of that kind (suite and held out, a case not timed counting against it) the
pick's time over the candidate's has a geomean of at least RULE_GEOMEAN and no case under RULE_FLOOR
(fp8_stagger_summary.meets_rule); of two that do, the faster in geomean.

  python lab/fp8_on_hopper/fp8_wide_summary.py CHECK.jsonl AB.jsonl [AB.jsonl ...] --out F.jsonl

One record per scale kind and set (kind "wide_summary"; set "all" or an A/B suite file's name): n, geomean /
min / max of ratio_to_pick of each candidate (above 1: faster than the pick), the pick's and each candidate's
geomean speed against torch._scaled_mm (block also against torch's per tensor), and the verdict (adopt: the
candidate's name or null, set "all" only).
"""
from __future__ import annotations

import sys

from fp8_stagger_summary import meets_rule  # this folder
from fp8_summaries import geomean, main as summary_main, scale_sets

# the candidates the rule may adopt (fp8_lab_variants.wide_candidates' names) and their checks' kinds
ADOPTABLE = {"serial 128x192": "wide_check", "overlapped 128x144": "wide144_check"}


def summarize(checks: list[dict], cases: list[dict]) -> list[dict]:
    """The per-kind summary records (module docstring)."""
    checked = [c for c in checks if c.get("kind") in ADOPTABLE.values()]
    out = []
    for scale, which, mine, here in scale_sets(checked, [r for r in cases if r.get("candidates")]):
        if not here:
            continue
        rec = {"kind": "wide_summary", "scale": scale, "set": which, "device": here[0]["device"],
               "n": len(here), "checks": len(mine), "checks_ok": sum(bool(c.get("ok")) for c in mine)}
        names = sorted({n for r in here for n, c in r["candidates"].items() if "ms" in c})
        for n in names:
            timed = [r for r in here if r.get("verified") and "ms" in r["candidates"].get(n, {})]
            g = [r["candidates"][n]["ratio_to_pick"] for r in timed]
            rec[f"{n}: n"], rec[f"{n}: untimed"] = len(g), len(here) - len(g)
            rec[f"{n}: geomean_ratio_to_pick"] = geomean(g)
            rec[f"{n}: min_ratio_to_pick"], rec[f"{n}: max_ratio_to_pick"] = min(g), max(g)
            for key in ("ratio_to_torch", "ratio_to_torch_tensor"):
                both = [r for r in timed if r.get(key)]
                if both:
                    rec[f"pick_geomean_{key}"] = geomean([r[key] for r in here if r.get(key)])
                    rec[f"{n}: geomean_{key}"] = geomean(
                        [r[key] * r["candidates"][n]["ratio_to_pick"] for r in both])
        if which == "all":  # of the candidates that meet the rule, the fastest (geomean)
            passing = []
            for n, kind in ADOPTABLE.items():
                mine_n = [c for c in mine if c["kind"] == kind]
                g = [r["candidates"][n]["ratio_to_pick"] for r in here
                     if r.get("verified") and "ms" in r["candidates"].get(n, {})]
                if mine_n and all(c.get("ok") for c in mine_n) and g and len(g) == len(here) \
                        and meets_rule(g):
                    passing.append((geomean(g), n))
            rec["adopt"] = max(passing)[1] if passing else None
        out.append(rec)
    return out


def main(argv=None) -> int:
    return summary_main(summarize, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
