"""v12's builders (the sm_90a and sm_100a tile menus) on the CPU: what each keyword compiles
to, and its one-line refusals."""
import json
import math
import re
from pathlib import Path

import pytest

from tirx_gemm import registry

ROOT = Path(__file__).parents[1]


def test_swap_ab_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    # a swap-AB tile takes BIAS (with or without ACT) in registers, no other epilogue
    for epi in ({"ACT": "relu"}, {"BIAS": "bfloat16", "OUT_DTYPE": "float32"},
                {"BIAS": "bfloat16", "BIAS_SMEM": True}, {"BIAS": "bfloat16", "SWAP_TMA": True},
                {"SWIGLU": True}):
        with pytest.raises(ValueError, match="SWAP_AB=True takes no fused epilogue but BIAS") as e:
            step.build_primfunc(8, 256, 512, BLK_M=64, BLK_N=16, SWAP_AB=True, **epi)
        assert "\n" not in str(e.value), epi
    step.build_primfunc(8, 256, 512, BLK_M=64, BLK_N=16, SWAP_AB=True, BIAS="float16", ACT="relu")
    with pytest.raises(ValueError, match="BLK_N=12 must be a multiple of 8"):
        step.build_primfunc(8, 256, 512, BLK_M=64, BLK_N=12, SWAP_AB=True)
    with pytest.raises(ValueError, match="BLK_N=20 must be a multiple of 8"):
        step.build_primfunc(8, 256, 512, BLK_M=64, BLK_N=20)


def test_one_cta_tiles_take_any_multiple_of_8_columns():
    """BLK_N of an odd multiple of 8 (2304 = 14 x 164.6: 168-column tiles): one
    m64n168k16 wgmma per consumer and k16, and the columns past the 64-column TMA chunks
    by guarded stores."""
    pytest.importorskip("tvm")
    import re
    text = registry.get("v12", "sm_90a").build_primfunc(
        256, 2304, 512, BLK_M=128, BLK_N=168).script()
    assert set(re.findall(r"m64n\d+k16", text)) == {"m64n168k16"}
    assert "tirx_gemm_st_global_b32" in text


def test_swap_ab_tiles_walk_n_with_the_mma_rows():
    pytest.importorskip("tvm")
    text = registry.get("v12", "sm_90a").build_primfunc(
        5, 1000, 512, BLK_M=64, BLK_N=8, SWAP_AB=True).script()
    # the producer loads B's rows into the MMA's A tile and A's rows into its B tile
    loads = [ln.strip() for ln in text.splitlines() if "copy_async(Asmem" in ln
             or "copy_async(Bsmem" in ln]
    assert any("copy_async(Asmem" in ln and ", B[" in ln for ln in loads), loads
    assert any("copy_async(Bsmem" in ln and ", A[" in ln for ln in loads), loads


def test_cluster_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="CLUSTER=3 must be 1, 2 or 4"):
        step.build_primfunc(256, 256, 512, BLK_M=64, BLK_N=64, CLUSTER=3)
    with pytest.raises(ValueError, match="CLUSTER=2 needs BLK_N a multiple of 16"):
        step.build_primfunc(8, 256, 512, BLK_M=64, BLK_N=8, SWAP_AB=True, CLUSTER=2)
    with pytest.raises(ValueError, match="CLUSTER=2 needs BLK_N a multiple of 16"):
        step.build_primfunc(256, 2304, 512, BLK_M=128, BLK_N=168, CLUSTER=2)
    # swap-AB pairs share the token tile: each CTA loads its weight rows and half the
    # tokens, multicast into both (the kernel's B operand is A, its A operand B)
    s = step.build_primfunc(48, 4096, 512, BLK_M=64, BLK_N=48, SWAP_AB=True,
                            CLUSTER=2).script()
    loads = [ln for ln in s.splitlines() if "copy_async(" in ln]
    assert any("copy_async(Asmem" in ln and ", B[" in ln for ln in loads), loads
    assert any("cta_mask" in ln and ", A[" in ln for ln in loads), loads
    with pytest.raises(ValueError, match="CLUSTER=2 takes no fused epilogue"):
        step.build_primfunc(256, 256, 512, BLK_M=64, BLK_N=64, CLUSTER=2, ACT="relu")


