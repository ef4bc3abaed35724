#!/usr/bin/env python3
"""Run a command, pass its output through, and print a plain line whenever it has been
silent for ``--every`` seconds (10 by default): nothing a README command or a CI step runs
is silent for longer. Standard library only (it runs before any venv exists).

    python3 scripts/heartbeat.py "installing torch" -- pip install torch==2.13.0

The heartbeat says what runs, how long it has run and the command's last output line:
``installing torch: still running, elapsed 40 s (last output: Downloading torch-...)``.
No carriage returns or escape codes are added, so a log or a pipe reads the same as a
terminal. The exit status is the command's."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

HEARTBEAT_S = 10.0


def run(cmd: list[str], label: str, *, every: float = HEARTBEAT_S, out=None,
        env: dict | None = None, cwd: str | None = None) -> int:
    """Run ``cmd`` (stderr folded into stdout), copy its output to ``out`` (a binary
    stream; sys.stdout's buffer by default) and add a heartbeat line after every ``every``
    silent seconds. Returns the exit status."""
    out = out if out is not None else sys.stdout.buffer
    t0 = time.monotonic()
    state = {"last": t0, "midline": False, "tail": b""}
    lock = threading.Lock()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=cwd)

    def pump() -> None:
        fd = proc.stdout.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            with lock:
                out.write(chunk)
                out.flush()
                state["last"] = time.monotonic()
                state["midline"] = not chunk.endswith(b"\n")
                lines = [ln for ln in (state["tail"] + chunk).splitlines() if ln.strip()]
                if lines:
                    state["tail"] = lines[-1][-200:]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            time.sleep(min(1.0, every / 4))
            with lock:
                now = time.monotonic()
                if now - state["last"] >= every and proc.poll() is None:
                    tail = state["tail"].decode("utf-8", "replace").strip()
                    last = f" (last output: {tail[:100]})" if tail else ""
                    line = f"{label}: still running, elapsed {now - t0:.0f} s{last}\n"
                    out.write((b"\n" if state["midline"] else b"") + line.encode())
                    out.flush()
                    state["last"], state["midline"] = now, False
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    reader.join(timeout=5)
    return proc.wait()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: heartbeat.py [--every S] LABEL -- COMMAND...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="heartbeat.py")
    ap.add_argument("label")
    ap.add_argument("--every", type=float, default=HEARTBEAT_S)
    args = ap.parse_args(argv[:cut])
    if not argv[cut + 1:]:
        ap.error("no command after --")
    return run(argv[cut + 1:], args.label, every=args.every)


if __name__ == "__main__":
    sys.exit(main())
