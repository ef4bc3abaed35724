"""Timing a kernel honestly: CUDA events, warm-up until clocks settle, inputs rotated past L2.

:func:`bench` times one function of (A, B, D); :func:`bench_interleaved` times several
(a kernel and torch.matmul) launch by launch in alternation so a clock change affects both
alike. Timing assumes a kernel that already passed its check (runner.run_step sees to it).
Imports torch and the standard library only.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time as _time
from typing import Callable, Mapping, Sequence

import torch

from tirx_gemm.run.checking import Log, _quiet, make_inputs, new_seed
from tirx_gemm.run.device import l2_bytes
from tirx_gemm.run.launcher import synchronize

__all__ = [
    "BenchResult",
    "DEFAULT_MIN_WARMUP_MS",
    "n_sets_for_l2",
    "make_bench_sets",
    "bench",
    "bench_interleaved",
    "torch_matmul",
    "tflops",
]


@dataclasses.dataclass
class BenchResult:
    median_ms: float
    best_ms: float
    mean_ms: float
    iters: int
    warmup: int  # warm-up launches actually run (at least the requested count)
    n_sets: int
    rounds: int = 1
    queue_ahead: bool = False
    times_ms: list = dataclasses.field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("times_ms")
        return d

    @classmethod
    def from_times(cls, times: list, **kw) -> "BenchResult":
        return cls(median_ms=statistics.median(times), best_ms=min(times),
                   mean_ms=statistics.fmean(times), iters=len(times), times_ms=list(times), **kw)



def n_sets_for_l2(set_bytes: int, l2_bytes: int, max_sets: int = 1024) -> int:
    """How many input sets to rotate among so no launch finds its operands in L2.

    One set when a set (A+B+D bytes) is at least twice L2 (little of it can survive in L2
    until its next use); otherwise enough sets that the ones touched since a set's last use
    total at least 2x L2 (capped at ``max_sets``).
    """
    if set_bytes <= 0:
        raise ValueError("set_bytes must be positive")
    if set_bytes >= 2 * l2_bytes:
        return 1
    return max(2, min(max_sets, math.ceil(2 * l2_bytes / set_bytes) + 1))


def make_bench_sets(M: int, N: int, K: int, *, device="cuda", n_sets: int | None = None,
                    seed: int | None = None) -> list[tuple]:
    """Input sets (A, B, D) for timing; as many as n_sets_for_l2 asks for unless given."""
    set_bytes = 2 * (M * K + N * K + M * N)
    if n_sets is None:
        n_sets = n_sets_for_l2(set_bytes, l2_bytes(device))
    base = new_seed() if seed is None else int(seed)
    sets = []
    for i in range(n_sets):
        inp = make_inputs(M, N, K, kind="random", seed=(base + i) & 0x7FFF_FFFF, device=device)
        sets.append((inp.A, inp.B, inp.D))
    return sets


# A GPU boosts for the first tens of ms of load and then settles at its power-limited clock
# (H200, cuBLAS 8192^3: 759 TFLOP/s for ~50 ms, then ~658). Warm-up therefore runs until at
# least DEFAULT_MIN_WARMUP_MS of GPU time has passed, and run_step interleaves the kernel and
# torch launch by launch in alternation so both are measured in the same clock state.
DEFAULT_MIN_WARMUP_MS = 200.0
# Queue-ahead: a torch.cuda._sleep kernel holds the stream while the host enqueues the timed
# launches, so the events measure GPU time, not Python/launch overhead (H200, 256x256x128
# cuBLAS: 26-40 us per launch without, 5.3 us with).
SLEEP_CYCLES_PER_MS = 2.0e6  # ~2 GHz; a lower clock only lengthens the sleep
MAX_QUEUE_AHEAD_MS = 100.0
EVENT_HOST_MS = 0.02  # host cost of the two event records around a launch


def _warm_up(fn: Callable, sets: Sequence[tuple], warmup: int, min_warmup_ms: float,
             start: int = 0) -> tuple[int, float]:
    """Run >= ``warmup`` launches and >= ``min_warmup_ms`` of GPU time.

    Returns (launches run, host milliseconds per launch).
    """
    n = len(sets)
    done = 0
    host_ms = 0.05
    if warmup > 0:
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
        t0 = _time.perf_counter()
        for i in range(warmup):
            fn(*sets[(start + i) % n])
        host_ms = (_time.perf_counter() - t0) * 1e3 / warmup
        ev1.record()
        synchronize("warm-up launches")
        gpu_ms = ev0.elapsed_time(ev1)
        done = warmup
        if gpu_ms < min_warmup_ms:
            per = max(gpu_ms / warmup, 1e-3)
            extra = min(math.ceil((min_warmup_ms - gpu_ms) / per), 20000)
            for i in range(extra):
                fn(*sets[(start + done + i) % n])
            done += extra
            synchronize("warm-up launches")
    return done, host_ms


def _timed_launches(fns: Sequence[Callable], sets: Sequence[tuple], count: int, start: int,
                    host_ms: float, queue_ahead: bool) -> tuple[list[list[float]], int]:
    """CUDA events around each of ``count`` launches of every function in ``fns``.

    With several functions the launches alternate A B, B A, A B, ... so that each sees the same
    clock state. Launch j (over all functions) uses ``sets[(start + j) % len(sets)]``, so no
    launch reuses the operands another launch has just pulled into L2. Returns (times in ms
    per function, next set index).
    """
    n, k = len(sets), len(fns)
    starts = [[torch.cuda.Event(enable_timing=True) for _ in range(count)] for _ in range(k)]
    ends = [[torch.cuda.Event(enable_timing=True) for _ in range(count)] for _ in range(k)]
    if queue_ahead:
        sleep_ms = min(MAX_QUEUE_AHEAD_MS, count * (host_ms + k * EVENT_HOST_MS) * 1.5 + 0.5)
        torch.cuda._sleep(int(sleep_ms * SLEEP_CYCLES_PER_MS))
    pos = start
    for i in range(count):
        for j in (range(k) if i % 2 == 0 else range(k - 1, -1, -1)):
            args = sets[pos % n]
            starts[j][i].record()
            fns[j](*args)
            ends[j][i].record()
            pos += 1
    synchronize("timed launches")
    times = [[a.elapsed_time(b) for a, b in zip(starts[j], ends[j])] for j in range(k)]
    return times, pos


def _check_bench_args(input_sets, iters):
    if not input_sets:
        raise ValueError("bench needs at least one input set")
    if iters < 1:
        raise ValueError("iters must be >= 1")


def bench(fn: Callable, input_sets: Sequence[tuple], *, warmup: int = 10, iters: int = 100,
          min_warmup_ms: float = DEFAULT_MIN_WARMUP_MS, queue_ahead: bool = True,
          log: Log | None = None) -> BenchResult:
    """Time ``fn(A, B, D)`` with CUDA events around each launch, after warm-up.

    Warm-up: at least ``warmup`` launches and ``min_warmup_ms`` of GPU time (clocks settle).
    Launch i uses ``input_sets[i % len(input_sets)]`` (make_bench_sets sizes the list so the
    operands are not L2-resident). With ``queue_ahead`` the timed launches are queued behind a
    GPU sleep so host overhead is not timed. Returns median and best of ``iters`` launches (ms).
    """
    _check_bench_args(input_sets, iters)
    log = log or _quiet
    qa = queue_ahead and hasattr(torch.cuda, "_sleep")
    done, host_ms = _warm_up(fn, input_sets, warmup, min_warmup_ms)
    (times,), _ = _timed_launches([fn], input_sets, iters, done, host_ms, qa)
    res = BenchResult.from_times(times, warmup=done, n_sets=len(input_sets), queue_ahead=qa)
    log(f"    median {res.median_ms:.4f} ms, best {res.best_ms:.4f} ms ({iters} launches over "
        f"{res.n_sets} input set{'s' if res.n_sets > 1 else ''}, {done} warm-up)")
    return res


def bench_interleaved(fns: Mapping[str, Callable], input_sets: Sequence[tuple], *,
                      warmup: int = 10, iters: int = 100, rounds: int = 4,
                      min_warmup_ms: float = DEFAULT_MIN_WARMUP_MS, queue_ahead: bool = True,
                      log: Log | None = None) -> dict[str, BenchResult]:
    """Time several functions of (A, B, D) launch by launch in alternation (A B B A A B ...).

    Each gets its warm-up; then ``iters`` timed launches of each, alternating, so a clock or
    power change during the run affects all of them alike (a fair ratio). ``rounds`` splits the
    launches into that many queue-ahead batches (each batch queued behind one GPU sleep).
    """
    _check_bench_args(input_sets, iters)
    log = log or _quiet
    qa = queue_ahead and hasattr(torch.cuda, "_sleep")
    names = list(fns)
    rounds = max(1, min(rounds, iters))
    sizes = [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]
    warmed, host_ms, pos = {}, 0.0, 0
    for name in names:
        warmed[name], h = _warm_up(fns[name], input_sets, warmup, min_warmup_ms, start=pos)
        host_ms += h
        pos += warmed[name]
    times: dict[str, list] = {name: [] for name in names}
    for count in sizes:
        chunk, pos = _timed_launches([fns[nm] for nm in names], input_sets, count, pos,
                                     host_ms, qa)
        for name, t in zip(names, chunk):
            times[name] += t
    out = {}
    for name in names:
        res = BenchResult.from_times(times[name], warmup=warmed[name], n_sets=len(input_sets),
                                     rounds=rounds, queue_ahead=qa)
        out[name] = res
        log(f"    {name}: median {res.median_ms:.4f} ms, best {res.best_ms:.4f} ms")
    log(f"    ({iters} launches each, alternating, in {rounds} batches over "
        f"{len(input_sets)} input set{'s' if len(input_sets) > 1 else ''})")
    return out


def torch_matmul(A, B, D):
    """torch.matmul(A, B.T, out=D) (cuBLAS): the denominator of every ratio to torch."""
    torch.matmul(A, B.T, out=D)


def tflops(M: int, N: int, K: int, ms: float | None) -> float | None:
    """2*M*N*K / seconds / 1e12."""
    if ms is None or not ms > 0:
        return None
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12

