"""In-kernel timelines: when each CTA's roles waited, issued and finished, from the GPU's
global timer, written as a Perfetto/Chrome trace, a Gantt chart and a summary.

Two halves, one module:

* **Build side** (imports TVM only inside the functions that emit code). An *instrumented*
  build of a step (``TIMELINE=True``) records events into one extra kernel operand, the
  timeline buffer, passed last (after D and after any workspace of the step). The events
  are emitted by the verbs, never by a step, so the step files carry no timeline lines:

  ===================================  ==============================================
  verb                                 event
  ===================================  ==============================================
  ``W.publish_setup[_cluster]``        the recording starts: cursor zeroed, CTA point
  ``Barriers.wait(.., role)``          FULL_WAIT span (EMPTY_WAIT for "producer")
  ``H.tma_load_tiles``,                TMA_ISSUE point on the producer lane (K slice)
  ``W.tma_load_multicast_b``
  ``W.wgmma_tile`` / ``W.mma_wait(n)`` WGMMA span opened / all but n newest closed
  ``Barriers.arrive``,                 RELEASE point (stage)
  ``W.release_stage_in_cluster``
  ``W.store_fragment`` ..              EPILOGUE span, ended by ``W.tma_store_tile``
  ``W.store_packed_tile``              EPILOGUE span (the whole verb)
  TMA store commits /                  STORE span opened / all but n newest closed
  ``H.store_wait[_read](n)``
  the tile scheduler's init/next_tile  SCHED point (the tile, -1: none left)
  ===================================  ==============================================

  Lanes are derived on the device: a verb's events go to the lane of the calling
  thread's warpgroup (the last of several warpgroups is the producer, the others are
  consumers 0, 1; a step with one warpgroup has it as consumer 0), except the TMA loads
  and the "producer" waits, which always go to the producer lane. Only the warpgroup's
  first thread writes. Outside an instrumented build every hook returns None and emits
  nothing, so the generated CUDA of a normal build is byte-identical to a build without
  them (tests/test_timeline.py checks it on real steps). :func:`build_instrumented` is
  what ``registry.Step.build_primfunc`` calls for ``TIMELINE=True``: it turns the recording
  on for that one builder call (the builder's ``@T.prim_func`` is parsed with the
  well-formedness check postponed, because the buffer is not yet a parameter), appends the
  buffer as the kernel's last parameter and then runs TVM's well-formedness check itself.
  sm_100a steps are refused: they run only on NumSim here, which has no clock.

* **Run side** (torch, numpy, matplotlib; never TVM): :func:`decode` reads a buffer back,
  :func:`spans` pairs the records, :func:`focus` picks the window kept in the repository
  (the first two clusters' CTAs around CTA 0's first tile boundary),
  :func:`chrome_trace` writes Chrome trace-event JSON (ui.perfetto.dev opens it),
  :func:`gantt_png` draws it, :func:`summary` describes the whole run, :func:`write_outputs`
  writes the three files and :func:`recorded_figure` shows a recorded trace in a notebook.
  Recording on a GPU (``tirx-gemm trace``: check, launch, decode, time against the plain
  build) lives in :mod:`tirx_gemm.run.trace`, which imports the registry, bundles and the
  run side (instrumented bundles: ``tirx-gemm export --timeline``); this module imports no
  other tirx_gemm module, so the verbs (helpers, hopper) and the registry can import it without an import circle.

Buffer layout (int64 words; zero-filled by the host before the launch)::

    word 0..7     header, written by thread 0 of CTA 0: MAGIC, FORMAT, grid CTAs, roles,
                  capacity per lane, header words, CTA 0's start time (ns), 0
    then          lanes: lane (cta, role) = cta * ROLES + role holds CAP records of two
                  words: [globaltimer ns, meta]; meta = kind (bits 0-7) | edge (8-9:
                  0 point, 1 begin, 2 end, 3 drain) | smid (16-23) | arg (32-63, signed)

A *drain* record (a wait_group n) closes the open spans of its kind on its lane, oldest
first, until ``arg`` = n remain. Each lane is written by one thread (the warpgroup's first),
with one write cursor per thread in a register (its record i goes to slot i of the lane it
names), so nothing is shared and no atomic is needed; a lane that fills up drops its later
events (reported as truncated). A record costs one 64-bit timer read (%globaltimer, ns,
the same clock on every SM), one %smid read and one 128-bit global store.

Why not TVM's own tools: ``tvm.tirx.bench.CudaProfiler`` (the ``T.cuda.timer_*``
intrinsics) packs a 32-bit timer and a 10-bit event id into one word per event, with no
stage/tile argument and no SM id, its buffer must already be a parameter of the kernel, and
its module imports triton at import time (not installed here); IKET
(``tvm.backend.cuda.iket``) needs NVIDIA's run-iket and exact nvrtc/nvdisasm wheels on the
GPU host, which has no network. This module uses the same idea (a per-thread
write cursor in registers, a buffer operand) through ``T.cuda.func_call`` device functions,
the path the watchdog already proved on the H200, and needs nothing on the GPU host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

# ---------------------------------------------------------------------------------------
# the format (shared by both sides; TVM- and torch-free)
# ---------------------------------------------------------------------------------------
MAGIC = 0x544C4D31  # "TLM1"
FORMAT = 2          # 2: lanes derived on the device, drain records
HEADER_WORDS = 8
RECORD_WORDS = 2
KWARG = "TIMELINE"          # the builder keyword of an instrumented build
OPERAND = "timeline"        # the name of the extra kernel operand

# roles: the lanes of one CTA
PRODUCER, CONSUMER0, CONSUMER1 = 0, 1, 2
ROLES = ("producer", "consumer 0", "consumer 1")
BY_WARPGROUP = -1   # a verb's lane: the calling thread's warpgroup (see the module notes)
SLOTS = 1           # write cursors per thread: one, shared by the lanes it writes (see below)

# edges
POINT, BEGIN, END, DRAIN = 0, 1, 2, 3
UNNAMED = -1        # a begin whose arg is given by its end (an epilogue learns its tile last)

# event kinds: id -> (name, what the span or point means, colour)
CTA = 1          # point: the recording starts on this lane (barriers initialised)
TMA_ISSUE = 2    # point: a TMA load of A and B issued (arg: K slice)
FULL_WAIT = 3    # span: a consumer waits for a stage's bytes (arg: stage); its end is the
                 #       arrival as the consumer sees it
EMPTY_WAIT = 4   # span: the producer waits for a stage to be freed (arg: stage)
WGMMA = 5        # span: a K slice's wgmmas issued -> a wait_group saw them done (arg: 0 on
                 #       the first slice of a tile, which overwrites the accumulator; else 1)
RELEASE = 6      # point: a consumer hands a stage back (arg: stage)
EPILOGUE = 7     # span: accumulator -> D for one tile (arg: tile, see tile_of)
STORE = 8        # span: TMA store committed -> a wait_group saw it done (or read)
SCHED = 9        # point: the scheduler hands this CTA a tile (arg: tile index, -1: none)
SYNC = 10        # span: a CTA / named barrier wait (arg: barrier id); no verb emits it yet

KINDS = {
    CTA: ("cta", "recording starts (barriers initialised)", "#7f7f7f"),
    TMA_ISSUE: ("tma_issue", "TMA load issued", "#1f77b4"),
    FULL_WAIT: ("full_wait", "waiting for TMA data (end: arrival seen)", "#d62728"),
    EMPTY_WAIT: ("empty_wait", "producer waiting for a free stage", "#ff7f0e"),
    WGMMA: ("wgmma", "a K slice's wgmmas, issued until a wait_group saw them done",
            "#2ca02c"),
    RELEASE: ("release", "stage handed back to the producer", "#9467bd"),
    EPILOGUE: ("epilogue", "accumulator -> D (registers, SMEM, TMA store issued)",
               "#8c564b"),
    STORE: ("store", "TMA store committed until a wait_group saw it done", "#e377c2"),
    SCHED: ("sched", "scheduler hands over a tile", "#17becf"),
    SYNC: ("sync", "barrier wait", "#bcbd22"),
}

# capacity: records per lane and tile = EV_SLICE per K slice + EV_TILE per tile. A thread's
# one cursor counts every record it writes, on whichever lane: a consumer writes 5 per
# slice (full_wait begin/end, wgmma begin/drain, release), v4-v6's thread 0 also the TMA
# issue (6); an epilogue with its stores and the scheduler write up to ~18 per tile
EV_SLICE = 7
EV_TILE = 24
TILE_BOUND = 128  # the smallest tile edge of any step: bounds the tile count


def tile_code(m_st, n_st):
    """The arg of an epilogue: its tile's first row and column in 64-element units
    (row << 16 | column); :func:`tile_of` reads it back. Works on ints and expressions."""
    return (m_st // 64) * 65536 + n_st // 64


def tile_of(arg: int) -> tuple[int, int]:
    """(first row, first column) of the tile an epilogue record names."""
    return (arg >> 16) * 64, (arg & 0xFFFF) * 64


@dataclasses.dataclass(frozen=True)
class Layout:
    ctas: int   # lanes are allocated for this many CTAs (an upper bound of the grid)
    roles: int
    cap: int    # records per lane

    @property
    def words(self) -> int:
        return HEADER_WORDS + self.ctas * self.roles * self.cap * RECORD_WORDS


DEFAULT_SM_COUNT = 132  # spec.SM_COUNT["sm_90a"]: timeline imports nothing of the package (test_spec checks the copy)


def layout(M: int, N: int, K: int, kwargs: dict | None = None, *,
           persistent: bool = False) -> Layout:
    """The buffer of an instrumented build at this shape (kwargs without TIMELINE).

    Lanes: a data-parallel step launches one CTA per tile (at most one per 128x128 tile);
    a persistent one (``persistent``: the registry row has an ``sm_count_kwarg``) a pool of
    at most SM_COUNT x CTAS_PER_SM CTAs (v6 puts two on an SM; the others one, and their
    lanes past the grid stay empty). Records per lane: a persistent CTA walks at most
    ceil(tiles / SM_COUNT) tiles, each EV_SLICE per K slice + EV_TILE. A lane that fills
    up anyway drops its later events and is reported by :func:`decode`."""
    kwargs = dict(kwargs or {})
    tiles = -(-M // TILE_BOUND) * -(-N // TILE_BOUND)
    k_slices = -(-K // 64)
    if persistent:
        sm = int(kwargs.get("SM_COUNT") or DEFAULT_SM_COUNT)
        ctas = sm * max(int(kwargs.get("CTAS_PER_SM") or 2), 1)
        per_cta = -(-tiles // sm)
    else:
        ctas, per_cta = tiles, 1
    return Layout(ctas=ctas, roles=len(ROLES), cap=per_cta * (EV_SLICE * k_slices + EV_TILE))


def buffer_specs(M: int, N: int, K: int, kwargs: dict | None = None, *,
                 persistent: bool = False):
    """The timeline operand, ((name, shape, dtype),), in the form of Step.workspace_specs."""
    return ((OPERAND, (layout(M, N, K, kwargs, persistent=persistent).words,), "int64"),)


def is_instrumented(kwargs: dict | None) -> bool:
    return bool((kwargs or {}).get(KWARG))


def plain_kwargs(kwargs: dict | None) -> dict:
    """The build keywords without TIMELINE (what the step's own workspace depends on)."""
    return {k: v for k, v in (kwargs or {}).items() if k != KWARG}


# ---------------------------------------------------------------------------------------
# build side: the hooks the verbs call (nothing is emitted unless instrumented)
# ---------------------------------------------------------------------------------------
NO_CLOCK = ("No timeline for sm_100a: these steps run only on NumSim, a CPU model of "
            "Blackwell that checks results and the barrier protocol but has no clock, so "
            "there is no time axis to draw. The sm_90a notebook of this step shows one "
            "recorded on a Hopper GPU.")
NO_CLOCK_BUILD = ("TIMELINE=True: sm_100a steps run only on NumSim here, which has no clock, "
                  "so their verbs record no timeline (build the sm_90a step: --arch sm_90a)")
NO_SETUP = ("TIMELINE=True: this step records no timeline: the recording starts in "
            "W.publish_setup / W.publish_setup_cluster, which it never calls before its "
            "first event (sm_90a v4 on record one; v1-v3 have no barriers to publish)")


class _Recording:
    """The state of one instrumented builder call."""

    def __init__(self, lay: Layout):
        import tvm
        self.layout = lay
        self.buffer = tvm.tirx.decl_buffer((lay.words,), "int64", name=OPERAND)
        self.cursor = None          # the per-thread cursor (a local array of SLOTS)


_rec: _Recording | None = None

# No backslash escapes: TVM unescapes the source it is given. One source per function:
# TVM emits each distinct source once.
_SETUP_SRC = """
__device__ __forceinline__ void tirx_gemm_tl_setup(int64_t* buf, int& cursor, int roles,
    int cap, int magic, int format, int header) {
  cursor = 0;
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
    buf[0] = magic; buf[1] = format;
    buf[2] = (long long)(gridDim.x * gridDim.y * gridDim.z); buf[3] = roles;
    buf[4] = cap; buf[5] = header; buf[6] = (long long)t; buf[7] = 0;
  }
}
"""
# lane < 0: the calling thread's warpgroup decides (the last of several is the producer,
# lane 0; the others are consumers, lanes 1 + warpgroup); only its first thread writes.
# The thread's record i goes to slot i of its lane: a thread that writes two lanes (v4-v6's
# thread 0: its TMA issues on the producer lane) leaves holes there, which decode skips
_MARK_SRC = """
__device__ __forceinline__ void tirx_gemm_tl_mark(int64_t* buf, int& cursor, int lane,
    int roles, int cap, int ctas, int header, int kind, int edge, int arg) {
  unsigned int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  if ((tid & 127u) != 0u) return;
  unsigned int ntid, cx, cy, cz, nx, ny, sm;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  asm volatile("{ mov.u32 %0, %%ntid.x; mov.u32 %1, %%ctaid.x; mov.u32 %2, %%ctaid.y; "
               "mov.u32 %3, %%ctaid.z; mov.u32 %4, %%nctaid.x; mov.u32 %5, %%nctaid.y; }"
               : "=r"(ntid), "=r"(cx), "=r"(cy), "=r"(cz), "=r"(nx), "=r"(ny));
  if (lane < 0) {
    unsigned int wgs = ntid >> 7, wg = tid >> 7;
    lane = (wgs > 1u && wg == wgs - 1u) ? 0 : 1 + (int)wg;
  }
  unsigned int cta = cx + nx * (cy + ny * cz);
  int i = cursor;
  cursor = i + 1;
  if (i < cap && cta < (unsigned int)ctas && lane < roles) {
    int64_t* rec = buf + header + 2LL * (((long long)cta * roles + lane) * cap + i);
    long long meta = ((long long)arg << 32) | (long long)((sm & 255u) << 16)
                     | (long long)(edge << 8) | (long long)kind;
    *reinterpret_cast<longlong2*>(rec) = make_longlong2((long long)t, meta);
  }
}
"""
# (the special registers are read through volatile asm so that nvcc recomputes them at each
# record instead of keeping the lane's base address live across the K-loop, where v9's
# consumers have no register to spare)


def instrumented() -> bool:
    """Whether the builder call in progress records a timeline (verbs may branch on it)."""
    return _rec is not None


def setup():
    """The recording starts (called by W.publish_setup / publish_setup_cluster, every
    thread, at the kernel's top level): this thread's cursor, zeroed, in a register; thread
    0 of CTA 0 writes the header; a CTA point on each warpgroup's lane. A second call in
    the same kernel emits nothing. Returns None (what it emits, it emits itself)."""
    if _rec is None:
        return None
    r = _rec
    if r.cursor is not None:
        return None
    from tvm.script import tirx as T
    lay = r.layout
    r.cursor = T.alloc_local((SLOTS,), "int32")
    T.evaluate(T.cuda.func_call("tirx_gemm_tl_setup", r.buffer.data, r.cursor[0],
                                lay.roles, lay.cap, MAGIC, FORMAT, HEADER_WORDS,
                                source_code=_SETUP_SRC))
    T.evaluate(point(CTA, 0))
    return None


def point(kind: int, arg=0, role=BY_WARPGROUP):
    """An instant event of ``kind`` (edge POINT) on ``role``'s lane (PRODUCER, or the
    calling warpgroup's: BY_WARPGROUP)."""
    return _mark(kind, POINT, arg, role)


def begin(kind: int, arg=0, role=BY_WARPGROUP):
    """The begin of a span of ``kind`` (closed by :func:`end` or :func:`drain`)."""
    return _mark(kind, BEGIN, arg, role)


def end(kind: int, arg=0, role=BY_WARPGROUP):
    """The end of the span of ``kind`` opened last with this ``arg`` (or, failing that,
    the oldest one still open) on the lane."""
    return _mark(kind, END, arg, role)


def drain(kind: int, keep, role=BY_WARPGROUP):
    """Close the open spans of ``kind`` on the lane, oldest first, until ``keep`` remain
    (what a wait_group ``keep`` guarantees of the groups it waits on)."""
    return _mark(kind, DRAIN, keep, role)


def around(call, kind: int, arg=0, role=BY_WARPGROUP):
    """For a plain-Python verb that returns one call: off, ``call`` itself; instrumented,
    a begin of ``kind`` and ``call`` are emitted and the end is returned (the verb's
    caller emits it as the statement that follows)."""
    if _rec is None:
        return call
    from tvm.script import tirx as T
    T.evaluate(begin(kind, arg, role))
    T.evaluate(call)
    return end(kind, arg, role)


def _mark(kind, edge, arg, lane):
    if _rec is None:
        return None
    from tvm.script import tirx as T
    r = _rec
    if r.cursor is None:
        raise ValueError(NO_SETUP)
    if kind not in KINDS:
        raise ValueError(f"timeline: unknown event kind {kind!r}")
    if lane not in (PRODUCER, BY_WARPGROUP):
        raise ValueError(f"timeline: lane {lane!r} is neither PRODUCER ({PRODUCER}) nor "
                         f"BY_WARPGROUP ({BY_WARPGROUP})")
    lay = r.layout
    return T.cuda.func_call("tirx_gemm_tl_mark", r.buffer.data, r.cursor[0],
                            lane, lay.roles, lay.cap, lay.ctas, HEADER_WORDS, kind, edge,
                            _int(arg), source_code=_MARK_SRC)


def _int(x):
    from tvm.script import tirx as T
    if isinstance(x, bool):
        return T.int32(int(x))
    return T.int32(x) if isinstance(x, int) else T.Cast("int32", x)


@contextlib.contextmanager
def _scheduler_events():
    """The tile schedulers (TVM's ClusterPersistentScheduler2D and its subclasses) report
    each tile they hand over: their init and next_tile are wrapped for this one builder
    call, so no step needs a line for it."""
    from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D as S
    orig_init, orig_next = S.init, S.next_tile

    def handed(self):
        from tvm.script import tirx as T
        return point(SCHED, T.Select(self.valid(), self.linear_idx, T.int32(-1)))

    def init(self, *a, **kw):
        orig_init(self, *a, **kw)
        return handed(self)

    def next_tile(self, *a, **kw):
        orig_next(self, *a, **kw)
        return handed(self)

    S.init, S.next_tile = init, next_tile
    try:
        yield
    finally:
        S.init, S.next_tile = orig_init, orig_next


@contextlib.contextmanager
def _recording(lay: Layout):
    """Turn recording on for one builder call. The builder's ``@T.prim_func`` is parsed with
    its well-formedness check postponed (the buffer is not a parameter yet); the check runs
    in :func:`attach`, once it is."""
    global _rec
    import tvm.script.tirx as tirx_script
    if _rec is not None:
        raise RuntimeError("timeline: an instrumented build is already in progress")
    original = tirx_script.prim_func

    def prim_func(func=None, **kw):
        kw["check_well_formed"] = False
        return original(func, **kw) if func is not None else original(**kw)

    prim_func.dispatch_token = original.dispatch_token  # how the parser recognises it
    _rec = _Recording(lay)
    tirx_script.prim_func = prim_func
    try:
        with _scheduler_events():
            yield _rec
    finally:
        tirx_script.prim_func = original
        _rec = None


def attach(func, rec: _Recording):
    """``func`` with the timeline buffer appended as its last parameter, checked."""
    import tvm
    out = tvm.tirx.PrimFunc(list(func.params) + [rec.buffer], func.body, func.ret_type,
                            func.attrs)
    tvm.s_tir.analysis.verify_well_formed(tvm.IRModule({"main": out}))
    tvm.tirx.analysis.verify_tirx_well_formed(out)
    return out


def _arch_of(builder) -> str | None:
    """The arch of a step builder from its module (steps.sm100a.hgemm_vN), if it says."""
    parts = (getattr(builder, "__module__", "") or "").split(".")
    return {"sm100a": "sm_100a", "sm90a": "sm_90a"}.get(
        next((p for p in parts if p in ("sm100a", "sm90a")), ""))


def build_instrumented(builder, M: int, N: int, K: int, kwargs: dict, *,
                       persistent: bool = False, arch: str | None = None):
    """The PrimFunc of ``builder(M, N, K, **kwargs)`` (kwargs without TIMELINE) with a
    timeline buffer (:func:`layout`) as its last parameter. Refused (ValueError): an
    sm_100a step (``arch``, else the builder's module: NumSim has no clock) and a step
    whose verbs never start the recording (v1-v3)."""
    if (arch or _arch_of(builder)) == "sm_100a":
        raise ValueError(NO_CLOCK_BUILD)
    with _recording(layout(M, N, K, kwargs, persistent=persistent)) as rec:
        try:
            func = builder(M, N, K, **kwargs)
        except Exception as exc:  # the parser wraps a hook's ValueError in a diagnostic
            if NO_SETUP in str(exc):
                raise ValueError(NO_SETUP) from None
            raise
        if rec.cursor is None:
            raise ValueError(NO_SETUP)
        return attach(func, rec)


# ---------------------------------------------------------------------------------------
# run side: decode, pair, focus, write (no TVM)
# ---------------------------------------------------------------------------------------
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
    """A trace written by :func:`write_chrome_trace`, checked to be one."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TimelineError(f"{path} is not a Chrome trace (no traceEvents list)")
    return data


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


# ---------------------------------------------------------------------------------------
# the files a trace leaves (tirx_gemm.run.trace writes them on a GPU) and the notebooks
# ---------------------------------------------------------------------------------------
TIMELINES_DIR = Path(__file__).resolve().parent.parent / "results" / "timelines"


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
    "MAGIC", "FORMAT", "KWARG", "OPERAND", "ROLES", "KINDS", "PRODUCER", "CONSUMER0",
    "CONSUMER1", "BY_WARPGROUP", "CTA", "TMA_ISSUE", "FULL_WAIT", "EMPTY_WAIT", "WGMMA",
    "RELEASE", "EPILOGUE", "STORE", "SCHED", "SYNC", "POINT", "BEGIN", "END", "DRAIN",
    "UNNAMED", "Layout", "layout", "buffer_specs", "is_instrumented", "plain_kwargs",
    "setup", "point", "begin", "end", "drain", "around", "tile_code", "tile_of",
    "instrumented", "build_instrumented", "attach", "decode", "spans", "Focus", "focus",
    "chrome_trace", "write_chrome_trace", "load_chrome_trace", "gantt", "gantt_png",
    "gantt_bytes", "summary", "write_outputs", "draw_recorded", "recorded_figure",
    "recorded_path", "trace_name", "TimelineError", "NO_CLOCK", "NO_CLOCK_BUILD",
    "MAX_TRACE_BYTES", "TIMELINES_DIR",
]

