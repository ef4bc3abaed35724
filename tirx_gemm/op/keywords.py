"""What every kernel matmul builds has, whichever rule picked it (pure Python: no torch, no
TVM): the problem checks, a step's base builder keywords (:func:`step_kwargs`: dtype, the
persistent pool, M and N, K at run time) and the shape a kernel is built at
(:func:`build_shape`). tirx_gemm.op.rules picks the step and adds the rest.
"""

from __future__ import annotations

from tirx_gemm import registry
from tirx_gemm.kernels import dtype_kwargs
from tirx_gemm.numerics import check_dtype

ROW_MULTIPLE = 8  # TMA: a row (K or N elements of 2 bytes) is a multiple of 16 bytes

# v9's output tile per cluster of two CTAs, (rows, columns), on each arch: sm_90a pairs
# two 128x256 CTA tiles vertically; sm_100a's CTA pair with two MMA consumers covers 512x256
V9_CLUSTER_TILE = {"sm_90a": (256, 256), "sm_100a": (512, 256)}
CLUSTER_SIZE = 2  # CTAs per v9 cluster: the pool (SM_COUNT) must be a multiple of it
DATA_PARALLEL = "v9"
SPLIT_K = "v11"
TILE_MENU = "v12"
PINGPONG = "v10"  # sm_90a's ping-pong step: BIAS and ACT only (rules.V10_KEYWORDS)
# steps built with RUNTIME_M=True: one kernel per (step, keywords, dtype, N, K) serves every
# M (sm_100a's runtime-M builds of v9 and v11 are checked on NumSim)
RUNTIME_M_STEPS = {"sm_90a": frozenset({"v9", "v10", "v11", "v12"}),
                   "sm_100a": frozenset({"v9", "v11"})}
NOMINAL_M = 128  # the M a runtime-M kernel is built, cached and exported at
# v12 can take N and K at run time too (one kernel per tile and dtype, built at NOMINAL_N
# and NOMINAL_K); rules.py keeps it only where it measured level (lab/static_n_k_builds)
RUNTIME_NK_STEPS = {"sm_90a": frozenset({"v12"})}
# one-CTA kernels built with their TMA descriptors prefetched at entry (a CTA pair takes
# TVM's defaults: rules.py drops it there); lab/static_n_k_builds measured it
PREFETCH_MAPS_STEPS = {"sm_90a": frozenset({"v12"})}
NOMINAL_N, NOMINAL_K = 256, 256
# arches whose v12 menu matmul chooses from with the cost model (fitted to the H200); sm_100a's
# v12 has no model yet, so matmul keeps v9 / v11 there
MENU_ARCHES = frozenset({"sm_90a"})
# v11's split counts, rounded down to this menu, so that the splits over all M of one (N, K)
# are a handful of kernels. No multiple of the build's L2_GROUP: with M at run time TVM would
# fold the tile order's unreachable `% tail` into a division by zero at compile time.
SPLIT_MENU = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)
V11_L2_GROUP = {"sm_90a": 16, "sm_100a": 8}  # v11's builder default per arch
# steps whose builders take the fused-epilogue keywords (tirx_gemm.epilogue), per arch
EPILOGUE_STEPS = {"sm_90a": frozenset({"v12", "v10"})}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def dtype_name(dtype) -> str:
    """A dtype's name: a string as given, a torch dtype (torch.bfloat16) by its name, without
    importing torch; anything else as given (the checks then refuse it)."""
    if isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if type(dtype).__module__ == "torch" and text.startswith("torch."):
        return text[len("torch."):]
    return dtype


INT32_MAX = 2**31 - 1  # the kernels' index math: int32 element offsets (compile.api)


def check_index_limits(M: int, N: int, K: int) -> None:
    """A one-line ValueError when an operand or the result of an MxNxK GEMM holds more than
    2^31-1 elements, past the int32 element offsets of the kernels' index math (a runtime-M
    kernel would compute wrong addresses, not fail): the same limit as ``build --mnk``
    and the suites (compile.api.check_shape_limits), with the way to split the call."""
    for name, v in (("M*K", M * K), ("M*N", M * N), ("N*K", N * K)):
        if v > INT32_MAX:
            split = (f"split b (the weight) along N into parts of at most "
                     f"{INT32_MAX // K} rows" if name == "N*K" else
                     f"split a along M into calls of at most {INT32_MAX // max(N, K)} rows")
            raise ValueError(f"{M}x{N}x{K}: {name}={v} elements exceeds 2^31-1, the limit of "
                             f"the kernels' int32 index math; {split}")


