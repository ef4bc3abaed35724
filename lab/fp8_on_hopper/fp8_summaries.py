"""What the A/B summaries of this study share (fp8_pair_summary.py, fp8_stagger_summary.py,
fp8_wide_summary.py): reading the records, the walk over scale kinds and sets, the geomeans
against torch, and the command line (CHECK.jsonl AB.jsonl [AB.jsonl ...] --out F.jsonl).
"""
from __future__ import annotations

import argparse
import json
import math
import os

SCALES = ("tensor", "row", "block")


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def load(path, missing_ok: bool = True) -> list[dict]:
    """The records of a JSON-lines file; none for a file a run cut short never wrote (where
    ``missing_ok``; else the open's error)."""
    if missing_ok and not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def suite_file(r: dict) -> str:
    return r["suite"].get("file", r["suite"]["name"])


def scale_sets(checks: list[dict], cases: list[dict]):
    """(scale, set, the checks of that scale kind, its fp8_case records in that set) for each
    scale kind, set "all" first, then each A/B suite file's name."""
    for scale in SCALES:
        mine = [c for c in checks if c["scale"] == scale]
        run = [r for r in cases if r.get("kind") == "fp8_case" and r["suite"]["scale"] == scale]
        for which in ["all"] + sorted({suite_file(r) for r in run}):
            yield scale, which, mine, [r for r in run if which in ("all", suite_file(r))]


def torch_geomeans(rows: list[dict], name: str, gain) -> dict:
    """The pick's and the candidate's (``name``; its time is the pick's over ``gain(r)``)
    geomean speed against torch._scaled_mm over the rows that have it (block also against
    torch's per tensor)."""
    rec = {}
    for key in ("ratio_to_torch", "ratio_to_torch_tensor"):
        both = [r for r in rows if r.get(key)]
        if both:
            rec[f"pick_geomean_{key}"] = geomean([r[key] for r in both])
            rec[f"{name}_geomean_{key}"] = geomean([r[key] * gain(r) for r in both])
    return rec


def main(summarize, description: str, argv=None, *, mode: str = "a",
         missing_ok: bool = True) -> int:
    """Reads CHECK and the AB files (:func:`load` with ``missing_ok``), writes
    ``summarize(checks, cases)``'s records to --out (opened with ``mode``) and prints them."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("check")
    ap.add_argument("ab", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    checks = load(a.check, missing_ok)
    cases = [r for p in a.ab for r in load(p, missing_ok)]
    recs = summarize(checks, cases)
    with open(a.out, mode, encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, sort_keys=True) + "\n")
            print(json.dumps(r, sort_keys=True))
    return 0
