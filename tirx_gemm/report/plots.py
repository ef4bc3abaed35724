"""The plots, drawn from the records (results/*.jsonl), never from printed output.

* :func:`canonical_png`: every registered step at its canonical shape, TFLOP/s and ratio to
  torch side by side (the notebooks' ``plot_results``);
* :func:`write_device_plots`: one PNG per GPU and arch of TFLOP/s at the 4096^3 / 8192^3
  benchmark shapes with torch.matmul as dashed lines (``scripts/plot_results.py``).

matplotlib (the ``plot`` extra) is imported only when a figure is drawn, through its Agg
canvas (no display, no pyplot state); :func:`canonical_text` gives the same numbers as a
markdown table where it is missing. Imports neither torch nor TVM.
"""

from __future__ import annotations

import io
import statistics
from pathlib import Path
from typing import Sequence

from tirx_gemm.report import records
from tirx_gemm.report import tables

__all__ = ["BIG_SHAPES", "canonical_data", "canonical_text", "canonical_png",
           "write_device_plots"]

BIG_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))
HIGHLIGHT, NORMAL = "tab:orange", "tab:blue"
SHAPE_COLORS = ("#3b6ea8", "#e08a2c")


def _mnk(rec: dict) -> tuple[int, int, int]:
    return (int(rec["M"]), int(rec["N"]), int(rec["K"]))


