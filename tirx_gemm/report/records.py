"""Measured results as data: JSONL records per device, and the README table made from them.

One record is one run of one step at one shape on one GPU (the dict that runner.run_step
returns). Records are appended, never edited, to ``results/<device-slug>.jsonl`` (one JSON
object a line). The full results table is generated from them by :func:`render_table` and
written between the ``<!-- results:begin -->`` / ``<!-- results:end -->`` markers of the
site's results page (docs/pages/results.md); the README gets a short summary
(:func:`render_summary`) and the path table's verdict cells (:func:`path_cells`). Nothing here parses printed output, and nothing here imports tvm or the
step registry: the caller passes the list of steps in.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import textwrap
from pathlib import Path
from typing import Iterable, Sequence

from tirx_gemm import spec
from tirx_gemm.report import tables

__all__ = [
    "BEGIN_MARKER",
    "END_MARKER",
    "PATH_BEGIN",
    "PATH_END",
    "SUMMARY_BEGIN",
    "SUMMARY_END",
    "path_cells",
    "render_summary",
    "between_markers",
    "NO_SM100_GPU",
    "NOT_MEASURED",
    "REQUIRED_KEYS",
    "device_slug",
    "record_dtype",
    "record_key",
    "record_problem",
    "sim_checks",
    "append_record",
    "load_records",
    "latest_by_key",
    "render_table",
    "replace_between_markers",
    "update_readme",
]

BEGIN_MARKER = "<!-- results:begin -->"
END_MARKER = "<!-- results:end -->"
# the README's path table, from tirx_gemm/registry.py and the records (path_table, below)
PATH_BEGIN = ("<!-- path:begin (generated from tirx_gemm/registry.py and results/ by "
              "scripts/render_results.py) -->")
PATH_END = "<!-- path:end -->"
# the README's short summary of the records (render_summary); the full table (render_table)
# sits between BEGIN_MARKER and END_MARKER on the site's results page, docs/pages/results.md
SUMMARY_BEGIN = "<!-- results-summary:begin (generated from results/ by scripts/render_results.py) -->"
SUMMARY_END = "<!-- results-summary:end -->"
NO_SM100_GPU = "not measured: no sm_100a GPU available"
NOT_MEASURED = "not measured"
REQUIRED_KEYS = ("step", "arch", "M", "N", "K", "device")


def device_slug(name: str) -> str:
    """File-name-safe form of a GPU name: "NVIDIA H200" -> "nvidia-h200"."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    return slug or "unknown-device"


DEFAULT_DTYPE = "float16"  # the operand dtype of a record without "dtype" (all older ones)


def record_dtype(rec: dict) -> str:
    """A record's operand dtype: its "dtype", else float16 (records from before bfloat16)."""
    return str(rec.get("dtype") or DEFAULT_DTYPE)


def record_key(rec: dict) -> tuple:
    """(step, arch, M, N, K, device, dtype): what a newer record of the same run supersedes."""
    return (rec["step"], rec["arch"], int(rec["M"]), int(rec["N"]), int(rec["K"]), rec["device"],
            record_dtype(rec))


