"""``tirx_gemm.matmul(a, b)``: the steps' GEMM for PyTorch users.

``matmul(a, b)`` returns ``a @ b.T`` for 2-D CUDA fp16 or bf16 tensors, with a an MxK matrix
(tokens x in-features) and b an NxK matrix (out-features x in-features, the layout of a
``torch.nn.Linear`` weight): the steps' product D = A @ B.T, i.e. ``F.linear(a, b)`` without
bias. It accumulates in fp32 and returns the inputs' dtype.

How a call runs:

1. :func:`check_operands` refuses what no step can take, in one line that says what to do
   (TypeError for a wrong type or dtype, ValueError for the rest);
2. :func:`choose` picks a step and its builder keywords for the shape on this GPU's arch
   (``step=`` overrides it);
3. the kernel is built here on first use (the build cache keeps it on disk across
   processes) or, on a GPU host without TVM, read from a bundle made by ``tirx-gemm export``
   (:func:`use_bundle` or ``$TIRX_GEMM_BUNDLE``); the loaded kernel is kept for the process,
   keyed by step, arch, shape, keywords, bundle and device;
4. it launches, asynchronously, into ``out`` or a fresh tensor; ``sync=True`` or
   :func:`synchronize` waits through the host hang guard.

Steps 1-3 run on the first call of a (shape, dtype, device, step); the call is then
remembered, and later calls of it check only what can change between calls and launch.
On sm_90a, matmul's kernels take M at run time (RUNTIME_M_STEPS; on sm_100a v9 only, checked
on NumSim): one kernel per (step, keywords, dtype, N, K) serves every token count;
:func:`variants` lists what a layer's (N, K) needs over all M, which is what
``tirx-gemm export --suite`` puts in a bundle.

The module is callable, so ``import tirx_gemm; tirx_gemm.matmul(a, b)`` and
``tirx_gemm.matmul.use_bundle(path)`` both work. Importing it imports neither torch nor TVM:
:func:`choose` and the suite planning (tirx_gemm.suite) run on a build machine without torch.
Not autograd-aware: inputs that require grad are refused while grad mode is on. The kernel
runs on the stream apache-tvm-ffi uses for torch tensors (torch's current stream; CUDA
graph capture records it).

Fused epilogues (issue 28; the rules and references: tirx_gemm/epilogue.py):
``matmul(a, b, bias=..., activation=..., out_dtype=...)`` computes
``act(a @ b.T + bias)`` in one kernel, on the fp32 accumulator before the cast, and
:func:`swiglu` computes ``silu(a @ w_gate.T) * (a @ w_up.T)`` from one GEMM over the fused
gate/up weight (:func:`fuse_gate_up`; fuse once per model and pass ``fused=``). v12
(sm_90a's tile menu) builds every epilogue and v10 (ping-pong) BIAS and ACT; v9 and v11
have none, so :func:`choose` routes a call with an epilogue to v12's best tile
(``chooser.best_tile``), or to v10 where ``chooser.epilogue_step`` says so (only once
``chooser.EPILOGUE_STEP`` is set to "v10"; off until measured). ``step="v10"`` or
``step="v12"`` forces one of them; ``step="v9"`` with an epilogue is refused. On sm_100a matmul has no epilogue kernels yet (refused in one line).
:func:`variants` takes the same ``epilogue`` (builder keywords) to list a layer's kernels.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from pathlib import Path

from tirx_gemm import epilogue as E
from tirx_gemm import registry, spec, splitk
from tirx_gemm.kernels import dtype_kwargs, kernel_for
from tirx_gemm.numerics import DTYPES, check_dtype

__all__ = ["matmul", "swiglu", "fuse_gate_up", "epilogue_kwargs",
           "synchronize", "choose", "variants", "step_kwargs", "runtime_m",
           "build_shape", "bare_launch", "check_operands", "use_bundle", "bundle_path", "kernel_source",
           "clear_cache", "BUNDLE_ENV"]

BUNDLE_ENV = "TIRX_GEMM_BUNDLE"
ROW_MULTIPLE = 8  # TMA: a row (K or N elements of 2 bytes) is a multiple of 16 bytes
ALIGN_BYTES = 16  # TMA and 16-byte vector copies: every operand's base address

# v9's output tile per cluster of two CTAs, (rows, columns), on each arch: sm_90a pairs
# two 128x256 CTA tiles vertically; sm_100a's CTA pair with two MMA consumers covers 512x256
V9_CLUSTER_TILE = {"sm_90a": (256, 256), "sm_100a": (512, 256)}
CLUSTER_SIZE = 2  # CTAs per v9 cluster: the pool (SM_COUNT) must be a multiple of it
DATA_PARALLEL = "v9"
SPLIT_K = "v11"
# steps whose kernels matmul builds with RUNTIME_M=True on each arch: M is bound from the
# operands at every call, so one kernel per (step, keywords, dtype, N, K) serves every M.
# sm_100a: v9 only, its runtime-M build simulated on NumSim (the registry's v9 sim case with
# RUNTIME_M); v11 there keeps compile-time M (its runtime-M build is not simulated).
RUNTIME_M_STEPS = {"sm_90a": frozenset({"v9", "v10", "v11", "v12"}),
                   "sm_100a": frozenset({"v9"})}
NOMINAL_M = 128  # the M a runtime-M kernel is built, cached and exported at
# v12 also takes N and K at run time (RUNTIME_NK): one kernel per menu tile and dtype
# serves every shape; it is built at this N and K
RUNTIME_NK_STEPS = {"sm_90a": frozenset({"v12"})}
NOMINAL_N, NOMINAL_K = 256, 256
TILE_MENU = "v12"
# v11's split counts, rounded down to this menu, so that the splits chosen over all M for
# one (N, K) are a handful of kernels (rounding down keeps the spread reduction's rule).
# No multiple of v11's L2_GROUP (16): with M at run time the scheduler's unit rows are
# SPLIT_K * ceil(M/128), TVM then proves the tail-group row count zero and folds the
# (unreachable) `% tail` of the tile order into a division by zero at compile time.
SPLIT_MENU = (1, 2, 3, 4, 6, 8, 12, 20, 24, 28, 40, 56)
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
    CTA pairs; an even pool is valid for every persistent step), and ``RUNTIME_M: True``
    for the steps of RUNTIME_M_STEPS."""
    kw = dtype_kwargs(dtype)
    if sm_count and step.sm_count_kwarg:
        kw.update(step.with_sm_count(_pool(sm_count)))
    if runtime_m(step.id, step.arch):
        kw["RUNTIME_M"] = True
    if step.id in RUNTIME_NK_STEPS.get(step.arch, ()):
        kw["RUNTIME_NK"] = True
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


