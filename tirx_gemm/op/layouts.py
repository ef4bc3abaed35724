"""Operand layouts of ``tirx_gemm.matmul``: NN, NT, TN, TT read in place on sm_90a.

``matmul(a, b)`` computes ``a @ b.T`` with a (M x K) and b (N x K). Each operand lies either
K-major (row-major: strides (K, 1), the letter N) or MN-major (the transposed view of a
row-major tensor: ``x.T`` with x (K, M) or (K, N) contiguous, strides (1, M) or (1, N), the
letter T). The layout names a's letter, then b's: NN is every kernel's layout; NT is dgrad's
(``dy @ w`` runs as ``matmul(dy, w.T)``), TT wgrad's (``dy.T @ x`` runs as
``matmul(dy.T, x.T)``).

On sm_90a a call with a T operand runs v15 (the operand-layout step, steps/sm90a/hgemm_v15.py)
on the tensors as they lie, no copy: TMA loads the MN-major tile in 64-element boxes and the
wgmma transpose bits read it. It is built as the backward builds it (tirx_gemm.op.autograd:
one CTA per tile and PDL, the fastest builds lab/training_backward measured; TT with K at run
time). The chooser's other steps read K-major operands only, so the layout decides the step
before any rule (:func:`choose` with ``layout=``); :func:`explain` says which layout it
assumed and what runs.

Refused in one line naming the operand and the way out (``x.contiguous()``): a T operand on
another arch, one strided in both dimensions, a T operand whose rows (M for a, N for b) are
not a multiple of 8 (TMA's 16-byte rows), a T operand with a fused epilogue (v15 has none),
and a forced ``step=`` other than "v15". K need not be a multiple of 8 for TT (it is then
the outer dimension of both operands).

Imports neither torch nor TVM at import time (tirx_gemm.matmul's rule).
"""

from __future__ import annotations

from tirx_gemm.op.keywords import ROW_MULTIPLE
from tirx_gemm.op.launch_site import new_cache

__all__ = ["LAYOUTS", "STEP", "layout_of", "has_transposed", "check_shape", "matmul",
           "choose", "explain", "kwargs_for", "refuse_epilogue", "check_view_step",
           "suite_layouts", "suite_requests",
           "LAYOUT_TUNE", "WGRAD_RUNTIME_K", "DGRAD_RUNTIME_K", "layout_kwargs", "layout_shape",
           "layout_kernel"]

LAYOUTS = ("NN", "NT", "TN", "TT")
# v15's keywords for the backward GEMMs (tirx_gemm.op.autograd) and matmul's transposed calls:
# one CTA per tile (v12's choice at these shapes) and PDL; with both operands MN-major (wgrad,
# TT) K, the token count, at run time too (WGRAD_RUNTIME_K); dgrad's NT likewise where
# DGRAD_RUNTIME_K (K is then the layer's out-features: one kernel per in-features)
LAYOUT_TUNE: dict = {"CLUSTER": 1, "PDL": True}
WGRAD_RUNTIME_K = True
DGRAD_RUNTIME_K = False
STEP = "v15"     # the step that reads a T operand in place
ARCH = "sm_90a"  # where it runs on a GPU (v15's sm_100a twin runs on NumSim only)


def layout_kwargs(step, dtype: str, sm_count: int, a_mn: bool, b_mn: bool,
                  tune: dict | None = None) -> dict:
    """v15's build keywords for one layout: the step's defaults, M at run time, the two
    majors and ``tune`` (None: the backward's, :data:`LAYOUT_TUNE`, plus RUNTIME_K where both
    operands are MN-major (wgrad) and :data:`WGRAD_RUNTIME_K`, or only B (dgrad) and
    :data:`DGRAD_RUNTIME_K`; a dict: those keywords, {} the lesson's build)."""
    from tirx_gemm.op.keywords import step_kwargs
    return {**step_kwargs(step, dtype, sm_count), "RUNTIME_M": True,
            "A_MAJOR": "MN" if a_mn else "K", "B_MAJOR": "MN" if b_mn else "K",
            **_tune(tune, a_mn, b_mn)}


def _tune(tune: dict | None, a_mn: bool, b_mn: bool) -> dict:
    if tune is not None:
        return tune
    rk = WGRAD_RUNTIME_K if a_mn and b_mn else DGRAD_RUNTIME_K if b_mn and not a_mn else False
    return {**LAYOUT_TUNE, "RUNTIME_K": True} if rk else LAYOUT_TUNE


def layout_shape(rows_a: int, rows_b: int, red: int, kw: dict) -> tuple[int, int, int]:
    """The (M, N, K) a v15 kernel is built and found at: K nominal for a RUNTIME_K build
    (one kernel serves every K), else as called."""
    from tirx_gemm.op.keywords import NOMINAL_K
    return (rows_a, rows_b, NOMINAL_K if kw.get("RUNTIME_K") else red)


