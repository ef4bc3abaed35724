"""Recorded results (results/*.jsonl, results/sim/, results/timelines/) and runs on this machine."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from tirx_gemm import registry, settings
from tirx_gemm.report import plots
from tirx_gemm.report import records
from tirx_gemm.run import measure
from tirx_gemm.notebook.display import Md, Png, _shape, _table
from tirx_gemm.notebook.steps import PKG_DIR, _step, steps_of

RESULTS_ENV = "TIRX_GEMM_RESULTS"


def results_dir() -> Path:
    """$TIRX_GEMM_RESULTS, else the checkout's results/ (editable install), else the first
    results/ found walking up from the working directory."""
    env = settings.get(RESULTS_ENV)
    if env is not None:
        return env
    cand = PKG_DIR.parent / "results"
    if cand.is_dir():
        return cand
    for d in [Path.cwd(), *Path.cwd().parents]:
        if (d / "results").is_dir():
            return d / "results"
    return cand


def _env_bundle() -> str | None:
    """$TIRX_GEMM_BUNDLE (tirx_gemm.settings), or None."""
    path = settings.get("TIRX_GEMM_BUNDLE")
    return None if path is None else str(path)


def _all_latest() -> list[dict]:
    return list(records.latest_by_key(records.load_records(results_dir())).values())


def results_for(step_id: str | None = None) -> list[dict]:
    """Latest recorded run per (step, arch, shape, device), for one step or all, sorted."""
    recs = [r for r in _all_latest() if step_id is None or r["step"] == step_id]
    order = {a: i for i, a in enumerate(registry.ARCHES)}
    return sorted(recs, key=lambda r: (r["step"], order.get(r["arch"], 9), r["device"],
                                       int(r["M"]) * int(r["N"]) * int(r["K"])))


def _step_rows(step_ids: Sequence[str]) -> list[tuple]:
    return [(s.id, s.arch, s.lesson) for sid in step_ids for s in steps_of(sid)]


def results_table(step_id: str | None = None) -> Md:
    """The README-style results table (records.render_table), for one step or all; steps
    without records say why (sm_100a: no sm_100a GPU available)."""
    ids = [step_id] if step_id else registry.step_ids()
    recs = [r for r in _all_latest() if r["step"] in ids]
    shapes = sorted({(int(r["M"]), int(r["N"]), int(r["K"])) for r in recs},
                    key=lambda s: s[0] * s[1] * s[2])
    if not shapes:
        shapes = sorted({s.canonical for sid in ids for s in steps_of(sid)})
    src = results_dir()
    try:
        src = src.relative_to(PKG_DIR.parent)
    except ValueError:
        pass
    return Md(f"Recorded in `{src}/` (newest run per step, arch, shape and GPU):\n\n"
              + records.render_table(recs, _step_rows(ids), shapes,
                                     sim_records=sim_records()))


def sim_records() -> list[dict]:
    """The NumSim records (results/sim/*.jsonl): sm_100a steps run on a CPU model."""
    return records.load_records(results_dir() / "sim")


_SIM_HEAD = ["M x N x K", "kwargs", "result", "rel. error", "synccheck", "racecheck", "date",
             "git"]


def simulation(step_id: str, *, live: bool | None = None) -> Md:
    """The sm_100a step on NumSim, a CPU model of Blackwell: simulated here when the
    simulator is installed (Python >= 3.12, ``pip install -e ".[sim]"``), else the step's
    latest recorded simulation (results/sim/). Correctness and synchronization on a model;
    no timing."""
    from tirx_gemm.sim.batch import simulate
    from tirx_gemm.sim.cases import ARCH, cases_for
    from tirx_gemm.sim.environment import unavailable_reason
    step = _step(step_id, ARCH)
    if step is None:
        return Md(f"{step_id} has no sm_100a step to simulate.")
    why = unavailable_reason()
    if live is None:
        live = why is None
    if live:
        lines: list[str] = []
        log_path = Path(tempfile.mkdtemp(prefix="tirx-gemm-sim-")) / f"{step_id}.txt"
        rows = simulate(cases_for(step), log_path=log_path, out=lines.append)
        ok = sum(r.ok for r in rows)
        return Md(f"Simulated here on NumSim ({ok}/{len(rows)} cases correct and clean; full "
                  f"checker text in `{log_path}`):\n\n```\n" + "\n".join(lines) + "\n```")
    run = sorted(records.latest_sim_run(sim_records(), step_id),
                 key=lambda r: int(r["M"]) * int(r["N"]) * int(r["K"]))
    if not run:
        return Md(f"Not simulated here ({why}) and no simulation recorded in results/sim/.")
    rows = [[_shape((r["M"], r["N"], r["K"])),
             " ".join(f"{k}={v}" for k, v in (r.get("kwargs") or {}).items()) or "-",
             r.get("numsim"), None if r.get("rel_err") is None else f"{r['rel_err']:.1e}",
             r.get("synccheck"), r.get("racecheck"), str(r.get("timestamp", ""))[:10],
             str(r.get("git_sha"))[:10]] for r in run]
    return Md(f"Not simulated here ({why}). The latest recorded simulation "
              f"(`tirx-gemm sim {step_id} --record`, {run[0].get('device')}):\n\n"
              + _table(_SIM_HEAD, rows))


def _device_for(arch: str):
    """(device info, None) if a GPU of this arch is here, else (None, why not)."""
    try:
        from tirx_gemm.run import device
    except Exception as exc:  # noqa: BLE001 - no torch: nothing can run here
        return None, f"the run side cannot be imported ({type(exc).__name__}: {exc})"
    return device.device_or_reason(arch, query_smi=False)


def _record_rows(recs: Sequence[dict]) -> list[list]:
    rows = []
    for r in recs:
        tf, ratio = r.get("tflops"), r.get("ratio_to_torch")
        rows.append([r["step"], r["arch"], r["device"], _shape((r["M"], r["N"], r["K"])),
                     records.record_dtype(r), "✓" if r.get("verified") else "✗",
                     None if r.get("rel_err") is None else f"{r['rel_err']:.1e}",
                     None if tf is None else f"{tf:.1f}",
                     None if ratio is None else f"{ratio:.2f}x",
                     str(r.get("timestamp", ""))[:10]])
    return rows


_RECORD_HEAD = ["step", "arch", "GPU", "M x N x K", "dtype", "check", "rel. error",
                "TFLOP/s", "x torch", "date"]


def measure_or_recorded(step_id: str, *, bundle: str | None = None) -> Md:
    """For each arch of the step: where a GPU of that arch is present, check and time the
    step here at its canonical shape (``tirx_gemm.run.measure.measure_plan``: build or bundle
    -> runner.run_step); where not, say why and show the recorded results with their GPU."""
    bundle = bundle or _env_bundle()
    out = []
    for arch in registry.ARCHES:
        step = _step(step_id, arch)
        if step is None:
            out.append(f"**{arch}**: {step_id} is not in the registry (yet).")
            continue
        dev, why = _device_for(arch)
        if dev is not None:
            log: list[str] = []
            recs = measure.measure_plan([(step, step.canonical)], bundle=bundle,
                                        log=log.append)
            out.append(f"**{arch}**: measured here on {dev['name']} (cc {dev['capability']}, "
                       f"{dev['sm_count']} SMs), canonical shape; not recorded "
                       "(`tirx-gemm run ... --record` appends to results/):\n\n"
                       + _table(_RECORD_HEAD, _record_rows(recs)))
            continue
        recs = [r for r in results_for(step_id) if r["arch"] == arch]
        if recs:
            devices = ", ".join(sorted({r["device"] for r in recs}))
            out.append(f"**{arch}**: not run here ({why}). Recorded on {devices}:\n\n"
                       + _table(_RECORD_HEAD, _record_rows(recs)))
        elif arch == "sm_100a" and not any(r["arch"] == "sm_100a" for r in _all_latest()):
            out.append(f"**{arch}**: {records.NO_SM100_GPU} (not run here either: {why}).")
        else:
            out.append(f"**{arch}**: {records.NOT_MEASURED} (no record in results/; not run "
                       f"here: {why}).")
    return Md("\n\n".join(out))


def timeline(step_id: str, arch: str = "sm_90a", *, bundle: str | None = None) -> Md | Png:
    """The in-kernel timeline of this step at its canonical shape: recorded live here when
    a GPU of the arch is present and the bundle (``bundle`` or TIRX_GEMM_BUNDLE) holds the
    step's instrumented build (`tirx-gemm export ... --timeline`); else the one recorded
    in results/timelines/ (the Gantt chart of the first CTAs around the first tile
    boundary, and the whole run summarised), or why there is none: sm_100a runs only on
    NumSim, which has no clock; an sm_90a step may not be recorded yet."""
    from tirx_gemm.report import timeline_files as TF
    bundle = bundle or _env_bundle()
    note = ""
    dev, why = _device_for(arch) if arch == "sm_90a" else (None, "")
    if dev is not None and bundle:
        live, note = _live_timeline(step_id, arch, bundle, dev)
        if live is not None:
            return live
    png, text = TF.recorded_figure(step_id, arch, folder=results_dir() / "timelines")
    text = (note + "\n\n" if note else "") + text
    return Md(text) if png is None else Png(png, text)


def _live_timeline(step_id: str, arch: str, bundle: str, dev: dict):
    """(Png, "") of a trace recorded now from the bundle's instrumented kernel, or (None,
    why not) -- the caller then shows the recorded one."""
    import argparse
    import tempfile
    from tirx_gemm.cli.trace import trace_main  # run.trace records, report writes the files
    step = registry.get(step_id, arch)
    out = Path(tempfile.mkdtemp(prefix=f"tirx-gemm-trace-{step_id}-"))
    args = argparse.Namespace(step=step_id, arch=arch, mnk=None, dtype="float16", out=str(out),
                              bundle=bundle, ctas=4, no_timing=False)
    try:
        rc = trace_main(args)
    except (ValueError, LookupError, FileNotFoundError) as e:
        return None, (f"Not recorded live on {dev['name']}: {e}. The recorded trace "
                      "instead:")
    pngs, txts = sorted(out.glob("*.png")), sorted(out.glob("*.txt"))
    if rc != 0 or not txts:
        return None, (f"The live recording on {dev['name']} failed (exit {rc}); the recorded "
                      "trace instead:")
    text = (f"Recorded live just now on {dev['name']} ({step.key}, "
            f"{'x'.join(map(str, step.canonical))}; files in {out}):\n\n```\n"
            + txts[0].read_text().rstrip() + "\n```")
    return (Png(pngs[0].read_bytes(), text) if pngs else Md(text)), ""


def plot_results(highlight: str | None = None):
    """Recorded TFLOP/s and ratio to torch of every step at its canonical shape, one bar per
    (step, arch, GPU), ``highlight`` in a stronger colour (``tirx_gemm.report.plots``). A PNG when
    matplotlib is importable (the ``plot`` extra), else the same numbers as a table."""
    data = plots.canonical_data(_all_latest(), registry.STEPS, highlight)
    text = plots.canonical_text(data)
    try:
        return Png(plots.canonical_png(data, highlight), text)
    except ImportError:
        return Md("matplotlib is not installed (`pip install -e '.[plot]'`): the recorded "
                  "results as a table instead.\n\n" + text)


def device_status() -> Md:
    """Which tracks can run on this machine."""
    rows = []
    for arch in registry.ARCHES:
        dev, why = _device_for(arch)
        rows.append([arch, f"yes: {dev['name']} (cc {dev['capability']})" if dev else
                     f"no: {why}"])
    return Md(_table(["arch", "runs here?"], rows))