def _menu_split(split: int) -> int:
    return max(s for s in SPLIT_MENU if s <= split)


def _pool(sm_count: int) -> int:
    return max(CLUSTER_SIZE, sm_count - sm_count % CLUSTER_SIZE)


def choose(M: int, N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
           sm_count: int = spec.SM_COUNT["sm_90a"], epilogue: dict | None = None) -> tuple[str, dict]:
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
    """
    _check_problem(M, N, K, dtype, arch, sm_count)
    epi = E.epilogue_kwargs(epilogue) if epilogue else {}
    if epi:
        return _choose_epilogue(M, N, K, dtype, arch, sm_count, epi)
    menu = _registered(TILE_MENU, arch)
    if menu is not None:
        return _choose_by_model(M, N, K, dtype, arch, sm_count, menu)
    tile_m, tile_n = V9_CLUSTER_TILE[arch]
    tiles = _ceil_div(M, tile_m) * _ceil_div(N, tile_n)
    clusters = max(1, sm_count // CLUSTER_SIZE)
    split_step = _registered(SPLIT_K, arch)
    if tiles < clusters and split_step is not None:
        variant = splitk.choose_variant(M, N, K, _pool(sm_count), arch)
        if runtime_m(SPLIT_K, arch) and variant["SPLIT_K"] > 1:
            variant["SPLIT_K"] = _menu_split(variant["SPLIT_K"])
        if variant["SPLIT_K"] > 1:
            return SPLIT_K, {**step_kwargs(split_step, dtype, sm_count), **variant}
    return DATA_PARALLEL, step_kwargs(registry.get(DATA_PARALLEL, arch), dtype, sm_count)


def _choose_by_model(M, N, K, dtype, arch, sm_count, menu):
    """sm_90a: tirx_gemm.chooser's cost model over v12's tile menu and v9; v11 with the
    split rule where the best data-parallel tile leaves over half the SMs idle on a deep
    K (chooser.wants_split)."""
    from tirx_gemm import chooser
    pool = _pool(sm_count)
    split_step = _registered(SPLIT_K, arch)
    if split_step is not None and chooser.wants_split(M, N, K, pool):
        variant = splitk.choose_variant(M, N, K, pool, arch)
        if runtime_m(SPLIT_K, arch) and variant["SPLIT_K"] > 1:
            variant["SPLIT_K"] = _menu_split(variant["SPLIT_K"])
        if variant["SPLIT_K"] > 1:
            return SPLIT_K, {**step_kwargs(split_step, dtype, sm_count), **variant}
    pick = chooser.best(M, N, K, pool)
    if pick == chooser.V9:
        return DATA_PARALLEL, step_kwargs(registry.get(DATA_PARALLEL, arch), dtype, sm_count)
    return TILE_MENU, _tile_kwargs(menu, pick, dtype, sm_count)


def _choose_epilogue(M, N, K, dtype, arch, sm_count, epi: dict):
    menu = _registered(TILE_MENU, arch)
    if TILE_MENU not in EPILOGUE_STEPS.get(arch, ()) or menu is None:
        raise ValueError(f"a fused epilogue ({E.tag(epi)}) runs on sm_90a only (v12's tile "
                         f"menu); on {arch} call matmul without bias/activation/out_dtype and "
                         f"apply them with torch")
    from tirx_gemm import chooser
    if chooser.epilogue_step(M, E.kernel_n(N, epi), K, epi, _pool(sm_count)) == PINGPONG:
        return choose_epilogue_on(PINGPONG, M, N, K, dtype, arch, sm_count, epi)
    pick = chooser.best_tile(M, E.kernel_n(N, epi), K, _pool(sm_count))
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
        from tirx_gemm import chooser
        menu = registry.get(TILE_MENU, arch)
        pick = chooser.best_tile(M, E.kernel_n(N, epi), K, _pool(sm_count))
        return TILE_MENU, {**_tile_kwargs(menu, pick, dtype, sm_count), **epi}
    from tirx_gemm import chooser
    extra = sorted(set(epi) - set(chooser.V10_KEYWORDS))
    if extra:
        raise ValueError(f"step='v10' takes bias and activation only, not {', '.join(extra)} "
                         f"({E.tag(epi)}): use step='v12'")
    return PINGPONG, {**step_kwargs(registry.get(PINGPONG, arch), dtype, sm_count), **epi}


def _tile_kwargs(menu: registry.Step, pick: str, dtype: str, sm_count: int) -> dict:
    bm, bn = (int(x) for x in pick.split("x"))
    return {**step_kwargs(menu, dtype, sm_count), "BLK_M": bm, "BLK_N": bn}


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
    through tile counts (ceil(M / 64), / 128, / 256), so one M per 64-row block decides
    the block. ``epilogue``: as in :func:`choose` (every variant is then a v12 tile)."""
    _check_problem(1, N, K, dtype, arch, sm_count)
    tile_m, tile_n = V9_CLUSTER_TILE[arch]
    clusters = max(1, sm_count // CLUSTER_SIZE)
    settled = tile_m * _ceil_div(clusters, _ceil_div(N, tile_n))  # tiles >= clusters from here
    last = max(settled, VARIANTS_MAX_M) if max_m is None else max_m
    out: list[list] = []
    for lo in range(1, last + 1, M_BLOCK):
        hi = min(lo + M_BLOCK - 1, last)
        step_id, kw = choose(lo, N, K, dtype, arch, sm_count, epilogue)
        if out and out[-1][0] == step_id and out[-1][1] == kw:
            out[-1][3] = hi
        else:
            out.append([step_id, kw, lo, hi])
    return [tuple(v) for v in out]


def _registered(step_id: str, arch: str) -> registry.Step | None:
    return next((s for s in registry.all_steps(arch) if s.id == step_id), None)


# --------------------------------------------------------------------------------------
# operands
# --------------------------------------------------------------------------------------
def _dtype_name(t) -> str | None:
    name = str(t.dtype).removeprefix("torch.")
    return name if name in DTYPES else None


def check_operands(a, b, out=None, *, require_cuda: bool = True) -> tuple[int, int, int, str]:
    """(M, N, K, dtype) of ``a @ b.T``, or a one-line TypeError/ValueError saying what to
    change. ``require_cuda=False`` skips the device checks so that the others can be
    exercised on CPU tensors (tests)."""
    import torch
    ops = [("a", a), ("b", b)] + ([("out", out)] if out is not None else [])
    for name, t in ops:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if require_cuda:  # first: on a machine without a GPU no other advice can help
        off = [name for name, t in ops if t.device.type != "cuda"]
        if off and not torch.cuda.is_available():
            raise ValueError(f"{', '.join(off)} on {ops[0][1].device} and this machine has no "
                             f"CUDA GPU (torch {torch.__version__}): tirx_gemm.matmul runs on "
                             "an sm_90a or sm_100a GPU; here use torch.nn.functional.linear")
        for name, t in ops:
            if t.device.type != "cuda":
                raise ValueError(f"{name} is on {t.device}: matmul runs on a CUDA GPU "
                                 f"({name}.cuda())")
        devices = sorted({str(t.device) for _, t in ops})
        if len(devices) > 1:
            raise ValueError(f"the operands are on {', '.join(devices)}: put them on one GPU")
    for name, t in ops:
        if _dtype_name(t) is None:
            raise TypeError(f"{name} has dtype {t.dtype}: matmul takes torch.float16 or "
                            f"torch.bfloat16 (convert with {name}.half() or {name}.bfloat16())")
    for name, t in ops[1:]:
        if t.dtype != a.dtype:
            raise TypeError(f"a is {a.dtype} but {name} is {t.dtype}: the operands (and out) "
                            f"must share one dtype")
    for name, t in ops:
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)} (flatten the "
                             f"leading dimensions: {name}.reshape(-1, {name}.shape[-1]))")
    (M, K), (N, Kb) = a.shape, b.shape
    if Kb != K:
        raise ValueError(f"a is {M}x{K} but b is {N}x{Kb}: matmul computes a @ b.T, so both "
                         f"need the same number of columns K (b is out-features x in-features, "
                         f"like a Linear weight)")
    if out is not None and tuple(out.shape) != (M, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected ({M}, {N}) for "
                         f"a {M}x{K} @ b.T with b {N}x{K}")
    for name, t in ops:
        if not t.is_contiguous():
            rows = t.shape[1]
            why = (f"row stride {t.stride(0)} for {rows} columns (a view with padded rows)"
                   if t.stride(1) == 1 else f"strides {t.stride()}, not row-major")
            raise ValueError(f"{name} is not contiguous ({why}): the kernels' TMA descriptors "
                             f"take compact rows; pass {name}.contiguous()")
    for name, v in (("K", K), ("N", N)):
        if v % ROW_MULTIPLE:
            rows = "a and b" if name == "K" else "out"
            raise ValueError(f"{name}={v} is not a multiple of {ROW_MULTIPLE}: the rows of "
                             f"{rows} are {v} elements, and TMA needs row strides of a "
                             f"multiple of 16 bytes; pad {name} with zeros to "
                             f"{_ceil_div(v, ROW_MULTIPLE) * ROW_MULTIPLE}")
    for name, t in ops:
        if t.data_ptr() % ALIGN_BYTES:
            raise ValueError(f"{name}'s data pointer is not {ALIGN_BYTES}-byte aligned (a view "
                             f"at an odd offset?): TMA needs it; pass {name}.clone()")
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        raise ValueError("matmul has no backward: call it under torch.no_grad() or "
                         "torch.inference_mode(), or pass detached tensors")
    return M, N, K, _dtype_name(a)


