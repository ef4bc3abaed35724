"""The fused epilogue: its keywords, numpy references and tolerances, in one place.

A GEMM kernel with an epilogue computes, per output element, from the fp32 accumulator
``acc = (A @ B.T)[m, n]`` (fp32 products and sums, as the tensor cores accumulate):

    D[m, n] = cast_out( act( acc + bias[n] ) )                       (BIAS / ACT)
    D[m, n] = cast_out( silu(acc_gate[m, n]) * acc_up[m, n] )        (SWIGLU)

everything after the accumulator in fp32 registers, one rounding at the end (to the input
dtype, or none for ``OUT_DTYPE="float32"``). Both arches' builders (sm_90a: registers;
sm_100a: TMEM -> registers) take the same keywords, validated by :func:`validate`:

- ``BIAS``: False, or the bias vector's dtype ("float16", "bfloat16", "float32"). The bias
  is a kernel operand named ``bias`` of shape (N,), right after D and before any workspace
  operand: the operand order is ``A, B, D, bias[, workspace]``.
- ``ACT``: None or one of :data:`ACTIVATIONS`: "relu", "gelu" (the erf form, torch's
  default ``F.gelu``), "gelu_tanh" (``F.gelu(approximate="tanh")``), "silu".
- ``OUT_DTYPE``: None (D has the input dtype) or "float32".
- ``SWIGLU``: False or True. B is then the fused gate/up weight (:func:`interleave_gate_up_np`)
  of :func:`fused_rows` (N) = 2*N rows (N a multiple of :data:`SWIGLU_GROUP`), interleaved in
  groups of SWIGLU_GROUP rows: gate rows 0..7, up rows 0..7, gate rows 8..15, up rows 8..15,
  ...; D is (M, N) and holds ``silu(acc_gate) * acc_up``. BIAS and ACT must be off.

Why groups of 8 (SWIGLU_GROUP): on sm_90a a wgmma m64nNk16 accumulator gives thread (warp w,
lane l) the columns ``8j + 2(l%4) + e`` of each 8-column block j (e in {0, 1}). With gate and
up interleaved in groups of 8 rows of B (= 8 columns of the accumulator), block 2t holds gate
columns and block 2t+1 the up columns of the same 8 outputs, at the same offsets, in the
same thread: ``out[4t+2h+e] = silu(acc[8t+2h+e]) * acc[8t+4+2h+e]``, no shuffle and no
shared memory, and the outputs come out in exactly the register layout of an accumulator of
BLK_N/2 columns, so the usual stmatrix / TMA-store path stores them. Any multiple of 8 would
keep the pairing; 8 is the smallest, so every BLK_N multiple of 16 holds whole group pairs
(a tile of BLK_N accumulator columns yields BLK_N/2 outputs), and the layout does not tie a
weight to a tile width. sm_100a's TMEM load gives a thread whole rows, where any group of 8
pairs as well.

Tolerances (:func:`tolerance`; numerics.py is the home of the plain rules and its
``compare_np`` applies these): the kernel and the reference share the accumulator up to the
fp32 summation order, then evaluate f in fp32 vs float64, then the kernel rounds once.
Per element, with rho = the relative accumulation error (below), L = max |f'| over the
reals (:data:`SLOPE`) and R = a bound on rms(acc) / rms(f(acc)) for the "random" inputs
(:data:`RMS_RATIO`: the ``atol`` is scaled by rms(ref), the error by rms(acc)):

    |out - ref| <= u_out*|ref| (output rounding)  +  L * rho * rms(acc)  +  f's fp32 error

- output rounding: numerics.tolerances(out) (2.048 u: 1e-3 float16, 8e-3 bfloat16); for a
  float32 output u = 2**-24 and the rounding term is negligible.
- rho: fp32 sums of K products in another order differ by about u32*sqrt(K) relative to
  the rms of the result (random-walk rounding; u32 = 2**-24); ACC_SLACK = 16 covers the
  tail over ~1e7 elements (a 5-sigma event is ~4 sigma-multiples of 1.2) and the blocked
  order of the tensor cores' k-groups. At K = 4096: 16*64*6e-8 = 6.1e-5 of rms(acc).
- f's fp32 error: the kernels build with --use_fast_math, so expf is __expf (ex2.approx:
  2 + 1.16|x| ulp, <= 12 ulp for the |x| <= 8 of rms-1 data) and the division approximate
  (2 ulp). gelu's erf is not erff's library form (two polynomial branches, ~30 instructions
  with the selects, sm_90a SASS) but Abramowitz and Stegun 7.1.26 on |z| (:data:`GELU_ERF`,
  :func:`gelu_erf_np`): erfc(|z|) = t*P(t)*exp(-z*z), t = 1/(1 + p|z|), branch-free, ~20
  instructions (two MUFU: the reciprocal and ex2). Its error against float64 F.gelu, with
  float32 arithmetic: at most 6.1e-7 absolute over x in [-10, 10] (the formula's 1.5e-7 on
  erf, halved by Phi = erfc/2, times x, plus float32 rounding), relative at most 1.7e-4 where
  |gelu(x)| > 1e-3 (the far negative tail, where gelu is tiny): under float16's rounding
  (4.9e-4) and bfloat16's (3.9e-3); :func:`tolerance` adds it to gelu's atol as an absolute
  term (tests/test_epilogue.py checks the bound on the float32 twin). tanhf would become tanh.approx.f32 (2**-11
  relative, as large as float16's rounding), so gelu_tanh is evaluated as
  x / (1 + exp(-2y)) (= 0.5x(1 + tanh(y)), exact algebra). FUNC_ULPS = 16 ulp of fp32
  covers these (relative, in the rtol); the atol's accumulation term covers large |x|.
So for 2-byte outputs the tolerance is the plain one plus a term ~1e-4 (the accumulation
error times the activation's slope); for float32 outputs it is the accumulation term.

Importing this module needs numpy only (TVM-free, torch-free: builders, matmul, the
simulation gate and tests import it).
"""

