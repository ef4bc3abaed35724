"""Workspace operands (split-K partial sums, stream-K tile counters) under streams, CUDA graphs
and torch.compile.

A step with a workspace (registry.Step.workspace_specs: v11, v12's SPLIT_K and STREAM_K builds)
takes scratch slabs and int32 counters after D; the counters must be zero when a launch starts
and the kernel leaves them zero. Where those buffers live decides whether the op is safe in a
serving stack, so the rule is one place, here:

* **Eager, on a stream** (the current stream is not capturing): one set of buffers per loaded
  kernel, device and stream, allocated on the first call of that stream and kept for the life of
  the process (a persistent buffer, registered once; a runtime-M kernel's set grows when a larger
  M comes, the old set staying with the calls that hold it). Two streams never share a set, so
  kernels queued on two streams at once cannot race on a counter. The set is allocated on a
  short-lived helper thread and a side stream: torch.compile's CUDA-graph trees route every
  allocation of the warming thread (older torch: of the warming stream) into the graph's memory
  pool, where a buffer kept across calls would be an untracked tensor ("Detected N tensor(s) in
  the cudagraph pool not tracked as outputs"); the helper's allocation comes from the ordinary
  caching allocator, and the caller's stream waits for its zero-fill before the kernel.
* **While the current stream captures a CUDA graph** (``torch.cuda.graph``, reduce-overhead's
  recording): the scratch a fresh tensor from the caching allocator on the capturing stream, so
  in the graph's own pool, left uninitialised (read only after written) and freed when the call
  returns; the counters a slice of the device's capture arena that this captured launch keeps
  for good. The arena (ARENA_COUNTERS int32 counters a device, a persistent buffer made once,
  like the eager sets, on the first eager call) is zero when made, and every kernel leaves its
  counters zero at exit, so a slice is zero at every replay: the graph holds the kernel alone,
  no fill before it. No two captured launches share a slice, so graphs may share one pool and
  replay on any stream. (One graph's executable launched on two streams at once would share
  its slices; CUDA orders the launches of one executable graph.) When the arena is spent, a
  captured launch zeroes counters of its own from the graph's pool by a captured fill, and
  the first such capture warns.

Torch is imported when the first workspace is made (the module itself imports only threading).
"""

from __future__ import annotations

import threading

__all__ = ["Workspaces", "CallWorkspace", "capturing", "ARENA_COUNTERS"]

_torch = None
ARENA_COUNTERS = 1 << 18  # int32 counters a device sets aside for captured launches (1 MiB)
ARENA_ALIGN = 32          # each captured launch's slice starts at a multiple of 128 bytes


def _bind():
    global _torch, _capturing, _raw_stream
    import torch
    if torch.cuda.is_available():  # a CPU-only torch has these names as stubs that raise
        _capturing = torch._C._cuda_isCurrentStreamCapturing
        _raw_stream = torch._C._cuda_getCurrentRawStream
    else:
        _capturing, _raw_stream = (lambda: False), (lambda index: 0)
    _torch = torch
    return torch


def _capturing():  # replaced by torch's own on the first bind
    return _bind() and _capturing()


def _raw_stream(index):
    _bind()
    return _raw_stream(index)


def capturing() -> bool:
    """Whether the calling thread's current CUDA stream is capturing a graph."""
    return bool(_capturing())


class Workspaces:
    """The workspace buffers of one loaded kernel: ``specs(M, N, K)`` gives ((name, shape,
    dtype), ...) (registry.Step.workspace_specs with the kernel's keywords); ``runtime_m``: one
    kernel serves every M, so a larger buffer serves a smaller M."""

    def __init__(self, specs, runtime_m: bool):
        self.specs = specs
        self.runtime_m = runtime_m
        self._lock = threading.Lock()
        self._held: dict = {}  # (device index, raw stream) -> (specs, tensors)

    def any(self, M: int, N: int, K: int) -> bool:
        return bool(self.specs(M, N, K))

    def for_call(self, M: int, N: int, K: int, device):
        """() where the kernel has no workspace operands at (M, N, K), else a
        :class:`CallWorkspace` on ``device`` (a torch device; no index: the current one)."""
        if not self.any(M, N, K):
            return ()
        index = device.index
        if index is None:
            index = (_torch or _bind()).cuda.current_device()
        return CallWorkspace(self, M, N, K, index)

    def fresh(self, M: int, N: int, K: int, device_index: int) -> tuple:
        """A captured launch's buffers: scratch from the caching allocator on the current
        stream (uninitialised), counters from the device's capture arena (zero; see the
        module docstring), or zeroed from the allocator once the arena is spent."""
        torch = _torch or _bind()
        device = _device(device_index)
        out = []
        for _, shape, dt in self.specs(M, N, K):
            if not dt.startswith("int"):
                out.append(torch.empty(shape, dtype=getattr(torch, dt), device=device))
                continue
            part = _arena_take(device_index, _numel(shape)) if dt == "int32" else None
            out.append(part.view(shape) if part is not None else
                       torch.zeros(shape, dtype=getattr(torch, dt), device=device))
        return tuple(out)

    def persistent(self, M: int, N: int, K: int, device_index: int) -> tuple:
        """The buffers of the current stream on ``device_index``, made (or grown) once."""
        stream = _current_stream(device_index)
        key = (device_index, stream.cuda_stream)
        specs = self.specs(M, N, K)
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                have, tensors = held
                if all(len(h[1]) == len(w[1]) and all(
                        x >= y if self.runtime_m else x == y for x, y in zip(h[1], w[1]))
                        for h, w in zip(have, specs)):
                    return tensors
                if self.runtime_m:  # grow: every extent the larger of the two
                    specs = tuple((w[0], tuple(max(x, y) for x, y in zip(h[1], w[1])), w[2])
                                  for h, w in zip(have, specs))
            tensors = aside(lambda: _zeros_on(specs, device_index, stream))
            self._held[key] = (specs, tensors)
        _arena_for(device_index, stream)  # made before any capture: every kernel runs eagerly first
        return tensors


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


