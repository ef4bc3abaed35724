"""The shape suite (tirx_gemm/op/suites/models.json): what matmul picks, and how it measured."""

from __future__ import annotations

import io

from tirx_gemm.report import records
from tirx_gemm.notebook.display import Md, Png, _shape, _table
from tirx_gemm.notebook.results import results_dir
from tirx_gemm.notebook.steps import _rel


def _default_sm_count() -> int:
    """The SM count ``matmul.choose`` plans for by default (its default card's)."""
    from tirx_gemm.op import cards
    return cards.resolve(None).sms


def _kw(kwargs: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(kwargs.items()) if k != "dtype") or "-"


def suite_cases(arch: str = "sm_90a", sm_count: int | None = None, path=None) -> Md:
    """The shape suite (default: the packaged models.json), one row per shape, with the step
    and keywords ``tirx_gemm.matmul`` picks for it on a GPU of ``arch`` with ``sm_count``
    SMs (default: matmul.choose's, the H200's 132). Planning only: no GPU, no timing."""
    from tirx_gemm.op import suite as S
    st = S.load_suite(path)
    n = sm_count or _default_sm_count()
    picks: dict = {}
    for (e, dtype), it in zip(st.cases(), S.plan(st, S.MATMUL, arch, n)):
        picks.setdefault(e.shape, {})[dtype] = f"{it.step.id} {_kw(it.kwargs)}".strip()
    rows = []
    for e in st.entries:
        choice = sorted(set(picks[e.shape].values()))
        rows.append([_shape(e.shape), e.model, e.layer,
                     ", ".join(records.DTYPE_LABEL.get(d, d) for d in e.dtypes),
            "; ".join(choice) if len(choice) == 1 else "; ".join(
                f"{records.DTYPE_LABEL.get(d, d)}: {c}" for d, c in picks[e.shape].items())])
    return Md(f"Suite `{st.name}` ({len(st.entries)} shapes, {len(st.cases())} cases; "
              f"`{_rel(st.path)}`). The last column is what `tirx_gemm.matmul` would run on "
              f"{arch} with {n} SMs (`matmul.choose`, computed now; nothing is timed here):\n\n"
              + _table(["M x N x K", "model", "layer", "dtypes", "matmul runs"], rows))


def _suite_latest(suite_name: str) -> dict:
    """(device, target, (M, N, K), dtype) -> the newest record of the suite run, from
    results/suites/*.jsonl (records carry a "suite" field: name, target, dtype, ...)."""
    recs = [r for r in records.load_records(results_dir() / "suites")
            if isinstance(r.get("suite"), dict) and r["suite"].get("name") == suite_name]
    recs.sort(key=lambda r: str(r.get("timestamp", "")))  # ISO UTC stamps; stable on ties
    out = {}
    for r in recs:
        out[(r["device"], r["suite"].get("target"), (int(r["M"]), int(r["N"]), int(r["K"])),
             r["suite"].get("dtype") or records.record_dtype(r))] = r
    return out


def suite_ratios(before: str | None = None, after: str | None = None, path=None) -> dict:
    """The suite's recorded ratios to torch.matmul (timed in the same run), per GPU: before
    (``before``, default the data-parallel step matmul falls back to, v9 alone) and after
    (``after``, default "matmul": the step matmul picks per shape). Returns {"suite": name,
    "before": target, "after": target, "devices": {device: [row, ...]}}, a row per suite
    case with at least one record: {"label", "shape", "dtype", "model", "before", "after"},
    each side the record or None. Nothing is estimated: no record, no row."""
    from tirx_gemm import matmul
    from tirx_gemm.op import suite as S
    st = S.load_suite(path)
    before = before or matmul.DATA_PARALLEL
    after = after or S.MATMUL
    latest = _suite_latest(st.name)
    devices = sorted({k[0] for k in latest if k[1] in (before, after)})
    out = {}
    for dev in devices:
        rows = []
        for e, dtype in st.cases():
            b = latest.get((dev, before, e.shape, dtype))
            a = latest.get((dev, after, e.shape, dtype))
            if b is None and a is None:
                continue
            rows.append({"label": f"{e.label} {records.DTYPE_LABEL.get(dtype, dtype)}",
                         "shape": e.shape, "dtype": dtype, "model": e.model,
                         "before": b, "after": a})
        out[dev] = rows
    return {"suite": st.name, "before": before, "after": after, "devices": out}


def _ratio(rec) -> float | None:
    if rec is None or not rec.get("verified"):
        return None
    r = rec.get("ratio_to_torch")
    return float(r) if isinstance(r, (int, float)) and r > 0 else None


