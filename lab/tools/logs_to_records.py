#!/usr/bin/env python
"""Figures that exist only in H200 text logs, as JSON-lines records (one home per fact; README.md and the lessons quote them through render_docs' rec markers).

    python lab/tools/logs_to_records.py [--check]

Each record names its source log (``source``) and device; every field is read from the
log by the regular expression next to it below, nothing is computed but unit changes
(ms to s). Without --check the record files under lab/*/records/ are rewritten; with
--check nothing is written and the exit status is 1 when a file differs from what its
logs give (each stale file named).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# fast.cu kernel 12 timed beside torch.matmul (scripts/lab/fastcu_bench.py's output)
FASTCU_LOGS = {"first": "lab/steps_on_h200/logs/v10_ping_pong/fastcu.log",
               "before": "lab/steps_on_h200/logs/v10_ping_pong/final_fastcu.log",
               "after": "lab/steps_on_h200/logs/v10_ping_pong/final_fastcu_after.log"}
_FASTCU_DEVICE = re.compile(r"^# (NVIDIA [^|]+?) \|", re.M)
_FASTCU_ROW = re.compile(r"^(fastcu_k12|torch_mm) (\d+)x(\d+)x(\d+) ([\d.]+) ([\d.]+) "
                         r"([\d.]+) ([\d.e+-]+)$", re.M)
_FASTCU_ROUNDS = re.compile(r"^#\s+rounds us: fastcu ([\d. ]+) \| torch ([\d. ]+) \| "
                            r"median of per-round ratios ([\d.]+)$", re.M)

# Nsight Compute's GPU Speed Of Light section, one launch per file
NCU_GLOB = "lab/ncu_profiles/logs/ncu/h200_*.txt"
_NCU_FILE = re.compile(r"h200_(\d+)_([a-z0-9]+)(?:_.*)?\.txt")
# lab/ncu_profiles/ncu_decode.sh's logs: matmul's pick or torch.matmul at M x N x K
# (decode: the decode shapes; mid: mid-size shapes of one or two waves, with the tensor pipes;
# stalls: mid-size shapes with the tensor pipe's busy cycles per SM and the stall reasons;
# m129: one kernel, matmul's 64x80 swapped, at 129 and 160 tokens on a 4096x4096 weight;
# split: the K-split shapes, lab/ncu_profiles/h200_splitprof.sh, with the dtype in the name and,
# for torch, both kernels of its call: cuBLAS's split-K GEMM and its reduce kernel; mdec:
# decode at 49-96 tokens on weights whose persistent swap-AB grid trails torch, an earlier run; c4:
# the same shapes, matmul's swap-AB kernel in clusters of four, an earlier run)
_NCU_DECODE_FILE = re.compile(r"h200_(?:decode|mid|stalls|m129|split|mdec|c4)_(ours|torch)_(\d+)x(\d+)x"
                              r"(\d+)(?:_(float16|bfloat16))?\.txt")
_NCU_DEVICE = re.compile(r" on (NVIDIA [\w ]+?) \(cc")
# a profiled launch's header: name (grid)x(block), then its sections up to the next header
# (a name may hold spaces: "void cublasLt::splitKreduce_kernel<...>(...)")
_NCU_KERNEL = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context",
                         re.M)
_NCU_METRICS = {"sm_ghz": r"SM Frequency\s+Ghz\s+([\d.]+)",
                "duration_us": r"Duration\s+us\s+([\d.,]+)",
                "l2_pct": r"L2 Cache Throughput\s+%\s+([\d.]+)",
                "sm_pct": r"Compute \(SM\) Throughput\s+%\s+([\d.]+)",
                "memory_pct": r"Memory Throughput\s+%\s+([\d.]+)",
                "dram_pct": r"DRAM Throughput\s+%\s+([\d.]+)"}
# the Compute Workload Analysis section's figures, where a log has it (EXTRA_SECS)
_NCU_OPTIONAL = {"issue_slots_busy_pct": r"Issue Slots Busy\s+%\s+([\d.]+)",
                 "executed_ipc": r"Executed Ipc Active\s+inst/cycle\s+([\d.]+)",
                 # the stalls logs' --metrics: the tensor pipe busy per active cycle (mean
                 # over SMs), on the busiest SM per elapsed cycle, and its cycles summed
                 "tensor_active_pct": r"sm__pipe_tensor_op_hmma_cycles_active\.avg\."
                                      r"pct_of_peak_sustained_active\s+%\s+([\d.]+)",
                 "tensor_busiest_sm_elapsed_pct": r"sm__pipe_tensor_op_hmma_cycles_active\."
                                                  r"max\.pct_of_peak_sustained_elapsed\s+%\s+"
                                                  r"([\d.]+)",
                 "tensor_cycles_sum": r"sm__pipe_tensor_op_hmma_cycles_active\.sum\s+cycle"
                                      r"\s+([\d,]+)\n"}
_NCU_UNMODIFIED = "Running with unmodified GPU clocks"

# notebook 07 run headless from a bundle: its "measured here" table row
NOTEBOOK_LOG = "lab/steps_on_h200/logs/h200_notebook_07.log"
_NOTEBOOK_ROW = re.compile(r"^\| (v\d+) \| (sm_\w+) \| (NVIDIA [^|]+?) \| (\d+)x(\d+)x(\d+) \| "
                           r"(\S+) \| ([\d.e+-]+) \| ([\d.]+) \| ([\d.]+)x \| ([\d-]+) \|$", re.M)

# lab/hang_guard/gpu_watchdog_demo.sh: a mutant's watchdog build, then its normal build
WATCHDOG_LOG = "lab/hang_guard/logs/h200_watchdog.log"
_WATCHDOG_CASE = re.compile(r"^(v\d+)/(sm_\w+) M,N,K=(\d+),(\d+),(\d+) on (NVIDIA [\w ]+?) \(",
                            re.M)
_WATCHDOG_END = re.compile(r"^== (watchdog|normal) build: exit code (\d+) after (\d+) ms$",
                           re.M)


def _read(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def _need(found, what: str, rel: str):
    if not found:
        raise SystemExit(f"logs_to_records: no {what} in {rel}")
    return found


def fastcu_records() -> list[dict]:
    out = []
    for run, rel in FASTCU_LOGS.items():
        text = _read(rel)
        device = _need(_FASTCU_DEVICE.search(text), "device header", rel).group(1)
        rows = _need(_FASTCU_ROW.findall(text), "result rows", rel)
        rounds = _FASTCU_ROUNDS.findall(text)
        torch = {tuple(r[1:4]): r for r in rows if r[0] == "torch_mm"}
        fast = [r for r in rows if r[0] == "fastcu_k12"]
        if len(rounds) != len(fast):
            raise SystemExit(f"logs_to_records: {rel}: {len(fast)} rows, {len(rounds)} rounds")
        for row, (ours_us, torch_us, median) in zip(fast, rounds):
            t = torch[tuple(row[1:4])]
            out.append({"source": rel, "device": device, "run": run, "impl": "fast.cu k12",
                        "dtype": "bfloat16", "M": int(row[1]), "N": int(row[2]),
                        "K": int(row[3]), "tflops": float(row[4]), "us": float(row[5]),
                        "ratio_to_torch": float(row[6]), "torch_tflops": float(t[4]),
                        "torch_us": float(t[5]),
                        "round_us": [float(x) for x in ours_us.split()],
                        "torch_round_us": [float(x) for x in torch_us.split()],
                        "median_round_ratio": float(median)})
    return out


def ncu_records() -> list[dict]:
    out = []
    for path in sorted(ROOT.glob(NCU_GLOB)):
        rel, text = str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
        decode = _NCU_DECODE_FILE.fullmatch(path.name)
        if decode:
            who, mnk = decode.group(1), [int(decode.group(i)) for i in (2, 3, 4)]
            gemm = "torch.matmul" if who == "torch" else "tirx_gemm.matmul"
        else:
            m = _need(_NCU_FILE.fullmatch(path.name), "size and kernel in the name", rel)
            mnk = [int(m.group(1))] * 3
            gemm = "torch.matmul" if m.group(2) == "torch" else m.group(2)
        dev = _NCU_DEVICE.search(text)
        kernels = _need(list(_NCU_KERNEL.finditer(text)), "kernel line", rel)
        for n, kern in enumerate(kernels):  # one record per profiled launch
            section = text[kern.start():kernels[n + 1].start() if n + 1 < len(kernels) else None]
            rec = {"source": rel,
                   "device": dev.group(1) if dev else "NVIDIA H200",
                   "device_named_by": "log" if dev else "file name (h200_)",
                   "gemm": gemm, "M": mnk[0], "N": mnk[1], "K": mnk[2],
                   "kernel": kern.group(1), "grid": [int(kern.group(i)) for i in (2, 3, 4)],
                   "threads": int(kern.group(5)) * int(kern.group(6)) * int(kern.group(7)),
                   "gpu_clocks": ("unmodified" if _NCU_UNMODIFIED in text
                                  else "ncu default control")}
            if decode and decode.group(5):
                rec["dtype"] = decode.group(5)
            if len(kernels) > 1:
                rec["launch"] = n + 1  # its place among the call's profiled launches
            for key, pattern in _NCU_METRICS.items():
                rec[key] = float(_need(re.search(pattern, section), key, rel).group(1)
                                 .replace(",", ""))
            for key, pattern in _NCU_OPTIONAL.items():
                found = re.search(pattern, section)
                if found:
                    rec[key] = float(found.group(1).replace(",", ""))
            out.append(rec)
    return _need(out, "Nsight Compute log", NCU_GLOB)


def notebook_records() -> list[dict]:
    text = _read(NOTEBOOK_LOG)
    return [{"source": NOTEBOOK_LOG, "device": r[2], "step": r[0], "arch": r[1],
             "M": int(r[3]), "N": int(r[4]), "K": int(r[5]), "check": r[6],
             "rel_err": float(r[7]), "tflops": float(r[8]), "ratio_to_torch": float(r[9]),
             "date": r[10]}
            for r in _need(_NOTEBOOK_ROW.findall(text), "measured table row", NOTEBOOK_LOG)]


def watchdog_records() -> list[dict]:
    text = _read(WATCHDOG_LOG)
    cases = _need(_WATCHDOG_CASE.findall(text), "case line", WATCHDOG_LOG)
    ends = _need(_WATCHDOG_END.findall(text), "exit line", WATCHDOG_LOG)
    if len(cases) != len(ends):
        raise SystemExit(f"logs_to_records: {WATCHDOG_LOG}: {len(cases)} cases, {len(ends)} exits")
    return [{"source": WATCHDOG_LOG, "device": c[5], "step": c[0], "arch": c[1],
             "M": int(c[2]), "N": int(c[3]), "K": int(c[4]), "build": e[0],
             "exit_code": int(e[1]), "elapsed_s": int(e[2]) / 1000}
            for c, e in zip(cases, ends)]


OUTPUTS = {"lab/steps_on_h200/records/fastcu_h200.jsonl": fastcu_records,
           "lab/ncu_profiles/records/ncu_h200.jsonl": ncu_records,
           "lab/steps_on_h200/records/notebook07_h200.jsonl": notebook_records,
           "lab/hang_guard/records/watchdog_h200.jsonl": watchdog_records}


def rendered() -> dict[str, str]:
    return {rel: "".join(json.dumps(r, sort_keys=True) + "\n" for r in make())
            for rel, make in OUTPUTS.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a record file differs from its logs")
    args = ap.parse_args(argv)
    stale = 0
    for rel, text in rendered().items():
        path = ROOT / rel
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            print(f"stale: {rel} (run python lab/tools/logs_to_records.py)")
            stale = 1
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {rel}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