def _figure(figsize, dpi):
    """A matplotlib Figure on the Agg canvas (ImportError without matplotlib)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


# --------------------------------------------------------------------------------------
# every step at its canonical shape (notebooks)
# --------------------------------------------------------------------------------------
def canonical_data(latest: Sequence[dict], steps, highlight: str | None = None) -> list[dict]:
    """One entry per registered (step, arch) of ``steps``: the latest record (``latest``:
    one per record key) at the canonical shape per GPU, or a 'not measured' entry."""
    data = []
    for s in steps:
        recs = [r for r in latest if r["step"] == s.id and r["arch"] == s.arch
                and _mnk(r) == tuple(s.canonical)]
        if not recs:
            why = (records.NO_SM100_GPU if s.arch == "sm_100a"
                   and not any(r["arch"] == "sm_100a" for r in latest) else records.NOT_MEASURED)
            data.append({"step": s.id, "arch": s.arch, "shape": s.canonical, "device": why,
                         "tflops": None, "ratio": None, "verified": None,
                         "highlight": s.id == highlight})
        for r in recs:
            data.append({"step": s.id, "arch": s.arch, "shape": s.canonical,
                         "device": r["device"], "tflops": r.get("tflops"),
                         "ratio": r.get("ratio_to_torch"), "verified": r.get("verified"),
                         "highlight": s.id == highlight})
    return data


def canonical_text(data: list[dict]) -> str:
    """The numbers of :func:`canonical_png` as a markdown table."""
    rows = [[d["step"] + (" <-" if d["highlight"] else ""), d["arch"], tables.shape(d["shape"]),
             d["device"], tables.fmt(d["tflops"], ".1f", None),
             None if d["ratio"] is None else f"{d['ratio']:.2f}x",
             {True: "✓", False: "✗", None: ""}[d["verified"]]] for d in data]
    return tables.markdown(["step", "arch", "M x N x K (canonical)", "GPU", "TFLOP/s",
                            "x torch", "check"], rows)


def canonical_png(data: list[dict], highlight: str | None = None) -> bytes:
    """TFLOP/s (log scale) and ratio to torch, one bar per measured (step, arch, GPU),
    ``highlight`` in a stronger colour. Raises ImportError without matplotlib."""
    fig = _figure((11, 4.2), 100)
    measured = [d for d in data if d["tflops"] is not None]
    unmeasured = sorted({f"{d['arch']}: {d['device']}" for d in data if d["tflops"] is None
                         and d["device"] == records.NO_SM100_GPU})
    if highlight and not any(d["highlight"] for d in measured):
        unmeasured.append(f"{highlight}: no recorded run at its canonical shape")
    ax1, ax2 = fig.subplots(1, 2)
    labels = [f"{d['step']}\n{d['arch']}" for d in measured]
    x = list(range(len(measured)))
    colors = [HIGHLIGHT if d["highlight"] else NORMAL for d in measured]
    if measured:
        ax1.bar(x, [d["tflops"] for d in measured], color=colors)
        ax1.set_yscale("log")
        ax1.set_ylim(top=max(d["tflops"] for d in measured) * 8)  # room for the labels
        for i, d in enumerate(measured):
            ax1.annotate(f"{d['tflops']:.3g}\n{tables.shape(d['shape'])}", (i, d["tflops"]),
                         ha="center", va="bottom", fontsize=7)
        ratios = [d["ratio"] or 0.0 for d in measured]
        ax2.bar(x, ratios, color=colors)
        ax2.axhline(1.0, color="gray", lw=0.8, ls="--")
        for i, v in enumerate(ratios):
            ax2.annotate(f"{v:.2f}x", (i, v), ha="center", va="bottom", fontsize=7)
    for ax, title in ((ax1, "TFLOP/s (log scale)"), (ax2, "ratio to torch.matmul (cuBLAS)")):
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title(title, fontsize=10)
    devices = ", ".join(sorted({d["device"] for d in measured})) or "no GPU recorded"
    fig.suptitle(f"Recorded results, each step at its canonical shape ({devices})", fontsize=11)
    if unmeasured:
        fig.text(0.5, 0.01, "; ".join(unmeasured), ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# --------------------------------------------------------------------------------------
# per GPU and arch at the benchmark shapes (scripts/plot_results.py)
# --------------------------------------------------------------------------------------
def _step_order(step_id: str):
    digits = "".join(c for c in step_id if c.isdigit())
    return (int(digits) if digits else 0, step_id)


def write_device_plots(recs: Sequence[dict], out_dir: Path,
                       shapes: Sequence[tuple] = BIG_SHAPES) -> list[Path]:
    """plot_<device>_<arch>.png in ``out_dir`` for every GPU and arch with timed, verified
    records at ``shapes``: bars per step and shape, torch.matmul (median over the same runs)
    as a dashed line per shape. Returns the files written. Raises ImportError without
    matplotlib."""
    timed = [r for r in recs if r.get("tflops") is not None and r.get("verified")]
    written = []
    for dev in sorted({r["device"] for r in timed}):
        latest = list(records.latest_by_key([r for r in timed if r["device"] == dev]).values())
        for arch in sorted({r["arch"] for r in latest}):
            mine = [r for r in latest if r["arch"] == arch and _mnk(r) in shapes]
            if not mine:
                continue
            steps = sorted({r["step"] for r in mine}, key=_step_order)
            fig = _figure((8, 4.2), 120)
            ax = fig.subplots()
            width = 0.8 / len(shapes)
            for i, shape in enumerate(shapes):
                color = SHAPE_COLORS[i % len(SHAPE_COLORS)]
                by_step = {r["step"]: r for r in mine if _mnk(r) == tuple(shape)}
                xs = [j + (i - (len(shapes) - 1) / 2) * width for j in range(len(steps))]
                ys = [by_step[s]["tflops"] if s in by_step else 0 for s in steps]
                label = records.shape_label(shape)
                bars = ax.bar(xs, ys, width, label=f"{label} (tirx-gemm)", color=color)
                for b, s in zip(bars, steps):
                    if s in by_step:
                        ax.annotate(f"{by_step[s]['tflops']:.0f}",
                                    (b.get_x() + b.get_width() / 2, b.get_height()),
                                    ha="center", va="bottom", fontsize=7)
                torch_tf = [r["torch_tflops"] for r in by_step.values() if r.get("torch_tflops")]
                if torch_tf:
                    ax.axhline(statistics.median(torch_tf), color=color, ls="--", lw=1,
                               label=f"{label} torch.matmul (cuBLAS), same runs")
            ax.set_xticks(range(len(steps)), steps)
            ax.set_ylabel("TFLOP/s (fp16 in, fp32 accumulate)")
            ax.set_title(f"tirx-gemm {arch} steps on {dev}: D = A @ B.T")
            ax.legend(fontsize=7, loc="upper left")
            ax.grid(axis="y", alpha=0.3)
            fig.tight_layout()
            out = Path(out_dir) / f"plot_{records.device_slug(dev)}_{arch}.png"
            fig.savefig(out)
            written.append(out)
    return written