def _gpu_arch(dev) -> tuple[str, int]:
    """(arch, SM count) of the GPU holding the operands, or a ValueError naming the fix."""
    import torch
    from tirx_gemm.run.device import ARCH_CAPABILITY, capability_matches
    cap = tuple(torch.cuda.get_device_capability(dev))
    for arch in ARCH_CAPABILITY:
        if capability_matches(arch, cap):
            return arch, int(torch.cuda.get_device_properties(dev).multi_processor_count)
    raise ValueError(f"{torch.cuda.get_device_name(dev)} is compute capability "
                     f"{cap[0]}.{cap[1]}: the steps run on sm_90a (9.0, Hopper) or sm_100a "
                     "(10.x, Blackwell); use torch.matmul(a, b.T) on this GPU")


# --------------------------------------------------------------------------------------
# kernels: built here or read from a bundle, loaded once per process
# --------------------------------------------------------------------------------------
_bundle_override: Path | None = None
_lock = threading.Lock()
_kernels: dict = {}


def use_bundle(path) -> None:
    """Read kernels from the bundle at ``path`` (``tirx-gemm export``) instead of building
    them; ``None`` goes back to ``$TIRX_GEMM_BUNDLE`` or, without it, building here."""
    global _bundle_override
    if path is not None:
        from tirx_gemm.bundle_format import load_manifest
        load_manifest(Path(path))  # not a bundle: say so now, not at the first call
    _bundle_override = None if path is None else Path(path)
    _calls.clear()  # calls remember kernels: the next call of each shape looks again


