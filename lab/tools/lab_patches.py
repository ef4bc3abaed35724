"""Which lab patch puts back a keyword that left a step's builder: the keywords the op never
picked (steps/sm90a/hgemm_v12.py and hgemm_v13.py keep what matmul and matmul_fp8 run or the
lesson teaches) live on as a patch in the study that decided against them, and so do keyword values the op never picked
(VALUE_PATCH_OF: a builder refuses them without the patch). A lab script that builds such a variant calls
require() first: without the patch applied it stops with a one-line error naming the patch.

    git apply lab/<study>/patches/<name>.patch     # then export the variants

(no TVM: the builder's signature is read from its source)
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "steps" / "sm90a" / "hgemm_v12.py"
BUILDERS = {"v12": BUILDER, "v13": ROOT / "steps" / "sm90a" / "hgemm_v13.py"}

# keyword -> the patch (path from the repository root) that adds it back to its step's builder
PATCH_OF = {
    "MMA_LAG": "lab/mma_lag_and_l2_hints/patches/mma_lag.patch",
    "L2_PROMO": "lab/mma_lag_and_l2_hints/patches/tma_hints.patch",
    "A_HINT": "lab/mma_lag_and_l2_hints/patches/tma_hints.patch",
    "B_HINT": "lab/mma_lag_and_l2_hints/patches/tma_hints.patch",
    "PAIR_ALONG": "lab/cta_clusters/patches/pair_along_n.patch",
    "STREAM_K_ALL": "lab/stream_k_tail/patches/stream_k_all.patch",
    "EPI_SPREAD": "lab/fused_epilogues/patches/epi_spread.patch",
    "EPI_DEFER": "lab/fused_epilogues/patches/epi_defer.patch",
    "STAGGER": "lab/fp8_on_hopper/patches/stagger.patch",
}
# a keyword value the step's builder refuses without a lab patch: {name: (the patch, a test on a
# variant's keywords, a line only the patched builder holds)}
# (none at present: v13's PROMOTE=8 overlapped, once such a value, is matmul_fp8's deep-K pick)
VALUE_PATCH_OF: dict = {}
# keyword (or value name) -> the step whose builder the patch changes (v12 where not named)
STEP_OF = {"STAGGER": "v13"}


def builder_of(keyword: str, root: Path = ROOT) -> Path:
    """The builder file (under ``root``) that ``keyword``'s patch adds it back to."""
    return root / BUILDERS[STEP_OF.get(keyword, "v12")].relative_to(ROOT)


def builder_keywords(path: Path = BUILDER) -> set[str]:
    """The keyword arguments the builder in ``path`` (hgemm_vN.py: hgemm_vN) takes in this
    checkout (patched or not)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == path.stem:
            args = node.args
            return {a.arg for a in args.args + args.kwonlyargs}
    raise LookupError(f"{path}: no {path.stem}")


class PatchNeeded(SystemExit):
    """A variant asks for a keyword the builder takes only with a lab patch applied."""


def value_applied(name: str, root: Path = ROOT) -> bool:
    """Whether the builder under ``root`` takes the lab-only keyword value ``name``
    (VALUE_PATCH_OF: its patch applied)."""
    return VALUE_PATCH_OF[name][2] in builder_of(name, root).read_text(encoding="utf-8")


def missing(kwargs_list, root: Path = ROOT) -> dict[str, str]:
    """{keyword or value name: patch} for every lab-only keyword (or keyword value) the variants
    use that its builder (under ``root``) lacks."""
    kwargs_list = list(kwargs_list)
    used = {k for kw in kwargs_list for k in kw}
    need = {k: PATCH_OF[k] for k in sorted(used)
            if k in PATCH_OF and k not in builder_keywords(builder_of(k, root))}
    for name, (patch, wants, _) in VALUE_PATCH_OF.items():
        if any(wants(kw) for kw in kwargs_list) and not value_applied(name, root):
            need[name] = patch
    return need


def require(kwargs_list, root: Path = ROOT) -> None:
    """Stop with one line (exit status 1) when a variant needs a patch that is not applied."""
    need = missing(kwargs_list, root)
    if need:
        patches = sorted(set(need.values()))
        files = sorted({str(builder_of(k).relative_to(ROOT)) for k in need})
        raise PatchNeeded(f"error: {', '.join(need)} left {' and '.join(files)}; "
                          f"`git apply {' '.join(patches)}` first (the study's variant patch)")
