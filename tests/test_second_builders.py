"""A step file's second builders (hgemm_<step>_*: v13's hgemm_v13_mx, v14's hgemm_v14_mx and
hgemm_v14_fp8_block): where one declares a barrier count unlike the step builder's, the lesson's
barrier section carries a count marker for it, which scripts/render_docs.py fills from that
builder and --check holds fresh; a wrong count in such a marker renders back to the right one."""
import pytest
from support import load_script

from tirx_gemm import registry

RD = load_script("scripts/render_docs.py")
WITH_SECOND = [s for s in registry.STEPS if len(RD.builders(s)) > 1]


def test_the_second_builders_are_found():
    assert {(s.id, s.arch, b.__name__) for s in WITH_SECOND for b in RD.builders(s)[1:]} == {
        ("v13", "sm_100a", "hgemm_v13_mx"), ("v14", "sm_100a", "hgemm_v14_mx"),
        ("v14", "sm_90a", "hgemm_v14_fp8_block")}


def test_every_count_a_second_builder_declares_unlike_its_step_builder_has_its_marker():
    differing = set()
    for step in WITH_SECOND:
        text = (RD.LESSONS_DIR / f"{step.id}.md").read_text(encoding="utf-8")
        section = next(text[a:b] for sec, a, b in RD.barrier_sections(text) if sec == step.arch)
        main, *others = RD.builders(step)
        counts, ns = RD.declared_counts(step), RD.builder_ns(step, main)
        for b in others:
            for name, expr in RD.declared_counts(step, b).items():
                if (RD.count_value(step, expr, RD.builder_ns(step, b))
                        != RD.count_value(step, counts[name], ns)):
                    differing.add((b.__name__, name))
                    assert f"<!-- count {b.__name__} {name} -->" in section, (step.key, b, name)
    # sm_90a's FP8_BLOCK declares NUM_CONSUMERS for mma2tma, the table's NUM_CONSUMERS * CLUSTER
    # at CLUSTER=1: no count of its own
    assert differing == {("hgemm_v13_mx", "mma2tma"), ("hgemm_v14_mx", "tma2mma")}


@pytest.mark.parametrize("lesson,right", [
    ("v14", "<!-- count hgemm_v14_mx tma2mma -->`1 + 32` = 33<!-- /count -->"),
    ("v13", "<!-- count hgemm_v13_mx ld2mma -->`CTA_PAIR * 128` = 256<!-- /count -->")])
def test_a_wrong_second_builder_count_in_the_lesson_is_stale(lesson, right, tmp_path):
    text = (RD.LESSONS_DIR / f"{lesson}.md").read_text(encoding="utf-8")
    assert right in text
    wrong = tmp_path / f"{lesson}.md"
    wrong.write_text(text.replace(right, right[:-len("<!-- /count -->") - 1] + "7<!-- /count -->"),
                     encoding="utf-8")
    assert wrong.read_text(encoding="utf-8") != text
    assert RD.render_lesson(wrong) == text