def bundle_path() -> Path | None:
    """The bundle kernels come from: use_bundle's, else $TIRX_GEMM_BUNDLE, else None."""
    if _bundle_override is not None:
        return _bundle_override
    env = os.environ.get(BUNDLE_ENV)
    return Path(env) if env else None


def clear_cache() -> None:
    """Forget the loaded kernels (the build cache on disk is kept). Needed after changing
    ``$TIRX_GEMM_BUNDLE`` in a running process (use_bundle does it itself)."""
    with _lock:
        _kernels.clear()
        _calls.clear()


def _describe(step: registry.Step, mnk, kwargs: dict) -> str:
    extra = ", ".join(f"{k}={v}" for k, v in sorted(kwargs.items()) if k != "dtype")
    shape = (["M"] if kwargs.get("RUNTIME_M") else [str(mnk[0])]) + (
        ["N", "K"] if kwargs.get("RUNTIME_NK") else [str(x) for x in mnk[1:]])
    return (f"{step.key} {'x'.join(shape)} {step.dtype(kwargs)}"
            + (f" ({extra})" if extra else ""))


def kernel_source(step: registry.Step, mnk, kwargs: dict, bundle=None) -> tuple[Path, dict]:
    """(library path, build metadata) of ``step`` at shape ``mnk`` built with ``kwargs``:
    the bundle's entry when ``bundle`` is given, else built here (the build cache returns a
    previous build at once): tirx_gemm.kernels.kernel_for at the shape the kernel is built
    at, its metadata at the caller's shape. Errors say how to get the missing kernel."""
    M, N, K = mnk
    at = build_shape(mnk, kwargs)  # runtime-M kernels are built once, at NOMINAL_M
    if bundle is None:
        import importlib.util
        if importlib.util.find_spec("tvm") is None:
            raise RuntimeError(
                f"cannot get {_describe(step, mnk, kwargs)}: no bundle is set and the TVM "
                f"compiler is not installed here; export a bundle on a build machine "
                f"(`tirx-gemm export --suite FILE`) and point tirx_gemm.matmul.use_bundle(path) "
                f"or ${BUNDLE_ENV} at it")
        lib, meta, _ = kernel_for(step, at, kwargs=dict(kwargs))
        meta["N"], meta["K"] = N, K
    else:
        try:
            lib, meta, _ = kernel_for(step, at, Path(bundle), kwargs=dict(kwargs))
        except ValueError as exc:
            sm = kwargs.get(step.sm_count_kwarg) if step.sm_count_kwarg else None
            raise ValueError(
                f"no kernel for {_describe(step, mnk, kwargs)} in bundle {bundle} ({exc}): "
                f"export it with `tirx-gemm export --suite FILE --arch {step.arch}"
                + (f" --num-sms {sm}" if sm else "") + f" --out {bundle}`, FILE a suite "
                f"listing {M}x{N}x{K}"
                + (" (any M: the export covers every token count of that N, K)"
                   if kwargs.get("RUNTIME_M") else "")) from None
        if kwargs.get("RUNTIME_NK"):
            meta["N"], meta["K"] = N, K  # a run-time-shape kernel runs at its N, K
    meta["M"] = M  # a runtime-M kernel runs at the caller's M
    meta["lib_path"] = str(lib)
    return lib, meta


