"""CPU tests of tirx_gemm.run.runner: the checker, input validation, device gating, imports."""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from tirx_gemm import numerics
from tirx_gemm.run import checking
from tirx_gemm.run import loader
from tirx_gemm.run import runner
from tirx_gemm.run.checking import check, compare, make_inputs, poison_, reference
from tirx_gemm.run.device import (DeviceMismatchError, capability_matches, check_device,
                              parse_smi_line)
from tirx_gemm.run.launcher import BuildMeta, KernelHandle, launch, validate_inputs
from tirx_gemm.run.loader import RuntimeLibraryError, find_runtime_dir
from tirx_gemm.run.timing import n_sets_for_l2, tflops

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()


def _random_case(M=64, N=48, K=256, seed=1):
    inp = make_inputs(M, N, K, kind="random", seed=seed, device="cpu")
    return inp, reference(inp.A, inp.B)


def _int_case(M=32, N=40, K=512, seed=2):
    inp = make_inputs(M, N, K, kind="int", seed=seed, device="cpu")
    return inp, reference(inp.A, inp.B)


# --------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------
def test_compare_passes_on_fp16_rounding_of_reference():
    _, ref = _random_case()
    res = compare(ref.half(), ref)
    assert res.ok, res.summary()
    assert res.n_nan == res.n_inf == res.n_mismatch == 0
    # fp16 output rounding: ~u/sqrt(3) with u = 2**-11
    assert 5e-5 < res.rel_frobenius_error < 5e-4
    assert res.first_mismatches == []
    assert res.reason == ""


def test_compare_catches_nan():
    _, ref = _random_case()
    out = ref.half()
    out[7, 3] = float("nan")
    res = compare(out, ref)
    assert not res.ok
    assert res.n_nan == 1
    assert res.n_mismatch == 1
    assert res.first_mismatches[0][:2] == (7, 3)
    assert math.isnan(res.first_mismatches[0][2])
    assert "NaN" in res.reason


