"""Which kernels a piece of training code calls: replay it on the CPU and record every GEMM.

``record(fn)`` runs ``fn()`` with a CPU reference kernel registered for the ops
``tirx_gemm::matmul``, ``tirx_gemm::swiglu`` and ``tirx_gemm::act_save_mm`` (enabled only
inside the call) that records each call (op, M, N, K, dtype, epilogue, step) and returns the
product; autograd's backward runs through the same ops, so its GEMMs are recorded too. tirx_gemm.op.autograd is told
the GPU is sm_90a (its forced backward step and fp32 outputs), as on the GPU host.
``requests(calls)`` turns the records into bundle.export requests (step, build shape,
kwargs), each once, with the step and keywords tirx_gemm.matmul would pick on an sm_90a GPU
of ``sm_count`` SMs. Used by export_tests.py, curve.py and bench.py to export their bundles.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

ARCH = "sm_90a"


def _act(z, act):
    if act is None:
        return z
    return {"relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act](z)


@contextlib.contextmanager
def recording():
    """Yield the list the calls are recorded into while the CPU reference kernels are on."""
    from tirx_gemm.op import autograd as AG
    from tirx_gemm.op import torch_op  # noqa: F401 (defines the ops)
    calls = []

    def mm(a, b, step=None, bias=None, activation=None, out_dtype=None):
        calls.append(("matmul", a.shape[0], b.shape[0], a.shape[1], a.dtype,
                      None if bias is None else bias.dtype, activation, out_dtype, step))
        z = a.float() @ b.float().T + (0 if bias is None else bias.float())
        return _act(z, activation).to(out_dtype or a.dtype)

    def sw(a, fused, out_dtype=None):
        calls.append(("swiglu", a.shape[0], fused.shape[0], a.shape[1], a.dtype, None, None,
                      out_dtype, None))
        v = fused.float().view(fused.shape[0] // 16, 2, 8, -1)
        g, u = v[:, 0].reshape(-1, a.shape[1]), v[:, 1].reshape(-1, a.shape[1])
        return (F.silu(a.float() @ g.T) * (a.float() @ u.T)).to(out_dtype or a.dtype)

    lib = torch.library.Library("tirx_gemm", "IMPL")
    lib.impl("matmul", mm, "CPU")
    lib.impl("swiglu", sw, "CPU")
    def layout(a_store, a_mn, b_store, b_mn, tune=None):
        rows_a, red = (a_store.shape[1], a_store.shape[0]) if a_mn else a_store.shape
        rows_b = b_store.shape[1] if b_mn else b_store.shape[0]
        calls.append(("layout", rows_a, rows_b, red, a_store.dtype, a_mn, b_mn, tune, "v15"))
        a = a_store.float().T if a_mn else a_store.float()
        b = b_store.float().T if b_mn else b_store.float()
        return (a @ b.T).to(a_store.dtype)

    def act_grad(dtype, M, N, K, act, bias, device, dbias=False):  # op.act_grad's fused kernel
        calls.append(("act_grad", M, N, K, dtype, bias, act, dbias,
                      "v15_prefetch" if AGR.PREFETCH and act in AGR.ACTS else "v15"))

        def run(a, b, out, dy_words, *rest):  # rest: bias words, then (dbias) the partials
            out.copy_(AGR.reference(a, b, dy_words.view(dtype),
                                    rest[0].view(dtype) if rest else None, act))
            if dbias:
                rest[1].copy_(AGR.dbias_partials(out))
        return run

    def act_save(dtype, M, N, K, act, bias, device):  # tirx_gemm.op.act_save's forward kernel
        calls.append(("act_save", M, N, K, dtype, bias, act, None, "v15"))

        def run(a, b, y, z, *bias_words):
            z.copy_(a.float() @ b.float().T + (bias_words[0].view(dtype).float()
                                                if bias_words else 0))
            y.copy_(_act(z.float(), act))
        return run

    def wgrad_dbias(dtype, N, K, M, device):  # tirx_gemm.op.wgrad_dbias's kernel
        calls.append(("wgrad_dbias", M, N, K, dtype, None, None, None, "v15"))

        def run(dz, a, db, dbias):
            db.copy_(dz.float().T @ a.float())
            dbias.copy_(dz.float().sum(0))
        return run

    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import act_save as AS
    from tirx_gemm.op import wgrad_dbias as WD
    lib.impl("act_save_mm", AS._run, "CPU")
    old = AG._arch, AG._gemm_layout, AGR.kernel, AS.kernel, WD.kernel
    AG._arch = lambda device: ARCH
    AG._gemm_layout = layout
    AGR.kernel = act_grad
    AS.kernel = act_save
    WD.kernel = wgrad_dbias
    try:
        yield calls
    finally:
        AG._arch, AG._gemm_layout, AGR.kernel, AS.kernel, WD.kernel = old
        lib._destroy()


def requests(calls, sm_count: int = 132):
    """bundle.export requests (step, build shape, kwargs) for the recorded calls, once each."""
    from tirx_gemm import registry
    from tirx_gemm.op.keywords import build_shape
    from tirx_gemm.op.matmul import _pick
    from tirx_gemm.op.operands import epilogue_kwargs
    from tirx_gemm.op.rules import choose, choose_epilogue_on
    out, seen = [], set()
    for op, M, N, K, dt, bias_dt, act, out_dt, step in calls:
        if M == 0:
            continue
        dtype = str(dt).removeprefix("torch.")
        if op == "act_grad":  # v15 with ACT_GRAD: bias_dt holds whether there is a bias,
            # out_dt whether ACT_GRAD_DBIAS, step "v15" or "v15_prefetch"
            from tirx_gemm.op import act_grad as AGR
            r = AGR.request(M, N, K, dtype, act, bias_dt, sm_count, ARCH,
                            step == "v15_prefetch", bool(out_dt))
            out.extend([r] if _once(seen, r) else [])
            continue
        if op == "act_save":  # v15 with ACT_SAVE: bias_dt holds whether there is a bias
            from tirx_gemm.op import act_save as AS
            out.extend(r for r in [AS.request(M, N, K, dtype, act, bias_dt, sm_count, ARCH)]
                       if _once(seen, r))
            continue
        if op == "wgrad_dbias":  # v15 with WGRAD_DBIAS: wgrad of N x K over M tokens
            from tirx_gemm.op import wgrad_dbias as WD
            out.extend(r for r in [WD.request(N, K, M, dtype, sm_count, ARCH)] if _once(seen, r))
            continue
        if op == "layout":  # v15: bias_dt, act, out_dt hold a_mn, b_mn, tune
            out.extend(r for r in [layout_request(M, N, K, dtype, bias_dt, act, sm_count,
                                                  out_dt)] if _once(seen, r))
            continue
        bias = None if bias_dt is None else str(bias_dt).removeprefix("torch.")
        epi = epilogue_kwargs(bias, act, out_dt, op == "swiglu", dtype)
        N = N // 2 if op == "swiglu" else N  # matmul chooses for the output's columns
        if any(v for v in epi.values()):
            step_id, kw = (choose(M, N, K, dtype, ARCH, sm_count, epi) if step is None else
                           choose_epilogue_on(step, M, N, K, dtype, ARCH, sm_count, epi))
            st = registry.get(step_id, ARCH)
        else:
            st, kw = _pick(M, N, K, dtype, ARCH, sm_count, step)
        r = (st, build_shape((M, N, K), kw), dict(kw))
        if _once(seen, r):
            out.append(r)
    return out


def _once(seen: set, req) -> bool:
    key = (req[0].key, req[1], tuple(sorted(req[2].items())))
    if key in seen:
        return False
    seen.add(key)
    return True


def layout_request(M, N, K, dtype: str, a_mn: bool, b_mn: bool, sm_count: int = 132,
                   tune: dict | None = None):
    """The bundle request of v15's kernel for D (M x N) = A @ B.T over K, M at run time,
    built with autograd.layout_kwargs' ``tune`` (None: the backward's LAYOUT_TUNE)."""
    from tirx_gemm import registry
    from tirx_gemm.op import autograd as AG
    from tirx_gemm.op.keywords import build_shape
    st = registry.get("v15", ARCH)
    kw = AG.layout_kwargs(st, dtype, sm_count, a_mn, b_mn, tune)
    return st, build_shape(AG.layout_shape(M, N, K, kw), kw), kw