def _sanitize(x):
    """NaN/Inf are not JSON: store them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _sanitize(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_sanitize(v) for v in x]
    return x


def append_record(rec: dict, results_dir: str | os.PathLike = "results") -> Path:
    """Append one record to results_dir/<device-slug>.jsonl (created if missing); return it."""
    missing = [k for k in REQUIRED_KEYS if rec.get(k) is None]
    if missing:
        raise ValueError(f"record lacks {', '.join(missing)}")
    clean = _sanitize(rec)
    problem = record_problem(clean)
    if problem:
        raise ValueError(f"refusing to record {rec.get('step')}@{rec.get('arch')}: {problem}")
    line = json.dumps(clean, sort_keys=True, allow_nan=False)
    d = Path(results_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{device_slug(rec['device'])}.jsonl"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    return path


# numbers a record may hold: None (not measured) or a finite number > 0 (>= 0 for errors)
POSITIVE_FIELDS = ("tflops", "torch_tflops", "median_ms", "best_ms", "torch_median_ms",
                   "torch_best_ms", "ratio_to_torch")
NONNEGATIVE_FIELDS = ("rel_err", "seconds")
SIM_CHECKS = {"numsim": ("numsim", ("correct",)),  # check -> (record field, passing verdicts)
              "sync": ("synccheck", ("clean", "accepted review")),
              "race": ("racecheck", ("clean", "accepted review"))}
KNOWN_DTYPES = spec.DTYPES


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def record_problem(rec) -> str | None:
    """What makes ``rec`` unusable as a record, in a few words, or None. Types are checked,
    not guessed: "verified" must be true or false (the string "false" is not a pass),
    TFLOP/s and times finite and positive, and a simulation record must name the checkers
    that ran ("checks") and may claim a pass only with each of their verdicts passing and
    the others "skipped"."""
    if not isinstance(rec, dict):
        return "a record must be a JSON object"
    missing = [k for k in (*REQUIRED_KEYS, "verified") if rec.get(k) is None]
    if missing:
        return f"record lacks {', '.join(missing)}"
    bad = [k for k in ("M", "N", "K") if not _is_int(rec[k]) or rec[k] < 1]
    if bad:
        return (f"{', '.join(bad)} must be positive integers, got "
                + ", ".join(repr(rec[k]) for k in bad))
    for k in ("step", "arch", "device"):
        if not isinstance(rec[k], str) or not rec[k]:
            return f"{k} must be a non-empty string, got {rec[k]!r}"
    for k in ("verified", "checked"):
        if k in rec and not isinstance(rec[k], bool):
            return f"{k} must be true or false, got {rec[k]!r}"
    for k in POSITIVE_FIELDS:
        v = rec.get(k)
        if v is not None and not (_is_number(v) and v > 0):
            return f"{k} must be a finite number > 0 or null, got {v!r}"
    for k in NONNEGATIVE_FIELDS:
        v = rec.get(k)
        if v is not None and not (_is_number(v) and v >= 0):
            return f"{k} must be a finite number >= 0 or null, got {v!r}"
    if rec.get("dtype") is not None and rec["dtype"] not in KNOWN_DTYPES:
        return f"dtype must be one of {', '.join(KNOWN_DTYPES)}, got {rec['dtype']!r}"
    for k in ("kwargs", "build_kwargs", "clocks", "clocks_after_timing"):
        if rec.get(k) is not None and not isinstance(rec[k], dict):
            return f"{k} must be an object, got {rec[k]!r}"
    if rec.get("timestamp") is not None and not isinstance(rec["timestamp"], str):
        return f"timestamp must be a string, got {rec['timestamp']!r}"
    if rec.get("kind") == "numsim":
        return _sim_problem(rec)
    if "suite" in rec:
        return _suite_problem(rec["suite"])
    return None


def _suite_problem(suite) -> str | None:
    """A suite record's "suite" object (bench --suite): which target ran, in which dtype."""
    if not isinstance(suite, dict):
        return f"suite must be an object, got {suite!r}"
    for k in ("target", "dtype"):
        if not isinstance(suite.get(k), str) or not suite[k]:
            return f"suite.{k} must be a non-empty string, got {suite.get(k)!r}"
    if suite["dtype"] not in KNOWN_DTYPES:
        return f"suite.dtype must be one of {', '.join(KNOWN_DTYPES)}, got {suite['dtype']!r}"
    for k in ("name", "file", "model", "layer", "file_sha256"):
        if suite.get(k) is not None and not isinstance(suite[k], str):
            return f"suite.{k} must be a string, got {suite[k]!r}"
    return None


