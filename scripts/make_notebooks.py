#!/usr/bin/env python3
"""Generate notebooks/*.ipynb: an overview plus one notebook per registry step.

The notebooks are generated, never edited by hand: narrative lives here, code lives in
``tirx_gemm.notebook`` (and the package it calls), and every notebook is written without
outputs (the policy: committed stripped; see notebooks/README.md). tests/test_notebooks.py
checks that the committed files are exactly what this script writes.

    python scripts/make_notebooks.py            # (re)write notebooks/
    python scripts/make_notebooks.py --check    # exit 1 if notebooks/ differs from the output

Steps come from the registry (``registry.step_ids()``); a step without a narrative entry
below still gets a notebook, with the registry's lesson and every generated table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbformat
from nbformat import v4

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing: import tirx_gemm here
    sys.path.insert(0, str(ROOT))
NB_DIR = ROOT / "notebooks"
OVERVIEW = "00_overview.ipynb"
NBFORMAT_MINOR = 5  # pinned: the files must not change with the installed nbformat
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}

# --------------------------------------------------------------------------------------
# narrative, per step id: slug (file name), title, what changes, barriers, SASS notes
# --------------------------------------------------------------------------------------
TRACKS_NOTE = (
    "Both tracks appear where the registry lists them: **sm_100a** (Blackwell, tcgen05, "
    "accumulator in tensor memory; compiled here and executed on NumSim, a CPU model of "
    "sm_100a, never on silicon: no Blackwell GPU) and its "
    "**sm_90a** twin (Hopper, wgmma, accumulator in registers; runs on an H200). A twin the "
    "registry does not list yet is reported as such by the cells below.")

TABLE_HEAD = ("| barrier | count | who arrives | who waits | initial phase | when it flips |\n"
              "|---|---|---|---|---|---|\n")

NARRATIVE: dict[str, dict] = {
    "v1": {
        "slug": "single_tile",
        "title": "a single 128x128 tile",
        "changes": """\
First step: the whole data path once, for one 128x128 output tile with K = 64.

| | sm_100a | sm_90a |
|---|---|---|
| **scope** | one CTA = one warpgroup (128 threads), one tile, one K slice | same |
| **layout** | A, B: 128x64 fp16 tiles (16 KiB each) in 128B-swizzled, K-major SMEM; accumulator: **TMEM** (all 512 columns allocated, the tile uses 128) | same SMEM tiles; accumulator: the **wgmma register fragment**, 128 fp32 per thread (two 64-row blocks) |
| **dispatch** | thread copies (`Tx.cta.copy`: LDG.E.128 -> STS.128); **one elected thread** issues `tcgen05.mma` (4 x K=16) and `tcgen05.commit`; epilogue `tcgen05.ld` (TMEM -> registers) -> GMEM | thread copies; the **whole warpgroup** issues 8 `wgmma.mma_async m64n128k16` (2 row blocks x 4 k16 slices), `commit_group`, `wait_group(0)`; registers -> GMEM |

Why: the correctness baseline. Every synchronisation point here exists for a reason that
the later steps keep: the copies must land before the MMA reads SMEM (CTA barrier; on
sm_90a also `fence.proxy.async`, because wgmma reads SMEM through the async proxy), and the
MMA is asynchronous, so its result may be read only after its completion is observed
(an mbarrier on sm_100a, `wgmma.wait_group` on sm_90a).""",
        "barriers_sm100a": TABLE_HEAD + """\
| `mma_bar` (mbarrier) | 1 | `tcgen05.commit` from the elected thread of warp 0: arrives once the MMAs it issued have completed | all 128 threads, before reading TMEM (then `tcgen05.fence::after_thread_sync`) | 0 (they wait for parity 0) | never: it completes one phase in the kernel's life |
| CTA barrier (`bar.sync 0`) | 128 | every thread: after setup (barrier init and TMEM address published), after copying its share of A and B **and `fence.proxy.async`** (its ordinary stores must reach the async proxy that `tcgen05.mma` reads through), and before TMEM is freed; each wrapped in `tcgen05.fence::before/after_thread_sync` | every thread | n/a | n/a |

