"""The fused epilogue in registers: bias, activation and SwiGLU on the fp32 fragment, before the cast."""

from __future__ import annotations

from tvm.script import tirx as T

from tirx_gemm.epilogue import gelu_constants  # shared: no TVM, numpy only
from ..helpers import ACC_DTYPE

# --- the fused epilogue on the fp32 accumulator fragment, in registers, before
# the cast (the keywords, references and tolerances: tirx_gemm/epilogue.py). Each
# activation is one device function of one fp32 value. The build passes --use_fast_math:
# expf is then ex2.approx based (__expf, 2 + 1.16|x| ulp; written out below) and x / y
# takes __fdividef (2 ulp; 0 once y > 2**126, where silu's true value is below 1e-36 anyway).
# gelu's erf is Abramowitz-Stegun 7.1.26 (epilogue.GELU_ERF, folded by gelu_constants; its
# error bound against float64 is in tirx_gemm/epilogue.py): branch-free, erfc's exp as one
# exp2f (MUFU.EX2) and its reciprocal one MUFU.RCP, no erff; and
# tanhf becomes tanh.approx.f32 (MUFU.TANH,
# 2**-11 relative: as large as fp16's rounding), so gelu_tanh is written without tanh:
# 0.5x(1 + tanh(y)) = x / (1 + exp(-2y)), exact algebra, the error of silu's form
GELU_CONSTANTS = gelu_constants()
_ACT_FN = {
    "relu": ("tirx_gemm_act_relu", """
__device__ __forceinline__ float tirx_gemm_act_relu(float x) { return fmaxf(x, 0.0f); }
"""),
    "gelu": ("tirx_gemm_act_gelu", """
__device__ __forceinline__ float tirx_gemm_act_gelu(float x) {
  float w = fabsf(x);
  float t = __fdividef(1.0f, fmaf(%.9ef, w, 1.0f));
  float p = fmaf(fmaf(fmaf(fmaf(%.9ef, t, %.9ef), t, %.9ef), t, %.9ef), t, %.9ef) * t;
  float q = p * exp2f(w * (w * -%.9ef));
  return x * (x >= 0.0f ? 1.0f - q : q);
}
""" % tuple(GELU_CONSTANTS[i] for i in (0, 5, 4, 3, 2, 1, 6))),
    "gelu_tanh": ("tirx_gemm_act_gelu_tanh", """
__device__ __forceinline__ float tirx_gemm_act_gelu_tanh(float x) {
  float y = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return __fdividef(x, 1.0f + __expf(-2.0f * y));
}
"""),
    "silu": ("tirx_gemm_act_silu", """
__device__ __forceinline__ float tirx_gemm_act_silu(float x) {
  return __fdividef(x, 1.0f + __expf(-x));
}
"""),
}
# ACT_APPROX (v12, bf16 D; epilogue.APPROX_ACTS): gelu with one MUFU, 0.5x(1 + tanh.approx(y)),
# y = x(A + Bx^2); tanh.approx.f32 errs by up to 2**-11 relative to tanh (its error over every
# bf16 input against float64: lab/fused_epilogues, the gelu error sweep)
_GELU_APPROX = """
__device__ __forceinline__ float %s(float x) {
  float y = x * fmaf(%.9ef, x * x, %.9ef);
  float t;
  asm("tanh.approx.f32 %%0, %%1;" : "=f"(t) : "f"(y));
  float h = 0.5f * x;
  return fmaf(h, t, h);
}
"""
GELU_TANH_AB = (0.79788456080286536 * 0.044715, 0.79788456080286536)  # (B, A): sqrt(2/pi)
_ACT_FN["gelu_tanh_approx"] = ("tirx_gemm_act_gelu_tanh_approx", _GELU_APPROX % (
    ("tirx_gemm_act_gelu_tanh_approx",) + GELU_TANH_AB))