def _sim_problem(rec: dict) -> str | None:
    checks = rec.get("checks")
    if not isinstance(checks, list) or not checks or any(c not in SIM_CHECKS for c in checks):
        return (f"a simulation record must list the checkers that ran in \"checks\" (some of "
                f"{', '.join(SIM_CHECKS)}), got {checks!r}")
    for c, (field, passing) in SIM_CHECKS.items():
        v = rec.get(field)
        if v is not None and not isinstance(v, str):
            return f"{field} must be a string, got {v!r}"
        if c not in checks and v not in (None, "skipped"):
            return f"{field} says {v!r} but \"checks\" does not list {c}"
        if rec["verified"] and c in checks and v not in passing:
            return f"verified is true but {field} is {v!r}"
    return None


def sim_checks(rec: dict) -> tuple[str, ...]:
    """The checkers a (validated) simulation record ran, in SIM_CHECKS order."""
    return tuple(c for c in SIM_CHECKS if c in (rec.get("checks") or ()))


def load_records(results_dir: str | os.PathLike = "results") -> list[dict]:
    """All records of results_dir/*.jsonl, file by file (sorted by name), in file order.

    A line that is not UTF-8 text, not a JSON object, or not a valid record
    (:func:`record_problem`: the keys that identify it, "verified" a real bool, finite
    positive TFLOP/s, a simulation's checkers named) raises ValueError naming the file and
    line: results are data, and a damaged file should be noticed, not skipped.
    """
    d = Path(results_dir)
    if not d.is_dir():
        return []
    records = []
    for path in sorted(d.glob("*.jsonl")):
        if not path.is_file():
            raise ValueError(f"{path}: not a records file (a folder, or not a plain file, "
                             f"named *.jsonl): rename or remove it")
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                where = f"{path}:{lineno}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{where}: not UTF-8 text (byte {e.start}: "
                                     f"{raw[e.start:e.start + 1]!r})") from None
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}: not valid JSON ({e})") from None
                except RecursionError:
                    raise ValueError(f"{where}: nests too deeply to be a record (fix or "
                                     "remove that line)") from None
                problem = record_problem(rec)
                if problem:
                    raise ValueError(f"{where}: {problem} (fix or remove that line)")
                records.append(rec)
    return records


def _when(rec: dict) -> _dt.datetime:
    ts = rec.get("timestamp")
    if ts:
        try:
            t = _dt.datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
            return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)
        except ValueError:
            pass
    return _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)


def latest_by_key(records: Iterable[dict]) -> dict[tuple, dict]:
    """The newest record (by timestamp; on a tie the later one) per record_key."""
    latest: dict[tuple, dict] = {}
    for rec in records:
        key = record_key(rec)
        old = latest.get(key)
        if old is None or _when(rec) >= _when(old):
            latest[key] = rec
    return latest


# --------------------------------------------------------------------------------------
# the README table
# --------------------------------------------------------------------------------------
def shape_label(shape) -> str:
    """(4096, 4096, 4096) -> "4096³"; otherwise "M×N×K"."""
    M, N, K = shape
    if M == N == K:
        return f"{M}³"
    return f"{M}×{N}×{K}"


def _fmt_cell(rec: dict | None) -> str:
    if rec is None:
        return tables.MISSING
    tf, ratio = rec.get("tflops"), rec.get("ratio_to_torch")
    perf = ""
    if tf is not None:
        perf = f"{tf:.1f}"
        if ratio is not None:
            perf += f" ({ratio:.2f}×)"
    if rec.get("verified") is True:
        return f"{perf} ✓" if perf else "✓ (not timed)"
    if not rec.get("checked", True):
        return f"{perf} unchecked" if perf else "unchecked"
    return f"✗ {perf} failed check" if perf else "✗ failed check"


SIM_ARCH = "sm_100a"  # the arch NumSim models


