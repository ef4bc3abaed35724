"""Run one built GEMM step on this GPU: check it, time it, return a record.

:func:`run_step` is the run side end to end (this module's only name); the jobs it strings
together live in modules named after them, and callers import each from its own module:

* ``tirx_gemm.run.device``: the device probe (compute capability, SM count, nvidia-smi clocks);
* ``tirx_gemm.run.loader``: TVM's runtime libraries and :func:`load_kernel`;
* ``tirx_gemm.run.launcher``: build metadata, operand validation, launch, the host hang guard;
* ``tirx_gemm.run.checking``: fresh inputs, the fp32 reference, compare (rules in numerics);
* ``tirx_gemm.run.timing``: CUDA-event timing, warm-up, L2 rotation, torch timed alongside.

House rules it implements (CONTRIBUTING.md, house style rules 6-8): correctness is never trivially satisfied
(checking.py), timing happens only after a passing check (timing.py), and the result is a
record (a dict, see records.py), not printed text. Imports torch, numpy and the standard
library only: there is no ``import tvm`` on the run side, so it works on a GPU host where
the TVM compiler is not installed.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import math
import sys

import torch

from tirx_gemm import numerics, registry
from tirx_gemm.run.checking import Log, _print, _quiet, check, torch_dtype
from tirx_gemm.run.device import check_device, query_nvidia_smi
from tirx_gemm.gitinfo import git_sha
from tirx_gemm.run.launcher import (BuildMeta, check_workspace, hang_label, label, launch,
                                make_workspace, validate_inputs, workspace_specs)
from tirx_gemm.run.timing import (DEFAULT_MIN_WARMUP_MS, bench, bench_interleaved,
                              make_bench_sets, tflops, torch_matmul)

__all__ = ["run_step"]

_run_check = check  # run_step's keyword ``check`` shadows the function


class Fp8Operands:
    """An fp8 step's kernel (registry Step.fp8: v13, f(A_e4m3, B_e4m3, D, scale_a, scale_b))
    run on the runner's 2-byte inputs, as f(A, B, D). Each new (A, B) is quantized once
    with power-of-two scales of the build's SCALE mode (per tensor, row, 1x128 / 128x128
    block: 2**ceil(log2(amax / 448))), and A and B are overwritten *in place* with the
    dequantized values, which a power-of-two scale makes exact in fp16 and bf16: the
    runner's fp32 reference of A @ B.T, taken after the launch, is then exactly the product
    of what the kernel read, and only the kernel's accumulation and output rounding are
    compared (numerics.fp8_tolerances). The quantized operands are kept per input set, so
    the timed launches call the kernel alone."""

    def __init__(self, kernel, scale: str):
        self.kernel, self.scale = kernel, numerics.check_fp8_scale(scale)
        self._held: dict = {}

    def _quantize(self, x, operand: str):
        R, K = x.shape
        blk = numerics.FP8_BLOCK
        rows = 1 if operand == "a" else blk
        v = x.float().abs()
        if self.scale == "tensor":
            amax = v.amax().reshape(1, 1)
        elif self.scale == "row":
            amax = v.amax(dim=1, keepdim=True)
        else:
            pad = torch.zeros(-(-R // rows) * rows, -(-K // blk) * blk, device=x.device)
            pad[:R, :K] = v
            amax = pad.reshape(pad.shape[0] // rows, rows, -1, blk).amax(dim=(1, 3))
        s = torch.where(amax > 0, torch.exp2(torch.ceil(torch.log2(amax / numerics.E4M3_MAX))),
                        torch.ones_like(amax))
        full = (s.expand(R, K) if self.scale != "block" else
                s.repeat_interleave(rows, 0).repeat_interleave(blk, 1)[:R, :K])
        q = (x.float() / full).to(torch.float8_e4m3fn)
        x.copy_(q.float() * full)  # exact: <= 4 significant bits times a power of two
        if self.scale == "tensor":
            s = s.reshape(1)
        elif self.scale == "row":
            s = s.reshape(R)
        return q.view(torch.uint8), s.contiguous()

    # as many input sets as the timed loop rotates among (timing.n_sets_for_l2's cap):
    # their quantized copies are half their bytes, and a set quantized again inside the
    # timed events would time torch's quantization ops, not the kernel (at small shapes
    # the loop rotates among hundreds of sets to keep them out of L2)
    MAX_HELD = 1024

    def _operands(self, A, B):
        key = (A.data_ptr(), B.data_ptr(), A._version, B._version)
        held = self._held.get(key)
        if held is None:
            if len(self._held) >= self.MAX_HELD:
                self._held.clear()
            (qa, sa), (qb, sb) = self._quantize(A, "a"), self._quantize(B, "b")
            held = self._held[(A.data_ptr(), B.data_ptr(), A._version, B._version)] = (
                qa, qb, sa, sb)
        return held

    def prepare(self, sets) -> None:
        """Quantize every timed input set before the timing starts (see MAX_HELD)."""
        if len(sets) > self.MAX_HELD:
            raise ValueError(f"{len(sets)} input sets: Fp8Operands holds {self.MAX_HELD}")
        for A, B, *_ in sets:
            self._operands(A, B)

    def __call__(self, A, B, D, *workspace):
        qa, qb, sa, sb = self._operands(A, B)
        self.kernel(qa, qb, D, sa, sb, *workspace)


class GroupedOperands:
    """A grouped step's kernel (registry Step.grouped: sm_90a v14, f(A, B_e, D, offs)) run on
    the runner's dense operands as f(A, B, D): every one of the build's E experts gets a copy
    of B (B_e is (E, N, K)) and the M rows are split evenly over them (contiguous layout, offs
    the experts' row ends), so D = A @ B.T and the dense check holds unchanged. The timed
    launch does the dense problem's flops as E experts of about M / E rows, each reading its
    own weight: E times the weight bytes of the torch.matmul it is timed against. The copies
    are made per input set before the timing (prepare); masked and fused builds are refused."""

    MAX_HELD = 1024

    def __init__(self, kernel, kwargs: dict | None):
        kw = dict(kwargs or {})
        fused = [k for k in ("ROW_SCALE", "BIAS", "SWIGLU", "FP8_BLOCK") if kw.get(k)]
        if kw.get("LAYOUT", "contiguous") != "contiguous" or fused:
            raise ValueError(f"the runner checks and times v14's plain contiguous builds; this "
                             f"one is {kw.get('LAYOUT', 'contiguous')}{' with ' if fused else ''}"
                             f"{', '.join(fused)} (its GPU tests: tests/test_gpu_grouped.py)")
        self.kernel, self.E = kernel, int(kw.get("E", registry.GROUPED_E))
        self._held: dict = {}

    def _weights(self, B):
        key = (B.data_ptr(), B._version)
        held = self._held.get(key)
        if held is None:
            if len(self._held) >= self.MAX_HELD:
                self._held.clear()
            held = self._held[key] = B.unsqueeze(0).expand(self.E, -1, -1).contiguous()
        return held

    def _offs(self, M: int, device):
        key = ("offs", M, device)
        if key not in self._held:
            counts = [M // self.E + (e < M % self.E) for e in range(self.E)]
            self._held[key] = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(
                device=device, dtype=torch.int32)
        return self._held[key]

    def prepare(self, sets) -> None:
        """Copy every timed input set's weight before the timing starts."""
        for A, B, *_ in sets:
            self._weights(B)
            self._offs(A.shape[0], A.device)

    def __call__(self, A, B, D, *workspace):
        self.kernel(A, self._weights(B), D, self._offs(A.shape[0], A.device), *workspace)


# --------------------------------------------------------------------------------------
# provenance
# --------------------------------------------------------------------------------------
_read_git_sha = git_sha  # run_step's keyword ``git_sha`` shadows the function


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tvm_version(meta: BuildMeta) -> str | None:
    if meta.tvm_version:
        return meta.tvm_version
    tvm = sys.modules.get("tvm")
    if tvm is not None and getattr(tvm, "__version__", None):
        return str(tvm.__version__)
    return _dist_version("apache-tvm")


def _finite_or_none(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _bench_sets(M: int, N: int, K: int, dtype: str, dev) -> list[tuple]:
    """timing.make_bench_sets in the build's dtype (it makes float16 sets; bfloat16 ones
    are converted, which keeps the same L2 rotation since both dtypes are 2 bytes)."""
    sets = make_bench_sets(M, N, K, device=dev)
    if dtype == "float16":
        return sets
    tdt = torch_dtype(dtype)
    out = []
    while sets:  # convert set by set, so at most one extra set is alive at a time
        out.append(tuple(t.to(tdt) for t in sets.pop(0)))
    return out


# --------------------------------------------------------------------------------------
# one step, end to end
# --------------------------------------------------------------------------------------
def run_step(kernel, meta, *, check: bool = True, time: bool = True, warmup: int = 10,
             iters: int = 100, rounds: int = 4, min_warmup_ms: float = DEFAULT_MIN_WARMUP_MS,
             torch_baseline: bool = True, time_unverified: bool = False, device=None,
             git_sha: str | None = None, seed: int | None = None,
             log: Log | None = _print) -> dict:
    """Check and time one built step on this GPU; return a record (a dict, see records.py).

    ``kernel`` is the loaded function f(A, B, D, *workspace) (load_kernel); ``meta`` has step,
    arch, M, N, K (and optionally kwargs, tvm_version, git_sha, lesson, lib_path). The
    operands are of the build's dtype (kwargs "dtype", float16 unless given); the step's
    workspace operands are allocated zero-filled once and passed after D to every launch
    (the check fails a kernel that leaves them dirty). The GPU must fit the arch
    (DeviceMismatchError otherwise). The check runs first; a kernel that fails it is not timed
    unless ``time_unverified`` (and its record then says verified=false). With ``check=False``
    the record also says verified=false. Timing: warm-up (>= ``warmup`` launches and
    ``min_warmup_ms`` of GPU time), then ``iters`` launches of the kernel and of torch.matmul,
    alternating launch by launch on the same input sets (``rounds`` queue-ahead batches).
    """
    log = log or _quiet
    m = BuildMeta.from_any(meta)
    with hang_label(label(m)):  # what a hang report names, for every wait below
        return _run_step(kernel, m, log=log, check=check, time=time, warmup=warmup,
                         iters=iters, rounds=rounds, min_warmup_ms=min_warmup_ms,
                         torch_baseline=torch_baseline, time_unverified=time_unverified,
                         device=device, git_sha=git_sha, seed=seed)


def _run_step(kernel, m, *, log, check, time, warmup, iters, rounds, min_warmup_ms,
              torch_baseline, time_unverified, device, git_sha, seed) -> dict:
    M, N, K = m.shape
    dev_info = check_device(m.arch, device)
    dev = torch.device("cuda", dev_info["index"])
    clocks = dev_info["clocks"]
    log(f"{m.step}/{m.arch} M,N,K={M},{N},{K} {m.dtype} on {dev_info['name']} "
        f"(cc {dev_info['capability']}, {dev_info['sm_count']} SMs"
        + (f", SM clock {clocks['sm_mhz']} MHz" if clocks and clocks.get("sm_mhz") else "")
        + ")")

    dtype = m.dtype
    compare_kw = {}
    step = registry.get(m.step, m.arch)
    if step.fp8:  # e4m3 operands: quantize the 2-byte inputs (Fp8Operands), fp8 tolerances
        kernel = Fp8Operands(kernel, (m.kwargs or {}).get("SCALE", "tensor"))
        tol = numerics.fp8_tolerances(dtype, K, numerics.fp8_promote(m.kwargs))
        compare_kw = {"rtol": tol.rtol, "atol_scale": tol.atol_scale,
                      "max_rel_err": tol.max_rel_err}
        log(f"fp8 step: A and B quantized to e4m3 (power-of-two {step.dtype(m.kwargs)} "
            f"round trip), tolerances {tol}")
    if step.grouped:  # v14: the dense operands as E experts' (GroupedOperands)
        kernel = GroupedOperands(kernel, m.kwargs)
        log(f"grouped step: B copied to each of {kernel.E} experts, the {M} rows split evenly "
            f"over them, so D = A @ B.T")
    # the step's extra operands, zero-filled once; every launch below passes them after D
    workspace = make_workspace(workspace_specs(m), dev)
    ws_tensors = tuple(t for _, t in workspace)

    def launch_checked(A, B, D):  # the GPU was checked once, by check_device above
        launch(kernel, m, A, B, D, sync=True, workspace=workspace, device_checked=True)

    def timed_kernel(A, B, D):  # the timed loop calls the kernel raw (validated once below)
        kernel(A, B, D, *ws_tensors)

    verified = False
    rel_err = None
    check_results = None
    if check:
        log("checking against the fp32 torch reference (fresh inputs, D poisoned with NaN)")
        rep = _run_check(kernel, M, N, K, launch=launch_checked, seed=seed,
                         device=dev, dtype=dtype, workspace=workspace, log=log,
                         **compare_kw)
        verified = rep["ok"]
        rel_err = rep["rel_err"]
        check_results = [
            {k: r[k] for k in ("kind", "seed", "ok", "exact", "rel_frobenius_error",
                               "max_abs_error", "n_nan", "n_inf", "n_mismatch", "n_total",
                               "first_mismatches", "reason")}
            for r in rep["results"]
        ]
        log("check: " + ("passed" if verified else "FAILED"))
    else:
        log("check skipped: the record will say verified=false")

    timing = None
    torch_timing = None
    clocks_after = None
    timed = time and (verified or time_unverified)
    if time and not timed:
        log("timing skipped: the kernel failed its check (time_unverified=True to time anyway)")
    if timed:
        sets = _bench_sets(M, N, K, dtype, dev)
        for A, B, D in sets[:1]:
            validate_inputs(A, B, D, M, N, K, dtype=dtype)  # the timed loop calls it raw
        if isinstance(kernel, (Fp8Operands, GroupedOperands)):  # once per set, before any event
            kernel.prepare(sets)
        check_workspace(workspace_specs(m), workspace, dev)
        if torch_baseline:
            log(f"timing {m.step} and torch.matmul(A, B.T) (cuBLAS): warm-up, then {iters} "
                f"launches each, alternating, CUDA events, {len(sets)} input set(s)")
            res = bench_interleaved({"kernel": timed_kernel, "torch": torch_matmul}, sets,
                                    warmup=warmup, iters=iters, rounds=rounds,
                                    min_warmup_ms=min_warmup_ms, log=log)
            timing, torch_timing = res["kernel"], res["torch"]
        else:
            log(f"timing {m.step}: warm-up, then {iters} launches, CUDA events, {len(sets)} "
                "input set(s)")
            timing = bench(timed_kernel, sets, warmup=warmup, iters=iters,
                           min_warmup_ms=min_warmup_ms, log=log)
        clocks_after = query_nvidia_smi(torch.cuda.get_device_properties(dev),
                                         dev.index)["clocks"]
        del sets

    k_tflops = tflops(M, N, K, timing.median_ms) if timing else None
    t_tflops = tflops(M, N, K, torch_timing.median_ms) if torch_timing else None
    ratio = (k_tflops / t_tflops) if (k_tflops and t_tflops) else None
    if timing:
        log(f"{m.step}/{m.arch}: {k_tflops:.1f} TFLOP/s"
            + (f", torch {t_tflops:.1f} TFLOP/s, ratio {ratio:.3f}" if ratio else "")
            + ("" if verified else "  [UNVERIFIED]"))

    sha = git_sha or m.git_sha or _read_git_sha()
    return {
        "record_version": 1,
        "step": m.step,
        "arch": m.arch,
        "lesson": m.lesson,
        "M": M,
        "N": N,
        "K": K,
        "dtype": dtype,
        "build_kwargs": m.kwargs or {},
        "device": dev_info["name"],
        "capability": dev_info["capability"],
        "sm_count": dev_info["sm_count"],
        "l2_bytes": dev_info["l2_bytes"],
        "clocks": clocks,
        "driver_version": dev_info["driver_version"],
        "cuda_runtime": dev_info["cuda_runtime"],
        "torch_version": torch.__version__,
        "tvm_version": _tvm_version(m),
        "tvm_ffi_version": _dist_version("apache-tvm-ffi"),
        "python_version": sys.version.split()[0],
        "git_sha": sha,
        "checked": bool(check),
        "verified": bool(verified),
        "rel_err": _finite_or_none(rel_err),
        "check": check_results,
        "median_ms": timing.median_ms if timing else None,
        "best_ms": timing.best_ms if timing else None,
        "tflops": k_tflops,
        "torch_median_ms": torch_timing.median_ms if torch_timing else None,
        "torch_best_ms": torch_timing.best_ms if torch_timing else None,
        "torch_tflops": t_tflops,
        "ratio_to_torch": ratio,
        "clocks_after_timing": clocks_after,
        "timing": None if timing is None else {
            "method": ("CUDA events around each launch"
                       + ("; kernel and torch launches alternate" if torch_timing else "")
                       + ("; launches queued behind a GPU sleep" if timing.queue_ahead else "")),
            "warmup_launches": timing.warmup,
            "min_warmup_ms": min_warmup_ms,
            "iters": timing.iters,
            "rounds": timing.rounds,
            "n_input_sets": timing.n_sets,
            "mean_ms": timing.mean_ms,
            "torch_mean_ms": torch_timing.mean_ms if torch_timing else None,
        },
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
