#!/usr/bin/env python
"""Render a PNG of TFLOP/s per step from the records in results/ (one plot per GPU).

    python scripts/plot_results.py [--results results] [--out results]

Bars: the latest timed, verified record of each step at each benchmark shape; dashed lines:
torch.matmul (cuBLAS) timed in the same runs (median over those runs). Needs matplotlib
(`pip install -e ".[plot]"`).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tirx_gemm.records import device_slug, latest_by_key, load_records  # noqa: E402

BIG_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))


def plot(records, out_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in records if r.get("tflops") is not None and r.get("verified")]
    written = []
    for dev in sorted({r["device"] for r in timed}):
        latest = [r for r in latest_by_key([r for r in timed if r["device"] == dev]).values()]
        archs = sorted({r["arch"] for r in latest})
        for arch in archs:
            mine = [r for r in latest if r["arch"] == arch
                    and (r["M"], r["N"], r["K"]) in BIG_SHAPES]
            if not mine:
                continue
            steps = sorted({r["step"] for r in mine}, key=lambda s: int(s[1:]))
            fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
            width = 0.8 / len(BIG_SHAPES)
            colors = ("#3b6ea8", "#e08a2c")
            for i, shape in enumerate(BIG_SHAPES):
                by_step = {r["step"]: r for r in mine if (r["M"], r["N"], r["K"]) == shape}
                xs = [j + (i - (len(BIG_SHAPES) - 1) / 2) * width for j in range(len(steps))]
                ys = [by_step[s]["tflops"] if s in by_step else 0 for s in steps]
                label = f"{shape[0]}³" if len(set(shape)) == 1 else "x".join(map(str, shape))
                bars = ax.bar(xs, ys, width, label=f"{label} (tirx-gemm)", color=colors[i])
                for b, s in zip(bars, steps):
                    if s in by_step:
                        ax.annotate(f"{by_step[s]['tflops']:.0f}", (b.get_x() + b.get_width() / 2,
                                    b.get_height()), ha="center", va="bottom", fontsize=7)
                torch_tf = [r["torch_tflops"] for r in by_step.values() if r.get("torch_tflops")]
                if torch_tf:
                    ax.axhline(statistics.median(torch_tf), color=colors[i], ls="--", lw=1,
                               label=f"{label} torch.matmul (cuBLAS), same runs")
            ax.set_xticks(range(len(steps)), steps)
            ax.set_ylabel("TFLOP/s (fp16 in, fp32 accumulate)")
            ax.set_title(f"tirx-gemm {arch} steps on {dev}: D = A @ B.T")
            ax.legend(fontsize=7, loc="upper left")
            ax.grid(axis="y", alpha=0.3)
            fig.tight_layout()
            out = out_dir / f"plot_{device_slug(dev)}_{arch}.png"
            fig.savefig(out)
            plt.close(fig)
            written.append(out)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--out", default=None, help="output folder (default: --results)")
    args = ap.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: pip install -e '.[plot]'", file=sys.stderr)
        return 2
    paths = plot(load_records(args.results), Path(args.out or args.results))
    for p in paths:
        print(f"wrote {p}")
    if not paths:
        print("no timed, verified records at 4096^3 / 8192^3: nothing to plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
