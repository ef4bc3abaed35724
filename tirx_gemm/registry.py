"""The one table of steps: it feeds the CLI, the tests, the notebooks and the scripts.

Importing this module does not import TVM: builders are loaded lazily by module path, so
the run side (a GPU host without the TVM compiler) can read the table too.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Callable

from tirx_gemm import spec
from tirx_gemm.sim_cases import SIM_CASES


ARCHES = spec.ARCHES
Shape = tuple[int, int, int]


GROUPED_E = 8  # the experts of a grouped build that names no E (v14's builders' default)


@dataclass(frozen=True)
class Step:
    id: str                 # "v1" .. "v11"
    arch: str               # "sm_100a" | "sm_90a"
    lesson: str             # one line: what this step teaches
    constraints: str        # human-readable shape contract (the builder enforces it)
    canonical: Shape        # the shape `tirx-gemm build vN` uses by default
    test_shapes: tuple[Shape, ...]   # other valid shapes for CPU build tests / GPU checks
    bench_shapes: tuple[Shape, ...]  # shapes that the benchmark / regression time
    invalid_shapes: tuple[Shape, ...]  # shapes the builder must reject with ValueError
    sass_expect: tuple[str, ...]       # SASS opcodes the lesson promises (prefix match)
    sass_forbid: tuple[str, ...] = ()  # SASS opcodes the lesson removes
    sm_count_kwarg: str | None = None  # persistent steps: the builder keyword for the CTA pool
    # sm_100a: CPU simulation cases (NumSim + synccheck + racecheck), each
    # ((M, N, K), ((kwarg, value), ...)), chosen to exercise the step's protocol
    sim_cases: tuple[tuple[Shape, tuple[tuple[str, object], ...]], ...] = ()
    # checker findings of status "review" this step accepts: ((finding kind, reason), ...)
    sim_accept: tuple[tuple[str, str], ...] = ()
    # extra kernel operands after D (split-K partial sums, tile counters): "module:function"
    # of a TVM- and torch-free function (M, N, K, kwargs) -> ((name, shape, dtype), ...).
    # The caller allocates each zero-filled once per kernel and passes it after D in that
    # order. Integer buffers (counters) must be zero-filled again when the kernel returns
    # (v11 resets each tile's counter once all its splits arrived); floating-point buffers
    # are scratch: every element a launch reads, that launch wrote first, so they need no
    # initial value and may be left dirty (a check may fill them with NaN instead of 0).
    workspace: str | None = None
    # a step that exists on this arch only says why (the twin is not written yet); every
    # other step has a twin on each arch (tests/test_registry.py)
    one_track: str | None = None
    # fp8 steps (v13): A and B are e4m3 (uint8 operands), fp32 scales follow D; the run
    # side quantizes its 2-byte inputs for them (run.runner.Fp8Operands)
    fp8: bool = False
    # grouped steps (v14): B is (E, N, K), the routing tensor (offs / counts) follows D; the
    # sim checks build their operands with tirx_gemm.hopper.grouped's model, the GPU runner
    # with run.runner.GroupedOperands (E: the build's, GROUPED_E where it names none)
    grouped: bool = False
    # the step this one changes (its card's "Changes from vN", its notebook's diff and SASS
    # comparison, scripts/diff_sizes.py); None for the first step. Declared once, in _BASES
    base: str | None = None
    # the builder's CTA tile at its default keywords: (BLK_M, BLK_N, BLK_K) in elements
    tile: tuple[int, int, int] = (128, 128, 64)
    # CTAs per cluster (spec.CLUSTER_SIZE for the clustered steps, else 1)
    cluster: int = 1
    # the output tile (M, N) one cluster's scheduler hands out, where it is not the CTA
    # tile's (BLK_M, BLK_N): a CTA pair, two consumers, or both
    cluster_tile: tuple[int, int] | None = None

    @property
    def idea(self) -> str:
        """The step's idea in a few words (IDEAS, shared by the arches): the path table's."""
        return IDEAS[self.id]

    @property
    def output_tile(self) -> tuple[int, int]:
        """The (M, N) of D one unit of the step's tile walk covers at default keywords."""
        return self.cluster_tile or self.tile[:2]

    @property
    def default_sm_count(self) -> int | None:
        """The CTA pool a persistent step's builder sizes for by default (spec.SM_COUNT of
        its arch); None for a step with one CTA per tile."""
        return spec.sm_count(self.arch) if self.sm_count_kwarg else None

    def workspace_specs(self, M: int, N: int, K: int, kwargs: dict | None = None):
        """The extra operands of this step at this shape: ((name, shape, dtype), ...)."""
        if self.workspace is None:
            return ()
        mod, _, fn = self.workspace.partition(":")
        return tuple(getattr(importlib.import_module(mod), fn)(M, N, K, dict(kwargs or {})))

    def dtype(self, kwargs: dict | None = None) -> str:
        """The operand dtype a build with these keywords takes (float16 unless given)."""
        return str((kwargs or {}).get("dtype", spec.DEFAULT_DTYPE))

    def with_sm_count(self, n: int | None) -> dict:
        """Builder keywords that size a persistent step's CTA pool to a GPU with n SMs."""
        return {self.sm_count_kwarg: n} if (n and self.sm_count_kwarg) else {}

    @property
    def key(self) -> str:
        return f"{self.id}@{self.arch}"

    @property
    def module(self) -> str:
        return f"tirx_gemm.steps.{self.arch.replace('_', '')}.hgemm_{self.id}"

    @property
    def source_file(self) -> str:
        """The step's source. From an installed package via its module; from a plain
        checkout on PYTHONPATH (a GPU host running bundles, no install) the steps/ folder
        beside tirx_gemm/, since only an install maps steps/ to tirx_gemm.steps."""
        import importlib.util
        from pathlib import Path
        try:
            spec = importlib.util.find_spec(self.module)
        except ModuleNotFoundError:
            spec = None
        if spec is not None and spec.origin:
            return spec.origin
        return str(Path(__file__).resolve().parent.parent / "steps"
                   / self.arch.replace("_", "") / f"hgemm_{self.id}.py")

    def builder(self) -> Callable:
        return getattr(importlib.import_module(self.module), f"hgemm_{self.id}")

    def build_primfunc(self, M: int, N: int, K: int, **kwargs):
        """The step's PrimFunc. ``mutant=NAME`` builds a deliberately broken variant of this
        step instead (tirx_gemm.mutants), e.g. to prove that the simulation gate or the
        GPU watchdog catches it; it travels through builds and bundles like any keyword.
        ``TIMELINE=True`` builds the instrumented twin (tirx_gemm.timeline): the same kernel
        plus event records into one extra operand after D; off, the PrimFunc is unchanged."""
        from tirx_gemm import tvm_frames
        tvm_frames.install()  # TVM's parser finds its frames faster; same PrimFunc
        builder = self.builder()
        mutant = kwargs.pop("mutant", None)
        timeline = kwargs.pop("TIMELINE", False)
        if mutant is not None:
            from tirx_gemm import mutants
            m = mutants.get(mutant)
            if (m.step, m.arch) != (self.id, self.arch):
                raise ValueError(f"mutant {mutant} breaks {m.step}@{m.arch}, not {self.key}")
            builder = mutants.builder(m, self.source_file)
        if timeline:
            from tirx_gemm import timeline as TL
            return TL.build_instrumented(builder, M, N, K, kwargs,
                                         persistent=self.sm_count_kwarg is not None,
                                         arch=self.arch)
        return builder(M, N, K, **kwargs)


