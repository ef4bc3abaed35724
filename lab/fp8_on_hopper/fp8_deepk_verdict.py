"""On CPU: the verdict on v13's promotion every second stage (PROMOTE=8, overlapped) bounded to deep K, by the rule the
README set before its run (section "Promotion every second stage at deep K only").

Reads one records file of one run: `fp8_pair_check.py --variant interval --suite SUITE` records (kind "interval_check":
the edge shapes, then each case of the suite) and `fp8_suite_run.py SUITE --candidates interval` records (kind
"fp8_case"), SUITE being suites/fp8_deepk_heldout.json. The rule:

- one run on one card: every record names the same device, and no check or case is recorded twice;
- every result within the fp8 tolerance the earlier run used (fp8_bench.check: numerics.fp8_tolerances at each
  build's PROMOTE): every interval check of the file passes (pick and candidate), the edge shapes' checks
  (fp8_pair_check.STAGGER_SHAPES, per tensor and rowwise) and a check at every held-out case at K >= BOUND_K are
  there, every A/B case of the file is verified (the pick), and at every case of the suite that was timed (the
  controls too) the candidate agreed with the pick (fp8_bench.CANDIDATE_AGREE) and was timed;
- over the held-out cases at K >= BOUND_K (a case not timed counts against it), the pick's time over the candidate's
  (ratio_to_pick) has a geomean of at least RULE_GEOMEAN["tensor"] per tensor and RULE_GEOMEAN["row"] rowwise, and
  no such case of either kind is under RULE_FLOOR.

The controls (the suite's cases at K < BOUND_K) are reported and decide nothing.

  python lab/fp8_on_hopper/fp8_deepk_verdict.py F.jsonl [--suite SUITE] [--out V.jsonl]

Prints "passes" or "does not pass" with the figures (exit status 0 either way; 2 if the file cannot be read);
--out appends the verdict as one record (kind "deepk_verdict").
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "suites" / "fp8_deepk_heldout.json"
BOUND_K = 8192                             # read off the earlier run's records: K >= 8192 gained 1.085 per tensor
RULE_GEOMEAN = {"tensor": 1.03, "row": 1.0}
RULE_FLOOR = 0.98
CHECK_KIND = "interval_check"
sys.path.insert(0, str(HERE))
# the earlier run's interval check shapes, each per tensor and rowwise
from fp8_pair_check import STAGGER_SHAPES as EDGE_SHAPES  # noqa: E402
# the candidate's name in the records (fp8_lab_variants.interval_candidates); where the pick is
# already PROMOTE=8 (K >= 8192 since the rule was adopted) the PROMOTE=4 build is timed beside
# it under FORMER, and the gain is the inverse of its ratio_to_pick
from fp8_lab_variants import EVERY_STAGE as FORMER, INTERVAL as CANDIDATE  # noqa: E402
KINDS = ("tensor", "row")


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def suite_cases(path=SUITE) -> list[tuple[int, int, int, str]]:
    """(M, N, K, scale kind) of every fp8 case of the suite, in its order (an entry's own
    "scales", else the suite's)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    top = data.get("scales", ["tensor", "row", "block"])
    return [(e["M"], e["N"], e["K"], s) for e in data["shapes"] for s in e.get("scales", top)]


def load(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _label(key) -> str:
    M, N, K, s = key
    return f"{M}x{N}x{K} {s}"


def verdict(records: list[dict], suite=SUITE) -> dict:
    """The rule (module docstring) applied to one run's records. Returns {"passes": bool, "reasons": [why it does
    not pass], "device", per kind {"n", "geomean", "min", "max", "worst"} of the deciding cases (K >= BOUND_K),
    "controls" (the same over K < BOUND_K, every kind together), "cases" {label: ratio_to_pick or None}, "checks",
    "checks_ok"}."""
    reasons: list[str] = []
    cases = suite_cases(suite)
    deep = [c for c in cases if c[2] >= BOUND_K and c[3] in KINDS]
    controls = [c for c in cases if c[2] < BOUND_K and c[3] in KINDS]
    checks = [r for r in records if r.get("kind") == CHECK_KIND]
    ab = [r for r in records if r.get("kind") == "fp8_case"]
    not_run = [r for r in records if r.get("kind") == "not_run"]

    devices = sorted({r["device"] for r in checks + ab if r.get("device")})
    if len(devices) != 1:
        reasons.append(f"not one card: devices {devices or 'none'}")

    def key_of(r, scale_key):
        return (r["M"], r["N"], r["K"], scale_key(r))

    by_check: dict = {}
    for r in checks:
        by_check.setdefault(key_of(r, lambda r: r["scale"]) + (bool(r.get("suite")),), []).append(r)
    by_case: dict = {}
    for r in ab:
        by_case.setdefault(key_of(r, lambda r: r["suite"]["scale"]), []).append(r)
    twice = [_label(k[:4]) for k, v in {**by_check, **by_case}.items() if len(v) > 1]
    if twice:
        reasons.append(f"not one run: recorded more than once: {', '.join(sorted(set(twice)))}")

    bad_checks = [_label(key_of(r, lambda r: r["scale"])) for r in checks if not r.get("ok")]
    if bad_checks:
        reasons.append(f"checks outside the fp8 tolerance or not run: {', '.join(bad_checks)}")
    edge_missing = [_label((M, N, K, s)) for M, N, K in EDGE_SHAPES for s in KINDS
                    if (M, N, K, s, False) not in by_check]
    if edge_missing:
        reasons.append(f"edge checks missing: {', '.join(edge_missing)}")
    deep_unchecked = [_label(c) for c in deep if c + (True,) not in by_check]
    if deep_unchecked:
        reasons.append(f"held-out cases not checked: {', '.join(deep_unchecked)}")
    unverified = [_label(k) for k, v in by_case.items() if not all(r.get("verified") for r in v)]
    if unverified:
        reasons.append(f"A/B picks outside the fp8 tolerance: {', '.join(unverified)}")
    off = [_label(k) for k in deep + controls for r in by_case.get(k, ())
           if "ms" not in r.get("candidates", {}).get(CANDIDATE, {})
           and "ms" not in r.get("candidates", {}).get(FORMER, {})]
    if off:
        reasons.append(f"candidate not timed (disagrees with the pick, or failed): {', '.join(off)}")

    def ratio(c):
        v = by_case.get(c)
        if not v or not v[0].get("verified"):
            return None
        cands = v[0].get("candidates", {})
        if CANDIDATE in cands:
            return cands[CANDIDATE].get("ratio_to_pick")
        r = cands.get(FORMER, {}).get("ratio_to_pick")
        return None if not r else 1.0 / r

    out = {"kind": "deepk_verdict", "device": devices[0] if len(devices) == 1 else devices,
           "bound_k": BOUND_K, "rule_geomean": RULE_GEOMEAN, "rule_floor": RULE_FLOOR,
           "checks": len(checks), "checks_ok": sum(bool(r.get("ok")) for r in checks),
           "cases": {_label(c): ratio(c) for c in deep}, "not_run": [r.get("case") for r in not_run]}
    untimed = [_label(c) for c in deep if ratio(c) is None]
    if untimed:
        reasons.append(f"held-out cases not timed: {', '.join(untimed)}")
    for kind in KINDS:
        mine = [c for c in deep if c[3] == kind]
        g = [ratio(c) for c in mine if ratio(c) is not None]
        fig = {"n": len(mine), "timed": len(g)}
        if g:
            worst = min((ratio(c), _label(c)) for c in mine if ratio(c) is not None)
            fig.update({"geomean": geomean(g), "min": min(g), "max": max(g), "worst": worst[1]})
            if fig["geomean"] < RULE_GEOMEAN[kind]:
                reasons.append(f"{kind}: geomean {fig['geomean']:.3f} < {RULE_GEOMEAN[kind]}")
            under = [f"{_label(c)} {ratio(c):.3f}" for c in mine
                     if ratio(c) is not None and ratio(c) < RULE_FLOOR]
            if under:
                reasons.append(f"{kind}: under {RULE_FLOOR}: {', '.join(under)}")
        elif mine:
            reasons.append(f"{kind}: no held-out case timed")
        out[kind] = fig
    g = [ratio(c) for c in controls if ratio(c) is not None]
    out["controls"] = {"n": len(controls), "timed": len(g),
                       **({"geomean": geomean(g), "min": min(g), "max": max(g)} if g else {}),
                       "cases": {_label(c): ratio(c) for c in controls}}
    out["passes"] = not reasons
    out["reasons"] = reasons
    return out


def verdict_file(path, suite=SUITE) -> dict:
    """:func:`verdict` of the records in ``path``."""
    return verdict(load(path), suite)


def report(v: dict) -> str:
    """The verdict as the lines main prints: "passes" or "does not pass", then the figures."""
    lines = ["passes" if v["passes"] else "does not pass"]
    lines.append(f"device {v['device']}; checks {v['checks_ok']} of {v['checks']} within the fp8 tolerance")
    for kind in KINDS:
        f = v.get(kind, {})
        if f.get("timed"):
            lines.append(f"{kind} (K >= {BOUND_K}, {f['timed']} of {f['n']} cases): geomean {f['geomean']:.3f} "
                         f"(rule >= {RULE_GEOMEAN[kind]}), {f['min']:.3f} to {f['max']:.3f} (floor {RULE_FLOOR}; "
                         f"worst {f['worst']})")
        else:
            lines.append(f"{kind} (K >= {BOUND_K}): {f.get('n', 0)} cases, none timed")
    for label, r in v["cases"].items():
        lines.append(f"  {label}: {'not timed' if r is None else f'{r:.3f}'}")
    c = v["controls"]
    if c.get("timed"):
        lines.append(f"controls (K < {BOUND_K}, information only, {c['timed']} of {c['n']}): geomean "
                     f"{c['geomean']:.3f}, {c['min']:.3f} to {c['max']:.3f}")
    lines += [f"why: {r}" for r in v["reasons"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records")
    ap.add_argument("--suite", default=str(SUITE))
    ap.add_argument("--out", default=None, help="append the verdict record here")
    a = ap.parse_args(argv)
    try:
        v = verdict_file(a.records, a.suite)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {a.records}: {exc}", file=sys.stderr)
        return 2
    print(report(v))
    if a.out:
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(v, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
