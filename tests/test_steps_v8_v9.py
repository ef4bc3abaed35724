"""sm_100a v8 (2-CTA MMA) and v9 (two MMA consumers): contracts a CPU can check.

The simulation itself (NumSim, synccheck, racecheck) runs through tests/test_sim.py and
`tirx-gemm sim v8 v9`; here: argument validation, the 2-CTA instructions in the compiled
SASS, and that the registry's simulation cases exercise the cluster protocol where it can
break. (The lessons' barrier tables are checked against the kernels for every step in
tests/test_facts.py.)
"""

from __future__ import annotations

import inspect

import pytest

from tirx_gemm import registry

PAIR_STEPS = [registry.get("v8", "sm_100a"), registry.get("v9", "sm_100a")]
# the cluster tile (M, N) each step walks: v8 256x256, v9 512x256 (two consumers)
CLUSTER_TILE = {"v8": (256, 256), "v9": (512, 256)}
ids = [s.key for s in PAIR_STEPS]


def _default(step, name):
    return inspect.signature(step.builder()).parameters[name].default


@pytest.mark.parametrize("step", PAIR_STEPS, ids=ids)
@pytest.mark.parametrize("sm_count", [3, 147, 0])
def test_sm_count_must_make_pairs(step, sm_count):
    with pytest.raises(ValueError, match="SM_COUNT"):
        step.build_primfunc(*step.canonical, SM_COUNT=sm_count)


@pytest.mark.parametrize("step", PAIR_STEPS, ids=ids)
def test_cluster_steps_take_edges_but_not_tma_illegal_rows(step):
    # a partial cluster tile (M, N off the grid) builds: TMA zero-fills and clips it
    tm, tn = CLUSTER_TILE[step.id]
    assert step.build_primfunc(tm + 128, tn + 8, 72) is not None
    with pytest.raises(ValueError, match=rf"N={tn + 4} is not a multiple of 8: TMA"):
        step.build_primfunc(tm, tn + 4, 64)
    with pytest.raises(ValueError, match="K=100 is not a multiple of 8: TMA"):
        step.build_primfunc(tm, tn, 100)


def test_v9_ring_depth_bounded_by_shared_memory():
    # 48 KiB per stage (two A slices + one B slice) + 32 KiB Dsmem: 4 stages fit, 5 do not.
    # 4 is the default, so that 4 fit is proven by tests/test_build.py, which compiles v9 at
    # its default and checks the shared memory ptxas reports against the 227 KiB limit
    v9 = PAIR_STEPS[1]
    assert _default(v9, "PIPE_DEPTH") == 4
    with pytest.raises(ValueError, match="PIPE_DEPTH=5 needs"):
        v9.build_primfunc(512, 256, 64, PIPE_DEPTH=5)


def test_the_pair_steps_compile_to_2cta_instructions_that_v7_lacks():
    """The lesson in the SASS (read from the builds, not from the registry's own list): v8
    and v9 issue the cta_group::2 forms of the MMA, its commit and TMA loads, and the cluster
    barrier; v7, which they extend, has none of them. The builds come from the session's
    cache (tests/test_build.py's batch)."""
    from tirx_gemm.compile.api import build_many
    v7 = registry.get("v7", "sm_100a")
    built = build_many([(s, s.canonical, {}) for s in [v7, *PAIR_STEPS]])
    pair_forms = ("UTCHMMA.2CTA", "UTCBAR.2CTA", "UTMALDG.2D.2CTA", "UCGABAR_ARV")
    for res in built:
        assert not isinstance(res, Exception), res
    for res in built[1:]:
        for op in pair_forms:
            assert any(k.startswith(op) for k in res.sass_counts), f"{res.step}: no {op}"
    assert not [k for k in built[0].sass_counts if ".2CTA" in k or k.startswith("UCGABAR")]


@pytest.mark.parametrize("step", PAIR_STEPS, ids=ids)
def test_sim_cases_exercise_the_cluster_protocol(step):
    tm, tn = CLUSTER_TILE[step.id]
    several, idle_pair, fewer_k, more_k, uneven_k, non_square = (False,) * 6
    for (M, N, K), kwargs in step.sim_cases:
        kw = dict(kwargs)
        clusters = kw["SM_COUNT"] // 2
        tiles = (M // tm) * (N // tn)
        depth = kw.get("PIPE_DEPTH", _default(step, "PIPE_DEPTH"))
        k_tiles = K // 64
        several |= tiles >= 2 * clusters  # each pair walks several cluster tiles
        idle_pair |= tiles < clusters  # a pair with no tile must still set up and tear down
        fewer_k |= k_tiles < depth
        more_k |= k_tiles > depth
        uneven_k |= k_tiles > depth and k_tiles % depth != 0
        non_square |= M // tm != N // tn
    assert several and idle_pair and fewer_k and more_k and uneven_k and non_square