def _suite_text(data: dict) -> str:
    from tirx_gemm.op import suite as S
    parts = []
    for dev, rows in data["devices"].items():
        def cell(rec):
            if rec is None:
                return "not run"
            if not rec.get("verified"):
                return "FAIL (check)"
            r = _ratio(rec)
            return "—" if r is None else f"{r:.2f}x"
        table = _table(["case", "model", f"before: {data['before']}", f"after: {data['after']}",
                        "after runs"],
                       [[r["label"], r["model"], cell(r["before"]), cell(r["after"]),
                         "" if r["after"] is None else
                         f"{r['after']['step']} {_kw(r['after'].get('build_kwargs') or {})}"]
                        for r in rows])
        lines = []
        for side in ("before", "after"):
            s = S.summarize([r[side] for r in rows if r[side] is not None])
            lines.append(f"- {side} ({data[side]}): " + (
                f"geomean {s['geomean_ratio']:.3f}x torch, min {s['min_ratio']:.3f}x "
                f"({s['min_case']}), over {s['n']} checked and timed case(s)" if s["n"]
                else "no checked and timed case"))
        parts.append(f"**{dev}**, suite `{data['suite']}`, ratio to torch.matmul timed in "
                     "the same run:\n\n" + table + "\n\n" + "\n".join(lines))
    return "\n\n".join(parts)


def _no_suite_records(data: dict) -> Md:
    return Md(f"**No H200 suite records yet:** `{_rel(results_dir() / 'suites')}/` holds no "
              f"record of suite `{data['suite']}` run as `{data['before']}` or "
              f"`{data['after']}` (they come from `tirx-gemm bench --suite --target T --record` "
              "on a GPU host, once per target). Nothing is plotted: no number here is estimated.")