def latest_sim_run(sim_records: Sequence[dict], step_id: str, arch: str = SIM_ARCH) -> list[dict]:
    """A step's latest NumSim run: the newest record per case among the records of the git
    revision that was simulated last (cases dropped from the registry since then and older
    revisions do not count)."""
    mine = [r for r in sim_records if r.get("step") == step_id and r.get("arch") == arch]
    if not mine:
        return []
    newest = max(mine, key=_when)
    latest: dict[tuple, dict] = {}
    for r in mine:
        if r.get("git_sha") != newest.get("git_sha"):
            continue
        key = (int(r["M"]), int(r["N"]), int(r["K"]), json.dumps(r.get("kwargs"), sort_keys=True))
        if key not in latest or _when(r) >= _when(latest[key]):
            latest[key] = r
    return list(latest.values())


def _sim_cell(step_id: str, arch: str, sim_records: Sequence[dict]) -> str:
    """The simulation verdict of one step (its latest NumSim run)."""
    if arch != SIM_ARCH:
        return "n/a (a GPU runs it)"
    run = latest_sim_run(sim_records, step_id, arch)
    if not run:
        return "not simulated"
    newest = max(run, key=_when)
    ok = sum(1 for r in run if r.get("verified") is True)
    when = str(newest.get('timestamp', ''))[:10]  # the run's date (its commit: the record)
    if ok == len(run):
        return f"✓ {ok}/{ok} cases {_claims(run)} ({when})"
    return f"✗ {len(run) - ok} of {len(run)} cases failed ({when})"


def _twin_ran(rec: dict, run: Sequence[dict], check: str) -> bool:
    """A bfloat16 record's protocol checker ran on its float16 twin in the same run (the
    gate gives such a case numsim only: sim.cases.checks_for)."""
    if check == "numsim" or rec.get("dtype") != "bfloat16":
        return False
    plain = {k: v for k, v in (rec.get("kwargs") or {}).items() if k != "dtype"}
    return any(t.get("dtype", "float16") == "float16" and check in sim_checks(t)
               and (t["M"], t["N"], t["K"]) == (rec["M"], rec["N"], rec["K"])
               and {k: v for k, v in (t.get("kwargs") or {}).items() if k != "dtype"} == plain
               for t in run)


def _claims(run: Sequence[dict]) -> str:
    """What every record of a passing run says ran: only checkers all of them ran (a
    bfloat16 case's synccheck and racecheck: on its float16 twin, as the gate runs them)."""
    ran = [c for c in SIM_CHECKS
           if all(c in sim_checks(r) or _twin_ran(r, run, c) for r in run)]
    said = []
    if "numsim" in ran:
        said.append("correct")
    clean = [c for c in ("sync", "race") if c in ran]
    if clean:
        said.append("/".join(clean) + " clean")
    missing = [f"{SIM_CHECKS[c][0]}" for c in SIM_CHECKS if c not in ran]
    text = ", ".join(said) or "passed"
    return text + (f"; not run: {', '.join(missing)}" if missing else "")


DTYPE_LABEL = {"float16": "fp16", "bfloat16": "bf16"}


def _dtype_order(dtype: str) -> tuple:
    return (dtype != DEFAULT_DTYPE, dtype)