def test_cluster_pairs_share_b_by_multicast():
    """CLUSTER=2: each CTA loads half of B's tile for both (a multicast mask), the empty
    barrier counts both CTAs' consumers, and the kernel ends on a cluster barrier."""
    pytest.importorskip("tvm")
    text = registry.get("v12", "sm_90a").build_primfunc(
        1000, 1000, 1000, BLK_M=64, BLK_N=128, CLUSTER=2).script()
    assert "cta_mask" in text and "cluster_sync" in text
    assert "mapa.shared::cluster" in text  # the remote release of a stage
    one = registry.get("v12", "sm_90a").build_primfunc(1000, 1000, 1000, BLK_M=64,
                                                       BLK_N=128).script()
    assert "cta_mask" not in one and "cluster_sync" not in one


@pytest.mark.parametrize("tokens,shares", [(64, (16, 16, 16, 16)), (72, (24, 24, 24, 0)),
                                           (88, (24, 24, 24, 16)), (56, (16, 16, 16, 8))])
def test_clusters_of_four_share_the_token_tile_in_whole_atoms(tokens, shares):
    """CLUSTER=4 (swap-AB along the weight): each CTA loads its own weight tile and a share
    of the token tile of whole 8-row swizzle atoms, multicast to all four (mask 0b1111);
    the last nonempty share is what is left, a CTA past it loads its own tile only; the
    empty barrier counts the four CTAs' consumers and every consumer releases a stage in
    all four."""
    pytest.importorskip("tvm")
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    func = hgemm_v12(tokens, 4608, 4096, BLK_M=64, BLK_N=tokens, SWAP_AB=True, CLUSTER=4,
                     SM_COUNT=132, RUNTIME_M=True, PDL=True)
    text = func.script()
    shared = [ln for ln in text.splitlines() if "copy_async(" in ln and ", A[" in ln]
    assert all("cta_mask=15" in ln for ln in shared) and shared
    share = shares[0]
    sizes = sorted({int(m) for ln in shared
                    for m in re.findall(rf"rank \* {share}:rank \* {share} \+ (\d+)", ln)})
    assert sizes == sorted({x for x in shares if x}), (sizes, shares)
    assert sum(shares) == tokens and all(x % 8 == 0 for x in shares)
    own = [ln for ln in text.splitlines() if "copy_async(" in ln and ", B[" in ln]
    # one own-tile load per branch: one for even shares, one per kind of share otherwise
    assert len(own) == (1 if len(set(shares)) == 1 else 3), own
    assert "cta_id_in_cluster([4, 1])" in text and "cluster_sync" in text
    assert "warp_id * 32 + lane_id < 4" in text  # a release in each of the four CTAs
    from tirx_gemm import pdl
    assert list(func.attrs["tirx.kernel_launch_params"]) == list(pdl.PAIR_LAUNCH_PARAMS)


def test_cluster_of_four_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    for kw, msg in (({"SM_COUNT": 130}, "SM_COUNT=130 is not a multiple of the cluster size 4"),
                    ({"ACT": "relu"}, "CLUSTER=4 takes no fused epilogue"),
                    ({"STREAM_K": True}, "STREAM_K=True takes no CLUSTER > 1")):
        with pytest.raises(ValueError, match=msg) as e:
            step.build_primfunc(72, 4608, 4096, BLK_M=64, BLK_N=72, CLUSTER=4, **kw)
        assert "\n" not in str(e.value)


# --- sm_100a v12: the menu on v7's kernel (NumSim checks its cases: `tirx-gemm sim v12`) ---
def test_sm100a_menu_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_100a")
    for bad in (8, 0, 100, 272, True):
        with pytest.raises(ValueError, match=f"BLK_N={bad!r} must be a multiple of 16"):
            step.build_primfunc(128, 256, 128, BLK_N=bad)
    with pytest.raises(ValueError, match="PIPE_DEPTH=5 needs"):
        step.build_primfunc(128, 256, 128, BLK_N=256, PIPE_DEPTH=5)


