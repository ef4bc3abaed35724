"""The bias gradient beside wgrad: ``db = dz.T @ a`` and ``dbias = dz.sum(0)`` from one kernel.

Without it the backward of a Linear with a bias reads all of dz once more after its GEMMs
(``dz.sum(0)``, M x N in the operands' dtype), on every path: the saved-z path (dz from torch's
elementwise activation backward), the recompute path without ``act_grad.DBIAS``, and a Linear
with no activation (dz = dy). With it, wgrad on v15 (both operands MN-major, K the token count
at run time: tirx_gemm.op.layouts) is built with ``WGRAD_DBIAS``: the tiles of its first column
of tiles also run, for each k16 slice of dz, one m64n8k16 wgmma against a tile of ones, so the
tensor core sums dz over the tokens beside the product (hopper/layouts.py says how) and the
kernel writes the bias gradient, fp32 (N,). Deterministic: one CTA sums each column over all
tokens in token order; no atomics, no partials.

When it runs (:func:`applies`): :data:`ENABLED` (off until the A/B of lab/training_backward
says otherwise), the call's tokens x in-features (dz's rows x a's columns) at most :data:`BOUND`,
sm_90a, the in-place wgrad would run (v15, no ``main_grad`` on the weight) with K at run time
(layouts.WGRAD_RUNTIME_K), and both the weight and the bias need a gradient. The bias's own
``main_grad``, if any, gets the fp32 sum added. While torch.compile traces the backward, the op
:data:`OP` (two outputs).
"""

from __future__ import annotations

import torch

__all__ = ["ENABLED", "BOUND", "OP", "set_enabled", "tune", "request", "kernel", "applies", "run",
           "wgrad_dbias"]

# off by the rule of lab/training_backward (GPU tests pass on an H100; the A/B failed)
ENABLED = False
# the largest tokens x in-features (M x K, the size of the layer's input) where the kernel runs:
# its gain over wgrad + dz.sum(0) falls as both grow (lab/training_backward, "A bounded rule")
BOUND = 2 ** 25


def set_enabled(on: bool) -> None:
    """The bias gradient from wgrad's kernel on, or off (``dz.sum(0)``, the default)."""
    global ENABLED
    if not isinstance(on, bool):
        raise TypeError(f"set_enabled({on!r}): True or False")
    ENABLED = on


def tune() -> dict:
    """v15's tune keywords of the wgrad build (layouts' for TT) plus ``WGRAD_DBIAS``."""
    from tirx_gemm.op.layouts import _tune
    return {**_tune(None, True, True), "WGRAD_DBIAS": True}


def request(N: int, K: int, M: int, dtype: str, sm_count: int | None = None,
            arch: str = "sm_90a"):
    """The bundle.export request (step, build shape, kwargs) of the kernel :func:`kernel`
    loads for a layer of N out- and K in-features at M tokens (one kernel for every M where
    the wgrad build takes K at run time)."""
    from tirx_gemm import registry, spec
    from tirx_gemm.op.keywords import build_shape
    from tirx_gemm.op.layouts import layout_kwargs, layout_shape
    sm_count = spec.SM_COUNT[arch] if sm_count is None else sm_count
    st = registry.get("v15", arch)
    kw = layout_kwargs(st, dtype, sm_count, True, True, tune())
    return st, build_shape(layout_shape(N, K, M, kw), kw), kw


def kernel(dtype, N: int, K: int, M: int, device):
    """The loaded kernel ``fn(dz, a, db, dbias)`` (dz M x N and a M x K as stored, db N x K,
    dbias fp32 (N,)): matmul's v15 loader (build cache or bundle) with :func:`tune`."""
    from tirx_gemm.op import matmul as MM
    return MM.v15_kernel(dtype, N, K, M, True, True, device, tune())


def applies(dz, a, device_arch: str | None, weight_main_grad: bool) -> bool:
    """Whether :func:`wgrad_dbias` runs: :data:`ENABLED`, ``device_arch`` sm_90a, no
    ``main_grad`` on the weight, tokens x in-features at most :data:`BOUND`; the caller has
    checked that v15 reads dz and a in place."""
    return ENABLED and device_arch == "sm_90a" and not weight_main_grad and dz.shape[0] > 0 \
        and dz.shape[0] * a.shape[1] <= BOUND \
        and tune().get("RUNTIME_K") is True  # v15 builds WGRAD_DBIAS with K at run time only


def run(dz, a):
    """(db, dbias): db = dz.T @ a (N x K, dz's dtype), dbias = dz.sum(0) in fp32 (N,)."""
    M, N = dz.shape
    K = a.shape[1]
    fn = kernel(dz.dtype, N, K, M, dz.device)
    db = dz.new_empty((N, K))
    dbias = dz.new_empty((N,), dtype=torch.float32)
    fn(dz, a, db, dbias)
    return db, dbias


def wgrad_dbias(dz, a, traced: bool = False):
    """:func:`run`, or while torch.compile traces the backward (``traced``) the op :data:`OP`."""
    return (OP if traced else run)(dz, a)


# tirx_gemm::wgrad_dbias_mm(dz, a) -> (db, dbias): the kernel as a graph node for the traced
# backward (fake tensors make no launch); no backward (double backward is refused before it).
_LIB = torch.library.Library("tirx_gemm", "FRAGMENT")
_LIB.define("wgrad_dbias_mm(Tensor dz, Tensor a) -> (Tensor, Tensor)")
_LIB.impl("wgrad_dbias_mm", run, "CompositeExplicitAutograd")


@torch.library.register_fake("tirx_gemm::wgrad_dbias_mm", lib=_LIB)
def _wgrad_dbias_mm_fake(dz, a):
    if dz.dim() != 2 or a.dim() != 2 or dz.shape[0] != a.shape[0] or dz.dtype != a.dtype:
        raise ValueError(f"wgrad_dbias_mm: dz {tuple(dz.shape)} and a {tuple(a.shape)} must be "
                         f"2-D with one token count (rows) and one dtype")
    return dz.new_empty((dz.shape[1], a.shape[1])), dz.new_empty((dz.shape[1],),
                                                                 dtype=torch.float32)


OP = torch.ops.tirx_gemm.wgrad_dbias_mm.default
