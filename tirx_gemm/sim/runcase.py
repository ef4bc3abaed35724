"""One case on NumSim (each input set, CLC's cancel path), then synccheck and racecheck: a SimRow."""

from __future__ import annotations

import time
import traceback

import numpy as np

from tirx_gemm import numerics
from tirx_gemm.registry import Step
from tirx_gemm.sim.cases import CHECKS, SimCase
from tirx_gemm.sim.environment import (SimEnvironmentError, crates_note, environment_failure,
                                       opt_level_for)
from tirx_gemm.sim.inputs import (case_inputs_np, check_output_np, input_kinds,
                                  make_workspace_np, workspace_dirt_np, workspace_specs)
from tirx_gemm.sim.rows import SimRow

def _checker_verdict(name: str, report, step: Step, row: SimRow, log) -> str:
    """Verdict text for the table; appends a problem line unless the verdict passes."""
    text = report.format()
    log(f"--- {name} ({row.step}@{row.arch} {row.M}x{row.N}x{row.K} {row.kwargs}) ---\n{text}\n")
    verdict = report.verdict
    if verdict == "clean":
        return "clean"
    findings = list(report.findings)
    if verdict == "review":
        accepted = dict(step.sim_accept)
        open_ = [f for f in findings if f.status == "review" and f.kind not in accepted]
        if not open_ and all(f.status in ("review", "info") for f in findings):
            for f in findings:
                if f.kind in accepted:
                    log(f"accepted review {f.kind}: {accepted[f.kind]}\n")
            return "accepted review"
    worst = [f for f in findings if f.status == verdict] or findings
    first = f"{worst[0].kind}: {str(worst[0].message).splitlines()[0]}" if worst else ""
    row.problems.append(f"{name} {verdict}" + (f" ({first})" if first else ""))
    return verdict


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0][:300] if text else type(e).__name__
    if type(e).__name__ == "NumSimBuildError":  # the engines are Rust crates built by cargo
        line += " (the full error is in the log)"
    return line


# A PrimFunc attribute (v10, Cluster Launch Control): how many clusters a GPU would keep
# resident. The whole launch (every cluster resident) takes CLC's fail path only; the
# cancel path needs the others pending, i.e. a run of the first `resident` clusters.
RESIDENT_ATTR = "tirx_gemm.resident_clusters"


def _cancel_path_ok(engine, module, resident: int, operands, inputs, dtype, case, row,
                    log) -> bool:
    """NumSim on the first ``resident`` clusters only: the pending ones are the clusters
    their try_cancel requests take over, so the resident ones must compute every tile.
    Numbers only: the checkers certify no subset run (they answer "incomplete")."""
    from tirx_harness.numsim.api import ExecutionSubset
    A, B, D = inputs
    res = engine.run(module, operands(A, B, D),
                     subset=ExecutionSubset(cluster_ids=tuple(range(resident))))
    cmp = numerics.compare_np(np.asarray(res.outputs["D"]), numerics.reference_np(A, B),
                              dtype=dtype)
    log(f"--- numsim cancel path: {resident} resident clusters, random inputs "
        f"({case.label}) ---\n{cmp.summary()}\ndiagnostics: {res.diagnostics}\n")
    if not cmp.ok:
        row.problems.append(f"numsim cancel path ({resident} resident clusters): "
                            f"{cmp.summary()}")
    if res.verdict != "clean":
        row.problems.append(f"numsim cancel path ({resident} resident clusters) diagnostics "
                            f"{res.verdict}: {res.diagnostics}")
    return cmp.ok and res.verdict == "clean"


def run_case(case: SimCase, *, checks=CHECKS, seed: int = 0, log=lambda s: None,
             engine=None) -> SimRow:
    """Simulate one case; never raises for a kernel problem (it goes into the row). A
    failure of the machine's NumSim set-up that every case would repeat (no cargo, the
    engines' build failing) raises SimEnvironmentError naming the cause."""
    crates_note()  # cargo builds from the vendored crates unless the user chose otherwise
    with opt_level_for(case.step.id):  # rustc's level for this step (environment.py)
        return _run_case(case, checks=checks, seed=seed, log=log, engine=engine)