def test_sm100a_default_ring_is_as_deep_as_fits():
    pytest.importorskip("tvm")
    from steps.sm100a.hgemm_v12 import default_pipe_depth
    from tirx_gemm import helpers as H
    for blk_n, depth in ((16, 11), (128, 6), (176, 5), (256, 4)):
        assert default_pipe_depth(blk_n) == depth
        H.check_pipe_depth(depth, (128 + blk_n) * 128, 128 * 128)  # it fits, one more not
        with pytest.raises(ValueError):
            H.check_pipe_depth(depth + 1, (128 + blk_n) * 128, 128 * 128)


@pytest.mark.parametrize("blk_n,chunks,tails", [(256, 4, 0), (80, 1, 1), (176, 2, 3),
                                                (48, 0, 3)])
def test_sm100a_epilogue_chunks_by_tma_and_tail_16_columns_a_load(blk_n, chunks, tails):
    pytest.importorskip("tvm")
    text = registry.get("v12", "sm_100a").build_primfunc(
        300, 1000, 128, BLK_N=blk_n, RUNTIME_M=blk_n == 48).script()
    lines = [ln.strip() for ln in text.splitlines()]
    # 64-column chunks: tcgen05.ld of 64 columns, then a TMA store of the staged chunk;
    # the tail: 16 columns per tcgen05.ld (no 48-wide load), stored row by row, guarded
    # (a loop of 0 trips is in the script and compiles to nothing)
    assert f"for i in T.unroll({chunks}):" in lines
    assert any(ln.startswith("T.tile.copy_async(D[") for ln in lines)
    assert f"for t in T.unroll({tails}):" in lines
    assert 'Dtail = T.alloc_local((16,), "float16")' in lines
    assert any(ln.startswith("T.tile.copy(D[") for ln in lines)


def test_sm100a_swap_ab_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_100a")
    with pytest.raises(ValueError, match="SWAP_AB='yes' must be True or False"):
        step.build_primfunc(8, 256, 128, BLK_N=16, SWAP_AB="yes")
    # tcgen05.mma at M = 128 has no 8-column N: the token tile starts at 16
    with pytest.raises(ValueError, match="BLK_N=8 must be a multiple of 16"):
        step.build_primfunc(8, 256, 128, BLK_N=8, SWAP_AB=True)


@pytest.mark.parametrize("blk_n,reads", [(16, 1), (48, 3), (64, 1), (96, 3), (256, 4)])
def test_sm100a_swap_ab_loads_swapped_and_stores_transposed(blk_n, reads):
    """SWAP_AB: B's rows go to the MMA's A tile and A's rows to its B tile; the epilogue
    reads BLK_N columns 16, 32 or 64 at a time and stores D[token, n] element by element,
    guarded (no staging tile, no TMA store)."""
    pytest.importorskip("tvm")
    text = registry.get("v12", "sm_100a").build_primfunc(
        5, 1000, 128, BLK_N=blk_n, SWAP_AB=True, RUNTIME_M=blk_n == 48).script()
    lines = [ln.strip() for ln in text.splitlines()]
    assert any(ln.startswith("T.tile.copy_async(Asmem") and ", B[" in ln for ln in lines)
    assert any(ln.startswith("T.tile.copy_async(Bsmem") and ", A[" in ln for ln in lines)
    assert f"for c in T.unroll({reads}):" in lines
    assert not any(ln.startswith("T.tile.copy_async(D[") for ln in lines)
    assert "Dsmem" not in text


def test_sm100a_stream_k_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_100a")
    with pytest.raises(ValueError, match="STREAM_K=1 must be True or False"):
        step.build_primfunc(128, 256, 1024, BLK_N=32, STREAM_K=1)
    with pytest.raises(ValueError, match="STREAM_K=True takes no SWAP_AB"):
        step.build_primfunc(8, 256, 1024, BLK_N=16, SWAP_AB=True, STREAM_K=True)