class _Loaded:
    """One loaded kernel library, with its workspace operands per device.

    A runtime-M kernel serves every M: its workspace (v11's partial-sum slabs and tile
    counters, registry.Step.workspace_specs) is sized for the largest M seen on the device
    and grown when a larger one comes (the kernel takes workspace extents at run time and
    leaves the counters zero, so a larger buffer is as good as an exact one)."""

    def __init__(self, step: registry.Step, lib: Path, meta: dict):
        from tirx_gemm.run.loader import load_kernel
        self.step = step
        self.meta = meta
        self.kwargs = dict(meta.get("kwargs") or {})
        self.runtime_m = bool(self.kwargs.get("RUNTIME_M"))
        self.kernel = load_kernel(str(lib))
        self._ws: dict = {}  # device index -> ((name, shape, dtype), ...), (tensor, ...)

    def workspace(self, M: int, N: int, K: int, device) -> tuple:
        import torch
        specs = self.step.workspace_specs(M, N, K, self.kwargs)
        if not specs:
            return ()
        held = self._ws.get(device.index)
        if held is not None:
            have = held[0]
            fits = all(len(h[1]) == len(w[1]) and all(
                x >= y if self.runtime_m else x == y for x, y in zip(h[1], w[1]))
                for h, w in zip(have, specs))
            if fits:
                return held[1]
            if self.runtime_m:  # grow: every extent the larger of the two
                specs = tuple((w[0], tuple(max(x, y) for x, y in zip(h[1], w[1])), w[2])
                              for h, w in zip(have, specs))
        tensors = tuple(torch.zeros(shape, dtype=getattr(torch, dt), device=device)
                        for _, shape, dt in specs)
        self._ws[device.index] = (specs, tensors)
        return tensors


def _load(step: registry.Step, mnk, kwargs: dict) -> _Loaded:
    bundle = bundle_path()
    key = (step.id, step.arch, build_shape(mnk, kwargs), tuple(sorted(kwargs.items())),
           str(bundle) if bundle else None)
    with _lock:
        hit = _kernels.get(key)
        if hit is None:
            lib, meta = kernel_source(step, mnk, kwargs, bundle)
            hit = _kernels[key] = _Loaded(step, lib, meta)
    return hit


# --------------------------------------------------------------------------------------
# the call: a lean path for shapes seen before, the full one for the first call
# --------------------------------------------------------------------------------------
class _Call:
    """What a call of one (M, N, K, dtype, device, step) needs once validated: the kernel,
    its workspace tensors and a label for errors."""
    __slots__ = ("kernel", "workspace", "label")

    def __init__(self, kernel, workspace, label):
        self.kernel, self.workspace, self.label = kernel, workspace, label


_calls: dict = {}
_CALLS_MAX = 1 << 16  # distinct (shape, dtype, device, step) keys kept; then start afresh
_torch = None  # torch, bound on the first call (importing this module imports no torch)


def _fast_key(a, b, out, step):
    """The cache key of a call: (a.shape, b.shape, dtype, device index, step), or None where it
    cannot be formed. Only a call the full path accepted is ever stored under its key, so
    a hit means shape, dtype, device kind, arch and step were checked for these values;
    what can differ between calls of one key -- b's or out's dtype, device or layout, an
    operand's alignment, autograd -- is checked per call: alignment and autograd here,
    the rest by the kernel's own host code (TVM checks every operand's dtype, shape,
    device and compactness before it launches), whose refusal sends the call to
    check_operands for the one-line message."""
    try:
        key = (a.shape, b.shape, a.dtype, a.get_device(), step)
    except (AttributeError, TypeError):
        return None
    if (a.data_ptr() | b.data_ptr()) & (ALIGN_BYTES - 1) or (
            out is not None and out.data_ptr() & (ALIGN_BYTES - 1)):
        return None
    if (a.requires_grad or b.requires_grad) and _torch.is_grad_enabled():
        return None
    return key


def _pick(M, N, K, dtype, arch, sm_count, step):
    if step is None:
        step_id, kwargs = choose(M, N, K, dtype, arch, sm_count)
        return registry.get(step_id, arch), kwargs
    st = registry.get(step, arch)
    kwargs = step_kwargs(st, dtype, sm_count)
    if st.id == TILE_MENU:  # the model's best tile of the menu
        from tirx_gemm import chooser
        pick = next(c for _, c in chooser.rank(M, N, K, _pool(sm_count)) if c != chooser.V9)
        return st, _tile_kwargs(st, pick, dtype, sm_count)
    if st.id == SPLIT_K and kwargs.get("RUNTIME_M"):
        variant = splitk.choose_variant(M, N, K, _pool(sm_count), arch)
        variant["SPLIT_K"] = _menu_split(variant["SPLIT_K"])
        kwargs.update(variant)
    return st, kwargs


def _first_call(a, b, out, step, key):
    """Check everything (one-line errors), pick and load the kernel, remember the call."""
    global _torch
    import torch
    M, N, K, dtype = check_operands(a, b, out)
    _torch = torch
    if M == 0:
        return None  # no rows: nothing to compute (no kernel is built for M=0)
    arch, sm_count = _gpu_arch(a.device)
    st, kwargs = _pick(M, N, K, dtype, arch, sm_count, step)
    loaded = _load(st, (M, N, K), kwargs)
    call = _Call(loaded.kernel, loaded.workspace(M, N, K, a.device),
                 f"{_describe(st, (M, N, K), kwargs)} at M={M}")
    key = key if key is not None else _fast_key(a, b, out, step)
    if key is not None and a.is_cuda:
        if len(_calls) >= _CALLS_MAX:
            _calls.clear()
        _calls[key] = call
    return call


def _launch(call: _Call, a, b, out, sync: bool) -> None:
    try:
        call.kernel(a, b, out, *call.workspace)
    except Exception as exc:
        _refused(call, a, b, out, exc)
    if sync:
        synchronize(a.device, what=call.label)


