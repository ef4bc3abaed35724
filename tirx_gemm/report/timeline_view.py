"""A recorded timeline buffer read back: records, spans, window kept, Chrome trace, summary.

The report side of :mod:`tirx_gemm.timeline` (numpy; never TVM, never torch; the buffer
format and the event codes are defined there, with the hooks that write them):
:func:`decode` reads a buffer back (a torch tensor or a numpy array of int64 words),
:func:`spans` pairs its records, :func:`focus` picks the window kept in the repository
(the first two clusters' CTAs around CTA 0's first tile boundary), :func:`chrome_trace`
and :func:`write_chrome_trace` write Chrome trace-event JSON (ui.perfetto.dev opens it) and
:func:`summary` describes the whole run. The Gantt chart, the three files of a trace and
the recorded traces a notebook shows are in :mod:`tirx_gemm.report.timeline_files`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from pathlib import Path

from tirx_gemm.timeline import (BEGIN, CTA, EMPTY_WAIT, END, EPILOGUE, FORMAT, HEADER_WORDS,
                                KINDS, MAGIC, POINT, PRODUCER, RECORD_WORDS, ROLES, SCHED,
                                STORE, UNNAMED, WGMMA, tile_of)


class TimelineError(ValueError):
    """A buffer that is not a timeline of this format."""


@dataclasses.dataclass(frozen=True)
class Record:
    cta: int
    role: int
    kind: int
    edge: int
    arg: int
    sm: int
    t_ns: int


@dataclasses.dataclass
class Timeline:
    grid: int            # CTAs the kernel launched
    roles: int
    cap: int
    t0_ns: int           # the earliest record (all times below are relative to it)
    records: list        # [Record], per lane in the order written
    truncated: list      # [(cta, role)] lanes that filled up (later events dropped)
    lane_ctas: int = 0   # CTAs the buffer has lanes for (a larger grid's rest is missing)


def _as_words(buf):
    import numpy as np
    if hasattr(buf, "detach"):  # a torch tensor, on any device
        buf = buf.detach().cpu().numpy()
    return np.asarray(buf).astype(np.int64, copy=False).reshape(-1)


def decode(buf) -> Timeline:
    """The records of a timeline buffer (torch tensor or numpy array of int64 words)."""
    import numpy as np
    w = _as_words(buf)
    if w.size < HEADER_WORDS or int(w[0]) != MAGIC:
        raise TimelineError("not a timeline buffer (no header: did the kernel run, and was it "
                            "an instrumented build?)")
    if int(w[1]) != FORMAT:
        raise TimelineError(f"timeline format {int(w[1])}, this tirx-gemm reads {FORMAT}")
    grid, roles, cap, header = (int(x) for x in w[2:6])
    if header != HEADER_WORDS or roles < 1 or cap < 1:
        raise TimelineError(f"timeline header is damaged ({w[:HEADER_WORDS].tolist()})")
    body = w[header:]
    lanes = body.size // (RECORD_WORDS * cap)
    if lanes < 1:
        raise TimelineError("timeline buffer holds no lane")
    rec = body[: lanes * cap * RECORD_WORDS].reshape(lanes, cap, RECORD_WORDS)
    t, meta = rec[..., 0], rec[..., 1]
    used = t != 0
    records, truncated = [], []
    for lane in np.nonzero(used.any(axis=1))[0]:
        cta, role = divmod(int(lane), roles)
        if cta >= grid:
            continue
        idx = np.nonzero(used[lane])[0]
        if used[lane, cap - 1]:  # its writer's cursor reached the end: later events dropped
            truncated.append((cta, role))
        for i, m in zip(idx.tolist(), meta[lane, idx].tolist()):
            records.append(Record(cta=cta, role=role, kind=m & 0xFF, edge=(m >> 8) & 0x3,
                                  arg=m >> 32, sm=(m >> 16) & 0xFF, t_ns=int(t[lane, i])))
    t0 = min((r.t_ns for r in records), default=0)
    return Timeline(grid=grid, roles=roles, cap=cap, t0_ns=t0, records=records,
                    truncated=truncated, lane_ctas=lanes // roles)


@dataclasses.dataclass(frozen=True)
class Span:
    cta: int
    sm: int
    role: int
    kind: int
    arg: int
    start_ns: int    # relative to Timeline.t0_ns
    dur_ns: int      # 0 for a point event
    point: bool = False


def spans(tl: Timeline) -> tuple[list, list]:
    """(spans, unmatched): the records of each lane and kind paired. An end closes the open
    begin of the same arg, else the oldest open one; a drain closes the oldest open ones
    until ``arg`` remain; a begin written with arg UNNAMED takes its end's arg. Points
    become spans of duration 0 with ``point=True``. Unmatched records (a begin never
    closed, an end never opened, a lane cut short) are returned apart."""
    out, unmatched = [], []
    open_: dict = {}

    def close(hit, r):
        arg = r.arg if hit.arg == UNNAMED and r.edge == END else hit.arg
        out.append(Span(r.cta, hit.sm, r.role, r.kind, arg, hit.t_ns - tl.t0_ns,
                        max(r.t_ns - hit.t_ns, 0)))

    for r in tl.records:  # per lane in the order written, so begins precede their ends
        key = (r.cta, r.role, r.kind)
        if r.edge == POINT:
            out.append(Span(r.cta, r.sm, r.role, r.kind, r.arg, r.t_ns - tl.t0_ns, 0, True))
        elif r.edge == BEGIN:
            open_.setdefault(key, []).append(r)
        elif r.edge == END:
            stack = open_.get(key) or []
            hit = next((b for b in stack if b.arg == r.arg), stack[0] if stack else None)
            if hit is None:
                unmatched.append(r)
                continue
            stack.remove(hit)
            close(hit, r)
        else:  # DRAIN: a wait_group arg returned
            stack = open_.get(key) or []
            while len(stack) > max(r.arg, 0):
                close(stack.pop(0), r)
    for stack in open_.values():
        unmatched.extend(stack)
    out.sort(key=lambda s: (s.cta, s.role, s.start_ns))
    return out, unmatched


def kind_name(kind: int) -> str:
    return KINDS.get(kind, (f"kind{kind}",))[0]


def _event_name(s: Span) -> str:
    name = kind_name(s.kind)
    if s.kind == EPILOGUE and s.arg >= 0:
        r, c = tile_of(s.arg)
        return f"{name} tile ({r}, {c})"
    if s.kind == WGMMA:
        return f"{name} (first slice)" if s.arg == 0 else name
    if s.kind in (CTA, STORE):
        return name
    return f"{name} {s.arg}"


@dataclasses.dataclass(frozen=True)
class Focus:
    """The part of a run kept in the repository: some CTAs, a time window (ns since the
    run's first record) around ``center_ns``, CTA 0's first tile boundary."""
    ctas: tuple
    lo_ns: int
    hi_ns: int
    center_ns: int
    why: str

    def holds(self, s: Span) -> bool:
        return (s.cta in self.ctas and s.start_ns <= self.hi_ns
                and s.start_ns + s.dur_ns >= self.lo_ns)


def focus(tl: Timeline, sp: list | None = None, *, ctas: int = 4, half_slices: int = 16,
          min_half_ns: int = 3_000, max_half_ns: int = 40_000) -> Focus:
    """The first ``ctas`` CTAs (4: the first two clusters of the clustered steps) around
    CTA 0's first tile boundary, the begin of its first epilogue (in v9 that epilogue runs
    under the next tile's first wgmmas, in v10 under the other warpgroup's mainloop):
    ``half_slices`` K steps (the median spacing of CTA 0's wgmma issues) on either side,
    clamped to [min_half_ns, max_half_ns]."""
    sp = spans(tl)[0] if sp is None else sp
    ids = tuple(sorted({s.cta for s in sp})[:max(ctas, 1)])
    if not ids:
        return Focus((), 0, 0, 0, "no events")
    first = [s for s in sp if s.cta == ids[0]]
    epi = sorted(s.start_ns for s in first if s.kind == EPILOGUE and not s.point)
    if epi:
        center, why = epi[0], f"CTA {ids[0]}'s first epilogue"
    else:
        ts = sorted(s.start_ns for s in first)
        center, why = ts[len(ts) // 2], f"the middle of CTA {ids[0]}'s events"
    lanes = sorted({s.role for s in first if s.kind == WGMMA})
    issues = sorted(s.start_ns for s in first if s.kind == WGMMA and lanes
                    and s.role == lanes[0])
    gaps = [b - a for a, b in zip(issues, issues[1:]) if b > a]
    period = statistics.median(gaps) if gaps else 1_000
    half = int(min(max(half_slices * period, min_half_ns), max_half_ns))
    return Focus(ids, max(center - half, 0), center + half, center, why)


def chrome_trace(tl: Timeline, meta: dict | None = None, *, keep: Focus | None = None,
                 sp: list | None = None) -> dict:
    """Chrome trace-event JSON (a dict): one process per CTA (named with its SM), one
    thread per role, 'X' events with ts/dur in microseconds since the run's first record,
    'i' events for points, metadata events naming both; ``keep``: only its CTAs and the
    spans that overlap its window; ``meta`` goes to otherData."""
    if sp is None:
        sp, unmatched = spans(tl)
    else:
        unmatched = []
    if keep is not None:
        sp = [s for s in sp if keep.holds(s)]
    events = []
    sm_of = {}
    for s in sp:
        sm_of.setdefault(s.cta, s.sm)
    for cta in sorted(sm_of):
        events.append({"name": "process_name", "ph": "M", "pid": cta, "tid": 0,
                       "args": {"name": f"CTA {cta} (SM {sm_of[cta]})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": cta, "tid": 0,
                       "args": {"sort_index": cta}})
        for r in sorted({s.role for s in sp if s.cta == cta}):
            events.append({"name": "thread_name", "ph": "M", "pid": cta, "tid": r,
                           "args": {"name": ROLES[r] if r < len(ROLES) else f"role {r}"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": cta, "tid": r,
                           "args": {"sort_index": r}})
    for s in sp:
        ev = {"name": _event_name(s), "cat": kind_name(s.kind), "pid": s.cta, "tid": s.role,
              "ts": round(s.start_ns / 1000.0, 3), "args": {"arg": s.arg}}
        if s.point:
            ev.update(ph="i", s="t")
        else:
            ev.update(ph="X", dur=round(s.dur_ns / 1000.0, 3))
        events.append(ev)
    other = {"format": "tirx-gemm timeline", "grid_ctas": tl.grid, "roles": list(ROLES),
             "kinds": {KINDS[k][0]: KINDS[k][1] for k in KINDS},
             "truncated_lanes": [list(x) for x in tl.truncated],
             "unmatched_records": len(unmatched), "t0_globaltimer_ns": tl.t0_ns,
             "sms": {str(c): sm for c, sm in sorted(sm_of.items())}}
    if keep is not None:
        other["window_us"] = [keep.lo_ns / 1000.0, keep.hi_ns / 1000.0]
        other["window_ctas"] = list(keep.ctas)
        other["window_center_us"] = keep.center_ns / 1000.0
        other["window_why"] = keep.why
    other.update(meta or {})
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


MAX_TRACE_BYTES = 1_000_000  # a trace kept in the repository stays under this


def _dumps(data: dict) -> str:
    return json.dumps(data, separators=(",", ":"))


def write_chrome_trace(tl: Timeline, path, meta: dict | None = None, *,
                       keep: Focus | None = None, max_bytes: int | None = None) -> Path:
    """Write :func:`chrome_trace` (atomically). With ``max_bytes``, a window that would
    write more is narrowed around its center until it fits."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sp, unmatched = spans(tl)
    while True:
        data = chrome_trace(tl, meta, keep=keep, sp=sp)
        data["otherData"]["unmatched_records"] = len(unmatched)
        text = _dumps(data)
        if max_bytes is None or keep is None or len(text) <= max_bytes \
                or keep.hi_ns - keep.lo_ns < 200:
            break
        half = (keep.hi_ns - keep.lo_ns) * 0.35
        keep = dataclasses.replace(keep, lo_ns=int(max(keep.center_ns - half, 0)),
                                   hi_ns=int(keep.center_ns + half))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def load_chrome_trace(path) -> dict:
    """A trace written by :func:`write_chrome_trace`, checked to be one (what the Gantt
    chart reads of it, field by field): a one-line TimelineError naming the file."""
    from tirx_gemm.report.jsonfile import load_object
    try:
        data = load_object(path, "a Chrome trace")
    except ValueError as exc:
        raise TimelineError(str(exc)) from None
    problem = trace_problem(data)
    if problem:
        raise TimelineError(f"{path}: not a Chrome trace of `tirx-gemm trace` ({problem})")
    return data


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def trace_problem(data: dict) -> str | None:
    """What makes ``data`` unusable as a recorded trace, in a few words, or None."""
    events = data.get("traceEvents")
    if not isinstance(events, list):
        return "no traceEvents list"
    other = data.get("otherData", {})
    if not isinstance(other, dict):
        return "otherData is not an object"
    for key in ("window_us",):
        w = other.get(key)
        if w is not None and not (isinstance(w, list) and len(w) == 2 and all(map(_num, w))):
            return f"otherData.{key} is not two numbers"
    if other.get("window_center_us") is not None and not _num(other["window_center_us"]):
        return "otherData.window_center_us is not a number"
    roles = other.get("roles")
    if roles is not None and not (isinstance(roles, list)
                                  and all(isinstance(r, str) for r in roles)):
        return "otherData.roles is not a list of names"
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            return f"traceEvents[{i}] is not an object"
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "process_name":
            args = e.get("args")
            if not (isinstance(args, dict) and isinstance(args.get("name"), str)):
                return f"traceEvents[{i}] names a CTA without args.name"
        if ph in ("M", "X", "i") and not all(isinstance(e.get(k), int)
                                             and not isinstance(e.get(k), bool)
                                             for k in ("pid", "tid")):
            return f"traceEvents[{i}] lacks integer pid and tid"
        if ph in ("X", "i"):
            if not _num(e.get("ts")) or ("dur" in e and not (_num(e["dur"]) and e["dur"] >= 0)):
                return f"traceEvents[{i}] lacks a number ts (and dur >= 0)"
            if not isinstance(e.get("cat", ""), str):
                return f"traceEvents[{i}] has a cat that is not a string"
    return None



def _pct(values, q):
    v = sorted(values)
    return v[min(int(q * len(v)), len(v) - 1)]


def summary(tl: Timeline, meta: dict | None = None, timing: dict | None = None,
            keep: Focus | None = None) -> str:
    """The whole run in a few lines: what was recorded, the cost of recording (``timing``:
    {"timeline_ms", "plain_ms", "iters"}), spans per kind (count, median, p90, max, share
    of the consumer lanes' time), tiles, the timer's granularity and the window kept."""
    meta = meta or {}
    sp, unmatched = spans(tl)
    lines = []
    if meta:
        lines.append(f"{meta.get('step', '?')}@{meta.get('arch', '?')} "
                     f"{meta.get('M')}x{meta.get('N')}x{meta.get('K')} "
                     f"{meta.get('dtype', '')} on {meta.get('device', '?')}"
                     f" ({meta.get('sm_count', '?')} SMs), instrumented build "
                     f"{json.dumps(meta.get('build_kwargs', {}), sort_keys=True)}")
    last = max((r.t_ns for r in tl.records), default=tl.t0_ns)
    lines.append(f"run: {(last - tl.t0_ns) / 1000:.1f} us from the first to the last event; "
                 f"{len(tl.records)} records from {len({r.cta for r in tl.records})} of "
                 f"{tl.grid} CTAs on {len({r.sm for r in tl.records})} SMs"
                 + (f"; {len(tl.truncated)} lane(s) full (later events dropped)"
                    if tl.truncated else "; no lane full")
                 + (f"; {len(unmatched)} unpaired record(s)" if unmatched else "")
                 + (f"; the buffer has lanes for {tl.lane_ctas} CTAs only"
                    if tl.lane_ctas < tl.grid else ""))
    if timing and timing.get("timeline_ms"):
        t, p = timing["timeline_ms"], timing.get("plain_ms")
        lines.append(f"cost: instrumented {t:.4f} ms" + (
            f", plain {p:.4f} ms: {t / p:.2f}x the plain kernel's time" if p else
            " (no plain build to compare with)")
            + f" (medians of {timing.get('iters', '?')} launches each"
            + (", alternating)" if p else ")"))
    busy: dict = {}
    for r in tl.records:
        if r.role != PRODUCER:
            lo, hi = busy.get((r.cta, r.role), (r.t_ns, r.t_ns))
            busy[(r.cta, r.role)] = (min(lo, r.t_ns), max(hi, r.t_ns))
    consumer_ns = sum(hi - lo for lo, hi in busy.values()) or 1
    by_kind: dict = {}
    for s in sp:
        if not s.point:
            by_kind.setdefault(s.kind, []).append(s)
    if by_kind:
        lines.append("spans over the whole run (us): kind, count, median, p90, max; share of "
                     "the consumer lanes' time (summed: spans in flight together, like two "
                     "wgmma groups, count twice)")
    for k, ss in sorted(by_kind.items()):
        durs = [s.dur_ns / 1000 for s in ss]
        share = sum(s.dur_ns for s in ss if s.role != PRODUCER) / consumer_ns
        lines.append(f"  {kind_name(k):11s} {len(durs):8d}  {statistics.median(durs):8.3f} "
                     f"{_pct(durs, 0.9):8.3f} {max(durs):9.3f}"
                     + (f"   {100 * share:5.1f}%" if k != EMPTY_WAIT else "   (producer)")
                     + ("  (asynchronous: a store in flight overlaps the lanes' other work,"
                        " so this share can pass 100%)" if k == STORE else ""))
    points: dict = {}
    for s in sp:
        if s.point:
            points[s.kind] = points.get(s.kind, 0) + 1
    if points:
        lines.append("points: " + ", ".join(f"{kind_name(k)} {n}"
                                            for k, n in sorted(points.items())))
    handed: dict = {}
    for s in sp:
        if s.point and s.kind == SCHED and s.arg >= 0 and s.role != PRODUCER:
            handed.setdefault((s.cta, s.role), []).append(s.start_ns)
    periods = [b - a for ts in handed.values() for a, b in zip(ts, ts[1:])]
    if handed:
        per = [len(v) for v in handed.values()]
        lines.append(f"tiles: {statistics.median(per):g} per consumer lane (median, "
                     f"{min(per)}..{max(per)})" + (
                         f", {statistics.median(periods) / 1000:.2f} us between two tiles "
                         "of a lane (median)" if periods else ""))
    gaps = [b.t_ns - a.t_ns for a, b in zip(tl.records, tl.records[1:])
            if (a.cta, a.role) == (b.cta, b.role) and b.t_ns > a.t_ns]
    if gaps:
        lines.append(f"smallest nonzero gap between two events of a lane: {min(gaps)} ns "
                     "(the global timer's granularity is at most this)")
    if keep is not None and keep.ctas:
        lines.append(f"window kept in the JSON and PNG: CTAs {', '.join(map(str, keep.ctas))}, "
                     f"{keep.lo_ns / 1000:.1f} .. {keep.hi_ns / 1000:.1f} us (around "
                     f"{keep.why} at {keep.center_ns / 1000:.1f} us)")
    return "\n".join(lines)


__all__ = [
    "TimelineError", "Record", "Timeline", "decode", "Span", "spans", "kind_name", "Focus",
    "focus", "chrome_trace", "write_chrome_trace", "load_chrome_trace", "summary",
    "MAX_TRACE_BYTES",
]
