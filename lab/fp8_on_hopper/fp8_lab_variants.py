"""The per-tensor v13 variants lab/fp8_on_hopper/fp8_h200.py times next to choose_fp8's picks
(and fp8_export.py adds to the bundle): the serial promotion, the tile without promotion."""
from __future__ import annotations

from tirx_gemm import registry, spec
from tirx_gemm.op.fp8 import ARCH, FP8_STEP


def lab_variants(sm_count: int = spec.SM_COUNT[ARCH]) -> list[tuple[str, dict]]:
    """(name, v13 keywords) of the per-tensor bf16 kernels lab/fp8_on_hopper/fp8_h200.py times
    next to choose_fp8's, to separate the promotion's cost from the tile's: the
    serial promotion (128 x 128, PROMOTE_OVERLAP=False) and the 128 x 128 tile without
    promotion; the small-M tiles (64 x 128 promoted serially, for M <= 64)."""
    base = {"dtype": "bfloat16", "SCALE": "tensor", "RUNTIME_M": True, "RUNTIME_NK": True,
            "SM_COUNT": sm_count}
    return [("v13 tensor serial 128x128", {**base, "PROMOTE": 4, "PROMOTE_OVERLAP": False,
                                           "BLK_M": 128, "BLK_N": 128}),
            ("v13 tensor fast 128x128", {**base, "PROMOTE": 0, "BLK_M": 128, "BLK_N": 128}),
            ("v13 tensor serial 64x128", {**base, "PROMOTE": 4, "PROMOTE_OVERLAP": False,
                                          "BLK_M": 64, "BLK_N": 128})]


def lab_variant_requests(sm_count: int = spec.SM_COUNT[ARCH]):
    """lab_variants as bundle requests (step, nominal build shape, keywords)."""
    from tirx_gemm.op.matmul import build_shape
    step = registry.get(FP8_STEP, ARCH)
    return [(step, build_shape((kw["BLK_M"], 256, 256), kw), kw)
            for _, kw in lab_variants(sm_count)]
