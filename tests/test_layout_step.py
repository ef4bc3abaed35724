"""v15 (operand layouts): the builders' keywords and checks, the four layouts' builds on both
arches, and (marked `gpu`) each sm_90a layout against torch on an sm_90a GPU. The sm_100a
twin's numbers and protocol: its registry sim cases (`tirx-gemm sim v15`, NumSim).

An MN-major operand is passed as the transposed tensor: A as (K, M), B as (K, N), both
row-major, so ``D = A_mn.T @ B_mn`` for A_MAJOR = B_MAJOR = "MN" (TT), and so on. The GPU
cases are built with M at run time (one kernel per (N, K, layout, dtype)):
lab/training_backward/export.py exports LAYOUT_CASES' kernels.
"""
import importlib.util
import os

import pytest

# the verbs import TVM (absent on a GPU host): the CPU tests skip without it
L = pytest.importorskip("tirx_gemm.hopper.layouts") if importlib.util.find_spec("tvm") \
    else None

LAYOUTS = (("K", "K"), ("K", "MN"), ("MN", "K"), ("MN", "MN"))
# (M, N, K, dtype): a full cluster tile grid; M, N off the tile grid with a partial last K
# step (A MN-major needs M % 8 == 0); a deep, ragged K (wgrad's token count)
LAYOUT_CASES = ((512, 768, 320, "bfloat16"), (296, 264, 200, "bfloat16"),
                (256, 512, 1000, "bfloat16"), (512, 768, 320, "float16"))
RUNTIME_K_TOKENS = (1, 7, 64, 333, 1000, 4096)  # one RUNTIME_K kernel (512 x 768) serves all
RUNTIME_K_FEATURES = (8, 64, 320, 4104)  # A K-major: its rows are K, a multiple of 8


def _builder():
    from steps.sm90a.hgemm_v15 import hgemm_v15
    return hgemm_v15


def test_descriptor_constants():
    pytest.importorskip("tvm")
    # MN-major 128B swizzle, 16-byte units: 8 K rows of 128 B between groups, 64 K rows of
    # 128 B between 64-element MN chunks, 16 K rows per k16 slice
    assert (L.DESC_MN_SBO, L.DESC_MN_LBO, L.DESC_MN_K16_STEP) == (64, 512, 128)
    assert L.desc_steps(False) == (1, 64, 2)
    assert L.smem_shape(4, 256, 64, True) == (4, 4, 64, 64)
    assert L.smem_shape(4, 256, 64, False) == (4, 256, 64)
    assert L.gmem_shape(300, 64, True) == (64, 300)


def test_bad_major_refused():
    pytest.importorskip("tvm")
    with pytest.raises(ValueError, match="A_MAJOR='T'.*'K'-major .* or 'MN'-major"):
        _builder()(512, 512, 320, A_MAJOR="T")


def test_mn_major_a_needs_m_multiple_of_8():
    pytest.importorskip("tvm")  # the builder and L
    with pytest.raises(ValueError, match="M=300 with A_MAJOR='MN'.*multiple of 8"):
        _builder()(300, 512, 320, A_MAJOR="MN")
    with pytest.raises(ValueError, match="MN-major tile of 100 rows"):
        L.smem_shape(2, 100, 64, True)


@pytest.mark.parametrize("a_major,b_major", LAYOUTS[1:])
def test_layout_builds(a_major, b_major):
    """Each layout compiles (nvcc, ptxas: no spills), the wgmmas carry its transpose bits and
    an MN-major operand is loaded in 64-row boxes (two per 128-row A tile or B half)."""
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build
    r = build("v15", 512, 512, 320, arch="sm_90a", A_MAJOR=a_major, B_MAJOR=b_major,
              SM_COUNT=4, dtype="bfloat16")
    assert r.spill_stores == 0 and r.spill_loads == 0
    assert r.sass_counts.get("HGMMA.64x256x16.F32.BF16", 0) > 0
    src = r.cuda_path.read_text()
    ta, tb = int(a_major == "MN"), int(b_major == "MN")
    assert f"ps0, 1, 1, {ta}, {tb}; }}" in src
    boxes = r.sass_counts.get("UTMALDG.2D", 0), r.sass_counts.get("UTMALDG.2D.MULTICAST", 0)
    assert boxes == (1 + (a_major == "MN"), 1 + (b_major == "MN"))


@pytest.mark.parametrize("a_major,b_major", (("K", "MN"), ("MN", "MN")))
def test_one_cta_build(a_major, b_major):
    """CLUSTER=1, PDL (the backward's build): no multicast (each CTA loads its whole 256-row B
    tile, four 64-row boxes MN-major), one HGMMA per k16 step of a 64-wide K tile per
    consumer, the PDL wait in the kernel."""
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build
    r = build("v15", 512, 512, 320, arch="sm_90a", A_MAJOR=a_major, B_MAJOR=b_major,
              SM_COUNT=4, dtype="bfloat16", CLUSTER=1, PDL=True)
    assert r.spill_stores == 0 and r.spill_loads == 0
    assert r.sass_counts.get("HGMMA.64x256x16.F32.BF16", 0) == 4
    assert r.sass_counts.get("UTMALDG.2D.MULTICAST", 0) == 0
    assert r.sass_counts.get("UTMALDG.2D", 0) == (1 + (a_major == "MN")) + 4
    assert "griddepcontrol.wait" in r.cuda_path.read_text()


