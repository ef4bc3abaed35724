"""On CPU: the CTA pair's A/B summed up per scale kind, and the study's rule applied.

Reads fp8_suite_run.py --candidates cluster records and fp8_pair_check.py records. The rule is the
README's "Rule (set before the run)": the pair is adopted for a kind only if every pair check passed
and it ran at least RULE_GAIN x the pick's speed at every A/B case of that kind (a case the pair was
not timed at, or whose pick failed its check, counts against it).

  python lab/fp8_on_hopper/fp8_pair_summary.py CHECK.jsonl AB.jsonl [AB.jsonl ...] --out F.jsonl

One record per scale kind and set (kind "pair_summary"; set "all" or an A/B suite file's name): n,
geomean / min / max of the pick's time over the pair's (ratio_to_pick), the pick's and the pair's
geomean speed against torch._scaled_mm with the same scale kind (block also against torch's per
tensor), the pick's and the pair's TFLOP/s at the largest case, and the rule's verdict (adopt).
"""
from __future__ import annotations

import sys

from fp8_summaries import geomean, main as summary_main, scale_sets, torch_geomeans  # this folder

RULE_GAIN = 1.02  # at least 2% faster than the pick at every case (the README's rule)


def summarize(checks: list[dict], cases: list[dict]) -> list[dict]:
    """The per-kind summary records (module docstring)."""
    checked = [c for c in checks if c.get("kind") == "pair_check"]
    out = []
    for scale, which, mine, here in scale_sets(checked, cases):
        rows = [r for r in here if r.get("verified")
                and "ms" in r.get("candidates", {}).get("pair", {})]
        if rows:  # a case whose pick failed its check or whose pair was not timed: untimed
            out.append({**_summary(scale, which, rows, mine), "untimed": len(here) - len(rows)})
            out[-1]["adopt"] = out[-1]["adopt"] and out[-1]["untimed"] == 0
    return out


def _summary(scale: str, which: str, rows: list[dict], mine: list[dict]) -> dict:
    gain = [r["candidates"]["pair"]["ratio_to_pick"] for r in rows]
    big = max(rows, key=lambda r: r["M"] * r["N"] * r["K"])
    rec = {"kind": "pair_summary", "scale": scale, "set": which, "device": rows[0]["device"],
           "n": len(rows),
           "checks": len(mine), "checks_ok": sum(bool(c.get("ok")) for c in mine),
           "checks_equal": sum(bool(c.get("pair_equals_pick")) for c in mine),
           "geomean_ratio_to_pick": geomean(gain), "min_ratio_to_pick": min(gain),
           "max_ratio_to_pick": max(gain),
           "cases_at_rule_gain": sum(g >= RULE_GAIN for g in gain),
           "largest": f"{big['M']}x{big['N']}x{big['K']}",
           "largest_pick_tflops": big["tflops"],
           "largest_pair_tflops": big["tflops"] * big["candidates"]["pair"]["ratio_to_pick"]}
    rec.update(torch_geomeans(rows, "pair", lambda r: r["candidates"]["pair"]["ratio_to_pick"]))
    rec["adopt"] = bool(mine) and rec["checks_ok"] == len(mine) \
        and rec["cases_at_rule_gain"] == len(rows)
    return rec


def main(argv=None) -> int:
    return summary_main(summarize, __doc__.splitlines()[0], argv, mode="w", missing_ok=False)


if __name__ == "__main__":
    sys.exit(main())
