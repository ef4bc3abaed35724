"""The lab: one folder per study under lab/, each with a README whose figures are rendered
from its records, and a generated index; every study's own check runs here."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import load_script

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "lab"


RENDER_DOCS = load_script("scripts/render_docs.py")
STUDIES = sorted(p for p in LAB.iterdir() if p.is_dir())


def test_the_lab_left_scripts_and_results():
    """The studies' scripts, records and logs live in lab/<study>/ only; results/ keeps what
    the README, lessons and site render."""
    for gone in ("scripts/lab", "results/lab", "results/logs", "results/op", "results/sweeps"):
        assert not (ROOT / gone).exists(), gone
    assert len(STUDIES) >= 20


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_a_study_readme_states_question_command_and_decision(study):
    readme = study / "README.md"
    assert readme.is_file(), f"{study.name} has no README.md"
    parts = RENDER_DOCS.study_parts(readme)
    assert set(parts) >= {"title", "question", "command", "decision"}, (study.name, sorted(parts))
    long = [i for i, line in enumerate(readme.read_text(encoding="utf-8").split("\n"), 1)
            if len(line) > 200]
    assert not long, f"{study.name}/README.md: lines over 200 characters: {long}"


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_a_study_readme_holds_what_its_records_say(study):
    """render_docs --check, one study at a time: every rec marker of the README holds the
    figure its record gives (a missing record or selector fails)."""
    readme = study / "README.md"
    assert RENDER_DOCS.render_lesson(readme, {}) == readme.read_text(encoding="utf-8"), \
        f"{study.name}/README.md is stale: run python scripts/render_docs.py"


def test_the_index_lists_every_study_as_its_readme_states_it():
    index = (LAB / "README.md").read_text(encoding="utf-8")
    assert index == RENDER_DOCS.lab_index(), "lab/README.md is stale: run python scripts/render_docs.py"
    for study in STUDIES:
        parts = RENDER_DOCS.study_parts(study / "README.md")
        assert f"]({study.name}/README.md)" in index, study.name
        assert parts["title"] in index, study.name


def test_the_index_is_generated_from_the_readmes(tmp_path):
    """A study's question and decision reach the index from its README, not typed twice."""
    study = tmp_path / "lab" / "a_question"
    study.mkdir(parents=True)
    (study / "README.md").write_text("# A question\n\nQuestion: Does X beat Y?\n\nCommand:\n\n"
                                     "- `python x.py`\n\nDecision: adopted as the rule `x`.\n")
    index = RENDER_DOCS.lab_index(tmp_path)
    assert "## [A question](a_question/README.md)" in index
    assert "Question: Does X beat Y?" in index and "Decision: adopted as the rule `x`." in index


def test_no_lab_file_is_named_by_history():
    """Names say what a file holds: no issue, stop, session or run label (s13, h12, call2,
    fresh51) and no commit hash."""
    label = re.compile(r"(^|[_./-])(issue\d+|stop\d+|session|s\d{1,2}|h\d{1,2}i?|call\d*|fresh\d+)"
                       r"([_./-]|$)")
    named = [str(p.relative_to(ROOT)) for p in LAB.rglob("*") if label.search(p.name)]
    assert not named, named[:10]


