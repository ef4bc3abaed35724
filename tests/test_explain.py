"""tirx_gemm.matmul.explain and `tirx-gemm choose M,N,K`: the kernel matmul picks for a shape
and, one line each, the rules that decided it (pure Python: no GPU, no torch, no TVM)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from tirx_gemm import registry, spec
from tirx_gemm.compile.names import kernel_symbol

from tirx_gemm.op import cost_model as cm, rules
from tirx_gemm.numerics import DTYPES

ROOT = Path(__file__).resolve().parents[1]
SETS = ("tirx_gemm/op/suites/models.json", "tirx_gemm/op/suites/heldout.json",
        "lab/held_out_shapes/suites/fresh.json", "lab/stream_k_tail/suites/mdec.json",
        "lab/cta_clusters/suites/c4check.json", "lab/cta_clusters/suites/misk.json",
        "lab/swap_ab_tma_store/suites/dpswap.json", "lab/v10_ping_pong_band/suites/pingband.json")


def _shapes() -> list[tuple[int, int, int]]:
    out = set()
    for path in SETS:
        for e in json.loads((ROOT / path).read_text())["shapes"]:
            out.add((e["M"], e["N"], e["K"]))
    return sorted(out)


def _expected_lines(step: str, kw: dict) -> list[str]:
    """Phrases the explanation must hold for a pick with these keywords: the tile as built
    and each rule the keywords show (the constants quoted from the rules)."""
    want = []
    bm, bn, split = kw.get("BLK_M"), kw.get("BLK_N"), kw.get("SPLIT_K")
    if kw.get("SWAP_AB") and not kw.get("SWAP_TMA") and split is None:
        want.append(f"swap-AB, the weight's ")
        want.append(f"the tokens its N in a tile {bn} wide")
    if kw.get("CLUSTER") == rules.SWAP_CLUSTER:
        along = "the weight" if kw.get("SWAP_AB") else "M share the B tile, on "
        want += [f"clusters of {rules.SWAP_CLUSTER} along {along}",
                 f"at most the {rules.SWAP_CLUSTER_MAX_CLUSTERS} the H200 holds"]
    if kw.get("CLUSTER") == rules.SWAP_CLUSTER and not kw.get("SWAP_AB"):
        want.append(f"on {bm}x{bn} (")
    if kw.get("STREAM_K"):
        want.append("stream-K over it")
    if (split or 1) > 1:
        want.append(f"K split in {split} ")
        want.append(f"swap-AB {bm}-row weight" if kw.get("SWAP_AB") else f"{bm}x{bn} tile")
    if split == 1:
        want.append(f"the non-persistent swap-AB kernel, one CTA per {bm}-row weight tile and "
                    f"{bn}-token tile")
    if kw.get("SWAP_TMA"):
        want.append("swap-AB stored by TMA")
    if kw.get("CLUSTER") == 2:
        want.append("(the misaligned-row rule)")
    if kw.get("PDL"):
        want.append("PDL with the exit trigger" if kw.get("PDL_TRIGGER") == "exit"
                    else "K splits keep it" if (split or 1) > 1
                    else "fit one per SM" if split == 1 else "a short kernel")
    if step == "v10":
        want.append("v10")
    return want


def test_explaining_a_choice_does_not_change_it_and_names_every_rule_that_shaped_it():
    """Over the suites and the lab sets, both arches and dtypes: choose with ``why`` picks
    what choose without it does; the explanation's first line is the pick (step and every
    keyword), and a line names each rule the keywords show (swap-AB, clusters, stream-K,
    a K split, the non-persistent kernel, the TMA-stored swap, the pair rule, PDL's
    trigger, v10)."""
    checked = 0
    for M, N, K in _shapes():
        for dt in DTYPES:
            for arch in ("sm_90a", "sm_100a"):
                sm = spec.SM_COUNT[arch]
                why: list[str] = []
                step, kw = rules.choose(M, N, K, dt, arch, sm, why=why)
                assert (step, kw) == rules.choose(M, N, K, dt, arch, sm)
                text = rules.explain(M, N, K, dt, arch)
                head, kernel, card, *lines = text.splitlines()
                assert kernel == f"  kernel: {kernel_symbol(registry.get(step, arch), kw)}"
                assert "kernel_kernel" not in kernel and step in kernel
                assert card == "  card: NVIDIA H200: 132 SMs, 60 MiB L2, 4.8 TB/s HBM (table)"
                assert head.startswith(f"{M}x{N}x{K} {dt} on {arch} ({sm} SMs): {step}")
                for k, v in kw.items():
                    if k not in ("dtype", "SM_COUNT"):
                        assert f" {k}={v}" in head, (head, k)
                assert [ln[4:] for ln in lines] == why and why
                body = "\n".join(why)
                for phrase in (_expected_lines(step, kw) if arch == "sm_90a" else []):
                    assert phrase in body, (M, N, K, dt, phrase, body)
                assert ("PDL with the" in body) == bool(kw.get("PDL")), body
                if arch == "sm_100a":
                    assert body.startswith("sm_100a has no cost model yet")
                    assert ("v11 splits K in " in body) == (step == "v11")
                    if step == "v11":
                        assert f"v11 splits K in {kw['SPLIT_K']} " in body
                checked += 1
    assert checked > 400


def test_the_model_line_quotes_the_models_own_figures():
    """Where the cost model decides, its line lists cm.rank's three fastest with their
    predicted microseconds, and the pick."""
    M, N, K = 2304, 2304, 2304
    why: list[str] = []
    step, kw = rules.choose(M, N, K, "float16", "sm_90a", 132, why=why)
    top = cm.rank(M, N, K, 132)[:3]
    line = next(w for w in why if w.startswith("the cost model's fastest"))
    assert all(f"{c} {t:.1f}" in line for t, c in top)
    assert f"; picked {cm.best(M, N, K, 132)} [cost_model: lab/cost_model_fit]" in line
    assert (kw["BLK_M"], kw["BLK_N"]) == cm.tile(cm.best(M, N, K, 132))[:2]


def test_the_cluster_line_gives_the_fill_and_the_cluster_count():
    """72x4608x4096: 72 one-CTA tiles of 64 weight rows on 132 SMs, a last wave 55% full,
    18 clusters of four."""
    M, N, K = 72, 4608, 4096
    text = rules.explain(M, N, K, "bfloat16")
    tiles = rules.swap_tiles(M, N, 132)
    assert tiles == math.ceil(N / 64) * 1
    assert f"one CTA per 64-row tile would make {tiles} tiles, the last wave on 132 SMs " \
           f"{rules.last_wave_fill(tiles, 132):.0%} full" in text
    assert f"({math.ceil(N / (64 * rules.SWAP_CLUSTER))} clusters," in text


def test_tirx_gemm_choose_prints_the_explanation_and_refuses_in_one_line():
    """`tirx-gemm choose` prints explain()'s text and imports neither torch nor TVM; a shape
    no kernel takes and a malformed one end in one line, exit 2."""
    code = ("import sys; from tirx_gemm.cli import main; rc = main(sys.argv[1:]); "
            "print('torch' in sys.modules, 'tvm' in sys.modules); sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, "choose", "72,4608,4096", "--dtype",
                          "bfloat16"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    *shown, imports = res.stdout.strip().splitlines()
    from tirx_gemm.op import layouts  # rules.explain's text and a last line naming the layout
    assert "\n".join(shown) == layouts.explain(72, 4608, 4096, "bfloat16")
    assert "\n".join(shown).startswith(rules.explain(72, 4608, 4096, "bfloat16") + "\n  layout: NN")
    assert imports == "False False"
    for args, message in ((["4096,4096,4095"], "tirx-gemm: error: K=4095 is not a multiple of 8"),
                          (["1,2"], "wants three integers M,N,K")):
        res = subprocess.run([sys.executable, "-m", "tirx_gemm.cli", "choose", *args],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert res.returncode == 2 and res.stdout == ""
        assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr, res.stderr


def test_the_choose_arch_default_is_one_fact():
    """`tirx-gemm choose`'s --arch default, explain()'s and the CLI page's line agree."""
    import argparse
    import inspect
    import re
    from tirx_gemm import cli
    sub = next(a for a in cli.make_parser()._actions
               if isinstance(a, argparse._SubParsersAction)).choices["choose"]
    default = next(a.default for a in sub._actions if "--arch" in a.option_strings)
    assert default == inspect.signature(rules.explain).parameters["arch"].default
    readme = re.sub(r"\s+", " ", (ROOT / "docs" / "cli.md").read_text())
    assert f"--arch defaults to {default})" in readme