_GRID_TESTS = ((256, 384, 512), (1024, 2048, 512), (768, 1280, 960))
_BENCH = ((4096, 4096, 4096), (8192, 8192, 8192))

# Each step's idea in a few words (at most 60 characters; one per step, both arches): the
# README's path table (records.path_table); the lesson line says it in full
IDEAS = {
    "v1": "one tile, one K block: a single MMA and its barrier",
    "v2": "a K loop: accumulate over K tiles",
    "v3": "a 2D grid: one CTA per output tile",
    "v4": "TMA: bulk tile copies on an mbarrier, TMA-store epilogue",
    "v5": "a multi-stage SMEM ring: load ahead while computing",
    "v6": "a persistent kernel: a CTA pool walks the tiles",
    "v7": "warp specialization: producer and consumers run at once",
    "v8": "a CTA pair: 2-CTA MMA (sm_100a), TMA multicast (sm_90a)",
    "v9": "two consumers (sm_100a), overlapped epilogue (sm_90a)",
    "v10": "dynamic scheduling (sm_100a), ping-pong consumers (sm_90a)",
    "v11": "split-K: each tile's K cut across CTAs, fixed-order sum",
    "v12": "tile menu: the tile's shape picked per problem",
    "v13": "fp8 (e4m3) operands, scaled in the kernel",
    "v14": "grouped GEMM: experts walked on the device, no host sync",
    "v15": "operand layouts: MN-major A and B through TMA and the MMA descriptors",
}

_LESSONS = {
    "v1": "single 128x128 tile, K=64: thread copies, one elected thread issues the MMA, mbarrier wait, accumulator -> registers -> GMEM",
    "v2": "K-loop: accumulate over K tiles; the mbarrier phase flips every iteration",
    "v3": "2D grid: one CTA per 128x128 output tile",
    "v4": "TMA: one thread issues tile copies completing on an mbarrier (expect_tx); TMA-store epilogue",
    "v5": "multi-stage SMEM ring: prefetch PIPE_DEPTH tiles, per-stage barriers and phases",
    "v6": "persistent kernel: a fixed pool of CTAs walks tiles in L2-friendly order",
    "v7": "warp specialization: TMA producer, MMA issuer and epilogue run concurrently, linked by full/empty barriers",
    "v8": "2-CTA MMA: a CTA pair issues one tcgen05.mma cta_group::2 over a 256x256 cluster tile; barriers signalled across the pair",
    "v9": "multiple consumers: two MMA warps into separate TMEM column ranges (all 512) share each staged B tile; two epilogue warpgroups",
    "v10": "dynamic persistent scheduling: Cluster Launch Control hands each CTA pair its next tile; v8's double-buffered TMEM accumulator, unchanged, still runs the epilogue of tile t under the MMAs of tile t+1",
    "v11": "split-K: few output tiles, so each tile's K range is cut across CTAs; every split stores an fp32 partial and counts itself (acq_rel atomic), the last to arrive sums all partials in split order (deterministic) and stores D; or (REDUCE=spread) every split waits for all and reduces its own band",
    "v12": "tile menu: BLK_N 16..256 (step 16) at BLK_M 128 in one builder, v7's warp-specialized kernel with a ring as deep as fits, 64-column chunks by TMA store and a narrow tail stored from registers, RUNTIME_M (one kernel for every M), SWAP_AB (tokens in the MMA's N) and STREAM_K (the tail wave's K steps in units, a fixed-order reduction); wave efficiency and bytes per flop pick the tile",
}
# The Hopper twins teach the same scheduling lessons; the MMA is wgmma (accumulator in
# registers, issued by a whole warpgroup) instead of tcgen05 (TMEM, one elected thread).
_LESSONS_SM90 = {
    **_LESSONS,
    "v1": "single 128x128 tile, K=64: thread copies, the warpgroup issues wgmma from SMEM descriptors, wait_group, register fragment -> GMEM",
    "v2": "K-loop: accumulate over K tiles in registers; a barrier stops the next copy overwriting SMEM that wgmma still reads",
    "v7": "warp specialization: a TMA producer warpgroup and two wgmma consumer warpgroups (128x256 tile), full/empty barriers, setmaxnreg",
    "v8": "2-CTA cluster: vertically adjacent CTAs share the B tile, each loads half and TMA multicasts it to both; empty barriers arrived remotely; cluster scheduler",
    "v9": "overlapped epilogue: stmatrix the previous tile's fp16 result and TMA-store it while the next tile's first wgmmas (scale-d 0) run; 4-stage ring",
    "v10": "ping-pong consumers: two consumer warpgroups on different tiles, one's epilogue under the other's mainloop, their turns ordered by named barriers",
    "v11": "split-K: few output tiles, so each tile's K range is cut across CTAs; each consumer half stores an fp32 partial and counts itself (acq_rel atomic), the last to arrive sums all partials in split order (deterministic) and stores D; or (REDUCE=spread) every split waits for all and reduces its own band",
}

