"""A case's operands (random, integer, fp8, epilogue; workspaces) and the check of its output."""

from __future__ import annotations

import numpy as np

from tirx_gemm import epilogue as E
from tirx_gemm import numerics
from tirx_gemm.sim.cases import SimCase

def workspace_specs(case: SimCase) -> tuple:
    """((name, shape, dtype), ...) of the case's workspace operands; () for most steps."""
    return tuple((str(n), tuple(int(x) for x in shape), str(dt)) for n, shape, dt in
                 case.step.workspace_specs(case.M, case.N, case.K, dict(case.kwargs)))


def _np_workspace_dtype(dt: str):
    return numerics.np_dtype(dt) if dt in numerics.DTYPES else np.dtype(dt)


def make_workspace_np(specs, poison: bool = False) -> dict:
    """{name: numpy array} for workspace ``specs``: zero-filled; with ``poison`` the
    floating-point (scratch) buffers are NaN instead, so a kernel that reads an element it
    did not write first fails (the contract: registry.Step.workspace)."""
    out = {}
    for name, shape, dt in specs:
        a = np.zeros(shape, dtype=_np_workspace_dtype(dt))
        if poison and (a.dtype.kind == "f" or a.dtype.name in numerics.DTYPES):
            a[...] = np.nan
        out[name] = a
    return out


def workspace_dirt_np(specs, outputs) -> str:
    """"" when every integer workspace buffer (tile counters) the simulator handed back is
    all zeros, else what is left in which (the contract: the kernel leaves its counters
    zero-filled; floating-point buffers are scratch)."""
    dirty = []
    for name, _, dt in specs:
        a = _np_workspace_dtype(dt)
        if name in outputs and a.kind in "iub":
            n = int(np.count_nonzero(np.asarray(outputs[name])))
            if n:
                dirty.append(f"{name!r} has {n} nonzero element(s)")
    if not dirty:
        return ""
    return "workspace " + ", ".join(dirty) + " after the kernel returned (it must leave its "\
        "counters zero-filled)"


def case_inputs_np(case: SimCase, kind: str, seed: int):
    """(A, B, D, extra) of one case for input ``kind``: as numerics.make_inputs_np, and with
    the case's epilogue keywords (tirx_gemm.epilogue): B is the fused gate/up weight (2N, K)
    under SWIGLU (its gate and up halves interleaved by epilogue.interleave_gate_up_np),
    D (all NaN) has the out dtype, and ``extra`` holds the ``bias`` operand (N,) of the
    BIAS dtype (the kernel takes it by name after D)."""
    if case.step.grouped:  # v14: per-expert operands (tirx_gemm/hopper/grouped.py's model,
        # with the epilogue's scale / bias and D N/2 wide under SWIGLU)
        from tirx_gemm.hopper.grouped import grouped_inputs_np
        return grouped_inputs_np(case.M, case.N, case.K, dict(case.kwargs), kind, seed, case.dtype)
    kw = dict(case.kwargs)
    if case.step.fp8 and kw.get("SCALE") == "mx":  # v13 MXFP8: UE8M0 SFs, blocked order
        Aq, Bq, sfa, sfb, D = numerics.make_mx_inputs_np(case.M, case.N, case.K, seed,
                                                         case.dtype)
        return (numerics.fp8_bytes_np(Aq), numerics.fp8_bytes_np(Bq), D,
                {"SFA": numerics.mx_block_sf_np(sfa, case.K),
                 "SFB": numerics.mx_block_sf_np(sfb, case.K)})
    if case.step.fp8:  # v13: e4m3 A, B as their uint8 bytes; fp32 scales SA, SB after D
        Aq, Bq, sa, sb, D = numerics.make_fp8_inputs_np(
            case.M, case.N, case.K, kw.get("SCALE", "tensor"), seed, case.dtype)
        return (numerics.fp8_bytes_np(Aq), numerics.fp8_bytes_np(Bq), D,
                {"SA": sa, "SB": sb})
    if E.training_act(kw) is not None:  # v15's ACT_GRAD / ACT_SAVE: DY or Z, bias words
        return _training_inputs_np(case, kind, seed)
    epi = E.validate(kw)
    dtype = case.dtype
    if epi["SWIGLU"]:
        A, B2, _ = numerics.make_inputs_np(case.M, 2 * case.N, case.K, kind, seed, dtype)
        B = E.interleave_gate_up_np(B2[:case.N], B2[case.N:])
    else:
        A, B, _ = numerics.make_inputs_np(case.M, case.N, case.K, kind, seed, dtype)
    od = E.out_dtype(epi, dtype)
    D = np.full((case.M, case.N), np.nan,
                dtype=np.float32 if od == "float32" else numerics.np_dtype(od))
    extra = {"bias": E.make_bias_np(case.N, epi["BIAS"], seed)} if epi["BIAS"] else {}
    return A, B, D, extra


