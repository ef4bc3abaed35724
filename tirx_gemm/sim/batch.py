"""simulate(): many cases, the first here, the rest in a process pool; rows as they end, heartbeat, log."""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import os
import sys
from pathlib import Path

from tirx_gemm.progress import Progress
from tirx_gemm.sim.cases import CHECKS, SimCase, checks_for
from tirx_gemm.sim.environment import _VENDORED_HOME, SimEnvironmentError, crates_dir
from tirx_gemm.sim.rows import HEAD, SimRow, format_row, mutant_missed
from tirx_gemm.sim.runcase import run_case

def default_log_path() -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("build") / "sim" / f"sim-{stamp}.txt"


def _descendant_commands(root: int | None = None) -> set[str]:
    """The command names (``comm``) of this process's descendants, read from /proc: how the
    heartbeat tells cargo building the engines from a kernel's own compile or simulation.
    Empty where there is no /proc."""
    root = os.getpid() if root is None else root
    try:
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return set()
    parent, comm = {}, {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        left, right = stat.find("("), stat.rfind(")")
        fields = stat[right + 2:].split()
        if left < 0 or right < 0 or len(fields) < 2:
            continue
        comm[pid], parent[pid] = stat[left + 1:right], int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        kids = {p for p, pp in parent.items() if pp in frontier and p not in found}
        found |= kids
        frontier = kids
    return {comm[p] for p in found}


class SimProgress(Progress):
    """What the heartbeat says while a case runs: "building NumSim engines" while cargo
    builds them (the first use on a machine: minutes), "compiling" while rustc builds the
    kernel's module, else the case running."""

    def heartbeat_line(self) -> str:
        tools = self.tools()
        took = f"elapsed {self.elapsed():.0f} s"
        if "cargo" in tools:
            return (f"building NumSim engines (cargo; first use on this machine, cached "
                    f"after) for {self.current or 'the first case'}: {self._count()} cases "
                    f"done, {took}")
        if "rustc" in tools and self.current:
            return f"{self.what}: {self._count()} done, compiling {self.current} for NumSim (rustc), {took}"
        return super().heartbeat_line()

    def tools(self) -> set[str]:
        return _descendant_commands()


@contextlib.contextmanager
def _quiet_native():
    """The engines print cargo progress on stdout; keep it out of the table (it is logged)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield buf


def _case_in_worker(case: SimCase, checks, seed: int):
    """One case in a pool worker: (row, its log text, the engines' own output)."""
    buf = io.StringIO()
    with _quiet_native() as native:
        row = run_case(case, checks=checks, seed=seed, log=buf.write)
    return row, buf.getvalue(), native.getvalue()


def _warm_kind(case: SimCase, check: str, seed: int) -> str:
    """In a pool worker: one check of ``case``, which builds that check's NumSim engine on
    a fresh machine (the row is discarded); the engines' own output, for the log."""
    with _quiet_native() as native:
        run_case(case, checks=(check,), seed=seed)
    return native.getvalue()


def warm_engines(case: SimCase, kinds, seed: int, log) -> None:
    """Build the engines of every check kind in ``kinds`` at once, one worker process per
    kind, each running ``case`` with that check alone. Each kind has its own engine (its
    own cargo build: about 80, 90 and 110 s on two idle cores, more beside other work), and
    much of a cargo build runs on one core, so three at once finish sooner than one after
    the other. On a machine whose engines are built this costs a few seconds (the kernels
    compiled here are then cached for the first case). Raises SimEnvironmentError as
    run_case does; any other failure is logged and left to the first case to report."""
    import concurrent.futures
    with _pool(len(kinds)) as pool:
        futures = {pool.submit(_warm_kind, case, k, seed): k for k in kinds}
        for f in concurrent.futures.as_completed(futures):
            try:
                native = f.result()
            except SimEnvironmentError:
                raise  # every case would fail the same way
            except Exception as exc:  # noqa: BLE001 - the first case runs next and says why
                log(f"--- warming the {futures[f]} engine ({case.label}) raised "
                    f"{type(exc).__name__}: {exc}; the first case, run next, reports it ---\n")
                continue
            if native:
                log(f"--- engine output ({futures[f]} engine, {case.label}) ---\n{native}\n")


def _worker_init() -> None:
    """A pool worker inherits CARGO_HOME from the run that unpacked the vendored crates:
    know it as ours, so the worker's notes and error texts say "vendored" as the run's do."""
    home = os.environ.get("CARGO_HOME")
    if home and home == str(crates_dir() / "cargo-home"):
        _VENDORED_HOME["path"] = home


def _pool(jobs: int):
    import concurrent.futures
    import multiprocessing
    # spawn: a fresh interpreter per worker (TVM and the engines hold threads and locks a
    # fork would copy mid-use)
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init)


def simulate(cases: list[SimCase], *, checks=CHECKS, seed: int = 0, log_path: Path,
             out=print, heartbeat_s: float | None = None, stream=None,
             jobs: int = 1) -> list[SimRow]:
    """Run every case, print one table row per case as it finishes, log the full text.
    With ``heartbeat_s`` (the CLI passes progress.HEARTBEAT_S), while a case runs a line
    ("simulating: 3/24 done, v4@sm_100a 256x128x192 running, elapsed 40 s") goes to
    ``stream`` (default stdout) whenever nothing was printed for that long.

    ``jobs`` > 1 runs cases in that many worker processes at once (NumSim compiles each
    kernel with one rustc and simulates it mostly on one core, so two cores take two cases).
    The first case always runs alone, here, after :func:`warm_engines` (with ``jobs`` > 1)
    has built NumSim's engine of each check kind at once, one process per kind: every later
    case needs them (two cargo builds of the same engine would only wait on each other),
    and a set-up failure stops the run there. Rows print as cases finish; the
    rows returned and the log are in the cases' order."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rows: list = [None] * len(cases)
    texts: list = [None] * len(cases)
    prog = SimProgress(
        "simulating", len(cases), stream=stream or sys.stdout, every=heartbeat_s or 1.0,
        enabled=heartbeat_s is not None)
    running: dict[int, str] = {}

    def finish(i: int, row: SimRow) -> None:
        rows[i] = row
        running.pop(i, None)
        prog.current = ", ".join(running.values()) or None
        prog.done += 1
        line = format_row(row)
        if row.mutant:
            missed = mutant_missed(row)
            line += "  caught" if missed is None else "  MISSED"
            problems = [missed] if missed else []
        else:
            problems = row.problems
        out(line)  # the row, as it finishes
        for p in problems:
            out(f"     ! {p}")
        prog.touch()

    def stopped(exc, case):
        where = "the first case, " if case is cases[0] else ""
        return SimEnvironmentError(
            f"{exc} (stopped at {where}{case.label}, since every case would fail the same "
            f"way; the full output is in {log_path})")

    with open(log_path, "w", encoding="utf-8") as logf:
        def log(s: str) -> None:
            logf.write(s)
            logf.flush()
        log(f"tirx-gemm sim: {len(cases)} case(s), checks {','.join(checks)}, seed {seed}"
            f"{f', {jobs} at a time' if jobs > 1 else ''}\n")
        out(HEAD)
        with prog:
            first = 1 if jobs > 1 else len(cases)
            kinds = checks_for(cases[0], cases, checks)
            if jobs > 1 and len(kinds) > 1:
                # the engines of each check kind, built at once (the first case then runs on
                # them, its kernels already compiled)
                prog.current = f"{cases[0].label} ({', '.join(kinds)} at once)"
                try:
                    warm_engines(cases[0], kinds, seed, log)
                except SimEnvironmentError as exc:
                    raise stopped(exc, cases[0]) from exc
            for i, case in enumerate(cases[:first]):
                running[i] = case.label
                prog.current = case.label
                try:
                    with _quiet_native() as buf:
                        row = run_case(case, checks=checks_for(case, cases, checks),
                                       seed=seed, log=log)
                except SimEnvironmentError as exc:
                    raise stopped(exc, case) from exc
                finally:
                    if buf.getvalue():
                        log(f"--- engine output ({case.label}) ---\n{buf.getvalue()}\n")
                finish(i, row)
            rest = list(enumerate(cases))[first:]
            if rest:
                with _pool(jobs) as pool:
                    futures = {}
                    for i, case in rest:
                        futures[pool.submit(_case_in_worker, case,
                                            checks_for(case, cases, checks), seed)] = i
                    import concurrent.futures
                    pending = set(futures)
                    while pending:
                        # what runs now: the first `jobs` unfinished cases in submission order
                        waiting = sorted(futures[f] for f in pending)
                        for i in waiting[:jobs]:
                            running[i] = cases[i].label
                        prog.current = ", ".join(running.values())
                        done, pending = concurrent.futures.wait(
                            pending, return_when=concurrent.futures.FIRST_COMPLETED)
                        for f in sorted(done, key=futures.get):
                            i = futures[f]
                            try:
                                row, text, native = f.result()
                            except SimEnvironmentError as exc:
                                for g in pending:
                                    g.cancel()
                                raise stopped(exc, cases[i]) from exc
                            texts[i] = text + (f"--- engine output ({cases[i].label}) ---\n"
                                               f"{native}\n" if native else "")
                            finish(i, row)
                for text in texts[first:]:  # the workers' text, in the cases' order
                    log(text or "")
    return rows