_layout_kernels: dict = new_cache()  # (N, K or None, majors, dtype, device, tune, bundle) -> kernel


def layout_kernel(dtype, rows_a: int, rows_b: int, red: int, a_mn: bool, b_mn: bool, device,
                  tune: dict | None = None, *, load, probe, bundle):
    """v15's kernel for D (rows_a x rows_b) = A @ B.T over ``red``, each operand K- or
    MN-major; M (rows_a) at run time. ``load(step, shape, kwargs)`` is matmul's loader (the
    build cache or the ``bundle``), ``probe(device)`` its (arch, SM count); the kernel is kept
    here by its key (a call's host work is then one dict look-up). tirx_gemm.matmul.v15_kernel
    passes matmul's own."""
    t = _tune(tune, a_mn, b_mn)
    key = (rows_b, None if t.get("RUNTIME_K") else red, a_mn, b_mn, dtype, device,
           tuple(sorted(t.items())), bundle)
    hit = _layout_kernels.get(key)
    if hit is None:
        from tirx_gemm import registry
        arch, sm_count = probe(device)
        st = registry.get(STEP, arch)
        kw = layout_kwargs(st, str(dtype).removeprefix("torch."), sm_count, a_mn, b_mn, tune)
        hit = _layout_kernels[key] = load(st, layout_shape(rows_a, rows_b, red, kw), kw).kernel
    return hit


def _major(t) -> str | None:
    """"N" (K-major, row-major), "T" (the transposed view of a row-major tensor) or None."""
    if t.is_contiguous():
        return "N"
    return "T" if t.dim() == 2 and t.t().is_contiguous() else None


def layout_of(a, b) -> str | None:
    """"NN", "NT", "TN" or "TT" for operands a (M x K) and b (N x K); None where one is
    neither row-major nor a transposed view."""
    ma, mb = _major(a), _major(b)
    return None if ma is None or mb is None else ma + mb


def has_transposed(a, b) -> bool:
    """Whether a or b is a transposed view (not row-major, its transpose is): the calls
    tirx_gemm.matmul hands to :func:`matmul`. False for anything else (non-tensors too)."""
    try:
        return any(not t.is_contiguous() and t.dim() == 2 and t.t().is_contiguous()
                   for t in (a, b))
    except (AttributeError, TypeError, RuntimeError):
        return False


def check_shape(M: int, N: int, K: int, layout: str, arch: str = ARCH,
                epilogue: dict | None = None, names=("a", "b")) -> None:
    """The one-line ValueError for a layout that no kernel reads as it lies: on ``arch``,
    with ``epilogue``, at M, N, K (TMA's row rule per operand). Nothing for NN."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)} (a's letter, then "
                         f"b's; T: the transposed view of a row-major tensor)")
    if layout == "NN":
        return
    t = [n for n, c in zip(names, layout) if c == "T"]
    fix = " and ".join(f"{n}.contiguous()" for n in t)
    views = " and ".join(t) + (" are transposed views" if len(t) > 1
                               else " is a transposed view")
    if arch != ARCH:
        raise ValueError(f"{views} (layout {layout}): on {arch} matmul reads K-major operands "
                         f"only (v15 reads them in place on sm_90a); pass {fix}")
    if epilogue and any(epilogue.values()):
        raise ValueError(f"{views} (layout {layout}): the fused epilogues (v12) read K-major "
                         f"operands and v15, which reads a transposed view in place, has none; "
                         f"pass {fix}, or call matmul(a, b) and apply the epilogue in torch")
    for n, c in zip(names, layout):
        r = M if n == names[0] else N
        if c == "T" and r % ROW_MULTIPLE:
            what = "M" if n == names[0] else "N"
            raise ValueError(f"{n} is a transposed view of a {K} x {r} tensor: its rows are "
                             f"{what}={r} elements, not a multiple of {ROW_MULTIPLE} (TMA "
                             f"needs 16-byte row strides); pass {n}.contiguous()")
    if N % ROW_MULTIPLE:
        raise ValueError(f"N={N} is not a multiple of {ROW_MULTIPLE}: the rows of out are N "
                         f"elements (TMA's 16-byte row strides); pad b with zero rows")
    if "N" in layout and K % ROW_MULTIPLE:
        n = names[layout.index("N")]
        raise ValueError(f"K={K} is not a multiple of {ROW_MULTIPLE}: {n} is row-major, its "
                         f"rows are K elements (TMA's 16-byte row strides); pad K with zeros, "
                         f"or pass both operands transposed (TT takes any K)")


def kwargs_for(layout: str, dtype: str = "float16", sm_count: int | None = None) -> dict:
    """v15's builder keywords for ``layout`` (not NN): :func:`layout_kwargs` with the
    backward's build, so matmul and the backward share kernels."""
    from tirx_gemm import registry, spec
    sm_count = spec.SM_COUNT[ARCH] if sm_count is None else sm_count
    return layout_kwargs(registry.get(STEP, ARCH), dtype, sm_count, layout[0] == "T",
                         layout[1] == "T")


