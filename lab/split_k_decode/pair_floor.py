"""Where does a decode split in two start to pay, card by card? At up to 48 tokens rule
``k_split_decode`` splits K in two with 64-row swap-AB tiles; on a card whose
``decode_pair_min_k_steps`` (tirx_gemm.op.cards) a unit falls short of, the non-persistent
swap-AB kernel runs instead. ``suites/pair_floor.json`` times both at units of 36-107 K steps;
the timing is lab/cost_model_error_classes/error_classes.py's (every candidate checked, CUDA
graphs interleaved with torch.mm in one run).

    python lab/split_k_decode/pair_floor.py plan lab/split_k_decode/suites/pair_floor.json --out PLAN.json
    python lab/split_k_decode/pair_floor.py export PLAN.json --out BUNDLE      # here: the missing kernels
    TIRX_GEMM_BUNDLE=BUNDLE python lab/cost_model_error_classes/error_classes.py run PLAN.json \
        --out RUN.jsonl --budget-s 40                                          # GPU host, per pass
    python lab/split_k_decode/pair_floor.py verdict RUN.jsonl [...] [--out records/X.jsonl]

``verdict``: per case the split's time, the non-persistent kernel's, ``gain`` (its time over
the split's: > 1, the split faster; the median over passes), and per card and band of K steps a
unit the geomean gain, how many cases are behind, and the floor the suite's bar gives.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "lab" / "cost_model_error_classes"))
# the bands of K steps a unit and the bar, as the suite states them
BANDS = ((33, 47), (48, 79), (80, 111))
LOWER_GEOMEAN, LOWER_WORST = 1.02, 0.98  # the floor drops to the first band's start
RAISE_GEOMEAN, RAISE_BEHIND = 0.98, 0.5  # a band at or past the floor fails the split


def plan(suite: Path, out: Path) -> int:
    import error_classes as ec
    return ec.plan(suite, out)


def export(plan_path: Path, out: Path) -> int:
    """Build only the plan's kernels the bundle at ``out`` does not hold yet (one job)."""
    import error_classes as ec
    from tirx_gemm import bundle_format
    from tirx_gemm.compile import bundle
    reqs = ec.requests(json.loads(plan_path.read_text()))
    have = ({e["lib"] for e in bundle_format.read_manifest(out)["kernels"]}
            if (out / bundle_format.MANIFEST).exists() else set())
    missing = [r for r in reqs if bundle_format.lib_name(
        r[0].id, r[0].arch, *r[1], r[2], None) not in have]
    print(f"{len(reqs)} kernels, {len(missing)} not in {out}")
    if missing:
        bundle.export(missing, out, jobs=1)
    return 0


def unit_steps(K: int, split: int) -> int:
    return math.ceil(math.ceil(K / 64) / split)


def rows(paths) -> list[dict]:
    """Per (case, card): the split's and the non-persistent kernel's medians over passes."""
    by: dict = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                by.setdefault((r["M"], r["N"], r["K"], r["dtype"], r["card"]), []).append(r)
    out = []
    for (M, N, K, dtype, card), recs in sorted(by.items()):
        gains, split_us, np_us, torch_us, split_r, np_r = [], [], [], [], [], []
        for r in recs:
            c = r["candidates"]
            split = c[r["pick"]]
            unsplit = [x for k, x in c.items() if k != r["pick"]
                       and x["kwargs"].get("SPLIT_K") == 1 and "ms" in x]
            if "ms" not in split or not unsplit:
                continue
            gains.append(unsplit[0]["ms"] / split["ms"])
            split_us.append(split["ms"] * 1e3)
            np_us.append(unsplit[0]["ms"] * 1e3)
            torch_us.append(r["torch_ms"] * 1e3)
            split_r.append(split["ratio"])
            np_r.append(unsplit[0]["ratio"])
        if not gains:
            continue
        kw = recs[0]["candidates"][recs[0]["pick"]]["kwargs"]
        med = statistics.median
        out.append({"M": M, "N": N, "K": K, "dtype": dtype, "card": card,
                    "device": recs[0]["device"], "class": recs[0]["class"],
                    "split": recs[0]["pick"], "split_k": kw["SPLIT_K"],
                    "unit_k_steps": unit_steps(K, kw["SPLIT_K"]), "passes": len(gains),
                    "gain": med(gains), "gain_min": min(gains), "gain_max": max(gains),
                    "split_us": med(split_us), "np_us": med(np_us), "torch_us": med(torch_us),
                    "split_ratio": med(split_r), "np_ratio": med(np_r)})
    return out