class Arena:
    """A device's zeroed int32 counters for captured launches: :meth:`take` hands out slices
    for good (ARENA_ALIGN-aligned), None once the rest is too short."""

    def __init__(self, tensor):
        self.tensor, self.used = tensor, 0

    def take(self, n: int):
        size = -(-n // ARENA_ALIGN) * ARENA_ALIGN
        if self.used + size > self.tensor.numel():
            return None
        part = self.tensor[self.used:self.used + n]
        self.used += size
        return part


_arenas: dict = {}  # device index -> Arena
_arena_lock = threading.Lock()
_spent_warned: set = set()


def _arena_for(device_index: int, stream) -> Arena:
    """The device's capture arena, made (zeroed, outside every pool) on first need."""
    with _arena_lock:
        arena = _arenas.get(device_index)
        if arena is None:
            spec = (("ARENA", (ARENA_COUNTERS,), "int32"),)
            arena = _arenas[device_index] = Arena(
                aside(lambda: _zeros_on(spec, device_index, stream))[0])
        return arena


def _arena_take(device_index: int, n: int):
    """``n`` zero counters of the device's arena for a captured launch, or None (no arena yet,
    or spent: the caller zeroes its own; the first spent capture warns)."""
    with _arena_lock:
        arena = _arenas.get(device_index)
        part = arena.take(n) if arena is not None else None
        if part is None and arena is not None and device_index not in _spent_warned:
            _spent_warned.add(device_index)
            import warnings
            warnings.warn(f"tirx_gemm: the {ARENA_COUNTERS} counters set aside for captured "
                          f"launches on cuda:{device_index} are spent; later captures zero "
                          f"their counters by a fill in the graph", RuntimeWarning, stacklevel=3)
        return part


def arena_used(device_index: int = 0) -> int:
    """How many counters of the device's capture arena captured launches hold (0: none yet)."""
    arena = _arenas.get(device_index)
    return 0 if arena is None else arena.used


def _device(device_index: int):
    return (_torch or _bind()).device("cuda", device_index)


def _current_stream(device_index: int):
    torch = _torch or _bind()
    return torch.cuda.current_stream(device_index)


_side: dict = {}  # device index -> the stream persistent buffers are made on


def _zeros_on(specs, device_index: int, stream) -> tuple:
    """Zero-filled ``specs`` made on a side stream of their own, ``stream`` made to wait for
    the fill: neither the thread (torch's newer CUDA-graph trees route a thread's allocations
    to the pool) nor the stream (older ones route a stream's) is one a pool serves."""
    torch = _torch or _bind()
    with torch.cuda.device(device_index):
        side = _side.get(device_index)
        if side is None:
            side = _side[device_index] = torch.cuda.Stream(device_index)
        side.wait_stream(stream)  # nothing queued before on the caller's stream is overtaken
        with torch.cuda.stream(side):
            out = tuple(torch.zeros(shape, dtype=getattr(torch, dt),
                                    device=torch.device("cuda", device_index))
                        for _, shape, dt in specs)
        stream.wait_stream(side)
    return out


def aside(make):
    """``make()`` run on a short-lived helper thread (so its allocations come from the caching
    allocator, not from a memory pool the calling thread allocates into); its result returned
    and its errors re-raised here."""
    box: dict = {}

    def run():
        try:
            box["t"] = make()
        except BaseException as exc:  # noqa: BLE001 (handed to the caller)
            box["e"] = exc

    th = threading.Thread(target=run, name="tirx-gemm-workspace", daemon=True)
    th.start()
    th.join()
    if "e" in box:
        raise box["e"]
    return box["t"]


class CallWorkspace:
    """The workspace of one remembered call (one M, N, K, device): :meth:`get` returns the
    operands for the current stream, fresh ones while it captures."""
    __slots__ = ("owner", "M", "N", "K", "index", "by_stream")

    def __init__(self, owner: Workspaces, M: int, N: int, K: int, index: int):
        self.owner, self.M, self.N, self.K, self.index = owner, M, N, K, index
        self.by_stream: dict = {}

    def get(self) -> tuple:
        if _capturing():
            return self.owner.fresh(self.M, self.N, self.K, self.index)
        s = _raw_stream(self.index)
        hit = self.by_stream.get(s)
        if hit is None:
            hit = self.by_stream[s] = self.owner.persistent(self.M, self.N, self.K, self.index)
        return hit
