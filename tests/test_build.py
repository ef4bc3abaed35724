"""Every step compiles for its arch at its canonical shape and at another valid shape, and
its SASS shows what its lesson promises. All builds run in one batch of parallel worker
processes (build_many), in the session's cache (tests/conftest.py): the other test files
then find the same builds there (notebooks, CLI, bundle, regress --cpu, reliability)."""
import pytest

from tirx_gemm import registry, spec
from tirx_gemm.compile.api import build_many, count_prefix

SMEM_LIMIT = spec.SMEM_BYTES_MAX
# SMs of the GPU each arch runs on (H100/H200, B200): a persistent step's other shape is
# built as `tirx-gemm export` builds it for that GPU, its CTA pool sized to the SM count
GPU_SMS = {"sm_90a": 132, "sm_100a": 148}


# the bf16 build of each step: v1-v3 at an aligned shape (their contract), the TMA steps
# at a shape off every tile grid (M not a multiple of any tile, N and K multiples of 8)
BF16 = {"dtype": "bfloat16"}
EDGE = (1000, 264, 200)
EDGE_FP8 = (1000, 264, 208)


def _requests():
    reqs = []
    for s in registry.STEPS:
        reqs.append((s, s.canonical, {}))
        other = next((t for t in s.test_shapes if t != s.canonical), None)
        if other:
            reqs.append((s, other, s.with_sm_count(GPU_SMS[s.arch])))
        aligned = s.constraints.startswith(("M = N = 128", "M, N multiples"))
        # fp8 (v13): K x 1 byte rows need K a multiple of 16
        edge = EDGE_FP8 if s.fp8 else EDGE
        reqs.append((s, (other or s.canonical) if aligned else edge,
                     {**s.with_sm_count(GPU_SMS[s.arch]), **BF16}))
    return reqs


REQUESTS = _requests()
# a shape the builder refuses, in the same batch: its ValueError crosses the build processes
INVALID = (registry.get("v4", "sm_100a"), (256, 260, 96), {})


@pytest.fixture(scope="module")
def built():
    results = build_many(REQUESTS + [INVALID])
    return {(req[0].key, req[1], req[2].get("dtype")): res
            for req, res in zip(REQUESTS, results)}, results[-1]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r[0].key}-{'x'.join(map(str, r[1]))}"
                         f"{'-' + r[2]['dtype'] if 'dtype' in r[2] else ''}")
def test_step_builds_with_lesson_sass(built, req):
    step, mnk, kwargs = req
    res = built[0][(step.key, mnk, kwargs.get("dtype"))]
    if isinstance(res, Exception):
        raise res
    assert (res.M, res.N, res.K) == mnk and res.arch == step.arch
    assert res.spill_stores == 0 and res.spill_loads == 0, "no register spills"
    assert res.stack_bytes == 0, "no local-memory stack frame"
    assert res.registers and res.registers <= 255
    assert res.smem_bytes and 0 < res.smem_bytes <= SMEM_LIMIT
    for op in step.sass_expect:
        assert count_prefix(res.sass_counts, op) > 0, f"{op} missing from SASS"
    for op in step.sass_forbid:
        assert count_prefix(res.sass_counts, op) == 0, f"{op} must not appear"
    assert f"arch = {step.arch.rstrip('a')}" in res.sass or step.arch in res.sass
    if kwargs.get("dtype") == "bfloat16":  # the operands and the MMA are bf16, not fp16
        assert "nv_bfloat16" in res.cuda_source
        if step.fp8:  # e4m3 operands, bf16 only the output: wgmma's e4m3 form on sm_90a,
            # tcgen05's kind::f8f6f4 (the types in its instruction descriptor) on sm_100a
            fp8_mma = ".e4m3.e4m3" if step.arch == "sm_90a" else "kind::f8f6f4"
            assert fp8_mma in res.cuda_source and ".f16.f16" not in res.cuda_source
        elif step.arch == "sm_90a":
            assert ".bf16.bf16" in res.cuda_source and ".f16.f16" not in res.cuda_source
    assert res.lib_path.stat().st_size > 10_000
    assert "__global__" in res.cuda_source and "T.prim_func" in res.tir


def test_exported_library_embeds_the_binary(built):
    """The .so made on this driverless machine (stub libcuda) carries the compiled cubin,
    not CUDA source: the GPU host needs neither nvcc nor TVM's compiler."""
    for step in registry.STEPS:
        res = built[0][(step.key, step.canonical, None)]
        cubin = res.cubin_path.read_bytes()
        assert cubin[:4] == b"\x7fELF"
        assert cubin in res.lib_path.read_bytes(), f"{step.key}: cubin not embedded"


def test_second_build_is_cached(built):
    # a cache hit is a file read: no build server starts (speed is shown by `tirx-gemm
    # build --all` printing "cached", not asserted on a shared machine's clock)
    again = build_many(REQUESTS)
    assert all(r.cached for r in again)
    for req, r in zip(REQUESTS, again):
        first = built[0][(req[0].key, req[1], req[2].get("dtype"))]
        assert r.key == first.key and r.cuda_source == first.cuda_source


def test_invalid_shape_through_harness_is_the_builders_valueerror(built):
    err = built[1]
    assert isinstance(err, ValueError) and "N=260 is not a multiple of 8" in str(err), err


def test_sm100a_v1_and_v7_differ_by_the_lesson(built):
    v1 = built[0][("v1@sm_100a", (128, 128, 64), None)]
    v7 = built[0][("v7@sm_100a", (4096, 4096, 4096), None)]
    assert count_prefix(v1.sass_counts, "USETMAXREG") == 0
    assert count_prefix(v7.sass_counts, "USETMAXREG") >= 2  # one dec + one inc


def test_setmaxnreg_splits_fit_the_registers_ptxas_chose(built):
    from tirx_gemm.compile.regbudget import setmaxnreg_problem
    for step in registry.STEPS:
        res = built[0][(step.key, step.canonical, None)]
        assert setmaxnreg_problem(res.cuda_source, res.registers) is None, step.key