def _run_case(case: SimCase, *, checks, seed: int, log, engine) -> SimRow:
    from tirx_harness.numsim import Engine, transpile
    from tirx_harness.numsim.checkers import racecheck, synccheck

    step = case.step
    row = SimRow(step.id, step.arch, case.M, case.N, case.K, dict(case.kwargs), case.mutant)
    t0 = time.time()
    func = case.build()
    dtype = case.dtype
    full = {kind: case_inputs_np(case, kind, seed + i)
            for i, kind in enumerate(input_kinds(case))}
    inputs = {kind: v[:3] for kind, v in full.items()}
    extras = {kind: v[3] for kind, v in full.items()}
    specs = workspace_specs(case)
    kw = dict(case.kwargs)

    def operands(A, B, D, extra=None):
        """The kernel's arguments by name: A, B, a fresh copy of D, the epilogue's bias
        (when the case has BIAS; v15's training cases: DY or Z too), then each workspace operand
        (registry.Step.workspace_specs): counters zero-filled, scratch poisoned with NaN,
        as the GPU check passes them. An MN-major operand (v15's A_MAJOR / B_MAJOR "MN")
        is passed as the stored transpose the kernel reads; the check compares against
        the untransposed A and B."""
        if kw.get("A_MAJOR") == "MN":
            A = np.ascontiguousarray(A.T)
        if kw.get("B_MAJOR") == "MN":
            B = np.ascontiguousarray(B.T)
        return {"A": A, "B": B, "D": D.copy(), **(extra or {}),
                **make_workspace_np(specs, poison=True)}

    if "numsim" in checks:
        try:
            module = transpile(func)
            engine = engine or Engine(max_workers="auto")
            rels, verdicts = [], []
            for kind, (A, B, D) in inputs.items():
                res = engine.run(module, operands(A, B, D, extras[kind]))
                out = np.asarray(res.outputs["D"])
                cmp = check_output_np(case, out, A, B, extras[kind], kind,
                                      outputs=res.outputs)
                log(f"--- numsim {kind} inputs ({case.label}, seed {seed}) ---\n"
                    f"{cmp.summary()}\ndiagnostics: {res.diagnostics}\n")
                if kind == "random":
                    rels.append(cmp.rel_frobenius_error)
                dirt = workspace_dirt_np(specs, res.outputs)
                if not cmp.ok:
                    row.problems.append(f"numsim {kind} inputs: {cmp.summary()}")
                if dirt:
                    row.problems.append(f"numsim {kind} inputs: {dirt}")
                if res.verdict != "clean":
                    row.problems.append(f"numsim diagnostics {res.verdict}: {res.diagnostics}")
                verdicts.append(cmp.ok and not dirt and res.verdict == "clean")
            attrs = getattr(func, "attrs", None)  # a PrimFunc's; None for a stand-in
            resident = attrs.get(RESIDENT_ATTR) if attrs is not None else None
            if resident is not None:
                verdicts.append(_cancel_path_ok(engine, module, int(resident), operands,
                                                inputs["random"], dtype, case, row, log))
            row.rel_err = rels[0] if rels else None
            row.numsim = "correct" if all(verdicts) else "WRONG"
        except Exception as e:  # noqa: BLE001 - a model or tool failure fails the row
            log(f"--- numsim ({case.label}) raised ---\n{traceback.format_exc()}\n")
            cause = environment_failure(e)
            if cause:  # every case would fail the same way: stop here
                raise SimEnvironmentError(cause) from e
            row.numsim = "failed"
            row.problems.append(f"numsim {type(e).__name__}: {_first_line(e)}")
    A, B, D = inputs["random"]
    for name, fn in (("sync", synccheck), ("race", racecheck)):
        if name not in checks:
            continue
        try:
            report = fn(func, operands(A, B, D, extras["random"]))
        except Exception as e:  # noqa: BLE001 - a model or tool failure fails the row
            log(f"--- {name}check ({case.label}) raised ---\n{traceback.format_exc()}\n")
            cause = environment_failure(e)
            if cause:
                raise SimEnvironmentError(cause) from e
            setattr(row, name, "failed")
            row.problems.append(f"{name}check {type(e).__name__}: {_first_line(e)}")
            continue
        setattr(row, name, _checker_verdict(f"{name}check", report, step, row, log))
    row.seconds = time.time() - t0
    row.checks = tuple(checks)
    # the check names are the row's field names: numsim, sync, race
    row.ok = not row.problems and all(
        getattr(row, c) in ("correct", "clean", "accepted review") for c in checks)
    return row
