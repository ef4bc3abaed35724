"""Decode K splits, card by card: does rule ``k_split_decode``'s swap-AB K split beat the best
kernel matmul has without it, on the card the device lends? The timing is
lab/cost_model_error_classes/error_classes.py's (every candidate checked, CUDA graphs
interleaved with torch.mm in one run); this script writes its plan and reads its records.

    python lab/split_k_decode/decode_cards.py plan suites/decode_cards.json --out PLAN.json   # here
    python lab/cost_model_error_classes/error_classes.py export PLAN.json --out BUNDLE        # here
    TIRX_GEMM_BUNDLE=BUNDLE python lab/cost_model_error_classes/error_classes.py run PLAN.json \
        --out RUN.jsonl --budget-s 40                                          # GPU host, per pass
    python lab/split_k_decode/decode_cards.py verdict RUN.jsonl [...] --out records/X.jsonl

``plan``: error_classes' plan of the suite, with the picks of RULES less ``k_split_decode``
as its "before" candidate (the persistent swap-AB kernel, clustered where the rules cluster
it); the suite names the non-persistent swap-AB kernel (``sw:64xT/1``, what the rule runs at
up to 48 tokens where it does not split) beside it. ``verdict``: per case and card, the
split's time, the best unsplit candidate's (before or non-persistent), their quotient
``gain`` (> 1: the split faster; the median over passes, each pass's candidates timed in
one interleaved run), ``fewer_gain`` where the suite names a split in fewer units (its time
over the pick's), ``fallback_gain`` (the kernel the rule runs without the split, the
non-persistent one at up to 48 tokens, else the "before" pick, over the split; its torch /
ours ``fallback_ratio``), ``pair_short``
(a two-way 64-row split at up to 48 tokens with units under 48 K steps: where the H100's rule
changes the pick) and the K steps a split unit holds; per class of K steps, the geomean
and how many cases are behind, against the bar the suite states (the split drops on a card
for a class with a geomean gain under 0.98 and at least half its cases behind).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "lab" / "cost_model_error_classes"))
RULE = "k_split_decode"
# the bar the suite states: a class drops the split on a card where its geomean gain is
# under DROP_GEOMEAN with at least DROP_BEHIND of its cases behind
DROP_GEOMEAN, DROP_BEHIND = 0.98, 0.5
# the rule the records led to, on the H100: at up to SWAP_NP_MAX_M tokens a 64-row split in
# two needs units of PAIR_MIN_K_STEPS K steps, else the non-persistent kernel runs
# (tirx_gemm.op.cards: decode_pair_min_k_steps); rows it changes are marked pair_short
SWAP_NP_MAX_M, PAIR_MIN_K_STEPS = 48, 48
# the classes of K steps a split unit holds (the rule's floor is cost_model.SPLIT_MIN_K_STEPS)
STEP_CLASSES = ((8, 15, "8-15"), (16, 47, "16-47"), (48, 10 ** 9, "48+"))


def plan(suite: Path, out: Path) -> int:
    import error_classes as ec
    from tirx_gemm.op import rules as R
    rules = R.RULES
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before.json"
        R.RULES = tuple(r for r in rules if r.name != RULE)
        try:
            ec.plan(suite, before)
        finally:
            R.RULES = rules
        return ec.plan(suite, out, before)


def steps_class(steps: int) -> str:
    return next(name for lo, hi, name in STEP_CLASSES if lo <= steps <= hi)


def cases(paths) -> dict:
    """{(M, N, K, dtype, card): [pass records]} of error_classes run records."""
    out: dict = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out.setdefault((r["M"], r["N"], r["K"], r["dtype"], r["card"]), []).append(r)
    return out


def verdict_rows(paths) -> list[dict]:
    rows = []
    for (M, N, K, dtype, card), recs in cases(paths).items():
        gains, split_r, best_r, torch_us, split_us, best_us, labels = [], [], [], [], [], [], []
        fewer_gains, fallback_gains, fallback_r = [], [], []
        for r in recs:
            c = r["candidates"]
            split = c[r["pick"]]
            unsplit = {k: x for k, x in c.items() if k != r["pick"] and "ms" in x
                       and x["kwargs"].get("SPLIT_K", 1) == 1}
            fewer = [x for k, x in c.items() if k != r["pick"] and "ms" in x
                     and x["kwargs"].get("SPLIT_K", 1) > 1]
            if "ms" not in split or not unsplit:
                continue
            if fewer:
                fewer_gains.append(fewer[0]["ms"] / split["ms"])
            fallback = [x for x in unsplit.values() if (x["kwargs"].get("SPLIT_K") == 1) ==
                        (M <= SWAP_NP_MAX_M)]
            if fallback:
                fallback_gains.append(fallback[0]["ms"] / split["ms"])
                fallback_r.append(fallback[0]["ratio"])
            best = min(unsplit, key=lambda k: unsplit[k]["ms"])
            gains.append(unsplit[best]["ms"] / split["ms"])
            split_r.append(split["ratio"])
            best_r.append(unsplit[best]["ratio"])
            torch_us.append(r["torch_ms"] * 1e3)
            split_us.append(split["ms"] * 1e3)
            best_us.append(unsplit[best]["ms"] * 1e3)
            labels.append(best)
        if not gains:
            continue
        kw = recs[0]["candidates"][recs[0]["pick"]]["kwargs"]
        steps = math.ceil(math.ceil(K / 64) / kw["SPLIT_K"])
        pair_short = (kw["SPLIT_K"] == 2 and kw["BLK_M"] == 64 and M <= SWAP_NP_MAX_M
                      and steps < PAIR_MIN_K_STEPS)
        rows.append({"M": M, "N": N, "K": K, "dtype": dtype, "card": card,
                     "device": recs[0]["device"], "class": recs[0]["class"],
                     "split": recs[0]["pick"], "split_k": kw["SPLIT_K"], "unit_k_steps": steps,
                     "steps_class": steps_class(steps), "passes": len(gains),
                     "gain": statistics.median(gains), "gain_min": min(gains),
                     "gain_max": max(gains),
                     "best_unsplit": statistics.mode(labels),
                     "split_ratio": statistics.median(split_r),
                     "unsplit_ratio": statistics.median(best_r),
                     "torch_us": statistics.median(torch_us),
                     "split_us": statistics.median(split_us),
                     "unsplit_us": statistics.median(best_us),
                     "behind": statistics.median(gains) < 1, "pair_short": pair_short,
                     **({"fallback_gain": statistics.median(fallback_gains),
                         "fallback_ratio": statistics.median(fallback_r)}
                        if fallback_gains else {}),
                     **({"fewer_gain": statistics.median(fewer_gains)} if fewer_gains else {})})
    return rows


def summary(rows, key) -> list[tuple]:
    """[(card, group, n, geomean gain, behind, the split stays)] grouped by ``key``."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["card"], key(r)), []).append(r["gain"])
    out = []
    for (card, g), gs in sorted(groups.items()):
        gm = statistics.geometric_mean(gs)
        behind = sum(x < 1 for x in gs)
        out.append((card, g, len(gs), gm, behind,
                    not (gm < DROP_GEOMEAN and behind >= DROP_BEHIND * len(gs))))
    return out


