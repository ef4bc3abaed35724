"""A case's verdicts: SimRow, its table line, pass or caught (row_verdict), its results/sim/ record."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from pathlib import Path

import numpy as np

from tirx_gemm.gitinfo import git_sha
from tirx_gemm.sim.cases import CHECKS
from tirx_gemm.sim.environment import _harness_version
from tirx_gemm.stepshape import StepShape

DEVICE = "NumSim, CPU model of sm_100a"

RECORDS_FILE = "numsim-cpu.jsonl"  # under results/sim/


@dataclasses.dataclass
class SimRow(StepShape):
    """One simulated case's verdicts (stepshape.StepShape: step, arch, M, N, K first)."""
    kwargs: dict
    mutant: str | None = None
    numsim: str = "skipped"   # "correct" | "WRONG" | "failed" | "skipped"
    rel_err: float | None = None
    sync: str = "skipped"     # a checker verdict, "accepted review", or "skipped"
    race: str = "skipped"
    seconds: float = 0.0
    ok: bool = False
    problems: list = dataclasses.field(default_factory=list)  # one line each
    checks: tuple = CHECKS  # the checks this case ran (cases.checks_for)

    def to_record(self, seed: int, checks: tuple[str, ...]) -> dict:
        import tvm  # the version only; tvm is already imported to build the kernel
        return {
            "kind": "numsim", "step": self.step, "arch": self.arch, "M": self.M, "N": self.N,
            "K": self.K, "kwargs": self.kwargs, "dtype": self.kwargs.get("dtype", "float16"),
            "device": DEVICE, "numsim": self.numsim,
            "rel_err": self.rel_err if self.rel_err is not None and np.isfinite(self.rel_err)
            else None, "synccheck": self.sync, "racecheck": self.race,
            "checks": list(checks), "verified": self.ok, "seed": seed,
            "seconds": round(self.seconds, 1), "tvm_version": tvm.__version__,
            "tirx_harness_version": _harness_version(), "git_sha": git_sha(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }


HEAD = (f"{'step':4} {'shape':13} {'kwargs':24} {'result':8} {'rel err':>8} "
        f"{'synccheck':15} {'racecheck':15} {'seconds':>7}")


def format_row(r: SimRow) -> str:
    kw = " ".join(f"{k}={v}" for k, v in r.kwargs.items()) or "-"
    if r.mutant:
        kw = f"MUTANT {r.mutant} " + ("" if kw == "-" else kw)
    rel = f"{r.rel_err:.1e}" if r.rel_err is not None else "-"
    return (f"{r.step:4} {f'{r.M}x{r.N}x{r.K}':13} {kw:24} {r.numsim:8} {rel:>8} "
            f"{r.sync:15} {r.race:15} {r.seconds:7.1f}")


def mutant_missed(row: SimRow) -> str | None:
    """For a mutant's row: None when the gate caught it as the mutant says it must (the row
    fails, each check in ``must_flag`` flags it, and a ``numbers_right`` mutant's numbers are
    still right, so only the checkers saw it); else why the gate missed it, in one line."""
    from tirx_gemm import mutants
    m = mutants.get(row.mutant)
    passed = {"numsim": row.numsim == "correct", "sync": row.sync == "clean",
              "race": row.race == "clean"}
    if row.ok:
        return f"mutant {m.name} ({m.bug}) passed the gate"
    quiet = [w for w in m.must_flag if passed[w]]
    if quiet:
        return f"mutant {m.name}: {', '.join(quiet)} did not flag it"
    if m.numbers_right and row.numsim != "correct":
        return f"mutant {m.name}: its numbers should be right (only the checkers see it), got {row.numsim}"
    return None


def row_verdict(row: SimRow) -> bool:
    """A real case passes when it is correct and clean; a mutant's when the gate caught it."""
    return mutant_missed(row) is None if row.mutant else row.ok


def append_records(rows: list[SimRow], seed: int, checks, results_dir="results") -> Path:
    path = Path(results_dir) / "sim" / RECORDS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    from tirx_gemm.report.records import record_problem
    recs = [r.to_record(seed, tuple(c for c in checks if c in r.checks)) for r in rows]
    for rec in recs:  # a record names the checkers that ran, and claims nothing else
        problem = record_problem(rec)
        if problem:
            raise ValueError(f"refusing to record {rec['step']} {rec['M']}x{rec['N']}x"
                             f"{rec['K']}: {problem}")
    with open(path, "a", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    return path