def _refused(call: _Call, a, b, out, exc: Exception):
    """The kernel's host code refused an operand (b's or out's dtype, device, shape or
    layout): the full checks say which, in one line; else the launch itself failed."""
    check_operands(a, b, out)
    from tirx_gemm.run.errors import KernelLaunchError
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    raise KernelLaunchError(f"launching {call.label} failed: {first}") from exc


def bare_launch(a, b, out):
    """A zero-argument function that launches the kernel :func:`matmul` runs for (a, b)
    into ``out``, with no checks at all: for measuring what matmul's own per-call path
    costs over the launch (scripts/bench_overhead.py). The first call of matmul for this
    shape is made here if needed (it checks everything once)."""
    key = _fast_key(a, b, out, None)
    call = _calls.get(key) if key is not None else None
    if call is None:
        matmul(a, b, out=out)
        call = _calls[_fast_key(a, b, out, None)]
    kernel, workspace = call.kernel, call.workspace
    return lambda: kernel(a, b, out, *workspace)


def synchronize(device=None, *, what: str = "tirx_gemm.matmul") -> None:
    """Wait for the work queued so far on ``device`` (default: the current CUDA device),
    with the project's hang guard: at most ``$TIRX_GEMM_KERNEL_TIMEOUT`` seconds (60),
    then a one-line report and the process exits (a hung GPU context cannot be recovered);
    an asynchronous kernel failure becomes a one-line KernelLaunchError. This is where a
    person waiting on a result should wait; ``matmul(..., sync=True)`` calls it."""
    import torch
    from tirx_gemm.run.launcher import synchronize as guarded
    with torch.cuda.device(device if device is not None else torch.cuda.current_device()):
        guarded(what)


def matmul(a, b, bias=None, activation: str | None = None, out_dtype=None, *,
           step: str | None = None, out=None, sync: bool = False):
    """``a @ b.T`` (``F.linear(a, b)`` without bias) for 2-D CUDA fp16/bf16 tensors; with
    ``bias`` / ``activation`` / ``out_dtype``, ``act(a @ b.T + bias)`` in one kernel.

    ``a``: M x K (tokens x in-features); ``b``: N x K (out-features x in-features, a Linear
    weight); both one dtype, contiguous, 16-byte aligned, N and K multiples of 8, on an
    sm_90a or sm_100a GPU. Returns an M x N tensor of the same dtype (fp32 accumulation):
    ``out`` when given (contiguous, same dtype and device), else a new one.

    Asynchronous, like every torch op: the call returns once the kernel is queued on the
    current CUDA stream (so CUDA graphs capture it), and a kernel failure surfaces at the
    next synchronization. ``sync=True`` waits through the hang guard (:func:`synchronize`:
    a hung kernel ends the process with a one-line report instead of freezing it).

    ``step``: a step id ("v9") instead of :func:`choose`'s pick (built with the dtype and
    this GPU's SM count). On sm_90a the kernels take M at run time: one kernel per (step,
    keywords, dtype, N, K) serves every token count, from the build cache or a bundle
    exported for the layer's (N, K). The first call of a shape checks everything, picks
    and loads the kernel; later calls of the same shape, dtype and device check only what
    can change between calls (device, layout, alignment) and launch.

    Fused epilogue (v12 only, sm_90a; see the module docstring): ``bias`` a 1-D tensor of
    N elements (float16, bfloat16 or float32, on the operands' GPU), added to the fp32
    accumulator; ``activation`` one of "relu", "gelu" (erf, F.gelu's default),
    "gelu_tanh" (F.gelu(approximate="tanh")), "silu", applied after the bias; ``out_dtype``
    None (the operands' dtype) or torch.float32 (the fp32 result, no rounding). ``out``
    then has the output dtype.
    """
    if bias is not None or activation is not None or out_dtype is not None:
        return _epilogue_call(a, b, bias, activation, out_dtype, False, step, out, sync)
    # the lean path, inline (each Python call costs a microsecond on a slow host): the
    # checks of _fast_key, then the launch of _launch
    t = _torch
    if t is not None:
        try:
            key = (a.shape, b.shape, a.dtype, a.get_device(), step)
        except (AttributeError, TypeError):
            key = None
        call = _calls.get(key) if key is not None else None
        if (call is not None and not (a.data_ptr() | b.data_ptr()) & (ALIGN_BYTES - 1)
                and not ((a.requires_grad or b.requires_grad) and t.is_grad_enabled())
                and (out is None or not out.data_ptr() & (ALIGN_BYTES - 1))):
            if out is None:
                out = a.new_empty((key[0][0], key[1][0]))
            try:
                call.kernel(a, b, out, *call.workspace)
            except Exception as exc:
                _refused(call, a, b, out, exc)
            if sync:
                synchronize(a.device, what=call.label)
            return out
    key = _fast_key(a, b, out, step) if t is not None else None
    call = _first_call(a, b, out, step, key)
    if call is None:  # M == 0
        return out if out is not None else a.new_empty((0, b.shape[0]))
    if out is None:
        out = a.new_empty((a.shape[0], b.shape[0]))
    _launch(call, a, b, out, sync)
    return out