def test_runtime_k_build():
    """RUNTIME_K: K is a kernel argument, the K loop as before (one HGMMA per k16 step)."""
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build
    r = build("v15", 512, 768, 64, arch="sm_90a", A_MAJOR="MN", B_MAJOR="MN", SM_COUNT=4,
              dtype="bfloat16", CLUSTER=1, PDL=True, RUNTIME_K=True)
    assert r.spill_stores == 0 and r.spill_loads == 0
    assert r.sass_counts.get("HGMMA.64x256x16.F32.BF16", 0) == 4
    assert "int K" in r.cuda_path.read_text()


def test_cluster_and_pdl_refused():
    """CLUSTER is 1 or 2; PDL only for one-CTA kernels."""
    pytest.importorskip("tvm")
    hgemm_v15 = _builder()
    with pytest.raises(ValueError, match="CLUSTER=4 must be 2"):
        hgemm_v15(512, 512, 320, CLUSTER=4)
    with pytest.raises(ValueError, match="PDL=True with CLUSTER=2"):
        hgemm_v15(512, 512, 320, PDL=True)


@pytest.mark.parametrize("a_major,b_major", LAYOUTS[1:])
def test_sm100a_layout_builds(a_major, b_major):
    """The sm_100a twin compiles in each layout: tcgen05.mma (UTCHMMA), one TMA box per
    64-element chunk of an MN-major operand's rows (two per 128-row tile)."""
    pytest.importorskip("tvm")
    from tirx_gemm.compile.api import build
    r = build("v15", 256, 256, 192, arch="sm_100a", A_MAJOR=a_major, B_MAJOR=b_major,
              SM_COUNT=2, dtype="bfloat16")
    assert r.spill_stores == 0 and r.spill_loads == 0
    assert any(op.startswith("UTCHMMA") for op in r.sass_counts)
    loads = sum(n for op, n in r.sass_counts.items() if op.startswith("UTMALDG"))
    assert loads == (1 + (a_major == "MN")) + (1 + (b_major == "MN"))


def test_k_rule_follows_the_layout():
    """K is a row length only for a K-major operand: any K when both are MN-major."""
    pytest.importorskip("tvm")
    L.check_layout_shape(512, 512, 7, "bfloat16", True, True)
    for a_mn, b_mn in ((False, True), (True, False), (False, False)):
        with pytest.raises(ValueError, match="K=7 is not a multiple of 8"):
            L.check_layout_shape(512, 512, 7, "bfloat16", a_mn, b_mn)
    with pytest.raises(ValueError, match="N=12 is not a multiple of 8"):
        L.check_layout_shape(512, 12, 64, "bfloat16", True, True)


# --------------------------------------------------------------------------------------
# on an sm_90a GPU
# --------------------------------------------------------------------------------------
def _gpu_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90a GPU (compute capability 9.0)")
    if not os.environ.get("TIRX_GEMM_BUNDLE") and importlib.util.find_spec("tvm") is None:
        pytest.skip("no kernels: set TIRX_GEMM_BUNDLE or install TVM")
    return torch


# v15's builds on the GPU: the lesson's (v9's CTA pair) and the backward's (autograd.LAYOUT_TUNE)
TUNES = {"pair": {}, "backward": None}


@pytest.mark.gpu
@pytest.mark.parametrize("tune", TUNES)
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("a_major,b_major", LAYOUTS)
def test_layout_against_torch(case, a_major, b_major, tune):
    torch = _gpu_or_skip()
    from tirx_gemm.matmul import synchronize
    from tirx_gemm.op import autograd as AG
    M, N, K, dtype = case
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", dtype=dt, generator=g)
    b = torch.randn(N, K, device="cuda", dtype=dt, generator=g)
    a_store = a.t().contiguous() if a_major == "MN" else a
    b_store = b.t().contiguous() if b_major == "MN" else b
    d = AG._gemm_layout(a_store, a_major == "MN", b_store, b_major == "MN", TUNES[tune])
    synchronize()
    ref = a.float() @ b.float().T
    err = (d.float() - ref).abs().max().item()
    assert err <= 2e-2 * ref.abs().max().item(), f"max error {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("a_major", ("MN", "K"))
def test_runtime_k_serves_every_token_count(a_major):
    """RUNTIME_K (B MN-major; A MN-major as wgrad's, K-major as dgrad's): one kernel, K read
    from the operands at each call (MN/MN: ragged token counts, a partial last K step)."""
    torch = _gpu_or_skip()
    from tirx_gemm.matmul import synchronize
    from tirx_gemm.op import autograd as AG
    tune = {**AG.LAYOUT_TUNE, "RUNTIME_K": True}
    M, N = 512, 768
    for K in RUNTIME_K_TOKENS if a_major == "MN" else RUNTIME_K_FEATURES:
        g = torch.Generator(device="cuda").manual_seed(K)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        b_store = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g)
        a_store = a.t().contiguous() if a_major == "MN" else a
        d = AG._gemm_layout(a_store, a_major == "MN", b_store, True, tune)
        synchronize()
        ref = a.float() @ b_store.float()
        err = (d.float() - ref).abs().max().item()
        assert err <= 2e-2 * ref.abs().max().item(), f"K={K}: max error {err:.3g}"
