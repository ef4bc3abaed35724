"""Per-step regression checks.

GPU level (``tirx-gemm regress``): every step of the present GPU's arch at its benchmark
shapes must pass its correctness check and reach at least ``baseline x (1 - tolerance)``
TFLOP/s, where the baseline is a per-device file under ``goldens/baselines/``. A GPU with no
baseline gets one recorded from the run (and is told so).

CPU level (``tirx-gemm regress --cpu``, run by CI): every step of both arches is compiled
and its registers, shared memory, spills, threads per CTA, setmaxnreg split and key SASS
instruction counts are compared with the committed expectations in
``goldens/expectations/build.json``, failing with a readable diff.

This module imports without TVM (the GPU side runs on hosts without the compiler).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from pathlib import Path

from tirx_gemm.report import tables
from tirx_gemm.report.jsonfile import load_object
from tirx_gemm.registry import Step
from tirx_gemm.compile.regbudget import launch_threads, setmaxnreg_split
from tirx_gemm.compile.sass import KEY_SASS

DEFAULT_TOLERANCE = 0.15
BASELINE_DIR = Path("goldens") / "baselines"
EXPECTATIONS = Path("goldens") / "expectations" / "build.json"


def shape_key(M: int, N: int, K: int) -> str:
    return f"{M}x{N}x{K}"


def bench_plan(steps: list[Step]) -> list[tuple[Step, tuple[int, int, int]]]:
    """(step, shape) pairs a regression run measures: bench shapes, else the canonical one
    (the same shapes `tirx-gemm bench` and `export --shapes bench` use)."""
    from tirx_gemm.bundle_format import shapes_for
    return [(s, mnk) for s in steps for mnk in shapes_for(s, "bench")]


# ---------------------------------------------------------------------------------------
# GPU level
# ---------------------------------------------------------------------------------------
def baseline_path(device_name: str, baseline_dir: Path = BASELINE_DIR) -> Path:
    from tirx_gemm.report.records import device_slug
    return Path(baseline_dir) / f"{device_slug(device_name)}.json"


_KEY = re.compile(r"[A-Za-z0-9_]+@[A-Za-z0-9_]+:[0-9]+x[0-9]+x[0-9]+")


def load_baseline(path: Path) -> dict | None:
    """The baseline at ``path`` (None if there is none), checked entry by entry (ValueError
    naming the file and entry): the CLI reads it before any GPU work."""
    path = Path(path)
    if not path.exists():
        return None
    data = load_object(path, "a baseline file")
    if not isinstance(data.get("entries"), dict):
        raise ValueError(f"{path}: not a baseline file (no 'entries' object)")
    for key, entry in data["entries"].items():
        tf = entry.get("tflops") if isinstance(entry, dict) else None
        if not (isinstance(tf, (int, float)) and not isinstance(tf, bool)
                and math.isfinite(tf) and tf > 0):
            raise ValueError(f"{path}: entry {key!r} needs a finite tflops > 0, got "
                             f"{entry!r}; fix it or re-record with `tirx-gemm regress "
                             "--update-baseline`")
        if not _KEY.fullmatch(key):
            raise ValueError(f"{path}: entry {key!r} is not step@arch:MxNxK")
    return data


_INT_FIELDS = ("registers", "smem_bytes", "spills")


def load_expectations(path: Path) -> dict | None:
    """The build expectations at ``path`` (None if there is none), checked entry by entry
    against what :func:`build_snapshot` writes: a one-line ValueError naming the file and
    the entry. `regress --cpu` (and its --update, before anything is written) reads it
    before any build."""
    path = Path(path)
    if not path.exists():
        return None
    fix = "; fix it, or delete it and run `tirx-gemm regress --cpu --update`"
    data = load_object(path, "a build expectations file", fix)
    for key, entry in data.items():
        problem = _expectation_problem(key, entry)
        if problem:
            raise ValueError(f"{path}: entry {key!r} {problem}{fix}")
    return data


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _expectation_problem(key: str, entry) -> str | None:
    if not _KEY.fullmatch(key):
        return "is not step@arch:MxNxK"
    if not isinstance(entry, dict):
        return f"is not an object ({entry!r:.60})"
    bad = [f for f in _INT_FIELDS if not _count(entry.get(f))]
    if bad:
        return f"needs {', '.join(bad)} as counts >= 0"
    if entry.get("threads") is not None and not _count(entry["threads"]):
        return "has threads that is not a count"
    split = entry.get("setmaxnreg")
    if split is not None and not (isinstance(split, dict) and all(
            isinstance(v, list) and all(map(_count, v)) for v in split.values())):
        return "has setmaxnreg that is not {dec: [...], inc: [...]} of counts"
    sass = entry.get("sass", {})
    if not (isinstance(sass, dict) and all(map(_count, sass.values()))):
        return "has sass that is not {opcode: count}"
    return None


def baseline_from_records(records: list[dict], device: dict) -> dict:
    entries = {}
    for r in records:
        if r.get("verified") and r.get("tflops"):
            entries[f"{r['step']}@{r['arch']}:{shape_key(r['M'], r['N'], r['K'])}"] = {
                "tflops": round(r["tflops"], 3),
                "ratio_to_torch": r.get("ratio_to_torch"),
                "git_sha": r.get("git_sha"),
            }
    return {"device": device.get("name"), "capability": device.get("capability"),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "note": "floor = tflops x (1 - tolerance); regenerate with "
                    "`tirx-gemm regress --update-baseline` after an intended change",
            "entries": entries}


def evaluate(records: list[dict], baseline: dict | None, tolerance: float) -> list[dict]:
    """One verdict per record: ok / FAIL with the reason. A wrong result always fails; a
    verified result fails when it is below its floor; no baseline entry -> 'new'."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance={tolerance} must be in [0, 1)")
    entries = (baseline or {}).get("entries", {})
    out = []
    for r in records:
        key = f"{r['step']}@{r['arch']}:{shape_key(r['M'], r['N'], r['K'])}"
        base = entries.get(key)
        floor = base["tflops"] * (1 - tolerance) if base else None
        tf = r.get("tflops")
        if not r.get("verified"):
            status, why = "FAIL", "wrong result: " + _check_reason(r)
        elif tf is None:
            status, why = "FAIL", "not timed"
        elif floor is None:
            status, why = "new", "no baseline entry"
        elif tf < floor:
            status, why = "FAIL", f"{tf:.1f} TFLOP/s < floor {floor:.1f} (baseline {base['tflops']:.1f})"
        else:
            status, why = "ok", ""
        out.append({"key": key, "step": r["step"], "arch": r["arch"],
                    "shape": shape_key(r["M"], r["N"], r["K"]), "tflops": tf,
                    "ratio_to_torch": r.get("ratio_to_torch"),
                    "baseline": base["tflops"] if base else None, "floor": floor,
                    "status": status, "why": why})
    return out


