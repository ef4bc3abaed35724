"""sm_100a's v14 twin with every weight's extents int64 (the wide build that experts past 2^27
elements get, tirx_gemm/hopper/grouped.py's weight_shape), forced at the registry's own small
simulation cases and run through NumSim (numbers, synccheck, racecheck): the wide host encode and
the device code together, on a CPU model of sm_100a. Needs the sim venv (Python >= 3.12,
tirx-harness); no GPU, no speed.

    python lab/moe_grouped_gemm/wide_twin_numsim.py --out lab/moe_grouped_gemm/records/wide_twin_numsim_cpu.jsonl

One line per case as it finishes, one JSON record each; exit 0 only if every case is wide,
correct and clean."""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tirx_gemm import registry  # noqa: E402
from tirx_gemm.hopper import grouped as HG  # noqa: E402
from tirx_gemm.sim.cases import cases_for  # noqa: E402
from tirx_gemm.sim.runcase import run_case  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="append one JSON record per case here")
    args = ap.parse_args(argv)
    HG.WIDE_FROM_BITS = 0  # every weight wide, whatever its size
    ok = True
    for case in cases_for(registry.get("v14", "sm_100a")):
        wide = "T.int64" in case.build().script()
        t0 = time.time()
        row = run_case(case)
        good = bool(row.ok and wide)
        ok &= good
        rec = {"date": datetime.date.today().isoformat(), "device": "NumSim, CPU model of sm_100a",
               "step": "v14", "arch": "sm_100a", "M": case.M, "N": case.N, "K": case.K,
               "kwargs": dict(case.kwargs), "weight_extents": "int64" if wide else "int32",
               "numsim": row.numsim, "sync": row.sync, "race": row.race, "rel_err": row.rel_err,
               "ok": good, "problems": list(row.problems), "seconds": round(time.time() - t0, 1)}
        print(f"{case.label}: extents {rec['weight_extents']}, numsim {row.numsim}, sync "
              f"{row.sync}, race {row.race}, rel_err {row.rel_err:.2g}"
              + (f"; {row.problems}" if row.problems else ""), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
    print("every case wide, correct and clean" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