def test_the_records_read_from_logs_are_fresh():
    """lab/tools/logs_to_records.py --check: the study's own check (the records of figures
    that exist only in H200 logs hold what the logs say)."""
    out = subprocess.run([sys.executable, "lab/tools/logs_to_records.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_cost_model_is_fitted_to_the_studys_records():
    """scripts/fit_chooser.py reads the sweeps it fits from lab/cost_model_fit/records/, and
    --check refits tirx_gemm/op/chooser_h200.json from them."""
    fit = load_script("scripts/fit_chooser.py")
    home = LAB / "cost_model_fit" / "records"
    for path in (*fit.SWEEPS, fit.V10_SWEEP, fit.SHORTK_SWEEP, fit.MIDK_SWEEP, fit.PDL_SWEEP,
                 fit.SPLIT_SWEEP):
        assert path.parent == home and path.is_file(), path
    out = subprocess.run([sys.executable, "scripts/fit_chooser.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_cost_model_fit_readme_quotes_the_models_error_and_floor_as_the_fit_gives_them():
    """lab/cost_model_fit/README.md's RMS error of the model over the swept kernels, without
    and with the HBM floor, and its 128x28672x8192 predictions at 128x224 are what
    scripts/fit_chooser.py and the cost model compute from the study's records."""
    from tirx_gemm.op import cost_model as cm
    fit = load_script("scripts/fit_chooser.py")
    samples, _ = fit.load()
    text = (LAB / "cost_model_fit" / "README.md").read_text(encoding="utf-8")
    prose = re.sub(r"\s+", " ", re.sub(r"<!-- /?rec[^>]*-->", "", text))
    errors = f"{fit.model_error(samples, floor=False):.1%} to {fit.model_error(samples):.1%}"
    assert f"RMS error over the {len(samples)} swept kernels from {errors}" in prose
    plain = cm.predict("128x224", 128, 28672, 8192, pdl=False)
    bare = cm._predict_plain("128x224", 128, 28672, 8192, cm.SMS_H200)
    assert f"128x224: predicted {bare:.0f} µs without it and {plain:.0f} µs with it" in prose


# ---- history labels in what a study says (the matcher is test_history_labels', by import)

from test_history_labels import labels_in  # noqa: E402  (tests/ is on sys.path under pytest)

_REC_HEADER = re.compile(r"<!-- rec:[^>]*-->")


def _prose(text: str) -> str:
    """A README with its rec markers' headers blanked (their selectors are data: the record
    fields a figure is read from, e.g. a suite's name), line breaks kept."""
    return _REC_HEADER.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _patch_words(text: str) -> str:
    """What a lab patch says in words: its header (the text before the first diff) and
    the lines it adds."""
    head, _, body = text.partition("\n--- a/")
    if text.startswith(("--- a/", "diff --git")):
        head, body = "", text
    added = [line for line in body.split("\n") if line.startswith("+") and not line.startswith("+++")]
    return "\n".join([head, *added])


def _labels(text: str) -> dict[int, list[str]]:
    return {n: found for n, line in enumerate(text.split("\n"), 1) if (found := labels_in(line))}


def test_the_label_check_of_the_lab_fails_on_a_planted_label():
    # the planted labels are assembled here, so this file itself carries none
    issue, stop = "issue" + " 32", "stop" + " 54"
    readme = (f"Decision: adopted in {issue} ({stop}).\n\nThe s13 bundles, against 6bb7121.\n"
              "<!-- rec:lab/x/records/a.jsonl suite=fresh51,git_sha^=91c28c0f ratio .2f -->1.0<!-- /rec -->\n")
    assert sorted(_labels(_prose(readme))) == [1, 3]
    patch = (f"Lab variant ({issue}, {stop}; not adopted): pairs.\n\n--- a/x.py\n+++ b/x.py\n"
             f"@@ -1 +1,2 @@\n a = 1\n+# LAB VARIANT ({stop})\n")
    words = _patch_words(patch)
    assert f"LAB VARIANT ({stop})" in words and issue in words
    assert len(_labels(words)) == 2
    assert not _labels(_prose("clusters of four at 56 tokens (run on the H100, two passes)\n"))


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_a_study_readme_and_its_patches_carry_no_history_labels(study):
    """History lives in commit messages: a study says what was compared, not in which issue,
    stop, session, call or run (s13, h12, fresh51) or against which commit."""
    hits = {}
    readme = study / "README.md"
    for n, found in _labels(_prose(readme.read_text(encoding="utf-8"))).items():
        hits[f"{readme.relative_to(ROOT)}:{n}"] = found
    for patch in sorted((study / "patches").glob("*.patch")):
        for n, found in _labels(_patch_words(patch.read_text(encoding="utf-8"))).items():
            hits[f"{patch.relative_to(ROOT)} (header or added line {n})"] = found
    assert not hits, hits


# ---- the lab-only keywords of v12: each a patch in its study, and the scripts say which

def _lab_patches():
    return load_script("lab/tools/lab_patches.py")


LAB_PATCHES = _lab_patches()


def test_a_lab_only_keyword_is_not_in_the_builder_and_a_script_asking_for_it_names_its_patch():
    have = LAB_PATCHES.builder_keywords()
    assert {"BLK_M", "SWAP_AB", "CLUSTER", "SPLIT_K"} <= have
    for keyword in LAB_PATCHES.PATCH_OF:
        assert keyword not in LAB_PATCHES.builder_keywords(LAB_PATCHES.builder_of(keyword)), keyword
    assert {"SCALE", "PROMOTE_OVERLAP", "CLUSTER"} <= LAB_PATCHES.builder_keywords(
        LAB_PATCHES.BUILDERS["v13"])
    with pytest.raises(SystemExit) as err:
        LAB_PATCHES.require([{"BLK_M": 64}, {"BLK_M": 64, "MMA_LAG": 2}])
    assert "lab/mma_lag_and_l2_hints/patches/mma_lag.patch" in str(err.value)
    assert "\n" not in str(err.value)
    LAB_PATCHES.require([{"BLK_M": 64, "CLUSTER": 2}])  # builder keywords: nothing to apply
    with pytest.raises(SystemExit) as err:
        LAB_PATCHES.require([{"SCALE": "block", "STAGGER": True}])
    assert "hgemm_v13.py" in str(err.value) and "fp8_on_hopper/patches/stagger.patch" in str(err.value)
    out = subprocess.run([sys.executable, "lab/tools/h200_variants.py", "export",
                          "lab/mma_lag_and_l2_hints/suites/mmalag.json", "--out", "/nonexistent/x"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "mma_lag.patch" in out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("keyword", sorted(LAB_PATCHES.PATCH_OF))
def test_each_lab_patch_applies_and_puts_its_keyword_back(keyword, tmp_path):
    patch = ROOT / LAB_PATCHES.PATCH_OF[keyword]
    text = patch.read_text(encoding="utf-8")
    for rel in re.findall(r"^--- a/(\S+)", text, re.M):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((ROOT / rel).read_bytes())
    out = subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, f"{patch.relative_to(ROOT)} no longer applies: {out.stderr}"
    assert keyword in LAB_PATCHES.builder_keywords(LAB_PATCHES.builder_of(keyword, tmp_path))



def test_the_gelu_variants_patches_apply_in_the_order_their_export_script_gives(tmp_path):
    """export_gelu_variants.py's docstring applies epi_defer.patch, then act_approx.patch (the
    erf form of ACT_APPROX; each also applies alone: tests/test_epilogue.py, lab_patches.PATCH_OF):
    both go on in that order, and the builder and epilogue.APPROX_ACTS then hold what the script
    exports."""
    script = (ROOT / "lab/fused_epilogues/export_gelu_variants.py").read_text(encoding="utf-8")
    order = re.search(r"git apply (\S+) (\S+)", script).groups()
    assert [Path(p).name for p in order] == ["epi_defer.patch", "act_approx.patch"], order
    for patch in order:
        for rel in re.findall(r"^--- a/(\S+)", (ROOT / patch).read_text(encoding="utf-8"), re.M):
            if not (tmp_path / rel).exists():
                (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / rel).write_bytes((ROOT / rel).read_bytes())
    out = subprocess.run(["git", "apply", *(str(ROOT / p) for p in order)], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "EPI_DEFER" in LAB_PATCHES.builder_keywords(tmp_path / "steps/sm90a/hgemm_v12.py")
    assert re.search(r"APPROX_ACTS = \([^)]*\"gelu\"", (tmp_path / "tirx_gemm/epilogue.py").read_text())

# ---- the H100 A/B runs of lab/cta_clusters

def test_the_cluster_ab_tables_hold_what_the_records_and_the_run_log_give():
    """lab/cta_clusters/ab_summary.py --check: the README's A/B tables are computed from the
    records, and they agree with the summary the run printed."""
    out = subprocess.run([sys.executable, "lab/cta_clusters/ab_summary.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_cluster_ab_section_quotes_each_suites_rule_as_stated_before_the_run():
    import json
    text = " ".join(re.sub(r"^> ", "", line) for line in
                    (LAB / "cta_clusters" / "README.md").read_text(encoding="utf-8").split("\n"))
    for name in ("c4next", "m128", "c4mis"):
        desc = json.loads((LAB / "cta_clusters" / "suites" / f"{name}.json").read_text())["description"]
        rule = desc[desc.index("Decided before the run:"):]
        assert " ".join(rule.split()) in " ".join(text.split()), name


# ---- lab/bf16_ceiling

def test_the_ceiling_table_names_each_paths_best_sustained_shape_and_their_ratio(tmp_path):
    """ceiling.py table: one row per record, and the line comparing tirx's best sustained shape
    with torch's (the run's ceiling); burst records never count as the ceiling."""
    import json
    ceiling = load_script("lab/bf16_ceiling/ceiling.py")
    recs = [dict(card="GPU X", M=m, N=8192, K=8192, mode=mode, path=path, ms=1.0, tflops=t,
                 sm_mhz=1500, power_w=690.0, reasons=["sw_power_cap"], frac_of_clock_peak=0.8)
            for m, mode, path, t in ((8192, "sustained", "torch.mm", 700.0),
                                     (8192, "sustained", "tirx", 680.0),
                                     (4096, "sustained", "torch.mm", 650.0),
                                     (4096, "sustained", "tirx", 690.0),
                                     (4096, "burst", "torch.mm", 900.0))]
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = ceiling.table([f])
    assert out.count("| 8192x8192x8192 |") == 2 and out.count("| 4096x8192x8192 |") == 3
    assert "torch's best sustained shape: 8192x8192x8192 700 TFLOP/s" in out
    assert "tirx's best: 4096x8192x8192 690 TFLOP/s = 0.986 of torch's best (GPU X)" in out
