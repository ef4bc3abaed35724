"""Figures quoted in prose (README, lessons, code notes) recomputed from the lab's H200 records."""
import json
import math
import re
from pathlib import Path

import pytest

from tirx_gemm import registry

ROOT = Path(__file__).parents[1]


# The helpers of the tests below that recompute quoted figures from H200 A/B records.
def _lab_records(name: str) -> list[dict]:
    """The lab record file at repo-relative ``name``, one dict per JSON line."""
    text = (ROOT / name).read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def _docs(_root=None) -> str:
    """The prose these figures are quoted in: README.md, the guides in docs/, and every study's
    README under lab/ (the rules' evidence moved there), each rec marker's header on one line."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "lab").glob("*/README.md"))]
    text = "\n\n".join(p.read_text() for p in paths)
    return re.sub(r"<!-- rec:[^>]*-->", lambda m: " ".join(m.group(0).split()), text)


M_CLUSTERS = "misaligned_rows_clusters"  # the rule adopted from the H100 A/B (suites/c4mis.json)


def _choose_without(rule_names, M, N, K, dt):
    """matmul's pick as the rules give it with some rules (a name or a tuple of names) left
    out: the package a record timed before later rules (checked to exist) superseded its
    pick at some shapes."""
    from tirx_gemm.op import rules
    names = (rule_names,) if isinstance(rule_names, str) else tuple(rule_names)
    assert all(any(r.name == n for r in rules.RULES) for n in names), names
    kept, rules.RULES = rules.RULES, tuple(r for r in rules.RULES if r.name not in names)
    try:
        return rules.choose(M, N, K, dt, "sm_90a", 132)
    finally:
        rules.RULES = kept


def _rule_figures():
    """The rules' and the cost model's names in one namespace (tirx_gemm/op/rules.py's
    constants over tirx_gemm/op/cost_model.py's)."""
    import types
    from tirx_gemm.op import cost_model, rules
    return types.SimpleNamespace(**{**vars(cost_model), **vars(rules)})


def _mean_log_ratio(records) -> float:
    """The mean of the records' log ratios to torch (a case's passes)."""
    return sum(math.log(r["ratio"]) for r in records) / len(records)


def _source_text(rel: str) -> str:
    """A module's text with its comment lines joined, so a quoted sentence reads as one."""
    return re.sub(r"\s*#\s*", " ", (ROOT / rel).read_text())


def _readme_text(code: bool = True) -> str:
    """README's prose with the rec markers removed and whitespace collapsed (code=False:
    backticks removed too)."""
    text = re.sub(r"\s+", " ", re.sub(r"<!-- /?rec[^>]*-->", "", _docs()))
    return text if code else text.replace("`", "")


def _ab_summary(gains) -> str:
    """How README and the chooser notes quote an A/B's cases: "N cases lo-hix (geomean g,
    behind at b" (gains: the variant over the package before, per case)."""
    return (f"{len(gains)} cases {min(gains):.3f}-{max(gains):.3f}x (geomean "
            f"{math.exp(sum(map(math.log, gains)) / len(gains)):.3f}, behind at "
            f"{sum(g < 1 for g in gains)}")


def test_the_width_rules_are_written_as_the_builder_and_the_lab_have_them():
    """v12@sm_90a's registry constraint names the builder's width steps, and the README's
    range of the 128-row widths of 8 is the lab sweep's menu (lab/cost_model_fit/records/v12_widths8_*)."""
    pytest.importorskip("tvm")
    import importlib.util
    import re
    from pathlib import Path
    from tirx_gemm import epilogue
    from tirx_gemm.steps.sm90a import hgemm_v12 as v12
    root = Path(__file__).resolve().parents[1]
    text = registry.get("v12", "sm_90a").constraints
    assert (f"BLK_N a multiple of {v12.BLK_N_STEP} in [{v12.BLK_N_STEP}, {v12.BLK_N_MAX}] "
            f"({v12.PAIR_N_STEP} for CLUSTER=2 and SWIGLU)") in text
    assert v12.PAIR_N_STEP == epilogue.SWIGLU_TILE_STEP
    spec = importlib.util.spec_from_file_location("v12_sweep", root / "lab/tools/v12_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    wide = [bn for bm, bn in sweep.WIDTHS8_MENU if bm == 128]
    assert wide == list(range(wide[0], wide[-1] + 1, 2 * v12.BLK_N_STEP))
    readme = re.sub(r"\s+", " ", _docs())
    assert f"128 the odd multiples of {v12.BLK_N_STEP} from {wide[0]} to {wide[-1]}" in readme


def test_readme_states_the_rules_as_the_code_has_them():
    """The README's chooser paragraph quotes swap-AB's token tiles and the narrow split's
    configuration; the code is their one home, this test keeps the prose equal to it."""
    import re
    from pathlib import Path

    chooser = _rule_figures()
    text = re.sub(r"\s+", " ", _docs())
    tiles = chooser.SWAP_AB_TILES
    assert f"a token tile of {', '.join(map(str, tiles[:-1]))} or {tiles[-1]}" in text
    tiles = chooser.SWAP_SPLIT_TILES
    assert f"A K split keeps to {', '.join(map(str, tiles[:-1]))} and {tiles[-1]}" in text
    tiles = ", ".join(f"{m}x{n}" for m, n in chooser.SPLIT_TILES[:-1])
    assert f"{tiles} and {'x'.join(map(str, chooser.SPLIT_TILES[-1]))} tiles split" in text
    assert f"more than {round(chooser.SPLIT_MARGIN * 100)}% faster" in text
    assert f"decode at up to {chooser.SWAP_NP_MAX_M} tokens otherwise" in text
    assert (f"{chooser.SWAP_SPLIT_ROWS}-row tiles, an {chooser.SWAP_NP_DEPTH}-stage ring"
            in text)
    assert f"at least {chooser.SWAP_NP_MIN_TOKENS} wide" in text
    assert (f"past decode, {chooser.SWAP_AB_TILES[-1] + 1} to {chooser.WIDE_SWAP_MAX_M} "
            f"tokens") in text
    assert f"ring holds fewer than {chooser.WIDE_SWAP_MIN_STAGES} stages" in text
    assert f"each a multiple of {chooser.WIDE_SWAP_STEP}" in text
    # the rules this stop added: v9's handicap and v10's margin (both checked by
    # test_v9_handicap_is_the_only_preference_v9_has), the 128-byte row rule for pairs, the
    # count of measured candidates
    assert f"whole {chooser.ROW_ALIGN_BYTES}-byte lines" in text
    # v9 and v10 are not v12 entries
    assert f"{len(chooser.params()) - 2} entries measured" in text
    assert f"predicted at most {chooser.PDL_MAX_US:.0f} µs, `chooser.PDL_MAX_US`" in text
    assert (f"K ≤ {chooser.PINGPONG_MAX_K} and at least as many "
            f"{chooser.V10_TILE[0]}x{chooser.V10_TILE[1]} tiles as SMs") in text
    # v10's band: where the model ranks it
    assert (f"K past {chooser.PINGPONG_MAX_K} up to {chooser.PINGPONG_BAND_MAX_K} and at "
            f"least as many {chooser.V10_TILE[0]}x{chooser.V10_TILE[1]} tiles as SMs") in text
    # the data-parallel swap-AB rule: where it applies, its margin, its blocks
    assert f"past {chooser.DP_SWAP_MIN_M} tokens (`chooser.DP_SWAP_MIN_M`" in text
    assert (f"more than {round(chooser.DP_SWAP_MARGIN * 100)}% faster than the best plain "
            f"candidate (`chooser.DP_SWAP_MARGIN`)") in text
    assert (f"Token tiles are multiples of {chooser.DP_SWAP_TOKEN_STEP} and M counts in "
            f"{chooser.DP_SWAP_TOKEN_STEP}-row blocks") in text
    assert (f"every {chooser.DP_SWAP_TOKEN_STEP} rows past {chooser.DP_SWAP_MIN_M}") in text
    # the v12 lesson states the same rule
    lesson = re.sub(r"\s+", " ", (Path(__file__).parents[1] / "steps" / "lessons" /
                                  "v12.md").read_text())
    assert (f"takes it past {chooser.DP_SWAP_MIN_M} tokens (first past {chooser.WIDE_SWAP_MAX_M} "
            f"only) where the model predicts the "
            f"swapped problem more than {round(chooser.DP_SWAP_MARGIN * 100)}% faster") in lesson
    assert f"needs `BLK_N` a multiple of {chooser.DP_SWAP_TOKEN_STEP}" in lesson


def test_graph_timing_figures_in_the_docs_match_the_harness():
    """The interleaved CUDA-graph timing's warm-up and rounds (v12_sweep's constants) as
    README and matmul_graph_times.py's docstring state them."""
    import importlib.util
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("v12_sweep", root / "lab/tools/v12_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    words = {5: "five", 7: "seven", 9: "nine"}
    readme = re.sub(r"\s+", " ", _docs())
    assert (f"warms both graphs up for {sweep.GRAPH_WARM_MS:g} ms and then replays them "
            f"alternately, {words[sweep.GRAPH_ROUNDS]} times each") in readme
    doc = re.sub(r"\s+", " ", (root / "lab/tools/matmul_graph_times.py").read_text())
    assert (f"replays both graphs for at least {sweep.GRAPH_WARM_MS:g} ms, then each "
            f"{sweep.GRAPH_ROUNDS} times in alternating order") in doc


def test_readme_counts_for_the_tail_and_swap_rules_are_the_records():
    """README's counts for TAIL_TMA and the swap-AB rule past 128 tokens are what the checks
    through matmul recorded and what chooser.tail_tma leaves out."""
    import collections
    import json
    import re
    from pathlib import Path
    chooser = _rule_figures()
    root = Path(__file__).parents[1]
    text = re.sub(r"\s+", " ", re.sub(r"<!--.*?-->", "", _docs()))

    def shapes(name, **match):
        out = collections.defaultdict(lambda: collections.defaultdict(list))
        for line in (root / name).read_text().splitlines():
            r = json.loads(line)
            if all(r.get(k) == v for k, v in match.items()):
                out[(r["M"], r["N"], r["K"])][r["chooser"]].append(r["ratio"])
        return out
    own = shapes("lab/tail_tma_store/records/matmul_graph_h200_tailtma.jsonl")
    shared = shapes("lab/tail_tma_store/records/matmul_graph_h200_tailshare.jsonl")
    kept = shapes("lab/tail_tma_store/records/matmul_graph_h200_tailshare.jsonl", final_rule="tma")
    low = shapes("lab/swap_ab_tma_store/records/matmul_graph_h200_dpswaplow.jsonl")
    # ahead: every new pass above every old one by at least 0.01 (the README's precision);
    # level: closer than that
    ahead = sum(min(v["new"]) >= max(v["old"]) + 0.01 for v in low.values())
    assert f"26 shapes whose kernel it changes" in text and len(own) == 26
    assert f"Shared tails, {len(shared)} shapes whose tile takes one" in text
    assert (f"at the {len(kept)} whose tile the rule keeps it on" in text
            and f"at the {len(shared) - len(kept)} whose odd-chunk tile" in text)
    words = {0: "none", 1: "one", 2: "two", 3: "three"}
    assert f"Through matmul at {len(low)} of them" in text
    assert f"ahead at {ahead} shapes, level at {words[len(low) - ahead]}" in text
    left = [(bm, bn) for bm in (64, 128) for bn in range(72, 256, 8)
            if bn % 64 and not chooser.tail_tma(bm, bn)]
    assert left == [(64, 224), (128, 80), (128, 104), (128, 112), (128, 208)]
    assert "it leaves 64x224 and 128x80, 104, 112 and 208 with element stores" in text


def test_readme_counts_for_v10s_band_are_the_records():
    """The counts README's v10-band bullet states are what the sweeps and the check through
    matmul recorded, and the v10 lesson states the band's edges as chooser has them."""
    import collections
    import json
    import re
    from pathlib import Path
    chooser = _rule_figures()
    root = Path(__file__).parents[1]
    lab = root
    text = re.sub(r"<!--.*?-->", "", _docs())
    text = re.sub(r"\s+", " ", text)
    sweeps = [json.loads(x) for f in ("lab/cost_model_fit/records/v12_shortk_h200.jsonl", "lab/cost_model_fit/records/v12_midk_h200.jsonl")
              for x in (lab / f).read_text().splitlines()]
    ratios = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in sweeps:
        if r["dtype"] == "bfloat16":
            for name, c in r["candidates"].items():
                ratios[(r["M"], r["N"], r["K"])][name].append(c["ratio"])
    first = sum(max(c, key=lambda n: sum(c[n])) == chooser.V10 for c in ratios.values())
    assert f"had v10 first at {first} of {len(ratios)} (bf16)" in text
    assert f"{len(ratios)} shapes of a thousand tokens or more" in text
    check = [json.loads(x) for x in
             (lab / "lab/v10_ping_pong_band/records/matmul_graph_h200_pingband.jsonl").read_text().splitlines()]
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in check:
        runs[(r["M"], r["N"], r["K"])][r["chooser"]].append(r["ratio"])
    ahead = sum(min(v["new"]) > max(v["old"]) for v in runs.values())
    behind = sum(max(v["new"]) < min(v["old"]) for v in runs.values())
    fresh = sum(s not in ratios for s in runs)
    assert (f"{len(runs)} shapes where the band changes the pick or could, {fresh} of them "
            f"in neither sweep") in text
    assert f"ahead at {ahead} (" in text and f"behind at {'two' if behind == 2 else behind} " in text
    lesson = re.sub(r"\s+", " ", (root / "steps" / "lessons" / "v10.md").read_text())
    assert (f"for a K of at most {chooser.PINGPONG_MAX_K} by a rule (`chooser.wants_pingpong`), "
            f"and from {chooser.PINGPONG_MAX_K + 1} to {chooser.PINGPONG_BAND_MAX_K}") in lesson


def test_readme_counts_for_shift_last_are_the_records():
    """README's and lesson v12's counts for SHIFT_LAST are what the sweeps and the check
    through matmul recorded: the oob sweep's ahead / level / behind pairs, every shifted
    kernel bit-identical to its twin, the oobpick twins' two-pass means within 0.02, and
    the shapes of the check where the shift moves a token tile."""
    import collections
    import json
    import re
    from pathlib import Path
    root = Path(__file__).parents[1]
    lab = root

    def prose(path):
        text = _docs() if path == "README.md" else (root / path).read_text()
        return re.sub(r"\s+", " ", re.sub(r"<!--.*?-->", "", text, flags=re.S))
    readme, lesson = prose("README.md"), prose("steps/lessons/v12.md")

    def twins(name):
        runs = collections.defaultdict(list)  # (shape, dtype, kernel) -> (shifted, twin)
        for line in (lab / name).read_text().splitlines():
            r = json.loads(line)
            for k, c in r["candidates"].items():
                if "same_bits_as" in c:
                    assert c["same_bits_as"] == [k[:-1], True], (name, r["M"], k)
                    runs[(r["M"], r["N"], r["K"], r["dtype"], k)].append(
                        (c["ratio"], r["candidates"][k[:-1]]["ratio"]))
        return runs
    oob = twins("lab/shift_last_token_tile/records/v12_oob_h200.jsonl")
    # ahead / behind: every pass of one above every pass of the other by at least 0.01
    ahead = sum(min(s for s, _ in v) >= max(t for _, t in v) + 0.01 for v in oob.values())
    behind = sum(max(s for s, _ in v) + 0.01 <= min(t for _, t in v) for v in oob.values())
    level = len(oob) - ahead - behind
    for text in (readme, lesson):
        assert f"ahead at {ahead} of the {len(oob)} pairs" in text
        assert f"level at {level}" in text or f"level at the other {level}" in text
    assert behind == 0 and "behind at none" in readme and "behind at none" in lesson
    pick = twins("lab/shift_last_token_tile/records/v12_oobpick_h200.jsonl")
    means = [abs(sum(s - t for s, t in v) / len(v)) for v in pick.values()]
    assert max(means) < 0.02
    for text in (readme, lesson):
        assert f"within 0.02 of its twin's at all {len(pick)} pairs" in text
    moved, shapes = set(), set()
    for line in (lab / "lab/shift_last_token_tile/records/matmul_graph_h200_shift.jsonl").read_text().splitlines():
        r = json.loads(line)
        shapes.add((r["M"], r["N"], r["K"]))
        kw = r["kwargs"]
        tok = kw.get("BLK_N") if kw.get("SWAP_AB") else kw.get("BLK_M")
        if r["chooser"] == "new" and kw.get("SHIFT_LAST") and r["M"] > tok and r["M"] % tok:
            moved.add((r["M"], r["N"], r["K"]))
    assert f"at {len(shapes)} real-model and suite shapes of odd token counts, the shift " \
           f"moving a token tile at {len(moved)} of them" in readme
    assert f"{len(shapes)} shapes of odd token counts, the shift moving a token tile at " \
           f"{len(moved)}" in lesson


def test_split_token_tile_and_static_nk_figures_are_computed_from_their_records():
    """The geomeans README and matmul_choice quote for the split token tiles and the plain
    tiles built for N and K, recomputed here from the H200 records with the committed
    rules: each splitw shape's record of the package whose token tile matmul now picks
    (the one before where both ran it), and each static-N/K suite's records."""
    import json
    import math
    import re
    from pathlib import Path

    chooser = _rule_figures()
    from tirx_gemm import matmul as mm
    root = Path(__file__).parents[1]
    lab = root

    def rows(name):
        return [json.loads(x) for x in (lab / name).read_text().splitlines() if x.strip()]

    def split_rule_geomean(name, key, dtype):
        per = {}
        for r in rows(name):
            if r["dtype"] == dtype:
                kw = r.get("kwargs") or r.get("build_kwargs")
                per.setdefault((r["M"], r["N"], r["K"]), {}).setdefault(
                    r["chooser"], (kw["BLK_N"], []))[1].append(math.log(r[key]))
        logs = []
        for (M, N, K), by in per.items():
            want = mm.choose(M, N, K, dtype, "sm_90a", 132)[1]["BLK_N"]
            who = next(w for w in ("old", "new") if w in by and by[w][0] == want)
            logs.append(sum(by[who][1]) / len(by[who][1]))
        return math.exp(sum(logs) / len(logs))

    readme = _readme_text()
    assert 56 not in chooser.SWAP_SPLIT_TILES
    for dt, short in (("bfloat16", "bf16"), ("float16", "fp16")):
        g = split_rule_geomean("lab/split_k_decode/records/matmul_graph_h200_splitw.jsonl", "ratio", dt)
        assert f"→ {g:.3f} ({short}) " in readme, (dt, g)
    g = split_rule_geomean("lab/split_k_decode/records/matmul_eager_h200_splitw.jsonl", "ratio_to_torch", "bfloat16")
    assert f"→ {g:.3f}: level" in readme, g

    def geo(suite, who, dtype):
        xs = [math.log(r["ratio"]) for r in rows("lab/static_n_k_builds/records/matmul_graph_h200_staticnk.jsonl")
              if (r["suite"], r["chooser"], r["dtype"]) == (suite, who, dtype)]
        return math.exp(sum(xs) / len(xs))

    src = _readme_text(code=False)
    for suite in ("models", "heldout"):
        old, new = ((" / ".join(f"{geo(suite, w, d):.3f}" for d in ("float16", "bfloat16")))
                    for w in ("old", "new"))
        assert f"{old} -> {new}" in src, (suite, old, new)


def test_static_nk_swap_and_pair_figures_are_computed_from_their_records():
    """The figures matmul_choice quotes for building persistent swap-AB tiles, swap-AB
    stored by TMA and pairs for their N and K (and not swap-AB's SPLIT_K=1 units),
    recomputed from the two H200 calls' records: per call, the cases whose kernel the rule
    changes (new against old in the same call, the mean of each one's passes), and the
    suites' geomeans. Every case's kernels are the committed rule's (call 2) or the rule
    tried first (call 1: SPLIT_K=1 units built for N and K too)."""
    import json
    import math
    import re
    from pathlib import Path

    from tirx_gemm import matmul as mm
    from tirx_gemm.op import suite as S
    root = Path(__file__).parents[1]
    rows = _lab_records("lab/static_n_k_builds/records/matmul_graph_h200_nkswap.jsonl")

    def changed(call, who):
        per: dict = {}
        for r in rows:
            if r["call"] == call and (call == 2 or r["shapes"] == "changed"):  # A/B pairs
                per.setdefault((r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
                    r["chooser"], []).append(r)
        out = []
        for key, by in per.items():
            if who in by and "old" in by and by[who][0]["kwargs"] != by["old"][0]["kwargs"]:
                d = (sum(math.log(r["ratio"]) for r in by[who]) / len(by[who])
                     - sum(math.log(r["ratio"]) for r in by["old"]) / len(by["old"]))
                out.append((key, by[who][0]["path"], d))
                if call == 2:  # the committed rule picks the new kernel (since given
                    # PDL with the exit trigger where it had no PDL: matmul_graph_h200_pdl)
                    M, N, K, dt = key
                    kw = _choose_without(M_CLUSTERS, M, N, K, dt)[1]
                    if kw.pop("PDL_TRIGGER", "start") == "exit":
                        del kw["PDL"]
                    assert kw == by[who][0]["kwargs"]
        return out

    def summary(cs):
        return len(cs), sum(d < 0 for _, _, d in cs), math.exp(sum(d for *_, d in cs) / len(cs))

    src = _readme_text(code=False)
    one = changed(1, "tried")
    units = [c for c in one if c[1] == "swap_unit"]
    n, behind, g = summary(units)
    assert f"ran behind at {behind} of {n} cases (geomean {g:.3f};" in src, (n, behind, g)
    rest1 = summary([c for c in one if c[1] != "swap_unit"])
    rest2 = summary(changed(2, "new"))
    assert rest1[:2] == rest2[:2]
    assert (f"at the {rest2[0]} cases whose kernel this changes, geomean {rest1[2]:.3f} and "
            f"{rest2[2]:.3f}, behind at {rest2[1]} of {rest2[0]} in each call") in src
    readme = _readme_text()
    assert (f"At the {rest2[0]} cases whose kernel the kept rule changes (persistent swap-AB "
            f"tiles, swap-AB stored by TMA, the 1000³ pair) the geomean of new over old is "
            f"{rest1[2]:.3f} and {rest2[2]:.3f} in the two calls, behind at {rest2[1]} of "
            f"{rest2[0]} in each") in readme
    assert f"behind at {behind} of {n} cases (geomean {g:.3f};" in readme

    def geo(suite, who, dtype):
        xs = [math.log(r["ratio"]) for r in rows if r["call"] == 2 and r["shapes"] == "all"
              and (r["suite"], r["chooser"], r["dtype"]) == (suite, who, dtype)]
        return math.exp(sum(xs) / len(xs))
    for suite, name in (("models", "models"), ("heldout", "held-out")):
        old, new = (" / ".join(f"{geo(suite, w, d):.3f}" for d in ("float16", "bfloat16"))
                    for w in ("old", "new"))
        assert f"{name} {old} -> {new}" in src, (suite, old, new)
    # the bundle count quoted: every M of the models suite's layers, one dtype
    models = S.load_suite(root / "tirx_gemm" / "op" / "suites" / "models.json")
    count = sum(1 for _, _, kw in S.export_requests(models, "matmul", "sm_90a", 132)
                if kw.get("dtype", "float16") == "float16")
    assert f"bundle for every M holds {count} kernels per dtype" in src, count
    assert f"over every M take {count} kernels per dtype" in readme, count


def test_pdl_exit_trigger_figures_are_computed_from_their_records():
    """The figures matmul_choice's PDL_EXIT_NOTE and README quote, recomputed from the two
    H200 calls' records: call 1 (the package before, PDL's start trigger on every kernel
    built for N and K without PDL, the exit trigger on every v12 kernel), call 2 (the kept
    rule against the package before); each case the mean of its passes' log ratios."""
    import json
    import math
    import re
    from pathlib import Path

    from tirx_gemm import matmul as mm
    root = Path(__file__).parents[1]
    rows = _lab_records("lab/pdl_exit_trigger/records/matmul_graph_h200_pdl.jsonl")

    def cases(call):
        per: dict = {}
        for r in rows:
            if r["call"] == call:
                per.setdefault((r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
                    r["chooser"], []).append(r)
        return per

    def lm(rs):
        return sum(math.log(r["ratio"]) for r in rs) / len(rs)

    def stats(xs):
        return (len(xs), f"{min(xs):.3f}-{max(xs):.3f}",
                f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f}", sum(x < 1 for x in xs))

    one = cases(1)
    before = {k: v["before"][0]["kwargs"] for k, v in one.items()}
    a = stats([math.exp(lm(v["start_all"]) - lm(v["before"])) for k, v in one.items()
               if not before[k].get("PDL") and v["start_all"][0]["kwargs"] != before[k]])
    b_off = stats([math.exp(lm(v["exit_all"]) - lm(v["before"])) for k, v in one.items()
                   if not before[k].get("PDL") and "BLK_M" in before[k]
                   and before[k].get("CLUSTER", 1) == 1])
    b_on = stats([math.exp(lm(v["exit_all"]) - lm(v["before"])) for k, v in one.items()
                  if before[k].get("PDL")])
    two = cases(2)
    for (M, N, K, dt), v in two.items():  # the kept rule's kernels are what this commits
        assert mm.choose(M, N, K, dt, "sm_90a", 132)[1] == v["kept"][0]["kwargs"]
    kept = [math.exp(lm(v["kept"]) - lm(v["before"])) for v in two.values()]
    c = stats(kept)
    src = _readme_text(code=False)
    readme = _readme_text()
    for text in (src, readme):
        assert f"start trigger on the {a[0]} cases of kernels built for N and K without PDL " \
               f"ran {a[1]}x" in text, a
        assert f"exit trigger on the {b_off[0]} cases without PDL {b_off[1]}x (geomean " \
               f"{b_off[2]})" in text, b_off
        assert f"on the {b_on[0]} with PDL {b_on[1]}x (geomean {b_on[2]}" in text, b_on
        assert f"at its {c[0]} cases: geomean {c[2]}, behind at {c[3]}" in text, c
    # lesson v12's summary of the same cases: the exit trigger on kernels without PDL over
    # both calls, and the start trigger's loss where it was replaced
    lesson = re.sub(r"\s+", " ", re.sub(r"<!-- /?rec[^>]*-->", "", (
        root / "steps" / "lessons" / "v12.md").read_text()))
    off = [math.exp(lm(v["exit_all"]) - lm(v["before"])) for k, v in one.items()
           if not before[k].get("PDL") and "BLK_M" in before[k]
           and before[k].get("CLUSTER", 1) == 1] + kept
    g1, g2 = (float(b_off[2]) - 1) * 100, (float(c[2]) - 1) * 100
    assert (f"moved each between {(min(off) - 1) * 100:.1f}% and +{(max(off) - 1) * 100:.1f}% "
            f"(geomean +{g1:.1f}% and +{g2:.1f}% in two calls)") in lesson
    assert f"it lost up to {round((1 - float(b_on[1].split('-')[0])) * 100)}%" in lesson


def test_split_pdl_trigger_figures_are_computed_from_their_records():
    """The figures matmul_choice's PDL_EXIT_NOTE and README quote for the K splits' PDL
    trigger, recomputed from the H200 call's records (each case the mean of its passes' log
    ratios, exit over start); the start side's kernels are what matmul picks with the token
    tiles of swap-AB splits in steps of 16, as when the records ran (today's step of 8 moves the
    200- and 300-token cases to 200- and 152-wide tiles), the exit side's the same kernels with
    PDL_TRIGGER="exit"."""
    chooser = _rule_figures()
    from tirx_gemm import matmul as mm
    from tirx_gemm.op import cost_model
    per: dict = {}
    for r in _lab_records("lab/pdl_exit_trigger/records/matmul_graph_h200_splitpdl.jsonl"):
        per.setdefault((r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
            r["chooser"], []).append(r)
    shapes = json.loads((ROOT / "lab/pdl_exit_trigger/suites/splitfam.json").read_text())
    assert len(shapes["shapes"]) == 42 == len({k[:3] for k in per})
    groups: dict = {"swap": [], "short": [], "long": []}
    for (M, N, K, dt), v in per.items():
        kw = v["start"][0]["kwargs"]
        step, cost_model.WIDE_SWAP_STEP = cost_model.WIDE_SWAP_STEP, 16
        try:
            assert mm.choose(M, N, K, dt, "sm_90a", 132)[1] == kw and kw["SPLIT_K"] > 1
        finally:
            cost_model.WIDE_SWAP_STEP = step
        assert all(r["kwargs"] == {**kw, "PDL_TRIGGER": "exit"} for r in v["exit"])
        assert len(v["start"]) == len(v["exit"]) == 2
        gain = math.exp(_mean_log_ratio(v["exit"]) - _mean_log_ratio(v["start"]))
        if kw.get("SWAP_AB"):
            groups["swap"].append(gain)
        else:
            t = chooser.predict_split(kw["BLK_M"], kw["BLK_N"], kw["SPLIT_K"], M, N, K)
            groups["short" if t <= chooser.PDL_MAX_US else "long"].append(gain)
    for text in (_readme_text(code=False), _readme_text(code=False)):
        swap, short, long = (_ab_summary(groups[g]) for g in ("swap", "short", "long"))
        assert f"swap-AB splits {swap}" in text, swap
        assert f"PDL_MAX_US {short}" in text, short
        assert f"the longer ones {long}" in text, long


def test_cublas_fp16_kernels_quoted_in_readme_are_the_recorded_ones():
    """The cuBLAS study's paragraph on the fp16 misses names the kernels cuBLAS ran per dtype at 128x256x32768
    and 1000^3: they must be the ones lab/cublas_kernels/records/cublas_kernels_dtypes_h200.jsonl holds."""
    first = {(r["M"], r["N"], r["K"], r["dtype"]): r["kernels"][0].split(" x")[0]
             for r in _lab_records("lab/cublas_kernels/records/cublas_kernels_dtypes_h200.jsonl")}
    readme = _docs()
    para = readme[readme.index("**Why the fp16 misses remain"):]
    para = " ".join(para[:para.index("\n\n")].split())
    for mnk in ((128, 256, 32768), (1000, 1000, 1000)):
        fp16, bf16 = first[(*mnk, "float16")], first[(*mnk, "bfloat16")]
        assert fp16 != bf16
        assert f"`{fp16}`" in para and f"bf16's `{bf16}`" in para, (mnk, fp16, bf16)
    assert first[(128, 128, 65536, "float16")].replace("hsh", "tst") == \
        first[(128, 128, 65536, "bfloat16")]


def test_tall_swap_split_rule_and_its_figures_follow_the_records():
    """chooser's TALL_SPLIT note: each case of the three H200 calls (the package before
    against a variant with no floor on a unit's K steps, then the committed rule's check) is
    recomputed, grouped by the K steps a unit keeps, and matched against the quoted figures;
    the committed rule picks the variant's kernel exactly where a unit keeps
    TALL_SPLIT_MIN_K_STEPS or more, else the kernel before."""
    chooser = _rule_figures()
    from tirx_gemm import matmul as mm
    per: dict = {}
    for r in _lab_records("lab/split_k_decode/records/matmul_graph_h200_tallsplit.jsonl"):
        per.setdefault((r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
            r["chooser"], []).append(r)
    groups: dict = {"deep": [], "32": [], "short": [], "check": []}
    for (M, N, K, dt), v in per.items():
        tall, before = v["tall"][0]["kwargs"], v["before"][0]["kwargs"]
        assert tall["BLK_M"] == 128 and tall["SWAP_AB"] and tall["SPLIT_K"] >= 3
        steps = -(-K // chooser.BLK_K) // tall["SPLIT_K"]
        now = mm.choose(M, N, K, dt, "sm_90a", 132)[1]
        want = tall if steps >= chooser.TALL_SPLIT_MIN_K_STEPS else before
        assert now == want or _clustered_now(M, N, now, want), (M, N, K)
        gain = math.exp(_mean_log_ratio(v["tall"]) - _mean_log_ratio(v["before"]))
        if v["tall"][0]["call"] == 3:  # the committed rule's check at token counts not run
            groups["check"].append(gain)
        else:
            groups["deep" if steps >= 48 else "32" if steps >= 32 else "short"].append(gain)
    deep, mid, short, check = (_ab_summary(groups[g]) for g in ("deep", "32", "short", "check"))
    for text in (_readme_text(code=False), _readme_text(code=False)):
        assert f"at least 48 K steps a unit {deep}" in text, deep
        assert f"with 32 steps {mid}" in text, mid
        assert f"with 24 or fewer {short}" in text, short
        assert f"both dtypes): {check}" in text, check
    assert chooser.TALL_SPLIT_MIN_K_STEPS == 48


def _ab_cases(name: str) -> dict:
    """{(call, M, N, K, dtype): {chooser label: [records]}} of an A/B records file."""
    per: dict = {}
    for r in _lab_records(name):
        per.setdefault((r["call"], r["M"], r["N"], r["K"], r["dtype"]), {}).setdefault(
            r["chooser"], []).append(r)
    return per


def _ab_gains(per: dict, call: int, base: str, label: str,
              changed: bool = False) -> list[float]:
    """Per case of ``call``: the variant ``label`` over ``base`` (the mean of each side's
    passes' log ratios); ``changed``: only the cases whose kernel the variant changed."""
    return [math.exp(_mean_log_ratio(v[label]) - _mean_log_ratio(v[base]))
            for k, v in per.items() if k[0] == call
            and not (changed and v[label][0]["kwargs"] == v[base][0]["kwargs"])]


def test_swap_stream_k_tail_rule_and_its_figures_follow_the_records():
    """chooser's swap-AB stream-K note: the three H200 calls' cases recomputed (the mean of
    each case's passes' log ratios, the variant over the package before, where the kernel
    changed) and matched against the quoted figures; the committed rule picks the kernels
    call 2's variant and call 3 ran, and the kernel before where its tail is not short."""
    chooser = _rule_figures()
    from tirx_gemm import matmul as mm
    per = _ab_cases("lab/stream_k_tail/records/matmul_graph_h200_swaptail.jsonl")

    def summary(call, label):
        return _ab_summary(_ab_gains(per, call, "before", label, changed=True))

    for (call, M, N, K, dt), v in per.items():
        if call == 1:
            continue
        now = mm.choose(M, N, K, dt, "sm_90a", 132)[1]
        if _clustered_now(M, N, now, v["stream_k"][0]["kwargs"]):
            continue  # the swap-AB cluster rule's since
        assert now == v["stream_k"][0]["kwargs"], (call, M, N, K)
        assert now.get("STREAM_K", False) == chooser.swap_stream_k(M, N)
        if call == 3:  # the committed package was "new" there: the kernel before had none
            assert now["STREAM_K"] and not v["before"][0]["kwargs"].get("STREAM_K")
    for text in (_readme_text(code=False), _readme_text(code=False)):
        for call, label in ((1, "rows64"), (2, "stream_k"), (3, "stream_k")):
            assert summary(call, label) in text, (call, summary(call, label))


def test_v9_handicap_rule_and_its_figures_follow_the_records():
    """chooser.V9_HANDICAP: the three H200 calls' cases recomputed and
    matched against the figures chooser.py and README quote; the committed rule picks, at
    every case, the v12 kernel that ran in v9's place, where the package before ran v9."""
    from tirx_gemm import matmul as mm
    per = _ab_cases("lab/cost_model_fit/records/matmul_graph_h200_v9handicap.jsonl")
    assert {k[0] for k in per} == {1, 2, 3}
    for (call, M, N, K, dt), v in per.items():
        label = "within0" if call == 1 else "handicap"
        assert v["before"][0]["step"] == "v9", (call, M, N, K, dt)
        assert len(v["before"]) == len(v[label]) == 2  # two passes each
        now = mm.choose(M, N, K, dt, "sm_90a", 132)
        assert now == ("v12", v[label][0]["kwargs"]), (call, M, N, K, dt)
    chooser_text, readme = _readme_text(code=False), _readme_text(code=False)
    for call, label in ((1, "within0"), (2, "handicap"), (3, "handicap")):
        summary = _ab_summary(_ab_gains(per, call, "before", label))
        assert summary in chooser_text and summary in readme, (call, summary)
    slowest = min((math.exp(_mean_log_ratio(v["handicap"]) - _mean_log_ratio(v["before"])), k)
                  for k, v in per.items() if k[0] == 2)
    _, (_, M, N, K, dt) = slowest
    assert f"the slowest {M}x{N}x{K} ({'bf16' if dt == 'bfloat16' else 'fp16'}) at " \
           f"{slowest[0]:.3f}" in readme


def test_v9_handicap_is_the_only_preference_v9_has():
    """v9 is picked only where it is predicted more than V9_HANDICAP faster than every v12
    tile; v10 (in its band) keeps PREFER_PAIR_WITHIN. Both as README states them."""
    chooser = _rule_figures()
    readme = _readme_text()
    assert (f"predicted more than {round(chooser.V9_HANDICAP * 100)}% faster than every v12 "
            f"tile (`chooser.V9_HANDICAP`") in readme
    assert (f"predicted more than {round(chooser.PREFER_PAIR_WITHIN * 100)}% faster "
            f"(`chooser.PREFER_PAIR_WITHIN`") in readme
    # a shape where v9's fitted figure is the fastest, but by less than the handicap
    found = 0
    for M in (4096, 6144, 8192):
        for N, K in ((4096, 4096), (6144, 4096), (28672, 4096), (8192, 28672)):
            ranked = chooser.rank(M, N, K)
            v9 = next(t for t, c in ranked if c == chooser.V9)
            v12 = next(t for t, c in ranked if c not in (chooser.V9, chooser.V10))
            pick = chooser.best(M, N, K)
            assert (pick == chooser.V9) == (v9 * (1 + chooser.V9_HANDICAP) < v12), (M, N, K)
            found += v9 < v12 and pick != chooser.V9
    assert found  # the handicap changed a pick the fitted figures alone would give v9


def test_v9_handicap_as_the_bullet_and_the_lesson_state_it():
    """The handicap's size and the lesson's wave arithmetic (6144x5120x3072), from the code."""
    chooser = _rule_figures()
    pct = round(chooser.V9_HANDICAP * 100)
    assert (f"v9's predicted time counts {pct}% more when `chooser.best` ranks it against "
            f"v12's tiles, and a v12 tile within {pct}% takes its place") in _readme_text()
    lesson = re.sub(r"\s+", " ", re.sub(r"<!-- /?rec[^>]*-->", "",
                                        (ROOT / "steps/lessons/v12.md").read_text()))
    assert f"counts v9's predicted time {pct}% higher" in lesson
    M, N, K = 6144, 5120, 3072
    _, v9_waves, v9_tiles = chooser.shape_terms(chooser.V9, M, N, K, 132)
    _, waves, tiles = chooser.shape_terms("128x240", M, N, K, 132)
    pairs = 132 // 2
    assert v9_waves == 8 and waves == 8 and tiles == 8 * 132  # every wave of 128x240 full
    assert (f"v9's {v9_tiles} tiles make {v9_tiles / pairs:.1f} waves on {pairs} pairs, the "
            f"eighth a quarter full; 128x240 tiles make {tiles}, eight waves on 132 CTAs") in lesson
    assert round(4 * (v9_tiles - 7 * pairs) / pairs) == 1  # "a quarter full"


def test_v10_band_keeps_its_place_as_measured():
    """The v10 band A/B (not adopted): its figures as README quotes them, and
    matmul still picks v10 at every case the variant moved to a v12 tile."""
    from tirx_gemm import matmul as mm
    per = _ab_cases("lab/v10_ping_pong_band/records/matmul_graph_h200_v10band.jsonl")
    for (call, M, N, K, dt), v in per.items():
        assert mm.choose(M, N, K, dt, "sm_90a", 132)[0] == "v10" == v["v10"][0]["step"]
        assert v["v10handicap"][0]["step"] == "v12"
    gains = _ab_gains(per, 4, "v10", "v10handicap")
    assert _ab_summary(gains) in _readme_text(code=False)
    assert f"ahead at {sum(g > 1 for g in gains)} cases only" in _readme_text(code=False)


def test_stream_k_all_figures_follow_the_records_and_matmul_never_takes_it():
    """v12's STREAM_K_ALL at 49-96 tokens (not adopted): the two variants' figures
    as README quotes them; matmul's picks at those shapes are the package's, without it."""
    per = _ab_cases("lab/stream_k_tail/records/matmul_graph_h200_skall.jsonl")
    readme = _readme_text(code=False)
    for label in ("stream_k_all", "stream_k_all_128"):
        assert _ab_summary(_ab_gains(per, 1, "before", label)) in readme, label
    for (call, M, N, K, dt), v in per.items():
        now = _decode_ab_pick(M, N, K, dt, v["before"][0])
        assert "STREAM_K_ALL" not in now[1]
        assert any(r["kwargs"].get("STREAM_K_ALL") for r in v["stream_k_all_128"])


def test_v9_handicap_kernel_count_as_quoted():
    """README's count of what serves the models suite's layers over every M (bf16)."""
    import json
    from tirx_gemm import matmul as mm
    suite = json.loads((ROOT / "tirx_gemm" / "op" / "suites" / "models.json").read_text())
    layers = sorted({(s["N"], s["K"]) for s in suite["shapes"]})
    ranges, kernels = 0, set()
    for N, K in layers:
        vs = mm.variants(N, K, "bfloat16")
        ranges += len(vs)
        kernels |= {(N, K, step, tuple(sorted(kw.items()))) for step, kw, _, _ in vs}
    assert len(layers) == 27
    assert (f"the models suite's {len(layers)} layers, bf16) matmul now serves {ranges} M "
            f"ranges with {len(kernels)} kernels") in _readme_text()


def _clustered_now(M, N, now: dict, before: dict) -> bool:
    """Whether matmul's kernel ``now`` at an earlier A/B's case is the swap-AB cluster
    rule's in place of ``before``, the persistent swap-AB kernel that A/B ran:
    clusters of four along the weight where chooser.swap_cluster_rows says so."""
    chooser = _rule_figures()
    if now.get("CLUSTER") != chooser.SWAP_CLUSTER:
        return False
    assert now["BLK_M"] == chooser.swap_cluster_rows(M, N), (M, N, now)
    assert before.get("SWAP_AB") and "SPLIT_K" not in before, (M, N, before)
    return True


def _decode_ab_pick(M, N, K, dt, before: dict) -> tuple:
    """matmul's pick at a case of the decode A/Bs: the kernel those calls ran as the
    package's ("before"), or the swap-AB cluster rule's (:func:`_clustered_now`)."""
    from tirx_gemm import matmul as mm
    now = mm.choose(M, N, K, dt, "sm_90a", 132)
    if not _clustered_now(M, N, now[1], before["kwargs"]):
        assert now == (before["step"], before["kwargs"]), (M, N, K, dt)
    return now


def test_mma_lag_at_49_96_tokens_figures_follow_the_records():
    """The MMA_LAG 2 / 4 A/B at the mdec shapes (not adopted): its figures as
    README quotes them, over the cases whose kernel the variant changed; matmul's picks
    there keep MMA_LAG at its default."""
    per = _ab_cases("lab/mma_lag_and_l2_hints/records/matmul_graph_h200_mdeclag.jsonl")
    readme = _readme_text(code=False)
    for label in ("mma_lag2", "mma_lag4"):
        assert all("MMA_LAG" in v[label][0]["kwargs"]
                   for v in per.values() if v[label][0]["kwargs"] != v["before"][0]["kwargs"])
        gains = _ab_gains(per, 1, "before", label, changed=True)
        assert len(gains) == 21 and _ab_summary(gains) in readme, label
    for (call, M, N, K, dt), v in per.items():
        assert "MMA_LAG" not in _decode_ab_pick(M, N, K, dt, v["before"][0])[1]


def test_misaligned_pair_rule_recheck_figures_follow_the_records():
    """The pair rule re-checked: README's figures over the cases where the rule
    makes a pair, and the rules still make it there but where the clusters of four adopted
    later replace it (then the pick is theirs)."""
    chooser = _rule_figures()
    from tirx_gemm import matmul as mm
    per = _ab_cases("lab/cta_clusters/records/matmul_graph_h200_misk.jsonl")
    for (call, M, N, K, dt), v in per.items():
        now = _choose_without((M_CLUSTERS, "misaligned_rows_model"), M, N, K, dt)
        assert now == (v["pair"][0]["step"], v["pair"][0]["kwargs"])
        current = mm.choose(M, N, K, dt, "sm_90a", 132)
        assert current == now or current[1].get("CLUSTER") in (2, 4), (M, N, K, dt)
        if v["pair"][0]["kwargs"] != v["one_cta"][0]["kwargs"]:
            assert chooser.misaligned_rows(K) and now[1]["CLUSTER"] == 2
            assert "CLUSTER" not in v["one_cta"][0]["kwargs"]
    gains = _ab_gains(per, 1, "pair", "one_cta", changed=True)
    assert len(gains) == 10 and _ab_summary(gains) in _readme_text(code=False)


def test_swap_pairs_at_49_96_tokens_figures_follow_the_records():
    """Swap-AB pairs at the mdec shapes (not adopted): README's figure over the
    cases the variant changed; matmul's picks there stay one-CTA."""
    per = _ab_cases("lab/cta_clusters/records/matmul_graph_h200_mdecpair.jsonl")
    for (call, M, N, K, dt), v in per.items():
        now = _decode_ab_pick(M, N, K, dt, v["before"][0])
        assert now[1].get("CLUSTER", 1) != 2
        if v["pairs"][0]["kwargs"] != v["before"][0]["kwargs"]:
            assert v["pairs"][0]["kwargs"]["CLUSTER"] == 2
    gains = _ab_gains(per, 1, "before", "pairs", changed=True)
    assert len(gains) == 21 and _ab_summary(gains) in _readme_text(code=False)


def test_swap_cluster_rule_figures_follow_the_records():
    """The clusters-of-four A/B: both variants' figures over the 24 decode layers
    and the rule's over the layers where it picks clusters, recomputed and matched against
    README and chooser.py; at those layers matmul now picks the kernel the variant ran."""
    chooser = _rule_figures()
    from tirx_gemm import matmul as mm
    per = _ab_cases("lab/cta_clusters/records/matmul_graph_h200_c4.jsonl")
    readme, chooser_text = _readme_text(code=False), _readme_text(code=False)
    for label in ("c4_rows64", "c4_rows128"):
        gains = _ab_gains(per, 1, "before", label)
        assert len(gains) == 24 and _ab_summary(gains) in readme, label
    rule, mixed = [], []
    for (call, M, N, K, dt), v in per.items():
        if call != 1:
            continue
        rows = chooser.swap_cluster_rows(M, N)
        label = {None: "before", 64: "c4_rows64", 128: "c4_rows128"}[rows]
        mixed.append(_mean_log_ratio(v[label]))
        now = mm.choose(M, N, K, dt, "sm_90a", 132)
        assert now == (v[label][0]["step"], v[label][0]["kwargs"]), (M, N, K)
        if rows is not None:
            rule.append(math.exp(_mean_log_ratio(v[label]) - _mean_log_ratio(v["before"])))
    assert len(rule) == 12
    assert _ab_summary(rule) in readme and _ab_summary(rule) in chooser_text
    assert f"the set's geomean goes from {_geomean_of(per, 'before'):.3f} to " \
           f"{math.exp(sum(mixed) / len(mixed)):.3f}" in readme
    # call 2: the rule as committed against the package before, at the mdec set again and
    # at the check set of other models' layers (both dtypes), where the kernel changed
    for name, count in (("lab/cta_clusters/suites/c4check.json", 24), ("lab/stream_k_tail/suites/mdec.json", 12)):
        sub = {k: v for k, v in per.items() if k[0] == 2
               and v["cluster_rule"][0]["set"].endswith(name)}
        gains = _ab_gains(sub, 2, "before", "cluster_rule", changed=True)
        assert len(gains) == count and _ab_summary(gains) in readme, name
        assert _ab_summary(gains) in chooser_text, name
        for (_, M, N, K, dt), v in sub.items():
            assert mm.choose(M, N, K, dt, "sm_90a", 132) == (v["cluster_rule"][0]["step"],
                                                             v["cluster_rule"][0]["kwargs"])
    import json
    check = json.loads((ROOT / "lab/cta_clusters/suites/c4check.json").read_text())["shapes"]
    changed = sum(mm.choose(e["M"], e["N"], e["K"], "bfloat16", "sm_90a", 132)[1].get("CLUSTER")
                  == chooser.SWAP_CLUSTER for e in check)
    assert (f"at {len(check)} decode layers of other models" in readme
            and f"the rule changes {changed} of them" in readme)


def test_swap_cluster_cap_is_the_drivers_count():
    """chooser.SWAP_CLUSTER_MAX_CLUSTERS is what the driver said the H200 holds at once of
    clusters of four of both swap-AB cluster kernels (lab/cta_clusters/records/cluster_occupancy_h200.jsonl),
    and README and the lesson quote it with the SMs it covers."""
    chooser = _rule_figures()
    rows = [r for r in _lab_records("lab/cta_clusters/records/cluster_occupancy_h200.jsonl")
            if r["cluster"] == chooser.SWAP_CLUSTER]
    assert len(rows) == 2 and {r["threads"] for r in rows} == {256, 384}
    assert {r["max_active_clusters"] for r in rows} == {chooser.SWAP_CLUSTER_MAX_CLUSTERS}
    ctas = chooser.SWAP_CLUSTER_MAX_CLUSTERS * chooser.SWAP_CLUSTER
    assert all(r["device"] == "NVIDIA H200" and r["ctas"] == ctas for r in rows)
    text = (f"holds {chooser.SWAP_CLUSTER_MAX_CLUSTERS} clusters of four at once, {ctas} of "
            f"its 132 SMs")
    assert text in _readme_text(code=False)
    lesson = re.sub(r"\s+", " ", (ROOT / "steps/lessons/v12.md").read_text())
    assert f"the H200 holds {chooser.SWAP_CLUSTER_MAX_CLUSTERS} at once, {ctas} of its 132 SMs" in lesson
    assert chooser.SWAP_CLUSTER_MAX_FILL == 2 / 3
    assert "the one-CTA grid's last wave is at most two-thirds full" in _readme_text()


def _geomean_of(per: dict, label: str, call: int = 1) -> float:
    logs = [math.log(r["ratio"]) for k, v in per.items() if k[0] == call for r in v[label]]
    return math.exp(sum(logs) / len(logs))


def test_swap_clusters_change_no_suite_kernel_at_its_own_token_count():
    """README: the clusters of four change no kernel of the models or held-out suites at
    their own token counts, and of the fresh sample only 80x4608x4096."""
    import json
    from tirx_gemm import matmul as mm
    changed = []
    for path in ("tirx_gemm/op/suites/models.json", "tirx_gemm/op/suites/heldout.json",
                 "lab/held_out_shapes/suites/fresh.json"):
        for e in json.loads((ROOT / path).read_text())["shapes"]:
            for dt in ("float16", "bfloat16"):
                kw = mm.choose(e["M"], e["N"], e["K"], dt, "sm_90a", 132)[1]
                if kw.get("SWAP_AB") and kw.get("CLUSTER") == 4:  # the swap-AB clusters
                    changed.append((path, e["M"], e["N"], e["K"]))
    assert {c[1:] for c in changed} == {(80, 4608, 4096)}
    assert all(c[0].endswith("lab/held_out_shapes/suites/fresh.json") for c in changed)
    assert "The clusters of four change no kernel of the models or held-out suites" \
           in _readme_text()


def test_the_prepared_lab_sets_meet_the_rules_they_test():
    """The sets prepared for the next H200 call test what their descriptions say:
    c4next.json, 64-row clusters of four at every layer, the 56-token tile at 52 and
    56 tokens and the 64-token one at 62, on weights outside the two sets the cluster rule
    was built and checked on (mdec, c4check);
    m128.json, one-CTA 64-row token tiles (no swap-AB, no split) at 97-128 tokens;
    c4mis.json, CTA pairs by the misaligned-row rule at every shape (the rules without the
    clusters of four adopted from it; with them, clusters of four where they fit)."""
    import json
    from tirx_gemm import matmul as mm
    from tirx_gemm.op.suite import load_suite
    lab = ROOT
    sets = {"c4next": "lab/cta_clusters/suites/c4next.json", "m128": "lab/cta_clusters/suites/m128.json",
            "c4mis": "lab/cta_clusters/suites/c4mis.json", "mdec": "lab/stream_k_tail/suites/mdec.json",
            "c4check": "lab/cta_clusters/suites/c4check.json"}
    for name in ("c4next", "m128", "c4mis"):  # what the H200 scripts load them with
        assert "Decided before the run" in load_suite(str(lab / sets[name])).description
    nxt = json.loads((lab / "lab/cta_clusters/suites/c4next.json").read_text())["shapes"]
    earlier = {(e["N"], e["K"]) for name in ("mdec", "c4check")
               for e in json.loads((lab / sets[name]).read_text())["shapes"]}
    for e in nxt:
        assert (e["N"], e["K"]) not in earlier, e
        for dt in ("float16", "bfloat16"):
            step, kw = mm.choose(e["M"], e["N"], e["K"], dt, "sm_90a", 132)
            assert (step, kw["BLK_M"], kw.get("CLUSTER"), kw["SWAP_AB"]) == ("v12", 64, 4, True)
            assert kw["BLK_N"] == (56 if e["M"] <= 56 else 64), e
    assert {e["M"] for e in nxt} == {52, 56, 62}
    for e in json.loads((lab / "lab/cta_clusters/suites/m128.json").read_text())["shapes"]:
        assert 96 < e["M"] <= 128
        for dt in ("float16", "bfloat16"):
            step, kw = mm.choose(e["M"], e["N"], e["K"], dt, "sm_90a", 132)
            assert step == "v12" and kw["BLK_M"] == 64, e
            assert not any(kw.get(k) for k in ("SWAP_AB", "SPLIT_K", "CLUSTER", "STREAM_K")), e
    chooser = _rule_figures()
    for e in json.loads((lab / "lab/cta_clusters/suites/c4mis.json").read_text())["shapes"]:
        assert chooser.misaligned_rows(e["K"]), e
        for dt in ("float16", "bfloat16"):
            step, kw = _choose_without(M_CLUSTERS, e["M"], e["N"], e["K"], dt)
            assert step == "v12" and kw.get("CLUSTER") == 2, e
            assert mm.choose(e["M"], e["N"], e["K"], dt, "sm_90a", 132)[1].get("CLUSTER") in (2, 4)



@pytest.mark.parametrize("card", ["h200", "h100"])
def test_the_error_class_figures_are_computed_from_their_records(card):
    """The public suite's kernel-time geomean and lowest case that the README quotes, and the
    misaligned-row rule's A/B gains that its study quotes, from each card's records."""
    rec = ROOT / "lab" / "cost_model_error_classes" / "records"
    rows = [json.loads(x) for x in (rec / f"public_suite_{card}.jsonl").read_text().splitlines()]
    ratios = [(r["candidates"][r["pick"]]["ratio"], r) for r in rows]
    g = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
    low, r = min(ratios, key=lambda t: t[0])
    dt = {"bfloat16": "bf16", "float16": "fp16"}[r["dtype"]]
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert (f"the same {len(ratios)} cases gave a geomean of {g:.3f} and a lowest case of "
            f"{low:.3f} ({r['M']}x{r['N']}x{r['K']} {dt})") in readme
    gains = []
    for line in (rec / f"error_classes_{card}.jsonl").read_text().splitlines():
        r = json.loads(line)
        c = r["candidates"]
        before = [k for k, v in c.items() if "before" in v["specs"]]
        if before and before[0] != r["pick"]:
            gains.append(c[before[0]]["ms"] / c[r["pick"]]["ms"])
    g = math.exp(sum(map(math.log, gains)) / len(gains))
    study = re.sub(r"\s+", " ", (ROOT / "lab" / "cost_model_error_classes" / "README.md")
                   .read_text(encoding="utf-8"))
    assert (f"Over the {len(gains)} cases where `misaligned_rows_model` changes the kernel" in study
            and f"geomean {g:.3f}, none behind" in study and min(gains) >= 1.0)
    for x in gains:
        assert f"{x:.3f}" in study, x


def test_the_h100_card_ab_figures_are_computed_from_their_records():
    """The card A/B's geomean and count behind that the study quotes (the default pick's time
    over the H100 card's, where they differ) from its records."""
    study = re.sub(r"\s+", " ", (ROOT / "lab" / "cost_model_error_classes" / "README.md")
                   .read_text(encoding="utf-8"))
    rec = ROOT / "lab" / "cost_model_error_classes" / "records" / "card_ab_h100.jsonl"
    gains = []
    for line in rec.read_text().splitlines():
        r = json.loads(line)
        c = r["candidates"]
        card = next(k for k, v in c.items() if "card:h100" in v["specs"])
        if card != r["pick"]:
            gains.append(c[r["pick"]]["ms"] / c[card]["ms"])
    g = math.exp(sum(map(math.log, gains)) / len(gains))
    behind = sum(x < 1.0 for x in gains)
    assert (f"has a geomean of {g:.3f} with {behind} of the {len(gains)} cases behind"
            in study), (g, behind, len(gains))