def suite_plot(before: str | None = None, after: str | None = None, path=None):
    """Ratio to torch.matmul over the shape suite, before (v9 alone) and after (what
    matmul picks), one panel per GPU, from the recorded suite runs (``suite_ratios``).
    A PNG with matplotlib, else the table; without records, a message saying so."""
    data = suite_ratios(before, after, path)
    if not any(data["devices"].values()):
        return _no_suite_records(data)
    text = _suite_text(data)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return Md("matplotlib is not installed (`pip install -e '.[plot]'`): the recorded "
                  "suite results as a table instead.\n\n" + text)
    devs = [d for d, rows in data["devices"].items() if rows]
    width = max(8.0, 0.28 * max(len(data["devices"][d]) for d in devs) + 2)
    fig = Figure(figsize=(width, 3.6 * len(devs)), dpi=100)
    FigureCanvasAgg(fig)
    for i, dev in enumerate(devs):
        rows = data["devices"][dev]
        ax = fig.add_subplot(len(devs), 1, i + 1)
        xs = range(len(rows))
        for side, marker, color in (("before", "o", "tab:gray"), ("after", "D", "tab:orange")):
            pts = [(x, _ratio(r[side])) for x, r in zip(xs, rows) if _ratio(r[side])]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=22,
                           color=color, zorder=3, label=f"{side}: {data[side]}")
        ax.axhline(1.0, color="black", lw=0.8, ls="--", label="torch.matmul")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["label"] for r in rows], rotation=75, fontsize=7)
        ax.set_ylabel("ratio to torch (higher is better)")
        ax.set_title(f"{dev}: suite {data['suite']}, ratio to torch.matmul timed in the same "
                     "run", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return Png(buf.getvalue(), text)


# the CUDA-graph run of matmul over the suite the chooser table reads (lab/tools/
# matmul_graph_times.py, here via lab/tools/h200_ab.sh's FULL), and torch.matmul's
# kernels per suite shape as the profiler saw them (lab/cublas_kernels/cublas_kernels.py). The run
# is the interleaved timing's (both graphs warmed up, then replayed alternately; a shape's
# last record is the one shown, the second pass where a run has two): README, "order
# bias". A run is a file under lab/ and the fields its records must have; this run
# times this package ("chooser": "new") beside the one before ("old"), one pass
CHOOSER_RUN = ("lab/models_suite_against_torch/records/matmul_graph_h200_15.jsonl", {"suite": "models", "chooser": "new"})
# real-model shapes never used to fit or tune the chooser (the held-out suite,
# tirx_gemm/op/suites/heldout.json)
HELDOUT_RUN = ("lab/models_suite_against_torch/records/matmul_graph_h200_15.jsonl", {"suite": "heldout", "chooser": "new"})
CUBLAS_KERNELS = "lab/cublas_kernels/records/cublas_kernels_h200.jsonl"


def _lines(path) -> list[dict]:
    """The JSON objects of a lab JSON-lines file, in order; none when it is missing."""
    import json
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _how_chosen(step_id: str, kw: dict) -> tuple[str, str | None]:
    """(the rule or "model" that picked ``step_id, kw``, the chooser candidate it predicts
    for, or None where the pick is a rule's with no fitted figures)."""
    from tirx_gemm.op import cost_model as chooser
    if step_id in (chooser.V9, chooser.V10):
        return ("model" if step_id == chooser.V9 else "ping-pong rule / model"), step_id
    if kw.get("SPLIT_K", 1) > 1:
        if kw.get("SWAP_AB"):
            return "swap-AB split rule", None
        return "split model", f"split:{kw['BLK_M']}x{kw['BLK_N']}s{kw['SPLIT_K']}"
    if kw.get("SWAP_AB"):
        return ("swap-AB non-persistent rule" if "SPLIT_K" in kw else "swap-AB rule"), None
    cand = chooser.name(kw["BLK_M"], kw["BLK_N"], kw.get("CLUSTER", 1))
    return ("pair rule" if kw.get("CLUSTER", 1) > 1 else "model"), cand


def _cublas_label(names) -> str:
    """"nvjet 64x8 16 stages 2x1 splitK + reduce" from the profiler's kernel names."""
    import re
    main = next((n for n in names if "nvjet" in n), None)
    if main is None:
        return ", ".join(n.split("(")[0][:40] for n in names) or "-"
    m = re.search(r"tst_(\d+x\d+)_64x(\d+)_(\d+x\d+)", main)
    text = f"nvjet {m[1]}, {m[2]} stages, cluster {m[3]}" if m else main.split(" x")[0]
    if "splitK" in main:
        text += ", split-K" + (" + reduce kernel" if any("splitKreduce" in n for n in names)
                               else "")
    return text


def chooser_table(dtype: str = "bfloat16", run: str | tuple | None = None) -> Md:
    """Per suite shape (H200 records): what matmul picks now (``matmul.choose``) and why (the
    cost model or which rule), what the model predicts for it (its fitted figures; a rule's
    pick has none), what it measured in the recorded CUDA-graph run (``CHOOSER_RUN``; a
    pick that has changed since that run is marked, its figure then being the older
    kernel's), and the kernel torch.matmul (cuBLAS) launched at the shape."""
    from tirx_gemm import matmul
    from tirx_gemm.op import cost_model as chooser
    run = run or CHOOSER_RUN
    name, where = run if isinstance(run, tuple) else (run, {})
    path = results_dir().parent / name
    meas = {(r["M"], r["N"], r["K"]): r for r in _lines(path)
            if r.get("dtype") == dtype and r.get("ok")
            and all(r.get(k) == v for k, v in where.items())}
    cub_path = results_dir().parent / CUBLAS_KERNELS
    cub = {(r["M"], r["N"], r["K"]): r["kernels"] for r in _lines(cub_path)
           if r.get("dtype") == dtype}
    if not meas:
        return Md(f"**No recorded run:** `{_rel(path)}` is missing; nothing is estimated.")
    rows = []
    for (M, N, K), r in meas.items():
        step_id, kw = matmul.choose(M, N, K, dtype, "sm_90a", _default_sm_count())
        how, cand = _how_chosen(step_id, kw)
        if cand and cand.startswith("split:"):  # the split model's own prediction
            bm, bn, split = (int(x) for x in cand[6:].replace("s", "x").split("x"))
            t = chooser.predict_split(bm, bn, split, M, N, K)
            pred = f"{t:.1f}" if t is not None else "-"
        else:
            # a cluster of four has no fitted figures: the rule ranks its one-CTA tile
            pred = (f"{chooser.predict(cand, M, N, K):.1f}" if cand in chooser.params()
                    else "-")
        same = r.get("step") == step_id and (r.get("kwargs") or {}) == kw
        got = f"{r['ms'] * 1e3:.1f}" + ("" if same else " (older pick)")
        rows.append([_shape((M, N, K)), f"{step_id} {_kw(kw)}", how, pred, got,
                     f"{r['torch_ms'] * 1e3:.1f}", f"{r['ratio']:.2f}",
                     _cublas_label(cub.get((M, N, K), ()))])
    how_timed = ("alternating with torch.matmul's after a warm-up"
                 if any(r.get("timing") == "interleaved" for r in meas.values())
                 else "torch.matmul's graph timed first, in the same run")
    return Md(f"`tirx_gemm.matmul`'s choice per suite shape ({dtype}, 132 SMs), the model's "
              f"prediction and the H200 measurement (GPU time per call from CUDA-graph "
              f"replays, {how_timed}: `{_rel(path)}`), beside the "
              f"kernel torch.matmul launched (`{_rel(cub_path)}`):\n\n"
              + _table(["M x N x K", "matmul runs", "chosen by", "predicted us",
                        "measured us", "torch us", "x torch", "torch.matmul's kernel"], rows))