NumSim's racecheck finds the missing proxy fence ("no generic->async proxy bridge"): `tirx-gemm sim v1 --mutant no-proxy-fence`.""",
        "barriers_sm90a": TABLE_HEAD + """\
| CTA barrier (`bar.sync 0`), after `fence.proxy.async` | 128 | every thread, after copying its share of A and B | every thread, before the wgmmas read SMEM | n/a | n/a |
| wgmma group (not a barrier) | n/a | `wgmma.commit_group` closes the 8 wgmmas | each thread's `wgmma.wait_group(0)`, then an operand fence pins the accumulator reads behind it | n/a | n/a |

No mbarrier yet on Hopper: thread copies plus `wait_group` need none.""",
        "sass": "What to look for: `UTCHMMA` x4 (one per k16 of the 64-wide slice, issued by "
                "one thread) against `HGMMA` x8 on sm_90a; thread copies (`LDG.E.128`, "
                "`STS.128`); `LDTM` (tcgen05.ld) in the sm_100a epilogue; no `UTMALDG`.",
        "lines": 60,
    },
    "v2": {
        "slug": "k_loop",
        "title": "a K-loop",
        "changes": """\
**What changes from v1:** control flow only. K is now any multiple of 64, walked in K/64
slices by a rolled loop (`#pragma unroll 1`, so the SASS does not grow with K); the first
slice overwrites the accumulator, the others add to it (TMEM or registers stay live across
the loop). The single A/B SMEM tile is refilled every slice.

| | sm_100a | sm_90a |
|---|---|---|
| **scope** | unchanged: one CTA, one 128x128 output tile | unchanged |
| **layout** | unchanged | unchanged |
| **dispatch** | unchanged | unchanged |
| **new contract** | `mma_bar` is reused every slice, so the **phase waited for flips every slice**: wait(0), wait(1), wait(0), ... Without the flip the second wait returns at once (phase 0 already completed) and the next copy overwrites SMEM while the MMA still reads it. | a **second CTA barrier** after `wait_group(0)` closes every slice: `wait_group` only covers the calling thread's wgmmas, so nobody may copy slice k+1 until every warp is past it (write-after-read on the single SMEM tile). |

Why: real K is thousands. Copy, sync, MMA and wait are still fully serial, and one CTA
uses one SM: the point is the contract, not the speed.""",
        "barriers_sm100a": TABLE_HEAD + """\
| `mma_bar` | 1 | `tcgen05.commit` (elected thread of warp 0), once per K slice | all 128 threads: before the next slice's copy overwrites SMEM (then `fence.proxy.async`: the MMA's async-proxy reads before our next stores), and before the epilogue reads TMEM | 0 | after every wait: `phase_mma ^= 1`, once per K slice |
| CTA barrier (`bar.sync 0`) | 128 | every thread, after copying its share of slice k and `fence.proxy.async` | every thread, before the MMA is issued; it also bounds how far thread 0 can run ahead, so no waiter misses a phase of `mma_bar` | n/a | n/a |""",
        "barriers_sm90a": TABLE_HEAD + """\
| CTA barrier 1 (after `fence.proxy.async`) | 128 | every thread, after copying its share of slice k | every thread, before the wgmmas read slice k (read after write) | n/a | n/a |
| CTA barrier 2 (after `wait_group(0)`) | 128 | every thread, once its wgmmas on slice k are done | every thread, before copying slice k+1 (write after read) | n/a | n/a |
| wgmma group | n/a | `commit_group`, once per slice | `wait_group(0)`, once per slice | n/a | n/a |""",
        "sass": "What to look for: almost nothing changes, which is the point: the loop is kept "
                "rolled, so the per-slice MMA count stays 4 (`UTCHMMA`) / 8 (`HGMMA`); on sm_90a "
                "`BAR.SYNC` goes from 1 to 2 (the write-after-read barrier).",
        "lines": 60,
    },
    "v3": {
        "slug": "2d_grid",
        "title": "a 2D grid of CTAs",
        "changes": """\
**What changes from v2:** scope. The grid is (M/128) x (N/128) CTAs; CTA (bx, by) reads
A's row band `[bx*128, +128)` and B's row band `[by*128, +128)` (B's rows are D's columns:
D = A @ B.T) and writes D's tile (bx, by). The kernel body is v2's with the tile offsets
`m_st = bx*128`, `n_st = by*128` in the slices and the epilogue.

| | sm_100a | sm_90a |
|---|---|---|
| **scope** | one CTA per output tile: 32 x 32 = 1024 CTAs at 4096^3 | same |
| **layout** | unchanged | unchanged |
| **dispatch** | unchanged | unchanged |

Why: a useful GEMM has many output tiles and the GPU has 132 (H200) or 148 (B200) SMs.
Each CTA uses 33 KiB of SMEM, so several are resident per SM and one CTA's copies overlap
another CTA's MMAs even though every CTA is still serial inside. Neighbouring CTAs re-read
the same A/B bands from GMEM (L2 catches some): left for later steps.""",
        "barriers_sm100a": "Unchanged from v2, per CTA (every CTA has its own barriers in its "
                           "own SMEM):\n\n" + TABLE_HEAD + """\
| `mma_bar` | 1 | `tcgen05.commit` (elected thread of warp 0), once per K slice | all 128 threads of the CTA (then `fence.proxy.async` before the next stores) | 0 | every K slice |
| CTA barrier (`bar.sync 0`) | 128 | every thread, after copying its share of slice k and `fence.proxy.async` | every thread | n/a | n/a |""",
        "barriers_sm90a": "Unchanged from v2, per CTA:\n\n" + TABLE_HEAD + """\
| CTA barrier 1 (after `fence.proxy.async`) | 128 | every thread, after copying its share of slice k | every thread, before the wgmmas (read after write) | n/a | n/a |
| CTA barrier 2 (after `wait_group(0)`) | 128 | every thread, once its wgmmas on slice k are done | every thread, before copying slice k+1 (write after read) | n/a | n/a |""",
        "sass": "What to look for: the same instructions as v2 (only the address arithmetic "
                "differs: `blockIdx.y` enters the B and D offsets). The lesson is in the "
                "launch, not in the SASS.",
        "lines": 60,
    },
    "v4": {
        "slug": "tma",
        "title": "TMA loads and a TMA-store epilogue",
        "changes": """\
**What changes from v3:** dispatch of every GMEM access.

| | sm_100a | sm_90a |
|---|---|---|
| **scope** | unchanged (one CTA per output tile) | unchanged |
| **layout** | + `Dsmem`, a 128x128 fp16 swizzled staging tile for the store: 65 KiB SMEM per CTA | same (stored as two 64-column halves) |
| **dispatch** | loads: thread copies -> **TMA** (`Tx.copy_async(dispatch="tma_auto")`) issued by thread 0, completing on `tma_bar`; store: TMEM -> registers -> Dsmem -> **one TMA store** | loads: TMA, completing on `tma_bar`; store: registers -> Dsmem -> one TMA store |
| **new contract** | a CTA barrier cannot see the TMA engine finish, so an mbarrier **counts bytes**: thread 0 arrives with `expect_tx(32768)` (2 x 128x64 fp16) and the TMA unit's `complete_tx` supplies them | same; `expect_tx` is issued before the copies here and after them on sm_100a: either order is correct, since the phase cannot complete before thread 0's single arrival |

Why: the threads stop computing addresses and moving data (32 load/store instructions per
thread and slice in v3); the TMA unit moves whole 128-byte rows and applies the swizzle in
flight, and the output leaves as full lines. Inside a CTA it is still load -> wait -> MMA
-> wait per slice: no overlap yet (that is v5). The seed's article series quotes
278 TFLOP/s for this step on a B200 at 4096^3 (not measured here).""",
        "barriers_sm100a": TABLE_HEAD + """\
| `tma_bar` | 1 (+ 32768 tx bytes) | thread 0: `arrive.expect_tx`, then the two TMA loads; the TMA unit completes the bytes | **warp 0 only**, before the MMA reads SMEM | 0 | every K slice |
| `mma_bar` | 1 | `tcgen05.commit` (thread 0) | **warp 0 only**, before the next TMA load overwrites SMEM | 0 | every K slice |
| CTA barrier (after the K-loop) | 128 | every thread; warp 0 once it has seen the last MMA complete | every thread, before the epilogue reads TMEM | n/a | n/a |
| named barrier 1 (`bar.sync 1`, 128) | 128 | every thread, after writing its row of Dsmem (and `fence.proxy.async`); again after the store | every thread | n/a | n/a |
| TMA store bulk group | n/a | thread 0: `cp.async.bulk.commit_group` | thread 0: `wait_group(0)` before Dsmem may be reused | n/a | n/a |""",
        "barriers_sm90a": TABLE_HEAD + """\
| `tma_bar` | 1 (+ 32768 tx bytes) | thread 0: `arrive.expect_tx`, then the two TMA loads; the TMA unit completes the bytes | all 128 threads, before the wgmmas (its acquire makes the TMA-written tiles visible) | 0 | every K slice |
| CTA barrier (after `wait_group(0)`) | 128 | every thread, once its wgmmas on slice k are done | thread 0 before issuing the next TMA (write after read) | n/a | n/a |
| CTA barrier (epilogue, after `fence.proxy.async`) | 128 | every thread, after writing its fragment to Dsmem | thread 0, before the TMA store | n/a | n/a |
| TMA store bulk group | n/a | thread 0: `commit_group` | thread 0: `wait_group(0)` (Dsmem must outlive the store's reads) | n/a | n/a |""",
        "sass": "What to look for: `LDG.E.128` disappears (the builder's `sass_forbid`), "
                "`UTMALDG` x2 (A and B) and `UTMASTG` x1 appear, and `SYNCS.ARRIVE` (the "
                "`expect_tx` arrival) joins `SYNCS.PHASECHK` (the waits).",
        "lines": 60,
    },
    "v5": {
        "slug": "pipeline",
        "title": "a multi-stage SMEM ring",
        "changes": """\
**What changes from v4:** layout (a ring of stages) and *when* the loads are issued.

| | sm_100a | sm_90a |
|---|---|---|
| **scope** | unchanged (one CTA per output tile) | unchanged |
| **layout** | A/B SMEM gain a stage dimension: `PIPE_DEPTH` = 2 by default (97 KiB per CTA); `tma_bar` becomes one barrier per stage | `PIPE_DEPTH` = 2 by default (97 KiB, so two CTAs fit on an SM); `tma_bar` becomes one barrier per stage; wgmma descriptors step by one 16 KiB stage |
| **dispatch** | thread 0 fills the ring before the loop (prologue); after slice k's MMA completes, stage `k % PIPE_DEPTH` is refilled with slice `k + PIPE_DEPTH` | same, after every warp is past slice k's `wait_group(0)` |
| **new contract** | stage s holds slices s, s+P, s+2P, ...: its barrier completes once per trip around the ring, so the parity to wait for **flips when the consumer wraps** (after stage P-1), not every slice; `mma_bar` still flips every slice | same for `tma_bar[s]` |

No "empty" barrier is needed yet: the thread that refills a stage is the one that saw its
MMA complete (`mma_bar` / `wait_group` + CTA barrier), so program order protects the
write-after-read.

Why: the TMA for the next slices is in flight while the tensor cores work, so the wait on a
stage usually finds its data already there. What stays serial is MMA issue -> wait ->
refill -> next issue: every slice still drains the tensor-core pipe (v7 removes that). On
sm_90a the default depth is 2 rather than more because two 97 KiB CTAs per SM hide each
other's drains; the step card has the measured depths.""",
        "barriers_sm100a": TABLE_HEAD + """\
| `tma_bar[s]`, s < PIPE_DEPTH | 1 (+ 32768 tx bytes) | thread 0: `expect_tx` with the two loads into stage s (prologue and refills); the TMA unit completes the bytes | warp 0 only, before the MMA reads stage s | 0 | when the ring wraps (after the wait on stage PIPE_DEPTH-1): once per PIPE_DEPTH slices |
| `mma_bar` | 1 | `tcgen05.commit` (thread 0) | warp 0 only, before stage s is refilled | 0 | every K slice |
| CTA barrier (after the K-loop) | 128 | every thread; warp 0 once it has seen the last MMA complete | every thread, before the epilogue reads TMEM | n/a | n/a |
| named barrier 1 (epilogue) | 128 | every thread, Dsmem written and fenced / store drained | every thread | n/a | n/a |""",
        "barriers_sm90a": TABLE_HEAD + """\
| `tma_bar[s]`, s < PIPE_DEPTH | 1 (+ 32768 tx bytes) | thread 0: `expect_tx` + the two loads into stage s (prologue and refills) | all 128 threads, before the wgmmas read stage s | 0 | when the ring wraps (after stage PIPE_DEPTH-1) |
| CTA barrier (after `wait_group(0)`) | 128 | every thread, once its wgmmas on slice k are done | thread 0, before refilling that stage (write after read) | n/a | n/a |
| CTA barrier (epilogue) + TMA store bulk group | 128 / n/a | as in v4 | as in v4 | n/a | n/a |""",
        "sass": "What to look for: more `UTMALDG` (the prologue's loads plus the in-loop "
                "refill) and more `SYNCS.ARRIVE` (one `expect_tx` per load site); the MMA "
                "count per slice is unchanged; shared memory per CTA grows by one 32 KiB "
                "stage per extra `PIPE_DEPTH`.",
        "lines": 70,
    },
    "v6": {
        "slug": "persistent",
        "title": "a persistent kernel",
        "changes": """\
**What changes from v5:** scope. A fixed pool of CTAs, one per SM, walks all output tiles.

| | sm_100a | sm_90a |
|---|---|---|
| **scope** | 1D grid of `SM_COUNT` = 148 CTAs (a B200's SMs); each takes tiles from `ClusterPersistentScheduler2D` (`l2_group_size=8`: groups of 8 tile rows visited column by column, so CTAs running at the same time share B bands in L2). TMEM allocation, barrier init and scheduler init happen once per CTA. | a pool of `SM_COUNT` x `CTAS_PER_SM` = 132 x 2 CTAs (H100/H200; two 97 KiB CTAs fit on an SM, as in v5), the same scheduler with `L2_GROUP` = 16 |
| **layout** | unchanged (PIPE_DEPTH-stage ring, Dsmem) | unchanged |
| **dispatch** | unchanged inside a tile | + the next tile's first slices are loaded as soon as this tile's last wgmmas drained, so they overlap this tile's epilogue; the TMA store is no longer waited for right after it is issued |
| **new contract** | barriers are reused across tiles, so their **phases are carried across tiles**: the ring's stage and phase live in a `PipelineState` that counts slices for the CTA's life, and each tile's prologue fills the stages after the last one used. (The seed restarted phases at 0 per tile, correct only when K/64 is a multiple of 2 x PIPE_DEPTH.) Two CTA barriers per tile hand the accumulator to the epilogue and TMEM back to the MMA | the ring's stage and phase (`PipelineState`) are **carried across tiles**, so no parity contract; before writing Dsmem again, thread 0 waits `cp.async.bulk.wait_group.read 0` (the previous store has finished *reading* it) |

Why: setup is paid once per SM instead of once per tile, and the tile order improves L2
reuse. Inside a CTA, loads, MMA and epilogue still take turns (v7).""",
        "barriers_sm100a": TABLE_HEAD + """\
| `tma_bar[s]` | 1 (+ 32768 tx bytes) | thread 0: `expect_tx` + two loads into stage s (each tile's prologue and refills) | warp 0 only, before the MMA reads stage s | 0, never reset: `ring` counts uses for the CTA's whole life | every ring wrap (`ring.advance()`) |
| `mma_bar` | 1 | `tcgen05.commit` (thread 0) | warp 0 only | 0, carried across tiles | every K slice |
| CTA barrier (after a tile's K-loop) | 128 | every thread; warp 0 once it has seen the tile's last MMA complete | every thread, before the epilogue reads TMEM | n/a | n/a |
| CTA barrier (end of tile) | 128 | every thread, past the epilogue's TMEM reads | warp 0, before the next tile's MMA overwrites TMEM | n/a | n/a |
| named barrier 1 (epilogue) | 128 | as in v4 | as in v4 | n/a | n/a |""",
        "barriers_sm90a": TABLE_HEAD + """\
| `tma_bar[s]` | 1 (+ 32768 tx bytes) | thread 0: in-loop refills and the next tile's prefetch, `expect_tx` + two loads | all 128 threads, before the wgmmas read stage s | 0, never reset: `ring` counts uses for the CTA's whole life | every ring wrap (`ring.advance()`) |
| CTA barrier (after `wait_group(0)`) | 128 | every thread, its wgmmas on the stage done | thread 0, before refilling the stage | n/a | n/a |
| CTA barrier (epilogue, first) | 128 | every thread; thread 0 after `bulk wait_group.read(0)` | every thread, before writing Dsmem | n/a | n/a |
| CTA barrier (epilogue, second, after `fence.proxy.async`) | 128 | every thread, fragment written | thread 0, before the TMA store | n/a | n/a |
| TMA store bulk group | n/a | thread 0: `commit_group` | `wait_group.read(0)` before the next epilogue; `wait_group(0)` at exit | n/a | n/a |""",
        "sass": "What to look for: on sm_100a the MMA, TMA and barrier instructions are v5's; "
                "the scheduler adds integer work around them and one more `BAR.SYNC` (the "
                "end-of-tile barrier). On sm_90a the next tile's prefetch is a third load site "
                "(more `UTMALDG` and `SYNCS.ARRIVE`) and the Dsmem-free barrier adds a "
                "`BAR.SYNC`; carrying tile indices and the ring across tiles costs registers.",
        "lines": 75,
    },
    "v7": {
        "slug": "warp_specialization",
        "title": "warp specialization",
        "changes": """\
**What changes from v6:** all three. Instead of one warpgroup doing everything in turn,
warps get fixed roles and talk only through mbarriers, so TMA, tensor cores and epilogue
run at the same time.

| | sm_100a | sm_90a |
|---|---|---|
| **scope** | 2 warpgroups (256 threads): warpgroup 1 warp 3 = **TMA producer**; warpgroup 1 warp 0 = **MMA issuer** (one elected lane); warpgroup 0 = **epilogue** | 3 warpgroups (384 threads): warpgroup 2 = **producer** (one thread); warpgroups 0 and 1 = **consumers**, each owns 64 rows of a 128x256 tile |
| **layout** | TMEM accumulator **double-buffered** (2 x 128 columns), so tile i+1's MMAs run while the epilogue drains tile i; `PIPE_DEPTH` = 4 (161 KiB SMEM) | tile 128x256 (`m64n256k16` wgmma), 48 KiB stages, `PIPE_DEPTH` = 3, Dsmem 128x256 as two contiguous 64-row halves (one TMA box each); one CTA per SM (`SM_COUNT` = 132, `L2_GROUP` = 16) |
| **dispatch** | `setmaxnreg`: warpgroup 1 down to 56 registers, the epilogue up to 224 | `setmaxnreg` 40 (producer) / 232 (consumers); consumers keep one wgmma group in flight: issue slice k, commit, `wait_group(1)` (= slice k-1 done), release slice k-1's stage |
| **new contract** | **full/empty barrier pairs** (`tma2mma`/`mma2tma` for the SMEM ring, `mma2ld`/`ld2mma` for the accumulators); stage and phase tracked by `PipelineState` and carried across tiles, as in v6 | `tma2mma`/`mma2tma` per stage, carried across tiles; each consumer syncs only its own warpgroup (named barrier) for its half of the store |

The trick in the "initial phase" column: a fresh mbarrier is in phase 0, and a wait for
parity 1 returns at once (the phase "before" 0 counts as completed). So a producer that
starts waiting on parity 1 of an *empty* barrier passes immediately: every stage, and
every accumulator, starts free.

Why: overlapping load, MMA and epilogue is what turns the tensor cores from mostly idle to
mostly busy. The seed's article series quotes 607 TFLOP/s for this step on a B200 at
4096^3 (not measured here); the sm_90a twin targets >= 0.9x torch.matmul on an H200.""",
        "barriers_sm100a": TABLE_HEAD + """\
| `tma2mma[s]` (full) | 1 (+ 32768 tx bytes) | producer warp's elected lane: two TMA loads into stage s + `expect_tx` | MMA warp | 0 (the MMA warp's ring starts at phase 0) | every ring wrap (`PipelineState.advance` after stage 3) |
| `mma2tma[s]` (empty) | 1 | `tcgen05.commit` after the MMAs reading stage s (MMA warp, elected lane) | producer warp, before reloading stage s | producer waits parity **1** first: passes on a fresh barrier, all stages start empty | every ring wrap |
| `mma2ld[a]` (accumulator full) | 1 | `tcgen05.commit` after a tile's last MMA into accumulator a | epilogue warpgroup (128 threads) | 0 | every 2 tiles (the accumulator ring wraps) |
| `ld2mma[a]` (accumulator empty) | 128 | every epilogue thread after its `tcgen05.ld` of accumulator a (`fence::before_thread_sync`) | MMA warp, before overwriting accumulator a | MMA warp waits parity **1** first: both accumulators start free | every 2 tiles |
| named barrier 1 (epilogue warpgroup) | 128 | epilogue threads: Dsmem written and fenced / store drained | epilogue threads | n/a | n/a |
| CTA barrier (exit) | 256 | every thread | warp 0 of warpgroup 0, before freeing TMEM | n/a | n/a |""",
        "barriers_sm90a": TABLE_HEAD + """\
| `tma2mma[s]` | 1 (+ 49152 tx bytes) | producer thread: `expect_tx` + two TMA loads into stage s | all 256 consumer threads | 0 (consumers wait for parity 0 first) | every ring wrap, carried across tiles |
| `mma2tma[s]` | 2 (one per consumer) | thread 0 of each consumer warpgroup, once `wait_group(1)` shows its wgmmas on stage s done (the tile's last stage: after `wait_group(0)`) | producer thread, before reloading stage s | producer waits parity **1** first: passes on a fresh barrier, all stages start empty | every ring wrap |
| named barrier 1 + c (consumer c's warpgroup) | 128 | consumer c's threads: Dsmem half free (after thread 0's `wait_group.read(0)`) / half written and fenced | consumer c's threads; thread 0 then issues the TMA store of its 64x256 half | n/a | n/a |
| wgmma groups | n/a | `commit_group` per slice | `wait_group(1)` keeps one slice in flight; `wait_group(0)` at the tile's end | n/a | n/a |""",
        "sass": "What to look for: `USETMAXREG` x2 (one decrease, one increase); more "
                "`SYNCS.PHASECHK` (four barrier roles, each waited on in its own loop); a second "
                "`UTCBAR` (the per-tile commit to the accumulator barrier); fewer `UTMALDG` "
                "sites (one producer loop instead of prologue + refill). On sm_90a `HGMMA` "
                "drops from 8 to 4 per slice: each consumer issues only its 64 rows, as "
                "m64n256k16 (the registry expects `HGMMA.64x256x16`).",
        "lines": 110,
    },
    "v8": {
        "slug": "two_cta",
        "title": "two CTAs work as one",
        "changes": """\
**What changes from v7:** scope. Two CTAs of a cluster cooperate on one cluster tile; the
technique differs per arch, because only Blackwell has a 2-CTA MMA.

| | sm_100a | sm_90a |
|---|---|---|
| **scope** | a cluster of 2 CTAs computes a **256x256** cluster tile; the scheduler walks cluster tiles over `SM_COUNT // 2` clusters | a cluster of 2 CTAs computes two vertically adjacent 128x256 tiles that need the same B tile; the scheduler walks 256x256 cluster tiles over `SM_COUNT // 2` clusters |
| **layout** | each CTA stages its own 128x64 slice of A and of B per stage; each CTA's TMEM holds its 128 rows of the 256x256 result, double-buffered (2 x 256 columns = all 512) | each CTA stages its A tile and **half** of B; the TMA unit **multicasts** that half into both CTAs' SMEM (`UTMALDG.2D.MULTICAST`): 32 KB of loads per CTA and K step instead of 48 KB |
| **dispatch** | CTA 0's MMA warp issues one `tcgen05.mma cta_group::2` that reads A and B from both CTAs' SMEM; TMEM alloc/dealloc and commits in their 2-CTA forms | as v7 (wgmma m64n256k16 per consumer), plus the multicast loads |
| **new contract** | barriers **across the pair**: CTA 0's `tma2mma` expects both CTAs' bytes; one multicast `tcgen05.commit` (mask 0b11) frees a stage or publishes an accumulator in both CTAs; both CTAs' epilogues arrive on CTA 0's `ld2mma` (256); cluster barriers at setup and teardown | a CTA may refill a stage only when the consumers of **both** CTAs are done with it (its multicast writes into the peer): consumers release stages in both CTAs through the cluster's shared-memory window (`mapa` + remote arrive); cluster barriers at setup and teardown |

Why: every staged byte feeds twice the output (sm_100a: half the operand traffic per FLOP;
the book measured 1328 TFLOP/s for its step 8 on a B200 at 4096^3, against 607 for step 7:
the book's figures, not measured here). On Hopper the multicast halves B's trips from L2 to
the SMs; v7 is bound by the tensor cores rather than by loads, so the measured gain is
small (results table).""",
        "barriers_sm100a": TABLE_HEAD + """\
| `tma2mma[s]` (CTA 0's is used) | 1 (+ both CTAs' bytes) | CTA 0's producer: `expect_tx` for the pair; both CTAs' TMA copies complete on CTA 0's barrier | CTA 0's MMA warp | 0 | every ring wrap |
| `mma2tma[s]` | 1 | one multicast `tcgen05.commit` (mask 0b11) arrives in both CTAs once the pair MMA has read stage s | each CTA's producer | producer waits parity 1 first (stages start empty) | every ring wrap |
| `mma2ld[a]` | 1 | multicast commit after a tile's last MMA, in both CTAs | each CTA's epilogue warpgroup | 0 | every 2 tiles |
| `ld2mma[a]` (CTA 0's) | 2 x 128 | every epilogue thread of both CTAs (CTA 1's arrive remotely) after reading accumulator a | CTA 0's MMA warp | MMA warp waits parity 1 first | every 2 tiles |
| cluster barrier | 2 x 256 | all threads of both CTAs | all threads: after barrier init and TMEM alloc; before TMEM dealloc (the peer's MMA and arrivals touch this CTA until both are done) | n/a | n/a |""",
        "barriers_sm90a": TABLE_HEAD + """\
| `tma2mma[s]` (per CTA) | 1 (+ 48 KB) | own producer thread (`expect_tx` 48 KB); bytes come from its own TMA (A + own half of B) and the peer's multicast (other half of B) | the 256 consumer threads of this CTA | 0 | every ring wrap |
| `mma2tma[s]` (per CTA) | 4 | threads 0 and 1 of each consumer warpgroup of both CTAs: each warpgroup arrives once in each CTA (two of the four arrivals are remote) | own producer thread | producer waits parity 1 first (stages start empty) | every ring wrap |
| cluster barrier | all threads of both CTAs | all threads | all threads: after barrier init; before exit | n/a | n/a |""",
        "sass": "What to look for: on sm_100a the 2-CTA forms `UTCHMMA.2CTA`, "
                "`UTCBAR.2CTA.MULTICAST`, `UTMALDG.2D.2CTA`, `UTCATOMSWS.2CTA` and the cluster "
                "barrier `UCGABAR_ARV`/`UCGABAR_WAIT`; on sm_90a `UTMALDG.2D.MULTICAST` next to "
                "the plain A load, and `SYNCS.ARRIVE.TRANS64.RED` (the remote arrive).",
        "lines": 110,
    },
    "v9": {
        "slug": "consumers_and_overlap",
        "title": "keep the tensor cores busy through the epilogue",
        "changes": """\
**What changes from v8:** dispatch. Again one idea per arch, both aimed at the time the
tensor cores wait for an epilogue.

| | sm_100a | sm_90a |
|---|---|---|
| **scope** | three warpgroups: warp 3 of warpgroup 2 loads, warps 0 and 1 of warpgroup 2 are **two MMA consumers**, warpgroups 0 and 1 are their epilogues; cluster tile 512x256 | as v8 (a 2-CTA cluster, producer + two consumer warpgroups) |
| **layout** | a stage holds two A slices and **one shared B slice**; consumer c accumulates into TMEM columns [256c, 256c+256) (all 512) | the staging buffer for the output shrinks to `EPI_BUFS` x 8 KB per warpgroup, which makes room for a **4th stage** |
| **dispatch** | each consumer issues its own 2-CTA MMA against the same B; each epilogue drains its columns in 64-column chunks and frees them on its own | the finished accumulators are packed to fp16 at once; the next tile's first wgmma starts from **scale-d 0** (no zero-fill), and while it runs the warpgroup writes the packed tile with `stmatrix` and TMA-stores it in 64-column chunks; a store is waited for (`wait_group.read`) only when its staging buffer is reused |
| **new contract** | a stage is refilled after **two** commits (`mma2tma` counts 2); `mma2ld`/`ld2mma` indexed by consumer instead of accumulator stage | bulk-async groups replace the per-tile `wait_group(0)`: staging buffer b is rewritten only after the store that read it finished reading |

Why: on sm_100a, while one epilogue writes back, the other consumer keeps the tensor cores
busy, and staged bytes per MMA fall from 32 KiB to 24 KiB (the book reports 1460 TFLOP/s for
its step 9 on a B200 at 4096^3, equal to cuBLAS there: the book's figures). On Hopper the
epilogue of tile t hides behind the first wgmmas of tile t+1.""",
        "barriers_sm100a": TABLE_HEAD + """\
| `tma2mma[s]` (CTA 0's is used) | 1 (+ both CTAs' bytes: two A slices and one B slice each) | CTA 0's producer (`expect_tx` for the pair) and both CTAs' TMA copies | both MMA consumers of CTA 0 | 0 | every ring wrap |
| `mma2tma[s]` | **2** | one multicast `tcgen05.commit` per consumer, once its MMA has read stage s | each CTA's producer | producer waits parity 1 first | every ring wrap |
| `mma2ld[c]` | 1 | consumer c's multicast commit after a tile's last MMA | epilogue warpgroup c of each CTA | 0 | every tile of consumer c |
| `ld2mma[c]` (CTA 0's) | 2 x 128 | every thread of epilogue c in both CTAs, after reading its columns | MMA consumer c | consumer waits parity 1 first | every tile of consumer c |
| cluster barrier | all threads of both CTAs | all threads | after init; before TMEM dealloc | n/a | n/a |""",
        "barriers_sm90a": TABLE_HEAD + """\
| `tma2mma[s]`, `mma2tma[s]` | as v8 | as v8 | as v8 | as v8 (4 stages) | every ring wrap |
| named barrier 1 + c (consumer c's warpgroup) | 128 | the warpgroup's threads, before and after each chunk's `stmatrix` | the same threads; thread 0 then issues the chunk's TMA store | n/a | n/a |
| bulk-async group (staging buffer b) | n/a | thread 0 commits one TMA store per chunk | thread 0: `wait_group.read(EPI_BUFS-1)` before reusing a buffer; `wait_group(0)` before exit | n/a | n/a |""",
        "sass": "What to look for: sm_100a keeps v8's 2-CTA forms with twice the `UTCHMMA` "
                "issue sites (two consumers); sm_90a gains `STSM` (stmatrix) and "
                "`F2FP.F16.F32.PACK_AB` between the `HGMMA` issue and `WARPGROUP.DEPBAR`, and "
                "several `UTMASTG` (one per 64-column chunk).",
        "lines": 120,
    },
}