def test_sm100a_stream_k_where_the_plan_is_on_and_off():
    """STREAM_K: the workspace operands (registry.Step.workspace, streamk's specs) follow
    D either way; the pieces' count and reduction appear only where the plan is on: a tail
    wave under half full (11 tiles on 8 CTAs), or RUNTIME_M (decided on the device); at half
    (12 on 8) the body is v12's walk."""
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_100a")
    for mnk, kw, on in (((128, 352, 1256), {}, True), ((128, 384, 1256), {}, False),
                        ((300, 136, 1032), {"RUNTIME_M": True}, True)):
        kw = dict(kw, SM_COUNT=8, BLK_N=32, STREAM_K=True)
        func = step.build_primfunc(*mnk, **kw)
        specs = step.workspace_specs(*mnk, kw)
        assert [(n, tuple(shape), dt) for n, shape, dt in specs] == [
            ("WS", (12, 128 * 32), "float32"), ("CNT", (8,), "int32")]
        assert [p.name for p in func.params][-2:] == ["WS", "CNT"]
        text = func.script()
        assert ("T.ptx.atom(old, T.address_of(CNT[" in text) == on, (mnk, kw)
        plain = step.build_primfunc(*mnk, **dict(kw, STREAM_K=False)).script()
        assert "T.ptx.atom" not in plain and "WS" not in plain


def test_v12_pdl_launch_and_wait():
    """PDL=True (tirx_gemm/pdl.py): the launch attribute TVM's CUDA runtime reads, and every
    thread's griddepcontrol.wait before the scheduler touches anything global, then
    launch_dependents; PDL=False adds neither; a non-bool PDL is refused in one line."""
    pytest.importorskip("tvm")
    from tirx_gemm import pdl
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    on = hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, RUNTIME_M=True, PDL=True)
    off = hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, RUNTIME_M=True)
    assert pdl.PDL_TAG in list(on.attrs["tirx.kernel_launch_params"])
    assert "tirx.kernel_launch_params" not in off.attrs
    lines = on.script().splitlines()
    wait = next(i for i, x in enumerate(lines) if 'griddepcontrol("wait"' in x)
    launch = next(i for i, x in enumerate(lines) if 'griddepcontrol("launch_dependents"' in x)
    first_tma = next(i for i, x in enumerate(lines) if "copy_async(" in x and "A[" in x)
    assert wait < launch < first_tma
    assert "griddepcontrol" not in off.script()
    with pytest.raises(ValueError, match="True or False") as e:
        hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, PDL=1)
    assert "\n" not in str(e.value)
    # PDL_TRIGGER="exit" (a lab option): the same wait, no launch_dependents (the next grid
    # launches as this one's CTAs exit); refused without PDL and for any other value
    at_exit = hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, RUNTIME_M=True, PDL=True,
                        PDL_TRIGGER="exit").script()
    assert 'griddepcontrol("wait"' in at_exit and "launch_dependents" not in at_exit
    for bad in ({"PDL_TRIGGER": "exit"}, {"PDL": True, "PDL_TRIGGER": "end"}):
        with pytest.raises(ValueError, match="PDL_TRIGGER") as e:
            hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, **bad)
        assert "\n" not in str(e.value)


def test_pdl_with_a_cluster_only_where_the_builder_opts_in():
    """pdl.check refuses PDL with a cluster in one line unless the builder says its pairs
    wait after their cluster set-up (v12 does, for CLUSTER=2 only); v12's pair with PDL
    carries the pair's launch params (TVM keeps the clusterCtaIdx tags beside PDL's)."""
    pytest.importorskip("tvm")
    from tirx_gemm import pdl
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    for kw in ({}, {"pairs": False}):
        with pytest.raises(ValueError, match="CLUSTER=2") as e:
            pdl.check(True, 2, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="CLUSTER=4"):
        pdl.check(True, 4)
    with pytest.raises(ValueError, match="CLUSTER=8"):
        pdl.check(True, 8, pairs=True)
    pdl.check(True, 2, pairs=True)
    pdl.check(True, 4, pairs=True)
    pdl.check(False, 2)
    pair = hgemm_v12(128, 256, 256, BLK_M=64, BLK_N=128, CLUSTER=2, SM_COUNT=132, PDL=True)
    assert list(pair.attrs["tirx.kernel_launch_params"]) == list(pdl.PAIR_LAUNCH_PARAMS)
    lines = pair.script().splitlines()
    sync = next(i for i, x in enumerate(lines) if "cluster_sync" in x)
    wait = next(i for i, x in enumerate(lines) if 'griddepcontrol("wait"' in x)
    first_tma = next(i for i, x in enumerate(lines) if "copy_async(" in x and "A[" in x)
    assert sync < wait < first_tma
    assert "tirx.kernel_launch_params" not in hgemm_v12(
        128, 256, 256, BLK_M=64, BLK_N=128, CLUSTER=2, SM_COUNT=132).attrs