def _check_reason(r: dict) -> str:
    for c in r.get("check") or []:
        if not c.get("ok"):
            return c.get("reason") or f"{c.get('n_mismatch')} mismatches ({c.get('kind')} inputs)"
    return "check failed"


def format_verdicts(verdicts: list[dict]) -> str:
    f = tables.fmt
    rows = [[v["step"], v["arch"], v["shape"], f(v["tflops"], ".1f"), f(v["baseline"], ".1f"),
             f(v["floor"], ".1f"), f(v["ratio_to_torch"], ".3f"),
             v["status"] + (f" ({v['why']})" if v["why"] else "")] for v in verdicts]
    return tables.text(["step", "arch", "M x N x K", "TFLOP/s", "baseline", "floor",
                        "x torch", "status"], rows, "<<<>>>><")


# ---------------------------------------------------------------------------------------
# CPU level: build expectations
# ---------------------------------------------------------------------------------------
def build_snapshot(results) -> dict:
    """{step@arch:MxNxK: {registers, smem_bytes, spills, threads, setmaxnreg, sass:
    {opcode: count}}}: ``threads`` from the launch bounds, ``setmaxnreg`` the
    {"dec": [...], "inc": [...]} register counts its warpgroups ask for (None without)."""
    snap = {}
    for r in results:
        snap[f"{r.step}@{r.arch}:{shape_key(r.M, r.N, r.K)}"] = {
            "registers": r.registers, "smem_bytes": r.smem_bytes,
            "spills": r.spill_stores + r.spill_loads,
            "threads": launch_threads(r.cuda_source),
            "setmaxnreg": setmaxnreg_split(r.cuda_source),
            "sass": {k: v for k, v in r.key_sass().items() if k in KEY_SASS}}
    return snap


def diff_snapshot(expected: dict, actual: dict) -> list[str]:
    """Readable differences; empty when the builds match the expectations."""
    lines = []
    for key in sorted(set(expected) | set(actual)):
        if key not in actual:
            lines.append(f"{key}: expected but not built")
            continue
        if key not in expected:
            lines.append(f"{key}: built but has no expectation (run `tirx-gemm regress --cpu "
                         f"--update`)")
            continue
        e, a = expected[key], actual[key]
        for field in ("registers", "smem_bytes", "spills", "threads", "setmaxnreg"):
            if e.get(field) != a.get(field):
                lines.append(f"{key}: {field} {e.get(field)} -> {a.get(field)}")
        es, as_ = e.get("sass", {}), a.get("sass", {})
        for op in sorted(set(es) | set(as_)):
            if es.get(op, 0) != as_.get(op, 0):
                lines.append(f"{key}: SASS {op} x{es.get(op, 0)} -> x{as_.get(op, 0)}")
    return lines


def cpu_requests(steps: list[Step]):
    return [(s, s.canonical, {}) for s in steps]
