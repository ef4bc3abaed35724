"""Which lab patch puts back a v12 keyword that left the builder: the keywords matmul never
picked (steps/sm90a/hgemm_v12.py keeps what matmul runs or the lesson teaches) live on as a
patch in the study that decided against them. A lab script that builds such a variant calls
require() first: without the patch applied it stops with a one-line error naming the patch.

    git apply lab/<study>/patches/<name>.patch     # then export the variants

(no TVM: the builder's signature is read from its source)
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "steps" / "sm90a" / "hgemm_v12.py"

# keyword -> the patch (path from the repository root) that adds it back to hgemm_v12
PATCH_OF = {
    "MMA_LAG": "lab/mma_lag_and_l2_hints/patches/mma_lag.patch",
    "L2_PROMO": "lab/mma_lag_and_l2_hints/patches/tma_hints.patch",
    "A_HINT": "lab/mma_lag_and_l2_hints/patches/tma_hints.patch",
    "B_HINT": "lab/mma_lag_and_l2_hints/patches/tma_hints.patch",
    "PAIR_ALONG": "lab/cta_clusters/patches/pair_along_n.patch",
    "STREAM_K_ALL": "lab/stream_k_tail/patches/stream_k_all.patch",
    "EPI_SPREAD": "lab/fused_epilogues/patches/epi_spread.patch",
}


def builder_keywords(path: Path = BUILDER) -> set[str]:
    """The keyword arguments hgemm_v12 takes in this checkout (patched or not)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == "hgemm_v12":
            args = node.args
            return {a.arg for a in args.args + args.kwonlyargs}
    raise LookupError(f"{path}: no hgemm_v12")


class PatchNeeded(SystemExit):
    """A variant asks for a keyword the builder takes only with a lab patch applied."""


def missing(kwargs_list, path: Path = BUILDER) -> dict[str, str]:
    """{keyword: patch} for every lab-only keyword the variants use that the builder lacks."""
    have = builder_keywords(path)
    used = {k for kw in kwargs_list for k in kw}
    return {k: PATCH_OF[k] for k in sorted(used) if k in PATCH_OF and k not in have}


def require(kwargs_list, path: Path = BUILDER) -> None:
    """Stop with one line (exit status 1) when a variant needs a patch that is not applied."""
    need = missing(kwargs_list, path)
    if need:
        patches = sorted(set(need.values()))
        raise PatchNeeded(f"error: {', '.join(need)} left steps/sm90a/hgemm_v12.py; "
                          f"`git apply {' '.join(patches)}` first (the study's variant patch)")
