"""The lab: one folder per study under lab/, each with a README whose figures are rendered
from its records, and a generated index; every study's own check runs here."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "lab"


def _render_docs():
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RENDER_DOCS = _render_docs()
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
    spec = importlib.util.spec_from_file_location("fit_chooser", ROOT / "scripts" / "fit_chooser.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
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
    spec = importlib.util.spec_from_file_location("fit_chooser", ROOT / "scripts" / "fit_chooser.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    samples, _ = fit.load()
    text = (LAB / "cost_model_fit" / "README.md").read_text(encoding="utf-8")
    prose = re.sub(r"\s+", " ", re.sub(r"<!-- /?rec[^>]*-->", "", text))
    errors = f"{fit.model_error(samples, floor=False):.1%} to {fit.model_error(samples):.1%}"
    assert f"RMS error over the {len(samples)} swept kernels from {errors}" in prose
    plain = cm.predict("128x224", 128, 28672, 8192, pdl=False)
    bare = cm._predict_plain("128x224", 128, 28672, 8192, cm.SMS_H200)
    assert f"128x224: predicted {bare:.0f} µs without it and {plain:.0f} µs with it" in prose