# --------------------------------------------------------------------------------------
# notebook assembly
# --------------------------------------------------------------------------------------
def _slug(step_id: str) -> str:
    if step_id in NARRATIVE:
        return NARRATIVE[step_id]["slug"]
    from tirx_gemm import registry
    lesson = next(s.lesson for s in registry.STEPS if s.id == step_id)
    words = [w for w in "".join(c if c.isalnum() else " " for c in lesson.split(":")[0].lower()
                                ).split()][:3]
    return "_".join(words) or "step"


def notebook_names() -> dict[str, str]:
    """step id -> notebook file name, for every step id in the registry."""
    from tirx_gemm import registry
    return {sid: f"{int(sid.lstrip('v')):02d}_{_slug(sid)}.ipynb" for sid in registry.step_ids()}


def _cells(stem: str, specs: list[tuple[str, str]]):
    cells = []
    for i, (kind, src) in enumerate(specs):
        cell = v4.new_markdown_cell(src) if kind == "md" else v4.new_code_cell(src)
        cell["id"] = f"{stem}-{i:02d}"
        cells.append(cell)
    return cells


def _notebook(stem: str, specs: list[tuple[str, str]]) -> str:
    nb = v4.new_notebook()
    nb.nbformat_minor = NBFORMAT_MINOR
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    nb.cells = _cells(stem, specs)
    nbformat.validate(nb)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _nav(step_id: str, names: dict[str, str]) -> str:
    ids = list(names)
    i = ids.index(step_id)
    parts = []
    if i > 0:
        parts.append(f"[<- {ids[i - 1]}]({names[ids[i - 1]]})")
    parts.append(f"[overview]({OVERVIEW})")
    if i + 1 < len(ids):
        parts.append(f"[{ids[i + 1]} ->]({names[ids[i + 1]]})")
    return " · ".join(parts)


