"""How close the largest bf16 GEMMs come to the card's tensor-core peak, and what holds them
under it: at each large shape of ``suites/ceiling.json``, torch.mm and tirx_gemm.matmul's pick
timed under CUDA graphs, while a sampler thread reads the SM clock, the board power and the
clock-event reasons through NVML every few milliseconds.

    tirx-gemm export --suite lab/bf16_ceiling/suites/ceiling.json --arch sm_90a --card all \\
        --num-sms 132 --out B                                                    # here
    TIRX_GEMM_BUNDLE=B python3 lab/bf16_ceiling/ceiling.py run --out F.jsonl     # GPU host
    python3 lab/bf16_ceiling/ceiling.py table F.jsonl                            # anywhere

Two modes per shape and path: ``burst`` (after IDLE_S seconds idle, one graph of a few
launches: the clock has come back to its idle maximum) and ``sustained`` (graphs of both paths
replayed in alternating order for ROUNDS rounds after WARM_S seconds of load: what a long run
sees). Each record has the time, TFLOP/s, the median SM clock and mean power over its replays,
the clock-event reasons seen, and the peak at that clock: SMs x FLOP_PER_CLK x clock, where
FLOP_PER_CLK is Hopper's dense 16-bit tensor rate per SM (4096 flops a cycle: 989.4 TFLOP/s
for an H100 SXM at 1830 MHz). ``frac_of_clock_peak`` is the share of that peak the kernel ran.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parents[0] / "tools"))

FLOP_PER_CLK = 4096  # dense bf16/fp16 flops per SM per cycle on sm_90 (4 tensor cores x 512 FMA)
IDLE_S = 1.5
WARM_S = 1.5
ROUNDS = 8
GRAPH_MS = 40.0  # launches per graph: about this long at 700 TFLOP/s
REASONS = {  # NVML clocks-event reason bits (nvmlClocksEventReason*)
    0x1: "gpu_idle", 0x2: "app_clock_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clock"}


class Sampler:
    """NVML readings of GPU 0 every ``period_s`` in a thread: (t, sm MHz, power W, reasons)."""

    def __init__(self, period_s: float = 0.004):
        import pynvml
        pynvml.nvmlInit()
        self.nv = pynvml
        self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.period = period_s
        self.rows: list[tuple[float, int, float, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def card(self) -> dict:
        nv, h = self.nv, self.h
        return {"max_sm_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
                "power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3}

    def _loop(self):
        nv, h = self.nv, self.h
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        while not self._stop.is_set():
            try:
                row = (time.perf_counter(), nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                       nv.nvmlDeviceGetPowerUsage(h) / 1e3,
                       reasons(h))
            except nv.NVMLError:
                row = None
            if row:
                self.rows.append(row)
            time.sleep(self.period)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def between(self, spans) -> dict:
        """Median clock, mean power and the reasons seen over the samples inside ``spans``."""
        got = [r for r in list(self.rows) if any(a <= r[0] <= b for a, b in spans)]
        if not got:
            return {"samples": 0}
        bits = 0
        for r in got:
            bits |= r[3]
        return {"samples": len(got), "sm_mhz": statistics.median(r[1] for r in got),
                "power_w": round(statistics.fmean(r[2] for r in got), 1),
                "reasons": [n for b, n in REASONS.items() if bits & b]}


def _replay(g) -> tuple[float, float, float]:
    """(ms of one replay of ``g``, host time before, host time after)."""
    from tirx_gemm.op.fp8_bench import _replay_ms
    t0 = time.perf_counter()
    ms = _replay_ms(g)
    return ms, t0, time.perf_counter()


def run(out: Path, budget_s: float) -> int:
    import torch
    import tirx_gemm.matmul as mm
    from gpu_host import start
    from tirx_gemm.op.fp8_bench import _capture
    from tirx_gemm.run.checking import compare
    suite = json.loads((HERE / "suites" / "ceiling.json").read_text())
    props, card, fout = start(torch, str(out))
    sms = props.multi_processor_count
    t_begin = time.time()
    with Sampler() as smp:
        info = smp.card()
        print(f"max SM clock {info['max_sm_mhz']} MHz, power limit {info['power_limit_w']} W",
              flush=True)
        for sh in suite["shapes"]:
            M, N, K = sh["M"], sh["N"], sh["K"]
            if time.time() - t_begin > budget_s:
                print(f"budget spent: {M}x{N}x{K} and later not run", flush=True)
                break
            bf = torch.bfloat16
            g = torch.Generator(device="cuda").manual_seed(M + 3 * N + 7 * K)
            a = torch.randn(M, K, device="cuda", dtype=bf, generator=g)
            b = torch.randn(N, K, device="cuda", dtype=bf, generator=g) / K ** 0.5
            ref = torch.mm(a, b.t())
            got = mm.matmul(a, b, sync=True)
            res = compare(got.float(), ref.float(), rtol=8e-3)
            flops = 2.0 * M * N * K
            calls = max(2, round(GRAPH_MS * 1e-3 * 700e12 / flops))
            y = torch.empty(M, N, device="cuda", dtype=bf)
            paths = {"torch.mm": lambda: torch.mm(a, b.t(), out=y)}
            if res.ok:  # a wrong kernel is recorded (tirx_ok, tirx_rel_err), never timed
                paths["tirx"] = lambda: mm.matmul(a, b, out=y)
            else:
                print(f"{M}x{N}x{K}: tirx wrong ({res.reason}): not timed", flush=True)
            graphs = {k: _capture([f] * calls) for k, f in paths.items()}
            base = {"card": card, "torch": torch.__version__, **info, "sms": sms,
                    "M": M, "N": N, "K": K, "dtype": "bfloat16", "calls": calls,
                    "explain": mm.explain(M, N, K, "bfloat16").splitlines()[0],
                    "tirx_ok": res.ok, "tirx_rel_err": res.rel_frobenius_error}
            recs = []
            for name, gr in graphs.items():  # burst: after an idle pause, one graph
                time.sleep(IDLE_S)
                ms, t0, t1 = _replay(gr)
                recs.append({"mode": "burst", "path": name, "ms": ms / calls,
                             **smp.between([(t0, t1)])})
            t_end = time.perf_counter() + WARM_S
            while time.perf_counter() < t_end:
                for gr in graphs.values():
                    _replay(gr)
            times = {k: [] for k in graphs}
            spans = {k: [] for k in graphs}
            order = list(graphs)
            for r in range(ROUNDS):
                for k in (order if r % 2 == 0 else order[::-1]):
                    ms, t0, t1 = _replay(graphs[k])
                    times[k].append(ms / calls)
                    spans[k].append((t0, t1))
            for k in graphs:
                recs.append({"mode": "sustained", "path": k, "ms": statistics.median(times[k]),
                             **smp.between(spans[k])})
            for rec in recs:
                rec = {**base, **rec}
                rec["tflops"] = round(flops / (rec["ms"] * 1e-3) / 1e12, 1)
                if rec.get("sm_mhz"):
                    peak = sms * FLOP_PER_CLK * rec["sm_mhz"] * 1e6 / 1e12
                    rec["peak_at_clock_tflops"] = round(peak, 1)
                    rec["frac_of_clock_peak"] = round(rec["tflops"] / peak, 3)
                print(json.dumps({k: rec.get(k) for k in (
                    "M", "N", "K", "mode", "path", "ms", "tflops", "sm_mhz", "power_w",
                    "reasons", "frac_of_clock_peak")}), flush=True)
                fout.write(json.dumps(rec) + "\n")
                fout.flush()
            del a, b, ref, got, y, graphs
            torch.cuda.empty_cache()
    return 0


def table(files) -> str:
    rows = [json.loads(ln) for f in files for ln in Path(f).read_text().splitlines() if ln]
    out = ["| shape | mode | path | ms | TFLOP/s | SM MHz | power W | clock events | of peak at clock |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['M']}x{r['N']}x{r['K']} | {r['mode']} | {r['path']} | {r['ms']:.3f} | "
                   f"{r['tflops']:.0f} | {r.get('sm_mhz', '')} | {r.get('power_w', '')} | "
                   f"{', '.join(r.get('reasons') or []) or '-'} | {r.get('frac_of_clock_peak', '')} |")
    sus_t = [r for r in rows if r["mode"] == "sustained" and r["path"] == "torch.mm"]
    sus_x = [r for r in rows if r["mode"] == "sustained" and r["path"] == "tirx"]
    if sus_t and sus_x:
        best_t = max(sus_t, key=lambda r: r["tflops"])
        best_x = max(sus_x, key=lambda r: r["tflops"])
        out.append("")
        out.append(f"torch's best sustained shape: {best_t['M']}x{best_t['N']}x{best_t['K']} "
                   f"{best_t['tflops']:.0f} TFLOP/s; tirx's best: {best_x['M']}x{best_x['N']}x"
                   f"{best_x['K']} {best_x['tflops']:.0f} TFLOP/s = "
                   f"{best_x['tflops'] / best_t['tflops']:.3f} of torch's best ({rows[0]['card']})")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--budget-s", type=float, default=120.0)
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return run(Path(args.out), args.budget_s)
    print(table(args.files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