def check_view_step(step, lay: str) -> None:
    """A forced ``step`` other than v15 with a transposed view (layout ``lay``): one line."""
    if step is not None and step.lower().lstrip("v") != STEP[1:]:
        t = " and ".join(n for n, c in zip("ab", lay) if c == "T")
        raise ValueError(f"step={step!r} reads K-major operands and {t} is transposed "
                         f"(layout {lay}): pass step=None (v15 reads it in place) or "
                         f"{t.replace(' and ', '.contiguous() and ')}.contiguous()")


def refuse_epilogue(a, b) -> None:
    """matmul's epilogue calls: a one-line ValueError when a or b is a transposed view."""
    if has_transposed(a, b):
        lay = "".join("T" if _major(t) == "T" else "N" for t in (a, b))
        check_shape(a.shape[0], b.shape[0], a.shape[1], lay, ARCH, {"epilogue": True})


def _arch_of(ops, probe, *, require_cuda: bool = True) -> str:
    """The arch of the one CUDA GPU holding ``ops`` [(name, tensor)] by ``probe`` (matmul's),
    or a one-line error (operands.check_devices'; ``require_cuda=False``: the bad-input
    sweep's emulated host)."""
    from tirx_gemm.op.operands import check_devices
    if require_cuda:
        check_devices(ops)
    return probe(ops[0][1].device)[0]


def _checks(a, b, out, step, probe):
    """(M, N, K, layout, stored a, stored b), or a one-line error (matmul's wording)."""
    import torch
    from tirx_gemm.op import operands as O
    ops = [("a", a), ("b", b)] + ([("out", out)] if out is not None else [])
    for name, t in ops:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    O.check_dense(ops)
    for name, t in ops:
        if O._dtype_name(t) is None or t.dtype != a.dtype:
            raise TypeError(f"{name} is {t.dtype}: the operands (and out) share one dtype, "
                            f"torch.float16 or torch.bfloat16")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    (M, K), (N, Kb) = a.shape, b.shape
    if Kb != K:
        raise ValueError(f"a is {M}x{K} but b is {N}x{Kb}: matmul computes a @ b.T, so both "
                         f"need the same number of columns K")
    lay = ""
    for name, t in (("a", a), ("b", b)):
        m = _major(t)
        if m is None:
            raise ValueError(f"{name} has strides {t.stride()}: neither row-major nor the "
                             f"transpose of a row-major tensor; pass {name}.contiguous()")
        lay += m
    O.check_step(step)
    check_view_step(step, lay)
    arch = _arch_of(ops, probe)
    check_shape(M, N, K, lay, arch)
    O.check_index_limits(M, N, K)
    stores = [t.t() if c == "T" else t for t, c in zip((a, b), lay)]
    for name, t in zip("ab", stores):
        if t.data_ptr() % O.ALIGN_BYTES:
            raise ValueError(f"{name}'s data pointer is not {O.ALIGN_BYTES}-byte aligned (a "
                             f"view at an odd offset?): TMA needs it; pass {name}.clone()")
    O.check_no_grad(a, b)
    if out is not None:
        O._check_out(out, M, N, a.dtype, a.device)
        O.check_no_overlap(out, a=a, b=b)
    return M, N, K, lay, stores[0], stores[1]


def matmul(a, b, *, out=None, step: str | None = None, probe, kernel):
    """``a @ b.T`` with a or b a transposed view, on v15 in place: tirx_gemm.matmul hands such
    calls here with its arch ``probe`` and ``kernel`` (matmul.v15_kernel). Checks every call
    (one-line errors), then launches the kernel, kept once per (N, K, layout, dtype, device)."""
    M, N, K, lay, sa, sb = _checks(a, b, out, step, probe)
    if out is None:
        out = a.new_empty((M, N))
    if M == 0:
        return out
    fn = kernel(a.dtype, M, N, K, lay[0] == "T", lay[1] == "T", a.device)
    try:
        fn(sa, sb, out)
    except Exception as exc:
        from tirx_gemm.run.errors import KernelLaunchError
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise KernelLaunchError(f"launching v15 (layout {lay}) at {M}x{N}x{K} failed: "
                                f"{first}") from exc
    return out