def test_v12_pair_with_pdl_builds_with_cluster_and_pdl_launch_tags():
    """The launch tags the exported library stores, which TVM 0.27's CUDA runtime reads: a
    pair with PDL lists clusterCtaIdx.x/.y (cluster dimension at launch) AND the PDL tag
    (its cuLaunchKernelEx sets both attributes); a pair without PDL only the cluster tags;
    a one-CTA PDL kernel only the PDL tag. No compile-time __cluster_dims__ in any: the
    cluster comes from the launch. Compiled on the CPU (the build cache)."""
    from tirx_gemm import pdl
    from tirx_gemm.compile.api import build_many
    v12 = registry.get("v12", "sm_90a")
    common = {"dtype": "bfloat16", "RUNTIME_M": True, "RUNTIME_NK": True, "SM_COUNT": 132}
    pair = {**common, "BLK_M": 64, "BLK_N": 128, "CLUSTER": 2}
    reqs = [(v12, (1000, 1000, 1000), {**pair, "PDL": True}),
            (v12, (1000, 1000, 1000), pair),
            (v12, (1000, 1000, 1000), {**common, "BLK_M": 64, "BLK_N": 64, "PDL": True})]
    built = build_many(reqs)
    for res in built:
        assert not isinstance(res, Exception), res
    cluster_tags = (b"clusterCtaIdx.x", b"clusterCtaIdx.y")
    pdl_tag = pdl.PDL_TAG.encode()
    expect = [(True, True), (True, False), (False, True)]  # (cluster tags, PDL tag)
    for res, (cluster, with_pdl) in zip(built, expect):
        lib = res.lib_path.read_bytes()
        assert all((t in lib) == cluster for t in cluster_tags), res.kwargs
        assert (pdl_tag in lib) == with_pdl, res.kwargs
        assert "__cluster_dims__" not in res.cuda_source
        assert ("griddepcontrol.wait" in res.cuda_source) == with_pdl
    src = built[0].cuda_source  # the pair waits after publishing its barrier inits
    body = src[src.index("_kernel(", src.index("__global__")):]  # the kernel named by its step
    assert body.index("cluster_sync();") < body.index("griddepcontrol_wait();")


def test_v12_prefetch_maps_adds_the_descriptor_prefetch():
    """PREFETCH_MAPS=True: TVM's prefetch.tensormap of A's and B's descriptors at entry."""
    pytest.importorskip("tvm")
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    kw = dict(BLK_M=64, BLK_N=128, RUNTIME_M=True)
    for flag in (True, False):
        text = hgemm_v12(128, 256, 256, PREFETCH_MAPS=flag, **kw).script()
        loads = [ln for ln in text.splitlines() if "copy_async(Asmem" in ln
                 or "copy_async(Bsmem" in ln]
        assert len(loads) == 2
        assert all(("prefetch_tensormap=True" in ln) == flag for ln in loads), loads
    for bad, why in (({"PREFETCH_MAPS": "yes"}, "PREFETCH_MAPS='yes' must be True or False"),
                     ({"PREFETCH_MAPS": True, "CLUSTER": 2, "SM_COUNT": 132}, "PREFETCH_MAPS")):
        with pytest.raises(ValueError, match=why) as e:
            hgemm_v12(256, 352, 512, BLK_M=128, BLK_N=176, **bad)
        assert "\n" not in str(e.value)


def test_swap_tma_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="SWAP_TMA=True stores a swap-AB tile"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=144, SWAP_TMA=True)
    with pytest.raises(ValueError, match="SWAP_TMA=True stores a swap-AB tile"):
        step.build_primfunc(8, 256, 4096, BLK_M=64, BLK_N=8, SWAP_AB=True, SWAP_TMA=True,
                            SPLIT_K=2)
    with pytest.raises(ValueError, match="SWAP_TMA=1 must be True or False"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=144, SWAP_AB=True, SWAP_TMA=1)