from __future__ import annotations

import math

import numpy as np

from tirx_gemm import numerics

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
BIAS_DTYPES = ("float16", "bfloat16", "float32")
OUT_DTYPES = ("float32",)  # OUT_DTYPE=None means the input dtype
SWIGLU_GROUP = 8           # rows of gate, then of up, per group of the fused weight
SWIGLU_TILE_STEP = 2 * SWIGLU_GROUP  # a SWIGLU tile's BLK_N: whole gate/up group pairs
KEYWORDS = ("BIAS", "ACT", "OUT_DTYPE", "SWIGLU")
PLAIN = {"BIAS": False, "ACT": None, "OUT_DTYPE": None, "SWIGLU": False}
# with KEYWORDS, what a kernel of an epilogue may carry beyond it: how v12 stages the bias
# (BIAS_SMEM) and computes its activation (ACT_APPROX); a plain kernel of the same tile drops them
WITH_EPILOGUE = KEYWORDS + ("BIAS_SMEM", "ACT_APPROX")
# v12's ACT_APPROX: the activations it computes with one MUFU (tanh.approx.f32), bfloat16 D only.
# gelu_tanh's is as accurate as cuBLASLt's epilogue over every bf16 input (lab/fused_epilogues);
# the erf gelu stays exact (its one-MUFU form is a tanh-form gelu in accuracy: a lab patch)
APPROX_ACTS = ("gelu_tanh",)


def approx_act(act: str) -> str:
    """The name of ``act``'s one-MUFU device function (hopper/fused.py), for ACT_APPROX."""
    return f"{act}_approx"

# max |f'(x)| over the reals: relu 1; gelu 1.129 (at x = 1.414..., erf form) and gelu_tanh
# 1.129 too; silu 1.0998 (at x = 2.3994); identity 1. SwiGLU's output silu(g)*u moves by
# silu'(g)*du + silu(g)*dg-ish: slope bound 1.1*|u| + |silu(g)|, taken as 3 for rms-1 inputs
SLOPE = {None: 1.0, "relu": 1.0, "gelu": 1.13, "gelu_tanh": 1.13, "silu": 1.1,
         "swiglu": 3.0}
