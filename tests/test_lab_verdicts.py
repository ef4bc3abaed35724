"""The verdict scripts of rules stated before their runs, on records made up here: each passes
a run that meets its rule and fails each way the rule names (CPU; no kernel runs)."""
import copy
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1] / "lab"


def _import(folder, name):
    sys.path.insert(0, str(LAB / folder))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(LAB / folder))


@pytest.fixture(scope="module")
def deepk():
    return _import("fp8_on_hopper", "fp8_deepk_verdict")


def _fp8_run(V, ratio=lambda M, N, K, s: 1.08):
    """One run's records that meet the rule: every check within tolerance, every case verified
    and its candidate timed at ``ratio`` of the pick."""
    dev = "NVIDIA H100 80GB HBM3"
    recs = [{"kind": V.CHECK_KIND, "M": M, "N": N, "K": K, "scale": s, "ok": True, "device": dev}
            for M, N, K in V.EDGE_SHAPES for s in V.KINDS]
    for M, N, K, s in V.suite_cases():
        recs.append({"kind": V.CHECK_KIND, "M": M, "N": N, "K": K, "scale": s, "ok": True,
                     "device": dev, "suite": True})
        recs.append({"kind": "fp8_case", "M": M, "N": N, "K": K, "suite": {"scale": s},
                     "verified": True, "device": dev,
                     "candidates": {V.CANDIDATE: {"ms": 1.0, "ratio_to_pick": ratio(M, N, K, s)}}})
    return recs


def test_fp8_deep_k_verdict_passes_a_run_that_meets_it(deepk):
    v = deepk.verdict(_fp8_run(deepk))
    assert v["passes"], v["reasons"]
    assert v["tensor"]["geomean"] == pytest.approx(1.08) and v["tensor"]["n"] == 13
    assert "passes" == deepk.report(v).splitlines()[0]


@pytest.mark.parametrize("how", ("geomean", "floor", "check", "untimed", "twice", "two cards",
                                 "control disagrees"))
def test_fp8_deep_k_verdict_fails_each_way(deepk, how):
    V = deepk
    if how == "geomean":
        recs = _fp8_run(V, lambda M, N, K, s: 1.02 if s == "tensor" else 1.1)
    elif how == "floor":
        recs = _fp8_run(V, lambda M, N, K, s: 0.97 if (M, N, K) == (8192, 4608, 36864) else 1.2)
    else:
        recs = _fp8_run(V)
        deep = [r for r in recs if r["kind"] == "fp8_case" and r["K"] >= V.BOUND_K]
        ctrl = [r for r in recs if r["kind"] == "fp8_case" and r["K"] < V.BOUND_K]
        if how == "check":
            next(r for r in recs if r["kind"] == V.CHECK_KIND)["ok"] = False
        elif how == "untimed":
            recs.remove(deep[0])
        elif how == "twice":
            recs.append(copy.deepcopy(deep[1]))
        elif how == "two cards":
            deep[2]["device"] = "NVIDIA H200"
        else:
            ctrl[0]["candidates"] = {}
    v = V.verdict(recs)
    assert not v["passes"] and v["reasons"]
    assert V.report(v).splitlines()[0] == "does not pass"


def test_the_fp8_choice_takes_the_bound_its_rule_passed_at(deepk):
    """One bound, two homes: matmul_fp8 promotes every second stage from the K the study's
    rule was stated and passed at (fp8_deepk_verdict.BOUND_K)."""
    from tirx_gemm.op import fp8
    assert fp8.PROMOTE_EVERY_SECOND_FROM_K == deepk.BOUND_K