# The step each step changes, per arch (Step.base: one notion of "the previous step" for
# the cards, the notebooks' diffs and SASS tables, and scripts/diff_sizes.py). Where it is
# not the step before: sm_100a v10 extends v8 (v9's two consumers fill all 512 TMEM columns,
# so no room for v10's double-buffered accumulator); v11 extends v7 on both arches (one
# tile per split, no cluster); sm_90a v12 extends v9 (no cluster, the tile a tunable);
# sm_100a v12 extends v7 (1-CTA, the tile a tunable); sm_100a v13 extends v9 (the 2-CTA
# pair of v8 / v9, which v12 does not have), sm_90a v13 extends v12; v14 extends v7 on both
# arches (the grouped walk on the one-CTA warp-specialized kernel; v12's keywords carried over)
_BASES = {
    "sm_100a": {"v1": None, "v2": "v1", "v3": "v2", "v4": "v3", "v5": "v4", "v6": "v5",
                "v7": "v6", "v8": "v7", "v9": "v8", "v10": "v8", "v11": "v7", "v12": "v7",
                "v13": "v9", "v14": "v7", "v15": "v7"},
    "sm_90a": {"v1": None, "v2": "v1", "v3": "v2", "v4": "v3", "v5": "v4", "v6": "v5",
               "v7": "v6", "v8": "v7", "v9": "v8", "v10": "v9", "v11": "v7", "v12": "v9",
               "v13": "v12", "v14": "v7", "v15": "v9"},
}
# CTA tiles (BLK_M, BLK_N, BLK_K) at the builders' defaults, where not 128x128x64 (the
# builders write theirs out, as the lesson; tests/test_registry.py checks they agree), and
# the clustered steps: CTAs per cluster, and the output tile one cluster walks
_WIDE = (128, 256, 64)       # sm_90a v7-v9, v11: two 64-row wgmma consumers of 256 columns
_FP8 = (128, 128, 128)       # v13: 128 e4m3 of K per 128-byte swizzle row
_TILES = {("v13", "sm_100a"): _FP8, ("v7", "sm_90a"): _WIDE, ("v8", "sm_90a"): _WIDE,
          ("v9", "sm_90a"): _WIDE, ("v11", "sm_90a"): _WIDE, ("v13", "sm_90a"): _FP8,
          ("v15", "sm_90a"): _WIDE}
# sm_100a: the CTA pair's MMA is 256x256 (v9, v13: two consumers, 512x256); sm_90a: two
# CTAs stacked in M (v10: 128x128 per consumer tile, so 256x128)
_CLUSTER_TILES = {("v8", "sm_100a"): (256, 256), ("v9", "sm_100a"): (512, 256),
                  ("v10", "sm_100a"): (256, 256), ("v13", "sm_100a"): (512, 256),
                  ("v8", "sm_90a"): (256, 256), ("v9", "sm_90a"): (256, 256),
                  ("v10", "sm_90a"): (256, 128), ("v15", "sm_90a"): (256, 256)}


def _static_facts(step: Step) -> Step:
    """The step with its base, tile and cluster from the tables above."""
    key = (step.id, step.arch)
    if step.id not in _BASES[step.arch]:
        raise KeyError(f"registry: {step.key} has no entry in _BASES (the step it changes, "
                       "as its card's 'Changes from vN' says; None for a first step)")
    return replace(step, base=_BASES[step.arch][step.id],
                   tile=_TILES.get(key, Step.tile),
                   cluster=spec.CLUSTER_SIZE if key in _CLUSTER_TILES else 1,
                   cluster_tile=_CLUSTER_TILES.get(key))


_THREAD_COPIES = ("LDG.E.128", "STS.128")
_TMA = ("UTMALDG", "UTMASTG", "SYNCS.ARRIVE")
# v11's spread reduction writes D with plain 128-bit stores (each unit a band of rows), so
# a split build promises TMA loads but not the TMA store
_TMA_LOADS = ("UTMALDG", "SYNCS.ARRIVE")
# v8, v9: the 2-CTA MMA, its multicast commit, TMA completing on the pair's barrier, the
# pair-wide TMEM allocation and the cluster barrier
_PAIR = ("UTCHMMA.2CTA", "UTCBAR.2CTA.MULTICAST", "UTMALDG.2D.2CTA", "UTCATOMSWS.2CTA",
         "UCGABAR_ARV", "UCGABAR_WAIT")


