"""The per-tensor v13 variants lab/fp8_on_hopper/fp8_h200.py times next to choose_fp8's picks
(and fp8_export.py adds to the bundle): the serial promotion, the tile without promotion."""
from __future__ import annotations

from tirx_gemm import registry, spec
from tirx_gemm.op.fp8 import ARCH, FP8_STEP

# interval_candidates' names (fp8_deepk_verdict and fp8_interval_summary read records by them)
INTERVAL = "overlapped every 2nd stage"       # PROMOTE=8 overlapped beside a PROMOTE=4 pick
EVERY_STAGE = "promoted every stage (PROMOTE=4)"  # beside a PROMOTE=8 pick (K >= 8192)


def lab_variants(sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) of the per-tensor bf16 kernels lab/fp8_on_hopper/fp8_h200.py times
    next to choose_fp8's, to separate the promotion's cost from the tile's: the
    serial promotion (128 x 128, PROMOTE_OVERLAP=False) and the 128 x 128 tile without
    promotion; the small-M tiles (64 x 128 promoted serially, for M <= 64)."""
    base = {"dtype": "bfloat16", "SCALE": "tensor", "RUNTIME_M": True, "RUNTIME_NK": True,
            "SM_COUNT": sm_count}
    return [("v13 tensor serial 128x128", {**base, "PROMOTE": 4, "PROMOTE_OVERLAP": False,
                                           "BLK_M": 128, "BLK_N": 128}),
            ("v13 tensor fast 128x128", {**base, "PROMOTE": 0, "BLK_M": 128, "BLK_N": 128}),
            ("v13 tensor serial 64x128", {**base, "PROMOTE": 4, "PROMOTE_OVERLAP": False,
                                          "BLK_M": 64, "BLK_N": 128})]


def lab_variant_requests(sm_count: int = spec.SM_COUNT[ARCH]):
    """lab_variants as bundle requests (step, nominal build shape, keywords)."""
    from tirx_gemm.op.matmul import build_shape
    step = registry.get(FP8_STEP, ARCH)
    return [(step, build_shape((kw["BLK_M"], 256, 256), kw), kw)
            for _, kw in lab_variants(sm_count)]


def thin_candidates(M: int, N: int, K: int, mode: str, out_dtype: str = "bfloat16",
                    sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) timed beside choose_fp8's pick at M <= 16 (fp8_suite_run.py
    --candidates thin): the pick with full A stages where it took thin ones (A_ROWS), and
    with thin A stages where it did not (the scale kinds thin A was not yet measured in);
    none for a K-split pick (thin A is not picked with a split)."""
    from tirx_gemm.op import fp8
    kw = fp8.choose_fp8(M, mode, False, out_dtype, sm_count, N=N, K=K)
    if M > max(fp8.THIN_A_ROWS) or "SPLIT_K" in kw:
        return []
    if "A_ROWS" in kw:
        return [("full A", {k: v for k, v in kw.items() if k != "A_ROWS"})]
    return [("thin A", {**kw, "A_ROWS": next(r for r in fp8.THIN_A_ROWS if M <= r)})]


