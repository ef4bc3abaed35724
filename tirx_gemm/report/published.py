"""Figures this project quotes but did not measure: each one once, with where it comes from.

Prose that quotes one (the README, steps/lessons/*.md, the step cards) must agree with this
table; tests/test_facts.py fails when a copy drifts. A figure measured here never goes in
this file: measurements are records under results/ and reach the README through
scripts/render_results.py. Standard library only, no imports.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Figure", "FIGURES", "get", "B200_TFLOPS"]

BOOK = ("the book this project's sm_100a track follows (its steps 1-9 on a B200 at 4096^3; "
        "its figures, never measured here)")
SERIES = ("the seed's article series (the TIRx GEMM tutorial this project reproduces), "
          "its B200 figures at 4096^3")
FAST_CU = ("fast.cu, an open H100 GEMM series (quoted in the sm_90a v8 card and the README; "
           "its text is not in this repository)")
TIRX_KERNELS = ("the TIRx kernel library (mlc-ai/TIRx-kernels): its fp16_bf16_gemm, a TIRx port "
                "of ThunderKittens' B200 kernel, as quoted from its report; never measured "
                "here")


@dataclass(frozen=True)
class Figure:
    key: str
    value: float
    unit: str
    what: str
    source: str


FIGURES: tuple[Figure, ...] = (
    Figure("b200_step4", 278, "TFLOP/s", "step 4 (TMA) on a B200 at 4096^3", SERIES),
    Figure("b200_step7", 607, "TFLOP/s", "step 7 (warp specialization) on a B200 at 4096^3",
           SERIES + "; the book quotes the same figure for its step 7"),
    Figure("b200_step8", 1328, "TFLOP/s", "step 8 (2-CTA MMA) on a B200 at 4096^3", BOOK),
    Figure("b200_step9", 1460, "TFLOP/s", "step 9 (two MMA consumers) on a B200 at 4096^3",
           BOOK),
    Figure("b200_cublas", 1460, "TFLOP/s", "cuBLAS on a B200 at 4096^3, as the book reports it",
           BOOK),
    Figure("tirx_kernels_b200_ratio", 0.986, "x cuBLAS", "bf16 4096^3 on a B200 with Cluster "
           "Launch Control and a double-buffered TMEM accumulator (the sm_100a v10 design)",
           TIRX_KERNELS),
    Figure("h100_multicast_gain_low", 1, "%", "gain of a 2-CTA cluster with TMA multicast on an "
           "H100, low end", FAST_CU),
    Figure("h100_multicast_gain_high", 3, "%", "the same gain, high end", FAST_CU),
    Figure("h100_producer_regs", 24, "registers", "producer warpgroup's setmaxnreg in fast.cu's "
           "register split", FAST_CU),
    Figure("h100_consumer_regs", 240, "registers", "consumer warpgroups' setmaxnreg in fast.cu's "
           "register split", FAST_CU),
)

_BY_KEY = {f.key: f for f in FIGURES}

# the B200 throughput figures, the ones prose quotes with "TFLOP/s" and "B200"
B200_TFLOPS = frozenset(int(f.value) for f in FIGURES if f.key.startswith("b200_"))


def get(key: str) -> Figure:
    return _BY_KEY[key]
