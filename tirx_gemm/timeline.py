"""In-kernel timelines, authoring side: the hooks the verbs call, event codes, buffer format.

When each CTA's roles waited, issued and finished, from the GPU's global timer. This
module is what a build needs (it imports TVM only inside the functions that emit code,
and nothing of tirx_gemm: the verbs and the registry import it). An *instrumented* build
of a step (``TIMELINE=True``) records events into one extra kernel operand, the timeline
buffer, passed last (after D and after any workspace of the step). The events are
emitted by the verbs, never by a step, so the step files carry no timeline lines:

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

Lanes are derived on the device: a verb's events go to the lane of the calling thread's
warpgroup (the last of several warpgroups is the producer, the others are consumers 0, 1;
a step with one warpgroup has it as consumer 0), except the TMA loads and the "producer"
waits, which always go to the producer lane. Only the warpgroup's first thread writes.
Outside an instrumented build every hook returns None and emits nothing, so the generated
CUDA of a normal build is byte-identical to a build without them (tests/test_timeline.py
checks it on real steps). :func:`build_instrumented` is what ``registry.Step.build_primfunc``
calls for ``TIMELINE=True``: it turns the recording on for that one builder call (the
builder's ``@T.prim_func`` is parsed with the well-formedness check postponed, because the
buffer is not yet a parameter), appends the buffer as the kernel's last parameter and then
runs TVM's well-formedness check itself. sm_100a steps are refused: they run only on
NumSim here, which has no clock.

What reads a buffer back lives in report/: :mod:`tirx_gemm.report.timeline_view` (decode,
spans, the window kept, Chrome trace JSON, summary) and
:mod:`tirx_gemm.report.timeline_files` (Gantt PNG, the three files of a trace, the recorded
traces a notebook shows). Recording on a GPU (``tirx-gemm trace``: check, launch, time
against the plain build) is :mod:`tirx_gemm.run.trace`, and tirx_gemm/cli/trace.py decodes
and writes what it recorded (instrumented bundles: ``tirx-gemm export --timeline``).

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

# ---------------------------------------------------------------------------------------
# the format (read back by tirx_gemm.report.timeline_view; TVM- and torch-free)
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


__all__ = [
    "MAGIC", "FORMAT", "KWARG", "OPERAND", "ROLES", "KINDS", "PRODUCER", "CONSUMER0",
    "CONSUMER1", "BY_WARPGROUP", "CTA", "TMA_ISSUE", "FULL_WAIT", "EMPTY_WAIT", "WGMMA",
    "RELEASE", "EPILOGUE", "STORE", "SCHED", "SYNC", "POINT", "BEGIN", "END", "DRAIN",
    "UNNAMED", "Layout", "layout", "buffer_specs", "is_instrumented", "plain_kwargs",
    "setup", "point", "begin", "end", "drain", "around", "tile_code", "tile_of",
    "instrumented", "build_instrumented", "attach", "NO_CLOCK_BUILD",
]