def _training_inputs_np(case: SimCase, kind: str, seed: int):
    """(A, B, D, extra) of a v15 training case (tirx_gemm.epilogue's training section):
    extra holds DY (ACT_GRAD: epilogue.make_dy_np's dy) or Z (ACT_SAVE: all NaN, as D), and
    with BIAS the bias, DY and bias as the int32 views the kernel takes (two values a word)."""
    kw = dict(case.kwargs)
    A, B, _ = numerics.make_inputs_np(case.M, case.N, case.K, kind, seed, case.dtype)
    D = np.full((case.M, case.N), np.nan, dtype=numerics.np_dtype(case.dtype))
    if E.training_act(kw)[0] == "ACT_GRAD":
        dy_cols = case.N // 2 if kw["ACT_GRAD"] == "swiglu" else case.N  # SwiGLU: per pair
        extra = {"DY": E.make_dy_np(case.M, dy_cols, case.dtype, seed).view(np.int32)}
    else:
        extra = {"Z": D.copy()}
    if kw.get("BIAS"):
        extra["bias"] = E.make_bias_np(case.N, case.dtype, seed).view(np.int32)
    if kw.get("ACT_GRAD_DBIAS"):  # the bias gradient's pieces, fp32, all NaN before the run
        extra["DBP"] = np.full((-(-case.M // _dbias_rows()), case.N), np.nan, np.float32)
    return A, B, D, extra


def _dbias_rows() -> int:
    from tirx_gemm.hopper.layouts import DBIAS_ROWS  # (TVM: the gate builds kernels anyway)
    return DBIAS_ROWS


def _training_check_np(case: SimCase, out, A, B, extra: dict, outputs: dict):
    """D (and for ACT_SAVE Z, from the simulator's ``outputs``) against
    epilogue.training_reference_np, and with ACT_GRAD_DBIAS the DBP ``outputs`` holds
    against epilogue.dbias_partials_np of that D: the first that fails, else the one further
    off."""
    kw = dict(case.kwargs)
    half = numerics.np_dtype(case.dtype)
    dy = extra["DY"].view(half) if "DY" in extra else None
    bias = extra["bias"].view(half) if "bias" in extra else None
    refs = E.training_reference_np(A, B, kw, dy, bias)
    got = {"D": out, **({"Z": np.asarray(outputs["Z"])} if "Z" in refs else {})}
    cmps = [E.training_compare_np(got[n], refs[n], kw, n, case.dtype, K=case.K) for n in refs]
    if "DBP" in extra:  # the column sums of D as the kernel stored it, up to fp32 order
        parts = E.dbias_partials_np(np.asarray(out, dtype=np.float32), _dbias_rows())
        atol = 1e-5 * _dbias_rows() * float(np.nanmax(np.abs(np.asarray(out, np.float32))))
        cmps.append(numerics.compare_np(np.asarray(outputs["DBP"]), parts, dtype=case.dtype,
                                        rtol=1e-5, atol=atol, max_rel_err=None))
    bad = [c for c in cmps if not c.ok]
    return bad[0] if bad else max(cmps, key=lambda c: c.rel_frobenius_error)


def input_kinds(case: SimCase) -> tuple[str, ...]:
    """The input kinds a case runs: numerics.INPUT_KINDS (random, small integers); an fp8
    case (registry.Step.fp8, or v14 SCALE="mx") runs one set, randn quantized to e4m3 with its
    scales (numerics.make_fp8_inputs_np, make_mx_inputs_np): the exact small-integer check has
    no fp8 twin here."""
    return ("random",) if _is_fp8(case) else numerics.INPUT_KINDS


def _is_fp8(case: SimCase) -> bool:
    """An fp8 step (v13), or a grouped case with e4m3 operands (v14 SCALE="mx")."""
    return case.step.fp8 or (case.step.grouped and dict(case.kwargs).get("SCALE") == "mx")


def check_output_np(case: SimCase, out, A, B, extra: dict, kind: str,
                    outputs: dict | None = None):
    """The compare of one case's output: a plain case by numerics' rules (exact for the
    small-integer inputs); an epilogue case against epilogue.reference_np under
    epilogue.tolerance (its functions are not exact even on integer inputs); a v15
    training case (ACT_GRAD, ACT_SAVE) against epilogue.training_reference_np, with the
    Z that ``outputs`` (the simulator's, by name) holds for ACT_SAVE."""
    if case.step.grouped:  # v14: each expert's rows against its own weight (mx: and scales;
        # ROW_SCALE, BIAS, SWIGLU: through hopper.grouped.grouped_epilogue_np, tolerances)
        from tirx_gemm.hopper.grouped import grouped_check_np
        return grouped_check_np(out, A, B, extra["routing"], dict(case.kwargs), case.dtype, kind,
                                scales=extra)
    kw = dict(case.kwargs)
    if case.step.fp8 and kw.get("SCALE") == "mx":  # 2**(sf - 127) per 32 of K, float64 sums
        ref = numerics.reference_mx_np(
            numerics.fp8_from_bytes_np(A), numerics.fp8_from_bytes_np(B),
            numerics.mx_unblock_sf_np(extra["SFA"], case.M, case.K),
            numerics.mx_unblock_sf_np(extra["SFB"], case.N, case.K))
        return numerics.compare_fp8_np(out, ref, out_dtype=case.dtype, K=case.K,
                                       promote=numerics.fp8_promote(kw))
    if case.step.fp8:  # the fp32 product of the dequantized e4m3 inputs, fp8 tolerances
        ref = numerics.reference_fp8_np(numerics.fp8_from_bytes_np(A),
                                        numerics.fp8_from_bytes_np(B), extra["SA"],
                                        extra["SB"], kw.get("SCALE", "tensor"))
        return numerics.compare_fp8_np(out, ref, out_dtype=case.dtype, K=case.K,
                                       promote=numerics.fp8_promote(kw))
    if E.training_act(kw) is not None:
        return _training_check_np(case, out, A, B, extra, outputs or {})
    if E.is_plain(kw):
        return numerics.compare_np(out, numerics.reference_np(A, B), dtype=case.dtype,
                                   exact=kind == "int")
    ref = E.reference_np(A, B, kw, extra.get("bias"))
    return E.compare_np(out, ref, kw, case.dtype, K=case.K)
