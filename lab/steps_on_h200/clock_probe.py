#!/usr/bin/env python
"""What limits a GEMM on this GPU: its clock and power while it runs, and the work it gets
done per SM per clock.

For torch.matmul and each kernel of a bundle (a registry bundle or a sweep bundle), at each
of its shapes, this runs the GEMM back to back for ``--seconds`` (inputs rotated past L2,
as the timing does) while ``nvidia-smi`` samples the SM clock, power draw, temperature and
the active clock-event reasons every 100 ms. It prints, per GEMM:

    TFLOP/s over the window  |  median SM clock  |  power / limit  |  reasons
    flop/clk/SM = TFLOP/s / (SMs x clock), and that as a fraction of the tensor cores'
    dense fp16 peak (4096 flop/clk/SM on sm_90, the figure behind H100's 989 TFLOP/s at
    1830 MHz)

A kernel whose clock sits below the maximum with the power-cap reason active is power
limited: at that point a faster kernel must do the same work with less energy, not just
issue faster. Two GEMMs at the same flop/clk/SM are equally efficient whatever their clock.

    python lab/steps_on_h200/clock_probe.py --bundle build/bundle-sweep [--seconds 3] \\
        [--steps v7,v8,v9] [--records lab/steps_on_h200/records/h200_clock_probe.jsonl]

Run on the GPU host (torch, no TVM). Never changes clocks or settings; it only reads them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PEAK_FLOP_PER_CLK_SM = {"sm_90a": 4096}
SMI_FIELDS = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active"
# nvidia-smi's clock-event reason bits (nvml's nvmlClocksEventReason*)
REASONS = {0x1: "idle", 0x2: "app-clocks", 0x4: "sw-power-cap", 0x8: "hw-slowdown",
           0x20: "sw-thermal", 0x40: "hw-thermal", 0x80: "hw-power-brake"}


class Sampler:
    """nvidia-smi -lms in the background; samples kept with the host time they arrived."""

    def __init__(self, period_ms: int = 100):
        self.samples: list[tuple[float, list[str]]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
             f"-lms={period_ms}", "-i", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.samples.append((time.monotonic(), [x.strip() for x in line.split(",")]))

    def window(self, t0: float, t1: float) -> list[list[str]]:
        return [s for t, s in self.samples if t0 <= t <= t1]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _num(x: str):
    try:
        return float(x)
    except ValueError:
        return None


def summarize(rows: list[list[str]]) -> dict:
    def med(i):
        vals = [v for v in (_num(r[i]) for r in rows if len(r) > i) if v is not None]
        return statistics.median(vals) if vals else None
    bits = 0
    for r in rows:
        if len(r) > 5:
            try:
                bits |= int(r[5], 16)
            except ValueError:
                pass
    return {"samples": len(rows), "sm_mhz": med(0), "max_sm_mhz": med(1), "power_w": med(2),
            "power_limit_w": med(3), "temp_c": med(4), "reasons_hex": hex(bits),
            "reasons": [name for bit, name in REASONS.items() if bits & bit]}


def run_window(fn, sets, seconds: float, sampler: Sampler, flop: float, sync) -> dict:
    """Run fn back to back for ``seconds`` after 0.5 s of settling; TFLOP/s over the window."""
    i = 0
    settle_end = time.monotonic() + 0.5
    while time.monotonic() < settle_end:  # let the clock settle before the window opens
        for _ in range(8):
            fn(*sets[i % len(sets)])
            i += 1
        sync()
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        for _ in range(8):
            fn(*sets[i % len(sets)])
            i += 1
            n += 1
        sync()
    t1 = time.monotonic()
    out = summarize(sampler.window(t0, t1))
    out["tflops"] = flop * n / (t1 - t0) / 1e12
    out["launches"] = n
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True, help="exported bundle (registry or sweep)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--steps", default="", help="comma-separated step ids (default: all)")
    ap.add_argument("--records", help="append one JSON line per GEMM here")
    args = ap.parse_args(argv)
    if not args.seconds > 0:
        ap.error("--seconds must be positive")

    import torch
    from tirx_gemm.compile import bundle
    from tirx_gemm.run import device
    from tirx_gemm.run import launcher
    from tirx_gemm.run import loader
    from tirx_gemm.run import timing
    arch, why = device.gpu_arch()
    if arch is None:
        print(f"clock_probe: error: {why}", file=sys.stderr)
        return 2
    entries = [e for e in bundle.load_manifest(Path(args.bundle)) if e["arch"] == arch]
    want = {s for s in args.steps.split(",") if s}
    entries = [e for e in entries if not want or e["step"] in want]
    if not entries:
        print(f"clock_probe: error: no {arch} kernel of {sorted(want) or 'any step'} in "
              f"{args.bundle}", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    peak = PEAK_FLOP_PER_CLK_SM.get(arch)
    sampler = Sampler()
    out = open(args.records, "a", encoding="utf-8") if args.records else None
    print(f"{'gemm':34} {'TFLOP/s':>8} {'SM MHz':>7} {'power W':>12} {'temp':>5} "
          f"{'flop/clk/SM':>11} {'of peak':>7}  reasons")
    try:
        for mnk in sorted({(e["M"], e["N"], e["K"]) for e in entries}):
            M, N, K = mnk
            sets = timing.make_bench_sets(M, N, K)
            flop = 2.0 * M * N * K
            gemms = [("torch.matmul", timing.torch_matmul)]
            for e in entries:
                if (e["M"], e["N"], e["K"]) != mnk:
                    continue
                h = launcher.KernelHandle(loader.load_kernel(str(Path(args.bundle) / e["lib"])), e)
                h(*sets[0])  # one validated, synchronized launch first
                kw = {k: v for k, v in e["kwargs"].items() if k != "SM_COUNT"}
                label = e["step"] + (" " + " ".join(f"{k}={v}" for k, v in kw.items()) if kw else "")
                label += f" SMs={e['kwargs'].get('SM_COUNT', '-')}"
                if e.get("watchdog_ms"):
                    label += f" wd{e['watchdog_ms']}"
                gemms.append((label, h.kernel))
            for label, fn in gemms:
                with launcher.hang_label(f"{label} {M}x{N}x{K}"):
                    r = run_window(fn, sets, args.seconds, sampler, flop,
                                   lambda: launcher.synchronize(f"{label} {M}x{N}x{K}"))
                fpc = (r["tflops"] * 1e12 / (sms * r["sm_mhz"] * 1e6)) if r["sm_mhz"] else None
                r.update(gemm=label, M=M, N=N, K=K, arch=arch, sms=sms,
                         flop_per_clk_sm=fpc, of_peak=(fpc / peak if fpc and peak else None),
                         device=torch.cuda.get_device_name(0))
                pw = f"{r['power_w'] or 0:.0f}/{r['power_limit_w'] or 0:.0f}"
                print(f"{label + ' ' + str(M):34} {r['tflops']:8.1f} {r['sm_mhz'] or 0:7.0f} "
                      f"{pw:>12} {r['temp_c'] or 0:5.0f} {fpc or 0:11.0f} "
                      f"{(r['of_peak'] or 0):7.3f}  {','.join(r['reasons']) or '-'}", flush=True)
                if out:
                    out.write(json.dumps(r, sort_keys=True) + "\n")
    finally:
        sampler.close()
        if out:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
