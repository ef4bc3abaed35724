"""v14 (grouped GEMM) on the CPU: the tile walk against a Python model, the builders' one-line
refusals, what the builds compile to (SASS promises of the registry rows), and (where
tirx-harness NumSim is installed) the sm_100a twin simulated with racecheck and synccheck on
its registry cases. Correctness on silicon: .gpu/gk's check, lab/moe_grouped_gemm."""
import math
import random

import pytest

from tirx_gemm import registry

pytest.importorskip("tvm")
from tirx_gemm.hopper import grouped as G  # noqa: E402 (TVM needed: device verbs beside it)


def kernel_walk(rows, tok: int, w_tiles: int, w_blk: int, group: int):
    """The units as the kernel computes them, one unit index at a time: scan_experts'
    inclusive prefix of token tiles, tile_at's binary search and raster (truncating
    division on non-negative values), written out in Python line by line."""
    E = len(rows)
    mt = [(max(r, 0) + tok - 1) // tok for r in rows]
    incl = [sum(mt[:e + 1]) for e in range(E)]
    starts = [sum(rows[:e]) for e in range(E)]
    total = incl[-1] * w_tiles
    out = []
    for t in range(total):
        g = t // w_tiles
        e = 0
        for s in range(G.log2_ceil(E) + 1):
            step = 1 << (G.log2_ceil(E) - s)
            if e + step <= E and incl[e + step - 1] <= g:
                e += step
        first_tile = incl[e - 1] if e > 0 else 0
        u = t - first_tile * w_tiles
        first = u // (group * w_tiles) * group
        inside = min(group, incl[e] - first_tile - first)
        within = u - first * w_tiles
        out.append((e, starts[e] + (first + within % inside) * tok, within // inside * w_blk))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_walk_covers_every_unit_once_and_skips_empty_experts(seed):
    rng = random.Random(seed)
    E = rng.choice([1, 3, 8, 13, 128])
    rows = [rng.choice([0, 0, 1, 7, 64, 129, 300]) for _ in range(E)]
    tok, w_tiles, group = rng.choice([8, 64, 128]), rng.choice([1, 3, 7]), rng.choice([1, 4, 8])
    model = G.python_walk(rows, tok, w_tiles, group)
    want = {(e, m, n) for e, r in enumerate(rows) for m in range(math.ceil(r / tok))
            for n in range(w_tiles)}
    assert len(model) == len(want) and set(model) == want  # each unit exactly once
    assert all(rows[e] > 0 for e, _, _ in model)             # no unit of an empty expert
    assert [e for e, _, _ in model] == sorted(e for e, _, _ in model)  # expert-major
    starts = [sum(rows[:e]) for e in range(E)]
    kern = kernel_walk(rows, tok, w_tiles, 16, group)
    assert kern == [(e, starts[e] + m * tok, n * 16) for e, m, n in model]


def test_walk_groups_token_tiles_per_weight_column():
    # 20 token tiles of one expert, 3 weight columns, GROUP 8: tiles 0-7 walk column 0,
    # then column 1, ...; the last group (tiles 16-19) has 4
    walk = G.python_walk([20 * 64], 64, 3, 8)
    assert walk[:9] == [(0, m, 0) for m in range(8)] + [(0, 0, 1)]
    assert walk[-4:] == [(0, m, 2) for m in range(16, 20)]


def test_host_model_check_flags_stray_rows():
    import numpy as np
    A, B, D, x = G.grouped_inputs_np(100, 16, 64, {"E": 3}, "int", 1, "float16")
    R = x["routing"]
    assert R[1] == R[0] and R[-1] < 100  # an empty expert; rows past the last end
    start = 0
    for e in range(3):
        D[start:R[e]] = (A[start:R[e]].astype(np.float32) @ B[e].astype(np.float32).T)
        start = R[e]
    assert G.grouped_check_np(D, A, B, R, {"E": 3}, "float16", "int").ok
    D[-1, 0] = 0
    bad = G.grouped_check_np(D, A, B, R, {"E": 3}, "float16", "int")
    assert not bad.ok and "no expert owns" in bad.summary()


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_refusals_in_one_line(arch):
    step = registry.get("v14", arch)
    for kw, msg in ((dict(E=0), "E=0 must be an int in \\[1, 256\\]"),
                    (dict(E=257), "E=257 must be an int in \\[1, 256\\]"),
                    (dict(LAYOUT="ragged"), "LAYOUT='ragged' must be one of contiguous, masked"),
                    (dict(BLK_N=12), "BLK_N=12 must be a multiple of"),
                    (dict(GROUP=0), "GROUP"),
                    (dict(SWAP_AB=1), "SWAP_AB=1 must be True or False")):
        with pytest.raises(ValueError, match=msg):
            step.build_primfunc(256, 256, 512, **kw)
    with pytest.raises(ValueError):
        step.build_primfunc(256, 130, 512)  # N not a multiple of 8
    if arch == "sm_90a":
        with pytest.raises(ValueError, match="TMA_STORE=True stores whole 64x64 chunks"):
            step.build_primfunc(256, 256, 512, TMA_STORE=True, LAYOUT="masked")
        for kw in (dict(STORE_STEPS=3), dict(STORE_STEPS=2, TMA_STORE=True),
                   dict(STORE_STEPS=2, SWAP_AB=True, BLK_N=16)):
            with pytest.raises(ValueError, match=f"STORE_STEPS={kw['STORE_STEPS']} splits"):
                step.build_primfunc(256, 256, 512, **kw)
        with pytest.raises(ValueError, match="STORE_STEPS"):
            step.build_primfunc(256, 256, 512, STORE_STEPS=0)
        with pytest.raises(ValueError, match="ROW_SCALE=1 must be True or False"):
            step.build_primfunc(256, 256, 512, ROW_SCALE=1)
        with pytest.raises(ValueError, match="SWIGLU='gelu' must be None, 'halves' or"):
            step.build_primfunc(256, 256, 512, SWIGLU="gelu")
        for kw in (dict(SWAP_AB=True, BLK_N=16, ROW_SCALE=True), dict(ROW_SCALE=True),
                   dict(BIAS=True), dict(BLK_N=136)):
            with pytest.raises(ValueError, match="SWIGLU='halves' pairs gate and up"):
                step.build_primfunc(256, 256, 512, SWIGLU="halves", **kw)
        with pytest.raises(ValueError, match="SWIGLU='interleaved' pairs gate and up"):
            step.build_primfunc(256, 256, 512, SWIGLU="interleaved", SWAP_AB=True, BLK_N=16)


def test_cluster_pairs_refusals_and_multicast_boxes():
    """CLUSTER=2 (sm_90a): each CTA of a pair loads its own token rows and half of the
    weight tile multicast to both (one 3-D multicast TMA per stage, the other load unicast),
    the walk counts 2 * BLK_M-row units over SM_COUNT / 2 pairs; refusals in one line."""
    from tirx_gemm.compile.api import build
    step = registry.get("v14", "sm_90a")
    for kw, msg in ((dict(CLUSTER=4), "CLUSTER=4 must be 1 or 2"),
                    (dict(CLUSTER=True), "CLUSTER=True must be 1 or 2"),
                    (dict(CLUSTER=2, SWAP_AB=True, BLK_N=16), "CLUSTER=2 pairs plain tiles"),
                    (dict(CLUSTER=2, SWIGLU="halves"), "CLUSTER=2 pairs plain tiles"),
                    (dict(CLUSTER=2, FP8_BLOCK=True, dtype="bfloat16"), "CLUSTER=2 pairs"),
                    (dict(CLUSTER=2, BLK_N=136), "BLK_N=136 a multiple of 16"),
                    (dict(CLUSTER=2, SM_COUNT=131), "SM_COUNT=131 is not a multiple")):
        with pytest.raises(ValueError, match=msg) as info:
            step.build_primfunc(256, 256, 512, **kw)
        assert "\n" not in str(info.value)
    text = step.build_primfunc(512, 256, 512, BLK_M=64, BLK_N=256, CLUSTER=2).script()
    loads = [ln for ln in text.splitlines() if "copy_async(" in ln and ", B[" in ln]
    assert len(loads) == 1 and "cta_mask=3" in loads[0] and "rank * 128" in loads[0], loads
    for kw in (dict(BLK_M=64, BLK_N=256, TMA_STORE=True), dict(LAYOUT="masked", BIAS=True)):
        r = build("v14", 1024, 1024, 1024, arch="sm_90a", CLUSTER=2, **kw)
        ops = r.sass_counts
        assert r.spill_stores == 0 and r.spill_loads == 0, kw
        a_box = "UTMALDG.3D" if kw.get("LAYOUT") == "masked" else "UTMALDG.2D"
        assert ops.get("UTMALDG.3D.MULTICAST") == 1 and ops.get(a_box) == 1, ops
        assert ops.get("UTMALDG.2D.MULTICAST") is None, ops


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_fused_epilogue_operands(layout, arch):
    """ROW_SCALE and BIAS add their operands after routing, in that order: scale float32 with
    one value per row of D, bias (E, N) in D's dtype; the epilogue reads them clamped."""
    step = registry.get("v14", arch)
    rows = '6, M' if layout == "masked" else 'M'
    for kw, extra in ((dict(ROW_SCALE=True, BIAS=True),
                       [f'scale: T.Buffer(({rows}' + (',)' if layout != "masked" else ')'),
                        'bias: T.Buffer((6, 256), "bfloat16")']),
                      (dict(ROW_SCALE=True), ["scale: T.Buffer"]),
                      (dict(BIAS=True), ['bias: T.Buffer((6, 256), "bfloat16")'])):
        text = step.build_primfunc(512, 256, 512, E=6, LAYOUT=layout, dtype="bfloat16",
                                   **kw).script()
        sig = next(ln for ln in text.splitlines() if "def kernel" in ln)
        assert sig.index("routing:") < min(sig.index(x.split(":")[0] + ":") for x in extra)
        for x in extra:
            assert x in sig, (x, sig)
        assert ("scale" in sig) == bool(kw.get("ROW_SCALE")) and ("bias:" in sig) == bool(
            kw.get("BIAS"))
        assert '"float32"' in sig if kw.get("ROW_SCALE") else True


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("gate_up", ["halves", "interleaved"])
def test_swiglu_output_and_boxes(gate_up, arch):
    """SWIGLU: D is N/2 wide; "halves" loads each weight tile as two boxes of BLK_N/2 rows (gate
    at the tile's row, up N/2 rows further), "interleaved" as one box."""
    step = registry.get("v14", arch)
    text = step.build_primfunc(512, 256, 512, SWIGLU=gate_up).script()
    sig = next(ln for ln in text.splitlines() if "def kernel" in ln)
    assert "D: T.Buffer((M, 128)" in sig and "B: T.Buffer((8, 256, 512)" in sig
    loads = [ln for ln in text.splitlines() if "copy_async(" in ln and ", B[" in ln]
    if gate_up == "halves":
        assert len(loads) == 2 and any("B[at[0], 128 + at[3]" in ln for ln in loads), loads
    else:
        assert len(loads) == 1, loads


def test_swap_ab_swiglu_loads_gate_and_up_rows_in_8_row_boxes():
    """SWIGLU="halves" on a swap-AB tile: D N/2 wide; the weight tile (the MMA's A) as BLK_M/16
    groups of an 8-row gate box and the same features' 8-row up box N/2 rows further;
    "interleaved" on a swap-AB tile is refused in one line."""
    step = registry.get("v14", "sm_90a")
    text = step.build_primfunc(512, 256, 512, SWIGLU="halves", SWAP_AB=True, BLK_M=64,
                               BLK_N=16).script()
    sig = next(ln for ln in text.splitlines() if "def kernel" in ln)
    assert "D: T.Buffer((M, 128)" in sig and "B: T.Buffer((8, 256, 512)" in sig
    loads = [ln for ln in text.splitlines() if "copy_async(" in ln and ", B[" in ln]
    assert any("Asmem[ring_stage, 16 * q:16 * q + 8" in ln and "B[at[0], at[3] + 8 * q" in ln
               for ln in loads), loads
    assert any("B[at[0], 128 + at[3] + 8 * q" in ln for ln in loads), loads
    assert "for q in T.unroll(4)" in text
    with pytest.raises(ValueError, match="halves") as info:
        step.build_primfunc(512, 256, 512, SWIGLU="interleaved", SWAP_AB=True, BLK_N=16)
    assert "\n" not in str(info.value)


def test_sm100a_epilogue_refusals_in_one_line():
    """sm_100a's fused epilogue (ROW_SCALE, BIAS, SWIGLU) is built on plain 16-bit tiles: a
    swap-AB or MXFP8 tile with it, SwiGLU with the row scale or bias or an N off 16, and a
    bad keyword value are refused in one line, in sm_90a's words."""
    step = registry.get("v14", "sm_100a")
    for kw, N, msg in ((dict(ROW_SCALE=1), 256, "ROW_SCALE=1 must be True or False"),
                       (dict(BIAS="float16"), 256, "BIAS='float16' must be True or False"),
                       (dict(SWIGLU="gelu"), 256, "SWIGLU='gelu' must be None, 'halves' or"),
                       (dict(SWIGLU=True), 256, "SWIGLU=True must be None, 'halves' or"),
                       (dict(SWIGLU="halves", ROW_SCALE=True), 256, "pairs gate and up"),
                       (dict(SWIGLU="interleaved", BIAS=True), 256, "pairs gate and up"),
                       (dict(SWIGLU="halves", SWAP_AB=True, BLK_N=16), 256, "no SWAP_AB, ROW"),
                       (dict(SWIGLU="interleaved"), 264, "N=264 a multiple of 16"),
                       (dict(ROW_SCALE=True, SWAP_AB=True, BLK_N=16), 256, "no SWAP_AB"),
                       (dict(BIAS=True, SWAP_AB=True, BLK_N=16), 256, "no SWAP_AB"),
                       (dict(SCALE="mx", ROW_SCALE=True), 256, "no SWAP_AB, ROW_SCALE, BIAS"),
                       (dict(SCALE="mx", SWIGLU="halves"), 256, "no SWAP_AB, ROW_SCALE, BIAS")):
        with pytest.raises(ValueError, match=msg) as info:
            step.build_primfunc(256, N, 512, **kw)
        assert "\n" not in str(info.value)


def test_sm100a_epilogue_reads_tmem_in_fp32_before_the_bounded_store():
    """The epilogue's order on sm_100a: fp32 TMEM loads, the row scale read once per row
    (clamped to the expert's rows), the bias per column (clamped to N), then the cast and
    the bounded 16-byte stores; "halves" reads the gate and up halves of a row as two loads."""
    step = registry.get("v14", "sm_100a")
    text = step.build_primfunc(512, 48, 128, E=3, BLK_N=32, ROW_SCALE=True, BIAS=True).script()
    body = text[text.index("mbarrier_wait(T.address_of(accs_full_buf[acc_stage])"):]
    order = [body.index(x) for x in ("scale[T.min(at[1] + (warp_id * 32 + lane_id), at[2] - 1)]",
                                     "T.wg.copy_async(", "bias[at[0], T.min(", "* f",
                                     'T.Cast("float16", acc[j])', "T.tile.copy(D[")]
    assert order == sorted(order), order
    text = step.build_primfunc(512, 80, 128, E=3, BLK_N=32, SWIGLU="halves").script()
    loads = [ln for ln in text.splitlines() if "T.wg.copy_async(" in ln]
    assert len(loads) == 2 and "acc_stage * 256 + 16 + c * 16" in loads[1], loads
    assert "T.exp(" in text and "D: T.Buffer((M, 40)" in text


def test_host_model_epilogue_reference():
    """The host model's epilogue (grouped_epilogue_np): an output computed by the formula per
    expert passes; the same without the bias, the scale or with gate and up swapped fails."""
    import numpy as np
    for kw in ({"E": 3, "ROW_SCALE": True, "BIAS": True},
               {"E": 3, "LAYOUT": "masked", "ROW_SCALE": True, "BIAS": True},
               {"E": 3, "SWIGLU": "halves"}, {"E": 3, "LAYOUT": "masked", "SWIGLU": "interleaved"}):
        masked = kw.get("LAYOUT") == "masked"
        A, B, D, x = G.grouped_inputs_np(100, 32, 64, kw, "random", 1, "float16")
        R = x["routing"]
        assert D.shape[-1] == (16 if kw.get("SWIGLU") else 32)
        good, bad, start = D.copy(), D.copy(), 0
        for e in range(3):
            lo, hi = (0, int(R[e])) if masked else (start, int(R[e]))
            acc = (A[e] if masked else A)[lo:hi].astype(np.float32) @ B[e].astype(np.float32).T
            silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
            if kw.get("SWIGLU") == "halves":
                out, wrong = silu(acc[:, :16]) * acc[:, 16:], silu(acc[:, 16:]) * acc[:, :16]
            elif kw.get("SWIGLU"):
                g = acc.reshape(-1, 2, 2, 8)
                out = (silu(g[:, :, 0]) * g[:, :, 1]).reshape(-1, 16)
                wrong = (silu(g[:, :, 1]) * g[:, :, 0]).reshape(-1, 16)
            else:
                s = (x["scale"][e] if masked else x["scale"])[lo:hi, None]
                out, wrong = (acc + x["bias"][e].astype(np.float32)) * s, acc * s
            (good[e] if masked else good)[lo:hi] = out
            (bad[e] if masked else bad)[lo:hi] = wrong
            start = hi
        assert G.grouped_check_np(good, A, B, R, kw, "float16", "random", scales=x).ok, kw
        assert not G.grouped_check_np(bad, A, B, R, kw, "float16", "random", scales=x).ok, kw
    with pytest.raises(ValueError, match="ROW_SCALE=True needs scales"):
        G.grouped_check_np(good, A, B, R, {"E": 3, "ROW_SCALE": True}, "float16", "random")


def test_sm100a_mx_refusals_in_one_line():
    """SCALE="mx" (sm_100a): plain tiles, K in whole scale blocks, one SF atom per weight
    tile; every refusal one line."""
    step = registry.get("v14", "sm_100a")
    for kw, K, msg in ((dict(SCALE="tensor"), 512, "SCALE='tensor' must be None"),
                       (dict(SCALE="mx", SWAP_AB=True, BLK_N=16), 512, "no SWAP_AB"),
                       (dict(SCALE="mx"), 400, "K=400 is not a multiple of 32"),
                       (dict(SCALE="mx", BLK_N=64), 512, "BLK_N=64 with SCALE='mx' must be 128"),
                       (dict(SCALE="mx", dtype="float32"), 512, "dtype='float32'"),
                       (dict(SCALE="mx", E=0), 512, "E=0 must be an int"),
                       (dict(SCALE="mx", LAYOUT="ragged"), 512, "LAYOUT='ragged'"),
                       (dict(SCALE="mx", PIPE_DEPTH=9), 512, "PIPE_DEPTH=9")):
        with pytest.raises(ValueError, match=msg) as info:
            step.build_primfunc(256, 256, K, **kw)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_sm100a_mx_operands_and_loads(layout):
    """SCALE="mx": A, B e4m3 bytes; SFA (blocked, run-time rows; masked one block per expert)
    and SFB (E, blocked) after routing; the weight rows and SFB's atom by 3-D TMA boxes,
    SFA's atom gathered by the producer warp (token tiles start at any row)."""
    step = registry.get("v14", "sm_100a")
    text = step.build_primfunc(512, 256, 640, E=6, LAYOUT=layout, SCALE="mx").script()
    sig = next(ln for ln in text.splitlines() if "def kernel" in ln)
    a = '(6, "M", 640)' if layout == "masked" else '("M", 640)'
    sfa = '(6, "SFA_ROWS", 128)' if layout == "masked" else '("SFA_ROWS", 128)'
    for want in (f'A: T.Buffer({a}, "uint8")', 'B: T.Buffer((6, 256, 640), "uint8")',
                 f'SFA: T.Buffer({sfa}, "uint8")', 'SFB: T.Buffer((6, 40, 128), "uint8")'):
        assert want in sig, (want, sig)
    assert sig.index("routing:") < sig.index("SFA:") < sig.index("SFB:")
    loads = [ln for ln in text.splitlines() if "copy_async(" in ln and "smem" in ln.lower()]
    assert any(", B[at[0], at[3]:" in ln for ln in loads), loads
    assert any(", SFB[at[0], " in ln for ln in loads), loads
    assert not any(", SFA[" in ln for ln in loads), loads  # SFA: thread loads, not TMA
    # tma2mma completes on 1 + 32 arrivals: the expect_tx and each producer lane's SFA bytes
    assert 'stages_full_buf[s])), T.uint32(33), "init"' in text


def test_host_model_mx_check_needs_the_scales():
    """The MXFP8 model: the float64 reference with the decoded scale factors passes a
    correct output, and the same output computed without the scales fails."""
    import numpy as np
    from tirx_gemm import numerics
    kw = {"E": 3, "SCALE": "mx"}
    A, B, D, x = G.grouped_inputs_np(200, 40, 320, kw, "random", 2, "bfloat16")
    R = x["routing"]
    assert x["SFA"].shape == (2 * 3 * 4, 128) and x["SFB"].shape == (3, 3 * 4, 128)
    start, plain = 0, D.copy()
    a = numerics.fp8_from_bytes_np(A).astype(np.float64)
    for e in range(3):
        sfa = numerics.mx_unblock_sf_np(x["SFA"], 200, 320)[start:R[e]]
        sfb = numerics.mx_unblock_sf_np(x["SFB"][e], 40, 320)
        b = numerics.fp8_from_bytes_np(B[e]).astype(np.float64)
        D[start:R[e]] = numerics.reference_mx_np(numerics.fp8_from_bytes_np(A[start:R[e]]),
                                                 numerics.fp8_from_bytes_np(B[e]), sfa, sfb)
        plain[start:R[e]] = a[start:R[e]] @ b.T
        start = R[e]
    assert G.grouped_check_np(D, A, B, R, kw, "bfloat16", "random", scales=x).ok
    assert not G.grouped_check_np(plain, A, B, R, kw, "bfloat16", "random", scales=x).ok
    with pytest.raises(ValueError, match="needs scales"):
        G.grouped_check_np(D, A, B, R, kw, "bfloat16", "random")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_operands_and_3d_weight_boxes(arch):
    step = registry.get("v14", arch)
    text = step.build_primfunc(512, 256, 512, E=6, LAYOUT="masked").script()
    sig = next(ln for ln in text.splitlines() if "def kernel" in ln)
    assert 'A: T.Buffer((6, "M", 512)' in sig and "B: T.Buffer((6, 256, 512)" in sig
    assert "D: T.Buffer((6, M, 256)" in sig and 'routing: T.Buffer((6,), "int32")' in sig
    # A's token box and B's weight box are both 3-D (bounded per expert in masked)
    loads = [ln for ln in text.splitlines() if "copy_async(" in ln and "smem" in ln]
    assert any(", A[at[0], at[1]:" in ln for ln in loads), loads
    assert any(", B[at[0], at[3]:" in ln for ln in loads), loads


SASS_CASES = {
    "sm_90a": [dict(), dict(LAYOUT="masked", dtype="bfloat16"),
               dict(SWAP_AB=True, BLK_M=64, BLK_N=16), dict(BLK_M=64, BLK_N=64, E=128),
               dict(BLK_N=256, TMA_STORE=True), dict(BLK_N=256, STORE_STEPS=4),
               dict(BLK_N=256, ROW_SCALE=True, BIAS=True, dtype="bfloat16"),
               dict(BLK_N=256, TMA_STORE=True, ROW_SCALE=True, BIAS=True, dtype="bfloat16"),
               dict(SWAP_AB=True, BLK_M=64, BLK_N=16, ROW_SCALE=True, BIAS=True,
                    LAYOUT="masked"),
               dict(BLK_N=256, SWIGLU="halves"), dict(SWIGLU="interleaved", STORE_STEPS=2),
               dict(FP8_BLOCK=True, dtype="bfloat16"), dict(FP8_BLOCK=True, BLK_M=64, E=128,
                                                                      LAYOUT="masked")],
    "sm_100a": [dict(), dict(LAYOUT="masked", BLK_N=64), dict(SWAP_AB=True, BLK_N=16),
                dict(SCALE="mx"), dict(SCALE="mx", LAYOUT="masked", dtype="bfloat16", E=128),
                dict(BLK_N=256, ROW_SCALE=True, BIAS=True, dtype="bfloat16"),
                dict(LAYOUT="masked", ROW_SCALE=True), dict(BLK_N=256, SWIGLU="halves"),
                dict(SWIGLU="interleaved", LAYOUT="masked", dtype="bfloat16")],
}


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_builds_keep_the_sass_promises(arch):
    """Every keyword family builds without spills and keeps the registry row's promises:
    TMA loads with a 3-D box (B[e]); no TMA store (every store bounded per expert) unless
    TMA_STORE asks for it on 64-row blocks wholly inside their expert."""
    from tirx_gemm.compile.api import build
    step = registry.get("v14", arch)
    for kw in SASS_CASES[arch]:
        r = build("v14", 1024, 1024, 1024, arch=arch, **kw)
        ops = r.sass_counts
        assert r.spill_stores == 0 and r.spill_loads == 0, kw
        assert "UTMALDG.3D" in ops, kw
        # TMA_STORE: full 64-row blocks by stmatrix + TMA store; otherwise no TMA store
        assert any(k.startswith("UTMASTG") for k in ops) == bool(kw.get("TMA_STORE")), kw
        # FP8_BLOCK: e4m3 wgmmas (QGMMA), k32, over the whole tile width; no 16-bit HGMMA
        if kw.get("FP8_BLOCK"):
            assert any(k.startswith(f"QGMMA.64x{kw.get('BLK_N', 128)}x32.F32.E4M3.E4M3")
                       for k in ops), sorted(ops)
            assert not any(k.startswith("HGMMA") for k in ops), sorted(ops)
        # SCALE="mx": block-scaled e4m3 MMAs on one CTA (UTCQMMA, 4 of K = 32 per stage, no
        # 16-bit UTCHMMA), and a tcgen05.cp per stage for SFA's atom and one for SFB's
        if kw.get("SCALE") == "mx":
            src = r.cuda_source
            assert "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X" in src
            assert "tcgen05.cp.cta_group::1.32x128b.warpx4" in src
            assert "cta_group::2" not in src and "kind::f8f6f4" not in src
            assert ops.get("UTCQMMA") == 4 and not any(k.startswith("UTCHMMA") for k in ops), ops
            assert sum(n for k, n in ops.items() if k.startswith("UTCCP")) == 2, ops
            # SFA gathered one 32-bit word per row (no byte loads), after the stage's TMA
            assert not any(k.startswith("LDG") and ".U8" in k for k in ops), sorted(ops)
            assert src.rindex("cp_async_bulk_tensor_g2s") < src.index("(uint)2139062143")
        if not kw:  # the registry build: every promise of the row
            for p in step.sass_expect:
                assert any(k.startswith(p) for k in ops), (p, sorted(ops))
            for p in step.sass_forbid:
                assert not any(k.startswith(p) for k in ops), (p, sorted(ops))


# --- NumSim (sm_100a), where tirx-harness is installed -------------------------------------
def _numsim_reason():
    from tirx_gemm.sim import gate
    return gate.unavailable_reason()


_why = _numsim_reason()


@pytest.mark.skipif(_why is not None, reason=f"simulation skipped: {_why}")
@pytest.mark.parametrize("case", registry.get("v14", "sm_100a").sim_cases,
                         ids=lambda c: "x".join(map(str, c[0])) + "-" + "-".join(
                             f"{k}{v}" for k, v in c[1]))
def test_sm100a_twin_is_numsim_clean(case):
    from tirx_harness.numsim import Engine, transpile
    from tirx_harness.numsim.checkers import racecheck, synccheck
    (M, N, K), kw = case
    kw = dict(kw)
    dtype = kw.get("dtype", "float16")
    func = registry.get("v14", "sm_100a").build_primfunc(M, N, K, **kw)
    A, B, D, extra = G.grouped_inputs_np(M, N, K, kw, "random", 0, dtype)
    ops = {"A": A, "B": B, "D": D, **extra}
    res = Engine(max_workers="auto").run(transpile(func), {**ops, "D": D.copy()})
    cmp = G.grouped_check_np(res.outputs["D"], A, B, extra["routing"], kw, dtype, "random",
                             scales=extra)
    assert res.verdict == "clean", res.diagnostics
    assert cmp.ok, cmp.summary()
    for check in (synccheck, racecheck):
        rep = check(func, {**ops, "D": D.copy()})
        assert rep.verdict == "clean", rep.format()


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_a_build_naming_no_e_has_the_registrys_experts(arch):
    """One count, one home: both v14 builders' default E is registry.GROUPED_E, which the GPU
    runner (run.runner.GroupedOperands) and the host model read for a build that names none."""
    import inspect
    builder = registry.get("v14", arch).builder()
    assert inspect.signature(builder).parameters["E"].default == registry.GROUPED_E
    _, B, _, _ = G.grouped_inputs_np(16, 8, 16, {}, "random", 0, "float16")  # the host model's
    assert B.shape[0] == registry.GROUPED_E