def verdict(paths, out: Path | None) -> int:
    rows = verdict_rows(paths)
    if not rows:
        print("no timed case in the records")
        return 1
    for r in sorted(rows, key=lambda r: (r["card"], r["unit_k_steps"], r["N"], r["M"])):
        print(f"{r['card']} {r['M']}x{r['N']}x{r['K']} {r['split']} ({r['unit_k_steps']} steps a "
              f"unit): split {r['split_us']:.1f} us, {r['best_unsplit']} {r['unsplit_us']:.1f}, "
              f"torch {r['torch_us']:.1f}; gain {r['gain']:.3f} ({r['gain_min']:.3f}-"
              f"{r['gain_max']:.3f}, {r['passes']} passes); x torch {r['split_ratio']:.3f} "
              f"split, {r['unsplit_ratio']:.3f} unsplit"
              + (f"; half the units {r['fewer_gain']:.3f}" if "fewer_gain" in r else "")
              + (f"; pair_short, against the kernel run without the split {r['fallback_gain']:.3f}"
                 if r["pair_short"] and "fallback_gain" in r else ""))
    for what, key in (("all", lambda r: "all"), ("K steps a unit", lambda r: r["steps_class"]),
                      ("class", lambda r: r["class"])):
        for card, g, n, gm, behind, ok in summary(rows, key):
            print(f"{card} {what} {g}: {n} cases, geomean gain {gm:.3f}, {behind} behind: "
                  + ("the split stays" if ok else f"the split drops (geomean under {DROP_GEOMEAN},"
                                                  f" at least {DROP_BEHIND:.0%} behind)"))
    for card in sorted({r["card"] for r in rows}):
        short = [r["fallback_gain"] for r in rows
                 if r["card"] == card and r["pair_short"] and "fallback_gain" in r]
        if short:
            print(f"{card} pair_short: {len(short)} cases, the split against the kernel run "
                  f"without it: geomean {statistics.geometric_mean(short):.3f}, "
                  f"{sum(g < 1 for g in short)} behind")
    if out is not None:
        with open(out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"{len(rows)} rows -> {out}")
    return 0


def main(argv) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("plan")
    a.add_argument("suite", type=Path)
    a.add_argument("--out", type=Path, required=True)
    v = sub.add_parser("verdict")
    v.add_argument("records", nargs="+")
    v.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.cmd == "plan":
        return plan(args.suite, args.out)
    return verdict(args.records, args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
