"""One typed record of "a step at a shape": step id, arch, M, N, K, the fields every record
about one kernel starts with. The build result (cache.BuildResult), the simulation row
(sim.SimRow) and the run side's build metadata (launcher.BuildMeta) extend it, so the five
fields and what follows from them (shape, label, dtype) are declared once. Their on-disk
forms (meta.json, results/*.jsonl) are unchanged: the fields keep their names and order.
Standard library only."""

from __future__ import annotations

import dataclasses

__all__ = ["StepShape", "shape_text"]


def shape_text(mnk) -> str:
    """(M, N, K) -> "MxNxK"."""
    return "x".join(str(int(x)) for x in mnk)


@dataclasses.dataclass(eq=False)
class StepShape:
    step: str  # step id, "v7"
    arch: str  # "sm_100a" | "sm_90a"
    M: int
    N: int
    K: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.M, self.N, self.K)

    @property
    def label(self) -> str:
        """"v7@sm_90a 4096x4096x4096" (the registry's step key and the shape)."""
        return f"{self.step}@{self.arch} {self.M}x{self.N}x{self.K}"

    @property
    def dtype(self) -> str:
        """The operand dtype ("float16" unless the record's kwargs say else)."""
        return str((getattr(self, "kwargs", None) or {}).get("dtype", "float16"))