def render_table(records: Sequence[dict], steps: Sequence[tuple],
                 shapes: Sequence[tuple] | None = None,
                 sim_records: Sequence[dict] = ()) -> str:
    """Markdown results table.

    ``steps``: (step_id, arch, lesson) tuples, one row each (in the given order; a step
    measured on several GPUs gets one row per GPU). ``shapes``: (M, N, K) columns; default:
    every shape found in the records. Each cell: TFLOP/s (median) and ratio to torch.matmul
    timed in the same run, ✓ when the run passed its check against the fp32 reference. A
    step without records reads "not measured: no sm_100a GPU available" when its arch is
    sm_100a and no sm_100a record exists at all, else "not measured". Operand dtypes are
    never mixed in a cell: with float16 records only the table is as it always was; once a
    bfloat16 record exists a "dtype" column appears and each (step, GPU) gets one row per
    dtype measured (fp16 first).
    """
    latest = list(latest_by_key(records).values())
    # a timed record of a shape is kept even when a later check-only run of it exists
    timed_latest = list(latest_by_key([r for r in records if r.get("tflops") is not None]).values())
    if shapes is None:
        shapes = sorted({(int(r["M"]), int(r["N"]), int(r["K"])) for r in timed_latest})
    shapes = [tuple(int(x) for x in s) for s in shapes]
    archs_measured = {r["arch"] for r in latest}
    split = any(record_dtype(r) != DEFAULT_DTYPE for r in latest)

    def dtype_cell(dt):
        return [DTYPE_LABEL.get(dt, dt)] if split else []

    header = ["step", "arch"] + (["dtype"] if split else []) + [
        "GPU", "simulated on CPU (NumSim)", "checked shapes"] + [
        f"{shape_label(s)} TFLOP/s (× torch)" for s in shapes]
    rows = []
    devices_used: dict[str, dict] = {}
    for step_id, arch, lesson in steps:
        recs = [r for r in latest if r["step"] == step_id and r["arch"] == arch]
        devices = sorted({r["device"] for r in recs})
        if not devices:
            why = NO_SM100_GPU if (arch == "sm_100a" and arch not in archs_measured) \
                else NOT_MEASURED
            rows.append([step_id, arch] + ([None] if split else [])
                        + [why, _sim_cell(step_id, arch, sim_records), None]
                        + [None] * len(shapes))
            continue
        for dev in devices:
            on_dev = [r for r in recs if r["device"] == dev]
            for r in on_dev:
                prev = devices_used.get(dev)
                if prev is None or _when(r) >= _when(prev):
                    devices_used[dev] = r
            for dt in sorted({record_dtype(r) for r in on_dev}, key=_dtype_order):
                mine = [r for r in on_dev if record_dtype(r) == dt]
                timed = {(int(r["M"]), int(r["N"]), int(r["K"])): r for r in timed_latest
                         if r["step"] == step_id and r["arch"] == arch and r["device"] == dev
                         and record_dtype(r) == dt}
                ok = sum(1 for r in mine if r.get("verified") is True)
                checked = f"{ok}/{len(mine)} ✓" + (
                    "" if ok == len(mine) else f", {len(mine) - ok} ✗ failed check")
                rows.append([step_id, arch] + dtype_cell(dt)
                            + [dev, _sim_cell(step_id, arch, sim_records), checked]
                            + [_fmt_cell(timed.get(s)) for s in shapes])

    notes = [
        "",
        "TFLOP/s = 2·M·N·K / median time (CUDA events, after warm-up, inputs rotated past L2); "
        "(× torch) = ratio to torch.matmul (cuBLAS) timed in the same run; "
        "✓ = passed the check against the fp32 torch reference (random and exact small-integer "
        "inputs, output poisoned with NaN before the launch); ✗ = failed it. checked shapes = "
        "distinct shapes whose latest check passed (canonical, test and benchmark shapes of "
        "the registry). simulated on CPU (NumSim) = every simulation case of the step's "
        "latest run (registry shapes chosen to exercise its barrier protocol) executed on "
        "tirx-harness NumSim, a CPU model of sm_100a: numbers correct on random and exact "
        "small-integer inputs, synccheck and racecheck clean (a cell names any checker its "
        "run left out, and claims nothing for it). It proves correctness and "
        "synchronization on a model, not speed and not silicon: no TFLOP/s come from it."
        + (" dtype = operand and output dtype (fp32 accumulation in both); fp16 and bf16 "
           "results are never mixed in one row, and the simulation column is the step's "
           "(all its cases, both dtypes)." if split else ""),
    ]
    for dev in sorted(devices_used):
        r = devices_used[dev]
        bits = [f"compute capability {r.get('capability', '?')}"]
        if r.get("sm_count"):
            bits.append(f"{r['sm_count']} SMs")
        clocks = r.get("clocks") or {}
        if clocks.get("max_sm_mhz"):
            bits.append(f"max SM clock {clocks['max_sm_mhz']} MHz")
        if r.get("driver_version"):
            bits.append(f"driver {r['driver_version']}")
        for key, label in (("torch_version", "torch"), ("tvm_version", "tvm")):
            if r.get(key):
                bits.append(f"{label} {r[key]}")
        ts = r.get("timestamp")
        if ts:
            bits.append(f"latest run {str(ts)[:10]}")
        notes.append(f"- {tables.cell(dev)}: " + ", ".join(bits))
    notes = [textwrap.fill(n, 100, break_long_words=False, break_on_hyphens=False)
             if not n.startswith("- ") else n for n in notes]
    return "\n".join([tables.markdown(header, rows)] + notes) + "\n"


