"""Kernel names that say what ran: step, dtype, tile, swap-AB, split, epilogue.

A build's PrimFunc is exported under :func:`kernel_name` (its global symbol), so the CUDA kernel
that torch.profiler, nsys and ncu show is :func:`kernel_symbol`, for example
``tirx_v12_bf16_m128n192_swap_split2_bias_silu_kernel`` (TVM appends ``_kernel`` to the device
function). The name is a function of the step and its builder keywords only, so it is stable
across builds, processes and bundles, and ``rules.explain`` prints the same string. The library's
entry point stays ``main`` (TVM's ``__tvm_main__``), so loading is unchanged.

Pure Python (no TVM, no torch): rules.explain and the build pipeline both import it.
"""

from __future__ import annotations

import re

__all__ = ["kernel_name", "kernel_symbol", "DEVICE_SUFFIX"]

DEVICE_SUFFIX = "_kernel"  # what TVM appends to a PrimFunc's global symbol for its device kernel
PREFIX = "tirx"
_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3", "float8_e4m3": "e4m3",
           "float8_e5m2": "e5m2", "float32": "f32"}
_ACTS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelutanh", "silu": "silu"}
_UNSAFE = re.compile(r"[^a-z0-9]+")


def _word(value) -> str:
    return _UNSAFE.sub("", str(value).lower())


def kernel_name(step, kwargs: dict | None = None, dtype: str | None = None,
                epilogue: dict | None = None) -> str:
    """The global symbol of the kernel ``step`` (a registry.Step, or a step id such as "v12")
    builds with builder keywords ``kwargs``: ``tirx_<step>_<dtype>_m<BLK_M>n<BLK_N>`` then, when
    set, the operand layout (``nt``, ``tn``, ``tt``: v15's A_MAJOR / B_MAJOR "MN", the op's
    layout letters), ``runtimek`` (RUNTIME_K), ``swap`` (SWAP_AB), ``split<S>`` (SPLIT_K > 1),
    ``streamk``, the epilogue (``bias``, or ``smembias`` with v12's BIAS_SMEM, the activation,
    ``approx`` with ACT_APPROX, v15's ``d<act>`` (ACT_GRAD), ``save<act>`` (ACT_SAVE) and
    ``dbias`` (ACT_GRAD_DBIAS, WGRAD_DBIAS), ``swiglu``, ``f32out``) and ``timeline`` for an
    instrumented build.

    ``dtype``: the operand dtype when ``kwargs`` has none ("dtype" in kwargs wins; float16 by
    default). ``epilogue``: fused-epilogue keywords (BIAS, ACT, OUT_DTYPE, SWIGLU) merged over
    ``kwargs``. The tile is BLK_M / BLK_N from the keywords, else the step's default tile."""
    kw = {**(kwargs or {}), **(epilogue or {})}
    sid = getattr(step, "id", step)
    sid = _word(sid if str(sid).lower().startswith("v") else f"v{sid}")
    dt = str(kw.get("dtype") or dtype or "float16").removeprefix("torch.")
    tile = getattr(step, "tile", None) or (None, None, None)
    bm, bn = kw.get("BLK_M") or tile[0], kw.get("BLK_N") or tile[1]
    parts = [PREFIX, sid, _DTYPES.get(dt, _word(dt))]
    if bm and bn:
        parts.append(f"m{int(bm)}n{int(bn)}")
    layout = "".join("t" if kw.get(k) == "MN" else "n" for k in ("A_MAJOR", "B_MAJOR"))
    if layout != "nn":  # v15: which operand is read MN-major (a transposed view), as op layouts
        parts.append(layout)
    if kw.get("RUNTIME_K"):
        parts.append("runtimek")
    if kw.get("SWAP_AB"):
        parts.append("swap")
    split = kw.get("SPLIT_K") or 1
    if isinstance(split, int) and split > 1:
        parts.append(f"split{split}")
    if kw.get("STREAM_K"):
        parts.append("streamk")
    if kw.get("BIAS"):
        parts.append("smembias" if kw.get("BIAS_SMEM") else "bias")
    act = kw.get("ACT")
    if act:
        parts.append(_ACTS.get(act, _word(act)))
        if kw.get("ACT_APPROX"):
            parts.append("approx")
    for key, word in (("ACT_GRAD", "d"), ("ACT_SAVE", "save")):  # v15's backward epilogues
        if kw.get(key):
            parts.append(word + _ACTS.get(kw[key], _word(kw[key])))
    if kw.get("ACT_GRAD_DBIAS") or kw.get("WGRAD_DBIAS"):
        parts.append("dbias")
    if kw.get("SWIGLU"):
        parts.append("swiglu")
    if kw.get("OUT_DTYPE"):
        parts.append(_DTYPES.get(str(kw["OUT_DTYPE"]), _word(kw["OUT_DTYPE"])) + "out")
    if kw.get("TIMELINE"):
        parts.append("timeline")
    return "_".join(p for p in parts if p)


def kernel_symbol(step, kwargs: dict | None = None, dtype: str | None = None,
                  epilogue: dict | None = None) -> str:
    """The CUDA kernel's name as profilers show it: :func:`kernel_name` + ``_kernel``."""
    return kernel_name(step, kwargs, dtype, epilogue) + DEVICE_SUFFIX