def band_of(steps: int):
    return next(((lo, hi) for lo, hi in BANDS if lo <= steps <= hi), None)


def floor_for(card_rows: list[dict], floor: int) -> tuple[int, list[str]]:
    """The floor the suite's bar gives from ``floor`` (the card's now), and a line per band."""
    lines, fails = [], {}
    for lo, hi in BANDS:
        gs = [r["gain"] for r in card_rows if lo <= r["unit_k_steps"] <= hi]
        if not gs:
            lines.append(f"  {lo}-{hi} K steps a unit: no case timed")
            continue
        gm, behind = statistics.geometric_mean(gs), sum(g < 1 for g in gs)
        fails[(lo, hi)] = gm < RAISE_GEOMEAN and behind >= RAISE_BEHIND * len(gs)
        clear = gm >= LOWER_GEOMEAN and min(gs) >= LOWER_WORST
        lines.append(f"  {lo}-{hi} K steps a unit: {len(gs)} cases, geomean gain {gm:.3f} "
                     f"({min(gs):.3f}-{max(gs):.3f}), {behind} behind"
                     + ("; fails the split (raise bar)" if fails[(lo, hi)] else "")
                     + ("; clears the lower bar" if clear else ""))
        fails[("clear", lo)] = clear
    new = floor
    first = BANDS[0]
    if floor > first[0] and fails.get(("clear", first[0])) and first[1] < floor:
        new = first[0]
    # raise: every band from the floor on that fails, in order, moves the floor past it; a
    # floor below the first band (units this suite does not time) stays where it is
    for lo, hi in BANDS:
        if hi < new:
            continue
        if lo > new:
            if fails.get((lo, hi)):
                lines.append(f"  the floor of {new} is below {lo}: units of {new}-{lo - 1} K "
                             f"steps are not timed here, so the bar does not move it")
            break
        if fails.get((lo, hi)):
            new = hi + 1
        else:
            break
    return new, lines


def verdict(paths, out: Path | None) -> int:
    from tirx_gemm.op import cards
    rs = rows(paths)
    if not rs:
        print("no timed case in the records")
        return 1
    for r in sorted(rs, key=lambda r: (r["card"], r["unit_k_steps"], r["M"])):
        print(f"{r['card']} {r['M']}x{r['N']}x{r['K']} {r['split']} ({r['unit_k_steps']} steps a "
              f"unit): split {r['split_us']:.1f} us, non-persistent {r['np_us']:.1f}, torch "
              f"{r['torch_us']:.1f}; gain {r['gain']:.3f} ({r['gain_min']:.3f}-{r['gain_max']:.3f}, "
              f"{r['passes']} passes); x torch {r['split_ratio']:.3f} split, {r['np_ratio']:.3f} "
              f"non-persistent")
    for card in sorted({r["card"] for r in rs}):
        now = cards.CARDS[card].decode_pair_min_k_steps if card in cards.CARDS else None
        mine = [r for r in rs if r["card"] == card]
        if now is None:
            print(f"{card}: not a card of tirx_gemm.op.cards")
            continue
        new, lines = floor_for(mine, now)
        print(f"{card} ({mine[0]['device']}): floor {now} K steps a unit now; by the bar: {new}")
        print("\n".join(lines))
    if out is not None:
        with open(out, "w") as f:
            for r in rs:
                f.write(json.dumps(r) + "\n")
        print(f"{len(rs)} rows -> {out}")
    return 0


def main(argv) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("plan")
    a.add_argument("suite", type=Path)
    a.add_argument("--out", type=Path, required=True)
    e = sub.add_parser("export")
    e.add_argument("plan", type=Path)
    e.add_argument("--out", type=Path, required=True)
    v = sub.add_parser("verdict")
    v.add_argument("records", nargs="+")
    v.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.cmd == "plan":
        return plan(args.suite, args.out)
    if args.cmd == "export":
        return export(args.plan, args.out)
    return verdict(args.records, args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