_PERSISTENT = ("v6", "v7", "v8", "v9", "v10", "v12")


def _sm100(id_, constraints, canonical, tests, bench, invalid, expect, forbid=()):
    return Step(id_, "sm_100a", _LESSONS[id_], constraints, canonical, tests, bench, invalid,
                ("UTCHMMA", "UTCBAR", "LDTM", "SYNCS.PHASECHK") + expect, forbid,
                sm_count_kwarg="SM_COUNT" if id_ in _PERSISTENT else None,
                sim_cases=SIM_CASES[id_])


def _sm90(id_, constraints, canonical, tests, bench, invalid, expect, forbid=()):
    return Step(id_, "sm_90a", _LESSONS_SM90[id_], constraints, canonical, tests, bench,
                invalid, ("HGMMA", "WARPGROUP.ARRIVE") + expect, forbid,
                sm_count_kwarg="SM_COUNT" if id_ in _PERSISTENT else None)


_ONE_TILE = "M = N = 128, K = 64 (one tile)"
_ONE_ROW = "M = N = 128, K a multiple of 64"
_TILED = "M, N multiples of 128, K a multiple of 64 (aligned: thread copies have no edge code)"
# v4 on (TMA): any M; N and K only need TMA's 16-byte row stride
_EDGE = "any M >= 1; N, K multiples of 8 (TMA: 16-byte row strides)"
_V1_BAD = ((256, 128, 64), (128, 128, 128), (128, 128, 32))
_V2_BAD = ((256, 128, 256), (128, 128, 96))
_TILED_BAD = ((200, 128, 64), (128, 130, 64), (128, 128, 100))
_EDGE_BAD = ((128, 130, 64), (128, 128, 100), (1, 12, 64))
# shapes off every tile grid: one row, a 4095-row batch, 1000^3, N and K only multiples of 8
_EDGE_TESTS = ((1000, 1000, 1000), (1, 264, 72), (4095, 4096, 4104))
# sm_90a v8/v9: 2-CTA clusters of 128x256 tiles (cluster tile 256x256; 132 SMs make 66
# clusters). Test shapes are mostly non-square: fewer cluster tiles than clusters (256x512,
# 512x256 with deep K), 78 cluster tiles (1536x3328: some clusters take two, the canonical
# and bench shapes take ~4 and ~16), K steps not a multiple of the ring depth, a single K step.
_CLUSTER_TILED = _EDGE + "; SM_COUNT even"
_CLUSTER_TESTS = ((256, 512, 320), (1024, 2048, 512), (768, 1280, 704), (1536, 3328, 1088),
                  (2048, 768, 64), (512, 256, 4096)) + _EDGE_TESTS
_CLUSTER_BAD = ((128, 132, 64), (256, 256, 100), (0, 256, 64))

