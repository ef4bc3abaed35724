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
4. it launches, asynchronously, on the current stream, into ``out`` or a fresh tensor;
   ``sync=True`` or :func:`synchronize` waits through the host hang guard. A split-K or
   stream-K kernel's workspace is one set per stream eagerly and fresh per call under
   CUDA-graph capture (tirx_gemm.run.workspace), so streams, torch.cuda graphs sharing a
   pool and torch.compile's reduce-overhead all hold what they use. Threads may call at once:
   a kernel is loaded once per process under a lock.

Steps 1-3 run on the first call of a (shape, dtype, device, step); the call is then
remembered, and later calls of it check only what can change between calls and launch.
On sm_90a, matmul's kernels take M at run time (RUNTIME_M_STEPS; on sm_100a v9 only, checked
on NumSim): one kernel per (step, keywords, dtype, N, K) serves every token count;
:func:`variants` lists what a layer's (N, K) needs over all M, which is what
``tirx-gemm export --suite`` puts in a bundle.

Operand layouts (tirx_gemm.op.layouts): a or b may be the transposed view of a row-major
tensor (NT, TN, TT): v15 reads it in place on sm_90a, no copy (:func:`choose`, :func:`explain`
take ``layout=``); elsewhere, or with a fused epilogue, a one-line error names the operand.

