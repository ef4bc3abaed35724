"""`tirx-gemm bench --suite --target matmul` on a GPU host plans for the card present
(tirx_gemm.op.cards.present): without a bundle the GPU's own picks; with one, the GPU's pick
where the bundle holds it, else the fitted card's with one CardWarning line. CPU only: the GPU
and the timing are stand-ins (what the suite would time is what is checked)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from tirx_gemm import cli
from tirx_gemm.bundle_format import FORMAT, MANIFEST, lib_name
from tirx_gemm.cli import gpu
from tirx_gemm.op import cards, rules, suite
from tirx_gemm.op.keywords import build_shape
from support import CARD_DECODE, write_card_suite

DECODE = CARD_DECODE
H100 = replace(cards.CARDS["h100"], source="device properties; bandwidth from the table")


@pytest.fixture
def suite_file(tmp_path) -> Path:
    return write_card_suite(tmp_path / "suite.json", "bench_cards")


@pytest.fixture
def bench(monkeypatch):
    """The command with a stand-in GPU host: the device check passes and bench_suite plans
    the suite as the real one does (suite.plan on 132 SMs), times nothing, and returns the
    plan; each call's plan is kept."""
    plans = []

    def fake_bench_suite(path, target, *, bundle=None, log=print, results_dir="results",
                         record=True):
        items = suite.plan(path, target, "sm_90a", 132, bundle)
        plans.append([(it.step.id, it.kwargs) for it in items])
        return {"records": [{"verified": True}], "failed": [], "summary": {}, "table": ""}

    monkeypatch.setattr(gpu, "_device_or_reason", lambda arch: ({"name": "stand-in"}, None))
    monkeypatch.setattr(suite, "bench_suite", fake_bench_suite)
    monkeypatch.setattr(cards, "_warned", False)
    return plans


def _run(suite_file, *extra) -> int:
    return cli.main(["bench", "--suite", str(suite_file), "--target", "matmul",
                     "--arch", "sm_90a", *extra])


def _picks(card):
    return [rules.choose(M, N, K, "bfloat16", card=card) for M, N, K in DECODE]


def _bundle(path: Path, card, record) -> Path:
    path.mkdir()
    libs = [{"lib": lib_name(s, "sm_90a", *build_shape((M, N, K), kw), kw)}
            for (M, N, K), (s, kw) in zip(DECODE, _picks(card))]
    (path / MANIFEST).write_text(json.dumps({"format": FORMAT, "kernels": libs, "files": {}}))
    cards.record_export(path, record, {"suite": "test"}, None, False)
    return path


def test_the_two_cards_pick_differently_on_these_shapes():
    assert _picks("h100") != _picks("h200")  # else the tests below would prove nothing


def test_without_a_bundle_an_h100_host_plans_the_h100_picks_and_says_so(bench, suite_file,
                                                                         monkeypatch, capsys):
    monkeypatch.setattr(cards, "from_device", lambda index=None: H100)
    assert _run(suite_file) == 0
    assert bench == [_picks("h100")]
    assert "card: NVIDIA H100 80GB HBM3: 132 SMs" in capsys.readouterr().out
    assert cards.resolve(None) is cards.CARDS[cards.FITTED_ON]  # only inside the command


def test_an_h100_host_plans_its_picks_from_a_bundle_exported_for_the_h200_that_holds_them(
        bench, suite_file, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cards, "from_device", lambda index=None: H100)
    bundle = _bundle(tmp_path / "b", "h100", ["h200"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _run(suite_file, "--bundle", str(bundle)) == 0
    assert bench == [_picks("h100")]
    assert "planned for the GPU present" in capsys.readouterr().out


def test_a_bundle_without_the_h100_picks_runs_the_fitted_cards_with_one_warning(
        bench, suite_file, monkeypatch, tmp_path):
    monkeypatch.setattr(cards, "from_device", lambda index=None: H100)
    bundle = _bundle(tmp_path / "b", "h200", ["h200"])
    with pytest.warns(cards.CardWarning) as got:
        assert _run(suite_file, "--bundle", str(bundle)) == 0
    assert bench == [_picks("h200")]
    assert len(got) == 1 and "lacks the NVIDIA H100 80GB HBM3's pick" in str(got[0].message)


def test_an_h200_host_plans_as_before(bench, suite_file, monkeypatch):
    monkeypatch.setattr(cards, "from_device",
                        lambda index=None: replace(cards.CARDS["h200"], source="device"))
    assert _run(suite_file) == 0
    assert bench == [_picks("h200")]


def test_a_fixed_step_target_prints_no_card_line(bench, suite_file, monkeypatch, capsys):
    monkeypatch.setattr(cards, "from_device", lambda index=None: H100)
    assert cli.main(["bench", "--suite", str(suite_file), "--target", "v9",
                     "--arch", "sm_90a"]) == 0
    assert "card:" not in capsys.readouterr().out
