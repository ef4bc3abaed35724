"""lab/decode_fixed_cost's plans: what error_classes.py plan writes from the suite today (a
rule or cost-model change that moves a pick shows up here, not on the GPU host), and every
"pick+KEY=VALUE" candidate differs from the pick in the keywords it names only."""
import json
from pathlib import Path

import pytest
from support import load_script

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "lab" / "decode_fixed_cost"
EC = load_script("lab/cost_model_error_classes/error_classes.py")


@pytest.mark.parametrize("card", ["h100", "h200"])
def test_the_committed_plan_is_what_plan_writes(card, tmp_path):
    out = tmp_path / "plan.json"
    assert EC.plan(STUDY / "suites" / "fixed_cost.json", out, None, card) == 0
    assert json.loads(out.read_text()) == json.loads((STUDY / "suites" / f"plan_{card}.json").read_text()), \
        f"lab/decode_fixed_cost/suites/plan_{card}.json is stale: rerun the plan command of its README"


def test_a_changed_keyword_candidate_changes_only_that_keyword():
    doc = json.loads((STUDY / "suites" / "plan_h100.json").read_text())
    assert doc["card"] == "h100" and len(doc["cases"]) == 24
    for case in doc["cases"]:
        pick = case["candidates"][0]
        assert pick["specs"][0] == "pick"
        for cand in case["candidates"][1:]:
            for spec in cand["specs"]:
                want = EC._overridden(pick["kwargs"], spec)
                assert cand["kwargs"] == want and cand["step"] == pick["step"], (case["M"], spec)
            assert cand["label"].startswith(pick["label"] + "+")
    assert EC._overridden({"A": 1, "PDL": True}, "pick+PDL=False+A=-+PIPE_DEPTH=4") == {
        "PDL": False, "PIPE_DEPTH": 4}
    with pytest.raises(ValueError, match="pick\\+KEY=VALUE"):
        EC._overridden({}, "pick+depth4")


def test_between_subtracts_the_gap_kernels_time():
    """run --between: each list's launches alternate with the gap; the timer gives the mean
    per entry of a list, and the kernel's own time comes back with the gap's taken out."""
    cost = {}

    def fn(ms):
        f = lambda: None  # noqa: E731
        cost[f] = ms
        return f

    gap = fn(0.5)
    timer = lambda lists: [sum(cost[f] for f in fl) / len(fl) for fl in lists]  # noqa: E731
    kernels, gap_ms = EC._between([[fn(3.0)] * 4, [fn(4.25)] * 4], gap=gap, timer=timer)
    assert kernels == [3.0, 4.25] and gap_ms == 0.5


def test_the_decision_is_the_records_verdict():
    """verdict.py on the committed records: PDL=False alone passes the --between rule on the
    H100, and fails the back-to-back bar (geomean of the old pick's time over the new one's
    under 0.98), so the rules keep PDL on the decode kernels of both cards."""
    from tirx_gemm.op import rules
    V = load_script("lab/decode_fixed_cost/verdict.py")
    rows = lambda name: [json.loads(x) for x in (STUDY / "records" / name).read_text().splitlines()]  # noqa: E731
    table, card = V.tally(rows("fixed_cost_h100.jsonl"))
    assert card == "h100" and [c for c, t in table.items() if V.passes(t)] == ["PDL=False"]
    gm, lowest = V.pair(rows("public_decode_pdl_h100.jsonl"))
    assert gm < 0.98 and lowest >= 0.93
    for card in ("h100", "h200"):
        assert rules.choose(1, 896, 896, "bfloat16", card=card)[1]["PDL"] is True
