"""The A/B runs of CTA clusters on each card, summarised from their records: per case, the gain
is the geometric mean over the passes of (the base package's time / the variant's time), both
timed as CUDA graphs interleaved with torch in the same pass (>1: the variant is faster); per
group, the geometric mean of the cases' gains and how many are behind (gain under 1). The
decision rule each suite stated before the run (its description in suites/) is applied to it.

    python lab/cta_clusters/ab_summary.py           # write the tables into README.md
    python lab/cta_clusters/ab_summary.py --check   # fail if README.md or the log disagree

--check also reads the summary each card's run printed (logs/ab_<card>/run.log) and fails when
a group's cases, geomean or count behind differs from what the records give. A card's tables
are README blocks ``ab_summary:<A/B>_<card>``; a card without records has none.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
# card key: the device name its records carry (the run logs: logs/ab_<card>/run.log)
CARDS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}


def _dtype(dt):
    return lambda r: r["dtype"] == dt


# name: (records of a card, base package, variant package, [(group label, case filter)])
AB = {
    "c4next": ("ab_c4next_{card}.jsonl", "old", "new", [
        ("float16", _dtype("float16")), ("bfloat16", _dtype("bfloat16")),
        ("56-token tile (52, 56 tokens)", lambda r: r["M"] in (52, 56)),
        ("64-token tile (62 tokens)", lambda r: r["M"] == 62),
        ("all", lambda r: True)]),
    "m128": ("ab_m128_pairs_{card}.jsonl", "new", "pairs", [
        ("float16", _dtype("float16")), ("bfloat16", _dtype("bfloat16")),
        ("all", lambda r: True)]),
    "c4mis": ("ab_c4mis_quads_{card}.jsonl", "new", "quads", [
        ("float16", _dtype("float16")), ("bfloat16", _dtype("bfloat16")),
        ("1000^3", lambda r: (r["M"], r["N"], r["K"]) == (1000, 1000, 1000)),
        ("all", lambda r: True)]),
}


def records(name: str, card: str) -> Path:
    return HERE / "records" / AB[name][0].format(card=card)


def run_log(card: str) -> Path:
    return HERE / "logs" / f"ab_{card}" / "run.log"


def cards_run() -> list[str]:
    """The cards whose records of every A/B are here."""
    return [c for c in CARDS if all(records(name, c).is_file() for name in AB)]


def gains(name: str, card: str) -> dict:
    """{(dtype, M, N, K): gain} of one A/B on one card: the variant against the base, pass by
    pass."""
    _, base, variant, _ = AB[name]
    times: dict = {}
    for line in records(name, card).read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        assert r["device"] == CARDS[card] and r["ok"], (name, card, r)
        times.setdefault((r["dtype"], r["M"], r["N"], r["K"]), {})[(r["package"], r["pass"])] = r["ms"]
    out = {}
    for case, t in times.items():
        passes = sorted(p for pkg, p in t if pkg == base)
        assert passes and passes == sorted(p for pkg, p in t if pkg == variant), (name, case)
        out[case] = statistics.geometric_mean([t[(base, p)] / t[(variant, p)] for p in passes])
    return out


def summary(name: str, card: str) -> list[tuple[str, int, float, int]]:
    """[(group, cases, geomean gain, cases behind)] of one A/B on one card."""
    g = gains(name, card)
    rows = []
    for label, keep in AB[name][3]:
        xs = [v for (dt, m, n, k), v in g.items() if keep({"dtype": dt, "M": m, "N": n, "K": k})]
        rows.append((label, len(xs), statistics.geometric_mean(xs), sum(x < 1 for x in xs)))
    return rows


def decision(name: str, card: str) -> tuple[bool, str]:
    """The rule the suite's description stated before the run, applied to one card's summary."""
    s = {label: (n, gm, behind) for label, n, gm, behind in summary(name, card)}
    if name == "c4next":
        n, gm, behind = s["56-token tile (52, 56 tokens)"]
        keep = s["64-token tile (62 tokens)"][1]
        ok = gm < 0.99 and behind * 3 >= 2 * n and keep >= 1.0
        return ok, (f"56-token tile {gm:.3f} (needs under 0.99), {behind}/{n} behind (needs >= 2/3); "
                    f"62 tokens {keep:.3f} (needs >= 1.0)")
    if name == "m128":
        ok = all(s[dt][1] >= 1.02 and 4 * s[dt][2] <= s[dt][0] for dt in ("float16", "bfloat16"))
        return ok, (f"fp16 {s['float16'][1]:.3f}, bf16 {s['bfloat16'][1]:.3f} (needs >= 1.02 in each, "
                    f"at most a quarter behind: {s['float16'][2]}/{s['float16'][0]}, "
                    f"{s['bfloat16'][2]}/{s['bfloat16'][0]})")
    g = gains(name, card)
    cube = {dt: g[(dt, 1000, 1000, 1000)] for dt in ("float16", "bfloat16")}
    ok = all(s[dt][1] >= 1.02 for dt in cube) and all(v > 1 for v in cube.values())
    return ok, (f"fp16 {s['float16'][1]:.3f}, bf16 {s['bfloat16'][1]:.3f} (needs >= 1.02 in each); "
                f"1000^3 {cube['float16']:.3f} fp16, {cube['bfloat16']:.3f} bf16 (needs > 1 in both)")


def table(block: str) -> str:
    name, card = block.rsplit("_", 1)
    _, base, variant, _ = AB[name]
    lines = [f"Gain = {base} ms / {variant} ms per case (geomean over the passes; >1: `{variant}` faster), "
             f"{CARDS[card]}, from `records/{records(name, card).name}`:", "",
             "| cases | count | geomean gain | behind |", "|---|---|---|---|"]
    lines += [f"| {label} | {n} | {gm:.3f} | {behind} |" for label, n, gm, behind in summary(name, card)]
    ok, why = decision(name, card)
    lines += ["", f"Rule applied: {why}: {'adopted' if ok else 'not adopted'}."]
    return "\n".join(lines)


BLOCK = re.compile(r"<!-- ab_summary:(\w+) -->.*?<!-- /ab_summary -->", re.DOTALL)


def render(text: str) -> str:
    return BLOCK.sub(lambda m: f"<!-- ab_summary:{m.group(1)} -->\n{table(m.group(1))}\n<!-- /ab_summary -->",
                     text)


def log_summary(card: str) -> dict:
    """{(A/B, group): (cases, geomean, behind)} as the card's run printed them at the end of
    its run.log."""
    out, name = {}, None
    for line in run_log(card).read_text(encoding="utf-8").splitlines():
        m = re.match(r"== (\w+): gain = ", line)
        if m:
            name = m.group(1)
            continue
        m = re.match(r"  (.+): (\d+) cases, geomean ([\d.]+), behind (\d+)$", line)
        if m and name:
            out[(name, m.group(1))] = (int(m.group(2)), m.group(3), int(m.group(4)))
    return out


def check() -> list[str]:
    errors = []
    for card in cards_run():
        logged = log_summary(card)
        for name in AB:
            for label, n, gm, behind in summary(name, card):
                want = logged.get((name, label))
                got = (n, f"{gm:.3f}", behind)
                if want != got:
                    errors.append(f"{name} {label} on {card}: records give {got}, "
                                  f"{run_log(card).relative_to(HERE)} says {want}")
    text = README.read_text(encoding="utf-8")
    found = {m.group(1) for m in BLOCK.finditer(text)}
    want = {f"{name}_{card}" for card in cards_run() for name in AB}
    if found != want:
        errors.append(f"README.md has ab_summary blocks for {sorted(found)}, not {sorted(want)}")
    if render(text) != text:
        errors.append("README.md's A/B tables are stale: run python lab/cta_clusters/ab_summary.py")
    return errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    if args.check:
        errors = check()
        print("\n".join(errors) or "ok: the A/B tables hold what the records and run.log give")
        return 1 if errors else 0
    README.write_text(render(README.read_text(encoding="utf-8")), encoding="utf-8")
    for card in cards_run():
        for name in AB:
            print(f"== {name} on {CARDS[card]}\n{table(f'{name}_{card}')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