@T.inline
def load_bias_fragment(bvals, n: int, bias, col0, N, lane_id):
    """bvals[2j+e] <- bias[col0 + 8j + 2(l%4) + e] as fp32 (0 past N): the n/4 bias values
    of this thread's columns of a 64 x n fragment, loaded once per tile (both rows h of a
    thread share a column). Called before the tile's last wgmma wait, so the loads (L2
    hits, issued back to back) are in flight while the last wgmmas run, not after them."""
    for j in T.unroll(n // 8):
        for e in T.unroll(2):
            col = T.meta_var(col0 + 8 * j + 2 * (lane_id % 4) + e)
            bvals[2 * j + e] = T.if_then_else(col < N, T.Cast(ACC_DTYPE, bias[col]),
                                              T.float32(0))


@T.inline
def epilogue_bias_act(acc, n: int, bvals, act):
    """acc[4j+2h+e] <- act(acc[4j+2h+e] + bvals[2j+e]) over a 64 x n fragment, the bias
    values from :func:`load_bias_fragment` (column 8j + 2(l%4) + e of the fragment).
    ``bvals`` None: no bias; ``act`` None: no activation."""
    for j in T.unroll(n // 8):
        for e in T.unroll(2):
            for h in T.unroll(2):
                if bvals is not None:
                    if act is not None:
                        acc[4 * j + 2 * h + e] = T.cuda.func_call(
                            _ACT_FN[act][0], acc[4 * j + 2 * h + e] + bvals[2 * j + e],
                            source_code=_ACT_FN[act][1], return_type=ACC_DTYPE)
                    else:
                        acc[4 * j + 2 * h + e] = acc[4 * j + 2 * h + e] + bvals[2 * j + e]
                else:
                    acc[4 * j + 2 * h + e] = T.cuda.func_call(
                        _ACT_FN[act][0], acc[4 * j + 2 * h + e],
                        source_code=_ACT_FN[act][1], return_type=ACC_DTYPE)


@T.inline
def load_bias_rows(bvals, bias, r_st, N, warp_id, lane_id):
    """bvals[h] <- bias[r_st + 16w + l/4 + 8h] as fp32 (0 past N): a swap-AB fragment's bias
    (SWAP_AB: fragment rows are D's columns, so the bias runs along the rows; each thread
    holds two rows, h = 0, 1, of its warp's 16)."""
    for h in T.unroll(2):
        r = T.meta_var(r_st + warp_id * 16 + lane_id // 4 + 8 * h)
        bvals[h] = T.if_then_else(r < N, T.Cast(ACC_DTYPE, bias[r]), T.float32(0))


@T.inline
def epilogue_bias_act_rows(acc, n: int, bvals, act):
    """acc[4j+2h+e] <- act(acc[4j+2h+e] + bvals[h]) over a 64 x n swap-AB fragment, the
    bias of fragment row h from :func:`load_bias_rows`; ``act`` None: no activation."""
    for j in T.unroll(n // 8):
        for e in T.unroll(2):
            for h in T.unroll(2):
                if act is not None:
                    acc[4 * j + 2 * h + e] = T.cuda.func_call(
                        _ACT_FN[act][0], acc[4 * j + 2 * h + e] + bvals[h],
                        source_code=_ACT_FN[act][1], return_type=ACC_DTYPE)
                else:
                    acc[4 * j + 2 * h + e] = acc[4 * j + 2 * h + e] + bvals[h]


@T.inline
def epilogue_bias_band(band, bias, q0, q1, m_st, n_st, row_off, ROWS, COLS, BAND_ITERS, tid,
                       transposed: bool):
    """v12's K split: the bias added to this thread's reduced chunks of a 64-row half before
    helpers.splitk_store_band stores them (its element map: chunk q = q0 + tid + 128 i holds
    rows row_off + 16w + l//4 + 8h, columns 8j + 2(l%4) + e, j = q // 128, t = q % 128 =
    32w + l). The bias runs along D's columns: the tile's columns, or (``transposed``, swap-AB)
    its rows; elements past ROWS or COLS get none (they are not stored)."""
    for i in T.unroll(BAND_ITERS):
        q = T.meta_var(q0 + i * 128 + tid)
        if q < q1:
            t = T.meta_var(q % 128)
            for h in T.unroll(2):
                r = T.meta_var(m_st + row_off + t // 32 * 16 + t % 32 // 4 + 8 * h)
                for e in T.unroll(2):
                    c = T.meta_var(n_st + q // 128 * 8 + t % 32 % 4 * 2 + e)
                    at = T.meta_var(r if transposed else c)
                    band[i * 4 + 2 * h + e] = band[i * 4 + 2 * h + e] + T.if_then_else(
                        at < (ROWS if transposed else COLS), T.Cast(ACC_DTYPE, bias[at]),
                        T.float32(0))


@T.inline
def load_bias_tile_smem(bias_s, stage, n: int, bias, col0, N, lane_id):
    """bias_s[stage, c] <- bias[col0 + c] as fp32 (0 past N), c < n: one warp (lane l takes
    c = 32i + l) copies a tile's bias into a shared buffer the consumers' epilogue reads
    (BIAS_SMEM: loaded once per tile by a producer warp, ahead of the tile's last wgmmas)."""
    for i in T.unroll(n // 32):
        col = T.meta_var(col0 + 32 * i + lane_id)
        bias_s[stage, 32 * i + lane_id] = T.if_then_else(col < N, T.Cast(ACC_DTYPE, bias[col]),
                                                         T.float32(0))
    if n % 32 > 0:  # the last n % 32 columns (n a multiple of 8)
        if lane_id < n % 32:
            col = T.meta_var(col0 + n // 32 * 32 + lane_id)
            bias_s[stage, n // 32 * 32 + lane_id] = T.if_then_else(
                col < N, T.Cast(ACC_DTYPE, bias[col]), T.float32(0))


@T.inline
def epilogue_bias_act_smem(acc, n: int, bias_s, stage, lane_id, act):
    """:func:`epilogue_bias_act` with the bias values read from the shared buffer
    ``bias_s[stage, :]`` (:func:`load_bias_tile_smem`), column 8j + 2(l%4) + e of the
    fragment: no bias registers live across the tile's last wgmma wait."""
    for j in T.unroll(n // 8):
        for e in T.unroll(2):
            for h in T.unroll(2):
                b = T.meta_var(bias_s[stage, 8 * j + 2 * (lane_id % 4) + e])
                if act is not None:
                    acc[4 * j + 2 * h + e] = T.cuda.func_call(
                        _ACT_FN[act][0], acc[4 * j + 2 * h + e] + b,
                        source_code=_ACT_FN[act][1], return_type=ACC_DTYPE)
                else:
                    acc[4 * j + 2 * h + e] = acc[4 * j + 2 * h + e] + b


@T.inline
def epilogue_swiglu(acc, n: int):
    """SwiGLU on a 64 x n fragment of the fused gate/up weight (groups of 8 columns: gate,
    up, gate, ...; epilogue.SWIGLU_GROUP): 8-column block 2t holds the gate and block 2t+1
    the up values of the same 8 outputs at the same places, so
    acc[4t+2h+e] <- silu(acc[8t+2h+e]) * acc[8t+4+2h+e]. The n/4 results fill acc's first
    registers in the fragment layout of a 64 x n/2 accumulator (in place: register 4t+k is
    written only after 8t'+k' = 4t+k was read, t' < t)."""
    for t in T.unroll(n // 16):
        for k in T.unroll(4):
            acc[4 * t + k] = T.cuda.func_call(
                _ACT_FN["silu"][0], acc[8 * t + k], source_code=_ACT_FN["silu"][1],
                return_type=ACC_DTYPE) * acc[8 * t + 4 + k]