def test_compare_catches_poisoned_unwritten_output():
    _, ref = _random_case()
    out = poison_(torch.empty(ref.shape, dtype=torch.float16))
    out[:, : ref.shape[1] // 2] = ref[:, : ref.shape[1] // 2].half()  # half the tile "written"
    res = compare(out, ref)
    assert not res.ok
    assert res.n_nan == ref.numel() // 2
    assert len(res.first_mismatches) == 5


def test_compare_catches_inf():
    _, ref = _random_case()
    out = ref.half()
    out[0, 0] = float("inf")
    res = compare(out, ref)
    assert not res.ok and res.n_inf == 1 and res.n_nan == 0
    assert "Inf" in res.reason


def test_compare_catches_one_wrong_element():
    _, ref = _random_case()
    out = ref.half()
    out[5, 9] += 0.25
    res = compare(out, ref)
    assert not res.ok
    assert res.n_mismatch == 1
    r, c, got, want = res.first_mismatches[0]
    assert (r, c) == (5, 9)
    assert got == pytest.approx(want + 0.25, abs=2e-3)


def test_compare_catches_permuted_output():
    _, ref = _random_case()
    out = ref.half()[torch.randperm(ref.shape[0], generator=torch.Generator().manual_seed(0))]
    res = compare(out, ref)
    assert not res.ok
    assert res.n_mismatch > ref.numel() // 2
    assert res.rel_frobenius_error > 0.5
    # a transposed-tile style bug: swap two columns
    out = ref.half().clone()
    out[:, [0, 1]] = out[:, [1, 0]]
    assert not compare(out, ref).ok


def test_compare_catches_fp16_accumulation():
    """A kernel that accumulated in fp16 instead of fp32 must fail the random check."""
    inp, ref = _random_case(K=1024)
    acc = torch.zeros(ref.shape, dtype=torch.float16)
    for k in range(0, inp.A.shape[1], 16):  # fp16 partial sums, as a broken kernel would
        acc = (acc.float() + inp.A[:, k:k + 16].float() @ inp.B[:, k:k + 16].float().T).half()
    res = compare(acc, ref)
    assert not res.ok
    assert res.rel_frobenius_error > numerics.DEFAULT_MAX_REL_ERR


def test_compare_exact_mode_with_integers():
    inp, ref = _int_case()
    assert ref.abs().max() <= 2048  # K <= 512: no fp16 rounding at all
    res = compare(ref.half(), ref, exact=True)
    assert res.ok and res.exact and res.rel_frobenius_error == 0.0
    out = ref.half()
    out[3, 4] += 1  # off by one integer
    res = compare(out, ref, exact=True)
    assert not res.ok and res.n_mismatch == 1
    assert res.first_mismatches[0][:2] == (3, 4)
    out = ref.half()
    out[1, 1] = float("nan")
    res = compare(out, ref, exact=True)
    assert not res.ok and res.n_nan == 1


def test_compare_exact_mode_large_k_still_exact():
    """|result| > 2048: both sides round the exact fp32 integer to fp16 the same way."""
    inp = make_inputs(16, 16, 8192, kind="int", seed=3, device="cpu")
    ref = reference(inp.A, inp.B)
    assert compare(ref.half(), ref, exact=True).ok


def test_compare_exact_is_stricter_than_tolerance():
    ref = torch.full((4, 4), 300.0)
    out = ref.half()
    out[0, 0] = 300.25  # one fp16 ulp off: inside the tolerance, not exact
    assert compare(out, ref).ok
    res = compare(out, ref, exact=True)
    assert not res.ok and res.n_mismatch == 1


def test_compare_shape_mismatch_raises():
    _, ref = _random_case()
    with pytest.raises(ValueError, match="shape"):
        compare(ref.half()[:-1], ref)


def test_compare_to_dict_is_plain():
    _, ref = _random_case()
    out = ref.half()
    out[0, 1] = 7.0
    d = compare(out, ref).to_dict()
    assert d["ok"] is False and d["n_mismatch"] == 1
    assert d["first_mismatches"][0][:2] == [0, 1]


# --------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------
def test_make_inputs_random_and_int():
    a = make_inputs(32, 16, 64, kind="random", device="cpu")
    b = make_inputs(32, 16, 64, kind="random", device="cpu")
    assert a.seed != b.seed and not torch.equal(a.A, b.A)  # fresh inputs each call
    c = make_inputs(32, 16, 64, kind="random", seed=a.seed, device="cpu")
    assert torch.equal(a.A, c.A) and torch.equal(a.B, c.B)  # the recorded seed reproduces it
    assert a.A.dtype == a.B.dtype == a.D.dtype == torch.float16
    assert tuple(a.A.shape) == (32, 64) and tuple(a.B.shape) == (16, 64)
    assert tuple(a.D.shape) == (32, 16) and torch.isnan(a.D).all()
    i = make_inputs(32, 16, 64, kind="int", device="cpu")
    vals = set(torch.cat([i.A.flatten(), i.B.flatten()]).tolist())
    assert vals <= {-2.0, -1.0, 0.0, 1.0, 2.0} and len(vals) == 5
    A, B, D = i  # unpacks like a tuple
    with pytest.raises(ValueError, match="kind"):
        make_inputs(8, 8, 8, kind="ones", device="cpu")


def test_random_inputs_are_unit_scale():
    inp, ref = _random_case(M=128, N=128, K=4096)
    rms = ref.pow(2).mean().sqrt().item()
    assert 0.7 < rms < 1.3


# --------------------------------------------------------------------------------------
# validation and launch
# --------------------------------------------------------------------------------------
def _ops(M=16, N=8, K=32, dtype=torch.float16):
    return (torch.zeros(M, K, dtype=dtype), torch.zeros(N, K, dtype=dtype),
            torch.zeros(M, N, dtype=dtype))


def test_validate_inputs_accepts_good_cpu_operands_when_cuda_not_required():
    validate_inputs(*_ops(), 16, 8, 32, require_cuda=False)


def test_validate_inputs_rejects_cpu_tensors():
    with pytest.raises(ValueError, match="A is on cpu, must be a CUDA tensor"):
        validate_inputs(*_ops(), 16, 8, 32)


def test_validate_inputs_rejects_non_tensor():
    A, B, D = _ops()
    with pytest.raises(TypeError, match="B must be a torch.Tensor"):
        validate_inputs(A, B.numpy(), D, 16, 8, 32, require_cuda=False)


def test_validate_inputs_rejects_wrong_dtype():
    A, B, D = _ops()
    with pytest.raises(TypeError, match="D has dtype torch.float32"):
        validate_inputs(A, B, D.float(), 16, 8, 32, require_cuda=False)
    with pytest.raises(TypeError, match="A has dtype torch.bfloat16"):
        validate_inputs(A.bfloat16(), B, D, 16, 8, 32, require_cuda=False)


def test_validate_inputs_rejects_wrong_shape():
    A, B, D = _ops()
    with pytest.raises(ValueError, match=r"B has shape \(8, 16\), expected \(8, 32\)"):
        validate_inputs(A, B[:, :16].contiguous(), D, 16, 8, 32, require_cuda=False)
    with pytest.raises(ValueError, match="2-D"):
        validate_inputs(A.reshape(1, 16, 32), B, D, 16, 8, 32, require_cuda=False)
    # B given as KxN (the transpose) instead of NxK
    with pytest.raises(ValueError, match="B has shape"):
        validate_inputs(A, torch.zeros(32, 8, dtype=torch.float16), D, 16, 8, 32,
                        require_cuda=False)


def test_validate_inputs_rejects_non_contiguous():
    A, B, D = _ops()
    At = torch.zeros(32, 16, dtype=torch.float16).T  # right shape, wrong strides
    with pytest.raises(ValueError, match="A is not contiguous"):
        validate_inputs(At, B, D, 16, 8, 32, require_cuda=False)


def test_validate_inputs_rejects_misaligned():
    A, B, D = _ops()
    storage = torch.zeros(16 * 32 + 1, dtype=torch.float16)
    A_off = storage[1:].view(16, 32)  # contiguous, but 2 bytes off
    with pytest.raises(ValueError, match="16-byte aligned"):
        validate_inputs(A_off, B, D, 16, 8, 32, require_cuda=False)


def test_launch_refuses_shape_other_than_built_before_launching():
    called = []
    meta = {"step": "v3", "arch": "sm_90a", "M": 256, "N": 256, "K": 128}
    with pytest.raises(ValueError, match=r"built for M,N,K=256,256,128 but inputs are"):
        launch(lambda *a: called.append(a), meta, *_ops(), sync=False)
    handle = KernelHandle(lambda *a: called.append(a), meta)
    with pytest.raises(ValueError, match="built for M,N,K=256,256,128"):
        handle(*_ops())
    assert not called


def test_launch_refuses_cpu_tensors_before_launching():
    called = []
    meta = BuildMeta("v1", "sm_90a", 16, 8, 32)
    with pytest.raises(ValueError, match="CUDA tensor"):
        launch(lambda *a: called.append(a), meta, *_ops())
    assert not called


def test_build_meta_from_dict_and_object():
    m = BuildMeta.from_any({"step": "v1", "arch": "sm_100a", "M": 128, "N": 128, "K": 64,
                            "extra": 1})
    assert m.shape == (128, 128, 64)

    class Obj:
        step, arch, M, N, K, tvm_version = "v2", "sm_90a", 128, 128, 256, "0.27.0.post1"

    assert BuildMeta.from_any(Obj()).tvm_version == "0.27.0.post1"
    with pytest.raises(ValueError, match="lacks K"):
        BuildMeta.from_any({"step": "v1", "arch": "sm_90a", "M": 1, "N": 1})
    with pytest.raises(ValueError, match="arch"):
        BuildMeta.from_any({"step": "v1", "arch": "sm_80", "M": 1, "N": 1, "K": 1})


# --------------------------------------------------------------------------------------
# check() with CPU stand-in kernels
# --------------------------------------------------------------------------------------
def _cpu_launch(fn):
    def go(A, B, D):
        validate_inputs(A, B, D, *fn.shape, require_cuda=False)
        fn(A, B, D)
    return go


def test_check_passes_a_correct_kernel_and_fails_broken_ones():
    M, N, K = 64, 64, 128

    def good(A, B, D):
        D.copy_((A.float() @ B.float().T).half())

    def skips_last_tile(A, B, D):  # leaves a 32x32 corner unwritten (still NaN)
        R = (A.float() @ B.float().T).half()
        D[:32, :] = R[:32, :]
        D[32:, :32] = R[32:, :32]

    def drops_last_k_tile(A, B, D):
        D.copy_((A[:, :64].float() @ B[:, :64].float().T).half())

    for fn in (good, skips_last_tile, drops_last_k_tile):
        fn.shape = (M, N, K)
    rep = check(good, M, N, K, launch=_cpu_launch(good), device="cpu", log=None)
    assert rep["ok"], rep
    assert [r["kind"] for r in rep["results"]] == ["random", "int"]
    assert rep["results"][1]["exact"] and rep["results"][1]["rel_frobenius_error"] == 0
    assert rep["rel_err"] < 5e-4

    rep = check(skips_last_tile, M, N, K, launch=_cpu_launch(skips_last_tile), device="cpu",
                log=None)
    assert not rep["ok"]
    assert all(r["n_nan"] == 32 * 32 for r in rep["results"])

    rep = check(drops_last_k_tile, M, N, K, launch=_cpu_launch(drops_last_k_tile),
                device="cpu", log=None)
    assert not rep["ok"]
    assert all(not r["ok"] for r in rep["results"])


def test_check_draws_fresh_seeds_each_call():
    M = N = K = 32

    def good(A, B, D):
        D.copy_((A.float() @ B.float().T).half())

    good.shape = (M, N, K)
    s1 = [r["seed"] for r in check(good, M, N, K, launch=_cpu_launch(good), device="cpu",
                                   log=None)["results"]]
    s2 = [r["seed"] for r in check(good, M, N, K, launch=_cpu_launch(good), device="cpu",
                                   log=None)["results"]]
    assert s1 != s2


# --------------------------------------------------------------------------------------
# bfloat16: inputs, tolerances from the unit roundoff, exact mode, launch refusals
# --------------------------------------------------------------------------------------
def test_tolerances_come_from_the_unit_roundoff():
    fp16, bf16 = numerics.tolerances("float16"), numerics.tolerances("bfloat16")
    assert (fp16.rtol, fp16.atol_scale, fp16.max_rel_err) == (1e-3, 1e-3, 1e-3)  # as always
    assert bf16.rtol == bf16.max_rel_err == pytest.approx(8 * 1e-3)  # u: 2**-8 vs 2**-11
    assert numerics.UNIT_ROUNDOFF == {"float16": 2 ** -11, "bfloat16": 2 ** -8}
    with pytest.raises(ValueError, match="dtype='float32' is not supported"):
        numerics.tolerances("float32")


def test_make_inputs_bfloat16():
    a = make_inputs(32, 16, 64, kind="random", device="cpu", dtype="bfloat16")
    assert a.A.dtype == a.B.dtype == a.D.dtype == torch.bfloat16
    assert torch.isnan(a.D.float()).all()
    i = make_inputs(32, 16, 64, kind="int", device="cpu", dtype="bfloat16")
    vals = set(torch.cat([i.A.flatten(), i.B.flatten()]).float().tolist())
    assert vals == {-1.0, 0.0, 1.0}  # the narrower bf16 range keeps results exact
    An, Bn, Dn = numerics.make_inputs_np(32, 16, 64, "int", 0, "bfloat16")
    assert An.dtype.name == Bn.dtype.name == Dn.dtype.name == "bfloat16"
    assert set(np.unique(An.astype(np.float32))) <= {-1.0, 0.0, 1.0}
    with pytest.raises(ValueError, match="not supported"):
        make_inputs(8, 8, 8, device="cpu", dtype="float32")


def test_exact_integer_bound_per_dtype():
    # every integer up to 2**p is representable (p: 11 fp16, 8 bf16 significant bits)
    assert numerics.exact_k("float16") == 512 and numerics.exact_k("bfloat16") == 256
    inp = make_inputs(64, 64, 256, kind="int", seed=5, device="cpu", dtype="bfloat16")
    ref = reference(inp.A, inp.B)
    assert ref.abs().max() <= 256
    assert torch.equal(ref.bfloat16().float(), ref)  # nothing rounded at all
    numerics.check_int_k(2 ** 24 - 1, "bfloat16")
    with pytest.raises(ValueError, match="too large for an exact integer check in float16"):
        numerics.check_int_k(2 ** 22, "float16")


def test_compare_bfloat16_rounding_passes_and_fp16_tolerance_would_not():
    inp = make_inputs(64, 48, 256, kind="random", seed=1, device="cpu", dtype="bfloat16")
    ref = reference(inp.A, inp.B)
    res = compare(ref.bfloat16(), ref)  # dtype from the output tensor
    assert res.ok and res.dtype == "bfloat16", res.summary()
    assert 5e-4 < res.rel_frobenius_error < 4e-3  # ~u/sqrt(3), u = 2**-8
    # the same bf16 output judged by float16's tolerances fails: the rules differ by dtype
    assert not compare(ref.bfloat16().float(), ref, dtype="float16").ok
    with pytest.raises(ValueError, match="out has dtype torch.bfloat16 but is compared as float16"):
        compare(ref.bfloat16(), ref, dtype="float16")


def test_compare_bfloat16_catches_bf16_accumulation_and_exact_off_by_one():
    inp = make_inputs(64, 64, 1024, kind="random", seed=2, device="cpu", dtype="bfloat16")
    ref = reference(inp.A, inp.B)
    acc = torch.zeros(ref.shape, dtype=torch.bfloat16)
    for k in range(0, 1024, 16):  # bf16 partial sums, as a broken kernel would keep them
        acc = (acc.float() + inp.A[:, k:k + 16].float() @ inp.B[:, k:k + 16].float().T).bfloat16()
    res = compare(acc, ref)
    assert not res.ok and res.rel_frobenius_error > numerics.tolerances("bfloat16").max_rel_err
    iinp = make_inputs(32, 40, 256, kind="int", seed=3, device="cpu", dtype="bfloat16")
    iref = reference(iinp.A, iinp.B)
    out = iref.bfloat16()
    assert compare(out, iref, exact=True).ok
    out[3, 4] += 1
    res = compare(out, iref, exact=True)
    assert not res.ok and res.n_mismatch == 1 and "bfloat16-rounded" in res.reason


def test_numpy_and_torch_round_bfloat16_alike():
    """The simulation (numpy, ml_dtypes) and the GPU check (torch) share one rule set: both
    round the fp32 reference to bf16 the same way (round to nearest even)."""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 300
    assert np.array_equal(x.bfloat16().float().numpy(), numerics.round_to(x.numpy(), "bfloat16"))
    assert np.array_equal(x.half().float().numpy(), numerics.round_to(x.numpy(), "float16"))


def test_validate_inputs_checks_the_build_dtype():
    A, B, D = _ops(dtype=torch.bfloat16)
    validate_inputs(A, B, D, 16, 8, 32, dtype="bfloat16", require_cuda=False)
    with pytest.raises(TypeError, match=r"^A has dtype torch.bfloat16, but the kernel was built "
                                        r"for float16 \(torch.float16\)$"):
        validate_inputs(A, B, D, 16, 8, 32, require_cuda=False)
    with pytest.raises(TypeError, match=r"^B has dtype torch.float16, but the kernel was built "
                                        r"for bfloat16"):
        validate_inputs(A, B.half(), D, 16, 8, 32, dtype="bfloat16", require_cuda=False)


def _cpu_launch_env(monkeypatch):
    """launch() on CPU stand-ins: the CUDA and capability checks skipped, nothing else."""
    from tirx_gemm.run import launcher
    real = launcher.validate_inputs
    monkeypatch.setattr(launcher, "validate_inputs",
                        lambda *a, **k: real(*a, **{**k, "require_cuda": False}))
    monkeypatch.setattr(launcher, "check_capability", lambda *a, **k: None)


def test_capability_is_checked_once_per_run(monkeypatch):
    """The run boundary checks the GPU once: a KernelHandle on its first launch on a device
    (not on every call), launch() unless its caller says it checked (run_step's
    check_device), and run_step's own launches never ask again."""
    from tirx_gemm.run import launcher
    _cpu_launch_env(monkeypatch)
    asked = []
    monkeypatch.setattr(launcher, "check_capability", lambda arch, dev: asked.append(arch))
    meta = {"step": "v4", "arch": "sm_90a", "M": 16, "N": 8, "K": 32}
    handle = KernelHandle(lambda *a: None, meta)
    for _ in range(3):
        handle(*_ops(), sync=False)
    assert asked == ["sm_90a"]
    launch(lambda *a: None, meta, *_ops(), sync=False)
    launch(lambda *a: None, meta, *_ops(), sync=False, device_checked=True)
    assert asked == ["sm_90a", "sm_90a"]
    src = (ROOT / "tirx_gemm" / "run" / "runner.py").read_text()
    assert "check_capability" not in src and src.count("check_device(") == 1
    assert "device_checked=True" in src


def test_launch_refuses_operands_of_another_dtype_than_built(monkeypatch):
    _cpu_launch_env(monkeypatch)
    called = []
    meta = {"step": "v4", "arch": "sm_90a", "M": 16, "N": 8, "K": 32,
            "kwargs": {"dtype": "bfloat16"}}
    assert BuildMeta.from_any(meta).dtype == "bfloat16"
    with pytest.raises(TypeError, match="A has dtype torch.float16, but the kernel was built "
                                        "for bfloat16"):
        launch(lambda *a: called.append(a), meta, *_ops(), sync=False)
    assert not called
    launch(lambda *a: called.append(a), meta, *_ops(dtype=torch.bfloat16), sync=False)
    assert len(called) == 1 and len(called[0]) == 3  # v4 has no workspace operands
    with pytest.raises(ValueError, match="dtype='float32' is not supported"):
        BuildMeta.from_any({**meta, "kwargs": {"dtype": "float32"}})


# --------------------------------------------------------------------------------------
# workspace operands (a split-K step's extra buffers after D), with a stand-in step
# --------------------------------------------------------------------------------------
def _fake_split_k_step(monkeypatch):
    """A Step whose workspace function asks for fp32 partial sums and int32 tile counters."""
    import types

    from tirx_gemm import registry
    mod = types.ModuleType("fake_workspace_specs")

    def specs(M, N, K, kwargs):
        splits = kwargs.get("SPLITS", 2)
        return (("partials", (splits, M, N), "float32"), ("counters", (4,), "int32"))

    mod.specs = specs
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return registry.Step("v11", "sm_90a", "split-K", "", (16, 8, 32), (), (), (), (),
                         workspace=f"{mod.__name__}:specs")


def test_workspace_specs_of_a_step_and_of_the_steps_without_one(monkeypatch):
    from tirx_gemm import registry
    from tirx_gemm.run import launcher
    step = _fake_split_k_step(monkeypatch)
    meta = {"step": "v11", "arch": "sm_90a", "M": 16, "N": 8, "K": 32, "kwargs": {"SPLITS": 3}}
    assert launcher.workspace_specs(meta, step) == (("partials", (3, 16, 8), "float32"),
                                                    ("counters", (4,), "int32"))
    for s in registry.STEPS:  # every existing step: no extra operands
        assert launcher.workspace_specs({"step": s.id, "arch": s.arch, "M": 128, "N": 128,
                                         "K": 64}) == ()


def test_kernel_handle_passes_a_zeroed_workspace_after_d_allocated_once(monkeypatch):
    _cpu_launch_env(monkeypatch)
    step = _fake_split_k_step(monkeypatch)
    meta = {"step": "v11", "arch": "sm_90a", "M": 16, "N": 8, "K": 32, "kwargs": {"SPLITS": 2}}
    seen = []

    def kernel(A, B, D, partials, counters):
        seen.append((partials, counters))
        assert int(partials.count_nonzero()) == 0 and int(counters.count_nonzero()) == 0
        D.copy_((A.float() @ B.float().T).half())

    h = KernelHandle(kernel, meta, step=step)
    h(*_ops(), sync=False)
    h(*_ops(), sync=False)
    (p1, c1), (p2, c2) = seen
    assert p1 is p2 and c1 is c2, "allocated once per loaded kernel, not per launch"
    assert tuple(p1.shape) == (2, 16, 8) and p1.dtype == torch.float32
    assert tuple(c1.shape) == (4,) and c1.dtype == torch.int32 and c1.device == torch.device("cpu")
    # a workspace unlike the specs is refused before the kernel runs
    from tirx_gemm.run import launcher
    bad = (("partials", torch.zeros(2, 16, 8)), ("counters", torch.zeros(4)))
    with pytest.raises(ValueError, match="workspace 'counters' is torch.float32 \\(4,\\), the "
                                         "build wants int32"):
        launch(kernel, meta, *_ops(), sync=False, workspace=bad, step=step)
    with pytest.raises(ValueError, match="do not match the build's"):
        launch(kernel, meta, *_ops(), sync=False, workspace=bad[:1], step=step)
    assert len(seen) == 2
    assert launcher.make_workspace((), "cpu") == ()


def test_check_poisons_scratch_and_fails_a_kernel_that_leaves_counters_dirty(monkeypatch):
    """The workspace contract (registry.Step.workspace): counters (integer buffers) are zero
    at the start and left zero; scratch (floating point) is written before it is read, so
    the check fills it with NaN and a kernel may leave it dirty."""
    from tirx_gemm.run import launcher
    step = _fake_split_k_step(monkeypatch)
    M, N, K = 16, 8, 32
    meta = {"step": "v11", "arch": "sm_90a", "M": M, "N": N, "K": K}
    ws = launcher.make_workspace(launcher.workspace_specs(meta, step), "cpu")

    def tidy(A, B, D, partials, counters):  # writes its scratch, then reads it
        partials[0].copy_(A[:, :16].float() @ B[:, :16].float().T)
        partials[1].copy_(A[:, 16:].float() @ B[:, 16:].float().T)
        counters[0] += 1
        D.copy_((partials[0] + partials[1]).half())
        counters[0] -= 1  # the last split resets the tile counter

    def reads_unwritten_scratch(A, B, D, partials, counters):
        partials[0].copy_(A[:, :16].float() @ B[:, :16].float().T)
        D.copy_((partials[0] + partials[1]).half())  # split 1 never stored its partial

    def leaves_counter(A, B, D, partials, counters):
        D.copy_((A.float() @ B.float().T).half())
        counters[0] += 1  # a tile counter never reset: the next launch would misbehave

    reps = {}
    for fn in (tidy, reads_unwritten_scratch, leaves_counter):
        def go(A, B, D, fn=fn):
            validate_inputs(A, B, D, M, N, K, require_cuda=False)
            fn(A, B, D, *(t for _, t in ws))
        reps[fn.__name__] = check(fn, M, N, K, launch=go, device="cpu", workspace=ws, log=None)
        if fn is tidy:  # its scratch is left as the kernel wrote it: allowed
            assert torch.isfinite(ws[0][1]).all()
    assert reps["tidy"]["ok"], reps["tidy"]
    bad = reps["reads_unwritten_scratch"]
    assert not bad["ok"] and all(r["n_nan"] == M * N for r in bad["results"])
    bad = reps["leaves_counter"]
    assert not bad["ok"]
    assert all("workspace 'counters' has 1 nonzero element(s)" in r["reason"]
               and r["n_mismatch"] == 0 for r in bad["results"])  # the numbers were right


# --------------------------------------------------------------------------------------
# device gating
# --------------------------------------------------------------------------------------
def test_capability_table():
    assert capability_matches("sm_90a", (9, 0))
    assert not capability_matches("sm_90a", (9, 1))
    assert not capability_matches("sm_90a", (10, 0))
    assert capability_matches("sm_100a", (10, 0))
    assert capability_matches("sm_100a", (10, 3))
    assert not capability_matches("sm_100a", (9, 0))
    assert not capability_matches("sm_100a", (12, 0))
    with pytest.raises(ValueError):
        capability_matches("sm_80", (8, 0))


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
@pytest.mark.parametrize("arch,need", [("sm_90a", "9.0"), ("sm_100a", "10.x")])
def test_check_device_without_gpu_raises_clear_error(arch, need):
    with pytest.raises(DeviceMismatchError) as ei:
        check_device(arch)
    msg = str(ei.value)
    assert msg.startswith("no CUDA GPU visible: ")
    assert arch in msg and need in msg
    assert isinstance(ei.value, RuntimeError)


def test_check_device_mismatch_message(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    with pytest.raises(DeviceMismatchError) as ei:
        check_device("sm_100a")
    assert str(ei.value) == ("step built for sm_100a needs compute capability 10.x; "
                             "this GPU NVIDIA H200 is 9.0")


def test_parse_smi_line():
    got = parse_smi_line("1980, 3201, 1980, 580.65.06")
    assert got == {"clocks": {"sm_mhz": 1980, "mem_mhz": 3201, "max_sm_mhz": 1980},
                   "driver_version": "580.65.06"}
    got = parse_smi_line("[N/A], [N/A], [N/A], [N/A]")
    assert got == {"clocks": None, "driver_version": None}


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
def test_load_kernel_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        loader.load_kernel(tmp_path / "missing.so")
    lib = tmp_path / "step.so"
    lib.write_bytes(b"")
    with pytest.raises(DeviceMismatchError, match="no CUDA GPU visible"):
        loader.load_kernel(lib)


def test_find_runtime_dir_order(tmp_path, monkeypatch):
    def fake_runtime(d):
        d.mkdir(parents=True)
        for name in loader.RUNTIME_LIBS:
            (d / name).write_bytes(b"")
        return d

    lib = tmp_path / "bundle" / "v4_sm90a.so"
    bundle_rt = fake_runtime(tmp_path / "bundle" / "runtime")
    env_rt = fake_runtime(tmp_path / "env_rt")
    monkeypatch.setenv(loader.RUNTIME_DIR_ENV, str(env_rt))
    assert find_runtime_dir(lib) == env_rt
    monkeypatch.setenv(loader.RUNTIME_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeLibraryError, match="does not contain"):
        find_runtime_dir(lib)
    monkeypatch.delenv(loader.RUNTIME_DIR_ENV)
    assert find_runtime_dir(lib) == bundle_rt
    # no bundle: the installed tvm wheel's lib/ (this venv has apache-tvm)
    found = find_runtime_dir(tmp_path / "elsewhere" / "x.so")
    assert (found / "libtvm_runtime.so").is_file() and found.name == "lib"


def test_load_kernel_loads_tvm_runtime_once_per_process(tmp_path, monkeypatch):
    """A second copy of libtvm_runtime.so from another folder aborts the process (seen on
    the H200): load_kernel must dlopen the runtime once and reuse it."""
    import types

    def fake_runtime(d):
        d.mkdir(parents=True)
        for name in loader.RUNTIME_LIBS:
            (d / name).write_bytes(b"")

    for b in ("b1", "b2"):
        fake_runtime(tmp_path / b / "runtime")
        (tmp_path / b / "k.so").write_bytes(b"")
    dlopened, loaded = [], []
    fake_ffi = types.ModuleType("tvm_ffi")
    fake_ffi.load_module = lambda p: loaded.append(p) or {"main": f"main of {p}"}
    monkeypatch.setitem(sys.modules, "tvm_ffi", fake_ffi)
    monkeypatch.delitem(sys.modules, "tvm", raising=False)
    monkeypatch.delenv(loader.RUNTIME_DIR_ENV, raising=False)
    monkeypatch.setattr(loader, "_init_cuda_via_torch", lambda: None)
    monkeypatch.setattr(loader.ctypes, "CDLL", lambda p, mode=0: dlopened.append(p) or p)
    monkeypatch.setattr(loader, "_RUNTIME_LOADED", {"dir": None, "handles": []})
    f1 = loader.load_kernel(tmp_path / "b1" / "k.so")
    f2 = loader.load_kernel(tmp_path / "b2" / "k.so")
    assert f1.endswith("b1/k.so") and f2.endswith("b2/k.so")
    assert [Path(p).name for p in dlopened] == list(loader.RUNTIME_LIBS)
    assert all("b1" in p for p in dlopened)
    assert loader.loaded_runtime_dir() == tmp_path / "b1" / "runtime"


def test_find_runtime_dir_reports_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv(loader.RUNTIME_DIR_ENV, raising=False)
    monkeypatch.setattr(loader, "tvm_package_lib_dir", lambda: None)
    with pytest.raises(RuntimeLibraryError) as ei:
        find_runtime_dir(tmp_path / "x.so")
    msg = str(ei.value)
    assert loader.RUNTIME_DIR_ENV in msg and "runtime" in msg and "tvm package" in msg


# --------------------------------------------------------------------------------------
# timing arithmetic
# --------------------------------------------------------------------------------------
def test_l2_rotation_and_tflops():
    l2 = 50 * 1024 * 1024
    assert n_sets_for_l2(2 * 3 * 8192 * 8192, l2) == 1  # 384 MiB >> L2: one set
    assert n_sets_for_l2(2 * 3 * 4096 * 4096, l2) == 3  # 96 MiB < 2x L2: rotate
    small = 2 * (128 * 64 + 128 * 64 + 128 * 128)
    n = n_sets_for_l2(small, l2)
    assert n * small >= 2 * l2 or n == 1024
    assert n_sets_for_l2(2 * 3 * 2048 * 2048, l2) >= 3  # 24 MiB fits: rotate
    assert tflops(4096, 4096, 4096, 1.0) == pytest.approx(137.438953472)
    assert tflops(1, 1, 1, None) is None


# --------------------------------------------------------------------------------------
# runner imports where tvm cannot be imported
# --------------------------------------------------------------------------------------
BLOCK_TVM = textwrap.dedent(
    """
    import sys

    class BlockTVM:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tvm", "tvm_ffi"):
                raise ImportError(f"blocked for this test: {name}")
            return None

    sys.meta_path.insert(0, BlockTVM())
    sys.path.insert(0, ROOT_DIR)
    """
)


def test_runner_imports_and_works_without_tvm(tmp_path):
    code = BLOCK_TVM.replace("ROOT_DIR", repr(str(ROOT))) + textwrap.dedent(
        """
        try:
            import tvm
        except ImportError:
            pass
        else:
            raise SystemExit("the blocker did not block tvm")
        import torch
        from tirx_gemm import numerics
        from tirx_gemm.report import records
        from tirx_gemm.run import checking, device, launcher, loader, runner, timing
        assert "tvm" not in sys.modules and "tvm_ffi" not in sys.modules, sorted(
            m for m in sys.modules if m.startswith("tvm"))
        inp = checking.make_inputs(32, 32, 64, device="cpu")
        ref = checking.reference(inp.A, inp.B)
        assert checking.compare(ref.half(), ref).ok
        assert not checking.compare(inp.D, ref).ok  # poisoned, never written
        try:
            loader.find_runtime_dir("/nonexistent/x.so")
        except loader.RuntimeLibraryError as e:
            assert "installed tvm package" in str(e), e
        else:
            raise SystemExit("find_runtime_dir should fail with tvm hidden")
        assert "tvm" not in sys.modules
        print("OK")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != loader.RUNTIME_DIR_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("OK")


# the run side: what a GPU host without TVM's compiler imports to load, check and time a kernel
RUN_SIDE = ("run/runner", "run/device", "run/loader", "run/launcher", "run/checking",
            "run/timing", "numerics", "report/records", "tvmruntime", "gitinfo")


@pytest.mark.parametrize("module", RUN_SIDE)
def test_run_side_modules_never_import_tvm(module):
    """No run-side module imports the TVM compiler anywhere in its code (module level or in
    a function): apache-tvm-ffi, which loads kernels, is allowed."""
    import ast
    tree = ast.parse((ROOT / "tirx_gemm" / f"{module}.py").read_text())
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            assert name != "tvm" and not name.startswith("tvm."), \
                f"tirx_gemm/{module}.py line {node.lineno} imports {name}"

def _grouped_kernel(seen):
    """A stand-in for v14's f(A, B_e, D, offs): each expert's rows against its own weight."""
    def f(A, Be, D, offs, *ws):
        seen.append((tuple(Be.shape), offs.tolist(), len(ws)))
        start = 0
        for e, end in enumerate(offs.tolist()):
            D[start:end] = (A[start:end].float() @ Be[e].float().T).to(D.dtype)
            start = end
    return f


def test_grouped_operands_run_v14_on_dense_operands():
    """The runner's check of v14: B copied to each of the build's experts, M split evenly
    (offs the row ends), so the kernel's D is A @ B.T; the weight copies are kept per set."""
    seen = []
    g = runner.GroupedOperands(_grouped_kernel(seen), {"E": 3, "dtype": "float16"})
    A, B = torch.randn(10, 16), torch.randn(24, 16)
    D = torch.full((10, 24), float("nan"))
    g(A, B, D)
    assert seen == [((3, 24, 16), [4, 7, 10], 0)]
    assert torch.allclose(D, A @ B.T, atol=1e-5)
    g.prepare([(A, B, D)])
    assert len([k for k in g._held if k[0] != "offs"]) == 1  # one copy for one weight
    assert runner.GroupedOperands(_grouped_kernel([]), {}).E == runner.registry.GROUPED_E


@pytest.mark.parametrize("kw", [{"LAYOUT": "masked"}, {"BIAS": True}, {"SWIGLU": "halves"}])
def test_grouped_operands_refuse_masked_and_fused_builds(kw):
    with pytest.raises(ValueError, match="plain contiguous builds"):
        runner.GroupedOperands(lambda *a: None, kw)
