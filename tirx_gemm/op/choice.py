"""matmul's choice of step and builder keywords per shape and GPU (pure Python: no torch, no TVM).

:func:`choose` (the rule: its docstring), :func:`variants` (what a layer's (N, K) needs over
all M: what ``tirx-gemm export --suite`` bundles), :func:`step_kwargs` and the shape a kernel
is built at (:func:`build_shape`). tirx_gemm.matmul, which loads and launches the kernels,
imports them from here; ``tirx_gemm.matmul.choose`` and the other names stay reachable there.
"""

from __future__ import annotations

from tirx_gemm import epilogue as E
from tirx_gemm import registry, spec, splitk
from tirx_gemm.kernels import dtype_kwargs
from tirx_gemm.numerics import check_dtype

__all__ = ["choose", "choose_epilogue_on", "explain", "variants", "step_kwargs", "runtime_m",
           "build_shape", "pick"]

ROW_MULTIPLE = 8  # TMA: a row (K or N elements of 2 bytes) is a multiple of 16 bytes

# v9's output tile per cluster of two CTAs, (rows, columns), on each arch: sm_90a pairs
# two 128x256 CTA tiles vertically; sm_100a's CTA pair with two MMA consumers covers 512x256
V9_CLUSTER_TILE = {"sm_90a": (256, 256), "sm_100a": (512, 256)}
CLUSTER_SIZE = 2  # CTAs per v9 cluster: the pool (SM_COUNT) must be a multiple of it
DATA_PARALLEL = "v9"
SPLIT_K = "v11"
# steps whose kernels matmul builds with RUNTIME_M=True on each arch: M is bound from the
# operands at every call, so one kernel per (step, keywords, dtype, N, K) serves every M.
# sm_100a: v9 and v11, their runtime-M builds simulated on NumSim (the registry's sim cases
# with RUNTIME_M: v9's, and v11's with both reductions).
RUNTIME_M_STEPS = {"sm_90a": frozenset({"v9", "v10", "v11", "v12"}),
                   "sm_100a": frozenset({"v9", "v11"})}
NOMINAL_M = 128  # the M a runtime-M kernel is built, cached and exported at
# v12 can also take N and K at run time (RUNTIME_NK: one kernel per tile and dtype serves
# every shape, built at this N and K). step_kwargs asks for it; only swap-AB's SPLIT_K=1
# units and the fused-epilogue kernels keep it (_choose_by_model drops it elsewhere)
RUNTIME_NK_STEPS = {"sm_90a": frozenset({"v12"})}
# steps whose one-CTA kernels matmul builds with PREFETCH_MAPS=True (the descriptors of the
# operand loads prefetched at kernel entry; TVM 0.27 offers it on the one-CTA loads, not
# on v12's CTA pairs, which drop it). Measured on the H200 with and without it at
# matmul's short v12 kernels: results/lab/v12_prefetch_h200.jsonl, lesson v12's figures.
PREFETCH_MAPS_STEPS = {"sm_90a": frozenset({"v12"})}
NOMINAL_N, NOMINAL_K = 256, 256
TILE_MENU = "v12"
# arches whose v12 menu matmul chooses from: tirx_gemm.op.chooser is sm_90a's model (fitted to
# H200 measurements, BLK_M 64 and swap-AB tiles among its picks); sm_100a's v12 (BLK_M 128
# only, checked on NumSim, never timed) has no model yet, so matmul keeps v9 / v11 there
MENU_ARCHES = frozenset({"sm_90a"})
# v11's split counts, rounded down to this menu, so that the splits chosen over all M for
# one (N, K) are a handful of kernels (rounding down keeps the spread reduction's rule).
# No multiple of the build's L2_GROUP (v11's default 16; 7 for the narrow split, splitk.
# NARROW_SPLIT_KWARGS): with M at run time the scheduler's unit rows are SPLIT_K *
# ceil(M/128), TVM then proves the tail-group row count zero and folds the (unreachable)
# `% tail` of the tile order into a division by zero at compile time.
SPLIT_MENU = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)
V11_L2_GROUP = {"sm_90a": 16, "sm_100a": 8}  # v11's builder default per arch
# steps whose builders take the fused-epilogue keywords (tirx_gemm.epilogue), per arch
EPILOGUE_STEPS = {"sm_90a": frozenset({"v12", "v10"})}
PINGPONG = "v10"  # sm_90a's ping-pong step: BIAS and ACT only (chooser.V10_KEYWORDS)


