"""PDL by call site: launch with programmatic dependent launch only after one of our kernels.

A short decode kernel built with PDL (tirx_gemm/pdl.py) starts its prologue under the kernel
before it, if that kernel triggers (ours do, at their start). After a kernel that does not
trigger -- a model's norm, activation or attention, none of them ours -- the launch with PDL's
attribute waits as any other does and pays for the attribute (lab/decode_fixed_cost
measured it). The op cannot see what torch launched, but it can see what it read:
a call whose A is the A the op's last such launch read (unchanged since: same data pointer
and version), or the D it wrote, comes right after one of ours in a model (q, k and v of one
hidden state; gate and up), so it keeps the attribute; any other call runs the pick's twin,
the same kernel built with ``PDL_ATTR=False`` (its trigger kept, so the call after it can
still start early). The choice moves time only: both kernels wait for the previous grid.

``MODE``: "site" (the choice above), "always" (every call with the attribute, the picks as
built) or "never" (every call that has a twin runs it); :func:`set_mode` changes it. A bundle
without a pick's twin runs the pick (`tirx-gemm export --suite ... --pdl-twins` adds them).

The op's caches are registered here too (:func:`new_cache`): caches of calls seen, which a mode
change drops, and each op module's cache of loaded kernels, which :func:`clear`
(tirx_gemm.matmul.clear_cache) empties with them. Pure Python: no torch, no TVM.
"""

from __future__ import annotations

MODES = ("site", "always", "never")
MODE = "always"
CALL_CACHES: list = []  # the op's caches of calls seen (new_cache(calls=True))
KERNEL_CACHES: list = []  # the op's caches of loaded kernels (new_cache())
# the op's last launch that had a twin: A's data pointer, A's version, D's data pointer
_last = [0, -1, 0]


def twin_kwargs(step_id: str, kwargs: dict) -> dict | None:
    """The keywords of a pick's twin (v12 with PDL's start trigger, one CTA a cluster:
    the same build launched without the attribute), or None where it has none."""
    if (step_id == "v12" and kwargs.get("PDL") and kwargs.get("PDL_ATTR", True)
            and kwargs.get("PDL_TRIGGER", "start") == "start" and kwargs.get("CLUSTER", 1) == 1):
        return {**kwargs, "PDL_ATTR": False}
    return None


def new_cache(calls: bool = False) -> dict:
    """An empty cache dict of loaded kernels (with ``calls``: of calls seen), registered in
    :data:`KERNEL_CACHES` (:data:`CALL_CACHES`) so that :func:`clear` empties it."""
    cache: dict = {}
    (CALL_CACHES if calls else KERNEL_CACHES).append(cache)
    return cache


def clear(lock, kernels: bool = True) -> None:
    """Under ``lock`` (matmul's loader lock), empty every cache of calls seen and, with
    ``kernels``, every cache of loaded kernels (the build cache on disk is kept)."""
    with lock:
        for cache in CALL_CACHES + (KERNEL_CACHES if kernels else []):
            cache.clear()


def set_mode(mode: str) -> None:
    """Set :data:`MODE` for the calls of this process from now on; the op's call cache is
    dropped, so the next call of each shape loads what the mode needs (outside a capture)."""
    global MODE
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: one of {', '.join(MODES)}")
    MODE = mode
    for calls in CALL_CACHES:  # the loaded kernels are kept
        calls.clear()


def kernel(call, a, out):
    """The kernel ``call`` launches for A ``a`` into ``out``: its pick or its twin
    (``call.lone``, None where it has none), by :data:`MODE`; notes the launch."""
    last, ptr = _last, a.data_ptr()
    try:
        version = a._version
    except RuntimeError:  # an inference tensor keeps no version counter: its pointer alone
        version = -2
    ours = (ptr == last[0] and version == last[1]) or ptr == last[2]
    last[0], last[1], last[2] = ptr, version, out.data_ptr()
    if MODE == "always" or (ours and MODE == "site"):
        return call.kernel
    return call.lone
