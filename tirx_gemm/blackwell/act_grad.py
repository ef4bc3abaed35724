"""v15's training epilogues on sm_100a: the activation gradient (ACT_GRAD), the forward keeping z (ACT_SAVE).

The keywords, their checks and the operand order are sm_90a's (tirx_gemm/hopper/layouts.py,
one home); the numpy references live in tirx_gemm.epilogue. What differs is where the tile
sits when the arithmetic runs: the accumulator is in TMEM, and tcgen05.ld gives each thread
of the epilogue warpgroup one whole output row (TMEM lane = row). So a thread reads its row
of 128 fp32 accumulators, then, per column c, in fp32 registers:

* ACT_GRAD:  z = acc + bias[c];  D = dy[row, c] * act'(z)      (operands A, B, D, DY, bias)
* ACT_SAVE:  z = acc + bias[c];  Z = z, then D = act(z)         (operands A, B, D, Z, bias)

and rounds once to the operands' dtype. DY and the bias come as sm_90a's int32 views (two
16-bit neighbours a word: DY (M, N/2), bias (N/2,)), so one caller serves both arches; here
they are read through a 16-bit view of the same memory (``T.decl_buffer`` on the word
buffer's data), one value per column, since a thread walks its row column by column. act'
is written with exp, division and compares only (NumSim models exp, not erf or tanh),
gelu's Phi from the forward's erfc fit (blackwell/fused.py). ACT_GRAD="swiglu": B is the
fused gate/up weight, so a row holds each group of 8 gate columns next to its 8 up columns
and a thread forms both gradients of a pair from one dy value (DY (M, N/4) words).
ACT_GRAD_DBIAS: the 16-row column sums of dz (sm_90a's DBP) from the staged tile, a thread
per column (:func:`store_tile_and_column_sums`).
"""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.tirx.layout import S, TileLayout, tid_in_wg

from ..helpers import ACC_DTYPE
from ..helpers import tma_store_swizzled
from ..hopper.layouts import (ACT_GRADS, ACT_SAVES, DBIAS_ROWS,  # noqa: F401 (one home)
                              SWIGLU_GRAD, check_act_grad, check_act_grad_dbias,
                              check_act_save)
from ..epilogue import SWIGLU_GROUP, SWIGLU_TILE_STEP
from .fused import _erfc_nonneg, activation

_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327   # the normal density's 1 / sqrt(2 pi)
_TANH_2C = 1.5957691216057308        # 2 sqrt(2 / pi): gelu_tanh's s = sigmoid(2y)
_TANH_3A = 0.134145                  # 3 * 0.044715: dy/dx = c (1 + 3a x^2)


def check_training(act_grad, act_save, bias, dbias, dtype: str, N: int, a_mn: bool,
                   b_mn: bool):
    """sm_90a's checks of ACT_GRAD, ACT_SAVE, ACT_GRAD_DBIAS and BIAS (the same one-line
    messages)."""
    check_act_grad(act_grad, a_mn, b_mn)
    if act_grad == SWIGLU_GRAD and (bias or N % SWIGLU_TILE_STEP):
        raise ValueError(f"ACT_GRAD='swiglu' (B the fused gate/up weight, N = {N} its rows: a "
                         f"multiple of {SWIGLU_TILE_STEP}) takes no BIAS")
    check_act_save(act_save, act_grad, a_mn, b_mn)
    check_act_grad_dbias(dbias, act_grad, bias)
    if bias and ((act_grad is None and act_save is None) or bias != dtype):
        raise ValueError(f"BIAS={bias!r}: v15 takes a bias only with ACT_GRAD or ACT_SAVE, in "
                         f"the operands' dtype ({dtype!r})")


@T.inline
def act_derivative(r, x, act: str):
    """r[0] <- act'(x) for the fp32 value x (epilogue.act_grad_np's functions), r[1] a
    scratch register holding the shared term, so each is written out once:
      gelu:      Phi(x) + x phi(x), Phi from fused.py's erfc fit (r[1] = |x|/sqrt2, then
                 erfc(r[1])/2),
                 phi = exp(-x^2/2) / sqrt(2 pi);
      gelu_tanh: s + x s (1 - s) 2c (1 + 3a x^2), r[1] = s = sigmoid(2c (x + a x^3));
      silu:      s (1 + x (1 - s)), r[1] = s = sigmoid(x)."""
    if act == "gelu":
        r[1] = T.abs(x) * T.float32(_INV_SQRT2)
        r[1] = T.float32(0.5) * _erfc_nonneg(r[1])
        r[0] = T.if_then_else(x >= T.float32(0.0), T.float32(1.0) - r[1], r[1]) \
            + x * T.float32(_INV_SQRT_2PI) * T.exp(T.float32(-0.5) * x * x)
    elif act == "gelu_tanh":
        r[1] = T.float32(1.0) / (T.float32(1.0) + T.exp(
            T.float32(0.0) - T.float32(_TANH_2C) * (x + T.float32(0.044715) * x * x * x)))
        r[0] = r[1] + x * r[1] * (T.float32(1.0) - r[1]) * T.float32(_TANH_2C) * (
            T.float32(1.0) + T.float32(_TANH_3A) * x * x)
    else:  # silu (check_act_grad admits nothing else here)
        r[1] = T.float32(1.0) / (T.float32(1.0) + T.exp(T.float32(0.0) - x))
        r[0] = r[1] * (T.float32(1.0) + x * (T.float32(1.0) - r[1]))


