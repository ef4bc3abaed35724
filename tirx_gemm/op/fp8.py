"""``tirx_gemm.matmul_fp8(a, b, scale_a, scale_b)``: v13's scaled e4m3 GEMM for PyTorch.

``matmul_fp8(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)`` returns
``(a * scale_a) @ (b * scale_b).T`` for e4m3 (``torch.float8_e4m3fn``) operands, fp32
accumulation, in ``out_dtype`` (bfloat16 or float16), with the scales broadcast as below.

Conventions: torch._scaled_mm's where they fit.

* ``a`` is M x K, row-major (K-major); ``b`` is **N x K**, row-major: the project's
  D = A @ B.T, and the layout of a Linear weight. ``torch._scaled_mm(a, mat2, ...)`` takes
  ``mat2`` K x N column-major, which is this ``b`` transposed: ``_scaled_mm(a, b.t(), ...)``
  computes what ``matmul_fp8(a, b, ...)`` does.
* scales are float32 on a's device, as in ``_scaled_mm``:
  per tensor, ``scale_a`` and ``scale_b`` of one element each (shape ``()``, ``(1,)`` or
  ``(1, 1)``); rowwise, ``scale_a`` (M, 1) and ``scale_b`` (1, N) (``_scaled_mm``'s
  rowwise shapes; ``scale_b[0, n]`` scales row n of ``b``); block (DeepGEMM's layout,
  which ``_scaled_mm`` takes as its 1x128 x 128x128 recipe with both scales column-major):
  ``scale_a`` (M, K/128) per 1x128 block of ``a`` and ``scale_b`` (ceil(N/128), K/128) per
  128x128 block of ``b``, K a multiple of 128 (whole blocks, as checkpoints lay them out).
  The mode is read from the shapes; mixing two modes is refused.
* bad input is refused before the launch in one line: a scale shape or dtype that fits no
  kind, K not a multiple of 128 with block scales, e5m2 operands (only e4m3 kernels are
  built). Non-finite or non-positive scales are refused only with ``TIRX_GEMM_CHECK=1``:
  the check reads the scales back (a device sync), so it is off by default and skipped
  while a CUDA graph is being captured.
* ``fast_accum`` as ``_scaled_mm``'s ``use_fast_accum``: False (default) promotes the
  tensor core's limited-precision partial sums into fp32 every 128 K (v13's PROMOTE=4,
  overlapped with the next stage's wgmmas); True keeps the whole K in the tensor core's
  accumulator (PROMOTE=0; per-tensor and rowwise only: block scaling always promotes).
  Deep K (PROMOTE_EVERY_SECOND_FROM_K): the promoted 128 x 128 tile, unsplit, per tensor and
  rowwise, at K >= 8192 promotes every second 128-K stage, overlapped (PROMOTE=8: a drain
  per four stages; its tolerance is numerics.fp8_tolerances at PROMOTE=8). Measured on an
  H100 on held-out shapes against PROMOTE=4 (lab/fp8_on_hopper/README.md, "Promotion every
  second stage at deep K only"); below 8192 it lost at short K, so PROMOTE=4 stays there.
  Fast accumulation is outside the project's tolerance at deep K, like torch's
  use_fast_accum: measured on the H200 (lab/fp8_on_hopper/records/fp8_h200_1.jsonl),
  at K >= 2064 a few elements per million fall outside the tolerance derived from the
  14-bit accumulator emulation (37 of 16.7M at 4096^3, rel. error 2.1e-3 against 1.66e-3
  promoted; 230 of 67M at 8192^3), while every promoted check passed. It was 1.5-1.6x
  faster than the (serial) promotion of that run at the large shapes.
* the tile (:func:`choose_fp8`, :func:`explain_fp8` says why): M <= 128: BLK_M 64, one
  consumer warpgroup, and the width W of SMALL_M_WIDTHS (128, 64, 32, 16: one m64nWk32
  wgmma per k32 step) whose busiest CTA streams the fewest columns of b, a fixed cost per
  tile counted as TILE_COST_COLUMNS columns (:func:`small_m_width`: at 1x4096x4096, 128
  tiles of width 32 on 132 SMs); else promoted :func:`mid_m_tile` (128 x 128
  unless its tiles leave SMs idle that 128 x 64 or 64 x 64 fill), or 128 x 256 for
  fast_accum without block scaling (an unpromoted 128x256 tile fits the registers; the
  overlapped promotion's acc + two partial sums fit up to BLK_N 128). One kernel per (mode,
  fast_accum, tile, out dtype) serves every shape: v13 is built with RUNTIME_M and
  RUNTIME_NK, so a bundle holds 65 kernels per out dtype (:func:`export_requests`), and a
  suite's fp8 entries need only their picks (:func:`suite_requests`).
* deep K at small M (:func:`split_k`): where even the narrowest tiles leave more than half
  the SMs idle, SPLIT_K = S units per tile each sum whole pairs of 128-K stages; the unit
  counted last adds the S partial tiles in split order (deterministic) and applies the
  per-tensor or rowwise scales once (block scales are per 128-K block: applied in each
  unit's mainloop); its workspace comes from tirx_gemm.run.workspace (per stream, fresh
  under CUDA-graph capture).
* how e4m3 reaches the kernel: as ``t.view(torch.uint8)``, a zero-copy view of the same
  bytes (the kernel's A and B are uint8 operands; see v13's card).

The kernel comes from the build cache here or, on a GPU host without TVM, from a bundle
(``tirx_gemm.matmul.use_bundle`` / ``$TIRX_GEMM_BUNDLE``), exactly as matmul's do; export
one with ``tirx-gemm export --suite tirx_gemm/op/suites/fp8-models.json --arch sm_90a``
(fp8 entries of a suite: "kind": "fp8", "scales": [...]) and time it with ``tirx-gemm
bench --suite`` (tirx_gemm.op.fp8_bench). The layer: tirx_gemm.op.fp8_nn (Fp8Linear,
patch_fp8, the custom op). On sm_100a, v13 builds e4m3 kind::f8f6f4 with tensor or row
scales and MXFP8 (kind::mxf8f6f4.block_scale, UE8M0 scales in TMEM, on a CTA pair), checked
on NumSim only; matmul_fp8 does not serve them. Importing this module imports neither torch
nor TVM.
"""

