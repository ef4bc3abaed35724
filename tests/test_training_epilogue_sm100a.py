"""v15's training epilogues on sm_100a (ACT_GRAD, ACT_SAVE; tirx_gemm/blackwell/act_grad.py):
the refusals (sm_90a's messages), the operand order, nvcc's view of the builds, the numpy
reference against torch's, and the simulation gate's operands and compare. The numbers and the
protocol on NumSim: the registry's v15 sim cases (`tirx-gemm sim v15`)."""
import importlib.util

import numpy as np
import pytest

from tirx_gemm import epilogue as E
from tirx_gemm import registry

HAS_TVM = importlib.util.find_spec("tvm") is not None
needs_tvm = pytest.mark.skipif(not HAS_TVM, reason="builds need TVM")
SHAPE = (200, 144, 128)  # M, N off the 128 x 128 tile grid; N a multiple of 16 (SwiGLU)


def _build(**kw):
    return registry.get("v15", "sm_100a").build_primfunc(*SHAPE, SM_COUNT=2, **kw)


def _refusal(arch: str, kw: dict) -> str:
    st = registry.get("v15", arch)
    with pytest.raises(ValueError) as e:
        st.build_primfunc(256, 256, 128, **kw)
    return str(e.value)


@needs_tvm
@pytest.mark.parametrize("kw", [
    dict(ACT_GRAD="relu"),
    dict(ACT_GRAD="gelu", A_MAJOR="MN"),
    dict(ACT_SAVE="tanh"),
    dict(ACT_SAVE="gelu", ACT_GRAD="silu"),
    dict(ACT_SAVE="gelu", B_MAJOR="MN"),
    dict(BIAS="float16"),
    dict(ACT_GRAD="gelu", BIAS="float32"),
    dict(ACT_GRAD="gelu", ACT_GRAD_DBIAS=True),
    dict(ACT_GRAD="swiglu", ACT_GRAD_DBIAS=True),
], ids=str)
def test_refusals_mirror_sm90a(kw):
    """What both arches refuse, each in one line and in the same words."""
    msg = _refusal("sm_100a", kw)
    assert "\n" not in msg
    assert msg == _refusal("sm_90a", kw)


@needs_tvm
def test_swiglu_refusal_in_sm90a_words():
    """sm_90a also names ACT_GRAD_PREFETCH, a keyword sm_100a does not have."""
    msg = _refusal("sm_100a", dict(ACT_GRAD="swiglu", BIAS="float16"))
    assert "\n" not in msg and msg.endswith("takes no BIAS")
    assert _refusal("sm_90a", dict(ACT_GRAD="swiglu", BIAS="float16")).startswith(msg)