def choose(M: int, N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
           sm_count: int | None = None, epilogue: dict | None = None, *, why=None, card=None,
           layout: str = "NN") -> tuple[str, dict]:
    """rules.choose for operands lying as ``layout``: NN, its pick; NT, TN, TT, ("v15", its
    keywords) (the layout decides the step before any rule), or matmul's one-line refusal."""
    from tirx_gemm.op import rules
    check_shape(M, N, K, layout, arch, epilogue)
    if layout == "NN":
        return rules.choose(M, N, K, dtype, arch, sm_count, epilogue, why=why, card=card)
    from tirx_gemm.op import cards
    from tirx_gemm.op.keywords import _check_problem, dtype_name
    dtype = dtype_name(dtype)
    card, sm_count = cards.for_arch(card, arch, sm_count)
    # K as _check_problem wants it (a multiple of 8): TT takes any K, check_shape said so
    _check_problem(M, N, -(-K // ROW_MULTIPLE) * ROW_MULTIPLE, dtype, arch, sm_count)
    return STEP, kwargs_for(layout, dtype, sm_count)


def explain(M: int, N: int, K: int, dtype: str = "float16", arch: str = "sm_90a",
            sm_count: int | None = None, epilogue: dict | None = None, *, card=None,
            layout: str = "NN") -> str:
    """rules.explain's text for a call whose operands lie as ``layout`` (NN, NT, TN, TT):
    NN, the chooser's pick and its rules, with the layout named; otherwise v15 and its
    keywords, what it reads in place and why no rule of the chooser applies (a one-line
    ValueError, as matmul's, where nothing reads the layout). ``tirx-gemm choose``."""
    from tirx_gemm.op import rules
    check_shape(M, N, K, layout, arch, epilogue)
    if layout == "NN":
        return rules.explain(M, N, K, dtype, arch, sm_count, epilogue, card=card) + (
            "\n  layout: NN (a and b row-major, K-major, as the chooser's kernels read them; "
            "a transposed operand runs v15: layout='NT', 'TN' or 'TT')")
    from tirx_gemm import registry
    from tirx_gemm.compile.names import kernel_symbol
    from tirx_gemm.op import cards
    from tirx_gemm.op.keywords import dtype_name
    dtype = dtype_name(dtype)
    card, sm_count = cards.for_arch(card, arch, sm_count)
    _, kw = choose(M, N, K, dtype, arch, sm_count, card=card, layout=layout)
    keys = " ".join(f"{k}={v}" for k, v in kw.items() if k not in ("dtype", "SM_COUNT"))
    t = [f"{n} ({'K x M' if n == 'a' else 'K x N'} row-major, read as its transpose)"
         for n, c in zip("ab", layout) if c == "T"]
    k_note = (", K at run time: both operands MN-major, one kernel serves every K"
              if kw.get("RUNTIME_K") else "")
    return "\n".join([
        f"{M}x{N}x{K} {dtype} on {arch} ({sm_count} SMs), layout {layout}: {STEP} {keys}",
        f"  card: {card.line()}",
        f"  kernel: {kernel_symbol(registry.get(STEP, arch), kw)}",
        f"  - layout {layout}: {' and '.join(t)} read in place by {STEP} (operand layouts, "
        f"steps/sm90a/hgemm_v15.py): TMA boxes of 64 MN elements and the wgmma transpose bits, "
        f"no copy",
        f"  - build: the backward's (tirx_gemm.op.autograd.LAYOUT_TUNE: one CTA per tile, "
        f"PDL{k_note}), the fastest lab/training_backward measured",
        "  - the chooser's rules (tile menu, split-K, swap-AB) pick among K-major kernels only: "
        "the layout decides the step first"])


def suite_layouts(value, at: str) -> tuple[str, ...]:
    """A suite entry's ``"layouts"`` (tirx_gemm.op.suite): a list of "NT", "TN", "TT" (NN is
    every entry's), validated; a one-line ValueError naming the entry otherwise."""
    if not isinstance(value, list) or not value or any(v not in LAYOUTS[1:] for v in value):
        raise ValueError(f"{at}: layouts={value!r} must be a non-empty list of "
                         f"{', '.join(LAYOUTS[1:])} (NN is every entry's)")
    return tuple(dict.fromkeys(value))


def suite_requests(M: int, N: int, K: int, dtype: str, layouts, arch: str,
                   sm_count: int) -> list[tuple]:
    """bundle.export requests (step, build shape, kwargs) of v15 for an MxNxK entry in each of
    ``layouts`` (M at run time: every token count; TT also K). None off sm_90a, where
    matmul refuses a transposed view in one line."""
    if arch != ARCH:
        return []
    from tirx_gemm import registry
    from tirx_gemm.op.keywords import build_shape
    out = []
    for lay in layouts:
        check_shape(M, N, K, lay, arch)
        kw = kwargs_for(lay, dtype, sm_count)
        out.append((registry.get(STEP, ARCH), build_shape(layout_shape(M, N, K, kw), kw), kw))
    return out