def cluster_candidates(M: int, N: int, K: int, mode: str, out_dtype: str = "bfloat16",
                       sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) timed beside choose_fp8's pick at M > 128 (fp8_suite_run.py
    --candidates cluster): the pick's 128-row tile on a CTA pair along M (v13's CLUSTER=2: each
    CTA loads half of the shared weight tile, multicast to both); none for other picks."""
    from tirx_gemm.op import fp8
    kw = fp8.choose_fp8(M, mode, False, out_dtype, sm_count, N=N, K=K)
    if M <= fp8.SMALL_M or kw["BLK_M"] != 128 or "SPLIT_K" in kw or sm_count % 2:
        return []
    return [("pair", {**kw, "CLUSTER": 2})]


def pair_check_kwargs(mode: str, sm_count: int = spec.SM_COUNT[ARCH]) -> tuple[dict, dict]:
    """(the 128 x 128 pick of a scale kind, the same on a CTA pair): what fp8_pair_check.py runs
    at its edge shapes (runtime-shape kernels: one pair serves every shape)."""
    from tirx_gemm.op import fp8
    kw = fp8.choose_fp8(4096, mode, False, "bfloat16", sm_count, N=4096, K=4096)
    return kw, {**kw, "CLUSTER": 2}


def promotion_candidates(M: int, N: int, K: int, mode: str, out_dtype: str = "bfloat16",
                         sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) timed beside choose_fp8's 128 x 128 pick at M > 128 (fp8_suite_run.py
    --candidates promotion): the candidate, the pick with its second consumer's stage pairs offset by one
    (STAGGER: the two warpgroups drain the tensor core at different stages); per tensor also the variants
    that isolate the promotion's cost: no promotion (PROMOTE=0, 128 x 128 and 128 x 256), the serial
    promotion every stage (PROMOTE=4) and every second stage (PROMOTE=8, half the FFMA). With
    FP8_SKIP_STAGGER=1 in the environment (its check failed) the staggered pick is left out."""
    import os
    from tirx_gemm.op import fp8
    kw = fp8.choose_fp8(M, mode, False, out_dtype, sm_count, N=N, K=K)
    if M <= fp8.SMALL_M or (kw["BLK_M"], kw["BLK_N"]) != (128, 128) or "SPLIT_K" in kw:
        return []
    skip = os.environ.get("FP8_SKIP_STAGGER") == "1"
    out = [] if skip else [("stagger", {**kw, "STAGGER": True})]
    if mode == "tensor":
        out += [("no promotion", {**kw, "PROMOTE": 0}),
                ("no promotion 128x256", {**kw, "PROMOTE": 0, "BLK_N": 256}),
                ("serial every stage", {**kw, "PROMOTE_OVERLAP": False}),
                ("serial every 2nd stage", {**kw, "PROMOTE": 8, "PROMOTE_OVERLAP": False})]
    return out


def stagger_check_kwargs(mode: str, sm_count: int = spec.SM_COUNT[ARCH]) -> tuple[dict, dict]:
    """(the 128 x 128 pick of a scale kind, the same with STAGGER): what the stagger check runs at its
    edge shapes (fp8_pair_check.py --variant stagger)."""
    from tirx_gemm.op import fp8
    kw = fp8.choose_fp8(4096, mode, False, "bfloat16", sm_count, N=4096, K=4096)
    return kw, {**kw, "STAGGER": True}


