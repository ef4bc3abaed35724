"""`tirx-gemm sim`: sm_100a steps on NumSim, a CPU model of Blackwell (tirx_gemm/sim/)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.cli.common import _mnk, check_step_shape, get_step
from tirx_gemm.numerics import DTYPES


def register(sub) -> None:
    from tirx_gemm.sim.cases import CHECKS
    p = sub.add_parser(
        "sim", help="run sm_100a steps on a CPU model of Blackwell (NumSim) + sync/race checks",
        description="Simulate sm_100a steps with tirx-harness NumSim at the registry's "
                    "simulation shapes (or --mnk), check numbers against an fp32 reference "
                    "and run synccheck and racecheck. Exit 0 only if every row is correct "
                    "and clean. Proves correctness and protocol on a model, never speed.")
    p.add_argument("step", nargs="?", help="step id, e.g. v4")
    p.add_argument("--all", action="store_true", help="every sm_100a step")
    p.add_argument("--mnk", type=_mnk,
                   help="one shape M,N,K instead of the registry's sim cases")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="operand dtype of the --mnk case; without --mnk, every registry case "
                        "in this dtype (default: the registry's cases as listed, float16 and "
                        "one bfloat16 case per step)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--check", default=",".join(CHECKS),
                   help=f"comma list of {','.join(CHECKS)} (default: all)")
    p.add_argument("--log", help="file for the full checker text (default build/sim/...)")
    p.add_argument("--mutant", help="simulate a deliberately broken variant instead "
                   "(tirx_gemm/mutants.py; the gate must fail); names the step itself")
    p.add_argument("--mutants", action="store_true",
                   help="with --all: also simulate every sm_100a mutant (tirx_gemm/mutants.py); "
                        "the run passes only if the gate catches each one as it must")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="cases simulated at once, each in its own process (default: the "
                        "machine's cores, at most 4; 1 runs them one by one in this process)")
    from tirx_gemm.sim.disk import CACHE_MAX_GIB
    p.add_argument("--cache-max-gib", type=float, default=CACHE_MAX_GIB,
                   help="keep NumSim's kernel cache under this many GiB after the run, the least "
                        f"recently used entries deleted first, never this run's (default {CACHE_MAX_GIB:g})")
    p.add_argument("--record", action="store_true",
                   help="append the rows to results/sim/numsim-cpu.jsonl (README table)")
    p.set_defaults(fn=cmd_sim)


def _sim_jobs(requested: int | None, n_cases: int) -> int:
    """Worker processes for `sim`: --jobs, else the cores (at most 4), never more than the
    cases after the first (which runs alone: it builds the engines on a fresh machine)."""
    if requested is not None and requested < 1:
        raise ValueError(f"--jobs {requested} must be >= 1")
    jobs = requested if requested is not None else min(os.cpu_count() or 1, 4)
    return max(1, min(jobs, n_cases - 1))


def _parse_checks(text: str) -> tuple[str, ...]:
    from tirx_gemm.sim.cases import CHECKS
    checks = tuple(c.strip() for c in text.split(",") if c.strip())
    bad = [c for c in checks if c not in CHECKS]
    if bad or not checks:
        raise ValueError(f"--check {text!r}: choose from {','.join(CHECKS)}")
    return checks


def cmd_sim(args) -> int:
    """`tirx-gemm sim`: the registry's simulation cases (or --mnk, or a mutant) on NumSim."""
    from tirx_gemm.sim.batch import default_log_path, simulate
    from tirx_gemm.sim.cases import ARCH, CHECKS, cases_for, mutant_case
    from tirx_gemm.sim.environment import SimUnavailable, crates_note, unavailable_reason
    from tirx_gemm.sim.rows import append_records
    checks = _parse_checks(args.check)
    mnk = args.mnk
    if args.mutant:
        from tirx_gemm import mutants
        mutant_case(args.mutant)  # an sm_90a mutant is refused here
        m = mutants.get(args.mutant)
        if args.all or (args.step and registry.get(args.step, ARCH).id != m.step):
            raise ValueError(f"--mutant {m.name} breaks step {m.step}; name that step or none")
        if args.record:
            raise ValueError("--record keeps results of the real steps only, not of mutants")
        args.step = m.step
    if args.all and args.step:
        raise ValueError("name one step or pass --all, not both")
    if getattr(args, "mutants", False) and not args.all:
        raise ValueError("--mutants goes with --all (one mutant: --mutant NAME)")
    if getattr(args, "mutants", False) and args.record:
        raise ValueError("--record keeps results of the real steps only, not of mutants")
    if args.all and mnk:
        raise ValueError("--mnk needs one step (the steps accept different shapes)")
    if args.all:
        steps = registry.all_steps(ARCH)
    elif args.step:
        steps = [get_step(args.step, ARCH)]
    else:
        raise ValueError("name a step (e.g. v4) or pass --all")
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed} must be >= 0")
    from tirx_gemm.sim import disk
    cache_max = getattr(args, "cache_max_gib", None)
    cache_max = disk.CACHE_MAX_GIB if cache_max is None else cache_max
    if not 0 < cache_max < float("inf"):
        raise ValueError(f"--cache-max-gib {cache_max:g} must be a positive number of GiB")
    dtype = getattr(args, "dtype", None)
    cases = [c for s in steps for c in cases_for(s, mnk, dtype)]
    if args.mutant:
        cases = [mutant_case(args.mutant, mnk, dtype)]
    if getattr(args, "mutants", False):
        from tirx_gemm.sim.cases import mutant_cases
        cases += mutant_cases()
    jobs = _sim_jobs(getattr(args, "jobs", None), len(cases))
    if mnk:  # a shape (or dtype) the step rejects fails here, before any simulation starts
        check_step_shape(steps[0], mnk)  # the registry's words first: no TVM for that
        steps[0].build_primfunc(*mnk, **dict(cases[0].kwargs))
    why = unavailable_reason()
    if why:
        raise SimUnavailable(why)
    log_path = Path(args.log) if args.log else default_log_path()
    note = crates_note()  # which crates cargo builds the engines from (vendored: offline)
    at_once = f", {jobs} at a time after the first" if jobs > 1 else ""
    print(f"simulating {len(cases)} case(s){at_once} on NumSim (CPU model of sm_100a). The first run "
          "on a machine builds NumSim's engines with cargo first (minutes: 5 or more on 2 "
          "busy cores; cached after; the heartbeat says \"building NumSim engines\" until "
          f"they are); {note}. Each row prints as its case finishes; the full checker text "
          f"goes to {log_path}", flush=True)
    from tirx_gemm.sim.cases import checks_for
    fewer = [c for c in cases if checks_for(c, cases, checks) != tuple(checks)]
    if fewer:
        print(f"{len(fewer)} case(s) run fewer checks (gate.checks_for): a bfloat16 case whose "
              "float16 twin is in this run checks its numbers (its barrier protocol is the "
              "twin's, which synccheck and racecheck check); a mutant, the checks its verdict "
              "reads", flush=True)
    t0 = time.time()
    from tirx_gemm.progress import HEARTBEAT_S
    rows = simulate(cases, checks=checks, seed=args.seed, log_path=log_path,
                    heartbeat_s=HEARTBEAT_S, jobs=jobs,
                    out=lambda s: print(s, flush=True))
    from tirx_gemm.sim.rows import row_verdict
    if args.mutant:  # one mutant, as a user simulates it: the gate's own verdict (it fails)
        bad, real = [r for r in rows if not r.ok], rows
    else:  # with --mutants, a mutant's row counts as passing when the gate caught it
        bad = [r for r in rows if not row_verdict(r)]
        real = [r for r in rows if not r.mutant]
    passed = ("correct and clean" if checks == CHECKS
              else f"passed {', '.join(checks)} (not run: {', '.join(c for c in CHECKS if c not in checks)})")
    caught = ""
    if not args.mutant and len(real) < len(rows):
        muts = [r for r in rows if r.mutant]
        caught = (f"; mutants caught by the gate: {sum(row_verdict(r) for r in muts)}/"
                  f"{len(muts)}")
    print(f"\n{sum(r.ok for r in real)}/{len(real)} {passed}{caught} in "
          f"{time.time() - t0:.0f} s; full checker text: {log_path}")
    print("A pass proves numbers and synchronization on a CPU model of sm_100a; it measures "
          "no speed and is not silicon.")
    print(disk.cap_line(cache_max, keep_since=t0))
    if args.record:
        print(f"records appended to {append_records(rows, args.seed, checks)}")
    return 1 if bad else 0
