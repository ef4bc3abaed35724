"""What tirx_gemm.op.rules walks: a :class:`Rule` (a condition on the shape and the kernel
picked so far, an effect, a one-line why) and a :class:`Plan` (the kernel picked so far).
Pure Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Plan:
    """The kernel picked so far: its step, its builder keywords and the rule that picked it.
    A rule never edits one: :meth:`but` returns a new plan."""
    step: str
    kw: dict
    by: str

    def but(self, drop: tuple = (), **kw) -> Plan:
        return Plan(self.step, {**{k: v for k, v in self.kw.items() if k not in drop}, **kw},
                    self.by)


@dataclass(frozen=True)
class Rule:
    """One rule: ``kind`` "pick" (the first that applies picks the kernel) or "adjust"
    (applies to the kernel picked); ``study`` is its folder under lab/."""
    name: str
    kind: str
    study: str
    # each takes the shape (a tirx_gemm.op.rules.Shape) and the plan so far
    applies: Callable[[Any, Plan | None], bool]
    apply: Callable[[Any, Plan | None], Plan]
    why: Callable[[Any, Plan], str]  # one line, given the plan this rule returned
