#!/usr/bin/env python
"""Render a PNG of TFLOP/s per step from the records in results/ (one plot per GPU).

    python scripts/plot_results.py [--results results] [--out results]

Bars: the latest timed, verified record of each step at each benchmark shape; dashed lines:
torch.matmul (cuBLAS) timed in the same runs (median over those runs). Drawn by
tirx_gemm.report.plots.write_device_plots; needs matplotlib (`pip install -e ".[plot]"`).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tirx_gemm.report.plots import write_device_plots  # noqa: E402
from tirx_gemm.report.records import load_records  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--out", default=None, help="output folder (default: --results)")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:
        print("matplotlib is not installed: pip install -e '.[plot]'", file=sys.stderr)
        return 2
    paths = write_device_plots(load_records(args.results), Path(args.out or args.results))
    for p in paths:
        print(f"wrote {p}")
    if not paths:
        print("no timed, verified records at 4096^3 / 8192^3: nothing to plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
