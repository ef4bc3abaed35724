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
  recording): fresh tensors from the caching allocator on the capturing stream, so in the
  graph's own pool; the counters zeroed by a captured fill, the scratch left uninitialised (read
  only after written), both freed when the call returns. A graph therefore holds no buffer that
  another graph, stream or eager call shares, graphs may share one pool, and replays on any
  stream are safe. The price is one small fill per replayed launch of a workspace kernel.

Torch is imported when the first workspace is made (the module itself imports only threading).
"""

from __future__ import annotations

import threading

__all__ = ["Workspaces", "CallWorkspace", "capturing"]

_torch = None


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
        """Per-call buffers from the caching allocator on the current stream (counters zeroed,
        scratch uninitialised): what a captured launch uses."""
        torch = _torch or _bind()
        device = _device(device_index)
        return tuple((torch.zeros if dt.startswith("int") else torch.empty)(
            shape, dtype=getattr(torch, dt), device=device) for _, shape, dt in self.specs(M, N, K))

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
            return tensors


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
