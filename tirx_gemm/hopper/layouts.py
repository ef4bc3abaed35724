"""Operand layouts (v15): K-major or MN-major A and B tiles, through TMA and the wgmma descriptors.

An operand is K-major when each of its rows (an A row of M, a B row of N) is contiguous along
K in global memory: A (M, K) and B (N, K) row-major, what every step before v15 reads. It is
MN-major when it is stored transposed: A as (K, M), B as (K, N) row-major, i.e. ``x.T`` of a
row-major tensor, as dgrad's ``W`` and wgrad's ``X`` and ``dY`` come.

SMEM, 128B swizzle, 16-bit elements, one K step of 64:

* K-major (v9's tile): ``rows`` rows of 128 B (64 K elements), 8-row swizzle atoms of 1 KiB;
  descriptor LBO unused (1), SBO 1 KiB between 8-row groups; a k16 slice starts 32 B on.
* MN-major: ``rows // 64`` chunks, each 64 K rows of 128 B (64 MN elements), the same 8-row
  swizzle atoms (the TMA box of one chunk is 64 MN x 64 K of the transposed tensor, so TMA
  writes exactly this). Descriptor: SBO 1 KiB between 8-K-row groups, LBO 8 KiB between
  64-element MN chunks (an m64nNk16 wgmma of N > 64 spans N / 64 chunks), and a k16 slice
  starts 16 rows = 2 KiB on. The wgmma's transpose bit (imm-trans-a / imm-trans-b = 1) tells
  the tensor core the operand is MN-major; 16-bit types only (fp8 wgmma takes K-major only).

Both layouts put a 64-row (or 64-column) block 8 KiB on, so a consumer's A block and the
m64 step of the descriptor are the same for either major order.

Global memory: an MN-major operand's rows are its MN extent, so TMA's 16-byte row rule asks
that M (A) or N (B) be a multiple of 8 instead of K; K is then the outer dimension (any K:
a box past K is zero-filled).
"""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from .. import helpers as H
from tirx_gemm.epilogue import gelu_constants  # shared: no TVM, numpy only
from ..helpers import ACC_DTYPE
from .. import timeline as TL
from .fused import epilogue_bias_act  # (read only: the forward epilogue's activations)
from .stores import _ST_GLOBAL_F32X2_SRC, pack_fragment, store_packed_tile
from .wgmma import (DESC_K16_STEP, DESC_LBO, DESC_M64_STEP, DESC_SBO, ELEM_BYTES,
                    SWIZZLE_128B, SWIZZLE_ROW_ELEMS, WGMMA_K, wgmma_name)

MAJORS = ("K", "MN")
MN_CHUNK = SWIZZLE_ROW_ELEMS            # MN elements in one 128-byte row of an MN-major tile
DESC_MN_SBO = (8 * 128) >> 4            # 1 KiB between 8-K-row groups = 64
DESC_MN_LBO = (SWIZZLE_ROW_ELEMS * 128) >> 4  # 8 KiB between 64-element MN chunks = 512
DESC_MN_K16_STEP = (WGMMA_K * 128) >> 4  # 16 K rows of 128 B = 2 KiB = 128


def check_major(name: str, value) -> bool:
    """True for "MN", False for "K"; a one-line ValueError otherwise."""
    if value not in MAJORS:
        raise ValueError(f"{name}={value!r}: an operand is 'K'-major (rows contiguous along "
                         f"K, the default) or 'MN'-major (stored transposed, (K, rows))")
    return value == "MN"


def check_layout_shape(M: int, N: int, K: int, dtype: str, a_mn: bool, b_mn: bool) -> None:
    """helpers.check_edge_shape for either major order: N a multiple of 8 (D's rows); K a
    multiple of 8 only while an operand is K-major (its rows are then K elements); M a
    multiple of 8 when A is MN-major (check_mn_rows). Any K when both are MN-major: K is
    then every operand's outer dimension, and TMA zero-fills a box past it."""
    H.check_dtype(dtype)
    H.check_positive_ints(M=M, N=N, K=K)
    for name, value, rule in (("N", N, True), ("K", K, not (a_mn and b_mn))):
        if rule and value % 8:
            raise ValueError(f"{name}={value} is not a multiple of 8: TMA needs every row of "
                             f"the K-major operands and D to start on a 16-byte boundary")
    check_mn_rows("A_MAJOR", M, a_mn, "M")


def check_mn_rows(name: str, rows, mn: bool, dim: str) -> None:
    """TMA's 16-byte row rule for an MN-major operand: its MN extent is the row length."""
    if mn and isinstance(rows, int) and rows % 8:
        raise ValueError(f"{dim}={rows} with {name}='MN': the operand's rows are its {dim} "
                         f"elements, a multiple of 8 for TMA's 16-byte row stride")


