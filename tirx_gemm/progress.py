"""Progress lines for long work: nothing the CLI does is silent for more than ``every``
seconds (10 by default).

:class:`Progress` prints one plain line per finished item ("built 5/18 (v7@sm_90a 12.3 s)
elapsed 40 s") and, from a daemon thread, a heartbeat line whenever nothing was printed for
``every`` seconds ("building: 5/18 done, v8@sm_90a running, elapsed 50 s"). Plain lines only:
no carriage returns or escape codes, so a log or a pipe reads the same as a terminal.
Standard library only.
"""

from __future__ import annotations

import sys
import threading
import time

from tirx_gemm.stepshape import shape_text

__all__ = ["HEARTBEAT_S", "Progress"]

HEARTBEAT_S = 10.0


class Progress:
    """``with Progress("building", total) as p: ... p.item("built", "v7@sm_90a", 12.3)``.

    ``stream`` is bound when the object is made (a later redirect of sys.stdout/sys.stderr,
    such as the simulator's capture of engine output, does not swallow the heartbeat).
    ``enabled=False`` prints nothing."""

    def __init__(self, what: str, total: int | None = None, *, stream=None,
                 every: float = HEARTBEAT_S, enabled: bool = True):
        self.what, self.total, self.every, self.enabled = what, total, every, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.current: str | None = None  # what is running now, for the heartbeat
        self.t0 = time.monotonic()
        self._last = self.t0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _count(self) -> str:
        return f"{self.done}/{self.total}" if self.total else str(self.done)

    def say(self, line: str) -> None:
        """Print one line (and restart the heartbeat's clock)."""
        if not self.enabled:
            return
        with self._lock:
            print(line, file=self.stream, flush=True)
            self._last = time.monotonic()

    def touch(self) -> None:
        """Something else was just printed: restart the heartbeat's clock."""
        self._last = time.monotonic()

    def item(self, verb: str, label: str, seconds: float | None = None) -> None:
        """One finished item: "built 5/18 (v7@sm_90a 12.3 s) elapsed 40 s"."""
        self.done += 1
        took = f" {seconds:.1f} s" if seconds is not None else ""
        self.say(f"{verb} {self._count()} ({label}{took}) elapsed {self.elapsed():.0f} s")

    def build_done(self, req, res) -> None:
        """The line of one finished build_many request (step, shape) -> BuildResult or the
        exception: "built 5/18 (v7@sm_90a 4096x4096x4096 12.3 s)", "cached", or "FAILED"."""
        if isinstance(res, Exception):
            verb, secs = "FAILED", None
        else:
            verb = "cached" if res.cached else "built"
            secs = None if res.cached else res.times.get("total")
        dtype = (req[2] if len(req) > 2 else {}).get("dtype", "float16")
        extra = "" if dtype == "float16" else f" {dtype}"
        self.item(verb, f"{req[0].key} {shape_text(req[1])}{extra}", secs)

    def heartbeat_line(self) -> str:
        running = f", {self.current} running" if self.current else ""
        if self.total is None and not self.done:  # one piece of work: only how long so far
            return f"{self.what}{running}: still working, elapsed {self.elapsed():.0f} s"
        return f"{self.what}: {self._count()} done{running}, elapsed {self.elapsed():.0f} s"

    # ------------------------------------------------------------------------------
    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.every / 4)):
            if time.monotonic() - self._last >= self.every:
                self.say(self.heartbeat_line())

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._thread = threading.Thread(target=self._beat, name="tirx-gemm-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