@pytest.mark.parametrize("blk_n", [144, 48, 128])
def test_swap_tma_stores_the_transpose_by_stmatrix_trans_and_tma(blk_n):
    """SWAP_TMA: the packed fragment goes to SMEM by stmatrix .trans and out by one TMA
    store per 64 tokens and one for the rest, D's rows (the tokens) at the tile's columns
    (its 64 weight rows); without it, no stmatrix and no TMA store of D."""
    pytest.importorskip("tvm")
    import re

    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    kw = dict(BLK_M=128, BLK_N=blk_n, SWAP_AB=True, RUNTIME_M=True, RUNTIME_NK=True)
    text = hgemm_v12(256, 768, 512, SWAP_TMA=True, **kw).script()
    plain = hgemm_v12(256, 768, 512, **kw).script()
    st = [ln for ln in text.splitlines() if "T.ptx.stmatrix(" in ln]
    assert st and all('"x4", "trans"' in ln for ln in st)
    boxes = re.findall(r"copy_async\(D\[prev_n[^:]*:prev_n [^,]*?\+ (\d+), "
                       r"prev_m \+ wg_id \* 64:prev_m \+ wg_id \* 64 \+ 64\]", text)
    # 64-token boxes (a loop over the full chunks, empty below 64) and the rest's one box
    assert set(map(int, boxes)) == {64} | ({blk_n % 64} if blk_n % 64 else set()), boxes
    assert "T.ptx.stmatrix(" not in plain and "copy_async(D[" not in plain
    step = registry.get("v12", "sm_90a")
    with pytest.raises(ValueError, match="BLK_N a multiple of 16"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=136, SWAP_AB=True, SWAP_TMA=True)


def test_tail_tma_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    for kw in (dict(BLK_N=128), dict(BLK_N=144, SWAP_AB=True), dict(BLK_N=144, STREAM_K=True),
               dict(BLK_N=144, OUT_DTYPE="float32"),
               dict(BLK_N=144, BIAS="float32"), dict(BLK_N=144, CLUSTER=2)):
        with pytest.raises(ValueError, match="TAIL_TMA=True stores a plain tile's last"):
            step.build_primfunc(200, 768, 512, BLK_M=128, TAIL_TMA=True, **kw)
    with pytest.raises(ValueError, match="TAIL_TMA=1 must be True or False"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=144, TAIL_TMA=1)


