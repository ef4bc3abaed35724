"""What the gate simulates: SimCase, each step's and each mutant's cases, the checks a case gets."""

from __future__ import annotations

import dataclasses

from tirx_gemm import numerics, registry
from tirx_gemm.registry import Step

ARCH = "sm_100a"
CHECKS = ("numsim", "sync", "race")


@dataclasses.dataclass(frozen=True)
class SimCase:
    step: Step
    M: int
    N: int
    K: int
    kwargs: tuple[tuple[str, object], ...] = ()
    mutant: str | None = None  # a deliberately broken variant (tirx_gemm.mutants)

    def build(self):
        extra = {"mutant": self.mutant} if self.mutant else {}
        return self.step.build_primfunc(self.M, self.N, self.K, **dict(self.kwargs), **extra)

    @property
    def shape(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"

    @property
    def dtype(self) -> str:
        return self.step.dtype(dict(self.kwargs))

    @property
    def kwargs_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.kwargs) or "-"

    @property
    def label(self) -> str:
        kw = f" {self.kwargs_text}" if self.kwargs else ""
        mut = f" [mutant {self.mutant}]" if self.mutant else ""
        return f"{self.step.id}@{self.step.arch} {self.shape}{kw}{mut}"


def _with_dtype(kwargs, dtype: str | None) -> tuple:
    """Case keywords in ``dtype`` (None: as given): the dtype keyword replaced, and written
    only for bfloat16 (float16 is every builder's default)."""
    kw = tuple(kwargs)
    if dtype is None:
        return kw
    numerics.check_dtype(dtype)
    kw = tuple((k, v) for k, v in kw if k != "dtype")
    return kw + ((("dtype", dtype),) if dtype != "float16" else ())


def cases_for(step: Step, mnk: tuple[int, int, int] | None = None,
              dtype: str | None = None) -> list[SimCase]:
    """The registry's simulation cases of ``step`` (or one case at ``mnk``). ``dtype`` None:
    the cases as the registry lists them (float16, and one bfloat16 case per step); a dtype:
    every case in that dtype (duplicates dropped), or the ``mnk`` case in it."""
    if step.arch != ARCH:
        raise ValueError(f"{step.key}: NumSim models sm_100a only (run sm_90a steps on a GPU)")
    if mnk is not None:
        return [SimCase(step, *mnk, _with_dtype((), dtype))]
    if not step.sim_cases:
        raise ValueError(f"{step.key} has no sim_cases in the registry")
    cases = [SimCase(step, *shape, _with_dtype(kwargs, dtype)) for shape, kwargs in step.sim_cases]
    return list(dict.fromkeys(cases))


def mutant_case(name: str, mnk=None, dtype: str | None = None) -> SimCase:
    """The case a mutant is simulated at: ``mnk``, else the mutant's own case, else the
    first simulation case of its step; in ``dtype`` when given."""
    from tirx_gemm import mutants
    m = mutants.get(name)
    if m.arch != ARCH:
        raise ValueError(f"mutant {name} breaks {m.step}@{m.arch}: NumSim models sm_100a only "
                         "(that one is for the GPU watchdog)")
    step = registry.get(m.step, ARCH)
    if mnk is not None:
        return SimCase(step, *mnk, _with_dtype((), dtype), mutant=name)
    shape, kwargs = m.case or step.sim_cases[0]
    return SimCase(step, *shape, _with_dtype(kwargs, dtype), mutant=name)


def mutant_cases() -> list[SimCase]:
    """One case per sm_100a mutant (tirx_gemm.mutants): `sim --all --mutants` runs them
    beside the real cases, and passes only if the gate catches every one."""
    from tirx_gemm import mutants
    return [mutant_case(m.name) for m in mutants.MUTANTS.values() if m.arch == ARCH]


def checks_for(case: SimCase, cases: list[SimCase], checks=CHECKS) -> tuple[str, ...]:
    """The checks a gate run gives ``case`` (a subset of ``checks``), so that CI's 2 cores
    spend no NumSim compile on a verdict that cannot change:
    - a mutant: the checks its verdict reads (``must_flag``, and numsim where its numbers
      must stay right): mutant_missed looks at nothing else;
    - a bfloat16 case whose float16 twin (same step, shape and other keywords) is in the
      same run: numsim only. Its barrier and proxy protocol is the twin's, which synccheck
      and racecheck check: the builders differ by the element type alone, both 2 bytes, so
      the TMA byte counts, barriers and MMA issue order are the same.
    Every other case gets every check."""
    from tirx_gemm import mutants
    if case.mutant:
        m = mutants.get(case.mutant)
        need = set(m.must_flag) | ({"numsim"} if m.numbers_right else set())
        return tuple(c for c in checks if c in need)
    if case.dtype == "bfloat16" and "numsim" in checks:
        plain = tuple((k, v) for k, v in case.kwargs if k != "dtype")
        if any(c is not case and not c.mutant and c.step == case.step
               and (c.M, c.N, c.K) == (case.M, case.N, case.K) and c.dtype == "float16"
               and tuple(c.kwargs) == plain for c in cases):
            return ("numsim",)
    return tuple(checks)
