"""On CPU: the large-M A/B of v13's promotion every second stage (overlapped, PROMOTE=8) and the scheduler's
L2 groups (4, 16) summed up per scale kind, and the study's rule applied.

Reads fp8_suite_run.py --candidates interval records and `fp8_pair_check.py --variant interval` records. The
rule is the README's "Rule (set before the run)" of the section on the promotion interval at large M: each
candidate is decided on its own, per kind. The promotion every second stage (per tensor and rowwise only) must
pass every interval check of that kind; an L2 group has no check of its own (it computes the pick's sums in
the pick's order; the A/B's agreement with the pick stands for it). Then, over every A/B case of that kind
(suite and held out, a case not timed counting against it), the pick's time over the candidate's has a
geomean of at least RULE_GEOMEAN and no case under RULE_FLOOR (fp8_stagger_summary.meets_rule). Of the two L2
groups, only the faster in geomean may be adopted.

  python lab/fp8_on_hopper/fp8_interval_summary.py CHECK.jsonl AB.jsonl [AB.jsonl ...] --out F.jsonl

One record per scale kind and set (kind "interval_summary"; set "all" or an A/B suite file's name): n, geomean /
min / max of ratio_to_pick of each candidate (above 1: faster than the pick), the pick's and each candidate's
geomean speed against torch._scaled_mm (block also against torch's per tensor), and the verdict (adopt: the
list of candidates the rule adopts, set "all" only). by_depth: the same ratios per K band, as the README
quotes them.
"""
from __future__ import annotations

import sys

from fp8_stagger_summary import meets_rule  # this folder
from fp8_lab_variants import INTERVAL  # interval_candidates' name of the candidate
from fp8_summaries import geomean, main as summary_main, scale_sets

L2_GROUPS = ("L2 group 4", "L2 group 16")
CHECK_KIND = "interval_check"


def summarize(checks: list[dict], cases: list[dict]) -> list[dict]:
    """The per-kind summary records (module docstring)."""
    checked = [c for c in checks if c.get("kind") == CHECK_KIND]
    out = []
    for scale, which, mine, here in scale_sets(checked, [r for r in cases if r.get("candidates")]):
        if not here:
            continue
        rec = {"kind": "interval_summary", "scale": scale, "set": which, "device": here[0]["device"],
               "n": len(here), "checks": len(mine), "checks_ok": sum(bool(c.get("ok")) for c in mine)}
        names = sorted({n for r in here for n in r["candidates"]})
        gains = {}
        for n in names:
            timed = [r for r in here if r.get("verified") and "ms" in r["candidates"].get(n, {})]
            g = gains[n] = [r["candidates"][n]["ratio_to_pick"] for r in timed]
            rec[f"{n}: n"], rec[f"{n}: untimed"] = len(g), len(here) - len(g)
            if not g:
                continue
            rec[f"{n}: geomean_ratio_to_pick"] = geomean(g)
            rec[f"{n}: min_ratio_to_pick"], rec[f"{n}: max_ratio_to_pick"] = min(g), max(g)
            for key in ("ratio_to_torch", "ratio_to_torch_tensor"):
                both = [r for r in timed if r.get(key)]
                if both:
                    rec[f"pick_geomean_{key}"] = geomean([r[key] for r in here if r.get(key)])
                    rec[f"{n}: geomean_{key}"] = geomean(
                        [r[key] * r["candidates"][n]["ratio_to_pick"] for r in both])
        if which == "all":
            def passes(n):
                g = gains.get(n, [])
                return bool(g) and len(g) == len(here) and meets_rule(g)
            adopt = []
            if scale != "block" and mine and all(c.get("ok") for c in mine) and passes(INTERVAL):
                adopt.append(INTERVAL)
            groups = [(geomean(gains[n]), n) for n in L2_GROUPS if passes(n)]
            if groups:
                adopt.append(max(groups)[1])
            rec["adopt"] = adopt
        out.append(rec)
    return out


# the K bands by_depth reports (the A/B's shapes: K of 512 to 3584, 4096 to 7168, 8192 to 29568)
K_BANDS = ((0, 4096, "K < 4096"), (4096, 8192, "4096 <= K < 8192"), (8192, None, "K >= 8192"))


def by_depth(cases: list[dict], scale: str, name: str) -> str:
    """One candidate's speed over the pick's in one scale kind, per K band of the timed A/B cases:
    "K < 4096: 0.888 (0.793 to 0.995, 2 cases); ..." (geomean, min and max of ratio_to_pick; the
    README quotes it, tests/test_fp8.py computes it from the records)."""
    parts = []
    for lo, hi, label in K_BANDS:
        g = [r["candidates"][name]["ratio_to_pick"] for r in cases
             if r.get("kind") == "fp8_case" and r.get("verified") and r["suite"]["scale"] == scale
             and lo <= r["K"] and (hi is None or r["K"] < hi) and "ms" in r.get("candidates", {}).get(name, {})]
        if g:
            parts.append(f"{label}: {geomean(g):.3f} ({min(g):.3f} to {max(g):.3f}, {len(g)} cases)")
    return "; ".join(parts)


def main(argv=None) -> int:
    return summary_main(summarize, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