@T.inline
def pre_activation_row(tmem, col, n, z, bias2, has_bias: bool, dtype, n_st, N):
    """z[j] <- acc[j] + bias[n_st + j] (fp32) for this thread's row of the accumulator, TMEM
    columns [col, col + n); bias2: sm_90a's int32 view, read through its 16-bit view
    (columns past N read bias[N - 1]: their outputs lie past D's edge, the TMA store drops
    them); ``has_bias`` False: z is the accumulator."""
    z_wg = z.view(128, n, layout=TileLayout(S[(128, n): (1 @ tid_in_wg, 1)]))
    Tx.wg.copy_async(z_wg[:, :], tmem[:, col:col + n])
    T.ptx["tcgen05.wait::ld.sync.aligned"]()
    if has_bias:
        bias = T.decl_buffer((N,), dtype, data=bias2.data)
        for j in T.unroll(n):
            z[j] = z[j] + T.cast(bias[T.min(n_st + j, N - 1)], ACC_DTYPE)


@T.inline
def act_grad_row(z, n, Dout, DY2, act, dtype, row, n_st, M, N):
    """Dout[j] <- dy[row, n_st + j] * act'(z[j]) in fp32, rounded once to ``dtype``: this
    thread's row ``row`` of the tile at column ``n_st``; DY2: sm_90a's int32 view, read
    through its 16-bit view; dy is 0 past M or N (those outputs are never stored)."""
    dy = T.decl_buffer((M, N), dtype, data=DY2.data)
    r = T.alloc_local((2,), ACC_DTYPE)
    for j in T.unroll(n):
        act_derivative(r, z[j], act)
        Dout[j] = T.cast(T.if_then_else(T.And(row < M, n_st + j < N),
                                        T.cast(dy[row, n_st + j], ACC_DTYPE), T.float32(0.0))
                         * r[0], dtype)


@T.inline
def act_row(z, n, Dout, act, dtype):
    """Dout[j] <- act(z[j]) in fp32 (the forward epilogue's activation), rounded once."""
    for j in T.unroll(n):
        Dout[j] = T.cast(activation(z[j], act), dtype)


@T.inline
def swiglu_grad_row(z, n, Dout, DY2, dtype, row, n_st, M, N):
    """SwiGLU's gradient over this thread's row of the fused gate/up product (z: n columns
    from column ``n_st`` of D's N = 2 x outputs; epilogue.SWIGLU_GROUP gate columns, then as
    many up columns, per group pair): with s = sigmoid(g), Dout <- dy * u * s (1 + g (1 - s))
    at g's column and dy * g * s at u's, dy[row, o] of the pair's output o (DY2: the int32
    view of dy, (M, N/2) values; 0 past M or N), in fp32, rounded once to ``dtype``."""
    dy = T.decl_buffer((M, N // 2), dtype, data=DY2.data)
    r = T.alloc_local((2,), ACC_DTYPE)
    for t in T.unroll(n // SWIGLU_TILE_STEP):
        for e in T.unroll(SWIGLU_GROUP):
            g = T.meta_var(z[SWIGLU_TILE_STEP * t + e])
            u = T.meta_var(z[SWIGLU_TILE_STEP * t + SWIGLU_GROUP + e])
            o = T.meta_var(n_st // 2 + SWIGLU_GROUP * t + e)  # the pair's output column
            r[0] = T.if_then_else(T.And(row < M, 2 * o < N), T.cast(dy[row, o], ACC_DTYPE),
                                  T.float32(0.0))
            r[1] = T.float32(1.0) / (T.float32(1.0) + T.exp(T.float32(0.0) - g))
            Dout[SWIGLU_TILE_STEP * t + e] = T.cast(
                r[0] * u * r[1] * (T.float32(1.0) + g * (T.float32(1.0) - r[1])), dtype)
            Dout[SWIGLU_TILE_STEP * t + SWIGLU_GROUP + e] = T.cast(r[0] * g * r[1], dtype)


@T.inline
def store_tile_and_column_sums(Dout, Dsmem, D, DBP, m_st, n_st, BLK_M, BLK_N, M, N, row,
                               bar_id):
    """stores.store_tile_via_tma, and between its two barriers, while the TMA store reads the
    staged tile, the bias gradient's pieces (ACT_GRAD_DBIAS): thread ``row`` sums column
    ``row`` of the staged dz (the values as stored; rows past M hold 0) over each block of
    DBIAS_ROWS rows, in fp32, into DBP[(m_st + 16 b) / 16, n_st + row], for blocks starting
    before M and columns before N. A thread per column: no shuffles, no atomics, a fixed
    order of additions."""
    Tx.copy(Dsmem[row, 0:BLK_N], Dout[:])
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if row < 32:
        if T.cuda.elect_sync():
            tma_store_swizzled(D, Dsmem, 0, m_st, n_st, BLK_M, BLK_N)
            T.ptx.cp.async_.bulk.commit_group()
    s = T.alloc_local((1,), ACC_DTYPE)
    for b in T.unroll(BLK_M // DBIAS_ROWS):
        s[0] = T.float32(0.0)
        for r in T.unroll(DBIAS_ROWS):
            s[0] = s[0] + T.cast(Dsmem[DBIAS_ROWS * b + r, row], ACC_DTYPE)
        if T.And(m_st + DBIAS_ROWS * b < M, n_st + row < N):
            DBP[m_st // DBIAS_ROWS + b, n_st + row] = s[0]
    if row < 32:
        if T.cuda.elect_sync():
            # Dsmem may be overwritten only after the store has read it
            T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)
