"""v9's fused epilogue: chunk sizes, exp-only activations, the bias/act/SwiGLU fill (without_operand: helpers)."""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.tirx.layout import S, TileLayout, tid_in_wg

from ..helpers import ACC_DTYPE, without_operand  # noqa: F401 (re-exported)


# --- the fused epilogue: bias, activation, SwiGLU, fp32 output ---
# The keywords and their numpy references live in tirx_gemm.epilogue (one home for both
# arches); these verbs are where the tile sits when each operation runs on sm_100a:
# TMEM --tcgen05.ld--> fp32 registers (one output row per thread) --bias, activation or
# silu(gate)*up, in fp32--> cast to D's dtype --> swizzled Dsmem --TMA store--> GMEM
# (the store: stores.py's store_rows_box_via_tma).
EPI_ROW_BYTES = 128  # a staged chunk row is one 128-byte swizzle atom (TMA's widest box)


TMEM_READ_N = 64  # accumulator columns per tcgen05.ld in the fused epilogue


def epilogue_chunks(out_dtype: str, swiglu: bool) -> tuple[int, int, int]:
    """(OUT_N, OUT_STEP, READS): a step of the fused epilogue reads READS x TMEM_READ_N
    accumulator columns (64 per tcgen05.ld, as the plain epilogue) into OUT_STEP outputs
    (SwiGLU: two columns per output), staged and stored in chunks of OUT_N columns, one
    128-byte swizzle atom per row (64 16-bit or 32 fp32 values).
    Why never narrower loads: ptxas sizes the kernel's entry register count by the code's
    demand, and a 32-column epilogue needed only ~44 at 384 threads, less than the 168
    the 56/224 setmaxnreg split needs, so the epilogue's setmaxnreg.inc could never be
    granted (the build refuses it: compile/regbudget.py; NumSim does not model it)."""
    out_bytes = 4 if out_dtype == "float32" else 2
    OUT_N = EPI_ROW_BYTES // out_bytes
    per_read = TMEM_READ_N // 2 if swiglu else TMEM_READ_N
    READS = max(1, OUT_N // per_read)
    return OUT_N, READS * per_read, READS


# erfc(z) for z >= 0 as t * exp(-z^2 + P(t)), t = 1 / (1 + z/2): the Chebyshev fit of
# Numerical Recipes' erfcc (Press et al., 2nd ed., section 6.2), fractional error below
# 1.2e-7 for every z >= 0 (a relative bound, so the tail Phi(x) of a negative x keeps it)
_ERFC_P = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
           -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def _erfc_nonneg(z):
    t = T.float32(1.0) / (T.float32(1.0) + T.float32(0.5) * z)
    p = T.float32(_ERFC_P[-1])
    for c in reversed(_ERFC_P[:-1]):
        p = T.float32(c) + t * p
    return t * T.exp(p - z * z)


def activation(x, act):
    """act(x) as a TIR expression of the fp32 value x (the functions torch computes:
    tirx_gemm.epilogue.act_np), written with exp, division and compares only: NumSim
    models tirx.exp but has no erf or tanh (the precise erff / tanhf), and exp is
    what the GPU evaluates fastest.
      gelu:      x * Phi(x), Phi(x) = 1 - erfc(x/sqrt2)/2 (x >= 0) or erfc(-x/sqrt2)/2,
                 erfc to 1.2e-7 relative (above);
      gelu_tanh: 0.5 x (1 + tanh(y)) = x * sigmoid(2y) = x / (1 + exp(-2y)),
                 y = sqrt(2/pi) (x + 0.044715 x^3): the same function, no tanh;
      silu:      x / (1 + exp(-x)).
    nvcc builds with --use_fast_math, so exp is __expf and / the approximate division:
    a few ulp of fp32 for moderate |x| (the 2-byte outputs round off far more)."""
    if act is None:
        return x
    if act == "relu":
        return T.max(x, T.float32(0.0))
    if act == "gelu":
        e = _erfc_nonneg(T.abs(x) * T.float32(0.7071067811865476))
        half_e = T.float32(0.5) * e
        return x * T.if_then_else(x >= T.float32(0.0), T.float32(1.0) - half_e, half_e)
    if act == "gelu_tanh":
        y2 = T.float32(1.5957691216057308) * (x + T.float32(0.044715) * x * x * x)
        return x / (T.float32(1.0) + T.exp(T.float32(0.0) - y2))
    if act == "silu":
        return x / (T.float32(1.0) + T.exp(T.float32(0.0) - x))
    raise ValueError(f"ACT={act!r} must be None or relu, gelu, gelu_tanh, silu")


def fused_epilogue_chunk(act, bias_dtype, swiglu: bool, group: int, READS: int,
                         out_dtype: str):
    """The @T.inline verb that fills one step's registers (``Dout``: OUT_STEP values of
    ``out_dtype``) of this thread's output row from accumulator columns [col, col +
    READS * READ_N): per TMEM load, READ_N = TMEM_READ_N fp32 values; then, in fp32, either
    act(acc + bias[n]) (``bias_dtype`` False: no bias) or, with ``swiglu``, the pairs of
    ``group`` gate columns followed by ``group`` up columns -> silu(gate) * up; then one
    rounding to ``out_dtype``. ``n_out`` is the step's first output column; bias columns
    past N read bias[N - 1] (their outputs lie past D's edge, the TMA store drops them)."""
    READ_N = TMEM_READ_N
    OUT_PER_READ = READ_N // 2 if swiglu else READ_N
    HAS_BIAS = bool(bias_dtype)

    @T.inline
    def fill(tmem, col, Dout, bias, n_out, N):
        for r in T.unroll(READS):
            acc = T.alloc_local((READ_N,), ACC_DTYPE)
            acc_wg = acc.view(128, READ_N, layout=TileLayout(S[(128, READ_N): (1 @ tid_in_wg, 1)]))
            Tx.wg.copy_async(acc_wg[:, :], tmem[:, col + r * READ_N:col + (r + 1) * READ_N])
            T.ptx["tcgen05.wait::ld.sync.aligned"]()
            if swiglu:
                # accumulator columns 2*group*t + [0, group) are gate, + [group, 2*group)
                # up, of outputs group*t + [0, group): a thread holds both of each pair
                for j in T.unroll(OUT_PER_READ):
                    g = T.meta_var(acc[(j // group) * 2 * group + j % group])
                    u = T.meta_var(acc[(j // group) * 2 * group + group + j % group])
                    Dout[r * OUT_PER_READ + j] = T.cast(activation(g, "silu") * u, out_dtype)
            elif HAS_BIAS:
                for j in T.unroll(READ_N):
                    b = T.meta_var(bias[T.min(n_out + r * READ_N + j, N - 1)])
                    Dout[r * READ_N + j] = T.cast(
                        activation(acc[j] + T.cast(b, ACC_DTYPE), act), out_dtype)
            else:
                for j in T.unroll(READ_N):
                    Dout[r * READ_N + j] = T.cast(activation(acc[j], act), out_dtype)

    return fill
