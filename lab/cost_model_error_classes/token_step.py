"""The token-tile step A/B: swap-AB splits past decode with the token tile rounded to 8 columns
(cost_model.WIDE_SWAP_STEP = 8) against 16, on the card of a run.

    python lab/cost_model_error_classes/token_step.py verdict RECORDS.jsonl [...]

RECORDS: `error_classes.py run` over the plan of `suites/token_step_ab.json` (one or more
passes, one card). For each case (shape and dtype) the card's pick under each step is found
among the timed candidates by its keywords (rules.choose on the record's card, the step set
explicitly), the gain = the step-16 pick's time / the step-8 pick's time per pass, and the
case's gain the geomean over passes. The bar, stated in the suite before the run: geomean at
least 1.01 with at most a quarter of the cases behind by more than 2%.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
BAR_GEOMEAN = 1.01
BEHIND = 0.98  # a case "behind" below this gain


@contextlib.contextmanager
def token_step(step: int):
    from tirx_gemm.op import cost_model as cm
    old = cm.WIDE_SWAP_STEP
    cm.WIDE_SWAP_STEP = step
    try:
        yield
    finally:
        cm.WIDE_SWAP_STEP = old


def _key(kw: dict) -> str:
    return json.dumps(kw, sort_keys=True)


def gains(paths) -> tuple[str, dict]:
    """(card, {case: [gain per pass]}) where both picks were timed."""
    from tirx_gemm.op import rules as R
    out, cards = defaultdict(list), set()
    for path in paths:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            cards.add(r["device"])
            picks = {}
            for step in (16, 8):
                with token_step(step):
                    picks[step] = _key(R.choose(r["M"], r["N"], r["K"], r["dtype"],
                                                card=r["card"])[1])
            ms = {_key(x["kwargs"]): x.get("ms") for x in r["candidates"].values()}
            old, new = ms.get(picks[16]), ms.get(picks[8])
            if old and new:
                out[f"{r['M']}x{r['N']}x{r['K']} {r['dtype']}"].append(old / new)
    return ", ".join(sorted(cards)), dict(out)


def verdict(paths) -> int:
    card, by_case = gains(paths)
    if not by_case:
        print("no case with both picks timed")
        return 1
    per = {c: math.exp(sum(map(math.log, g)) / len(g)) for c, g in by_case.items()}
    gm = math.exp(sum(map(math.log, per.values())) / len(per))
    behind = sum(g < BEHIND for g in per.values())
    for c, g in per.items():
        print(f"{c:28} gain {g:.3f} over {len(by_case[c])} pass(es)")
    ok = gm >= BAR_GEOMEAN and 4 * behind <= len(per)
    print(f"{card}: {len(per)} cases, geomean {gm:.3f}, {behind} behind by more than 2%: "
          + ("the step of 8 passes the bar" if ok else "the step of 8 does not pass the bar")
          + f" (geomean at least {BAR_GEOMEAN}, at most a quarter behind)")
    return 0


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verdict", help="the A/B's verdict from run records")
    v.add_argument("records", nargs="+")
    args = p.parse_args(argv)
    return verdict(args.records)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