def _check_problem(M, N, K, dtype, arch, sm_count) -> None:
    if arch not in V9_CLUSTER_TILE:
        raise ValueError(f"arch={arch!r}: matmul runs on {' or '.join(V9_CLUSTER_TILE)}")
    for name, v in (("M", M), ("N", N), ("K", K), ("sm_count", sm_count)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")
    check_index_limits(M, N, K)
    for name, v in (("N", N), ("K", K)):
        if v % ROW_MULTIPLE:
            raise ValueError(f"{name}={v} is not a multiple of {ROW_MULTIPLE}: TMA needs "
                             f"16-byte row strides ({ROW_MULTIPLE} fp16/bf16 elements); pad "
                             f"{name} with zeros to a multiple of {ROW_MULTIPLE}")
    check_dtype(dtype)


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


def _registered(step_id: str, arch: str) -> registry.Step | None:
    return next((s for s in registry.all_steps(arch) if s.id == step_id), None)


# The bias staged in shared memory by a producer warp (v12's BIAS_SMEM): faster than the register
# path with the same bits where lab/fused_epilogues checked and timed it (its figures live there);
# these are those epilogues and tiles (silu spills at 128 x 256; relu, fp32 D and the decode
# tiles were not timed).
BIAS_SMEM_ACTS = (None, "gelu", "gelu_tanh")
BIAS_SMEM_MIN_BLK_N = 128


def bias_smem(epi: dict, blk_n: int) -> dict:
    """{"BIAS_SMEM": True} for a v12 bias epilogue it was measured for, else {}."""
    on = (bool(epi.get("BIAS")) and epi.get("ACT") in BIAS_SMEM_ACTS
          and not epi.get("OUT_DTYPE") and not epi.get("SWIGLU") and blk_n >= BIAS_SMEM_MIN_BLK_N)
    return {"BIAS_SMEM": True} if on else {}


# gelu_tanh with one MUFU (v12's ACT_APPROX): as accurate as cuBLASLt's epilogue over every bf16
# input and faster than the exact form at the tiles lab/fused_epilogues timed (its figures live
# there), with and without a bias; bfloat16 D only (tanh.approx's 2**-11 is under its rounding).
# The erf gelu stays exact. Narrower (decode) tiles were not timed.
ACT_APPROX_ACTS = ("gelu_tanh",)
ACT_APPROX_MIN_BLK_N = 128


def act_approx(epi: dict, blk_n: int, dtype: str) -> dict:
    """{"ACT_APPROX": True} for a v12 bfloat16 epilogue whose activation it was measured for,
    else {}."""
    on = (epi.get("ACT") in ACT_APPROX_ACTS and dtype_name(dtype) == "bfloat16"
          and not epi.get("OUT_DTYPE") and not epi.get("SWIGLU") and blk_n >= ACT_APPROX_MIN_BLK_N)
    return {"ACT_APPROX": True} if on else {}


def epilogue_picks(epi: dict, blk_n: int, dtype: str) -> dict:
    """The v12 keywords of how an epilogue runs at a BLK_N-wide tile (:func:`bias_smem`,
    :func:`act_approx`), beside what it computes (``epi``)."""
    return {**bias_smem(epi, blk_n), **act_approx(epi, blk_n, dtype)}


def epilogue_picks_why(kw: dict) -> str:
    """What :func:`epilogue_picks` added to a plan's keywords ``kw``, as the end of the epilogue
    rule's line in ``explain`` (empty when it added nothing)."""
    said = [text for key, text in (("BIAS_SMEM", "the bias staged in shared memory (BIAS_SMEM)"),
                                   ("ACT_APPROX", f"{kw.get('ACT')} with one MUFU (ACT_APPROX)"))
            if kw.get(key)]
    return f"; {' and '.join(said)}, as measured in lab/fused_epilogues" if said else ""