def step_notebook(step_id: str, names: dict[str, str]) -> str:
    from tirx_gemm import registry
    n = NARRATIVE.get(step_id)
    lesson = next(s.lesson for s in registry.STEPS if s.id == step_id)
    prev = registry.step_ids()[registry.step_ids().index(step_id) - 1] \
        if registry.step_ids().index(step_id) > 0 else None
    title = n["title"] if n else lesson.split(":")[0]
    lines = n["lines"] if n else 70
    S = repr(step_id)

    specs: list[tuple[str, str]] = [
        ("md", f"# {step_id}: {title}\n\n{_nav(step_id, names)}\n\n"
               f"**Lesson (registry):** {lesson}\n\n{TRACKS_NOTE}\n\n"
               "This notebook is generated by `scripts/make_notebooks.py` and holds no kernel "
               "code: every cell calls the package (`tirx_gemm.notebook`, which reads the "
               "registry, the build harness and `results/`)."),
        ("code", f"from tirx_gemm import notebook as nb\n\nSTEP = {S}\nnb.step_overview(STEP)"),
        ("md", "## What changes" + (f" from {prev}" if prev else "") + ", and why\n\n"
               + (n["changes"] if n else "_No narrative for this step yet: see the step cards "
                  "above._")),
        ("md", "## Barriers and phases\n\nOne row per synchronisation object: who arrives, "
               "who waits, the phase the waiters start from and when that phase flips. (An "
               "mbarrier wait for parity p returns once the barrier's phase with parity p has "
               "completed; a fresh barrier is in phase 0.)\n\n"
               "### sm_100a\n\n" + (n["barriers_sm100a"] if n else "_(not written yet)_")
               + "\n\n### sm_90a\n\n" + (n["barriers_sm90a"] if n else "_(not written yet)_")),
        ("md", "## Build it\n\nThe package's builder for every arch the registry lists, at the "
               "step's canonical shape. `tirx_gemm.build.build` compiles in a worker process "
               "(TVM -> CUDA -> nvcc -> cubin -> SASS) and caches the result on disk under "
               "`$TIRX_GEMM_CACHE` (default `~/.cache/tirx-gemm`): a repeat is a file read."),
        ("code", "builds = nb.build_step(STEP)  # arch -> tirx_gemm.build.BuildResult\n"
                 "nb.build_summary(builds)"),
        ("md", "## The generated CUDA\n\nThe kernel body TVM generated, as a *skeleton*: "
               "control flow, barriers, MMA issue, TMA and fences kept, everything else "
               "dropped, runs of identical calls folded, long lines cut. "
               "(`nb.cuda_excerpt(..., skeleton=False)` shows the verbatim text; "
               "`tirx-gemm show " + step_id + " --cuda` prints all of it.)"),
        ("code", f"nb.cuda_excerpt(STEP, \"sm_100a\", lines={lines})"),
        ("code", f"nb.cuda_excerpt(STEP, \"sm_90a\", lines={lines})"),
        ("md", "## SASS: " + (f"{prev} vs {step_id}" if prev else "what the step compiles to")
               + "\n\nCounts of the opcodes the lessons talk about (prefix match on the "
               "mnemonic; the K-loops are kept rolled, so counts are per loop body, not per K) "
               "and the total instruction count.\n\n" + (n["sass"] if n else "")),
        ("code", "nb.sass_compare(STEP)"),
        ("md", "## Registers and shared memory\n\nFrom `ptxas -v` (registers, static shared "
               "memory, spills) and the launch parameters (dynamic shared memory per CTA)"
               + (f", this step next to {prev}" if prev else "") + "."),
        ("code", "nb.resource_table(STEP)"),
        ("md", "## Run it, or read the recorded results\n\nWhere a GPU of an arch is present "
               "(and the build or a bundle in `$TIRX_GEMM_BUNDLE` is available), the step is "
               "checked against the fp32 torch reference and timed here via "
               "`tirx_gemm.runner`; otherwise the recorded results from `results/` are shown "
               "with the GPU they ran on. sm_100a has no recorded run: no Blackwell GPU was "
               "available."),
        ("code", "nb.measure_or_recorded(STEP)"),
        ("md", "## Simulate it on a CPU model of Blackwell\n\nNo Blackwell GPU was available, "
               "so the sm_100a step is executed on tirx-harness NumSim, a CPU model of sm_100a "
               "(tcgen05/TMEM, TMA, mbarrier phases and byte counts), at the registry's "
               "simulation shapes, and checked by synccheck (deadlocks, phase overtaking) and "
               "racecheck (races, missing proxy fences). It runs live where the simulator is "
               "installed (Python >= 3.12, `pip install -e \".[sim]\"`); otherwise the latest "
               "recorded simulation is shown. It proves numbers and synchronization on a "
               "model: no timing, not silicon."),
        ("code", "nb.simulation(STEP)"),
        ("code", "nb.results_table(STEP)"),
        ("md", "Every step's recorded result at its canonical shape, this one highlighted "
               "(a matplotlib plot with the `plot` extra installed, a table otherwise)."),
        ("code", "nb.plot_results(highlight=STEP)"),
    ]
    return _notebook(names[step_id].removesuffix(".ipynb"), specs)