# --------------------------------------------------------------------------------------
# fused epilogues: bias, activation, fp32 output, SwiGLU (v12; tirx_gemm.epilogue)
# --------------------------------------------------------------------------------------
def _out_dtype_name(out_dtype, dtype: str) -> str | None:
    """OUT_DTYPE of a call: None for the operands' dtype, "float32" for fp32."""
    if out_dtype is None:
        return None
    name = out_dtype if isinstance(out_dtype, str) else str(out_dtype).removeprefix("torch.")
    if name == dtype:
        return None
    if name not in E.OUT_DTYPES:
        raise ValueError(f"out_dtype={out_dtype!r} is not supported: pass None (the operands' "
                         f"dtype, {dtype}) or torch.float32")
    return name


def epilogue_kwargs(bias=None, activation=None, out_dtype=None, swiglu: bool = False,
                    dtype: str = "float16") -> dict:
    """The builder keywords (tirx_gemm.epilogue) of a call's epilogue arguments, checked
    (one-line errors): what :func:`choose` and :func:`variants` take as ``epilogue``.
    ``bias`` may be a tensor or a dtype name."""
    if activation is not None and activation not in E.ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not supported: choose one of "
                         f"{', '.join(E.ACTIVATIONS)} (or None)")
    if bias is None:
        bias_dt = False
    else:
        bias_dt = bias if isinstance(bias, str) else _bias_dtype(bias)
    return E.epilogue_kwargs({"BIAS": bias_dt, "ACT": activation, "SWIGLU": bool(swiglu),
                              "OUT_DTYPE": _out_dtype_name(out_dtype, dtype)})


def _bias_dtype(bias) -> str:
    name = str(getattr(bias, "dtype", "")).removeprefix("torch.")
    if name not in E.BIAS_DTYPES:
        raise TypeError(f"bias has dtype {getattr(bias, 'dtype', type(bias).__name__)}: the "
                        f"fused bias takes {', '.join('torch.' + d for d in E.BIAS_DTYPES)}")
    return name


def check_bias(bias, N: int, device=None) -> None:
    """A one-line TypeError / ValueError unless ``bias`` is a contiguous 1-D tensor of N
    elements of a fused-bias dtype (on ``device`` when given)."""
    import torch
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    _bias_dtype(bias)
    if bias.dim() != 1 or bias.shape[0] != N:
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({N},): one value per "
                         f"output column (b's rows)")
    if device is not None and bias.device != device:
        raise ValueError(f"bias is on {bias.device} but the operands are on {device}: "
                         f"bias.to({str(device)!r})")
    if not bias.is_contiguous():
        raise ValueError(f"bias is not contiguous (stride {bias.stride()}): pass "
                         f"bias.contiguous()")
    if bias.requires_grad and torch.is_grad_enabled():
        raise ValueError("matmul has no backward: call it under torch.no_grad() or "
                         "torch.inference_mode(), or pass a detached bias")