# --------------------------------------------------------------------------------------
# the README's path table cells and results summary
# --------------------------------------------------------------------------------------
REPRESENTATIVE = (4096, 4096, 4096)  # the path table's shape where a step was timed there


def _card(device: str) -> str:
    """"NVIDIA H200" -> "H200": the card, named short."""
    return re.sub(r"^NVIDIA\s+", "", str(device))


def sim_verdict(step_id: str, sim_records: Sequence[dict]) -> str:
    """A step's NumSim verdict in a few words: "✓ 6/6 correct, sync/race clean"."""
    run = latest_sim_run(sim_records, step_id)
    if not run:
        return "not simulated"
    ok = sum(1 for r in run if r.get("verified") is True)
    if ok == len(run):
        return f"✓ {ok}/{ok} {_claims(run)}"
    return f"✗ {len(run) - ok} of {len(run)} failed"


def torch_fraction(step_id: str, arch: str, records: Sequence[dict], fp8: bool = False) -> str:
    """A step's ratio to torch.matmul at one shape: 4096³ where it passed its check and was
    timed there in fp16, else its largest such shape: "0.99× at 4096³ (H200)"."""
    timed = [r for r in latest_by_key(records).values()
             if r["step"] == step_id and r["arch"] == arch and r.get("verified") is True
             and r.get("ratio_to_torch") is not None and record_dtype(r) == DEFAULT_DTYPE]
    if not timed:
        return NOT_MEASURED

    def rank(r):
        shape = (int(r["M"]), int(r["N"]), int(r["K"]))
        return (shape == REPRESENTATIVE, shape[0] * shape[1] * shape[2], _when(r))
    r = max(timed, key=rank)
    what = "; fp8 vs fp16 torch" if fp8 else ""
    return (f"{r['ratio_to_torch']:.2f}× at {shape_label((r['M'], r['N'], r['K']))} "
            f"({_card(r['device'])}{what})")


def path_cells(steps: Sequence, records: Sequence[dict], sim_records: Sequence[dict]) -> dict:
    """{step id: (sm_100a NumSim verdict, sm_90a × torch)} for registry rows (``id``,
    ``arch``, optional ``fp8``); a step without a twin on an arch says so."""
    out: dict[str, tuple[str, str]] = {}
    for sid in dict.fromkeys(s.id for s in steps):
        twins = {s.arch: s for s in steps if s.id == sid}
        sm100 = sim_verdict(sid, sim_records) if SIM_ARCH in twins else "no sm_100a step"
        sm90 = twins.get("sm_90a")
        hopper = (torch_fraction(sid, "sm_90a", records, bool(getattr(sm90, "fp8", False)))
                  if sm90 is not None else "no sm_90a step")
        out[sid] = (sm100, hopper)
    return out