The module is callable, so ``import tirx_gemm; tirx_gemm.matmul(a, b)`` and
``tirx_gemm.matmul.use_bundle(path)`` both work. Importing it imports neither torch nor TVM:
:func:`choose` and the suite planning (tirx_gemm.op.suite) run on a build machine without torch.
Calling the module, ``tirx_gemm.matmul(a, b)``, is differentiable (tirx_gemm/matmul.py); the
function :func:`matmul` records no gradient. The kernel runs on apache-tvm-ffi's stream for
torch tensors (torch's current stream; CUDA graph capture records it).

Fused epilogues (the rules and references: tirx_gemm/epilogue.py):
``matmul(a, b, bias=..., activation=..., out_dtype=...)`` computes
``act(a @ b.T + bias)`` in one kernel, on the fp32 accumulator before the cast, and
:func:`swiglu` computes ``silu(a @ w_gate.T) * (a @ w_up.T)`` from one GEMM over the fused
gate/up weight (:func:`fuse_gate_up`; fuse once per model and pass ``fused=``). v12
(sm_90a's tile menu) builds every epilogue and v10 (ping-pong) BIAS and ACT; v9 and v11
have none, so :func:`choose` routes a call with an epilogue to v12's best tile
(``cost_model.best_tile``), a bias alone at decode to the plain GEMM's swap-AB kernel
(the ``swap_ab_bias`` rule), or to v10 where ``rules.epilogue_step`` says so (only once
``rules.EPILOGUE_STEP`` is set to "v10"; off until measured). ``step="v10"`` or
``step="v12"`` forces one of them; ``step="v9"`` with an epilogue is refused. On sm_100a
matmul has no epilogue kernels yet (refused in one line).
:func:`variants` takes the same ``epilogue`` (builder keywords) to list a layer's kernels.
"""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path

from tirx_gemm import epilogue as E
from tirx_gemm import registry, spec, splitk
from tirx_gemm.kernels import kernel_for
from tirx_gemm.numerics import DTYPES
from tirx_gemm.op import cards as _cards, cost_model as _cm, rules as _rules
# the choice of step and keywords (pure Python), reachable as tirx_gemm.matmul.<name> too
from tirx_gemm.op.keywords import (  # noqa: F401
    CLUSTER_SIZE, DATA_PARALLEL, EPILOGUE_STEPS, MENU_ARCHES, NOMINAL_K, NOMINAL_M, NOMINAL_N,
    PINGPONG, ROW_MULTIPLE, RUNTIME_M_STEPS, RUNTIME_NK_STEPS, SPLIT_K, SPLIT_MENU, TILE_MENU,
    V9_CLUSTER_TILE, V11_L2_GROUP, _ceil_div, _check_problem, _menu_split, _pool, _registered,
    build_shape, runtime_m, step_kwargs)
from tirx_gemm.op.rules import RULES, choose_epilogue_on  # noqa: F401
# the checks of a call's tensors, reachable as tirx_gemm.matmul.<name> too
from tirx_gemm.op.operands import (  # noqa: F401
    ALIGN_BYTES, _bias_dtype, _check_out, _dtype_name, _gpu_arch, _out_dtype_name, check_bias,
    check_dense, check_gate_up, check_no_overlap, check_operands, check_step, epilogue_kwargs,
    fuse_gate_up, mark_gate_up, out_overlaps)
# transposed operands (NN, NT, TN, TT): v15 in place on sm_90a; choose and explain take layout=
from tirx_gemm.op import launch_site as _site, layouts as _layouts
from tirx_gemm.op.layouts import choose

__all__ = ["matmul", "swiglu", "fuse_gate_up", "epilogue_kwargs", "check_step",
           "synchronize", "choose", "explain", "variants", "step_kwargs", "runtime_m",
           "build_shape", "bare_launch", "check_operands", "use_bundle", "bundle_path",
           "kernel_source", "clear_cache", "BUNDLE_ENV"]

BUNDLE_ENV = "TIRX_GEMM_BUNDLE"


# --------------------------------------------------------------------------------------
# a forced step, and every kernel a layer needs over all M (both walk rules.RULES)
# --------------------------------------------------------------------------------------
def _pick(M, N, K, dtype, arch, sm_count, step):
    """(Step, builder keywords) of a call: :func:`choose`'s pick, or the forced ``step``
    (``matmul(..., step=...)``) with its keywords, v12's tile and v11's split chosen here."""
    if step is None:
        step_id, kwargs = _cards.pick(choose, M, N, K, dtype, arch, sm_count, bundle=bundle_path())
        return registry.get(step_id, arch), kwargs
    st = registry.get(step, arch)
    kwargs = step_kwargs(st, dtype, sm_count)
    if st.id == TILE_MENU and arch in MENU_ARCHES:  # the model's best tile of the menu
        best = next(c for _, c in _cm.rank(M, N, K, _pool(sm_count))
                    if c not in (_cm.V9, _cm.V10))
        bm, bn, _ = _cm.tile(best)
        return st, {**kwargs, "BLK_M": bm, "BLK_N": bn}
    if st.id == SPLIT_K and kwargs.get("RUNTIME_M"):
        variant = splitk.choose_variant(M, N, K, _pool(sm_count), arch)
        variant["SPLIT_K"] = _menu_split(variant["SPLIT_K"],
                                         variant.get("L2_GROUP", V11_L2_GROUP[arch]))
        kwargs = {**kwargs, **variant}
    return st, kwargs


VARIANTS_MAX_M = 16384  # variants() covers every M up to this (and v9's settled point)
M_BLOCK = 64  # every tile height of every step divides 256 and is a multiple of 64


def variants(N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
             sm_count: int = spec.SM_COUNT["sm_90a"], max_m: int | None = None,
             epilogue: dict | None = None) -> list[tuple[str, dict, int, int]]:
    """Every (step_id, kwargs, first M, last M) that :func:`choose` picks for an Mx``N``x``K``
    GEMM over M = 1 .. ``max_m`` (default: VARIANTS_MAX_M, or the M at which v9's cluster
    tiles alone fill the GPU if that is larger), in order of M: what a bundle needs to serve
    every token count of a layer (``tirx-gemm export --suite``). Every rule depends on M
    only through tile counts, so one M per block decides the block: every 64 rows, every 16
    past rules.DP_SWAP_MIN_M (swap-AB's TMA-stored token tiles), past each swap-AB token
    tile, and where a swap-AB split's token tile grows (rules.wide_swap_token_tiles)."""
    from tirx_gemm.op.keywords import INT32_MAX, dtype_name
    dtype = dtype_name(dtype)  # torch.bfloat16 as well as "bfloat16", as choose takes it
    _check_problem(1, N, K, dtype, arch, sm_count)
    tile_m, tile_n = V9_CLUSTER_TILE[arch]
    clusters = max(1, sm_count // CLUSTER_SIZE)
    settled = tile_m * _ceil_div(clusters, _ceil_div(N, tile_n))  # tiles >= clusters from here
    last = max(settled, VARIANTS_MAX_M) if max_m is None else max_m
    last = min(last, INT32_MAX // max(N, K))  # past it matmul refuses (int32 index math)
    r, out = _rules, []
    wide = range(r.SWAP_AB_TILES[-1] + 2, min(r.WIDE_SWAP_MAX_M, last) + 1)
    starts = sorted({lo for lo in range(1, last + 1, M_BLOCK)}
                    | {lo for lo in range(1, last + 1, r.DP_SWAP_TOKEN_STEP)
                       if lo > r.DP_SWAP_MIN_M}
                    | ({r.DP_SWAP_MIN_M + 1} if r.DP_SWAP_MIN_M < last else set())
                    | {t + 1 for t in r.SWAP_AB_TILES if t < last}
                    | {m for m in wide
                       if r.wide_swap_token_tiles(m) != r.wide_swap_token_tiles(m - 1)})
    for i, lo in enumerate(starts):
        hi = (starts[i + 1] - 1) if i + 1 < len(starts) else last
        step_id, kw = choose(lo, N, K, dtype, arch, sm_count, epilogue)
        if out and out[-1][0] == step_id and out[-1][1] == kw:
            out[-1][3] = hi
        else:
            out.append([step_id, kw, lo, hi])
    return [tuple(v) for v in out]


# --------------------------------------------------------------------------------------
# kernels: built here or read from a bundle, loaded once per process
# --------------------------------------------------------------------------------------
_bundle_override: Path | None = None
_lock = threading.Lock()
_kernels: dict = _site.new_cache()


def use_bundle(path) -> None:
    """Read kernels from the bundle at ``path`` (``tirx-gemm export``) instead of building
    them; ``None`` goes back to ``$TIRX_GEMM_BUNDLE`` or, without it, building here."""
    global _bundle_override
    if path is not None and (not isinstance(path, (str, Path)) or not str(path).strip()):
        raise TypeError(f"use_bundle takes the path of a bundle folder (tirx-gemm export "
                        f"--out), or None, got {path!r}")
    if path is not None:
        from tirx_gemm.bundle_format import load_manifest
        load_manifest(Path(path))  # not a bundle: say so now, not at the first call
    _bundle_override = None if path is None else Path(path)
    _site.clear(_lock, kernels=False)  # calls remember kernels: each shape looks again


def bundle_path() -> Path | None:
    """The bundle kernels come from: use_bundle's, else $TIRX_GEMM_BUNDLE, else None."""
    if _bundle_override is not None:
        return _bundle_override
    from tirx_gemm import settings
    return settings.get(BUNDLE_ENV)  # a Path, or None when unset


def explain(M, N, K, dtype="float16", arch="sm_90a", sm_count=None, epilogue=None, *,
            card=None, layout="NN") -> str:
    """layouts.explain on the card matmul assumes here (tirx_gemm.op.cards.assumed: the GPU
    present where the bundle was exported for it, else the H200) unless ``card`` names one."""
    return _layouts.explain(M, N, K, dtype, arch, sm_count, epilogue, layout=layout,
                            card=_cards.assumed(bundle_path()) if card is None else card)


def clear_cache() -> None:
    """Forget the calls seen and the loaded kernels: matmul's, its transposed calls', its
    backward's (op.launch_site.KERNEL_CACHES; the build cache on disk is kept). Needed after
    a bundle is re-exported at its path or ``$TIRX_GEMM_BUNDLE`` changes in a running process."""
    _site.clear(_lock)


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
        from tirx_gemm.bundle_format import KernelNotInBundle
        try:
            lib, meta, _ = kernel_for(step, at, Path(bundle), kwargs=dict(kwargs))
        except KernelNotInBundle as exc:  # a refused digest pin or a bad bundle says so itself
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
    """One loaded kernel library, with its workspace operands (v11's and v12's split-K
    partial sums and tile counters, stream-K's: registry.Step.workspace_specs): per device
    and stream eagerly, fresh per call under CUDA-graph capture (tirx_gemm.run.workspace)."""

    def __init__(self, step: registry.Step, lib: Path, meta: dict):
        from tirx_gemm.run.loader import load_kernel
        from tirx_gemm.run.workspace import Workspaces
        self.step = step
        self.meta = meta
        self.kwargs = dict(meta.get("kwargs") or {})
        self.kernel = load_kernel(str(lib))
        self.ws = Workspaces(lambda M, N, K: step.workspace_specs(M, N, K, self.kwargs),
                             bool(self.kwargs.get("RUNTIME_M")))

    def workspace(self, M: int, N: int, K: int, device):
        """() for a kernel without workspace operands, else the call's CallWorkspace."""
        return self.ws.for_call(M, N, K, device)


def _load(step: registry.Step, mnk, kwargs: dict) -> _Loaded:
    bundle = bundle_path()
    key = (step.id, step.arch, build_shape(mnk, kwargs), tuple(sorted(kwargs.items())),
           str(bundle) if bundle else None)
    with _lock:
        hit = _kernels.get(key)
        if hit is None:
            from tirx_gemm.run.workspace import capturing
            if capturing():  # CUDA refuses a module load inside a capture: say what to do
                raise RuntimeError(
                    f"{_describe(step, mnk, kwargs)} is not loaded yet, and CUDA cannot load a "
                    f"kernel while the current stream captures a graph: call the op once with "
                    f"this shape before capturing (torch.cuda.graph's warm-up on a side stream)")
            lib, meta = kernel_source(step, mnk, kwargs, bundle)
            hit = _kernels[key] = _Loaded(step, lib, meta)
    return hit


# --------------------------------------------------------------------------------------
# the call: a lean path for shapes seen before, the full one for the first call
# --------------------------------------------------------------------------------------
class _Call:
    """What a call of one (M, N, K, dtype, device, step) needs once validated: the kernel,
    its workspace (() or a run.workspace.CallWorkspace), a label for errors, the output's
    shape (M, N) and the kernel's launch-site twin (op.launch_site; None where none runs)."""
    __slots__ = ("kernel", "workspace", "label", "shape", "lone")

    def __init__(self, kernel, workspace, label, shape=None, lone=None):
        self.kernel, self.workspace, self.label, self.shape = kernel, workspace, label, shape
        self.lone = lone


def _twin(step, mnk, kwargs):
    """The pick's launch-site twin, loaded, where MODE runs one and the bundle has it."""
    tw = None if _site.MODE == "always" else _site.twin_kwargs(step.id, kwargs)
    try:
        return None if tw is None else _load(step, mnk, tw).kernel
    except ValueError:  # a bundle exported without it: the pick runs
        return None


_calls: dict = _site.new_cache(calls=True)  # a mode change drops them (op.launch_site)
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
    except (AttributeError, TypeError, RuntimeError):  # a nested tensor: no sizes
        return None
    try:  # a sparse tensor (or a non-tensor) has no data pointer: the full checks say so
        if (a.data_ptr() | b.data_ptr()) & (ALIGN_BYTES - 1) or (
                out is not None and out.data_ptr() & (ALIGN_BYTES - 1)):
            return None
    except (RuntimeError, AttributeError, TypeError):
        return None
    if (a.requires_grad or b.requires_grad) and _torch.is_grad_enabled():
        return None
    return key


def _first_call(a, b, out, step, key):
    """Check everything (one-line errors), pick and load the kernel, remember the call."""
    global _torch
    import torch
    check_step(step)
    M, N, K, dtype = check_operands(a, b, out)
    _torch = torch
    if M == 0:
        return None  # no rows: nothing to compute (no kernel is built for M=0)
    arch, sm_count = _gpu_arch(a.device)
    st, kwargs = _pick(M, N, K, dtype, arch, sm_count, step)
    loaded = _load(st, (M, N, K), kwargs)
    call = _Call(loaded.kernel, loaded.workspace(M, N, K, a.device),
                 f"{_describe(st, (M, N, K), kwargs)} at M={M}", (M, N),
                 _twin(st, (M, N, K), kwargs))
    key = key if key is not None else _fast_key(a, b, out, step)
    if key is not None and a.is_cuda:
        if len(_calls) >= _CALLS_MAX:
            _calls.clear()
        _calls[key] = call
    return call


def _launch(call: _Call, a, b, out, sync: bool) -> None:
    ws, k = call.workspace, call.kernel if call.lone is None else _site.kernel(call, a, out)
    try:
        k(a, b, out, *(ws if ws.__class__ is tuple else ws.get()))
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
    ws = call.workspace
    kernel, workspace = call.kernel, (ws if ws.__class__ is tuple else ws.get())
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
    sm_90a or sm_100a GPU (on sm_90a either may be a transposed view instead:
    tirx_gemm.op.layouts runs it on v15 in place). Returns an M x N tensor of the same
    dtype (fp32 accumulation): ``out`` when given (contiguous, same dtype and device, no
    byte shared with an input), else a new one.

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
            call = _calls.get((a.shape, b.shape, a.dtype, a.get_device(), step))
        except (AttributeError, TypeError, RuntimeError):  # a nested tensor: no sizes
            call = None
        try:  # a sparse tensor (or a non-tensor) has no data pointer: the full checks say so
            lean = (call is not None and not (a.data_ptr() | b.data_ptr()) & (ALIGN_BYTES - 1)
                    and not (t.is_grad_enabled() and (a.requires_grad or b.requires_grad))
                    and (out is None or not out.data_ptr() & (ALIGN_BYTES - 1)))
        except (RuntimeError, AttributeError, TypeError):
            lean = False
        if lean:
            if out is None:
                out = a.new_empty(call.shape)
            elif out_overlaps(out, a, b):
                check_no_overlap(out, a=a, b=b)
            ws, k = call.workspace, call.kernel if call.lone is None else _site.kernel(call, a, out)
            try:
                k(a, b, out, *(ws if ws.__class__ is tuple else ws.get()))
            except Exception as exc:
                if _layouts.has_transposed(a, b):  # the kernel's host code refused the view
                    return _transposed(a, b, out, step, sync)
                _refused(call, a, b, out, exc)
            if sync:
                synchronize(a.device, what=call.label)
            return out
    if _layouts.has_transposed(a, b):  # NT, TN, TT: v15 reads the views in place (sm_90a)
        return _transposed(a, b, out, step, sync)
    key = _fast_key(a, b, out, step) if t is not None else None
    call = _first_call(a, b, out, step, key)
    if call is None:  # M == 0
        return out if out is not None else a.new_empty((0, b.shape[0]))
    if out is None:
        out = a.new_empty((a.shape[0], b.shape[0]))
    _launch(call, a, b, out, sync)
    return out


def _transposed(a, b, out, step, sync: bool):
    """a or b a transposed view (NT, TN, TT): v15 in place (tirx_gemm.op.layouts)."""
    out = _layouts.matmul(a, b, out=out, step=step, probe=_gpu_arch, kernel=v15_kernel)
    if sync:
        synchronize(a.device, what="tirx_gemm.matmul on v15 (a transposed view)")
    return out


def v15_kernel(dtype, rows_a: int, rows_b: int, red: int, a_mn: bool, b_mn: bool, device,
               tune: dict | None = None):
    """v15's kernel for a layout (tirx_gemm.op.layouts.layout_kernel), loaded as matmul's."""
    return _layouts.layout_kernel(dtype, rows_a, rows_b, red, a_mn, b_mn, device, tune,
                                  load=_load, probe=_gpu_arch, bundle=bundle_path())


# --------------------------------------------------------------------------------------
# fused epilogues: bias, activation, fp32 output, SwiGLU (v12; tirx_gemm.epilogue)
# --------------------------------------------------------------------------------------
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
    except (AttributeError, TypeError, RuntimeError):  # a nested tensor: no sizes
        key, call = None, None
    t = _torch
    try:  # a sparse tensor (or a non-tensor) has no data pointer: the full checks say so
        lean = call is not None and t is not None and not (
            a.data_ptr() | b.data_ptr() | (0 if bias is None else bias.data_ptr())
            | (0 if out is None else out.data_ptr())) & (ALIGN_BYTES - 1) \
            and not (t.is_grad_enabled() and (a.requires_grad or b.requires_grad or (
                bias is not None and bias.requires_grad)))
    except (RuntimeError, AttributeError, TypeError):
        lean = False
    if lean:
        if out is None:
            out = a.new_empty(call.shape[0], dtype=call.shape[1])
        elif out_overlaps(out, a, b, bias):
            check_no_overlap(out, a=a, b=b, bias=bias)
        try:
            _epilogue_launch(call, a, b, out, bias)
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
    _layouts.refuse_epilogue(a, b)  # v15 reads transposed views, but has no epilogue
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
        check_no_overlap(out, a=a, b=b, bias=bias)
    return M, N, K, dtype, epi, res_dtype


def _raise_launch(call, exc):
    from tirx_gemm.run.errors import KernelLaunchError
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    raise KernelLaunchError(f"launching {call.label} failed: {first}") from exc


def _epilogue_first(a, b, bias, activation, out_dtype, swiglu, step, out, sync, key):
    global _torch
    import torch
    check_step(step)
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
        step_id, kwargs = _cards.pick(choose, M, N, K, dtype, arch, sm_count, epi,
                                      bundle=bundle_path())
    else:
        step_id, kwargs = choose_epilogue_on(step, M, N, K, dtype, arch, sm_count, epi)
    st = registry.get(step_id, arch)
    loaded = _load(st, (M, N, K), kwargs)
    # an epilogue call's "shape" slot holds what the lean path allocates: (shape, dtype)
    call = _Call(loaded.kernel, loaded.workspace(M, N, K, a.device),
                 f"{_describe(st, (M, N, K), kwargs)} at M={M}", ((M, N), res_dtype),
                 _twin(st, (M, N, K), kwargs))
    if key is not None:
        if len(_calls) >= _CALLS_MAX:
            _calls.clear()
        _calls[key] = call
    try:
        _epilogue_launch(call, a, b, out, bias)
    except Exception as exc:
        _raise_launch(call, exc)
    if sync:
        synchronize(a.device, what=call.label)
    return out


def _epilogue_launch(call: _Call, a, b, out, bias) -> None:
    # the kernel's operands: D, the bias if any, then the workspace (a K split's slabs and
    # counters: v12 adds the bias to the summed bands)
    ws, k = call.workspace, call.kernel if call.lone is None else _site.kernel(call, a, out)
    ws = ws if ws.__class__ is tuple else ws.get()
    if bias is not None:
        k(a, b, out, bias, *ws)
    else:
        k(a, b, out, *ws)


def swiglu(a, w_gate=None, w_up=None, *, fused=None, out_dtype=None, out=None,
           sync: bool = False):
    """``silu(a @ w_gate.T) * (a @ w_up.T)`` (a SwiGLU MLP's gate/up half) in one kernel:
    one GEMM over the fused weight, the silu and the product on the fp32 accumulators
    (v12 on sm_90a). Give ``w_gate`` and ``w_up`` (N x K each; fused here at every call,
    a copy of both) or ``fused=fuse_gate_up(w_gate, w_up)`` made once: ``fused=`` takes only
    what fuse_gate_up marked (a concatenated [w_gate; w_up], a checkpoint's gate_up_proj, is
    refused: ``w.chunk(2, dim=0)`` splits it). Returns M x N in
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
        check_gate_up(fused)
    return _epilogue_call(a, fused, None, None, out_dtype, True, None, out, sync)


class _CallableModule(types.ModuleType):
    """``tirx_gemm.matmul(a, b)`` calls :func:`matmul`; the module's other names stay
    reachable as attributes (``tirx_gemm.matmul.use_bundle``). Under torch.compile call
    ``tirx_gemm.torch_op.matmul`` (or use ``tirx_gemm.nn.Linear``): dynamo cannot trace a
    call of a module object."""

    def __call__(self, a, b, *args, **kw):
        return matmul(a, b, *args, **kw)


sys.modules[__name__].__class__ = _CallableModule
