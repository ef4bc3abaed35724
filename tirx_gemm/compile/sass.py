"""The one SASS opcode glossary: opcode (prefix of the mnemonic) -> what it is.

The build summaries count these opcodes (``BuildResult.key_sass``), the CPU regression
compares their counts, the CLI's build table shows the headline ones and the notebooks
explain them with the meanings below. Standard library only.
"""

from __future__ import annotations

__all__ = ["SASS_GLOSSARY", "KEY_SASS", "HEADLINE_SASS", "meaning"]

SASS_GLOSSARY: dict[str, str] = {
    "UTCHMMA": "tcgen05.mma: tensor-core MMA into TMEM (sm_100a)",
    "UTCBAR": "tcgen05.commit: MMA completion -> mbarrier arrive (sm_100a)",
    "UGETNEXTWORKID": "clusterlaunchcontrol.try_cancel: take a not-yet-launched cluster's tile (sm_100a)",
    "LDTM": "tcgen05.ld: TMEM -> registers (sm_100a)",
    "HGMMA": "wgmma.mma_async: warpgroup MMA, accumulator in registers (sm_90a)",
    "UTMALDG": "TMA tile load GMEM -> SMEM",
    "UTMASTG": "TMA tile store SMEM -> GMEM",
    "LDG.E.128": "16-byte global load by a thread (thread copies)",
    "STS.128": "16-byte shared store by a thread",
    "STG.E.128": "16-byte global store by a thread",
    "LDSM": "ldmatrix: shared -> registers",
    "SYNCS.PHASECHK": "mbarrier try_wait on a phase parity",
    "SYNCS.ARRIVE": "mbarrier arrive (incl. expect_tx)",
    "USETMAXREG": "setmaxnreg: move registers between warpgroups",
    "WARPGROUP.ARRIVE": "wgmma.fence: order register writes before wgmma",
    "BAR.SYNC": "CTA or named barrier (bar.sync)",
    "BAR.ARV": "named barrier arrive without waiting (bar.arrive)",
}

# counted in build summaries and compared by `tirx-gemm regress --cpu`, in this order
KEY_SASS: tuple[str, ...] = tuple(SASS_GLOSSARY)

# the few the one-line `tirx-gemm build` table shows (MMA engine, data movement, setmaxnreg)
HEADLINE_SASS: tuple[str, ...] = ("UTCHMMA", "HGMMA", "UTMALDG", "UTMASTG", "LDG.E.128",
                                  "STS.128", "USETMAXREG")
assert set(HEADLINE_SASS) <= set(SASS_GLOSSARY)


def meaning(opcode: str) -> str:
    """The glossary entry of ``opcode`` or of the longest glossary prefix of it ("" if none)."""
    hits = [k for k in SASS_GLOSSARY if opcode.startswith(k)]
    return SASS_GLOSSARY[max(hits, key=len)] if hits else ""