def render_summary(records: Sequence[dict], sim_records: Sequence[dict],
                   page: str = "docs/pages/results.md") -> str:
    """The README's results summary (markdown, every line short): per GPU and for NumSim,
    which steps ran, how many checks passed and when; every figure lives on ``page``."""
    latest = list(latest_by_key(records).values())
    rows = []
    for dev in sorted({r["device"] for r in latest}):
        mine = [r for r in latest if r["device"] == dev]
        newest = max(mine, key=_when)
        steps = sorted({(r["step"], r["arch"]) for r in mine})
        archs = ", ".join(sorted({a for _, a in steps}))
        ok = sum(1 for r in mine if r.get("verified") is True)
        timed = sum(1 for r in mine if r.get("tflops") is not None)
        bits = [f"{newest['sm_count']} SMs" if newest.get("sm_count") else None,
                f"driver {newest['driver_version']}" if newest.get("driver_version") else None,
                f"torch {newest['torch_version']}" if newest.get("torch_version") else None]
        where = tables.cell(dev) + "".join(f", {b}" for b in bits if b)
        rows.append((f"{where} ({archs})", len(steps), f"{ok}/{len(mine)} ✓, {timed} timed",
                     str(newest.get("timestamp", ""))[:10],
                     "TFLOP/s and × torch.matmul per shape"))
    sims = [r for r in sim_records if r.get("arch") == SIM_ARCH]
    if sims:
        runs = [latest_sim_run(sims, sid) for sid in sorted({r["step"] for r in sims})]
        cases = [r for run in runs for r in run]
        ok = sum(1 for r in cases if r.get("verified") is True)
        rows.append((f"NumSim, a CPU model of {SIM_ARCH}", len(runs),
                     f"{ok}/{len(cases)} cases ✓", str(max(cases, key=_when).get(
                         "timestamp", ""))[:10], "correctness and synchronization, no speed"))
    table = tables.markdown(("where it ran", "steps", "checks", "latest run", "what it shows"),
                            rows)
    return (table + f"\n\nEvery step at every shape, with each check and timing: the site's "
            f"results page,\n[{page}]({page}), generated from the same records.\n")


def replace_between_markers(text: str, table_md: str, begin: str = BEGIN_MARKER,
                            end: str = END_MARKER) -> str:
    """``text`` with everything between ``begin`` and ``end`` (the results markers by
    default) replaced by ``table_md``."""
    nb, ne = text.count(begin), text.count(end)
    if nb != 1 or ne != 1:
        raise ValueError(f"expected exactly one {begin} and one {end}, "
                         f"found {nb} and {ne}")
    b, e = text.index(begin), text.index(end)
    if e < b:
        raise ValueError(f"{end} comes before {begin}")
    head = text[: b + len(begin)]
    tail = text[e:]
    return f"{head}\n{table_md.strip()}\n{tail}"


def between_markers(text: str, begin: str, end: str) -> str:
    """What ``text`` holds between ``begin`` and ``end`` (stripped); ValueError when the
    markers are missing or out of order."""
    b, e = text.find(begin), text.find(end)
    if b < 0 or e < b:
        raise ValueError(f"markers {begin} ... {end} missing or out of order")
    return text[b + len(begin):e].strip()


def update_readme(readme_path: str | os.PathLike, table_md: str) -> bool:
    """Write table_md between the markers of the README; return True if the file changed."""
    path = Path(readme_path)
    text = path.read_text(encoding="utf-8")
    new = replace_between_markers(text, table_md)
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def _step_number(step_id: str) -> int:
    digits = "".join(c for c in step_id if c.isdigit())
    return int(digits) if digits else 0


def path_table(steps, records=None, sim_records=None) -> str:
    """The README's path table (markdown, no trailing newline): one row per step id in step
    order: its idea (registry ``idea``), the sm_100a twin's NumSim verdict and the sm_90a
    twin's ratio to torch.matmul at one shape, with its card (records.path_cells). The
    records default to the repository's results/ (results/sim/ for NumSim)."""
    if records is None or sim_records is None:
        results = Path(__file__).resolve().parents[2] / "results"
        records = load_records(results) if records is None else records
        sim_records = load_records(results / "sim") if sim_records is None else sim_records
    cells = path_cells(steps, records, sim_records)
    ideas = {s.id: s.idea for s in steps}
    rows = [(sid, ideas[sid]) + cells[sid]
            for sid in sorted(cells, key=lambda i: (_step_number(i), i))]
    return tables.markdown(("step", "idea", "sm_100a: NumSim (CPU model)",
                     "sm_90a: × torch.matmul (cuBLAS)"), rows)