def overview_notebook(names: dict[str, str]) -> str:
    mapping = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in names.items()) + "}"
    specs: list[tuple[str, str]] = [
        ("md", "# tirx-gemm: the path from one tile to a warp-specialized GEMM\n\n"
               "A stepwise FP16 GEMM, `D = A @ B.T` (A is MxK, B is NxK, fp16 in, fp32 "
               "accumulate, fp16 out), written in Apache TVM's TIRx. Each step changes one "
               "contract; each has a notebook.\n\n" + TRACKS_NOTE + "\n\n"
               "**How these notebooks work.** They are generated by "
               "`scripts/make_notebooks.py` and committed without outputs; they hold narrative "
               "and calls into `tirx_gemm.notebook`, never kernel code. Builds use the "
               "canonical shapes and are cached on disk (`$TIRX_GEMM_CACHE`). To run them: "
               "`pip install -e '.[test,plot]'` plus Jupyter, then open this folder. No GPU is "
               "needed: without one the notebooks show the recorded results."),
        ("code", "from tirx_gemm import notebook as nb\n\n"
                 f"NOTEBOOKS = {mapping}\n"
                 "nb.path_table(NOTEBOOKS)"),
        ("md", "## What can run here"),
        ("code", "nb.device_status()"),
        ("md", "## mbarriers in one paragraph\n\n"
               "An mbarrier lives in shared memory and counts arrivals (and, for TMA, "
               "transaction bytes: `arrive.expect_tx` announces them, the copy engine "
               "completes them). When the expected arrivals and bytes are in, the current "
               "*phase* completes and the next begins. Waiters name the *parity* (0 or 1) of "
               "the phase they wait for; the wait returns once that phase has completed. A "
               "fresh barrier is in phase 0, so a wait for parity 1 returns at once: that is "
               "how v7's producers start with every stage empty. A barrier reused in a loop "
               "completes one phase per use, so the waiter flips its parity per use (v2), per "
               "trip around a ring (v5), and carries it across tiles (v6, v7). Only a warp "
               "that cannot fall a whole phase behind may watch a barrier: in sm_100a v4-v6 "
               "that is warp 0 alone, in v7 each role's own warp. Each step notebook has the "
               "table for its step."),
        ("md", "## Every step, compiled\n\nRegisters, shared memory, spills and size of every "
               "registered step at its canonical shape (built in parallel worker processes on "
               "a cache miss)."),
        ("code", "nb.resource_overview()"),
        ("code", "nb.sass_overview(\"sm_100a\")"),
        ("code", "nb.sass_overview(\"sm_90a\")"),
        ("md", "## Recorded results\n\nFrom `results/*.jsonl` (the same data as the README "
               "table), with the GPU named; sm_100a: not measured, no sm_100a GPU available."),
        ("code", "nb.results_table()"),
        ("code", "nb.plot_results()"),
    ]
    return _notebook(OVERVIEW.removesuffix(".ipynb"), specs)


def render() -> dict[str, str]:
    """File name -> exact file text, for every notebook this script writes."""
    names = notebook_names()
    out = {OVERVIEW: overview_notebook(names)}
    for sid, name in names.items():
        out[name] = step_notebook(sid, names)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if notebooks/ differs from what would be written")
    args = ap.parse_args(argv)
    files = render()
    stale = sorted(p.name for p in NB_DIR.glob("*.ipynb") if p.name not in files)
    differ = sorted(n for n, text in files.items()
                    if not (NB_DIR / n).exists()
                    or (NB_DIR / n).read_text(encoding="utf-8") != text)
    if args.check:
        for n in differ:
            print(f"differs from the generator: notebooks/{n}")
        for n in stale:
            print(f"not produced by the generator: notebooks/{n}")
        return 1 if (differ or stale) else 0
    NB_DIR.mkdir(exist_ok=True)
    for n in differ:
        (NB_DIR / n).write_text(files[n], encoding="utf-8")
        print(f"wrote notebooks/{n}")
    for n in stale:
        print(f"note: notebooks/{n} is not produced by the generator (remove it?)")
    if not differ:
        print(f"notebooks/ is up to date ({len(files)} notebooks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