def gmem_shape(rows, K, mn: bool):
    """The global operand's shape: (rows, K) K-major, (K, rows) MN-major."""
    return (K, rows) if mn else (rows, K)


def smem_shape(depth: int, rows: int, blk_k: int, mn: bool):
    """The ring's SMEM shape of one operand: (depth, rows, blk_k) K-major; (depth, rows // 64,
    blk_k, 64) MN-major (chunks of 64 MN elements, blk_k K rows each)."""
    if not mn:
        return (depth, rows, blk_k)
    if rows % MN_CHUNK:
        raise ValueError(f"an MN-major tile of {rows} rows is not a multiple of {MN_CHUNK} "
                         f"(one 128-byte swizzle row of MN elements)")
    return (depth, rows // MN_CHUNK, blk_k, MN_CHUNK)


def desc_steps(mn: bool) -> tuple[int, int, int]:
    """(LBO, SBO, k16 step) of a 128B-swizzled operand, in 16-byte units."""
    return (DESC_MN_LBO, DESC_MN_SBO, DESC_MN_K16_STEP) if mn else \
        (DESC_LBO, DESC_SBO, DESC_K16_STEP)


@T.inline
def encode_desc_major(desc, tile_ptr, lbo: int, sbo: int):
    """desc[0] <- descriptor of a 1024-aligned, 128B-swizzled 16-bit tile (desc_steps)."""
    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[0]), tile_ptr, lbo, sbo,
                                          SWIZZLE_128B)