def test_variants_takes_a_torch_dtype_as_choose_does():
    """variants(N, K, dtype=torch.bfloat16) answered "dtype=torch.bfloat16 is not supported:
    choose one of float16, bfloat16", which contradicts itself (choose/explain take it)."""
    import torch
    from tirx_gemm import matmul as mm
    assert mm.variants(4096, 4096, dtype=torch.bfloat16, max_m=256) == \
        mm.variants(4096, 4096, dtype="bfloat16", max_m=256)


def test_an_epilogue_with_a_misspelt_or_foreign_key_is_refused_not_dropped():
    """epilogue={'BAIS': 'float16'} used to pick (and variants to list) the plain kernel:
    the misspelt key was dropped without a word."""
    import pytest
    from tirx_gemm import matmul as mm
    for call in (lambda e: rules.choose(128, 4096, 4096, epilogue=e),
                 lambda e: rules.explain(128, 4096, 4096, epilogue=e),
                 lambda e: mm.variants(4096, 4096, max_m=64, epilogue=e)):
        with pytest.raises(ValueError, match=r"^epilogue key 'BAIS' is not one of BIAS, ACT, "
                                             r"OUT_DTYPE, SWIGLU \(did you mean 'BIAS'\?\)$"):
            call({"BAIS": "float16"})
        with pytest.raises(TypeError, match=r"^epilogue=\['relu'\] must be a dict"):
            call(["relu"])
    assert rules.choose(128, 4096, 4096, epilogue={"ACT": "relu"})[1]["ACT"] == "relu"
    assert rules.choose(128, 4096, 4096, epilogue={}) == rules.choose(128, 4096, 4096)