from __future__ import annotations

import threading

from tirx_gemm import numerics, registry, spec
from tirx_gemm.op.operands import check_dense, check_devices, check_no_overlap

__all__ = ["matmul_fp8", "scale_mode", "check_fp8_operands", "choose_fp8", "explain_fp8",
           "small_m_width", "variants", "suite_requests", "tile_candidates", "export_requests",
           "FP8_STEP", "OUT_DTYPES"]

FP8_STEP = "v13"
ARCH = "sm_90a"
K_MULTIPLE = spec.row_multiple("float8_e4m3fn")  # TMA: a row of a or b (K bytes): 16
N_MULTIPLE = spec.row_multiple("bfloat16")       # TMA: a row of out (N x 2 bytes): 8
ALIGN_BYTES = spec.TMA_ROW_BYTES
OUT_DTYPES = ("bfloat16", "float16")
SMALL_M = 128     # M <= this (one row of 128-row tiles): the 64 x 64 tile
SCALE_BLOCK = numerics.FP8_BLOCK


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def scale_mode(scale_a_shape, scale_b_shape, M: int, N: int, K: int) -> str:
    """"tensor", "row" or "block" from the scales' shapes, or a one-line ValueError."""
    sa, sb = tuple(scale_a_shape), tuple(scale_b_shape)

    def one(s):
        n = 1
        for d in s:
            n *= d
        return n == 1 and len(s) <= 2

    kb = _ceil_div(K, SCALE_BLOCK)
    if one(sa) and one(sb):
        return "tensor"
    if sa == (M, 1) and sb == (1, N):
        return "row"
    if sa == (M, kb) and sb == (_ceil_div(N, SCALE_BLOCK), kb):
        return "block"
    raise ValueError(
        f"scale_a {sa} and scale_b {sb} match no scaling for a {M}x{K} @ ({N}x{K}).T: use "
        f"per tensor (), (); rowwise ({M}, 1), (1, {N}); or block ({M}, {kb}), "
        f"({_ceil_div(N, SCALE_BLOCK)}, {kb})")


