"""A recorded trace drawn and filed: Gantt chart, the files a run leaves, notebook figures.

The report side of :mod:`tirx_gemm.timeline`, after
:mod:`tirx_gemm.report.timeline_view` (decode, spans, window, Chrome trace, summary):
:func:`gantt` / :func:`gantt_png` draw a Chrome trace (matplotlib, imported only then),
:func:`write_outputs` writes a decoded run's .json, .png and .txt (``tirx-gemm trace``,
tirx_gemm/cli/trace.py, calls it on a GPU host), and :func:`recorded_figure` /
:func:`draw_recorded` show a trace recorded under results/timelines/ in a notebook.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from tirx_gemm import spec
from tirx_gemm.report.timeline_view import (MAX_TRACE_BYTES, Focus, Timeline, focus,
                                            load_chrome_trace, summary, write_chrome_trace)
from tirx_gemm.timeline import KINDS, ROLES

NO_CLOCK = ("No timeline for sm_100a: these steps run only on NumSim, a CPU model of "
            "Blackwell that checks results and the barrier protocol but has no clock, so "
            "there is no time axis to draw. The sm_90a notebook of this step shows one "
            "recorded on a Hopper GPU.")



def _events_for_plot(trace: dict, ctas: int | None, window):
    """(lanes, bars): the CTAs of a Chrome trace (the first ``ctas`` if given), as
    [(pid, tid, label)] and [(lane index, start us, dur us, cat)] within ``window``."""
    names = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
    keep = sorted(names)[:ctas] if ctas else sorted(names)
    tids = {}
    for e in trace["traceEvents"]:
        if e.get("ph") in ("X", "i") and e["pid"] in keep:
            tids.setdefault(e["pid"], set()).add(e["tid"])
    roles = trace.get("otherData", {}).get("roles", ROLES)
    lanes = [(p, t, f"{names[p]}: {roles[t] if t < len(roles) else t}")
             for p in keep for t in sorted(tids.get(p, ()))]
    index = {(p, t): i for i, (p, t, _) in enumerate(lanes)}
    lo, hi = window if window else (None, None)
    bars = []
    for e in trace["traceEvents"]:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") not in ("X", "i") or key not in index:
            continue
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        if hi is not None and (ts > hi or ts + dur < lo):
            continue
        bars.append((index[key], ts, dur, e.get("cat", "")))
    return lanes, bars


def gantt(trace: dict, ax=None, *, ctas: int | None = None, window=None,
          title: str | None = None):
    """Draw a Chrome trace (a dict) on a matplotlib axis: one row per role of each CTA, one
    colour per event kind, points as ticks, within ``window`` (us; default: the trace's
    own window); returns the axis."""
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=(13, 1.2 + 0.42 * 4 * len(ROLES)))
    window = window or trace.get("otherData", {}).get("window_us")
    lanes, bars = _events_for_plot(trace, ctas, window)
    colours = {v[0]: v[2] for v in KINDS.values()}
    order = [v[0] for v in KINDS.values()]
    seen = set()
    for lane, ts, dur, cat in sorted(bars, key=lambda b: b[2] == 0):  # ticks on top
        c = colours.get(cat, "#333333")
        label = None if cat in seen else cat
        seen.add(cat)
        if dur > 0:
            ax.broken_barh([(ts, dur)], (lane - 0.38, 0.76), facecolors=c, label=label,
                           edgecolor="white", linewidth=0.3)
        else:
            ax.plot([ts, ts], [lane - 0.45, lane + 0.45], color=c, linewidth=1.0, label=label)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([lab for _, _, lab in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    if window:
        ax.set_xlim(window[0], window[1])
    centre = trace.get("otherData", {}).get("window_center_us")
    if centre is not None:
        ax.axvline(centre, color="#444444", linewidth=0.6, linestyle=":")
    ax.set_xlabel("time since the kernel's first event (us, GPU global timer)")
    if title:
        ax.set_title(title, fontsize=10)
    if seen:
        handles, labels = ax.get_legend_handles_labels()
        ranked = sorted(zip(labels, handles), key=lambda x: order.index(x[0])
                        if x[0] in order else 99)
        ax.legend([h for _, h in ranked], [lab for lab, _ in ranked], loc="upper left",
                  bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return ax


def gantt_png(trace: dict, path, *, ctas: int | None = None, window=None,
              title: str | None = None) -> Path:
    """:func:`gantt` written to a PNG (Agg backend: no display needed)."""
    data = gantt_bytes(trace, ctas=ctas, window=window, title=title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def gantt_bytes(trace: dict, *, ctas: int | None = None, window=None,
                title: str | None = None) -> bytes:
    import io
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    n = len(_events_for_plot(trace, ctas, window)[0]) or 1
    fig, ax = plt.subplots(figsize=(13, 1.4 + 0.36 * n))
    gantt(trace, ax, ctas=ctas, window=window, title=title)
    fig.tight_layout()
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=100)
    plt.close(fig)
    return data.getvalue()


# ---------------------------------------------------------------------------------------
# the files a trace leaves (tirx_gemm.cli.trace writes them on a GPU) and the notebooks
# ---------------------------------------------------------------------------------------
TIMELINES_DIR = Path(__file__).resolve().parents[2] / spec.RESULTS_DIR / "timelines"


def trace_name(step_id: str, arch: str, M: int, N: int, K: int,
               dtype: str = "float16") -> str:
    return f"{step_id}_{arch}_{M}x{N}x{K}" + ("" if dtype == "float16" else "_bf16")


def _title(meta: dict, keep) -> str:
    lo, hi = (keep.lo_ns / 1000, keep.hi_ns / 1000) if isinstance(keep, Focus) else keep
    return (f"{meta.get('step', '?')}@{meta.get('arch', '?')} "
            f"{meta.get('M')}x{meta.get('N')}x{meta.get('K')} {meta.get('dtype', '')} on "
            f"{meta.get('device', '?')}: CTAs "
            f"{', '.join(map(str, meta.get('window_ctas', [])))}, {lo:.1f}-{hi:.1f} us "
            "(dotted: CTA 0's first epilogue)")


def write_outputs(tl: Timeline, out: Path, stem: str, meta: dict, *, timing=None,
                  ctas: int = 4):
    """<out>/<stem>.json (Chrome trace of the focus window, under MAX_TRACE_BYTES),
    <out>/<stem>.png (its Gantt chart) and <out>/<stem>.txt (the whole run, :func:`summary`)."""
    out = Path(out)
    keep = focus(tl, ctas=ctas)
    meta = dict(meta)
    if timing:
        meta["timing"] = timing
    js = write_chrome_trace(tl, out / f"{stem}.json", meta, keep=keep,
                            max_bytes=MAX_TRACE_BYTES)
    trace = load_chrome_trace(js)
    other = trace["otherData"]
    lo, hi = other["window_us"]
    keep = dataclasses.replace(keep, lo_ns=int(lo * 1000), hi_ns=int(hi * 1000))
    try:
        png = gantt_png(trace, out / f"{stem}.png", title=_title(other, (lo, hi)))
    except ImportError as exc:  # a GPU host without matplotlib: the JSON draws it later
        print(f"no PNG ({exc}): `tirx-gemm trace {js}` draws it where "
              "matplotlib is installed", file=sys.stderr)
        png = None
    txt = out / f"{stem}.txt"
    txt.write_text(summary(tl, meta, timing, keep) + "\n")
    return js, png, txt


def recorded_path(step_id: str, M: int, N: int, K: int, arch: str = "sm_90a",
                  folder=None, dtype: str = "float16") -> Path:
    return Path(folder or TIMELINES_DIR) / f"{trace_name(step_id, arch, M, N, K, dtype)}.json"


def _recorded(step_id: str, arch: str, mnk, folder):
    """(trace or None, path or the reason there is none). Without ``mnk``: the step's
    fp16 trace in the folder (the largest shape if there are several)."""
    if arch == "sm_100a":
        return None, NO_CLOCK
    folder = Path(folder or TIMELINES_DIR)
    if mnk is None:
        def size(p):
            try:
                return tuple(int(x) for x in p.stem.rsplit("_", 1)[-1].split("x"))
            except ValueError:
                return ()
        found = sorted((p for p in folder.glob(f"{step_id}_{arch}_*.json")
                        if len(size(p)) == 3), key=size)
        if not found:
            return None, (f"No timeline recorded yet for {step_id}@{arch} (no "
                          f"{step_id}_{arch}_*.json in {folder}): `tirx-gemm trace {step_id} "
                          f"--arch {arch}` on a Hopper GPU writes it.")
        path = found[-1]
    else:
        M, N, K = mnk
        path = recorded_path(step_id, M, N, K, arch, folder)
        if not path.exists():
            return None, (f"No timeline recorded yet for {step_id}@{arch} {M}x{N}x{K} "
                          f"({path.name} is not in {path.parent}): `tirx-gemm trace {step_id} "
                          f"--arch {arch} --mnk {M},{N},{K}` on a Hopper GPU writes it.")
    return load_chrome_trace(path), path


def draw_recorded(step_id: str, M: int | None = None, N: int | None = None,
                  K: int | None = None, *, arch: str = "sm_90a", ctas: int | None = None,
                  window=None, folder=None, ax=None):
    """For a notebook: draw the trace recorded under results/timelines/ for this step and
    shape (default: the one recorded) on ``ax``. sm_100a steps have none (NumSim has no
    clock), and that is what this prints, as it does for a trace not recorded yet; returns
    the axis or None."""
    trace, why = _recorded(step_id, arch, None if M is None else (M, N, K), folder)
    if trace is None:
        print(why)
        return None
    other = trace.get("otherData", {})
    win = window or other.get("window_us") or (0, max(
        (e["ts"] + e.get("dur", 0) for e in trace["traceEvents"] if "ts" in e), default=1))
    return gantt(trace, ax, ctas=ctas, window=win, title=_title(other, win))


def recorded_figure(step_id: str, arch: str = "sm_90a", mnk=None, *, ctas: int | None = None,
                    folder=None) -> tuple[bytes | None, str]:
    """(PNG bytes or None, text) of the recorded trace of a step, for notebook.Png / Md:
    the PNG written beside the trace (drawn from the JSON if missing); the text says what
    the chart shows and adds the summary of the whole run, or says why there is none
    (sm_100a: no clock)."""
    trace, why = _recorded(step_id, arch, mnk, folder)
    if trace is None:
        return None, why
    other = trace.get("otherData", {})
    png_path, txt_path = why.with_suffix(".png"), why.with_suffix(".txt")
    win = other.get("window_us") or (0, max(
        (e["ts"] + e.get("dur", 0) for e in trace["traceEvents"] if "ts" in e), default=1))
    data = png_path.read_bytes() if png_path.exists() and ctas is None else \
        gantt_bytes(trace, ctas=ctas, window=win, title=_title(other, win))
    kinds = {e.get("cat") for e in trace["traceEvents"] if e.get("ph") in ("X", "i")}
    legend = "; ".join(f"{v[0]}: {v[1]}" for v in KINDS.values() if v[0] in kinds)
    text = (f"{_title(other, win)}. One row per role, one colour per event kind ({legend}). "
            f"The window's events are in {why.name} (ui.perfetto.dev opens it).")
    if txt_path.exists():
        text += "\n\nThe whole run:\n\n```\n" + txt_path.read_text().rstrip() + "\n```"
    return data, text


__all__ = [
    "gantt", "gantt_png", "gantt_bytes", "write_outputs", "draw_recorded", "recorded_figure",
    "recorded_path", "trace_name", "NO_CLOCK", "TIMELINES_DIR",
]