@pytest.mark.parametrize("bm,bn", [(128, 168), (64, 96), (128, 240), (64, 224)])
def test_tail_tma_stores_the_tail_by_one_box_of_its_width(bm, bn):
    """TAIL_TMA: the last bn % 64 columns go by stmatrix (an x4 per 16 columns, an x2 for
    an odd 8) into a staging tile of their width and out in one TMA box of that width
    beside the 64-column chunks' boxes; without it, no box narrower than 64 (guarded
    element stores). The ring is as deep as cm.ring_depth says, with and without:
    where a tail tile of its own would cost a stage (128x168, 64x224) the tail tile lies
    over each warpgroup's staging tile of the last chunk instead."""
    pytest.importorskip("tvm")
    import re

    from tirx_gemm.op import cost_model as cm, rules
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    kw = dict(BLK_M=bm, BLK_N=bn, RUNTIME_M=True, RUNTIME_NK=True)
    texts = {tt: hgemm_v12(256, 768, 512, TAIL_TMA=tt, **kw).script() for tt in (False, True)}
    tail = bn % 64
    for tt, text in texts.items():
        widths = {int(w) for w in re.findall(r"copy_async\(D\[prev_m[^,]*, prev_n \+ \d+:prev_n "
                                             r"\+ \d+ \+ (\d+)\]", text)}
        assert widths == ({tail} if tt else set()), (tt, widths)
        depth = re.search(r"\((\d+), %d, 64\)" % bm, text).group(1)
        assert int(depth) == cm.ring_depth(bm, bn, tt)
    x2 = [ln for ln in texts[True].splitlines() if "T.ptx.stmatrix(" in ln and '"x2"' in ln]
    assert bool(x2) == bool(tail // 8 % 2)
    # the staging buffers: the chunks' (consumers, bufs, 64, 64), one (64, tail) per consumer
    decls = re.findall(r"decl_buffer\(\(([\d, ]+)\), \"float16\", data=pool_buf.data, "
                       r"(?:strides=[^,]*, )?elem_offset=(\d+)", texts[True])
    stage = [(tuple(map(int, d.split(","))), int(o)) for d, o in decls if d.endswith("64, 64")]
    tails = sorted(int(o) for d, o in decls if d.replace(" ", "") == f"64,{tail}")
    (consumers, bufs, _, _), at = stage[-1]
    assert consumers == bm // 64 and len(tails) == consumers
    over = [at + (c * bufs + (bn // 64 - 1) % bufs) * 4096 for c in range(consumers)]
    shared = cm.staging_bytes(bm, bn, True) == cm.staging_bytes(bm, bn)
    assert (tails == over) == shared, (tails, over)
    # the tail's wait: a shared tile waits for every store before it (the last chunk's), a
    # tile of its own only for the previous tail's (the chunks' stores since may pend)
    waits = {tt: {int(n) for n in re.findall(r'T\.ptx\.cp\((\d+), "async", "bulk", '
                                            r'"wait_group", "read"', text)}
             for tt, text in texts.items()}
    since = 0 if shared else bn // 64
    assert since in waits[True] and waits[True] - waits[False] <= {since}, waits
    assert shared == ((bm, bn) in ((128, 168), (64, 224)))


def test_shift_last_refusals_in_one_line():
    pytest.importorskip("tvm")
    step = registry.get("v12", "sm_90a")
    for kw in (dict(CLUSTER=2), dict(STREAM_K=True), dict(SPLIT_K=2),
               dict(BIAS="float32"), dict(OUT_DTYPE="float32")):
        with pytest.raises(ValueError, match="SHIFT_LAST=True moves a data-parallel one-CTA"):
            step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=128, SHIFT_LAST=True, **kw)
    with pytest.raises(ValueError, match="SHIFT_LAST=1 must be True or False"):
        step.build_primfunc(200, 768, 512, BLK_M=128, BLK_N=128, SHIFT_LAST=1)


@pytest.mark.parametrize("kw,width", [(dict(BLK_M=64, BLK_N=96, TAIL_TMA=True), 64),
                                      (dict(BLK_M=128, BLK_N=144), 128),
                                      (dict(BLK_M=64, BLK_N=80, SWAP_AB=True, SWAP_TMA=True), 80),
                                      (dict(BLK_M=64, BLK_N=16, SWAP_AB=True), 16)])
def test_shift_last_ends_the_last_token_tile_at_m(kw, width):
    """SHIFT_LAST: the token tile (A's rows: the MMA's rows, or with SWAP_AB its columns)
    starts at min(tile * width, max(M - width, 0)), in the producer's TMA loads and in
    the consumer's stores alike, so a last tile that would reach past M is loaded from
    rows that exist (TMA zero-fills rows past M slowly: lab/shift_last_token_tile/records/v12_m129_h200.jsonl)
    and stored where it was loaded from; the weight's tiles do not move."""
    pytest.importorskip("tvm")
    import re

    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    texts = {s: hgemm_v12(256, 768, 512, RUNTIME_M=True, RUNTIME_NK=True, SHIFT_LAST=s,
                          **kw).script() for s in (False, True)}
    shift = r"T\.min\((\w+) \* (\d+), T\.max\(M - (\d+), 0\)\)"
    loads = re.findall(r"A\[" + shift, texts[True])
    assert loads and {(int(a), int(b)) for _, a, b in loads} == {(width, width)}, loads
    assert not re.search(r"B\[T\.min\(", texts[True])  # the weight's rows stay
    # the consumer stores the tile where the producer loaded it from
    side = "prev_n" if kw.get("SWAP_AB") else "prev_m"
    if kw.get("SWAP_TMA") or not kw.get("SWAP_AB"):
        assert re.search(side + r" = " + shift, texts[True]), side
    else:  # element stores straight from the fragment: D's row is the shifted token
        assert re.search(r"D\[" + shift + r" \+", texts[True])
    assert "T.max(M - " not in texts[False]


def test_shift_last_with_m_fixed_at_build_folds_the_start():
    """With M fixed at build (no RUNTIME_M) the shifted start folds to a constant bound:
    200 rows in 64-row tiles start the last at 136, in the loads and the stores."""
    pytest.importorskip("tvm")
    from tirx_gemm.steps.sm90a.hgemm_v12 import hgemm_v12
    text = hgemm_v12(200, 768, 512, BLK_M=64, BLK_N=96, SHIFT_LAST=True).script()
    assert "A[T.min(buffer_1 * 64, 136):" in text and "prev_m = T.min(buffer_1 * 64, 136)" in text
    assert "T.min(buffer_1 * 64, 136)" not in hgemm_v12(200, 768, 512, BLK_M=64,
                                                       BLK_N=96).script()



def _menu_widths() -> dict[int, dict]:
    """Every BLK_N matmul can build on sm_90a, with the keywords of one build of it: the
    cost model's tile menu (one CTA and pairs) and the swap-AB token tiles (SWAP_AB, 64
    weight rows); BLK_M 128 where the menu has the width only there."""
    from tirx_gemm.op import cost_model as cm, rules
    widths: dict[int, dict] = {}
    for cand in cm.params():
        if cand in (cm.V9, cm.V10):
            continue
        bm, bn, _ = cm.tile(cand)
        if bn not in widths or bm < widths[bn]["BLK_M"]:
            widths[bn] = {"BLK_M": bm, "BLK_N": bn}
    for tokens in rules.SWAP_AB_TILES + rules.SWAP_SPLIT_TILES:
        widths.setdefault(tokens, {"BLK_M": 64, "BLK_N": tokens, "SWAP_AB": True})
    return dict(sorted(widths.items()))


MENU_WIDTHS = _menu_widths()


@pytest.fixture(scope="module")
def menu_sass():
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build_many
    step = registry.get("v12", "sm_90a")
    reqs = [(step, (128, 256, 256), {**kw, "SM_COUNT": 132, "RUNTIME_M": True,
                                     "RUNTIME_NK": True}) for kw in MENU_WIDTHS.values()]
    return dict(zip(MENU_WIDTHS, build_many(reqs)))


def test_menu_widths_cover_the_narrow_instruction_widths():
    """The widths tile-ai/tilelang#2928 saw split into narrower wgmmas are in the menu."""
    assert {96, 112, 176} <= set(MENU_WIDTHS)
    assert all(w % 8 == 0 and 8 <= w <= 256 for w in MENU_WIDTHS)


def _wgmma_split(sass_counts: dict, width: int) -> str | None:
    """Why a build of BLK_N = ``width`` does not issue one 64 x width x 16 wgmma per k16
    step (HGMMA of other widths: a split; fewer than a stage's four k16 steps), or None."""
    hgmma = {op: n for op, n in sass_counts.items() if op.startswith("HGMMA.")}
    shapes = {op.split(".")[1] for op in hgmma}
    if shapes != {f"64x{width}x16"}:
        return f"BLK_N={width}: HGMMA {sorted(shapes)} in SASS, not 64x{width}x16 alone"
    if sum(hgmma.values()) < 64 // 16:
        return f"BLK_N={width}: {sum(hgmma.values())} HGMMA, fewer than a stage's k16 steps"
    return None


def test_the_wgmma_split_check_fails_on_a_planted_split():
    """The check below names a width compiled as two narrower wgmmas (96 = 64 + 32)."""
    split = {"HGMMA.64x64x16.F32": 8, "HGMMA.64x32x16.F32": 8, "STSM.16.M88.4": 4}
    assert "64x32x16" in _wgmma_split(split, 96)
    assert _wgmma_split({"HGMMA.64x96x16.F32": 8}, 96) is None


@pytest.mark.parametrize("width", list(MENU_WIDTHS))
def test_every_menu_width_issues_one_wgmma_per_k16_step(menu_sass, width):
    """The SASS of each built width holds HGMMA of that width only (64 x BLK_N x 16), at
    least one per k16 step of a BLK_K = 64 stage: a width compiled as narrower wgmmas
    (the narrow-instruction trap) fails here."""
    res = menu_sass[width]
    if isinstance(res, Exception):
        raise res
    assert _wgmma_split(res.sass_counts, width) is None
