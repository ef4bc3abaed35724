"""Fit fp8's small-M tile rule and its K-split rule to the study's records (CPU).

For every small-M case of a tile-candidate record file (fp8_suite_run.py --candidates tiles) the
time of each BLK_M 64 width is known (the pick's and the candidates'); for each
TILE_COST_COLUMNS in --costs, op/fp8.small_m_width's pick is looked up and its time compared with
the fastest width's: the geomean and worst of (fastest time / rule's time) over the cases, and how
many cases the rule picks the fastest width. For a split record file (--candidates split), per case
the pick's time against each SPLIT_K's, with the tiles the pick makes.

  python lab/fp8_on_hopper/fp8_fit_rule.py --tiles records/A.jsonl [--split records/B.jsonl]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tirx_gemm.op import fp8  # noqa: E402


def _records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()
            and json.loads(line).get("kind") == "fp8_case"]


def width_times(rec) -> dict:
    """{(BLK_M, BLK_N): ms} of a case: its pick and every candidate that ran."""
    out = {(rec["build_kwargs"]["BLK_M"], rec["build_kwargs"]["BLK_N"]): rec["median_ms"]}
    for c in (rec.get("candidates") or {}).values():
        if "ms" in c and c["kwargs"].get("PROMOTE_OVERLAP") is not False:
            out[(c["kwargs"]["BLK_M"], c["kwargs"]["BLK_N"])] = c["ms"]
    return out


def fit_width(recs, costs, sms: int):
    small = [r for r in recs if r["M"] <= fp8.SMALL_M]
    for cost in costs:
        saved = fp8.TILE_COST_COLUMNS
        fp8.TILE_COST_COLUMNS = cost
        try:
            ratios, hits = [], 0
            for r in small:
                t = {w: ms for (bm, w), ms in width_times(r).items() if bm == 64}
                w = fp8.small_m_width(r["M"], r["N"], sms)
                if w not in t:
                    continue
                best = min(t.values())
                ratios.append(best / t[w])
                hits += t[w] == best
        finally:
            fp8.TILE_COST_COLUMNS = saved
        if ratios:
            g = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"TILE_COST_COLUMNS={cost:3d}: rule's time / fastest width: geomean "
                  f"{1 / g:.3f}, worst {1 / min(ratios):.3f}; fastest picked {hits}/{len(ratios)}")
    for r in small:
        t = {w: ms for (bm, w), ms in width_times(r).items()}
        best = min(t, key=t.get)
        print(f"  {r['M']}x{r['N']}x{r['K']} {r['suite']['scale']:6s} fastest {best[0]}x{best[1]} "
              + " ".join(f"{bm}x{w}:{ms * 1e3:.1f}us" for (bm, w), ms in sorted(t.items())))


def show_split(recs, sms: int):
    for r in recs:
        kw = r["build_kwargs"]
        tiles = math.ceil(r["M"] / kw["BLK_M"]) * math.ceil(r["N"] / kw["BLK_N"])
        parts = [f"pick {r['median_ms'] * 1e3:.1f}us ({tiles} tiles)"]
        for c in (r.get("candidates") or {}).values():
            if "ms" in c:
                parts.append(f"S={c['kwargs']['SPLIT_K']}: x{c['ratio_to_pick']:.2f}")
            else:
                parts.append(f"S={c['kwargs']['SPLIT_K']}: {c.get('error')}")
        print(f"  {r['M']}x{r['N']}x{r['K']} {r['suite']['scale']:6s} " + ", ".join(parts)
              + f"; torch x{r.get('ratio_to_torch', float('nan')):.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles")
    ap.add_argument("--split")
    ap.add_argument("--costs", default="0,8,16,24,32,48,64")
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args(argv)
    if a.tiles:
        fit_width(_records(a.tiles), [int(c) for c in a.costs.split(",")], a.sms)
    if a.split:
        show_split(_records(a.split), a.sms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