def wide_candidates(M: int, N: int, K: int, mode: str, out_dtype: str = "bfloat16",
                    sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) timed beside choose_fp8's 128 x 128 pick at M > 128 (fp8_suite_run.py
    --candidates wide): the widest promoted tiles that fit a consumer's registers. 128 x 192 with one
    partial sum promoted every stage (PROMOTE_OVERLAP=False: 96 + 96 registers a thread, the previous
    tile stored before the mainloop; with block scales it straddles two blocks of B); per tensor and
    rowwise 128 x 144 with the overlapped promotion (acc, tmp0, tmp1: 3 x 72 registers; with block
    scales it spills, so it is not timed there); per tensor also 128 x 256 without promotion (the
    width's ceiling)."""
    from tirx_gemm.op import fp8
    kw = fp8.choose_fp8(M, mode, False, out_dtype, sm_count, N=N, K=K)
    if M <= fp8.SMALL_M or (kw["BLK_M"], kw["BLK_N"]) != (128, 128) or "SPLIT_K" in kw:
        return []
    out = [("serial 128x192", {**kw, "PROMOTE_OVERLAP": False, "BLK_N": 192})]
    if mode != "block":
        out.insert(0, ("overlapped 128x144", {**kw, "BLK_N": 144}))
    if mode == "tensor":
        out.append(("no promotion 128x256", {**kw, "PROMOTE": 0, "BLK_N": 256}))
    return out


def wide_check_kwargs(mode: str, sm_count: int = spec.SM_COUNT[ARCH],
                      width: int = 192) -> tuple[dict, dict] | None:
    """(the 128 x 128 pick of a scale kind, its wide candidate of ``width`` columns: 192 promoted
    every stage, 144 overlapped): what fp8_pair_check.py --variant wide / wide144 runs at its edge
    shapes; None where wide_candidates has no such tile (144 with block scales)."""
    from tirx_gemm.op import fp8
    kw = fp8.choose_fp8(4096, mode, False, "bfloat16", sm_count, N=4096, K=4096)
    if width == 144:
        return None if mode == "block" else (kw, {**kw, "BLK_N": 144})
    return kw, {**kw, "PROMOTE_OVERLAP": False, "BLK_N": 192}


def interval_candidates(M: int, N: int, K: int, mode: str, out_dtype: str = "bfloat16",
                        sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) timed beside choose_fp8's 128 x 128 pick at M > 128 (fp8_suite_run.py
    --candidates interval): per tensor and rowwise the overlapped promotion every second stage
    (PROMOTE=8: stages 4j, 4j+1 into tmp0 and 4j+2, 4j+3 into tmp1, so both consumers drain the
    tensor core once per four stages instead of per pair; the same registers), or where the pick
    already is that (K >= fp8.PROMOTE_EVERY_SECOND_FROM_K) the pick promoted every stage
    (PROMOTE=4, "promoted every stage (PROMOTE=4)": fp8_deepk_verdict inverts its ratio); in every
    kind the pick with the scheduler's L2 group at 4 and 16 rows instead of 8."""
    from tirx_gemm.op import fp8
    kw = fp8.choose_fp8(M, mode, False, out_dtype, sm_count, N=N, K=K)
    if M <= fp8.SMALL_M or (kw["BLK_M"], kw["BLK_N"]) != (128, 128) or "SPLIT_K" in kw:
        return []
    if mode == "block":
        out = []
    elif kw["PROMOTE"] == 8:
        out = [(EVERY_STAGE,
                {k: v for k, v in kw.items() if k != "PROMOTE_OVERLAP"} | {"PROMOTE": 4})]
    else:
        out = [(INTERVAL, {**kw, "PROMOTE": 8, "PROMOTE_OVERLAP": True})]
    return out + [("L2 group 4", {**kw, "L2_GROUP": 4}), ("L2 group 16", {**kw, "L2_GROUP": 16})]


def interval_check_kwargs(mode: str, sm_count: int = spec.SM_COUNT[ARCH]) -> tuple[dict, dict] | None:
    """(the 128 x 128 pick of a scale kind, the same promoted every second stage, overlapped): what
    fp8_pair_check.py --variant interval runs at its edge shapes (K = 4096: the pick is PROMOTE=4);
    None with block scales (each 128-K block has its own scales, so PROMOTE is 4 there)."""
    from tirx_gemm.op import fp8
    if mode == "block":
        return None
    kw = fp8.choose_fp8(4096, mode, False, "bfloat16", sm_count, N=4096, K=4096)
    return kw, {**kw, "PROMOTE": 8, "PROMOTE_OVERLAP": True}


def interval_case_kwargs(M: int, N: int, K: int, mode: str, out_dtype: str = "bfloat16",
                         sm_count: int = spec.SM_COUNT[ARCH]) -> tuple[dict, dict] | None:
    """(choose_fp8's pick at this shape, its interval candidate: the same promoted every second stage,
    overlapped, or at K >= 8192, where the pick is that, promoted every stage): the pair
    interval_candidates times there, which `fp8_pair_check.py --variant interval --suite FILE` also checks
    against torch's dequantized product at each of the suite's cases; None where interval_candidates has
    no such candidate (block scales, a pick that is not 128 x 128)."""
    from tirx_gemm.op import fp8
    kw = fp8.choose_fp8(M, mode, False, out_dtype, sm_count, N=N, K=K)
    got = dict(interval_candidates(M, N, K, mode, out_dtype, sm_count))
    cand = got.get(INTERVAL) or got.get(EVERY_STAGE)
    return None if cand is None else (kw, cand)
