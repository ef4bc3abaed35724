#!/usr/bin/env python
"""Build (or take from a bundle), check and time every step of this GPU's arch at the
registry's benchmark shapes (4096^3 and 8192^3; v1/v2 at their single-tile shapes), with
torch.matmul(A, B.T) timed in the same run; print the table, append the records to
results/, re-render the README table and the PNG plot. ``--dtype bfloat16`` benchmarks the
bfloat16 builds (the bundle must hold them: `tirx-gemm export --dtype bfloat16`); their
records carry the dtype and get rows of their own in the README table.

    python scripts/benchmark.py [--bundle build/bundle] [--results results] [--dtype D] [--no-readme]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", help="exported bundle (GPU host without TVM)")
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--no-readme", action="store_true", help="do not re-render README/plot")
    from tirx_gemm.numerics import DTYPES
    ap.add_argument("--dtype", choices=DTYPES, default=DTYPES[0],
                    help=f"operand dtype (default {DTYPES[0]})")
    args = ap.parse_args(argv)

    from tirx_gemm import cli
    from tirx_gemm.run import device
    arch, why = device.gpu_arch()
    if arch is None:
        print(f"cannot benchmark: {why}", file=sys.stderr)
        return 2
    bench = ["bench", "--all", "--arch", arch, "--shapes", "bench", "--record",
             "--results", args.results, "--dtype", args.dtype, "-q"] + (
                 ["--bundle", args.bundle] if args.bundle else [])
    rc = cli.main(bench)
    if not args.no_readme:
        for script in ("render_results.py", "plot_results.py"):
            subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--results",
                            args.results], check=False)
    return rc


if __name__ == "__main__":
    sys.exit(main())
