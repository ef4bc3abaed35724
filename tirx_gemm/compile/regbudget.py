"""Does a warp-specialized kernel's setmaxnreg split fit the registers ptxas gave it?

``setmaxnreg`` moves registers between warpgroups out of one pool: threads per CTA x the
register count ptxas chose at entry. A ``setmaxnreg.inc`` that asks for more than the
``dec``s released blocks forever -- a hang no compiler reports. In the steps here one
warpgroup (the producer / MMA issuer) decreases and every other warpgroup increases, so
the split fits when 128 x (dec + (warpgroups - 1) x inc) <= threads x registers; e.g.
sm_100a v7 (256 threads, 56/224) needs at least 140 registers at entry.
"""

from __future__ import annotations

import re

_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\((\d+)\)")
_SETMAXNREG = re.compile(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)")
WARPGROUP = 128


def launch_threads(cuda_source: str) -> int | None:
    """Threads per CTA from the kernel's ``__launch_bounds__``, or None."""
    m = _LAUNCH_BOUNDS.search(cuda_source)
    return int(m.group(1)) if m else None


def setmaxnreg_split(cuda_source: str) -> dict[str, list[int]] | None:
    """{"dec": [...], "inc": [...]}: the register counts the kernel's setmaxnreg
    instructions ask for (sorted, distinct), or None when it has none."""
    found = {(kind, int(n)) for kind, n in _SETMAXNREG.findall(cuda_source)}
    if not found:
        return None
    return {kind: sorted({n for k, n in found if k == kind}) for kind in ("dec", "inc")}


def setmaxnreg_problem(cuda_source: str, registers: int | None) -> str | None:
    """One line saying why the split cannot be honoured, or None (fits, or no setmaxnreg)."""
    split = setmaxnreg_split(cuda_source)
    if split is None:
        return None
    incs, decs = split["inc"], split["dec"]
    threads = launch_threads(cuda_source)
    if registers is None or threads is None or len(incs) != 1 or len(decs) != 1:
        return (f"cannot check the setmaxnreg split (registers={registers}, inc={incs}, "
                f"dec={decs}, launch bounds {'missing' if threads is None else 'found'})")
    groups = threads // WARPGROUP
    need = WARPGROUP * (decs[0] + (groups - 1) * incs[0])
    have = threads * registers
    if need > have:
        return (f"setmaxnreg split {decs[0]}/{incs[0]} over {groups} warpgroups needs "
                f"{need} registers, but ptxas gave {registers} x {threads} threads = {have}: "
                f"the increasing warpgroups would wait forever (need >= "
                f"{-(-need // threads)} registers at entry)")
    return None