STEPS: list[Step] = [
    _sm100("v1", _ONE_TILE, (128, 128, 64), (), (), _V1_BAD, _THREAD_COPIES, ("UTMALDG",)),
    _sm100("v2", _ONE_ROW, (128, 128, 1024), ((128, 128, 64), (128, 128, 512), (128, 128, 4032)), (), _V2_BAD,
           _THREAD_COPIES, ("UTMALDG",)),
    _sm100("v3", _TILED, (4096, 4096, 4096), _GRID_TESTS, _BENCH, _TILED_BAD,
           _THREAD_COPIES, ("UTMALDG",)),
    _sm100("v4", _EDGE, (4096, 4096, 4096), _GRID_TESTS + _EDGE_TESTS, _BENCH, _EDGE_BAD, _TMA,
           ("LDG.E.128",)),
    _sm100("v5", _EDGE, (4096, 4096, 4096), _GRID_TESTS + _EDGE_TESTS, _BENCH, _EDGE_BAD, _TMA,
           ("LDG.E.128",)),
    _sm100("v6", _EDGE, (4096, 4096, 4096), ((256, 384, 576), (1024, 2048, 512), (768, 1280, 960)) + _EDGE_TESTS,
           _BENCH, _EDGE_BAD, _TMA, ("LDG.E.128",)),
    _sm100("v7", _EDGE, (4096, 4096, 4096), ((256, 384, 192), (1024, 2048, 512), (768, 1280, 960)) + _EDGE_TESTS, _BENCH,
           _EDGE_BAD, _TMA + ("USETMAXREG",), ("LDG.E.128",)),
    _sm100("v8", _EDGE + "; SM_COUNT even", (4096, 4096, 4096),
           ((512, 768, 192), (1024, 2048, 512), (768, 1280, 960)) + _EDGE_TESTS, _BENCH,
           _CLUSTER_BAD, _TMA + ("USETMAXREG",) + _PAIR, ("LDG.E.128",)),
    _sm100("v9", _EDGE + "; SM_COUNT even",
           (4096, 4096, 4096), ((512, 768, 192), (1024, 2048, 512), (1536, 1280, 960)) + _EDGE_TESTS, _BENCH,
           _CLUSTER_BAD, _TMA + ("USETMAXREG",) + _PAIR, ("LDG.E.128",)),
    # v10: UGETNEXTWORKID is clusterlaunchcontrol.try_cancel (multicast: .BROADCAST)
    _sm100("v10", _EDGE + "; SM_COUNT even", (4096, 4096, 4096),
           ((512, 768, 192), (1024, 2048, 512), (768, 1280, 960)) + _EDGE_TESTS, _BENCH,
           _CLUSTER_BAD, _TMA + ("USETMAXREG",) + _PAIR + ("UGETNEXTWORKID.BROADCAST",),
           ("LDG.E.128",)),

    _sm90("v1", _ONE_TILE, (128, 128, 64), (), (), _V1_BAD, _THREAD_COPIES, ("UTMALDG",)),
    _sm90("v2", _ONE_ROW, (128, 128, 1024), ((128, 128, 64), (128, 128, 512), (128, 128, 4032)), (), _V2_BAD,
          _THREAD_COPIES, ("UTMALDG",)),
    _sm90("v3", _TILED, (4096, 4096, 4096), _GRID_TESTS, _BENCH, _TILED_BAD,
          _THREAD_COPIES, ("UTMALDG",)),
    _sm90("v4", _EDGE, (4096, 4096, 4096), _GRID_TESTS + _EDGE_TESTS, _BENCH, _EDGE_BAD,
          _TMA + ("SYNCS.PHASECHK",), ("LDG.E.128",)),
    _sm90("v5", _EDGE, (4096, 4096, 4096), _GRID_TESTS + _EDGE_TESTS, _BENCH, _EDGE_BAD, _TMA,
          ("LDG.E.128",)),
    _sm90("v6", _EDGE, (4096, 4096, 4096), ((256, 384, 576), (1024, 2048, 512), (768, 1280, 960)) + _EDGE_TESTS, _BENCH,
          _EDGE_BAD, _TMA, ("LDG.E.128",)),
    _sm90("v7", _EDGE,
          (4096, 4096, 4096), ((256, 512, 320), (1024, 2048, 512), (512, 1280, 704)) + _EDGE_TESTS, _BENCH,
          _EDGE_BAD, _TMA + ("USETMAXREG", "HGMMA.64x256x16"), ("LDG.E.128",)),
    _sm90("v8", _CLUSTER_TILED, (4096, 4096, 4096), _CLUSTER_TESTS, _BENCH, _CLUSTER_BAD,
          _TMA + ("USETMAXREG", "HGMMA.64x256x16"), ("LDG.E.128",)),
    _sm90("v9", _CLUSTER_TILED, (4096, 4096, 4096), _CLUSTER_TESTS, _BENCH, _CLUSTER_BAD,
          _TMA + ("USETMAXREG", "HGMMA.64x256x16", "STSM"), ("LDG.E.128",)),
    # v10 (ping-pong): v9's shapes, timed also where v9 has few tiles per CTA (2048^3,
    # 1024x4096x4096) and at 4096x14336x4096; BAR.ARV is the turn handed over
    _sm90("v10", _CLUSTER_TILED, (4096, 4096, 4096), _CLUSTER_TESTS,
          _BENCH + ((2048, 2048, 2048), (1024, 4096, 4096), (4096, 14336, 4096)), _CLUSTER_BAD,
          _TMA + ("USETMAXREG", "HGMMA.64x128x16", "STSM", "BAR.ARV"), ("LDG.E.128",)),

    # v11 (split-K): few tiles, deep K. Canonical: 256x256x16384 (4 tiles of 128x128 on
    # sm_100a, 2 of 128x256 on sm_90a: splitk.choose_split picks 11 and 9 splits); the
    # others include a single tile with K=65536, the small-K shapes where the heuristic
    # keeps SPLIT_K=1, and 4096^3 (enough tiles: SPLIT_K=1). No LDG.E.128 promise either
    # way: the reductions read the fp32 slabs with 128-bit loads (a split build) or not at all.
    replace(_sm100("v11", _EDGE + "; 1 <= SPLIT_K <= ceil(K/64)", (256, 256, 16384),
                   ((128, 128, 65536), (1024, 1024, 8192), (256, 512, 192)) + _EDGE_TESTS,
                   ((256, 256, 16384), (128, 128, 65536), (1024, 1024, 8192)) + _BENCH[:1],
                   _EDGE_BAD, _TMA_LOADS + ("USETMAXREG",)),
            sm_count_kwarg="SM_COUNT", workspace="tirx_gemm.splitk:workspace_specs"),
    replace(_sm90("v11", _EDGE + "; 1 <= SPLIT_K <= ceil(K/64)", (256, 256, 16384),
                  ((128, 128, 65536), (1024, 1024, 8192), (256, 512, 192)) + _EDGE_TESTS,
                  ((256, 256, 16384), (128, 128, 65536), (1024, 1024, 8192)) + _BENCH[:1],
                  _EDGE_BAD, _TMA_LOADS + ("USETMAXREG", "HGMMA.64x256x16")),
            sm_count_kwarg="SM_COUNT", workspace="tirx_gemm.splitk:workspace_specs_sm90a"),
    # v12 (sm_100a, tile menu): v7 with BLK_N 16..256 (step 16), RUNTIME_M; registry
    # builds use the default 128x128 (no tail: every column by TMA store). Shapes: v12
    # sm_90a's (decode, odd token counts, the edges)
    replace(_sm100("v12", _EDGE + "; BLK_N a multiple of 16 in [16, 256]", (1024, 1024, 1024),
                   ((16, 14336, 4096), (77, 7168, 2048), (333, 4096, 1024), (640, 640, 640))
                   + _EDGE_TESTS, ((1024, 1024, 1024), (2304, 2304, 2304)) + _BENCH[:1],
                   _EDGE_BAD, _TMA, ("LDG.E.128",)),
            workspace="tirx_gemm.streamk:workspace_specs_sm100a"),  # STREAM_K's WS, CNT
    # v12 (sm_90a, tile menu): 1x1 CTAs, BLK_M x BLK_N a tunable (64|128 x 8..256 step
    # 8), RUNTIME_M; registry builds use the default 128x128. Tests: decode and odd token
    # counts beside the edge shapes; promises the stmatrix + TMA-store epilogue of the
    # default tile (no setmaxnreg at 128x128: only tiles wider than 128 columns split)
    Step("v12", "sm_90a", "tile menu: BLK_M 64|128 x BLK_N 8..256 (step 8) in one builder, 1x1 CTAs with their own TMA loads and a ring as deep as fits, narrow tails stored from registers, RUNTIME_M (one kernel for every M); wave efficiency and bytes per flop pick the tile",
         _EDGE + "; BLK_M 64 or 128; BLK_N a multiple of 8 in [8, 256] (16 for CLUSTER=2 "
         "and SWIGLU)", (1024, 1024, 1024),
         ((16, 14336, 4096), (77, 7168, 2048), (333, 4096, 1024), (640, 640, 640))
         + _EDGE_TESTS, ((1024, 1024, 1024), (2304, 2304, 2304)) + _BENCH[:1], _EDGE_BAD,
         ("HGMMA", "WARPGROUP.ARRIVE") + _TMA + ("HGMMA.64x128x16", "STSM"),
         ("LDG.E.128",), sm_count_kwarg="SM_COUNT",
         workspace="tirx_gemm.splitk:workspace_specs_v12"),  # SPLIT_K's or STREAM_K's
    # v13 (sm_90a, fp8): e4m3 A and B (uint8 operands), fp16 or bf16 D (float16 unless
    # asked, like every builder), fp32 scales after D (SCALE tensor | row | block,
    # PROMOTE); the fp8 wgmma is QGMMA in SASS (HGMMA is the 16-bit one). The run side
    # quantizes its 2-byte inputs (runner.Fp8Operands). Registry builds use the defaults: 128x128,
    # per-tensor scales, no promotion. Tests: edges (one row, N and K off the tile grid,
    # K a multiple of 16 only) and a decode shape; K=24 is valid for v12, not here
    Step("v13", "sm_90a", "fp8 (e4m3): m64nNk32 wgmmas on v12's skeleton, per-tensor / per-row scales in the epilogue, 1x128 x 128x128 block scales in the mainloop, partial sums promoted from the tensor core's limited-precision accumulator into fp32 every PROMOTE wgmmas",
         "any M >= 1; N a multiple of 8, K a multiple of 16 (TMA: 16-byte rows of 2-byte D "
         "and 1-byte A, B); SCALE tensor|row|block; PROMOTE 0 or a multiple of 4 (block: 4)",
         (1024, 1024, 1024),
         ((1, 264, 80), (77, 7168, 2048), (1000, 1000, 1008), (300, 136, 400)),
         ((4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096)),
         ((128, 130, 64), (128, 128, 100), (128, 128, 24), (0, 256, 64)),
         ("QGMMA", "WARPGROUP.ARRIVE") + _TMA + ("QGMMA.64x128x32.F32.E4M3.E4M3", "STSM"),
         ("LDG.E.128", "HGMMA"), sm_count_kwarg="SM_COUNT",
         fp8=True),
    # v13 (sm_100a, fp8): v9's 2-CTA, two-consumer skeleton with e4m3 operands (uint8),
    # tcgen05.mma kind::f8f6f4 (UTCQMMA in SASS; UTCHMMA is the 16-bit kind), SCALE tensor
    # | row in the epilogue; no block scaling (the card says why). Sim cases: per-tensor
    # scales at a full cluster tile with more K stages than the ring (5 over 3); per-row
    # scales with M, N off the tile grid and a partial last K stage (K = 400 = 3 x 128 +
    # 16), two cluster tiles for one pair, 8 stages over a ring of 3 (phases wrap across
    # tiles); bf16 output, per-row, one K stage (fewer than the ring's 4). SCALE="mx"
    # (block-scaled MXFP8 on v8's CTA pair, one accumulator): M, N off the 256 x 256 tile
    # (CTA 1's rows and the second B row block wholly past the edge on the last tiles: zero
    # SF atoms), a partial last K stage and SF block (K = 400), 4 tiles over 2 pairs, 4
    # stages over a ring of 2; one pair walking 2 tiles, 4 stages over a ring of 3 (phases,
    # SF slots and the accumulator's phase wrap)
    Step("v13", "sm_100a", "fp8 (e4m3): tcgen05.mma kind::f8f6f4 on v9's skeleton, 128 e4m3 of K per 128-byte swizzle row, fp32 accumulation in TMEM (no promotion on Blackwell), per-tensor / per-row scales in the epilogue",
         "any M >= 1; N a multiple of 8, K a multiple of 16 (TMA: 16-byte rows of 2-byte D "
         "and 1-byte A, B); SCALE tensor|row|mx; SM_COUNT even",
         (4096, 4096, 4096),
         ((1024, 2048, 512), (1, 264, 80), (1000, 1000, 1008), (300, 136, 400)), _BENCH,
         ((128, 130, 64), (128, 128, 100), (128, 128, 24), (0, 256, 64)),
         ("UTCQMMA", "UTCBAR", "LDTM", "SYNCS.PHASECHK") + _TMA + ("USETMAXREG",)
         + ("UTCQMMA.2CTA",) + _PAIR[1:],
         ("LDG.E.128", "UTCHMMA"), sm_count_kwarg="SM_COUNT",
         sim_cases=(((512, 256, 640), (("SM_COUNT", 2), ("PIPE_DEPTH", 3))),
                    ((300, 264, 400), (("SM_COUNT", 2), ("PIPE_DEPTH", 3),
                                       ("SCALE", "row"))),
                    ((512, 256, 128), (("SM_COUNT", 2), ("SCALE", "row"),
                                       ("dtype", "bfloat16"))),
                    ((300, 264, 400), (("SM_COUNT", 4), ("PIPE_DEPTH", 2),
                                       ("SCALE", "mx"), ("dtype", "bfloat16"))),
                    ((512, 256, 512), (("SM_COUNT", 2), ("PIPE_DEPTH", 3),
                                       ("SCALE", "mx")))),
         fp8=True),
    # v14 (sm_90a, grouped GEMM): B (E, N, K), the routing tensor (E,) after D; every store
    # bounded by its expert's row end (no TMA store). Shapes: M rows (run time), N, K per expert
    Step("v14", "sm_90a", "grouped GEMM (mixture of experts): E experts' GEMMs in one persistent launch, the walk over (expert, token tile, weight tile) computed on the device from offs / counts (no host sync, CUDA-graph replayable), zero-row experts cost nothing, stores bounded per expert; contiguous and masked layouts, swap-AB for decode",
         "N, K multiples of 8; 1 <= E <= 256; LAYOUT contiguous|masked; BLK_M 64|128; BLK_N "
         "a multiple of 8 in [8, 256]; STORE_STEPS, SWIGLU, TMA_STORE on plain (not swap-AB) "
         "tiles; SWIGLU: N, BLK_N multiples of 16; CLUSTER 1|2 (CTA pairs, the weight tile "
         "multicast) on plain tiles, BLK_N a multiple of 16; TAIL_SPLIT=S on plain tiles, "
         "BLK_N a multiple of 64, K >= 256 S", (1024, 1024, 1024),
         ((16, 14336, 4096), (512, 768, 2048), (1000, 1000, 1000)), ((4096, 14336, 4096),),
         _EDGE_BAD, ("HGMMA", "WARPGROUP.ARRIVE", "UTMALDG", "SYNCS.ARRIVE",
                     "HGMMA.64x128x16", "BAR.SYNC", "UTMALDG.3D"), ("UTMASTG", "STSM"),
         sm_count_kwarg="SM_COUNT", grouped=True,
         workspace="tirx_gemm.splitk:workspace_specs_v14"),  # TAIL_SPLIT's WS, CNT
    # v14 (sm_100a): the tcgen05 twin. Sim cases (routing: hopper.grouped.routing_rows, an empty
    # expert each): contiguous, more units than CTAs, a partial K step; masked; swap-AB with N
    # off the 128-row weight tile; bf16, one CTA walking every unit (phases wrap). SCALE="mx"
    # (MXFP8): contiguous, token tiles starting off the 128-row SF atoms (the gathered SFA),
    # 4 K stages (the last 32 of K) through a 2-stage ring, 2 weight tiles; masked in bf16
    # with N off the weight tile (SFB's padded atom), 3 K stages. The fused epilogue: ROW_SCALE
    # + BIAS in bf16, N off the weight tile (bias reads clamped); masked SWIGLU="halves", the
    # last gate box reaching past N/2 and its up box past N (zero-filled)
    Step("v14", "sm_100a", "grouped GEMM (mixture of experts): the tcgen05 twin of sm_90a's v14, the walk over (expert, token tile, weight tile) computed on the device from offs / counts, every accumulator row stored only below its expert's row end; contiguous and masked layouts, swap-AB for decode; SCALE=\"mx\": MXFP8 operands, block-scaled MMA with UE8M0 scale factors in TMEM",
         "N, K multiples of 8; 1 <= E <= 256; LAYOUT contiguous|masked; BLK_N a multiple of "
         "16 in [16, 256]; K a multiple of 32, BLK_N 128, plain tiles when SCALE='mx'; "
         "ROW_SCALE, BIAS, SWIGLU on plain 16-bit tiles; N a multiple of 16 when SWIGLU",
         (1024, 1024, 1024),
         ((16, 14336, 4096), (512, 768, 2048), (1000, 1000, 1000)), ((4096, 14336, 4096),),
         _EDGE_BAD, ("UTCHMMA", "UTCBAR", "LDTM", "SYNCS.PHASECHK", "UTMALDG.3D", "BAR.SYNC"),
         ("UTMASTG",), sm_count_kwarg="SM_COUNT", grouped=True,
         sim_cases=(((300, 64, 160), (("E", 4), ("SM_COUNT", 2), ("PIPE_DEPTH", 2),
                                      ("BLK_N", 32))),
                    ((96, 48, 128), (("E", 3), ("LAYOUT", "masked"), ("SM_COUNT", 2),
                                     ("BLK_N", 32))),
                    ((40, 136, 64), (("E", 3), ("SWAP_AB", True), ("BLK_N", 16),
                                     ("SM_COUNT", 2))),
                    ((200, 32, 128), (("E", 5), ("SM_COUNT", 1), ("PIPE_DEPTH", 3),
                                      ("BLK_N", 32), ("dtype", "bfloat16"))),
                    ((300, 256, 416), (("E", 4), ("SCALE", "mx"), ("SM_COUNT", 2),
                                       ("PIPE_DEPTH", 2))),
                    ((160, 136, 320), (("E", 3), ("LAYOUT", "masked"), ("SCALE", "mx"),
                                       ("SM_COUNT", 2), ("dtype", "bfloat16"))),
                    ((200, 48, 128), (("E", 3), ("SM_COUNT", 2), ("BLK_N", 32),
                                      ("ROW_SCALE", True), ("BIAS", True),
                                      ("dtype", "bfloat16"))),
                    ((96, 80, 128), (("E", 3), ("LAYOUT", "masked"), ("SM_COUNT", 2),
                                     ("BLK_N", 32), ("SWIGLU", "halves"))))),
    # v15 (sm_90a, operand layouts): v9 with A_MAJOR / B_MAJOR "K" | "MN" (an MN-major
    # operand is the transposed tensor, (K, M) or (K, N)); registry builds use K-major both
    # (v9's kernel), the layout tests (tests/test_layout_step.py) build the other three
    Step("v15", "sm_90a", "operand layouts: A and B K-major or MN-major (stored transposed) on v9's kernel; TMA loads an MN-major tile in boxes of 64 MN elements x 64 K rows, the wgmma descriptor's LBO / SBO describe that swizzled tile and the wgmma transpose bits say which operand lies which way: NN, NT, TN, TT without a copy",
         _CLUSTER_TILED + "; M a multiple of 8 when A_MAJOR='MN'; any K when both are MN-major",
         (4096, 4096, 4096),
         _CLUSTER_TESTS, _BENCH, _CLUSTER_BAD,
         ("HGMMA", "WARPGROUP.ARRIVE") + _TMA + ("USETMAXREG", "HGMMA.64x256x16", "STSM"),
         ("LDG.E.128",), sm_count_kwarg="SM_COUNT"),
    # v15 (sm_100a, operand layouts): v7's one-CTA warp-specialized kernel with A_MAJOR /
    # B_MAJOR; the MMA's descriptors come from TIRx's tcgen05 lowering (transA / transB).
    # Sim cases: each layout once: TT with 4 tiles on 2 CTAs and 3 K steps; NT (B MN-major)
    # with M, N off the tile grid, a partial last K step and a 3-stage ring (4 K steps); TN (A
    # MN-major) with 6 tiles on 2 CTAs (phases wrap across tiles); TT with K = 100 (not a
    # multiple of 8: K is every operand's outer dimension, the last box zero-filled); NN
    # (v7's kernel); TT in bf16; the training epilogues (K-major both, M and N off the tile
    # grid, 4 tiles on 2 CTAs): ACT_GRAD gelu with a bias, ACT_SAVE silu with a bias in bf16
    Step("v15", "sm_100a", "operand layouts: A and B K-major or MN-major (stored transposed) on v7's kernel; TMA loads an MN-major tile as it lies, in boxes of 64 MN elements, and the tcgen05 shared-memory and instruction descriptors (LBO / SBO, the a_major / b_major bits) say which way each operand lies: NN, NT, TN, TT without a copy",
         "any M >= 1; N a multiple of 8 (TMA: 16-byte row strides); K a multiple of 8 when "
         "an operand is K-major (any K when both are MN-major); M a multiple of 8 when "
         "A_MAJOR='MN'",
         (4096, 4096, 4096),
         ((256, 384, 192), (1024, 2048, 512), (768, 1280, 960)) + _EDGE_TESTS, _BENCH,
         ((128, 130, 64), (1, 12, 64)),  # K = 100 is a shape this step takes (both MN-major)
         ("UTCHMMA", "UTCBAR", "LDTM", "SYNCS.PHASECHK") + _TMA + ("USETMAXREG",),
         ("LDG.E.128",), sm_count_kwarg="SM_COUNT",
         sim_cases=(((256, 256, 192), (("SM_COUNT", 2), ("A_MAJOR", "MN"), ("B_MAJOR", "MN"))),
                    ((200, 136, 200), (("SM_COUNT", 2), ("B_MAJOR", "MN"), ("PIPE_DEPTH", 3))),
                    ((384, 256, 128), (("SM_COUNT", 2), ("A_MAJOR", "MN"))),
                    ((128, 256, 100), (("SM_COUNT", 2), ("A_MAJOR", "MN"), ("B_MAJOR", "MN"))),
                    ((256, 256, 192), (("SM_COUNT", 2),)),
                    ((256, 256, 192), (("SM_COUNT", 2), ("A_MAJOR", "MN"), ("B_MAJOR", "MN"),
                                       ("dtype", "bfloat16"))),
                    ((200, 136, 128), (("SM_COUNT", 2), ("ACT_GRAD", "gelu"),
                                       ("BIAS", "float16"))),
                    ((200, 136, 128), (("SM_COUNT", 2), ("ACT_SAVE", "silu"),
                                       ("BIAS", "bfloat16"), ("dtype", "bfloat16"))))),
]


