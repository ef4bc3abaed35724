"""Deliberately broken variants of the steps: proof that the checks can fail.

Each mutant is one small source edit of a step (or of the helpers or Blackwell verbs it
uses) that plants a real protocol bug: a barrier phase or arrival count, a missing fence,
wait or expect_tx, a relaxed atomic where the split-K and stream-K counters need acq_rel.
The sm_100a mutants feed the simulation gate: ``tirx-gemm sim vN --mutant NAME`` simulates
one, and the tests assert that the gate reports what its ``must_flag`` lists (NumSim's
numbers, synccheck, racecheck). The one sm_90a mutant, ``producer-phase-0``, is for a GPU:
a certain deadlock, which a watchdog build (helpers.set_watchdog) must turn into a trap
naming the barrier (lab/hang_guard); the simulation gate refuses it. The ``ld2mma-64``
mutant is the lesson: its numbers come out right, only the checkers see the bug.

A mutant is built from a copy of the source written to a temporary folder (TVMScript
parses a kernel from its source file), so the package itself is never modified. An edit
whose text no longer occurs exactly once fails loudly: a mutant never silently becomes
the unbroken step.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable


PKG_DIR = Path(__file__).resolve().parent
HELPERS_IMPORT = "from tirx_gemm import helpers as H"
BLACKWELL_IMPORT = "from tirx_gemm import blackwell as W"


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    step: str                  # step id
    bug: str                   # one line: what is broken
    step_edits: tuple[tuple[str, str], ...] = ()     # (old, new) in the step's source
    helper_edits: tuple[tuple[str, str], ...] = ()   # (old, new) in helpers.py
    # (module, old, new): module is a file of the blackwell/ package ("clc.py")
    blackwell_edits: tuple[tuple[str, str, str], ...] = ()
    # what the gate must report: the simulation's result and/or checker verdicts that
    # must NOT be "clean"/"correct" (e.g. ("sync",) = synccheck must flag it)
    must_flag: tuple[str, ...] = ()
    numbers_right: bool | None = None  # True: NumSim's numbers are still correct
    # the case to simulate, ((M, N, K), kwargs); None: the step's first sim case
    case: tuple | None = None
    arch: str = "sm_100a"  # sm_100a mutants feed the simulation gate, sm_90a ones the GPU


MUTANTS: dict[str, Mutant] = {m.name: m for m in (
    Mutant("consumer-phase-1", "v7",
           "the MMA warp waits on tma2mma starting at phase 1 instead of 0",
           step_edits=(("ring = PipelineState(PIPE_DEPTH, 0)",
                        "ring = PipelineState(PIPE_DEPTH, 1)"),),
           must_flag=("numsim", "sync")),
    Mutant("ld2mma-64", "v7",
           "ld2mma expects 64 arrivals although all 128 epilogue threads arrive (with each "
           "accumulator used once per CTA the numbers are right; with more tiles it deadlocks)",
           step_edits=(('"ld2mma", 128)', '"ld2mma", 64)'),),
           must_flag=("sync", "race"), numbers_right=True,
           case=((256, 256, 256), (("SM_COUNT", 2),))),
    Mutant("no-proxy-fence", "v1",
           "thread-written SMEM reaches tcgen05.mma through a CTA barrier only "
           "(no fence.proxy.async)",
           step_edits=(("        W.publish_smem_writes()\n",
                        "        T.cuda.cta_sync()\n"),),
           must_flag=("race",)),
    Mutant("no-expect-tx", "v4",
           "the TMA barrier gets a plain arrival instead of arrive.expect_tx: its phase "
           "can complete before the bytes land",
           helper_edits=(("    T.ptx.mbarrier.arrive.expect_tx.shared.b64(\n"
                          "        bar, T.uint32((BLK_M * BLK_K + BLK_N * BLK_K) * ELEM_BYTES))\n",
                          "    T.ptx.mbarrier.arrive.shared.b64(bar, T.uint32(1))\n"),),
           must_flag=("sync", "race")),
    # GPU (H200): a hang the watchdog build must turn into a trap naming the barrier
    Mutant("producer-phase-0", "v7",
           "the TMA producer waits on mma2tma starting at phase 0: a fresh barrier has not "
           "completed phase 0, so it waits for consumers that wait for it (deadlock)",
           step_edits=(("                ring = PipelineState(PIPE_DEPTH, 1)",
                        "                ring = PipelineState(PIPE_DEPTH, 0)"),),
           must_flag=("hang",), arch="sm_90a"),
    # v11 (split-K): the cross-CTA publication of the partial slabs through the counter
    Mutant("splitk-relaxed-count", "v11",
           "the tile counter is incremented with a relaxed atomic: no release orders the "
           "slab stores before the count, no acquire orders the reducer's slab loads after "
           "it (the numbers may still come out right on a model that runs CTAs in turn)",
           helper_edits=(('T.ptx["atom.acq_rel.gpu.global.add.s32"](old[0], counter,',
                          'T.ptx["atom.relaxed.gpu.global.add.s32"](old[0], counter,'),),
           must_flag=("race",), numbers_right=True,
           case=((128, 128, 256), (("SM_COUNT", 4), ("SPLIT_K", 4)))),
    Mutant("splitk-no-wait", "v11",
           "every unit reduces right after counting itself, without checking that all "
           "SPLIT_K splits have arrived: it reads slabs other CTAs have not published "
           "(or not yet written) and several units store the same D tile",
           helper_edits=(("    return arrivals[i] == SPLIT_K - 1\n",
                          "    return arrivals[i] >= 0\n"),),
           must_flag=("race",),
           case=((128, 128, 256), (("SM_COUNT", 4), ("SPLIT_K", 4)))),
    # v11 REDUCE="spread": every split waits for all arrivals, then reduces its own band
    Mutant("splitk-spread-early", "v11",
           "with REDUCE=spread each unit stops waiting at SPLIT_K - 1 arrivals: it may read "
           "the slab of the split that has not counted itself yet (unpublished, or not yet "
           "written)",
           step_edits=(('splitk.wait_count(CNT.ptr_to([tile]), SPLIT_K, "CNT"',
                        'splitk.wait_count(CNT.ptr_to([tile]), SPLIT_K - 1, "CNT"'),),
           must_flag=("race",),
           case=((128, 128, 256), (("SM_COUNT", 4), ("SPLIT_K", 4), ("REDUCE", "spread")))),
    Mutant("splitk-spread-relaxed-done", "v11",
           "with REDUCE=spread the units count their finished bands with a relaxed atomic: "
           "the last one's reset of the tile counter is not ordered after the other units' "
           "acquire loads of it",
           helper_edits=(('T.ptx["atom.acq_rel.gpu.global.add.s32"](done[0],',
                          'T.ptx["atom.relaxed.gpu.global.add.s32"](done[0],'),),
           must_flag=("race",), numbers_right=True,
           case=((128, 128, 256), (("SM_COUNT", 4), ("SPLIT_K", 4), ("REDUCE", "spread")))),
    # v12 (sm_100a) STREAM_K: the stream-K pieces' slabs, published through the tile counter
    Mutant("streamk-no-wait", "v12",
           "with STREAM_K each unit reduces its stream-K tile right after counting its piece, "
           "without waiting for the tile's other pieces: it reads slabs other CTAs have not "
           "published (or not yet written) and several units store the same D tile",
           step_edits=(("if H.splitk_is_last(arrivals, 0, pieces):",
                        "if arrivals[0] >= 0:"),),
           must_flag=("race",),
           case=((128, 160, 1024), (("SM_COUNT", 4), ("BLK_N", 32), ("STREAM_K", True)))),
    Mutant("streamk-relaxed-count", "v12",
           "with STREAM_K the stream-K tile's counter is incremented with a relaxed atomic: "
           "the reducing unit's slab loads are not ordered after the other pieces' slab "
           "stores (no acquire, no release)",
           helper_edits=(('T.ptx["atom.acq_rel.gpu.global.add.s32"](old[0], counter,',
                          'T.ptx["atom.relaxed.gpu.global.add.s32"](old[0], counter,'),),
           must_flag=("race",), numbers_right=True,
           case=((128, 160, 1024), (("SM_COUNT", 4), ("BLK_N", 32), ("STREAM_K", True)))),
    # v10 (CLC on v8's double-buffered TMEM accumulator)
    Mutant("acc-empty-no-wait", "v10",
           "the MMA warp does not wait on ld2mma ('accumulator empty') before a tile: with "
           "several tiles per pair it overwrites a TMEM buffer the epilogue is still reading",
           step_edits=(('                        ld2mma.wait(acc.stage, acc.phase, "MMA issuer")\n',
                        ''),),
           must_flag=("numsim", "sync", "race"),
           case=((512, 768, 320), (("SM_COUNT", 2), ("CLC", False)))),
    Mutant("acc-full-parity", "v10",
           "the epilogue waits on mma2ld ('accumulator full') starting at phase 1: a fresh "
           "barrier passes at once, so it reads TMEM before the MMAs have written it",
           step_edits=(("            acc = PipelineState(ACC_STAGES, 0)",
                        "            acc = PipelineState(ACC_STAGES, 1)"),),
           must_flag=("numsim", "sync", "race")),
    Mutant("clc-no-empty-wait", "v10",
           "CTA 0's scheduler requests the next tile without waiting on clc_empty: the "
           "response slot is rewritten while readers may still decode the previous one "
           "(only a cluster's second request shows it: the cancel-path run catches it)",
           blackwell_edits=(("clc.py", "        self.empty.wait(0, self.free.phase, role)\n", ""),),
           must_flag=("numsim",)),
    Mutant("mx-sf-copy-one-cta", "v13",
           "CTA 0 copies the MXFP8 scale factors SMEM -> TMEM with tcgen05.cp.cta_group::1: CTA 1's "
           "TMEM never gets its SFs, yet the pair's block-scaled MMA reads them there",
           blackwell_edits=(("fp8.py", "    Tx.copy_async(sf_tmem, sf_smem, cta_group=2)\n",
                             "    Tx.copy_async(sf_tmem, sf_smem, cta_group=1)\n"),),
           must_flag=("numsim", "race"),
           case=((512, 256, 512), (("SM_COUNT", 2), ("PIPE_DEPTH", 3), ("SCALE", "mx")))),
    Mutant("mx-grouped-no-sfa-fence", "v14",
           "the producer warp's SFA stores reach the next tcgen05.cp without a proxy fence: "
           "generic-proxy writes read by the async proxy",
           blackwell_edits=(("grouped.py",
                             "    T.ptx.fence.proxy.async_.shared__cta()  # our writes, then the "
                             "next tcgen05.cp's reads\n", ""),),
           must_flag=("race",), numbers_right=True,
           case=((300, 256, 416), (("E", 4), ("SCALE", "mx"), ("SM_COUNT", 2),
                                   ("PIPE_DEPTH", 2)))),
)}


def get(name: str) -> Mutant:
    if name not in MUTANTS:
        raise ValueError(f"no mutant {name!r} (mutants: {', '.join(MUTANTS)})")
    return MUTANTS[name]


def _edit(text: str, edits, where: str, name: str) -> str:
    for old, new in edits:
        n = text.count(old)
        if n != 1:
            raise RuntimeError(f"mutant {name}: the text to break occurs {n} times in {where} "
                               f"(expected once): {old.strip()[:70]!r}; update the mutant")
        text = text.replace(old, new)
    return text


def _load(path: Path, module_name: str, package: bool = False):
    """Import ``path`` as ``module_name``; ``package``: path is a package folder (its
    __init__.py), whose submodules are then imported from that folder, and the submodules
    of an earlier copy of the same name are forgotten first."""
    if package:
        for stale in [k for k in sys.modules if k.startswith(module_name + ".")]:
            del sys.modules[stale]
        spec = importlib.util.spec_from_file_location(
            module_name, path / "__init__.py", submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(module_name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = mod
    spec.loader.exec_module(mod)
    return mod


def builder(m: Mutant, source_file: str) -> Callable:
    """The mutant's builder, made from the step's source ``source_file`` (the registry's
    Step.source_file; this module does not import the registry): same signature as the
    step's ``hgemm_vN``."""
    tmp = Path(tempfile.mkdtemp(prefix=f"tirx-gemm-mutant-{m.name}-"))
    step_src = Path(source_file).read_text(encoding="utf-8")
    if m.helper_edits and HELPERS_IMPORT not in step_src:
        raise RuntimeError(f"mutant {m.name}: {source_file} no longer has "
                           f"{HELPERS_IMPORT!r}; update the mutant")
    tag = m.name.replace("-", "_")
    if m.blackwell_edits:
        if BLACKWELL_IMPORT not in step_src:
            raise RuntimeError(f"mutant {m.name}: {source_file} no longer has "
                               f"{BLACKWELL_IMPORT!r}; update the mutant")
        # a copy of the whole blackwell/ package with the edited modules, loaded inside
        # tirx_gemm, so that its relative imports (..helpers; .cluster, ... of the copy) resolve
        copy = tmp / "blackwell_mutant"
        shutil.copytree(PKG_DIR / "blackwell", copy,
                        ignore=shutil.ignore_patterns("__pycache__"))
        for module, old, new in m.blackwell_edits:
            path = copy / module
            if not (PKG_DIR / "blackwell" / module).is_file():
                raise RuntimeError(f"mutant {m.name}: the blackwell package has no module "
                                   f"{module!r}; update the mutant")
            path.write_text(_edit(path.read_text(encoding="utf-8"), ((old, new),),
                                  f"blackwell/{module}", m.name), encoding="utf-8")
        _load(copy, f"tirx_gemm.mutant_blackwell_{tag}", package=True)
        step_src = step_src.replace(BLACKWELL_IMPORT,
                                    f"from tirx_gemm import mutant_blackwell_{tag} as W")
    if m.helper_edits:
        helpers_src = _edit((PKG_DIR / "helpers.py").read_text(encoding="utf-8"),
                            m.helper_edits, "helpers.py", m.name)
        (tmp / "helpers_mutant.py").write_text(helpers_src, encoding="utf-8")
        _load(tmp / "helpers_mutant.py", f"tirx_gemm_mutant_helpers_{tag}")
        step_src = step_src.replace(HELPERS_IMPORT,
                                    f"import tirx_gemm_mutant_helpers_{tag} as H")
    step_src = _edit(step_src, m.step_edits, source_file, m.name)
    (tmp / f"hgemm_{m.step}_mutant.py").write_text(step_src, encoding="utf-8")
    mod = _load(tmp / f"hgemm_{m.step}_mutant.py", f"tirx_gemm_mutant_{tag}")
    return getattr(mod, f"hgemm_{m.step}")