@needs_tvm
@pytest.mark.parametrize("kw, names", [
    ({}, ["A", "B", "D"]),
    (dict(ACT_GRAD="silu"), ["A", "B", "D", "DY"]),
    (dict(ACT_GRAD="gelu_tanh", BIAS="float16"), ["A", "B", "D", "DY", "bias"]),
    (dict(ACT_GRAD="swiglu"), ["A", "B", "D", "DY"]),
    (dict(ACT_GRAD="gelu", BIAS="float16", ACT_GRAD_DBIAS=True), ["A", "B", "D", "DY", "bias",
                                                                  "DBP"]),
    (dict(ACT_SAVE="relu"), ["A", "B", "D", "Z"]),
    (dict(ACT_SAVE="gelu", BIAS="bfloat16", dtype="bfloat16"), ["A", "B", "D", "Z", "bias"]),
])
def test_operands_in_sm90a_order(kw, names):
    """A, B, D, then DY (ACT_GRAD) or Z (ACT_SAVE), then the bias; DY and the bias as int32
    views of two 16-bit values a word, as sm_90a takes them."""
    f = _build(**kw)
    assert [p.name for p in f.params] == names
    shapes = {p.name: (tuple(int(x) for x in p.shape), str(p.dtype)) for p in f.params}
    M, N, _ = SHAPE
    words = N // 4 if kw.get("ACT_GRAD") == "swiglu" else N // 2  # SwiGLU: dy per pair
    assert shapes.get("DY", ((M, words), "int32")) == ((M, words), "int32")
    assert shapes.get("bias", ((N // 2,), "int32")) == ((N // 2,), "int32")
    assert shapes.get("Z", ((M, N), shapes["D"][1])) == ((M, N), shapes["D"][1])
    assert shapes.get("DBP", ((-(-M // 16), N), "float32")) == ((-(-M // 16), N), "float32")


@needs_tvm
def test_builds_compile_without_spills():
    """nvcc's view (NumSim models no registers): the epilogues leave v15's 56/224 setmaxnreg
    split its entry registers, spill nothing, load TMEM, evaluate exp and store through TMA."""
    from tirx_gemm.compile.api import build_many
    st = registry.get("v15", "sm_100a")
    reqs = [(st, SHAPE, dict(SM_COUNT=2, ACT_GRAD="gelu", BIAS="float16")),
            (st, SHAPE, dict(SM_COUNT=2, ACT_SAVE="silu", BIAS="bfloat16", dtype="bfloat16")),
            (st, SHAPE, dict(SM_COUNT=2, ACT_GRAD="swiglu")),
            (st, SHAPE, dict(SM_COUNT=2, ACT_GRAD="silu", BIAS="float16", ACT_GRAD_DBIAS=True))]
    for (_, shape, kw), r in zip(reqs, build_many(reqs, jobs=2)):
        if isinstance(r, Exception):
            raise r
        assert (r.spill_loads, r.spill_stores) == (0, 0), kw
        for op in ("LDTM", "UTMASTG", "MUFU.EX2", "UTCHMMA"):
            assert any(k.startswith(op) for k in r.sass_counts), (op, kw)


def test_sim_cases_cover_both_training_epilogues():
    cases = [dict(kw) for _, kw in registry.get("v15", "sm_100a").sim_cases]
    assert any(kw.get("ACT_GRAD") and kw.get("BIAS") for kw in cases)
    assert any(kw.get("ACT_SAVE") and kw.get("BIAS") for kw in cases)
    assert len([kw for kw in cases if E.training_act(kw)]) <= 2  # CI simulates each


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "swiglu"])
def test_numpy_gradient_is_torchs(act):
    """epilogue.act_grad_np (the sim gate's reference) against op.act_grad.reference (torch's
    autograd, the GPU tests' reference) on the same z and dy."""
    torch = pytest.importorskip("torch")
    from tirx_gemm.op import act_grad as AGR
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((48, 32)).astype(np.float32) / 4
    dy = rng.standard_normal((64, 24 if act == "swiglu" else 48)).astype(np.float32)
    want = AGR.reference(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(dy), None,
                         act).double().numpy()
    got = E.training_reference_np(a, b, {"ACT_GRAD": act}, dy)["D"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _model(case, A, B, extra, act_of=None):
    """A numpy model of the sm_100a epilogue, written apart from the reference: z in fp32,
    dy * act'(z) by central differences of the forward; for ACT_SAVE z and act(z) (``act_of``:
    another activation's, a wrong model)."""
    from tirx_gemm import numerics
    half = numerics.np_dtype(case.dtype)
    kw = dict(case.kwargs)
    z = A.astype(np.float32) @ B.astype(np.float32).T
    if "bias" in extra:
        z = z + extra["bias"].view(half).astype(np.float32)
    if "DY" in extra:
        act, h = kw["ACT_GRAD"], 1e-4
        d = (E.act_np(z + h, act) - E.act_np(z - h, act)) / (2 * h)
        return {"D": (extra["DY"].view(half).astype(np.float64) * d).astype(half)}
    return {"D": E.act_np(z, act_of or kw["ACT_SAVE"]).astype(half), "Z": z.astype(half)}


@pytest.mark.parametrize("kw, dtype", [
    ((("ACT_GRAD", "gelu"), ("BIAS", "float16")), "float16"),
    ((("ACT_SAVE", "silu"), ("BIAS", "bfloat16"), ("dtype", "bfloat16")), "bfloat16"),
])
def test_sim_gate_operands_and_compare(kw, dtype):
    """The gate's operands for a training case (DY or Z beside D, the int32 views) and its
    compare: a model of the right epilogue passes, one of the wrong function fails (SwiGLU's
    reference: test_numpy_gradient_is_torchs)."""
    from tirx_gemm.sim.cases import SimCase
    from tirx_gemm.sim.inputs import case_inputs_np, check_output_np
    case = SimCase(registry.get("v15", "sm_100a"), 24, 16, 32, (("SM_COUNT", 2),) + kw)
    A, B, D, extra = case_inputs_np(case, "random", 0)
    assert D.shape == (24, 16) and np.isnan(D.astype(np.float32)).all()
    assert extra["bias"].dtype == np.int32 and extra["bias"].shape == (8,)
    good = _model(case, A, B, extra)
    if "DY" in extra:
        assert extra["DY"].dtype == np.int32 and extra["DY"].shape == (24, 8)
        assert check_output_np(case, good["D"], A, B, extra, "random").ok
        bad = E.act_np(A.astype(np.float32) @ B.astype(np.float32).T, "gelu").astype(D.dtype)
        assert not check_output_np(case, bad, A, B, extra, "random").ok
    else:
        assert extra["Z"].shape == (24, 16)
        assert check_output_np(case, good["D"], A, B, extra, "random", outputs=good).ok
        wrong_z = {"Z": good["D"]}
        assert not check_output_np(case, good["D"], A, B, extra, "random",
                                   outputs=wrong_z).ok
        relu = _model(case, A, B, extra, act_of="relu")
        assert not check_output_np(case, relu["D"], A, B, extra, "random", outputs=good).ok


def test_sim_gate_swiglu_operands():
    from tirx_gemm.sim.cases import SimCase
    from tirx_gemm.sim.inputs import case_inputs_np
    case = SimCase(registry.get("v15", "sm_100a"), 24, 32, 32,
                   (("SM_COUNT", 2), ("ACT_GRAD", "swiglu")))
    A, B, D, extra = case_inputs_np(case, "random", 0)
    assert B.shape == (32, 32) and D.shape == (24, 32) and set(extra) == {"DY"}
    assert extra["DY"].dtype == np.int32 and extra["DY"].shape == (24, 8)


def test_dbias_partials_are_torchs():
    """epilogue.dbias_partials_np (the gate's) against op.act_grad.dbias_partials (the GPU
    tests'), M not a multiple of 16; and the gate's DBP operand (NaN until the kernel writes)."""
    torch = pytest.importorskip("torch")
    from tirx_gemm.op import act_grad as AGR
    dz = np.random.default_rng(5).standard_normal((37, 24)).astype(np.float32)
    np.testing.assert_allclose(E.dbias_partials_np(dz, AGR.DBIAS_ROWS),
                               AGR.dbias_partials(torch.from_numpy(dz)).numpy(), rtol=1e-6,
                               atol=1e-6)
    if HAS_TVM:
        from tirx_gemm.sim.cases import SimCase
        from tirx_gemm.sim.inputs import case_inputs_np
        case = SimCase(registry.get("v15", "sm_100a"), 37, 16, 32,
                       (("SM_COUNT", 2), ("ACT_GRAD", "gelu"), ("BIAS", "float16"),
                        ("ACT_GRAD_DBIAS", True)))
        extra = case_inputs_np(case, "random", 0)[3]
        assert extra["DBP"].shape == (3, 16) and np.isnan(extra["DBP"]).all()
