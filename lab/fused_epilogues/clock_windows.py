#!/usr/bin/env python
"""The SM clock and power draw over each path's clock-probe window, from one run's samples.

gelu_vs_cublaslt.py --clock-probe-ms T replays each path's CUDA graph alone for T ms and writes
its window ("kind": "clock_probe" records: local_start, t_start, t_end); an nvidia-smi sampler
ran beside it (``--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
--format=csv,noheader -lms 50``, its timestamps in the host's local time). This joins the two:
one JSON line per path with the samples inside its window (the first 20% of each window left
out, while the clock settles), their median SM clock (MHz), median power (W) and the count.

    python lab/fused_epilogues/clock_windows.py RUN.jsonl CLOCKS.csv [--out F.jsonl]
"""
import argparse
import datetime as dt
import json
import statistics
import sys


def parse_samples(lines):
    """(seconds since the epoch in the host's local time, SM MHz, power W) per sample line."""
    out = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            t = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            mhz = float(parts[1].split()[0])
            watts = float(parts[3].split()[0])
        except ValueError:  # the header, or a "[N/A]" field
            continue
        out.append((t, mhz, watts))
    return out


def windows(records, samples, settle=0.2):
    """One dict per clock_probe record: its path, window, and the samples' medians inside it.
    Both clocks are the host's local time: a window's ``local_start`` is parsed as the sampler's
    timestamps are (the window's length from t_end - t_start)."""
    rows = []
    for r in records:
        if r.get("kind") != "clock_probe":
            continue
        start = dt.datetime.strptime(r["local_start"], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        length = r["t_end"] - r["t_start"]
        lo, hi = start + settle * length, start + length
        inside = [s for s in samples if lo <= s[0] <= hi]
        row = {"card": r.get("card"), "kind": "clock_window", "M": r["M"], "N": r["N"],
               "K": r["K"], "path": r["path"], "window_s": round(length, 3),
               "us_per_call": r["us"], "samples": len(inside)}
        if inside:
            row["sm_mhz"] = statistics.median(s[1] for s in inside)
            row["power_w"] = statistics.median(s[2] for s in inside)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("clocks")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    with open(args.run) as f:
        records = [json.loads(line) for line in f if line.strip()]
    with open(args.clocks) as f:
        samples = parse_samples(f)
    rows = windows(records, samples)
    out = open(args.out, "a") if args.out else sys.stdout
    for row in rows:
        out.write(json.dumps(row) + "\n")
    if args.out:
        out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
