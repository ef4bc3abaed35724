"""`tirx-gemm export --suite FILE --card ...`: a bundle carries the kernels the chooser picks
on each named card and records the cards; matmul on a GPU host chooses for the GPU present
where the bundle was exported for it (tirx_gemm.op.cards.assumed / pick), else for the H200 the
model was fitted on, with one CardWarning line where the bundle lacks the GPU's pick. CPU only:
the builds and the GPU are stand-ins (the requests an export would build are what is checked)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from tirx_gemm import cli
from tirx_gemm.bundle_format import FORMAT, MANIFEST, lib_name
from tirx_gemm.op import cards, rules
from tirx_gemm.op.keywords import build_shape
from support import CARD_DECODE, write_card_suite

DECODE = CARD_DECODE


@pytest.fixture
def suite_file(tmp_path) -> Path:
    return write_card_suite(tmp_path / "suite.json", "cards")


@pytest.fixture
def exports(monkeypatch):
    """compile.bundle.export replaced: the requests of each export, and a bundle folder with
    a manifest listing them (as a real export writes it, less the libraries)."""
    from tirx_gemm import bundle_format
    from tirx_gemm.compile import bundle
    calls = []

    def fake_export(reqs, out, **kw):
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / MANIFEST
        old = json.loads(path.read_text())["kernels"] if path.exists() else []
        new = [{"lib": lib_name(s.id, s.arch, *mnk, kwargs)} for s, mnk, kwargs in reqs]
        path.write_text(json.dumps({"format": FORMAT, "kernels": old + new, "files": {}}))
        calls.append(list(reqs))
        return len(reqs)

    monkeypatch.setattr(bundle, "export", fake_export)
    monkeypatch.setattr(bundle_format, "manifest_sha256", lambda out: "0" * 64)
    return calls


def _argv(suite_file, out, *extra) -> list[str]:
    return ["export", "--arch", "sm_90a", "--suite", str(suite_file), "--out", str(out), *extra]


def _ids(reqs) -> set:
    return {(s.id, tuple(mnk), json.dumps(kw, sort_keys=True)) for s, mnk, kw in reqs}


def _pick_id(M, N, K, card):
    step_id, kw = rules.choose(M, N, K, "bfloat16", card=card)
    return step_id, build_shape((M, N, K), kw), json.dumps(kw, sort_keys=True)


def _one_line_refusal(capsys, argv, *words):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("value", ["h300", "H100x", "h100,a100", ""])
def test_a_card_not_in_the_table_is_refused_in_one_line_naming_the_choices(value, suite_file,
                                                                            tmp_path, capsys):
    out = tmp_path / "b"
    _one_line_refusal(capsys, _argv(suite_file, out, "--card", value),
                      "--card", "h100", "h200", "all", "auto")
    assert not out.exists()


def test_card_auto_without_a_gpu_says_so_and_names_the_cards(suite_file, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.setattr(cards, "from_device", lambda index=None: None)
    _one_line_refusal(capsys, _argv(suite_file, tmp_path / "b", "--card", "auto"),
                      "no GPU is visible here", "h100, all")


def test_card_without_a_suite_is_refused_in_one_line(tmp_path, capsys):
    rc = cli.main(["export", "v1", "--card", "h100", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "use it with --suite" in err, err
    assert not (tmp_path / "b").exists()


def test_card_on_an_arch_without_cards_is_refused_in_one_line(suite_file, tmp_path, capsys):
    rc = cli.main(["export", "--arch", "sm_100a", "--suite", str(suite_file), "--card", "h100",
                   "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "leave --card out" in err, err


def test_card_values_parse_to_card_keys():
    assert cards.card_keys("h100") == ("h100",)
    assert cards.card_keys("H200, h100,h200") == ("h200", "h100")
    assert set(cards.card_keys("all")) == set(cards.CARDS)


def test_card_h100_adds_the_kernels_the_h100_chooser_picks_for_the_suite(suite_file, tmp_path,
                                                                         exports, capsys):
    out = tmp_path / "b"
    assert cli.main(_argv(suite_file, out, "--card", "h100")) == 0
    got = _ids(exports[-1])
    for M, N, K in DECODE:
        assert _pick_id(M, N, K, "h100") in got, (M, N, K)
    # the point of the flag: a default export lacks the H100's decode picks
    assert cli.main(_argv(suite_file, tmp_path / "d")) == 0
    default = _ids(exports[-1])
    for M, N, K in DECODE:
        assert _pick_id(M, N, K, "h100") not in default, (M, N, K)
        assert _pick_id(M, N, K, "h200") in default, (M, N, K)
    assert cards.bundle_cards(out) == ("h100",)
    assert cards.bundle_cards(tmp_path / "d") == ("h200",)
    assert "the picks of h100; the bundle is for h100" in capsys.readouterr().out


def test_both_cards_in_one_export_carry_both_picks_once(suite_file, tmp_path, exports):
    out = tmp_path / "b"
    assert cli.main(_argv(suite_file, out, "--card", "h100,h200")) == 0
    reqs = exports[-1]
    assert len(_ids(reqs)) == len(reqs)  # each kernel once
    for M, N, K in DECODE:
        assert {_pick_id(M, N, K, "h100"), _pick_id(M, N, K, "h200")} <= _ids(reqs)
    assert set(cards.bundle_cards(out)) == {"h100", "h200"}


def test_the_record_holds_only_cards_every_suite_export_was_made_for(suite_file, tmp_path,
                                                                     exports):
    out = tmp_path / "b"
    assert cli.main(_argv(suite_file, out, "--card", "all")) == 0
    assert cli.main(_argv(suite_file, out, "--card", "h100")) == 0
    assert cards.bundle_cards(out) == ("h100",)
    assert cli.main(_argv(suite_file, out)) == 0  # the default: the H200's picks only
    assert cards.bundle_cards(out) == ()
    record = json.loads((out / cards.RECORD).read_text())
    assert [e["cards"] for e in record["exports"]] == [["h200", "h100"], ["h100"], ["h200"]]


def test_a_bundle_exported_before_the_record_counts_as_the_fitted_cards(tmp_path, suite_file,
                                                                        exports):
    out = tmp_path / "b"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({"format": FORMAT, "kernels": [], "files": {}}))
    assert cards.bundle_cards(out) == (cards.FITTED_ON,)
    assert cli.main(_argv(suite_file, out, "--card", "h100")) == 0
    assert cards.bundle_cards(out) == ()  # the earlier kernels were the H200's picks


def test_assuming_a_card_is_what_choose_takes_for_no_card():
    with cards.assuming("h100"):
        assert cards.resolve(None) is cards.CARDS["h100"]
        assert rules.choose(5, 4096, 4096, "bfloat16") == \
            rules.choose(5, 4096, 4096, "bfloat16", card="h100")
    assert cards.resolve(None) is cards.CARDS[cards.FITTED_ON]


# -- matmul on a GPU host: the card assumed and the one warning --------------------------------
H100 = replace(cards.CARDS["h100"], source="device properties; bandwidth from the table")


@pytest.fixture
def on_h100(monkeypatch):
    monkeypatch.setattr(cards, "from_device", lambda index=None: H100)
    monkeypatch.setattr(cards, "_warned", False)


def _bundle(path: Path, picks, card_keys) -> Path:
    path.mkdir()
    libs = []
    for M, N, K, card in picks:
        step_id, kw = rules.choose(M, N, K, "bfloat16", card=card)
        libs.append({"lib": lib_name(step_id, "sm_90a", *build_shape((M, N, K), kw), kw)})
    (path / MANIFEST).write_text(json.dumps({"format": FORMAT, "kernels": libs, "files": {}}))
    if card_keys is not None:
        cards.record_export(path, card_keys, {"suite": "test"}, None, False)
    return path


def _pick(M, N, K, bundle):
    return cards.pick(rules.choose, M, N, K, "bfloat16", "sm_90a", 132, bundle=bundle)


def test_without_a_gpu_or_a_bundle_matmul_assumes_the_fitted_card(monkeypatch, tmp_path):
    monkeypatch.setattr(cards, "from_device", lambda index=None: None)
    assert cards.assumed(tmp_path) is cards.CARDS[cards.FITTED_ON]
    monkeypatch.setattr(cards, "from_device", lambda index=None: H100)
    assert cards.assumed(None) is cards.CARDS[cards.FITTED_ON]


def test_an_h100_with_a_bundle_for_the_h200_runs_its_picks_and_warns_once(on_h100, tmp_path):
    bundle = _bundle(tmp_path / "b", [(M, N, K, "h200") for M, N, K in DECODE], None)
    card = cards.assumed(bundle)
    assert card.name == cards.CARDS["h200"].name and "the GPU is NVIDIA H100" in card.source
    assert "--card h100" in card.line()
    with pytest.warns(cards.CardWarning) as got:
        assert _pick(*DECODE[0], bundle) == rules.choose(*DECODE[0], "bfloat16")
    assert len(got) == 1 and len(str(got[0].message).splitlines()) == 1
    assert "not this NVIDIA H100" in str(got[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once a process
        assert _pick(*DECODE[1], bundle) == rules.choose(*DECODE[1], "bfloat16")


def test_an_h100_with_a_bundle_for_it_runs_the_h100_picks_without_a_warning(on_h100, tmp_path):
    bundle = _bundle(tmp_path / "b", [(M, N, K, "h100") for M, N, K in DECODE], ["h100"])
    card = cards.assumed(bundle)
    assert card.name == H100.name and "the bundle was exported for it" in card.line()
    text = rules.explain(*DECODE[0], "bfloat16", card=card)
    assert "card: NVIDIA H100 80GB HBM3" in text and "exported for it" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for M, N, K in DECODE:
            assert _pick(M, N, K, bundle) == rules.choose(M, N, K, "bfloat16", card="h100")
            assert _pick(M, N, K, bundle) != rules.choose(M, N, K, "bfloat16")


def test_a_pick_the_cards_bundle_lacks_falls_back_to_the_fitted_cards_and_warns(on_h100,
                                                                               tmp_path):
    # exported for the H100, but this shape's H100 pick is missing; the H200's is there
    bundle = _bundle(tmp_path / "b", [(*DECODE[0], "h200")], ["h100"])
    with pytest.warns(cards.CardWarning) as got:
        assert _pick(*DECODE[0], bundle) == rules.choose(*DECODE[0], "bfloat16")
    assert len(got) == 1 and "lacks the NVIDIA H100 80GB HBM3's pick" in str(got[0].message)
    # a pick neither card's kernel is there for: the GPU's, whose load error names it
    assert _pick(*DECODE[1], bundle) == rules.choose(*DECODE[1], "bfloat16", card="h100")


def test_the_suite_bench_plans_the_picks_matmul_runs_from_the_same_bundle(on_h100, tmp_path,
                                                                          suite_file):
    """`tirx-gemm bench --suite --target matmul` on an H100 with a bundle exported for it times
    the H100's picks (suite.plan through cards.pick, as matmul), not the fitted card's."""
    from tirx_gemm.op import suite
    bundle = _bundle(tmp_path / "b", [(M, N, K, "h100") for M, N, K in DECODE], ["h100"])
    one = suite_file
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [(it.step.id, it.kwargs) for it in suite.plan(one, "matmul", "sm_90a", 132, bundle)]
    assert got == [rules.choose(M, N, K, "bfloat16", card="h100") for M, N, K in DECODE]
    assert [(it.step.id, it.kwargs) for it in suite.plan(one, "matmul", "sm_90a", 132)] \
        == [rules.choose(M, N, K, "bfloat16") for M, N, K in DECODE]