# rms(acc) / rms(f(acc)) for acc ~ N(0, 1) ("random" inputs give rms(acc) ~ 1):
# relu 1.41, gelu 1.55, silu 1.6, swiglu ~1.9 (rms(silu(g)*u) ~ 0.52); taken as 2 with margin
RMS_RATIO = {None: 1.0, "relu": 2.0, "gelu": 2.0, "gelu_tanh": 2.0, "silu": 2.0,
             "swiglu": 2.0}
ACC_SLACK = 16.0   # rho = ACC_SLACK * u32 * sqrt(K) (module docstring)
FUNC_ULPS = 16.0   # __expf (<= 12 ulp at |x| <= 8) + an approximate division (2 ulp)
# gelu's erf (Abramowitz and Stegun 7.1.26): (p, a1, a2, a3, a4, a5), erfc(z) ~ t*(a1 + t*(a2 +
# t*(a3 + t*(a4 + t*a5)))) * exp(-z*z), t = 1/(1 + p*z), z >= 0; |error| <= 1.5e-7 on erf
GELU_ERF = (0.3275911, 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
GELU_ABS_ERR = 6.1e-7  # max |gelu_erf_np(x) - gelu(x)| over [-10, 10], float32 twin vs float64
U32 = 2.0 ** -24
DEFAULT_K = 4096   # tolerance()'s K when the caller does not name one


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be True or False")
    return bool(value)


def validate(kwargs: dict) -> dict:
    """The four epilogue keywords of ``kwargs`` (others ignored), completed with their
    defaults and checked: a one-line ValueError / TypeError names a bad value or
    combination. Returns ``{"BIAS", "ACT", "OUT_DTYPE", "SWIGLU"}``."""
    if not isinstance(kwargs, dict):
        raise TypeError(f"validate() wants a dict of builder keywords, got "
                        f"{type(kwargs).__name__}")
    out = dict(PLAIN)
    for k in KEYWORDS:
        if k in kwargs:
            out[k] = kwargs[k]
    bias = out["BIAS"]
    if bias is None or bias is False:
        out["BIAS"] = False
    elif bias is True:
        raise ValueError(f"BIAS=True: name the bias dtype instead, one of "
                         f"{', '.join(BIAS_DTYPES)} (or False)")
    elif bias not in BIAS_DTYPES:
        raise ValueError(f"BIAS={bias!r} must be False or one of {', '.join(BIAS_DTYPES)}")
    act = out["ACT"]
    if act is not None and act not in ACTIVATIONS:
        raise ValueError(f"ACT={act!r} must be None or one of {', '.join(ACTIVATIONS)}")
    od = out["OUT_DTYPE"]
    if od is not None and od not in OUT_DTYPES:
        raise ValueError(f"OUT_DTYPE={od!r} must be None (the input dtype) or one of "
                         f"{', '.join(OUT_DTYPES)}")
    out["SWIGLU"] = _check_bool("SWIGLU", out["SWIGLU"])
    if out["SWIGLU"] and (out["BIAS"] or out["ACT"] is not None):
        raise ValueError(f"SWIGLU=True takes no BIAS or ACT (got BIAS={out['BIAS']!r}, "
                         f"ACT={out['ACT']!r}): the gate's silu is the activation")
    return out


def check_epilogue_arg(epilogue) -> dict:
    """A user's ``epilogue=`` (rules.choose / explain, matmul.variants): a dict of the four
    keywords only, or a one-line error. :func:`validate` ignores other keys (builder
    keywords pass through it), so a misspelt one would be dropped and the plain kernel
    picked without a word."""
    if not isinstance(epilogue, dict):
        raise TypeError(f"epilogue={epilogue!r} must be a dict of epilogue keywords "
                        f"({', '.join(KEYWORDS)}), e.g. {{'ACT': 'relu'}}, or None")
    unknown = sorted(set(epilogue) - set(KEYWORDS), key=str)
    if unknown:
        import difflib
        near = difflib.get_close_matches(str(unknown[0]), KEYWORDS, n=1)
        raise ValueError(f"epilogue key {unknown[0]!r} is not one of {', '.join(KEYWORDS)}"
                         + (f" (did you mean {near[0]!r}?)" if near else ""))
    return epilogue


def is_plain(kwargs: dict) -> bool:
    """True when ``kwargs`` asks for no epilogue (every keyword absent or at its default)."""
    return validate(kwargs) == PLAIN


def epilogue_kwargs(kwargs: dict) -> dict:
    """Only the keywords of ``kwargs`` that differ from the plain kernel (validated): what a
    build request, a cache key or a suite entry carries."""
    v = validate(kwargs)
    return {k: v[k] for k in KEYWORDS if v[k] != PLAIN[k]}


def tag(kwargs: dict) -> str:
    """A short stable name of an epilogue, for records and file names: "plain",
    "bias_float16+gelu+out_float32", "swiglu", ..."""
    v = validate(kwargs)
    parts = []
    if v["SWIGLU"]:
        parts.append("swiglu")
    if v["BIAS"]:
        parts.append(f"bias_{v['BIAS']}")
    if v["ACT"]:
        parts.append(v["ACT"])
    if v["OUT_DTYPE"]:
        parts.append(f"out_{v['OUT_DTYPE']}")
    return "+".join(parts) or "plain"


def out_dtype(kwargs: dict, in_dtype: str) -> str:
    """D's dtype: OUT_DTYPE, or the input dtype."""
    return validate(kwargs)["OUT_DTYPE"] or numerics.check_dtype(in_dtype)


def fused_rows(N: int) -> int:
    """Rows of the fused gate/up weight for N outputs (2*N); N must be a multiple of
    SWIGLU_GROUP."""
    check_swiglu_n(N)
    return 2 * N


def check_swiglu_n(N: int) -> None:
    if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1 \
            or N % SWIGLU_GROUP:
        raise ValueError(f"SwiGLU's N={N!r} (the intermediate size) must be a positive "
                         f"multiple of {SWIGLU_GROUP} (the fused weight's group)")


def kernel_n(N: int, kwargs: dict) -> int:
    """Rows of the kernel's B operand for an output of N columns: 2*N with SWIGLU."""
    return fused_rows(N) if validate(kwargs)["SWIGLU"] else N


# ---- numpy references (float64 from the fp32 accumulator) ----------------------------------

def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # noqa: PLC0415
        return erf(x)
    except ImportError:
        return np.vectorize(math.erf, otypes=[np.float64])(x)


def gelu_constants() -> tuple:
    """The kernels' gelu constants from :data:`GELU_ERF`, folded for |x| (not z = |x|/sqrt(2))
    and for Phi's halving: (c, b1, b2, b3, b4, b5, k) with t = 1/(1 + c|x|), q/2 =
    t*(b1 + t*(b2 + ...)) * 2**(-k*x*x) (k = log2(e)/2), b_i = a_i/2."""
    p, *a = GELU_ERF
    return (p / math.sqrt(2.0), *(0.5 * ai for ai in a), 0.5 / math.log(2.0))


def gelu_erf_np(x: np.ndarray) -> np.ndarray:
    """The kernels' gelu (erf form) in float32, step for step as hopper/fused.py writes it
    (exact division and exp2, where the kernel's are within 2 ulp): x * Phi(x), Phi from
    q = erfc(|x|/sqrt(2)) / 2 by :func:`gelu_constants`: 1 - q for x >= 0, q below."""
    f = np.float32
    x = np.asarray(x, dtype=f)
    c, b1, b2, b3, b4, b5, k = (f(v) for v in gelu_constants())
    w = np.abs(x)
    t = (f(1) / (c * w + f(1))).astype(f)
    poly = (((((b5 * t + b4) * t + b3) * t + b2) * t + b1) * t).astype(f)
    q = (poly * np.exp2((w * (w * -k)).astype(f)).astype(f)).astype(f)
    return (x * np.where(x >= 0, f(1) - q, q)).astype(f)


def act_np(x: np.ndarray, act: str | None) -> np.ndarray:
    """The activation in float64 (the definitions torch uses)."""
    x = np.asarray(x, dtype=np.float64)
    if act is None:
        return x
    if act == "relu":
        return np.maximum(x, 0.0)
    if act == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if act == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if act == "silu":
        return x / (1.0 + np.exp(-x))
    raise ValueError(f"act={act!r} must be None or one of {', '.join(ACTIVATIONS)}")


def apply_np(acc: np.ndarray, bias: np.ndarray | None = None,
             act: str | None = None) -> np.ndarray:
    """act(acc + bias) in float64, returned as float32: the bias (any dtype, converted
    exactly) is added to the fp32 accumulator, then the activation; the caller rounds."""
    x = np.asarray(acc, dtype=np.float32).astype(np.float64)
    if bias is not None:
        b = np.asarray(bias).astype(np.float32).astype(np.float64)
        if b.ndim != 1 or b.shape[0] != x.shape[-1]:
            raise ValueError(f"bias of shape {b.shape} must be ({x.shape[-1]},)")
        x = x + b
    return act_np(x, act).astype(np.float32)


def swiglu_np(acc_gate: np.ndarray, acc_up: np.ndarray) -> np.ndarray:
    """silu(acc_gate) * acc_up in float64, returned as float32."""
    g = np.asarray(acc_gate, dtype=np.float32).astype(np.float64)
    u = np.asarray(acc_up, dtype=np.float32).astype(np.float64)
    if g.shape != u.shape:
        raise ValueError(f"gate {g.shape} and up {u.shape} accumulators must match")
    return (act_np(g, "silu") * u).astype(np.float32)


def interleave_gate_up_np(w_gate: np.ndarray, w_up: np.ndarray) -> np.ndarray:
    """The fused weight (2N, K) of w_gate and w_up (each (N, K)): groups of SWIGLU_GROUP
    rows, gate then up (module docstring). Its torch twin: tirx_gemm.fuse_gate_up."""
    w_gate, w_up = np.asarray(w_gate), np.asarray(w_up)
    if w_gate.ndim != 2 or w_gate.shape != w_up.shape or w_gate.dtype != w_up.dtype:
        raise ValueError(f"w_gate {w_gate.shape} {w_gate.dtype} and w_up {w_up.shape} "
                         f"{w_up.dtype} must be 2-D of one shape and dtype (N, K)")
    N, K = w_gate.shape
    check_swiglu_n(N)
    g = w_gate.reshape(N // SWIGLU_GROUP, 1, SWIGLU_GROUP, K)
    u = w_up.reshape(N // SWIGLU_GROUP, 1, SWIGLU_GROUP, K)
    return np.concatenate([g, u], axis=1).reshape(2 * N, K)


def split_gate_up_np(fused: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`interleave_gate_up_np`: (w_gate, w_up) of a fused weight."""
    fused = np.asarray(fused)
    if fused.ndim != 2 or fused.shape[0] % (2 * SWIGLU_GROUP):
        raise ValueError(f"a fused gate/up weight {fused.shape} must be 2-D with a multiple "
                         f"of {2 * SWIGLU_GROUP} rows")
    N2, K = fused.shape
    f = fused.reshape(N2 // (2 * SWIGLU_GROUP), 2, SWIGLU_GROUP, K)
    return f[:, 0].reshape(N2 // 2, K), f[:, 1].reshape(N2 // 2, K)


def reference_np(A: np.ndarray, B: np.ndarray, kwargs: dict,
                 bias: np.ndarray | None = None) -> np.ndarray:
    """The fp32 expected output (before the final rounding) of a full case: A (M, K), B the
    kernel's B operand ((N, K), or the fused (2N, K) with SWIGLU), bias (N,) when BIAS."""
    v = validate(kwargs)
    acc = numerics.reference_np(A, B)
    if v["SWIGLU"]:
        if bias is not None:
            raise ValueError("SWIGLU takes no bias")
        g, u = split_gate_up_np(acc.T)
        return swiglu_np(g.T, u.T)
    if bool(v["BIAS"]) != (bias is not None):
        raise ValueError(f"BIAS={v['BIAS']!r} but bias is "
                         f"{'missing' if bias is None else 'given'}: pass both or neither")
    return apply_np(acc, bias, v["ACT"])


def make_bias_np(N: int, dtype: str, seed: int = 0) -> np.ndarray:
    """A bias vector (N,) of ``dtype`` with rms ~0.5 (comparable to a random case's acc)."""
    if dtype not in BIAS_DTYPES:
        raise ValueError(f"bias dtype={dtype!r} must be one of {', '.join(BIAS_DTYPES)}")
    rng = np.random.default_rng(int(seed) + 7919)
    b = (rng.standard_normal(N) * 0.5).astype(np.float32)
    return b if dtype == "float32" else b.astype(numerics.np_dtype(dtype))


def tolerance(kwargs: dict, in_dtype: str, K: int = DEFAULT_K) -> numerics.Tolerances:
    """The compare tolerances of an epilogue's output (module docstring derives them):
    the output rounding of the out dtype, plus the activation's slope times the GEMM's
    accumulation error at K (times rms(acc)/rms(ref) for the atol), plus f's fp32 error."""
    v = validate(kwargs)
    numerics.check_dtype(in_dtype)
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K={K!r} must be a positive int")
    key = "swiglu" if v["SWIGLU"] else v["ACT"]
    rho = ACC_SLACK * U32 * math.sqrt(K)       # accumulation error / rms(acc)
    acc_term = SLOPE[key] * rho                # moved through f (relative to rms(acc))
    func_term = FUNC_ULPS * U32 if key is not None else 0.0
    if v["OUT_DTYPE"] == "float32":
        base_rtol = base_atol = base_rel = numerics.TOL_PER_U * U32
    else:
        t = numerics.tolerances(in_dtype)
        base_rtol, base_atol, base_rel = t.rtol, t.atol_scale, t.max_rel_err
    ratio = RMS_RATIO[key]
    # gelu's erf formula errs by an absolute amount (GELU_ABS_ERR), not by ulps: against
    # rms(acc) ~ 1 ("random" inputs), times ratio in units of rms(ref)
    formula = GELU_ABS_ERR * ratio if key == "gelu" else 0.0
    return numerics.Tolerances(
        rtol=base_rtol + func_term,
        atol_scale=base_atol + acc_term * ratio + func_term + formula,
        max_rel_err=base_rel + acc_term * ratio + func_term + formula)


def compare_np(out: np.ndarray, ref: np.ndarray, kwargs: dict, in_dtype: str,
               K: int = DEFAULT_K) -> numerics.CompareResult:
    """numerics.compare_np with :func:`tolerance` (the output rounded from ``ref``'s
    out dtype rules: a 2-byte out dtype's tolerances, or float32's)."""
    tol = tolerance(kwargs, in_dtype, K)
    ref = np.asarray(ref, dtype=np.float32)
    rms = float(np.sqrt(np.mean(np.square(ref.astype(np.float64))))) if ref.size else 0.0
    od = out_dtype(kwargs, in_dtype)
    return numerics.compare_np(np.asarray(out, dtype=np.float32), ref,
                               dtype=in_dtype if od == "float32" else od,
                               rtol=tol.rtol, atol=tol.atol_scale * rms,
                               max_rel_err=tol.max_rel_err)


# ---- v15's training epilogues (ACT_GRAD, ACT_SAVE; hgemm_v15 on both arches) -----------------
# ACT_GRAD=act: D = dy * act'(z), z = A @ B.T + bias (operands A, B, D, DY, bias); ACT_SAVE=act:
# D = act(z) and Z = z (operands A, B, D, Z, bias). DY and bias are passed as int32 views (two
# 16-bit values a word: DY (M, N/2), bias (N/2,)). torch's form of the gradient is
# tirx_gemm.op.act_grad.reference (tests/test_training_epilogue.py holds the two equal).
TRAINING_KEYWORDS = ("ACT_GRAD", "ACT_SAVE")
# ACT_GRAD's tolerance is its activation's (tolerance with ACT=act): an accumulation error in
# z moves dz by |dy| * |act''| (max |act''|: gelu 0.80, gelu_tanh 0.80, silu 0.50), for
# make_dy_np's dy (rms 0.5) within 2x of what SLOPE and RMS_RATIO allow, inside ACC_SLACK's
# 16x margin; at the simulated K the term is under 1/50 of the output rounding


def training_act(kwargs: dict) -> tuple[str, str] | None:
    """("ACT_GRAD" or "ACT_SAVE", act) of a v15 build's keywords, or None for neither."""
    for k in TRAINING_KEYWORDS:
        if kwargs.get(k) is not None:
            return k, kwargs[k]
    return None


def act_grad_np(x: np.ndarray, act: str) -> np.ndarray:
    """act'(x) in float64 for the gradients v15 fuses (gelu, gelu_tanh, silu)."""
    x = np.asarray(x, dtype=np.float64)
    if act == "gelu":
        return 0.5 * (1.0 + _erf(x / math.sqrt(2.0))) \
            + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    if act == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x ** 3))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)
    if act == "silu":
        s = 1.0 / (1.0 + np.exp(-x))
        return s * (1.0 + x * (1.0 - s))
    raise ValueError(f"no activation gradient for {act!r}: gelu, gelu_tanh or silu")


def make_dy_np(M: int, N: int, dtype: str, seed: int = 0) -> np.ndarray:
    """An upstream gradient dy (M, N) of ``dtype``, rms 0.5 (as :func:`make_bias_np`)."""
    rng = np.random.default_rng(int(seed) + 104729)
    return (rng.standard_normal((M, N)) * 0.5).astype(numerics.np_dtype(dtype))


def training_reference_np(A: np.ndarray, B: np.ndarray, kwargs: dict,
                          dy: np.ndarray | None = None,
                          bias: np.ndarray | None = None) -> dict:
    """{output name: fp32 expected value} of a v15 training build: {"D": dy * act'(z)} for
    ACT_GRAD, {"D": act(z), "Z": z} for ACT_SAVE, z = A @ B.T + bias in fp32 (bias (N,) in
    its dtype or None; dy (M, N) for ACT_GRAD). ACT_GRAD="swiglu": B is the fused gate/up
    weight (:func:`interleave_gate_up_np`'s rows), dy (M, N/2), and D holds d gate and d up
    at the gate's and the up's columns."""
    kind, act = training_act(kwargs) or (None, None)
    if kind is None:
        raise ValueError("training_reference_np: the keywords name neither ACT_GRAD nor ACT_SAVE")
    z = apply_np(numerics.reference_np(A, B), bias, None)
    if kind == "ACT_SAVE":
        return {"D": act_np(z, act).astype(np.float32), "Z": z}
    d = np.asarray(dy).astype(np.float32).astype(np.float64)
    if act == "swiglu":  # z: the fused gate/up product; dy one value per gate/up pair
        M, N2 = z.shape
        pairs = z.astype(np.float64).reshape(M, N2 // SWIGLU_TILE_STEP, 2, SWIGLU_GROUP)
        g, u = pairs[:, :, 0], pairs[:, :, 1]
        s = 1.0 / (1.0 + np.exp(-g))
        d = d.reshape(M, N2 // SWIGLU_TILE_STEP, SWIGLU_GROUP)
        dz = np.stack((d * u * s * (1.0 + g * (1.0 - s)), d * g * s), axis=2)
        return {"D": dz.reshape(M, N2).astype(np.float32)}
    return {"D": (d * act_grad_np(z, act)).astype(np.float32)}


def dbias_partials_np(dz: np.ndarray, rows: int) -> np.ndarray:
    """ACT_GRAD_DBIAS's pieces of the bias gradient: fp32 (ceil(M/rows), N), row r the column
    sums of dz's rows rows*r .. rows*r + rows - 1 (dz as stored; rows past M 0), so that
    their sum(0) is dz.sum(0). Its torch twin: tirx_gemm.op.act_grad.dbias_partials."""
    dz = np.asarray(dz, dtype=np.float32)
    M, N = dz.shape
    pad = np.zeros((-(-M // rows) * rows, N), dtype=np.float64)
    pad[:M] = dz
    return pad.reshape(-1, rows, N).sum(1).astype(np.float32)


def training_compare_np(out: np.ndarray, ref: np.ndarray, kwargs: dict, name: str,
                        in_dtype: str, K: int = DEFAULT_K) -> numerics.CompareResult:
    """One output of a training build against :func:`training_reference_np`'s: Z (no
    function after the accumulator) at the plain epilogue's tolerance, D at its activation's
    (for ACT_GRAD: the note at TRAINING_KEYWORDS)."""
    _, act = training_act(kwargs)
    if act == "swiglu":
        return compare_np(out, ref, {"SWIGLU": True}, in_dtype, K)
    return compare_np(out, ref, {"ACT": None if name == "Z" else act}, in_dtype, K)