def _check_out(out, M: int, N: int, dtype, device) -> None:
    import torch
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"out is {out.dtype} but the result is {dtype}")
    if tuple(out.shape) != (M, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected ({M}, {N})")
    if out.device != device:
        raise ValueError(f"out is on {out.device} but the operands are on {device}")
    if not out.is_contiguous() or out.data_ptr() % ALIGN_BYTES:
        raise ValueError("out must be contiguous and 16-byte aligned: pass a fresh tensor")


def _epilogue_call(a, b, bias, activation, out_dtype, swiglu: bool, step, out, sync):
    """A call with a fused epilogue. Lean path for a call seen before (same shapes, dtype,
    device, step and epilogue arguments): alignment and autograd checked here, the rest by
    the kernel's host code, whose refusal sends the call through every check for the
    one-line message. First call: every check, the kernel picked, loaded and remembered."""
    try:
        key = ("epilogue", a.shape, b.shape, a.dtype, a.get_device(), step,
               None if bias is None else (bias.dtype, bias.shape), activation, out_dtype,
               swiglu)
        call = _calls.get(key)
    except (AttributeError, TypeError):
        key, call = None, None
    t = _torch
    if call is not None and t is not None and not (
            a.data_ptr() | b.data_ptr() | (0 if bias is None else bias.data_ptr())
            | (0 if out is None else out.data_ptr())) & (ALIGN_BYTES - 1) \
            and not (t.is_grad_enabled() and (a.requires_grad or b.requires_grad or (
                bias is not None and bias.requires_grad))):
        if out is None:
            out = a.new_empty(call.workspace[0], dtype=call.workspace[1])
        try:
            if bias is not None:
                call.kernel(a, b, out, bias)
            else:
                call.kernel(a, b, out)
        except Exception as exc:
            _epilogue_checks(a, b, bias, activation, out_dtype, swiglu, out)
            _raise_launch(call, exc)
        if sync:
            synchronize(a.device, what=call.label)
        return out
    return _epilogue_first(a, b, bias, activation, out_dtype, swiglu, step, out, sync, key)


def _epilogue_checks(a, b, bias, activation, out_dtype, swiglu, out, *,
                     require_cuda: bool = True):
    """Every check of an epilogue call (one line each): (M, N, K, dtype, epi, out dtype).
    ``require_cuda=False`` skips the device checks (tests on CPU tensors)."""
    import torch
    M, NB, K, dtype = check_operands(a, b, require_cuda=require_cuda)
    epi = epilogue_kwargs(bias, activation, out_dtype, swiglu, dtype)
    N = NB // 2 if swiglu else NB
    if swiglu:
        E.check_swiglu_n(N)
    if bias is not None:
        check_bias(bias, N, a.device)
    res_dtype = torch.float32 if epi.get("OUT_DTYPE") == "float32" else a.dtype
    if out is not None:
        _check_out(out, M, N, res_dtype, a.device)
    return M, N, K, dtype, epi, res_dtype


def _raise_launch(call, exc):
    from tirx_gemm.run.errors import KernelLaunchError
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    raise KernelLaunchError(f"launching {call.label} failed: {first}") from exc


def _epilogue_first(a, b, bias, activation, out_dtype, swiglu, step, out, sync, key):
    global _torch
    import torch
    M, N, K, dtype, epi, res_dtype = _epilogue_checks(a, b, bias, activation, out_dtype,
                                                     swiglu, out)
    _torch = torch
    if step is not None and step not in EPILOGUE_STEPS.get("sm_90a", ()):
        raise ValueError(f"step={step!r} has no fused epilogue (v9 and v11 have none): leave "
                         f"step=None, or step='v12' (or 'v10': bias and activation only)")
    if out is None:
        out = torch.empty((M, N), dtype=res_dtype, device=a.device)
    if M == 0:
        return out
    arch, sm_count = _gpu_arch(a.device)
    if step is None:
        step_id, kwargs = choose(M, N, K, dtype, arch, sm_count, epi)
    else:
        step_id, kwargs = choose_epilogue_on(step, M, N, K, dtype, arch, sm_count, epi)
    st = registry.get(step_id, arch)
    loaded = _load(st, (M, N, K), kwargs)
    # an epilogue call's "workspace" slot holds what the lean path allocates: (shape, dtype)
    call = _Call(loaded.kernel, ((M, N), res_dtype),
                 f"{_describe(st, (M, N, K), kwargs)} at M={M}")
    if key is not None:
        if len(_calls) >= _CALLS_MAX:
            _calls.clear()
        _calls[key] = call
    try:
        if bias is not None:
            call.kernel(a, b, out, bias)
        else:
            call.kernel(a, b, out)
    except Exception as exc:
        _raise_launch(call, exc)
    if sync:
        synchronize(a.device, what=call.label)
    return out


def fuse_gate_up(w_gate, w_up):
    """The fused gate/up weight of a SwiGLU MLP, for :func:`swiglu` (``fused=``): w_gate and
    w_up (N x K each, one dtype and device, N a multiple of 8) interleaved in groups of
    8 rows (gate 0-7, up 0-7, gate 8-15, ...; tirx_gemm.epilogue.SWIGLU_GROUP), a new
    contiguous (2N, K) tensor. Do it once per model (it copies both weights), not per call.
    Its numpy twin: tirx_gemm.epilogue.interleave_gate_up_np."""
    import torch
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
        if w.dim() != 2:
            raise ValueError(f"{name} must be 2-D (N x K), got shape {tuple(w.shape)}")
    if w_gate.shape != w_up.shape or w_gate.dtype != w_up.dtype \
            or w_gate.device != w_up.device:
        raise ValueError(f"w_gate ({tuple(w_gate.shape)}, {w_gate.dtype}, {w_gate.device}) and "
                         f"w_up ({tuple(w_up.shape)}, {w_up.dtype}, {w_up.device}) must have "
                         f"one shape, dtype and device")
    N, K = w_gate.shape
    E.check_swiglu_n(N)
    G = E.SWIGLU_GROUP
    return torch.stack((w_gate.reshape(N // G, G, K), w_up.reshape(N // G, G, K)),
                       dim=1).reshape(2 * N, K).contiguous()


def swiglu(a, w_gate=None, w_up=None, *, fused=None, out_dtype=None, out=None,
           sync: bool = False):
    """``silu(a @ w_gate.T) * (a @ w_up.T)`` (a SwiGLU MLP's gate/up half) in one kernel:
    one GEMM over the fused weight, the silu and the product on the fp32 accumulators
    (v12 on sm_90a). Give ``w_gate`` and ``w_up`` (N x K each; fused here at every call,
    a copy of both) or ``fused=fuse_gate_up(w_gate, w_up)`` made once. Returns M x N in
    the operands' dtype, or fp32 with ``out_dtype=torch.float32``."""
    if fused is None:
        if w_gate is None or w_up is None:
            raise ValueError("swiglu needs w_gate and w_up, or fused=fuse_gate_up(w_gate, "
                             "w_up)")
        fused = fuse_gate_up(w_gate, w_up)
    elif w_gate is not None or w_up is not None:
        raise ValueError("swiglu: pass either w_gate and w_up, or fused=, not both")
    else:
        import torch
        if isinstance(fused, torch.Tensor) and fused.dim() == 2 \
                and fused.shape[0] % (2 * E.SWIGLU_GROUP):
            raise ValueError(f"fused has {fused.shape[0]} rows: a fused gate/up weight "
                             f"(fuse_gate_up) has 2N rows, N a multiple of {E.SWIGLU_GROUP}")
    return _epilogue_call(a, fused, None, None, out_dtype, True, None, out, sync)


class _CallableModule(types.ModuleType):
    """``tirx_gemm.matmul(a, b)`` calls :func:`matmul`; the module's other names stay
    reachable as attributes (``tirx_gemm.matmul.use_bundle``). Under torch.compile call
    ``tirx_gemm.torch_op.matmul`` (or use ``tirx_gemm.nn.Linear``): dynamo cannot trace a
    call of a module object."""

    def __call__(self, a, b, *args, **kw):
        return matmul(a, b, *args, **kw)


sys.modules[__name__].__class__ = _CallableModule