@T.inline
def wgmma_tile_major(acc, desc_a, desc_b, accumulate, m_blocks: int, n: int, dtype: str,
                     k_step_a: int, k_step_b: int, trans_a: int, trans_b: int):
    """wgmma.wgmma_tile for either major order: the k16 slices of one 64-wide K step.
    ``k_step_a`` / ``k_step_b``: desc_steps' k16 step of each operand; ``trans_a`` /
    ``trans_b``: 1 for an MN-major operand (the wgmma's transpose bits), else 0."""
    TL.begin(TL.WGMMA, accumulate)
    for kk in T.unroll(SWIZZLE_ROW_ELEMS // WGMMA_K):
        for h in T.unroll(m_blocks):
            T.ptx[wgmma_name(n, dtype)](
                *[acc[h * (n // 2) + i] for i in range(n // 2)],
                desc_a + T.Cast("uint64", h * DESC_M64_STEP + kk * k_step_a),
                desc_b + T.Cast("uint64", kk * k_step_b),
                T.ptx.pred(T.Or(accumulate, kk > 0)),
                1, 1, trans_a, trans_b,  # scale-a, scale-b, trans-a, trans-b (1 = MN-major)
            )


@T.inline
def tma_load_operand(Xsmem, stage, first, X, r_st, k_st, ROWS: int, BLK_K: int, mn: bool, bar,
                     mask: int):
    # one thread: ROWS rows of the operand from row r_st, K from k_st, into rows [first,
    # first + ROWS) of stage `stage` of the ring Xsmem, completing on `bar` (the caller's
    # expect_tx counts the bytes). K-major: one box X[r_st:, k_st:]; MN-major: one box per
    # 64-row chunk, X[k_st:, r_st + 64c:] (the transposed tensor's rows are K) into chunk
    # first / 64 + c. mask 0: unicast; else multicast to those CTAs of the cluster
    if mn:
        for c in T.unroll(ROWS // MN_CHUNK):
            if mask == 0:
                Tx.copy_async(Xsmem[stage, first // MN_CHUNK + c, :, :],
                              X[k_st:k_st + BLK_K, r_st + c * MN_CHUNK:r_st + (c + 1) * MN_CHUNK],
                              dispatch=H.TMA, mbar=bar)
            else:
                Tx.copy_async(Xsmem[stage, first // MN_CHUNK + c, :, :],
                              X[k_st:k_st + BLK_K, r_st + c * MN_CHUNK:r_st + (c + 1) * MN_CHUNK],
                              dispatch=H.TMA, mbar=bar, cta_mask=mask)
    else:
        if mask == 0:
            Tx.copy_async(Xsmem[stage, first:first + ROWS, :],
                          X[r_st:r_st + ROWS, k_st:k_st + BLK_K], dispatch=H.TMA, mbar=bar)
        else:
            Tx.copy_async(Xsmem[stage, first:first + ROWS, :],
                          X[r_st:r_st + ROWS, k_st:k_st + BLK_K], dispatch=H.TMA, mbar=bar,
                          cta_mask=mask)


@T.inline
def expect_stage_bytes(bar, ROWS_A: int, ROWS_B: int, BLK_K: int):
    # the bytes landing in this CTA's stage: the A tile and the whole B tile (TMA counts a
    # zero-filled box's bytes too), whichever the major order
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((ROWS_A + ROWS_B) * BLK_K * ELEM_BYTES))


# --- the activation gradient in the epilogue (v15's ACT_GRAD, a training step's backward) ---
# For y = act(a @ b.T + bias), the backward needs dz = dy * act'(z) at z = a @ b.T + bias. v15
# built with ACT_GRAD recomputes z in its accumulators (A = a, B = b, both K-major) and, in the
# epilogue, loads dy at each accumulator's place, forms dz in fp32 registers and packs it in
# the operands' dtype: one kernel instead of a GEMM writing z in fp32 and elementwise passes.
# dy and the bias come as 32-bit words of two 16-bit neighbours (int32 views: DY (M, N/2),
# bias (N/2,)): a thread's accumulator pair (columns 2(l%4), +1 of an 8-column block) is one
# word, so 64 loads a tile instead of 128, unpacked in the device function below.
# act' uses the forward epilogue's arithmetic (hopper/fused.py, --use_fast_math): gelu's Phi
# is its Abramowitz-Stegun erfc (epilogue.gelu_constants), whose exp2 term is exp(-x*x/2),
# the same factor the normal density phi needs; gelu_tanh and silu through a logistic s.
ACT_GRADS = ("gelu", "gelu_tanh", "silu")
_GC = gelu_constants()
_DACT_SRC = {
    "gelu": """
  float w = fabsf(x);
  float t = __fdividef(1.0f, fmaf(%.9ef, w, 1.0f));
  float p = fmaf(fmaf(fmaf(fmaf(%.9ef, t, %.9ef), t, %.9ef), t, %.9ef), t, %.9ef) * t;
  float g = exp2f(w * (w * -%.9ef));
  float q = p * g;
  return dy * fmaf(x * g, 0.398942280401432678f, x >= 0.0f ? 1.0f - q : q);
""" % tuple(_GC[i] for i in (0, 5, 4, 3, 2, 1, 6)),
    "gelu_tanh": """
  float x2 = x * x;
  float y = 0.79788456080286536f * (x + 0.044715f * x2 * x);
  float s = __fdividef(1.0f, 1.0f + __expf(-2.0f * y));
  float dydx = 0.79788456080286536f * fmaf(0.134145f, x2, 1.0f);
  return dy * fmaf(2.0f * x * s * (1.0f - s), dydx, s);
""",
    "silu": """
  float s = __fdividef(1.0f, 1.0f + __expf(-x));
  return dy * s * fmaf(x, 1.0f - s, 1.0f);
""",
}
_PAIR = {"float16": ("__half2", "__half22float2", "__floats2half2_rn"),
         "bfloat16": ("__nv_bfloat162", "__bfloat1622float2", "__floats2bfloat162_rn")}


def act_grad_fn(act: str, dtype: str) -> tuple[str, str]:
    """(name, CUDA source) of the device function dz2 = f(acc0, acc1, bias2, dy2): two
    neighbouring accumulators, the words holding their bias and dy values (two ``dtype``
    each), the packed word of dy * act'(acc + bias) for both."""
    if act not in ACT_GRADS:
        raise ValueError(f"no activation gradient for {act!r}: one of {', '.join(ACT_GRADS)}")
    H.check_dtype(dtype)
    pair, to_f2, from_f2 = _PAIR[dtype]
    name = f"tirx_gemm_dact_{act}_{dtype}"
    src = f"""
__device__ __forceinline__ float {name}_1(float x, float dy) {{{_DACT_SRC[act]}}}
__device__ __forceinline__ unsigned int {name}(float a0, float a1, int b2, int dy2) {{
  float2 b = {to_f2}(*reinterpret_cast<{pair}*>(&b2));
  float2 d = {to_f2}(*reinterpret_cast<{pair}*>(&dy2));
  {pair} v = {from_f2}({name}_1(a0 + b.x, d.x), {name}_1(a1 + b.y, d.y));
  return *reinterpret_cast<unsigned int*>(&v);
}}
"""
    return name, src


_ACT_GRAD_FN = {(act, dt): act_grad_fn(act, dt) for act in ACT_GRADS for dt in _PAIR}

# SwiGLU (ACT_GRAD="swiglu"): B is the fused gate/up weight (epilogue.SWIGLU_GROUP rows of gate,
# then of up, ...), so 8-column block 2t of a fragment holds gate values g and block 2t+1 the
# up values u of the same 8 outputs, at the same places (hopper/fused.py's pairing). With
# y = silu(g) * u: dg = dy * u * silu'(g), du = dy * silu(g); D (M x 2N, interleaved as the
# fused weight's rows) gets dg at g's columns and du at u's, and dy (M x N) is read as words of
# two outputs: the word of outputs 8t + 2(l%4), +1 of a fragment is one word for both.
SWIGLU_GRAD = "swiglu"


def swiglu_grad_fns(dtype: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """((name, source) of dg2 = f(g0, g1, u0, u1, dy2), (name, source) of du2 = f(g0, g1,
    dy2)): the packed words of a pair's gate and up gradients."""
    H.check_dtype(dtype)
    pair, to_f2, from_f2 = _PAIR[dtype]
    sig = "__device__ __forceinline__ float"
    common = f"""
{sig} tirx_gemm_swiglu_s(float g) {{ return __fdividef(1.0f, 1.0f + __expf(-g)); }}
"""
    dg = f"tirx_gemm_dswiglu_gate_{dtype}"
    du = f"tirx_gemm_dswiglu_up_{dtype}"
    src_g = common.replace("tirx_gemm_swiglu_s", f"{dg}_s") + f"""
__device__ __forceinline__ unsigned int {dg}(float g0, float g1, float u0, float u1, int dy2) {{
  float2 d = {to_f2}(*reinterpret_cast<{pair}*>(&dy2));
  float s0 = {dg}_s(g0), s1 = {dg}_s(g1);
  {pair} v = {from_f2}(d.x * u0 * s0 * fmaf(g0, 1.0f - s0, 1.0f),
                        d.y * u1 * s1 * fmaf(g1, 1.0f - s1, 1.0f));
  return *reinterpret_cast<unsigned int*>(&v);
}}
"""
    src_u = common.replace("tirx_gemm_swiglu_s", f"{du}_s") + f"""
__device__ __forceinline__ unsigned int {du}(float g0, float g1, int dy2) {{
  float2 d = {to_f2}(*reinterpret_cast<{pair}*>(&dy2));
  {pair} v = {from_f2}(d.x * g0 * {du}_s(g0), d.y * g1 * {du}_s(g1));
  return *reinterpret_cast<unsigned int*>(&v);
}}
"""
    return (dg, src_g), (du, src_u)


_SWIGLU_GRAD_FN = {dt: swiglu_grad_fns(dt) for dt in _PAIR}


def check_act_grad(act, a_mn: bool, b_mn: bool) -> None:
    """ACT_GRAD: None or one of :data:`ACT_GRADS`, with both operands K-major (the forward's
    a and b as saved); a one-line ValueError otherwise."""
    if act is None:
        return
    if act not in ACT_GRADS + (SWIGLU_GRAD,):
        raise ValueError(f"ACT_GRAD={act!r} must be None or one of {', '.join(ACT_GRADS)}, "
                         f"{SWIGLU_GRAD!r} (relu's gradient needs no GEMM: its mask is y > 0)")
    if a_mn or b_mn:
        raise ValueError("ACT_GRAD recomputes the forward's a @ b.T: A_MAJOR and B_MAJOR "
                         "must be 'K'")


_FENCE_U32_SRC = """
__device__ __forceinline__ void tirx_gemm_fence_u32(unsigned int& reg) {
  asm volatile("" : "+r"(reg) :: "memory");
}
"""


@T.inline
def load_dy_words(packed, n: int, DY2, row0, col0, M, N, warp_id, lane_id):
    """packed[2j+h] <- the dy word of accumulator pair (4j+2h, +1) (epilogue_act_grad's
    places; 0 past M or N), then a fence on each: the loads are issued here, before the tile's
    last wgmma wait, and complete under those wgmmas (ACT_GRAD_PREFETCH). ``packed`` is free:
    the previous tile was stored from it earlier in the K loop."""
    for j in T.unroll(n // 8):
        w = T.meta_var((col0 + 8 * j) // 2 + lane_id % 4)
        for h in T.unroll(2):
            row = T.meta_var(row0 + warp_id * 16 + lane_id // 4 + 8 * h)
            packed[2 * j + h] = T.if_then_else(T.And(row < M, w * 2 < N),
                                               T.Cast("uint32", DY2[row, w]), T.uint32(0))
    for i in T.unroll(n // 4):
        T.cuda.func_call("tirx_gemm_fence_u32", packed[i], source_code=_FENCE_U32_SRC)


@T.inline
def epilogue_act_grad(packed, acc, n: int, DY2, bias2, act, dtype, row0, col0, M, N, warp_id,
                      lane_id, prefetched: bool = False):
    """packed[2j+h] <- the two ``dtype`` values DY[r, c + e] * act'(acc[4j+2h+e] + bias[c + e])
    (e = 0, 1) of a 64 x n fragment whose first row is ``row0`` and first column ``col0``
    (wgmma's fragment: r = row0 + 16w + l//4 + 8h, c = col0 + 8j + 2(l%4)); DY2, bias2: the
    int32 views (two values a word); 0 past M or N (never stored). ``bias2`` None: z is the
    accumulator. ``prefetched``: the dy words are in ``packed`` already (load_dy_words).
    Replaces stores.pack_fragment."""
    for j in T.unroll(n // 8):
        w = T.meta_var((col0 + 8 * j) // 2 + lane_id % 4)  # the word of columns c, c + 1
        for h in T.unroll(2):
            row = T.meta_var(row0 + warp_id * 16 + lane_id // 4 + 8 * h)
            a0 = T.meta_var(acc[4 * j + 2 * h])
            a1 = T.meta_var(acc[4 * j + 2 * h + 1])
            if prefetched:
                if bias2 is not None:
                    packed[2 * j + h] = T.cuda.func_call(
                        _ACT_GRAD_FN[act, dtype][0], a0, a1,
                        T.if_then_else(w * 2 < N, bias2[w], T.int32(0)),
                        T.Cast("int32", packed[2 * j + h]),
                        source_code=_ACT_GRAD_FN[act, dtype][1], return_type="uint32")
                else:
                    packed[2 * j + h] = T.cuda.func_call(
                        _ACT_GRAD_FN[act, dtype][0], a0, a1, T.int32(0),
                        T.Cast("int32", packed[2 * j + h]),
                        source_code=_ACT_GRAD_FN[act, dtype][1], return_type="uint32")
            elif bias2 is not None:
                packed[2 * j + h] = T.if_then_else(
                    T.And(row < M, w * 2 < N),
                    T.cuda.func_call(_ACT_GRAD_FN[act, dtype][0], a0, a1, bias2[w], DY2[row, w],
                                     source_code=_ACT_GRAD_FN[act, dtype][1],
                                     return_type="uint32"),
                    T.uint32(0))
            else:
                packed[2 * j + h] = T.if_then_else(
                    T.And(row < M, w * 2 < N),
                    T.cuda.func_call(_ACT_GRAD_FN[act, dtype][0], a0, a1, T.int32(0),
                                     DY2[row, w], source_code=_ACT_GRAD_FN[act, dtype][1],
                                     return_type="uint32"),
                    T.uint32(0))


@T.inline
def epilogue_swiglu_grad(packed, acc, n: int, DY2, dtype, row0, col0, M, N, warp_id, lane_id):
    """SwiGLU's gradient over a 64 x n fragment of the fused gate/up product (n a multiple of
    16; ``col0``, ``N``: in D's 2N columns; DY2: dy's int32 view, (M, N/4) words):
    packed[2(2t)+h] <- dg of the pair (acc[8t+2h], acc[8t+2h+1]), packed[2(2t+1)+h] <- du of
    (acc[8t+4+2h], +1), from the dy word of outputs col0/2 + 8t + 2(l%4), +1; 0 past M or N
    (never stored). Replaces stores.pack_fragment."""
    for t in T.unroll(n // 16):
        w = T.meta_var((col0 // 2 + 8 * t) // 2 + lane_id % 4)  # dy's word of this pair
        for h in T.unroll(2):
            row = T.meta_var(row0 + warp_id * 16 + lane_id // 4 + 8 * h)
            g0 = T.meta_var(acc[8 * t + 2 * h])
            g1 = T.meta_var(acc[8 * t + 2 * h + 1])
            packed[4 * t + h] = T.if_then_else(
                T.And(row < M, w * 4 < N),
                T.cuda.func_call(_SWIGLU_GRAD_FN[dtype][0][0], g0, g1, acc[8 * t + 4 + 2 * h],
                                 acc[8 * t + 5 + 2 * h], DY2[row, w],
                                 source_code=_SWIGLU_GRAD_FN[dtype][0][1],
                                 return_type="uint32"),
                T.uint32(0))
            packed[4 * t + 2 + h] = T.if_then_else(
                T.And(row < M, w * 4 < N),
                T.cuda.func_call(_SWIGLU_GRAD_FN[dtype][1][0], g0, g1, DY2[row, w],
                                 source_code=_SWIGLU_GRAD_FN[dtype][1][1],
                                 return_type="uint32"),
                T.uint32(0))


# --- the forward that keeps its pre-activation (v15's ACT_SAVE, a training step's forward) ---
# torch's Linear + activation keeps z = x @ W.T + b for the backward, which is then elementwise:
# dz = dy * act'(z). ACT_SAVE stores z beside y = act(z), both from the same accumulators: the
# bias is added in fp32, z packed and TMA-stored through the staging tiles at once, then
# act(z) (the forward epilogue's device functions, hopper/fused.py) packed into the same
# registers for the overlapped store of D. One packed array: Z's store is not overlapped.
ACT_SAVES = ("relu", "gelu", "gelu_tanh", "silu")


def check_act_save(act, act_grad, a_mn: bool, b_mn: bool) -> None:
    """ACT_SAVE: None or one of :data:`ACT_SAVES`, without ACT_GRAD, both operands K-major; a
    one-line ValueError otherwise."""
    if act is None:
        return
    if act not in ACT_SAVES:
        raise ValueError(f"ACT_SAVE={act!r} must be None or one of {', '.join(ACT_SAVES)}")
    if act_grad is not None:
        raise ValueError(f"ACT_SAVE={act!r} is a forward, ACT_GRAD={act_grad!r} a backward: "
                         f"one kernel takes one of them")
    if a_mn or b_mn:
        raise ValueError("ACT_SAVE is a Linear's forward: A_MAJOR and B_MAJOR must be 'K'")


def _word_fns(dtype: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """((name, source), (name, source)): the low and the high ``dtype`` value of a 32-bit
    word, as fp32."""
    pair, to_f2, _ = _PAIR[dtype]
    return tuple((f"tirx_gemm_word_{half}_{dtype}", f"""
__device__ __forceinline__ float tirx_gemm_word_{half}_{dtype}(int w) {{
  return {to_f2}(*reinterpret_cast<{pair}*>(&w)).{xy};
}}
""") for half, xy in (("lo", "x"), ("hi", "y")))


_WORD_FN = {dt: _word_fns(dt) for dt in _PAIR}


@T.inline
def add_bias_words(acc, n: int, bias2, col0, N, lane_id, dtype):
    """acc[4j+2h+e] += bias[col0 + 8j + 2(l%4) + e] over a 64 x n fragment, the bias read
    as 32-bit words of two ``dtype`` values (``bias2``, (N/2,) int32; 0 past N): one word per
    8-column block, shared by both rows h."""
    bw = T.alloc_local((2,), ACC_DTYPE)
    for j in T.unroll(n // 8):
        w = T.meta_var((col0 + 8 * j) // 2 + lane_id % 4)
        bw[0] = T.if_then_else(w * 2 < N, T.cuda.func_call(
            _WORD_FN[dtype][0][0], bias2[w], source_code=_WORD_FN[dtype][0][1],
            return_type=ACC_DTYPE), T.float32(0))
        bw[1] = T.if_then_else(w * 2 < N, T.cuda.func_call(
            _WORD_FN[dtype][1][0], bias2[w], source_code=_WORD_FN[dtype][1][1],
            return_type=ACC_DTYPE), T.float32(0))
        for h in T.unroll(2):
            for e in T.unroll(2):
                acc[4 * j + 2 * h + e] = acc[4 * j + 2 * h + e] + bw[e]


@T.inline
def epilogue_act_save(Z, Dstage, wg, packed, acc, n: int, bias2, act, dtype, row0, col0, N,
                      bufs: int, warp_id, lane_id, tid_in_wg, bar_id):
    """Warpgroup ``wg``, a finished 64 x n fragment at (row0, col0): acc <- acc + bias
    (``bias2`` None: none), packed <- z, z TMA-stored to Z[row0:+64, col0:+n] through the
    staging tiles (stores.store_packed_tile: rows past M, columns past N clipped), then acc <-
    act(z) and packed <- act(z), for the caller's store of D. Replaces stores.pack_fragment."""
    if bias2 is not None:
        add_bias_words(acc, n, bias2, col0, N, lane_id, dtype)
    pack_fragment(packed, acc, n // 2, dtype)
    store_packed_tile(Z, Dstage, wg, packed, row0, col0, n, bufs, warp_id, lane_id, tid_in_wg,
                      bar_id)
    epilogue_bias_act(acc, n, None, act)
    pack_fragment(packed, acc, n // 2, dtype)


# --- the bias gradient's column sums (v15's ACT_GRAD_DBIAS, beside ACT_GRAD's dz) ---
# The bias's gradient is dz.sum(0): a pass over all of dz after the kernel. With ACT_GRAD_DBIAS
# the epilogue also sums each warp's 16 rows of dz per column (the packed values, as stored)
# into DBP (ceil(M/16), N) fp32, and the bias gradient is DBP.sum(0): 1/16 of dz's rows, in a
# fixed order (no atomics, no shared memory, no barrier). In wgmma's fragment the 8 lanes of
# one lane % 4 hold the same columns in the warp's 8 row pairs (g = lane // 4: rows g, g + 8),
# so the sum is over lane bits 2, 3, 4. Per 64-column chunk (8 column blocks j) a thread adds
# its two rows (16 values: 2 per block), then halves the set three times: at lane bit m (16,
# 8, 4) it keeps the blocks whose j bit (2, 1, 0) equals its own lane bit, sends the others to
# lane ^ m and adds what comes back (8 + 4 + 2 shuffles, where a full butterfly of every value
# takes 48). Lane l ends with the warp's sums of block j = l // 4, columns 8j + 2(l % 4), +1:
# the 32 lanes cover the chunk's 64 columns in order, one 8-byte store each (256 bytes a warp).
DBIAS_ROWS = 16  # rows summed into one DBP row: one warp's rows of a wgmma fragment

_HALVE_SUM_SRC = """
__device__ __forceinline__ float tirx_gemm_halve_sum(float lo, float hi, int lane, int m) {
  bool up = (lane & m) != 0;
  return (up ? hi : lo) + __shfl_xor_sync(0xffffffffu, up ? lo : hi, m);
}
"""


def check_act_grad_dbias(dbias, act, bias) -> None:
    """ACT_GRAD_DBIAS: True or False, True only with ACT_GRAD one of :data:`ACT_GRADS` and a
    BIAS (the column sums of dz are the bias's gradient); a one-line ValueError otherwise."""
    if not isinstance(dbias, bool) or (dbias and (act not in ACT_GRADS or not bias)):
        raise ValueError(f"ACT_GRAD_DBIAS={dbias!r}: True or False, True only with ACT_GRAD one "
                         f"of {', '.join(ACT_GRADS)} and a BIAS (dz's column sums are the "
                         f"bias's gradient; ACT_GRAD={act!r}, BIAS={bias!r})")


def _word_value(word, dtype: str, half: int):
    # the low (0) or high (1) ``dtype`` value of a 32-bit word, as fp32
    name, src = _WORD_FN[dtype][half]
    return T.cuda.func_call(name, word, source_code=src, return_type=ACC_DTYPE)


@T.inline
def _halve(s, pairs: int, far: int, lane_id, m: int):
    # s[2i+e] <- the sum over lanes {l, l ^ m} of the value of block i or i + far, whichever
    # lane bit m picks (i < pairs, e = 0, 1)
    for i in T.unroll(pairs):
        for e in T.unroll(2):
            s[2 * i + e] = T.cuda.func_call("tirx_gemm_halve_sum", s[2 * i + e],
                                            s[2 * (i + far) + e], lane_id, m,
                                            source_code=_HALVE_SUM_SRC, return_type=ACC_DTYPE)


@T.inline
def store_dbias_partials(DBP, packed, n: int, dtype, row0, col0, M, N, warp_id, lane_id):
    """DBP[(row0 + 16w) / 16, c] <- the sum of the 16 dz values of warp w's rows in column c,
    for the 64 x n fragment at (row0, col0) whose dz ``packed`` holds (epilogue_act_grad's
    words, rows past M 0), c < N; a warp whose rows all lie past M stores nothing. The
    shuffles run in every lane (the guards come after them)."""
    s = T.alloc_local((16,), ACC_DTYPE)
    r = T.meta_var(row0 + warp_id * DBIAS_ROWS)  # the warp's first row, a multiple of 16
    for c in T.unroll(n // 64):
        for jj in T.unroll(8):  # rows h = 0, 1 of block 8c + jj: its columns e = 0, 1
            w0 = T.meta_var(T.Cast("int32", packed[2 * (8 * c + jj)]))
            w1 = T.meta_var(T.Cast("int32", packed[2 * (8 * c + jj) + 1]))
            s[2 * jj] = _word_value(w0, dtype, 0) + _word_value(w1, dtype, 0)
            s[2 * jj + 1] = _word_value(w0, dtype, 1) + _word_value(w1, dtype, 1)
        _halve(s, 4, 4, lane_id, 16)  # j bit 2 <- lane bit 4
        _halve(s, 2, 2, lane_id, 8)   # j bit 1 <- lane bit 3
        _halve(s, 1, 1, lane_id, 4)   # j bit 0 <- lane bit 2: block j = 8c + lane // 4
        col = T.meta_var(col0 + 64 * c + 8 * (lane_id // 4) + 2 * (lane_id % 4))
        if T.And(r < M, col < N):
            T.cuda.func_call("tirx_gemm_st_global_f32x2", DBP.ptr_to([r // DBIAS_ROWS, 0]),
                             col, s[0], s[1], source_code=_ST_GLOBAL_F32X2_SRC)


# --- the bias gradient beside wgrad (v15's WGRAD_DBIAS) ---
# wgrad is D = dz.T @ x: A is dz read MN-major, reduced over the tokens, and the bias gradient
# dz.sum(0) is A @ 1, the row sums of A over K. With WGRAD_DBIAS the tiles of the first column
# of tiles (n_idx 0) issue, beside each k16 slice's m64n256k16, one m64n8k16 on the same A slice
# against a tile of ones in SMEM: its 4 accumulators a thread hold the running row sums (all 8
# columns alike), fp32, reduced over K by the tensor core in k order. No pass over dz after the
# GEMM, no atomics, the same bits every run. A tile of ones reads as ones in any layout, so the
# ones tile is one 1 KiB swizzle atom read at the same place by every k16 slice (k step 0).
ONES_TILE = (8, SWIZZLE_ROW_ELEMS)  # B of the row-sum wgmma: 8 rows (m64n8k16, the narrowest)
ONES_BYTES = ONES_TILE[0] * ONES_TILE[1] * ELEM_BYTES  # 1 KiB
ROWSUM_REGS = ONES_TILE[0] // 2  # fp32 accumulators a thread of the m64n8 row-sum wgmma


def check_wgrad_dbias(dbias, act_grad, act_save, bias, runtime_k) -> None:
    """WGRAD_DBIAS: True or False, True only for a plain GEMM (no ACT_GRAD, ACT_SAVE or BIAS:
    its D is wgrad's, A's row sums the bias's gradient) with K at run time (wgrad's build: with
    K fixed ptxas serializes the wgmmas around the branch of the row sums); a one-line
    ValueError otherwise."""
    if not isinstance(dbias, bool) or (dbias and (act_grad is not None or act_save is not None
                                                  or bias)):
        raise ValueError(f"WGRAD_DBIAS={dbias!r}: True or False, True only without ACT_GRAD, "
                         f"ACT_SAVE and BIAS (A's row sums beside a plain D = A @ B.T; "
                         f"ACT_GRAD={act_grad!r}, ACT_SAVE={act_save!r}, BIAS={bias!r})")
    if dbias and runtime_k is not True:
        raise ValueError("WGRAD_DBIAS=True needs RUNTIME_K=True (wgrad's build; with K fixed "
                         "ptxas serializes the wgmmas around the row sums' branch)")


@T.inline
def fill_ones(Ones, tid, dtype):
    # the 128 threads of one warpgroup, once: every element of the ONES_TILE tile <- 1, then
    # each writer fences its stores into the async proxy (the wgmmas read them after the CTA
    # barrier of publish_setup)
    for i in T.unroll(ONES_BYTES // ELEM_BYTES // 128):
        idx = T.meta_var(tid * (ONES_BYTES // ELEM_BYTES // 128) + i)
        Ones[idx // ONES_TILE[1], idx % ONES_TILE[1]] = T.Cast(dtype, T.float32(1))
    T.ptx.fence.proxy.async_.shared__cta()


@T.inline
def wgmma_rowsum(rs, desc_a, desc_ones, accumulate, dtype: str, k_step_a: int, trans_a: int):
    """rs (ROWSUM_REGS) <- (accumulate: +=) the row sums of the 64-row A slice ``desc_a`` over
    one 64-wide K step: wgmma_tile_major with n = 8 against the ones tile (k step 0)."""
    wgmma_tile_major(rs, desc_a, desc_ones, accumulate, 1, ONES_TILE[0], dtype, k_step_a, 0,
                     trans_a, 0)


@T.inline
def store_rowsums(DB, rs, row0, M, warp_id, lane_id):
    """DB[r] <- A's row sum of row r (fp32) for warp w's 16 rows of the 64 at row0, r < M: in
    the m64n8 fragment rs[2h] holds row 16w + l // 4 + 8h (column 2(l % 4), all alike), so
    the lanes of l % 4 == 0 store two rows each."""
    if lane_id % 4 == 0:
        for h in T.unroll(2):
            r = T.meta_var(row0 + warp_id * 16 + lane_id // 4 + 8 * h)
            if r < M:
                DB[r] = rs[2 * h]
