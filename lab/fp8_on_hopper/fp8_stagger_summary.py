"""On CPU: the staggered pick's A/B (v13 STAGGER) and the promotion's isolating variants summed up per scale
kind, and the study's rule applied.

Reads fp8_suite_run.py --candidates promotion records and `fp8_pair_check.py --variant stagger` records.
The rule is the README's "Rule (set before the run)" of the section on the staggered consumers: STAGGER
becomes choose_fp8's default for a kind's 128 x 128 pick at M > 128 only if every stagger check passed
(within the fp8 tolerance and equal to the pick), and over every A/B case of that kind (suite and held out,
a case not timed counting against it) the pick's time over the staggered one's has a geomean of at least
RULE_GEOMEAN and no case under RULE_FLOOR.

  python lab/fp8_on_hopper/fp8_stagger_summary.py CHECK.jsonl AB.jsonl [AB.jsonl ...] --out F.jsonl

One record per scale kind and set (kind "stagger_summary"; set "all" or an A/B suite file's name): n,
geomean / min / max of ratio_to_pick of each candidate (above 1: faster than the pick), the pick's and the
staggered pick's geomean speed against torch._scaled_mm (block also against torch's per tensor), TFLOP/s at
the largest case, and the verdict (adopt, set "all" only).
"""
from __future__ import annotations

import sys

from fp8_summaries import geomean, main as summary_main, scale_sets, torch_geomeans  # this folder

RULE_GEOMEAN = 1.03  # at least 3% faster in geomean over a kind's A/B cases ...
RULE_FLOOR = 0.98    # ... and no case more than 2% slower (the README's rule)
CANDIDATE = "stagger"


def meets_rule(gains: list[float]) -> bool:
    """The rule's speed terms over a kind's cases (each the pick's time over the candidate's):
    a geomean of at least RULE_GEOMEAN and none under RULE_FLOOR."""
    return geomean(gains) >= RULE_GEOMEAN and min(gains) >= RULE_FLOOR


def summarize(checks: list[dict], cases: list[dict]) -> list[dict]:
    """The per-kind summary records (module docstring)."""
    checked = [c for c in checks if c.get("kind") == "stagger_check"]
    out = []
    for scale, which, mine, here in scale_sets(checked, [r for r in cases if r.get("candidates")]):
        rows = [r for r in here if r.get("verified") and "ms" in r["candidates"].get(CANDIDATE, {})]
        if not rows:
            continue
        rec = {"kind": "stagger_summary", "scale": scale, "set": which, "device": rows[0]["device"],
               "n": len(rows), "untimed": len(here) - len(rows), "checks": len(mine),
               "checks_ok": sum(bool(c.get("ok")) for c in mine),
               "checks_equal": sum(bool(c.get("stagger_equals_pick")) for c in mine)}
        names = sorted({n for r in here for n, c in r["candidates"].items() if "ms" in c})
        for n in names:
            g = [r["candidates"][n]["ratio_to_pick"] for r in here if "ms" in r["candidates"].get(n, {})]
            rec[f"{n}: geomean_ratio_to_pick"] = geomean(g)
            rec[f"{n}: min_ratio_to_pick"], rec[f"{n}: max_ratio_to_pick"] = min(g), max(g)
        big = max(rows, key=lambda r: r["M"] * r["N"] * r["K"])
        gain = lambda r: r["candidates"][CANDIDATE]["ratio_to_pick"]  # noqa: E731
        rec.update({"largest": f"{big['M']}x{big['N']}x{big['K']}", "largest_pick_tflops": big["tflops"],
                    "largest_stagger_tflops": big["tflops"] * gain(big),
                    "largest_torch_tflops": big.get("torch_tflops")})
        rec.update(torch_geomeans(rows, "stagger", gain))
        if which == "all":
            g = [gain(r) for r in rows]
            rec["adopt"] = bool(mine) and rec["checks_ok"] == len(mine) \
                and rec["checks_equal"] == len(mine) and rec["untimed"] == 0 and meets_rule(g)
        out.append(rec)
    return out


def main(argv=None) -> int:
    return summary_main(summarize, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