# --------------------------------------------------------------------------------------
# choosing a step: pure Python, no torch, no TVM
# --------------------------------------------------------------------------------------
def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_problem(M, N, K, dtype, arch, sm_count) -> None:
    for name, v in (("M", M), ("N", N), ("K", K), ("sm_count", sm_count)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")
    for name, v in (("N", N), ("K", K)):
        if v % ROW_MULTIPLE:
            raise ValueError(f"{name}={v} is not a multiple of {ROW_MULTIPLE}: TMA needs "
                             f"16-byte row strides ({ROW_MULTIPLE} fp16/bf16 elements); pad "
                             f"{name} with zeros to a multiple of {ROW_MULTIPLE}")
    check_dtype(dtype)
    if arch not in V9_CLUSTER_TILE:
        raise ValueError(f"arch={arch!r}: matmul runs on {' or '.join(V9_CLUSTER_TILE)}")


def step_kwargs(step: registry.Step, dtype: str, sm_count: int | None) -> dict:
    """Builder keywords of ``step`` for operands of ``dtype`` on a GPU with ``sm_count`` SMs:
    the dtype (written only for bfloat16: float16 is every builder's default), the
    persistent CTA pool, rounded down to an even count (the cluster steps, v8 on, schedule
    CTA pairs; an even pool is valid for every persistent step), ``RUNTIME_M: True``
    for the steps of RUNTIME_M_STEPS (``RUNTIME_NK`` and ``PREFETCH_MAPS`` likewise)."""
    kw = dtype_kwargs(dtype)
    if sm_count and step.sm_count_kwarg:
        kw.update(step.with_sm_count(_pool(sm_count)))
    if runtime_m(step.id, step.arch):
        kw["RUNTIME_M"] = True
    if step.id in RUNTIME_NK_STEPS.get(step.arch, ()):
        kw["RUNTIME_NK"] = True
    if step.id in PREFETCH_MAPS_STEPS.get(step.arch, ()):
        kw["PREFETCH_MAPS"] = True
    return kw


def runtime_m(step_id: str, arch: str) -> bool:
    """Whether matmul builds ``step_id`` on ``arch`` with M taken at run time."""
    return step_id in RUNTIME_M_STEPS.get(arch, ())


def build_shape(mnk, kwargs: dict) -> tuple[int, int, int]:
    """The shape a kernel is built, cached and exported at: (NOMINAL_M, N, K) for a
    runtime-M build (it serves every M), (NOMINAL_M, NOMINAL_N, NOMINAL_K) for a
    run-time-shape build (RUNTIME_NK too: it serves every shape), else ``mnk``."""
    M, N, K = mnk
    if kwargs.get("RUNTIME_NK"):
        return (NOMINAL_M if kwargs.get("RUNTIME_M") else M, NOMINAL_N, NOMINAL_K)
    return (NOMINAL_M, N, K) if kwargs.get("RUNTIME_M") else (M, N, K)


def _menu_split(split: int, l2_group: int) -> int:
    return max(s for s in SPLIT_MENU if s <= split and (s == 1 or s % l2_group))


def _pool(sm_count: int) -> int:
    return max(CLUSTER_SIZE, sm_count - sm_count % CLUSTER_SIZE)


def choose(M: int, N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
           sm_count: int = spec.SM_COUNT["sm_90a"], epilogue: dict | None = None, *,
           why: list | None = None) -> tuple[str, dict]:
    """The step and builder keywords that :func:`matmul` uses for an MxNxK GEMM of ``dtype``
    on a GPU of ``arch`` with ``sm_count`` SMs: ``(step_id, kwargs)``.

    The rule, derived from the H200 records of the suite run as v9 alone and as matmul
    (``results/suites/nvidia-h200.jsonl``) and of v11's variants
    (``results/lab/h200.jsonl``; the split and reduction rule is ``splitk.choose_variant``):

    * count v9's output tiles per cluster (``V9_CLUSTER_TILE``: 256x256 on sm_90a, 512x256 on
      sm_100a; edge tiles count whole) against the clusters of the GPU (``sm_count // 2``).
      When every cluster gets at least one tile, the GEMM is **data-parallel: v9**, the
      last data-parallel step (on sm_90a the fastest in the README's H200 results at 4096^3
      and 8192^3; sm_100a is unmeasured), its persistent pool sized to the GPU
      (``SM_COUNT``, rounded down to an even count), its L2 tile order the builder's
      default;
    * with fewer tiles than clusters, idle SMs can only be put to work by splitting K:
      **v11 with ``splitk.choose_variant(M, N, K, SM_COUNT, arch)``** (no split below 32 K
      steps, where v9 measured as fast; else the spread reduction with as many splits as
      fit the GPU once, at least 8 K steps and at most 64 splits each) when v11 is
      registered for ``arch`` and that rule splits, SPLIT_K written out so that a bundle
      names it;
    * otherwise v9 as above, which takes every shape with N and K multiples of 8.

    bfloat16 adds ``{"dtype": "bfloat16"}``; float16 is the builders' default and is not
    written. Raises ValueError for a shape no step takes (N or K not a multiple of 8), an
    unknown dtype or arch.

    ``epilogue``: builder keywords of a fused epilogue (tirx_gemm.epilogue: BIAS, ACT,
    OUT_DTYPE, SWIGLU; N is the output's columns). Only v12 builds one, so such a call gets
    v12's fastest tile for the kernel's GEMM (SwiGLU: M x 2N x K), never v9 or v11, with the
    epilogue keywords added (only those that differ from the plain kernel).

    ``why``: a list that gets one line per rule that decided, in the order they were asked
    (what :func:`explain` returns); the choice is the same with or without it.
    """
    _check_problem(M, N, K, dtype, arch, sm_count)
    epi = E.epilogue_kwargs(epilogue) if epilogue else {}
    if epi:
        return _choose_epilogue(M, N, K, dtype, arch, sm_count, epi, why)
    menu = _registered(TILE_MENU, arch) if arch in MENU_ARCHES else None
    if menu is not None:
        return _choose_by_model(M, N, K, dtype, arch, sm_count, menu, why)
    tile_m, tile_n = V9_CLUSTER_TILE[arch]
    tiles = _ceil_div(M, tile_m) * _ceil_div(N, tile_n)
    clusters = max(1, sm_count // CLUSTER_SIZE)
    split_step = _registered(SPLIT_K, arch)
    _say(why, lambda: f"{arch} has no cost model yet: v9's {tile_m}x{tile_n} cluster tiles "
                      f"give {_count(tiles, 'tile')} for {_count(clusters, 'cluster')} of "
                      f"{CLUSTER_SIZE} CTAs")
    if tiles < clusters and split_step is not None:
        variant = splitk.choose_variant(M, N, K, _pool(sm_count), arch)
        if runtime_m(SPLIT_K, arch) and variant["SPLIT_K"] > 1:
            variant["SPLIT_K"] = _menu_split(variant["SPLIT_K"],
                                              variant.get("L2_GROUP", V11_L2_GROUP[arch]))
        if variant["SPLIT_K"] > 1:
            _say(why, lambda: f"fewer tiles than clusters: v11 splits K in "
                              f"{variant['SPLIT_K']} (splitk.choose_variant) to put the idle "
                              "SMs to work")
            return SPLIT_K, {**step_kwargs(split_step, dtype, sm_count), **variant}
        _say(why, lambda: "fewer tiles than clusters, but K is too short to split "
                          "(splitk.choose_variant): v9")
    else:
        _say(why, lambda: "every cluster gets a tile: v9, data-parallel")
    return DATA_PARALLEL, step_kwargs(registry.get(DATA_PARALLEL, arch), dtype, sm_count)


def explain(M: int, N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
            sm_count: int | None = None, epilogue: dict | None = None) -> str:
    """What :func:`choose` picks for an MxNxK GEMM and why, as text: the step and its
    builder keywords on one line, then one line per rule that decided, in the order
    choose asks them, with the figures that decided (tiles, waves, the model's predicted
    microseconds). ``sm_count`` defaults to the arch's GPU (the H200's 132 SMs on sm_90a).
    Pure Python, like choose; ``tirx-gemm choose M,N,K`` prints it."""
    if sm_count is None:
        sm_count = spec.SM_COUNT.get(arch, 0)  # an unknown arch: choose says so in one line
    why: list[str] = []
    step, kw = choose(M, N, K, dtype, arch, sm_count, epilogue, why=why)
    keys = " ".join(f"{k}={v}" for k, v in kw.items() if k not in ("dtype", "SM_COUNT"))
    used = _pool(sm_count)
    sms = f"{sm_count} SMs" + ("" if used == sm_count else f", {used} used")
    head = f"{M}x{N}x{K} {dtype} on {arch} ({sms}): {step} {keys}".rstrip()
    return "\n".join([head] + [f"  - {w}" for w in why])


def _say(why: list | None, text) -> None:
    """Append ``text()`` to ``why`` when a caller asked for the reasons (the line is built
    only then: choose runs without them on every first call of a shape)."""
    if why is not None:
        why.append(text())


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _choose_by_model(M, N, K, dtype, arch, sm_count, menu, why: list | None):
    """sm_90a: tirx_gemm.op.chooser's cost model over v12's tile menu, v9 and v10, with v12's
    SPLIT_K where chooser.split_plan says (the split model beats the data-parallel one, or
    a decode rule), swap-AB for few tokens and v10's ping-pong by their rules, and
    swap-AB stored by TMA where the model prefers the swapped problem
    (chooser.dp_swap_tile); v10 is also a candidate of the model in its band
    (chooser.pingpong_band). Every v12 pick but swap-AB's SPLIT_K=1 units is built for the
    layer's N and K, and a one-CTA pick without PDL gets PDL with the exit trigger (the
    notes below)."""
    step, kw = _choose_by_model_kw(M, N, K, dtype, arch, sm_count, menu, why)
    if step == TILE_MENU and kw.get("SPLIT_K") != 1:
        kw.pop("RUNTIME_NK", None)  # built for the layer's N and K (above _tile_kwargs)
    if step == TILE_MENU and not kw.get("PDL") and kw.get("CLUSTER", 1) == 1:
        kw.update(PDL=True, PDL_TRIGGER="exit")  # PDL_EXIT_NOTE
    if step == TILE_MENU and kw.get("PDL"):
        _say(why, lambda: _pdl_reason(kw))
    return step, kw


def _pdl_reason(kw: dict) -> str:
    """One line on why a v12 kernel got programmatic dependent launch with its trigger."""
    from tirx_gemm.op import chooser
    if kw.get("PDL_TRIGGER") == "exit":
        return ("PDL with the exit trigger: the rules leave this kernel without the start "
                "trigger (a long kernel, or more CTAs than fit at once), so the next kernel "
                "launches as its CTAs exit (matmul_choice.py's PDL_EXIT_NOTE)")
    if kw.get("SPLIT_K", 1) > 1:
        return "PDL with the start trigger: K splits keep it (chooser.py's notes on PDL)"
    if kw.get("SPLIT_K") == 1:
        return ("PDL with the start trigger: the non-persistent kernel's CTAs fit one per SM "
                "(chooser.np_swap_pdl)")
    return (f"PDL with the start trigger: a short kernel (at most chooser.PDL_MAX_US = "
            f"{chooser.PDL_MAX_US:g} us by the model, or for swap-AB by its bytes at the HBM "
            "rate), whose prologue overlaps the kernel before")


# PDL_EXIT_NOTE: a one-CTA v12 kernel the rules above leave without PDL (longer than
# chooser.PDL_MAX_US, or a swap-AB unit grid larger than the SMs) takes PDL with
# PDL_TRIGGER="exit": its CTAs wait in griddepcontrol.wait as every PDL kernel's do, but
# never call launch_dependents, so the next kernel launches as this one's CTAs exit rather
# than once they all started. Through matmul on the H200 against e05d09a, every suite and
# off-suite (scripts/lab/issue32_xnk.json) shape whose kernel a variant changes
# (results/lab/matmul_graph_h200_pdl.jsonl, CUDA graphs interleaved with torch, two passes,
# both dtypes), call 1: the start trigger on the 39 cases of kernels built for N and K
# without PDL ran 0.811-1.031x the package before (128x10240x8192 64x160 0.81; the 64-wide
# tiles at 100-256 tokens all under 0.92), the exit trigger on the 65 cases without PDL
# 0.990-1.038x (geomean 1.011), and the exit trigger in place of the start one on the 57
# with PDL 0.874-1.085x (geomean 0.967: a short kernel's prologue no longer overlaps), so
# those keep the start trigger; call 2, this rule against the package before at its 65
# cases: geomean 1.007, behind at 14 (16x14336x4096 bf16 0.979, 256x5120x13824 0.98).
# K splits (SPLIT_K > 1) keep the start trigger. Measured at 42 shapes where matmul splits K
# (scripts/lab/issue32_splitfam.json, bf16, fp16 at 5 suite shapes of them; this package against
# a lab variant giving every split the exit trigger, one H200 call, two passes,
# results/lab/matmul_graph_h200_splitpdl.jsonl), the exit trigger ran: swap-AB splits 13
# cases 0.935-0.992x (geomean 0.970, behind at 13); the other splits predicted within
# chooser.PDL_MAX_US 20 cases 0.926-1.083x (geomean 0.974, behind at 15); the longer ones
# 14 cases 0.990-1.096x (geomean 1.033, behind at 4, the 128x128 tiles split in 4 among them).
# 128x128x65536 ran ahead and 128x256x32768 behind with the same 64x64 units of 32 K steps on
# 128 CTAs: no term of the model separates them, so no rule was adopted.


def _choose_by_model_kw(M, N, K, dtype, arch, sm_count, menu, why: list | None):
    from tirx_gemm.op import chooser
    pool = _pool(sm_count)
    swap = chooser.swap_ab_tile(M, N, pool)  # few tokens: v12 with swap-AB
    plan = chooser.split_plan(M, N, K, pool)  # v12's SPLIT_K: a CTA per unit
    if plan is not None:
        _say(why, lambda: _split_reason(M, N, K, pool, plan))
        return TILE_MENU, _split_kwargs(menu, plan, dtype, sm_count, M, N)
    if swap is not None:
        kw = {**step_kwargs(menu, dtype, sm_count), "BLK_M": swap[0], "BLK_N": swap[1],
              "SWAP_AB": True, "SHIFT_LAST": True}
        if chooser.swap_pdl(M, N, K):  # a short one: PDL, as for the model's short tiles
            kw["PDL"] = True
        rows = chooser.swap_cluster_rows(M, N, pool)
        if rows is not None:  # clusters along the weight share the token tile
            for k in ("SHIFT_LAST", "PREFETCH_MAPS"):  # (a cluster takes neither)
                kw.pop(k, None)
            kw.update(BLK_M=rows, CLUSTER=chooser.SWAP_CLUSTER)
            if not kw.get("PDL"):  # a long one (swap_pdl above): the exit trigger
                kw.update(PDL=True, PDL_TRIGGER="exit")  # PDL_EXIT_NOTE
        elif chooser.swap_stream_k(M, N, pool):  # a last wave under half full: stream-K
            kw["STREAM_K"] = True
            del kw["SHIFT_LAST"]  # (STREAM_K takes none)
        _say(why, lambda: _swap_reason(M, N, pool, swap, kw))
        return TILE_MENU, kw
    pingpong = _registered(PINGPONG, arch)
    if pingpong is not None and chooser.wants_pingpong(M, N, K, pool):
        _say(why, lambda: f"K={K} <= {chooser.PINGPONG_MAX_K} with at least one 128x128 "
                          "tile per SM and no kernel short enough for PDL: v10's ping-pong "
                          "hides each tile's epilogue under the other's mainloop "
                          "(chooser.wants_pingpong)")
        return PINGPONG, step_kwargs(pingpong, dtype, sm_count)
    dp_swap = chooser.dp_swap_tile(M, N, K, pool)  # the swapped problem fills a wave better
    if dp_swap is not None:
        kw = {**step_kwargs(menu, dtype, sm_count), "BLK_M": dp_swap[0], "BLK_N": dp_swap[1],
              "SWAP_AB": True, "SWAP_TMA": True, "SHIFT_LAST": True}
        if chooser.uses_pdl(chooser.name(*dp_swap), N, chooser.dp_swap_rows(M), K, pool):
            kw["PDL"] = True
        _say(why, lambda: _dp_swap_reason(M, N, K, pool, dp_swap))
        return TILE_MENU, kw
    pick = chooser.best(M, N, K, pool)
    _say(why, lambda: _model_reason(M, N, K, pool, pick))
    if pick == chooser.V9:
        return DATA_PARALLEL, step_kwargs(registry.get(DATA_PARALLEL, arch), dtype, sm_count)
    if pick == chooser.V10 and pingpong is not None:  # its default 128x128 tiles
        return PINGPONG, step_kwargs(pingpong, dtype, sm_count)
    return TILE_MENU, _tile_kwargs(menu, pick, dtype, sm_count, (M, N, K))


def _swap_reason(M, N, pool, swap, kw) -> str:
    """One line on the persistent swap-AB kernel as built (``kw``): its tiles, and the
    cluster or stream-K rule where one applies."""
    from tirx_gemm.op import chooser
    tiles = chooser.swap_tiles(M, N, pool)
    line = (f"{_count(M, 'token')} <= {chooser.SWAP_AB_TILES[-1]}: swap-AB, the weight's {N} "
            f"rows are the MMA's M in {kw['BLK_M']}-row tiles and the tokens its N in a tile "
            f"{kw['BLK_N']} wide (chooser.swap_ab_tile); ")
    if kw.get("CLUSTER"):
        clusters = chooser.swap_clusters(N, kw["BLK_M"])
        return line + (
            f"one CTA per {swap[0]}-row tile would make {_count(tiles, 'tile')}, the last "
            f"wave on {pool} SMs {chooser.last_wave_fill(tiles, pool):.0%} full (at most "
            f"{chooser.SWAP_CLUSTER_MAX_FILL:.0%}): clusters of {chooser.SWAP_CLUSTER} along "
            f"the weight share the token tile ({_count(clusters, 'cluster')}, at most the "
            f"{chooser.SWAP_CLUSTER_MAX_CLUSTERS} the H200 holds at once; "
            "chooser.swap_cluster_rows)")
    if kw.get("STREAM_K"):
        return line + (f"{_count(tiles, 'tile')} on {pool} SMs leave the last wave "
                       f"{tiles % pool} of {pool}, under half: stream-K over it "
                       "(chooser.swap_stream_k)")
    return line + f"one CTA per tile, persistent: {_count(tiles, 'tile')} on {pool} SMs"


def _dp_swap_reason(M, N, K, pool, dp_swap) -> str:
    from tirx_gemm.op import chooser
    rows, cand = chooser.dp_swap_rows(M), chooser.name(*dp_swap)
    t_plain, plain = chooser.rank(M, N, K, pool)[0]
    return (f"the swapped problem ({N}x{rows}x{K}) on {cand} tiles is predicted "
            f"{chooser.predict(cand, N, rows, K, pool):.1f} us against {t_plain:.1f} us for "
            f"the best unswapped candidate, {plain} (more than {chooser.DP_SWAP_MARGIN:.0%} "
            "faster): swap-AB stored by TMA (chooser.dp_swap_tile)")


def _split_reason(M, N, K, pool, plan) -> str:
    """One line on chooser.split_plan's plan ``(BLK_M, BLK_N, SWAP_AB, S, PIPE_DEPTH)``."""
    from tirx_gemm.op import chooser
    bm, bn, swap, split, _ = plan
    tiles = _ceil_div(N, bm) * _ceil_div(M, bn) if swap else _ceil_div(M, bm) * _ceil_div(N, bn)
    if split == 1:
        return (f"{_count(M, 'token')} <= {chooser.SWAP_NP_MAX_M}: the non-persistent swap-AB "
                f"kernel, one CTA per {bm}-row weight tile and {bn}-token tile "
                f"({_count(tiles, 'CTA')}; chooser.split_plan)")
    what = (f"swap-AB {bm}-row weight {'tile' if tiles == 1 else 'tiles'} by {bn} tokens"
            if swap else f"{bm}x{bn} {'tile' if tiles == 1 else 'tiles'}")
    t = chooser.predict_split(bm, bn, split, M, N, K)
    model = (f": predicted {t:.1f} us against {chooser.rank(M, N, K, pool)[0][0]:.1f} us "
             "data-parallel" if t is not None and not (swap and M <= chooser.SWAP_AB_TILES[-1])
             else "")
    return (f"K split in {split} (units of {_ceil_div(_ceil_div(K, chooser.BLK_K), split)} or "
            f"fewer K steps) over {tiles} {what}, {_count(tiles * split, 'CTA')} on {pool} "
            f"SMs{model} "
            "(chooser.split_plan)")


def _model_reason(M, N, K, pool, pick: str) -> str:
    """One line on chooser.best's pick: the model's three fastest, and the pair rule."""
    from tirx_gemm.op import chooser
    top = ", ".join(f"{c} {t:.1f}" for t, c in chooser.rank(M, N, K, pool)[:3])
    line = f"the cost model's fastest (us, chooser.rank): {top}"
    if pick == chooser.V9 or chooser.V9 in [c for _, c in chooser.rank(M, N, K, pool)[:3]]:
        line += f" (v9 counts {chooser.V9_HANDICAP:.0%} more against v12)"
    if pick not in (chooser.V9, chooser.V10) and chooser.tile(pick)[2] > 1:
        line += (f"; K={K}: rows of {K * 2} bytes are not whole {chooser.ROW_ALIGN_BYTES}-byte "
                 f"lines, so the tile runs as a CTA pair, {pick} (the misaligned-row rule)")
    if pick == chooser.V10:
        line += (f" (K in v10's band, {chooser.PINGPONG_MAX_K + 1}-"
                 f"{chooser.PINGPONG_BAND_MAX_K}, where v10 is a candidate and keeps its place "
                 f"within {chooser.PREFER_PAIR_WITHIN:.0%} of the fastest)")
    return line + f"; picked {pick}"


def _choose_epilogue(M, N, K, dtype, arch, sm_count, epi: dict, why: list | None):
    menu = _registered(TILE_MENU, arch)
    if TILE_MENU not in EPILOGUE_STEPS.get(arch, ()) or menu is None:
        raise ValueError(f"a fused epilogue ({E.tag(epi)}) runs on sm_90a only (v12's tile "
                         f"menu); on {arch} call matmul without bias/activation/out_dtype and "
                         f"apply them with torch")
    from tirx_gemm.op import chooser
    if chooser.epilogue_step(M, E.kernel_n(N, epi), K, epi, _pool(sm_count)) == PINGPONG:
        _say(why, lambda: f"a fused epilogue ({E.tag(epi)}) on v10's ping-pong "
                          "(chooser.epilogue_step)")
        return choose_epilogue_on(PINGPONG, M, N, K, dtype, arch, sm_count, epi)
    pick = chooser.best_tile(M, E.kernel_n(N, epi), K, _pool(sm_count),
                             chooser.EPILOGUE_TILE_STEP)
    _say(why, lambda: f"a fused epilogue ({E.tag(epi)}): only v12 builds it, on the model's "
                      f"fastest one-CTA tile whose width is a multiple of "
                      f"{chooser.EPILOGUE_TILE_STEP}, {pick} (chooser.best_tile)")
    return TILE_MENU, {**_tile_kwargs(menu, pick, dtype, sm_count), **epi}


def choose_epilogue_on(step_id: str, M: int, N: int, K: int, dtype: str, arch: str,
                       sm_count: int, epilogue: dict) -> tuple[str, dict]:
    """``(step_id, kwargs)`` of a fused epilogue forced onto ``step_id`` ("v12": its
    model-best tile, as :func:`choose` without the v10 rule; "v10": its default 128x128
    ping-pong tiles, BIAS / ACT only): what ``matmul(..., step=...)`` runs."""
    _check_problem(M, N, K, dtype, arch, sm_count)
    epi = E.epilogue_kwargs(epilogue or {})
    if arch not in EPILOGUE_STEPS or step_id not in EPILOGUE_STEPS[arch]:
        raise ValueError(f"step={step_id!r} has no fused epilogue on {arch}: use step='v12' "
                         f"(every epilogue) or step='v10' (bias and activation), on sm_90a")
    if step_id == TILE_MENU:
        from tirx_gemm.op import chooser
        menu = registry.get(TILE_MENU, arch)
        pick = chooser.best_tile(M, E.kernel_n(N, epi), K, _pool(sm_count),
                                 chooser.EPILOGUE_TILE_STEP)
        return TILE_MENU, {**_tile_kwargs(menu, pick, dtype, sm_count), **epi}
    from tirx_gemm.op import chooser
    extra = sorted(set(epi) - set(chooser.V10_KEYWORDS))
    if extra:
        raise ValueError(f"step='v10' takes bias and activation only, not {', '.join(extra)} "
                         f"({E.tag(epi)}): use step='v12'")
    return PINGPONG, {**step_kwargs(registry.get(PINGPONG, arch), dtype, sm_count), **epi}


def _split_kwargs(menu: registry.Step, plan: tuple, dtype: str, sm_count: int, M: int,
                  N: int) -> dict:
    """v12's keywords for chooser.split_plan's ``(BLK_M, BLK_N, SWAP_AB, S, PIPE_DEPTH)``:
    PDL (as measured; S = 1 only where its CTAs fit the SMs, chooser.np_swap_pdl); S > 1
    takes N and K fixed (its K split is built in) and an L2 group that does not divide S
    (splitk.l2_group_for); S = 1 keeps the run-time shape and its ring depth. S is the
    plan's own (tiles x S within the SMs at this M), not rounded to v11's SPLIT_MENU: it
    changes only over the few M blocks a split serves."""
    from tirx_gemm.op import chooser
    bm, bn, swap, split, depth = plan
    kw = {**step_kwargs(menu, dtype, sm_count), "BLK_M": bm, "BLK_N": bn, "PDL": True}
    if split == 1 and swap and not chooser.np_swap_pdl(M, N, bn, _pool(sm_count)):
        del kw["PDL"]
    if swap:
        kw["SWAP_AB"] = True
    if split > 1:
        kw.update(SPLIT_K=split, L2_GROUP=splitk.l2_group_for(split))
    else:
        kw.update(SPLIT_K=1, SHIFT_LAST=True)  # no zero-filled token rows
    if depth is not None:
        kw["PIPE_DEPTH"] = depth
    return kw


# Which v12 kernels are built for their layer's N and K (M still at run time): every pick
# of _choose_by_model but swap-AB's one-CTA-per-unit decode kernels (SPLIT_K=1 from
# chooser.split_plan), which read N and K at run time. Plain one-CTA tiles: the same 64x160
# kernel (TAIL_TMA, PREFETCH_MAPS, SHIFT_LAST) ran 0.99-1.04x torch at 256x5120x13824 built
# for that N and K and 0.88-0.90x with N and K read at run time, 64x96 at 128x6144x4096
# 0.97-0.98 against 0.93-0.95, and level or ahead at the other three shapes (H200, bf16,
# each kernel alternated with torch alone, two passes: scripts/lab/streaming_sweep.py
# --set nk, results/lab/v12_nk_h200.jsonl); through matmul, against the package before
# (results/lab/matmul_graph_h200_staticnk.jsonl, both dtypes, two passes): the models suite
# 1.021 / 1.021 -> 1.032 / 1.031, the held-out suite 0.985 / 0.989 -> 0.997 / 0.997
# (fp16 / bf16). Persistent swap-AB tiles, swap-AB stored by TMA and CTA pairs, through
# matmul against 76def98 in two H200 calls (results/lab/matmul_graph_h200_nkswap.jsonl,
# CUDA graphs, two passes each; the suites and 12 decode shapes off both): at the 13 cases
# whose kernel this changes, geomean 1.011 and 1.010, behind at 3 of 13 in each call
# (56x8192x2048 -2.4%; 77x7168x2048 +2.5%, 1000^3 +1.5%); the suites level (models
# 1.030 / 1.029 -> 1.032 / 1.030, held-out 0.988 / 0.989 -> 0.987 / 0.991). Swap-AB's
# SPLIT_K=1 units built so ran behind at 32 of 35 cases (geomean 0.970; +2 us at K = 3584
# and 5120, 1x4608x3584 0.95 -> 0.81; not profiled: their CUDA differs only in the tile
# walk's tail branch and the K loop's bound), so they keep RUNTIME_NK. N and K built in
# are not shared between layers: the models suite's bundle for every M holds 743 kernels
# per dtype, against 572 with swap-AB and pairs read at run time.
def _tile_kwargs(menu: registry.Step, pick: str, dtype: str, sm_count: int,
                 mnk: tuple | None = None) -> dict:
    """v12's keywords for the chooser's candidate ``pick``; with ``mnk`` (a plain GEMM),
    PDL=True where chooser.uses_pdl (a short kernel, one CTA or a pair), TAIL_TMA=True
    where chooser.tail_tma (a one-CTA tile whose tail's staging costs no ring stage) and
    SHIFT_LAST=True on one-CTA tiles (a last token tile that would reach past M ends at M:
    TMA's zero fill of rows past M is slow)."""
    from tirx_gemm.op import chooser
    bm, bn, cluster = chooser.tile(pick)
    kw = {**step_kwargs(menu, dtype, sm_count), "BLK_M": bm, "BLK_N": bn}
    if cluster > 1:
        kw["CLUSTER"] = cluster
        kw.pop("PREFETCH_MAPS", None)  # a pair's multicast loads take TVM's defaults
    if mnk is not None and chooser.uses_pdl(pick, *mnk, _pool(sm_count)):
        kw["PDL"] = True
    if mnk is not None and cluster == 1 and chooser.tail_tma(bm, bn):
        kw["TAIL_TMA"] = True  # its last bn % 64 columns by TMA (chooser.tail_tma)
    if mnk is not None and cluster == 1:
        kw["SHIFT_LAST"] = True  # no zero-filled token rows (v12's SHIFT_LAST)
    return kw



VARIANTS_MAX_M = 16384  # variants() covers every M up to this (and v9's settled point)
M_BLOCK = 64  # every tile height of every step divides 256 and is a multiple of 64


def variants(N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
             sm_count: int = spec.SM_COUNT["sm_90a"], max_m: int | None = None,
             epilogue: dict | None = None) -> list[tuple[str, dict, int, int]]:
    """Every (step_id, kwargs, first M, last M) that :func:`choose` picks for an Mx``N``x``K``
    GEMM over M = 1 .. ``max_m`` (default: VARIANTS_MAX_M, or the M at which v9's cluster
    tiles alone fill the GPU if that is larger), in order of M. With runtime-M kernels
    this is what a bundle needs to serve every token count of a layer: ``tirx-gemm export
    --suite`` exports these for each (N, K) of the suite. Every choice depends on M only
    through tile counts (ceil(M / 64), / 128, / 256; past 128 tokens chooser.dp_swap_tile's
    token tiles, multiples of 16, by ceil(M / 16)) and swap-AB's token tiles, so one M per
    block (64 rows, 16 past 128), and per token tile, decides the block. ``epilogue``: as in
    :func:`choose` (every variant is then a v12 tile)."""
    _check_problem(1, N, K, dtype, arch, sm_count)
    tile_m, tile_n = V9_CLUSTER_TILE[arch]
    clusters = max(1, sm_count // CLUSTER_SIZE)
    settled = tile_m * _ceil_div(clusters, _ceil_div(N, tile_n))  # tiles >= clusters from here
    last = max(settled, VARIANTS_MAX_M) if max_m is None else max_m
    out: list[list] = []
    # block starts: every 64 rows, past 128 every 16 (the data-parallel swap-AB rule's
    # token tiles, chooser.dp_swap_rows), past each of swap-AB's token tiles (its kernel
    # changes with the smallest tile that holds M), and where the token tile of a swap-AB
    # split past decode grows (chooser.wide_swap_tokens: every 16 or 32 rows to 512)
    from tirx_gemm.op import chooser
    wide = range(chooser.SWAP_AB_TILES[-1] + 2, min(chooser.WIDE_SWAP_MAX_M, last) + 1)
    step = chooser.DP_SWAP_TOKEN_STEP
    starts = sorted({lo for lo in range(1, last + 1, M_BLOCK)}
                    | {lo for lo in range(1, last + 1, step) if lo > chooser.DP_SWAP_MIN_M}
                    | ({chooser.DP_SWAP_MIN_M + 1} if chooser.DP_SWAP_MIN_M < last else set())
                    | {t + 1 for t in chooser.SWAP_AB_TILES if t < last}
                    | {m for m in wide
                       if chooser.wide_swap_token_tiles(m) != chooser.wide_swap_token_tiles(m - 1)})
    for i, lo in enumerate(starts):
        hi = (starts[i + 1] - 1) if i + 1 < len(starts) else last
        step_id, kw = choose(lo, N, K, dtype, arch, sm_count, epilogue)
        if out and out[-1][0] == step_id and out[-1][1] == kw:
            out[-1][3] = hi
        else:
            out.append([step_id, kw, lo, hi])
    return [tuple(v) for v in out]


def _registered(step_id: str, arch: str) -> registry.Step | None:
    return next((s for s in registry.all_steps(arch) if s.id == step_id), None)


def pick(M, N, K, dtype, arch, sm_count, step):
    """(Step, builder keywords) of a call: :func:`choose`'s pick, or the forced ``step``
    (``matmul(..., step=...)``) with its keywords, v12's tile and v11's split chosen here."""
    if step is None:
        step_id, kwargs = choose(M, N, K, dtype, arch, sm_count)
        return registry.get(step_id, arch), kwargs
    st = registry.get(step, arch)
    kwargs = step_kwargs(st, dtype, sm_count)
    if st.id == TILE_MENU and arch in MENU_ARCHES:  # the model's best tile of the menu
        from tirx_gemm.op import chooser
        pick = next(c for _, c in chooser.rank(M, N, K, _pool(sm_count))
                    if c not in (chooser.V9, chooser.V10))
        return st, _tile_kwargs(st, pick, dtype, sm_count)
    if st.id == SPLIT_K and kwargs.get("RUNTIME_M"):
        variant = splitk.choose_variant(M, N, K, _pool(sm_count), arch)
        variant["SPLIT_K"] = _menu_split(variant["SPLIT_K"],
                                              variant.get("L2_GROUP", V11_L2_GROUP[arch]))
        kwargs.update(variant)
    return st, kwargs