def check_fp8_operands(a, b, scale_a, scale_b, out_dtype, out=None, *,
                       require_cuda: bool = True) -> tuple[int, int, int, str, str]:
    """(M, N, K, scale mode, out dtype name), or a one-line TypeError / ValueError."""
    import torch
    ops = check_fp8_tensors(a, b, scale_a, scale_b, out)
    odt = check_fp8_types(a, b, scale_a, scale_b, out_dtype, out)
    if require_cuda:
        check_devices(ops, "matmul_fp8", "an sm_90a GPU",
                      "torch._scaled_mm or dequantize and torch.matmul", "them (and the scales)")
    M, N, K, mode = check_fp8_shapes(a, b, scale_a, scale_b, out)
    for name, t in ops:
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous (strides {t.stride()}): pass "
                             f"{name}.contiguous()")
    for name, t in ops:
        if name.startswith("scale"):
            continue
        if t.data_ptr() % ALIGN_BYTES:
            raise ValueError(f"{name}'s data pointer is not {ALIGN_BYTES}-byte aligned: "
                             f"TMA needs it; pass {name}.clone()")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.data_ptr() % 4:
            raise ValueError(f"{name}'s data pointer is not 4-byte aligned: pass "
                             f"{name}.clone()")
    if out is not None:
        check_no_overlap(out, a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    grad = [name for name, t in ops if t.requires_grad] if torch.is_grad_enabled() else []
    if grad:
        n = grad[0]
        raise ValueError(f"{n} requires grad and matmul_fp8 has no backward: pass "
                         f"{n}.detach() (or call it under torch.no_grad()); to train, train "
                         f"in bf16 (tirx_gemm.nn.Linear) and quantize after")
    if checks_enabled():
        check_scales_finite(scale_a, scale_b)
    return M, N, K, mode, odt


def check_fp8_tensors(a, b, scale_a, scale_b, out=None) -> list:
    """[(name, tensor)] of a call's operands: a one-line TypeError for one that is not a
    dense torch.Tensor."""
    import torch
    ops = [("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)]
    if out is not None:
        ops.append(("out", out))
    for name, t in ops:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(ops)
    return ops


def check_fp8_types(a, b, scale_a, scale_b, out_dtype, out=None) -> str:
    """The out dtype's name, or a one-line TypeError for a dtype matmul_fp8 does not take
    (tensors as check_fp8_tensors passed; no data read: the custom op's fake implementation
    runs it too)."""
    import torch
    if not isinstance(out_dtype, torch.dtype) or \
            str(out_dtype).removeprefix("torch.") not in OUT_DTYPES:
        raise TypeError(f"out_dtype={out_dtype!r}: matmul_fp8 returns torch.bfloat16 or "
                        f"torch.float16")
    for name, t in (("a", a), ("b", b)):
        if t.dtype != torch.float8_e4m3fn:
            if "e5m2" in str(t.dtype):
                raise TypeError(f"{name} has dtype {t.dtype}: only e4m3 kernels are built "
                                f"(v13's wgmma is e4m3 x e4m3); requantize to "
                                f"torch.float8_e4m3fn (fp8.quantize) or use torch._scaled_mm")
            raise TypeError(f"{name} has dtype {t.dtype}: matmul_fp8 takes "
                            f"torch.float8_e4m3fn operands (quantize: "
                            f"({name} / scale).to(torch.float8_e4m3fn))")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} has dtype {t.dtype}: scales are torch.float32 "
                            f"({name}.float())")
    if out is not None and out.dtype != out_dtype:
        raise TypeError(f"out has dtype {out.dtype} but out_dtype is {out_dtype}: pass "
                        f"out_dtype={out.dtype}, or an out of {out_dtype}")
    return str(out_dtype).removeprefix("torch.")


def check_fp8_shapes(a, b, scale_a, scale_b, out=None) -> tuple[int, int, int, str]:
    """(M, N, K, scale mode), or a one-line ValueError for shapes matmul_fp8 does not take
    (no data read: the custom op's fake implementation runs it too)."""
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    (M, K), (N, Kb) = a.shape, b.shape
    if Kb != K:
        raise ValueError(f"a is {M}x{K} but b is {N}x{Kb}: matmul_fp8 computes a @ b.T with "
                         f"b N x K (torch._scaled_mm's mat2 is b.t()), so both need K columns")
    if K % K_MULTIPLE:
        raise ValueError(f"K={K} is not a multiple of {K_MULTIPLE}: TMA needs 16-byte rows "
                         f"of a and b (K bytes); pad K with zeros to "
                         f"{_ceil_div(K, K_MULTIPLE) * K_MULTIPLE}")
    if N % N_MULTIPLE:
        raise ValueError(f"N={N} is not a multiple of {N_MULTIPLE}: TMA needs 16-byte rows "
                         f"of out (N x 2 bytes); pad b with zero rows to "
                         f"{_ceil_div(N, N_MULTIPLE) * N_MULTIPLE}")
    if out is not None and tuple(out.shape) != (M, N):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected ({M}, {N})")
    mode = scale_mode(scale_a.shape, scale_b.shape, M, N, K)
    if mode == "block" and K % SCALE_BLOCK:
        raise ValueError(f"K={K} with block scales: {block_k_rule()}")
    return M, N, K, mode


def block_k_rule() -> str:
    """Why block scales need K a multiple of 128 (one line, the end of an error)."""
    return (f"block scales need K a multiple of {SCALE_BLOCK} (one scale per whole "
            f"1x{SCALE_BLOCK} block of a and {SCALE_BLOCK}x{SCALE_BLOCK} block of b, as "
            f"DeepSeek-V3's checkpoints and torch's blockwise _scaled_mm lay them out): pad "
            f"a and b with zero columns to the next multiple of {SCALE_BLOCK}")


CHECK_SETTING = "TIRX_GEMM_CHECK"


def checks_enabled() -> bool:
    """Whether the checks that need a device sync run ($TIRX_GEMM_CHECK=1)."""
    from tirx_gemm import settings
    return CHECK_SETTING in settings.TABLE and bool(settings.get(CHECK_SETTING))


def check_scales_finite(scale_a, scale_b) -> None:
    """Under TIRX_GEMM_CHECK=1: every scale finite and > 0, or a one-line ValueError (reads
    the scales back: one device sync, so off by default; never inside a CUDA graph capture)."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        bad = ~(torch.isfinite(t) & (t > 0))
        if bool(bad.any()):
            i = int(bad.reshape(-1).nonzero()[0])
            raise ValueError(f"{name} holds {float(t.reshape(-1)[i])!r} at flat index {i}: "
                             f"scales must be finite and > 0 (checked because "
                             f"{CHECK_SETTING}=1)")


def choose_fp8(M: int, mode: str, fast_accum: bool, out_dtype: str = "bfloat16",
               sm_count: int = spec.SM_COUNT[ARCH], *, N: int | None = None,
               K: int | None = None) -> dict:
    """v13's builder keywords for a call (module docstring: the tile rule; ``N``, ``K``
    where the rule reads them, explain_fp8 says why)."""
    return _choose(M, mode, fast_accum, out_dtype, sm_count, N, K, [])


def _choose(M, mode, fast_accum, out_dtype, sm_count, N, K, why: list) -> dict:
    numerics.check_fp8_scale(mode)
    if not isinstance(fast_accum, bool):
        raise TypeError(f"fast_accum={fast_accum!r} must be True or False")
    promote = 0 if fast_accum and mode != "block" else 4
    why.append("promoted accumulation (PROMOTE=4: fp32 every 128 K)" if promote else
               "fast accumulation (PROMOTE=0: the tensor core's accumulator for all of K)")
    split = 1
    rows = None
    if M <= SMALL_M:
        blk_m, blk_n = 64, small_m_width(M, N, sm_count, why)
        if promote and N is not None and K is not None:
            split = split_k(M, N, K, blk_n, sm_count, why)
        rows = thin_a_rows(M, mode, promote, split, why)
    elif promote and N is not None:
        blk_m, blk_n = mid_m_tile(M, N, sm_count, why)
    else:
        blk_m, blk_n = 128, (256 if promote == 0 else 128)
        acc = "unpromoted" if promote == 0 else "promoted"
        why.append(f"M={M} > {SMALL_M}: 128-row tiles, BLK_N {blk_n} (the widest whose {acc} "
                   f"accumulators fit the registers)")
    kw = {"dtype": out_dtype, "SCALE": mode, "PROMOTE": promote, "BLK_M": blk_m,
          "BLK_N": blk_n, "RUNTIME_M": True, "RUNTIME_NK": True, "SM_COUNT": sm_count}
    if (promote and mode != "block" and (blk_m, blk_n) == (128, 128) and split == 1
            and K is not None and K >= PROMOTE_EVERY_SECOND_FROM_K):
        kw.update(PROMOTE=8, PROMOTE_OVERLAP=True)
        why.append(f"K={K} >= {PROMOTE_EVERY_SECOND_FROM_K}: promoted every second 128-K stage, "
                   f"overlapped (PROMOTE=8: fp32 every 256 K; lab/fp8_on_hopper)")
    if split > 1:
        from tirx_gemm import splitk
        kw.update(SPLIT_K=split, L2_GROUP=splitk.l2_group_for(split))
    if rows:
        kw["A_ROWS"] = rows
    return kw


# the 128 x 128 pick per tensor and rowwise promotes every second stage (PROMOTE=8, overlapped)
# from this K: lab/fp8_on_hopper/README.md, "Promotion every second stage at deep K only"
PROMOTE_EVERY_SECOND_FROM_K = 8192

# thin A stages (v13's A_ROWS) at M <= 16: 8 or 16 rows of A a stage, so more B stages fit; per
# tensor (promoted, unsplit) 1.07-1.26x full A on an H100; rowwise gained < 2% at some shapes,
# block lost at some: full A there (lab/fp8_on_hopper)
THIN_A_ROWS = (8, 16)
THIN_A_SCALES = ("tensor",)


def thin_a_rows(M: int, mode: str, promote: int, split: int, why: list | None = None):
    """A_ROWS of a small-M pick: the fewest of THIN_A_ROWS that hold M rows, or None."""
    rows = next((r for r in THIN_A_ROWS if M <= r), None)
    if rows is None or mode not in THIN_A_SCALES or not promote or split > 1:
        return None
    if why is not None:
        why.append(f"M={M} <= {rows}: A_ROWS={rows} (a stage loads {rows} rows of A, so "
                   f"the ring holds more stages of B; lab/fp8_on_hopper)")
    return rows


def split_k(M: int, N: int, K: int, blk_n: int, sm_count: int, why: list | None = None) -> int:
    """SPLIT_K of the 64-row tile at M <= SMALL_M: the largest S of SPLITS whose S x tiles
    units still fit one wave of the SMs, where every split gets a pair of 128-K stages;
    1 where the tiles alone fill half the SMs or more (then splitting only adds the
    workspace's traffic: measured on an H100, lab/fp8_on_hopper)."""
    tiles = _ceil_div(M, 64) * _ceil_div(N, blk_n)
    pairs = _ceil_div(_ceil_div(K, SCALE_BLOCK), 2)
    if blk_n > SPLIT_WIDTH_MAX:  # the reduction's registers on top of a 128-wide tile spill
        return 1
    best = max([S for S in SPLITS if tiles * S <= sm_count and pairs >= S], default=1)
    if best > 1 and why is not None:
        why.append(f"{tiles} tiles fill {tiles}/{sm_count} SMs: SPLIT_K={best} ({best} units "
                   f"per tile over {pairs} pairs of 128-K stages; the last unit sums the "
                   f"partial tiles in split order and applies the scales once)")
    return best


SPLITS = (2, 4, 8)
SPLIT_WIDTH_MAX = 64  # widths SPLIT_K is built for (block scales at 128 wide spill with it)
MID_M_TILES = ((128, 128), (128, 64), (64, 64))  # promoted tiles at M > SMALL_M, widest first


def mid_m_tile(M: int, N: int, sm_count: int, why: list | None = None) -> tuple[int, int]:
    """(BLK_M, BLK_N) of a promoted call at M > SMALL_M: of MID_M_TILES, the fewest waves of
    tiles times the rows a tile loads per stage (BLK_M + BLK_N: these shapes wait on loads);
    ties go to the wider. 128 x 128 unless its tiles leave SMs idle that a narrower tile's
    fill: on an H200, 512x576x7168 ran 1.84x faster at 64 x 64 (20 tiles of 128 x 128), and
    512x1536x7168 1.38x at 128 x 64 (lab/fp8_on_hopper/records/fp8_probe_h200.jsonl)."""
    cost = {t: _ceil_div(_ceil_div(M, t[0]) * _ceil_div(N, t[1]), sm_count) * sum(t)
            for t in MID_M_TILES}
    best = min(MID_M_TILES, key=lambda t: cost[t])  # min keeps the first (widest) of a tie
    if why is not None:
        why.append(f"M={M} > {SMALL_M}: BLK {best[0]}x{best[1]}, the fewest waves x rows loaded "
                   f"per stage among {', '.join(f'{a}x{b}' for a, b in MID_M_TILES)} "
                   f"(mid_m_tile)")
    return best


# small M (one or two 64-row tiles): a wgmma m64nWk32 per k32 step, W from SMALL_M_WIDTHS,
# the one whose busiest CTA streams the fewest B columns, counting a fixed cost per tile
# (its pipeline fill and epilogue) as TILE_COST_COLUMNS columns; ties go to the wider tile
SMALL_M_WIDTHS = (128, 64, 32, 16)
TILE_COST_COLUMNS = 16
DEFAULT_WIDTH = 64  # where N is not known (choose_fp8 without N)


def small_m_width(M: int, N: int | None, sm_count: int, why: list | None = None) -> int:
    """BLK_N of the 64-row tile at M <= SMALL_M (the rule in the comment above)."""
    if N is None:
        if why is not None:
            why.append(f"M={M} <= {SMALL_M}: BLK_M 64, BLK_N {DEFAULT_WIDTH} (N not given)")
        return DEFAULT_WIDTH
    rows = _ceil_div(M, 64)
    best, best_cost = None, None
    for w in SMALL_M_WIDTHS:
        tiles = rows * _ceil_div(N, w)
        cost = _ceil_div(tiles, sm_count) * (w + TILE_COST_COLUMNS)
        if best_cost is None or cost < best_cost:
            best, best_cost, best_tiles = w, cost, tiles
    if why is not None:
        why.append(f"M={M} <= {SMALL_M}: BLK_M 64 and BLK_N {best} (one m64n{best}k32 wgmma "
                   f"per k32): {best_tiles} tiles on {sm_count} SMs, "
                   f"{_ceil_div(best_tiles, sm_count)} per CTA, the fewest B columns per "
                   f"CTA among widths {SMALL_M_WIDTHS} with {TILE_COST_COLUMNS} columns' "
                   f"cost per tile (small_m_width)")
    return best


def explain_fp8(M: int, N: int, K: int, scale: str = "tensor", fast_accum: bool = False,
                out_dtype: str = "bfloat16", sm_count: int = spec.SM_COUNT[ARCH]) -> str:
    """What choose_fp8 picks for an fp8 GEMM and why, as text (one line of keywords, then
    one line per decision)."""
    why: list[str] = []
    kw = _choose(M, scale, fast_accum, out_dtype, sm_count, N, K, why)
    keys = " ".join(f"{k}={v}" for k, v in kw.items() if k not in ("dtype", "SM_COUNT"))
    head = (f"{M}x{N}x{K} e4m3 -> {out_dtype}, {scale} scales, on {ARCH} ({sm_count} SMs): "
            f"v13 {keys}")
    return "\n".join([head] + [f"  - {w}" for w in why])


VARIANT_MS = (1, 16, 32, 64, 65, 128, 129, 256, 512, 1024, 2048, 4096, 8192, 16384)


def variants(N: int, K: int, mode: str, fast_accum: bool = False, out_dtype: str = "bfloat16",
             sm_count: int = spec.SM_COUNT[ARCH]) -> list[dict]:
    """Every distinct set of v13 keywords choose_fp8 picks for a layer (N, K) over the token
    counts VARIANT_MS (the rule's boundaries lie between them): what a bundle must hold to
    serve the layer at every M."""
    seen, out = set(), []
    for M in VARIANT_MS:
        kw = choose_fp8(M, mode, fast_accum, out_dtype, sm_count, N=N, K=K)
        key = tuple(sorted(kw.items()))
        if key not in seen:
            seen.add(key)
            out.append(kw)
    return out


def suite_requests(cases, arch: str, sm_count: int) -> list[tuple]:
    """The builds a bundle needs for a suite's fp8 cases ((entry, out dtype, scale kind), as
    Suite.fp8_cases gives them): choose_fp8's pick at each entry's M, and with the entry's
    all_m every pick of its (N, K) over all M; promoted accumulation (matmul_fp8's
    default). fp8 kernels are sm_90a's: another arch is a one-line ValueError."""
    from tirx_gemm.op.matmul import build_shape
    if arch != ARCH:
        raise ValueError(f"the suite has fp8 entries, which export for {ARCH} only "
                         f"(matmul_fp8 runs v13 on Hopper; sm_100a's v13 runs on NumSim, "
                         f"one shape per build): export them with --arch {ARCH}")
    step = registry.get(FP8_STEP, ARCH)
    seen, reqs = set(), []
    for e, odt, mode in cases:
        kws = [choose_fp8(e.M, mode, False, odt, sm_count, N=e.N, K=e.K)]
        if e.all_m:
            kws += variants(e.N, e.K, mode, False, odt, sm_count)
        for kw in kws:
            key = tuple(sorted(kw.items()))
            if key not in seen:
                seen.add(key)
                reqs.append((step, build_shape((e.M, e.N, e.K), kw), kw))
    return reqs


def export_requests(sm_count: int = spec.SM_COUNT[ARCH], out_dtypes=("bfloat16",)):
    """Every (step, build shape, keywords) choose_fp8 can ask for: what a bundle for
    matmul_fp8 must hold (runtime-shape kernels: the build shape is nominal)."""
    from tirx_gemm.op.matmul import build_shape
    step = registry.get(FP8_STEP, ARCH)
    seen, reqs = set(), []
    for odt in out_dtypes:
        for mode in numerics.FP8_SCALES:
            for fast in (False, True):
                small = choose_fp8(SMALL_M, mode, fast, odt, sm_count)  # every width it picks
                kws = [{**small, "BLK_N": w} for w in SMALL_M_WIDTHS]
                if thin_a_rows(1, mode, small["PROMOTE"], 1):  # and its thin A stages
                    kws += [{**small, "BLK_N": w, "A_ROWS": r} for w in SMALL_M_WIDTHS
                            for r in THIN_A_ROWS]
                if small["PROMOTE"]:  # and every split of each (split_k)
                    from tirx_gemm import splitk
                    kws += [{**small, "BLK_N": w, "SPLIT_K": S, "L2_GROUP": splitk.l2_group_for(S)}
                            for w in SMALL_M_WIDTHS if w <= SPLIT_WIDTH_MAX for S in SPLITS]
                big = choose_fp8(SMALL_M + 1, mode, fast, odt, sm_count)
                if big["PROMOTE"]:  # and the narrower mid-M tiles (mid_m_tile)
                    kws += [{**big, "BLK_M": bm, "BLK_N": bn} for bm, bn in MID_M_TILES]
                # and its build at deep K (PROMOTE_EVERY_SECOND_FROM_K)
                kws.append(choose_fp8(SMALL_M + 1, mode, fast, odt, sm_count,
                                      K=PROMOTE_EVERY_SECOND_FROM_K))
                for kw in kws + [big]:
                    key = tuple(sorted(kw.items()))
                    if key not in seen:
                        seen.add(key)
                        reqs.append((step, build_shape((kw["BLK_M"], 256, 256), kw), kw))
    return reqs


CANDIDATE_TILES = ((64, 16), (64, 32), (64, 64), (64, 128), (128, 128))


def tile_candidates(M: int, N: int, K: int, mode: str, out_dtype: str = "bfloat16",
                    sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) of the promoted tiles the fp8 study times beside choose_fp8's
    pick at a shape (M <= 128: every BLK_M 64 width of CANDIDATE_TILES, unsplit, and
    128 x 128 where M > 64; larger M with block scales: EARLY_SCALES=True), the pick
    itself left out: the data the rules are fit on."""
    pick = choose_fp8(M, mode, False, out_dtype, sm_count, N=N, K=K)
    if M > SMALL_M:
        # block: both stages' scales of a pair loaded before its first wait (v13's
        # EARLY_SCALES, not yet measured on a GPU); per tensor and rowwise the serial
        # promotion's 128 x 128 and 128 x 160 ran at 0.52-0.73 of the pick on an H100
        # (lab/fp8_on_hopper): none
        return [("v13 128x128 early scales", {**pick, "EARLY_SCALES": True})] \
            if mode == "block" else []
    split = "SPLIT_K" in pick  # then its own tile unsplit is a candidate too
    pick = {k: v for k, v in pick.items() if k not in ("SPLIT_K", "L2_GROUP")}
    out = []
    for bm, bn in CANDIDATE_TILES:
        if (bm == 128 and M <= 64) or (not split and (bm, bn) == (pick["BLK_M"],
                                                                  pick["BLK_N"])):
            continue
        out.append((f"v13 {bm}x{bn}", {**pick, "BLK_M": bm, "BLK_N": bn}))
    return out


def split_candidates(M: int, N: int, K: int, mode: str, out_dtype: str = "bfloat16",
                     sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) of choose_fp8's small-M pick split along K (SPLIT_K of SPLITS
    where every split gets a pair of 128-K stages; an L2_GROUP that does not divide it,
    splitk.l2_group_for): the data a split rule is fit on."""
    from tirx_gemm import splitk
    pick = choose_fp8(M, mode, False, out_dtype, sm_count, N=N, K=K)
    if M > SMALL_M:
        return []
    pairs = _ceil_div(_ceil_div(K, SCALE_BLOCK), 2)
    plain = {k: v for k, v in pick.items() if k not in ("SPLIT_K", "L2_GROUP")}
    out = [] if "SPLIT_K" not in pick else [(f"v13 {pick['BLK_M']}x{pick['BLK_N']}", plain)]
    return out + [(f"v13 {pick['BLK_M']}x{pick['BLK_N']} split{S}",
                   {**plain, "SPLIT_K": S, "L2_GROUP": splitk.l2_group_for(S)})
                  for S in SPLITS if pairs >= S and S != pick.get("SPLIT_K")]


_lock = threading.Lock()
_kernels: dict = {}


def workspace_specs(M: int, N: int, K: int, kwargs: dict | None = None):
    """v13's operands after SB: none, or with SPLIT_K = S > 1 the partial sums WS (S, tiles,
    BLK_M * BLK_N) fp32 and the tile counters CNT (tiles * BLK_M / 64,) int32 (zero at launch
    and at exit; tirx_gemm.run.workspace keeps them per stream, fresh under capture)."""
    kw = kwargs or {}
    split = kw.get("SPLIT_K") or 1
    if split == 1:
        return ()
    bm, bn = kw["BLK_M"], kw["BLK_N"]
    tiles = _ceil_div(M, bm) * _ceil_div(N, bn)
    return (("WS", (split, tiles, bm * bn), "float32"), ("CNT", (tiles * (bm // 64),), "int32"))


def _kernel(kwargs: dict, mnk):
    """(the loaded kernel, its Workspaces or None)."""
    from tirx_gemm.op.matmul import bundle_path, kernel_source
    from tirx_gemm.run.loader import load_kernel
    step = registry.get(FP8_STEP, ARCH)
    bundle = bundle_path()
    key = (tuple(sorted(kwargs.items())), str(bundle) if bundle else None)
    with _lock:
        hit = _kernels.get(key)
        if hit is None:
            lib, meta = kernel_source(step, mnk, kwargs, bundle)
            ws = None
            if (kwargs.get("SPLIT_K") or 1) > 1:
                from tirx_gemm.run.workspace import Workspaces
                ws = Workspaces(lambda M, N, K, kw=dict(kwargs): workspace_specs(M, N, K, kw),
                                True)
            hit = _kernels[key] = (load_kernel(str(lib)), ws)
    return hit


def clear_cache() -> None:
    with _lock:
        _kernels.clear()


def kernel_scales(scale_a, scale_b, mode: str):
    """The scales as v13's kernel takes them: (1,), (1,) per tensor; (M,), (N,) rowwise;
    block ones unchanged (views, no copies)."""
    if mode == "tensor":
        return scale_a.reshape(1), scale_b.reshape(1)
    if mode == "row":
        return scale_a.reshape(-1), scale_b.reshape(-1)
    return scale_a, scale_b


def matmul_fp8(a, b, scale_a, scale_b, out_dtype=None, *, out=None, fast_accum: bool = False,
               sync: bool = False, _kwargs: dict | None = None):
    """``(a * scale_a) @ (b * scale_b).T`` for e4m3 ``a`` (M x K) and ``b`` (N x K) on an
    sm_90a GPU, fp32 accumulation, returned in ``out_dtype`` (default torch.bfloat16; or
    torch.float16). Scales per tensor, rowwise or per block (module docstring).
    Asynchronous like matmul (``sync=True`` waits through the hang guard).
    ``_kwargs`` (for the lab scripts): v13 builder keywords instead of choose_fp8's."""
    import torch
    from tirx_gemm.op.matmul import _gpu_arch, synchronize
    if out_dtype is None:
        out_dtype = torch.bfloat16
    M, N, K, mode, odt = check_fp8_operands(a, b, scale_a, scale_b, out_dtype, out)
    arch, sms = _gpu_arch(a.device)
    if arch != ARCH:
        raise ValueError(f"matmul_fp8 runs on sm_90a (Hopper) only: this GPU is {arch}; "
                         f"sm_100a's v13 (e4m3 kind::f8f6f4 with tensor or row scales, and "
                         f"MXFP8 kind::mxf8f6f4.block_scale on a CTA pair) is built and checked "
                         f"on NumSim only, not served by matmul_fp8 yet; use torch._scaled_mm")
    kw = dict(_kwargs) if _kwargs is not None else choose_fp8(M, mode, fast_accum, odt, sms,
                                                              N=N, K=K)
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if M == 0:
        return out
    if M > kw.get("A_ROWS", M):  # v13's thin A stages (lab keywords): rows past A_ROWS unloaded
        raise ValueError(f"A_ROWS={kw['A_ROWS']} serves M <= {kw['A_ROWS']}, not M={M}")
    split = kw.get("SPLIT_K") or 1
    if split > 1 and _ceil_div(_ceil_div(K, SCALE_BLOCK), 2) < split:
        raise ValueError(f"SPLIT_K={split} at K={K}: each split needs a pair of 128-K stages "
                         f"(K > {(split - 1) * 2 * SCALE_BLOCK})")
    kernel, ws = _kernel(kw, (M, N, K))
    sa, sb = kernel_scales(scale_a, scale_b, mode)
    extra = ()
    if ws is not None:
        from tirx_gemm.run.workspace import CallWorkspace
        index = a.device.index if a.device.index is not None else torch.cuda.current_device()
        extra = CallWorkspace(ws, M, N, K, index).get()
    kernel(a.view(torch.uint8), b.view(torch.uint8), out, sa, sb, *extra)
    if sync:
        synchronize(a.device, what=f"tirx_gemm.matmul_fp8 {M}x{N}x{K} {mode}")
    return out


# the torch side of the operands (quantize, scales, the reference): tirx_gemm/op/fp8_quant.py
from tirx_gemm.op.fp8_quant import dequantize, expand_scale, quantize, reference  # noqa: E402,F401

__all__ += ["quantize", "dequantize", "expand_scale", "reference", "kernel_scales",
            "clear_cache"]