STEPS = [_static_facts(s) for s in STEPS]


def base_of(step: Step) -> Step | None:
    """The registered step ``step`` changes (its ``base``), same arch; None for the first."""
    return get(step.base, step.arch) if step.base else None


def gpu_shapes(step: Step) -> list[Shape]:
    """Every shape a GPU check of this step covers: canonical, tests and benchmarks."""
    out: list[Shape] = []
    for s in (step.canonical, *step.test_shapes, *step.bench_shapes):
        if s not in out:
            out.append(s)
    return out


def all_steps(arch: str | None = None) -> list[Step]:
    return [s for s in STEPS if arch is None or s.arch == arch]


def step_ids() -> list[str]:
    seen: list[str] = []
    for s in STEPS:
        if s.id not in seen:
            seen.append(s.id)
    return seen


def get(step_id: str, arch: str = "sm_100a") -> Step:
    step_id = step_id.lower()
    if not step_id.startswith("v"):
        step_id = "v" + step_id
    if arch not in ARCHES:
        raise ValueError(f"unknown arch {arch!r}: choose one of {', '.join(ARCHES)}")
    for s in STEPS:
        if s.id == step_id and s.arch == arch:
            return s
    have = ", ".join(s.id for s in STEPS if s.arch == arch) or "none yet"
    raise ValueError(f"no step {step_id!r} for {arch} (steps for {arch}: {have})")
