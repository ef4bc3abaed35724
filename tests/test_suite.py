"""The shape suite: the packaged file, its validation, plans, export requests and the
benchmark's bookkeeping (the GPU parts replaced by stand-ins)."""
import json
import math
import re
import tomllib
from pathlib import Path

import pytest

from tirx_gemm import matmul

from tirx_gemm.op import suite

ROOT = Path(__file__).resolve().parent.parent

# Linear layers as (N, K) = (out-features, in-features): D = A @ B.T with B the weight
LLAMA = {
    "Llama-3-8B": {(6144, 4096), (4096, 4096), (28672, 4096), (14336, 4096), (4096, 14336)},
    "Llama-3-70B": {(10240, 8192), (8192, 8192), (57344, 8192), (28672, 8192),
                    (8192, 28672)},
}
NAMED = {(256, 256, 16384), (128, 128, 65536), (1000, 1000, 1000), (4095, 4096, 4104),
         (256, 512, 192), (128, 256, 192)}


@pytest.fixture(scope="module")
def models():
    return suite.load_suite()


def test_the_packaged_suite_covers_the_models_and_edges(models):
    assert models.name == "models" and models.path == suite.DEFAULT_SUITE
    shapes = [e.shape for e in models.entries]
    assert len(shapes) >= 24 and len(set(shapes)) == len(shapes)
    assert NAMED <= set(shapes)
    for e in models.entries:
        assert e.dtypes == ("float16", "bfloat16"), e
        assert e.N % 8 == 0 and e.K % 8 == 0, e
        assert e.model and e.layer and len(e.why) > 20, e
    llama = [e for e in models.entries if e.model in LLAMA]
    assert len(llama) >= 16
    for e in llama:  # out x in of one of the model's projections, at a token count asked for
        assert (e.N, e.K) in LLAMA[e.model], f"{e.label} is no {e.model} Linear (N=out, K=in)"
        assert e.M in (1, 8, 16, 32, 64, 128, 333, 1000, 4096, 8192), e
    for model, layers in LLAMA.items():
        assert len({(e.N, e.K) for e in llama if e.model == model}) >= 4, model
    assert {128, 1000, 4096, 8192} <= {e.M for e in llama}  # prefill
    assert {1, 8, 16, 32, 64} <= {e.M for e in llama}  # decode
    assert len(shapes) >= 40
    assert len(models.cases()) == 2 * len(shapes)


def test_the_suite_ships_as_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["tirx_gemm.op"]
    rel = suite.DEFAULT_SUITE.relative_to(ROOT / "tirx_gemm" / "op")
    assert any(rel.match(p) for p in patterns), patterns


def test_every_subpackage_ships_in_the_wheel():
    """Each folder of tirx_gemm/ with an __init__.py is listed in pyproject's packages (an
    unlisted one is left out of a built wheel: tirx_gemm.cli once was, the entry point's
    own package)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(data["tool"]["setuptools"]["packages"])
    found = {"tirx_gemm." + p.parent.relative_to(ROOT / "tirx_gemm").as_posix().replace("/", ".")
             for p in (ROOT / "tirx_gemm").glob("*/**/__init__.py")}
    assert found <= listed, sorted(found - listed)


def write(tmp_path, data) -> Path:
    p = tmp_path / "suite.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


GOOD = {"M": 128, "N": 256, "K": 64, "model": "m", "layer": "l", "why": "w"}


@pytest.mark.parametrize("data, pattern", [
    ("{not json", r"suite .*suite.json: not valid JSON"),
    ([], "the top level must be a JSON object"),
    ({"name": "x", "shapes": [GOOD], "extra": 1}, "unknown key 'extra'"),
    ({"shapes": [GOOD]}, "'name' must be a non-empty string"),
    ({"name": "x", "shapes": []}, "'shapes' must be a non-empty list"),
    ({"name": "x", "dtypes": ["float32"], "shapes": [GOOD]}, "dtype 'float32' is not one of"),
    ({"name": "x", "shapes": [GOOD, {**GOOD, "N": 260}]},
     r"entry 1 \(128x260x64\): N=260 is not a multiple of 8"),
    ({"name": "x", "shapes": [{**GOOD, "K": 0}]}, r"entry 0 \(128x256x0\): K=0 must be a "
                                                   "positive integer"),
    ({"name": "x", "shapes": [{**GOOD, "M": "128"}]}, r"entry 0: M='128' must be a positive"),
    ({"name": "x", "shapes": [{k: v for k, v in GOOD.items() if k != "model"}]},
     r"entry 0 \(128x256x64\): 'model' must be a non-empty string"),
    ({"name": "x", "shapes": [{**GOOD, "why": " "}]}, "'why' must be a non-empty string"),
    ({"name": "x", "shapes": [{**GOOD, "mnk": 1}]}, "entry 0 .*unknown key 'mnk'"),
    ({"name": "x", "shapes": [GOOD, {**GOOD, "model": "n"}]},
     r"entry 1 \(128x256x64\) repeats entry 0"),
    ({"name": "x", "shapes": [{**GOOD, "dtypes": []}]}, "dtypes must be a non-empty list"),
])
def test_bad_suites_are_refused_in_one_line_naming_the_entry(tmp_path, data, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        suite.load_suite(write(tmp_path, data))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("entry, pattern", [
    ({**GOOD, "M": 1 << 20, "N": 4096, "K": 4096},
     r"entry 1 \(1048576x4096x4096\): .*M\*K=4294967296 elements exceeds 2\^31-1"),
    ({**GOOD, "M": 1 << 16, "N": 24576, "K": 4096, "epilogues": [{"SWIGLU": True}]},
     r"entry 1 \(65536x24576x4096\): .*M\*N=3221225472 elements exceeds .*fused weight"),
])
def test_an_entry_past_the_int32_shape_limits_is_refused_naming_file_and_entry(
        tmp_path, entry, pattern):
    """The limits build --mnk and choose hold a shape to, so that export --suite and bench
    --suite refuse the entry on the build machine, not deep in a build or at run time."""
    path = write(tmp_path, {"name": "x", "shapes": [GOOD, entry]})
    with pytest.raises(ValueError, match=f"^suite {re.escape(str(path))}: {pattern}") as info:
        suite.load_suite(path)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"suite .*nope.json: cannot read it"):
        suite.load_suite(tmp_path / "nope.json")


def test_entry_dtypes_override_the_suites(tmp_path):
    s = suite.load_suite(write(tmp_path, {"name": "x", "dtypes": ["float16"], "shapes": [
        GOOD, {**GOOD, "M": 8, "dtypes": ["bfloat16", "float16"]}]}))
    assert [(e.M, dt) for e, dt in s.cases()] == [(128, "float16"), (8, "bfloat16"),
                                                 (8, "float16")]


def test_plan_for_matmul_follows_choose_case_by_case(models):
    from tirx_gemm.matmul import choose
    for arch, sms in (("sm_90a", 132), ("sm_100a", 148)):
        items = suite.plan(models, "matmul", arch, sms)
        assert len(items) == len(models.cases())
        for (e, dtype), it in zip(models.cases(), items):
            assert it.shape == e.shape and it.dtype == dtype and it.step.arch == arch
            assert (it.step.id, it.kwargs) == choose(*e.shape, dtype, arch, sms)


def test_plan_for_a_step_uses_it_everywhere(models):
    items = suite.plan(models, "v7", "sm_90a", 132)
    assert {it.step.key for it in items} == {"v7@sm_90a"}
    assert all(it.kwargs == ({"SM_COUNT": 132} if it.dtype == "float16"
                             else {"dtype": "bfloat16", "SM_COUNT": 132}) for it in items)
    assert all(it.kwargs == {"dtype": "bfloat16"} or it.kwargs == {}
               for it in suite.plan(models, "v5", "sm_100a", 148))
    with pytest.raises(ValueError, match="--target 'v42' is neither 'matmul' nor a step of sm_90a"):
        suite.plan(models, "v42", "sm_90a", 132)
    with pytest.raises(ValueError, match="sm_count=0 must be a positive int"):
        suite.plan(models, "matmul", "sm_90a", 0)


def test_export_requests_list_each_build_once(models, tmp_path):
    reqs = suite.export_requests(models, "matmul", "sm_90a", 132)
    keys = [(step.key, mnk, tuple(sorted(kw.items()))) for step, mnk, kw in reqs]
    assert len(keys) == len(set(keys))  # each build once
    # every case's kernel, at the shape it is built at (runtime M: matmul.NOMINAL_M) ...
    for it in suite.plan(models, "matmul", "sm_90a", 132):
        assert it.kwargs.get("RUNTIME_M") is True
        assert (it.step.key, matmul.build_shape(it.shape, it.kwargs),
                tuple(sorted(it.kwargs.items()))) in keys
        # ... and every kernel any other token count of that layer picks
        for step_id, kw, _, _ in matmul.variants(it.shape[1], it.shape[2], it.dtype,
                                                 "sm_90a", 132):
            assert (f"{step_id}@sm_90a", matmul.build_shape(it.shape, kw),
                    tuple(sorted(kw.items()))) in keys
    # sm_100a: v9 and v11 take M at run time (builds at NOMINAL_M, one per (step, keywords,
    # N, K, dtype)), each build once, and every kernel any token count of a layer picks
    reqs100 = suite.export_requests(models, "matmul", "sm_100a", 148)
    keys100 = [(step.key, mnk, tuple(sorted(kw.items()))) for step, mnk, kw in reqs100]
    assert reqs100 and len(keys100) == len(set(keys100))
    for step, mnk, kw in reqs100:
        assert step.id in ("v9", "v11") and kw.get("RUNTIME_M") is True
        assert mnk[0] == matmul.NOMINAL_M
    for e, dtype in models.cases():
        for step_id, kw, _, _ in matmul.variants(e.shape[1], e.shape[2], dtype, "sm_100a", 148):
            assert (f"{step_id}@sm_100a", matmul.build_shape(e.shape, kw),
                    tuple(sorted(kw.items()))) in keys100
    twice = suite.Suite("t", "", (suite.Entry(8, 8, 8, "a", "b", "c", ("float16",)),
                                  suite.Entry(8, 8, 8, "d", "e", "f", ("float16", "bfloat16"))))
    assert [(s.key, mnk, kw) for s, mnk, kw in suite.export_requests(twice, "v9", "sm_90a", 132)] \
        == [("v9@sm_90a", (matmul.NOMINAL_M, 8, 8), {"SM_COUNT": 132, "RUNTIME_M": True}),
            ("v9@sm_90a", (matmul.NOMINAL_M, 8, 8),
             {"dtype": "bfloat16", "SM_COUNT": 132, "RUNTIME_M": True})]


def rec(M, ratio, verified=True, dtype="float16"):
    return {"M": M, "N": 8, "K": 8, "step": "v9", "build_kwargs": {"SM_COUNT": 132},
            "verified": verified, "tflops": 100.0 * ratio, "torch_tflops": 100.0,
            "ratio_to_torch": ratio, "suite": {"dtype": dtype}}


def test_summary_is_the_geomean_and_minimum_of_checked_cases():
    s = suite.summarize([rec(1, 0.5), rec(2, 2.0, dtype="bfloat16"), rec(3, 0.1, False)])
    assert s["n"] == 2 and math.isclose(s["geomean_ratio"], 1.0)
    assert (s["min_ratio"], s["min_case"]) == (0.5, "1x8x8 float16")
    assert suite.summarize([rec(3, 0.1, False)])["geomean_ratio"] is None


def test_bench_suite_runs_records_and_summarizes_each_case(tmp_path, monkeypatch):
    """The orchestration with the GPU replaced: every case runs through runner.run_step
    with its step's metadata, a case whose kernel is missing is reported and skipped, and
    records land in results/suites/ with their suite field."""
    from tirx_gemm import matmul
    from tirx_gemm.run import device
    from tirx_gemm.run import loader
    from tirx_gemm.run import runner
    s = suite.load_suite(write(tmp_path, {"name": "tiny", "shapes": [
        {**GOOD, "M": 1000}, {**GOOD, "M": 8, "why": "missing in the bundle"}]}))
    monkeypatch.setattr(device, "gpu_arch", lambda: ("sm_90a", ""))
    monkeypatch.setattr(device, "check_device", lambda arch, query_smi=True: {
        "name": "NVIDIA H200", "sm_count": 132, "index": 0})

    def source(step, mnk, kw, bundle):
        assert bundle == "B"
        if mnk[0] == 8:
            raise ValueError("no kernel for it in bundle B\nsecond line")
        return Path("k.so"), {"step": step.id, "arch": step.arch, "M": mnk[0], "N": mnk[1],
                              "K": mnk[2], "kwargs": kw, "git_sha": "abc"}

    ran = []

    def run_step(kernel, meta, *, check, time, git_sha, log):
        assert check and time and git_sha == "abc" and kernel == ("loaded", "k.so")
        ran.append(meta)
        r = 0.8 if meta["kwargs"].get("dtype") else 1.25
        return {"step": meta["step"], "arch": meta["arch"], "M": meta["M"], "N": meta["N"],
                "K": meta["K"], "device": "NVIDIA H200", "build_kwargs": meta["kwargs"],
                "verified": True, "tflops": 100 * r, "torch_tflops": 100.0,
                "ratio_to_torch": r}

    monkeypatch.setattr(matmul, "kernel_source", source)
    monkeypatch.setattr(loader, "load_kernel", lambda lib: ("loaded", lib))
    monkeypatch.setattr(runner, "run_step", run_step)
    lines = []
    out = suite.bench_suite(s, "matmul", bundle="B", log=lines.append,
                            results_dir=tmp_path / "results")
    assert [(m["M"], m["kwargs"]) for m in ran] == [
        (1000, matmul.choose(1000, 256, 64, "float16", "sm_90a", 132)[1]),
        (1000, matmul.choose(1000, 256, 64, "bfloat16", "sm_90a", 132)[1])]
    assert [it.shape for it, _ in out["failed"]] == [(8, 256, 64), (8, 256, 64)]
    assert out["failed"][0][1] == "no kernel for it in bundle B"
    assert math.isclose(out["summary"]["geomean_ratio"], 1.0) and out["summary"]["n"] == 2
    saved = [json.loads(x) for x in
             (tmp_path / "results" / "suites" / "nvidia-h200.jsonl").read_text().splitlines()]
    assert [r["suite"]["dtype"] for r in saved] == ["float16", "bfloat16"]
    assert saved[0]["suite"] == {"name": "tiny", "file": s.path.name, "target": "matmul",
                                 "file_sha256": suite.suite_file_fields(s.path)["file_sha256"],
                                 "model": "m", "layer": "l", "dtype": "float16"}
    text = "\n".join(lines)
    assert out["table"] in text
    step, kw = matmul.choose(1000, 256, 64, "bfloat16", "sm_90a", 132)
    assert re.search(rf"^1000x256x64 +bfloat16 +{step} +{re.escape(suite._kw_text(kw))} +ok "
                     r"+80\.0 +100\.0 +0\.800$",
                     text, re.M)
    assert "geomean ratio to torch 1.000, min 0.800 (1000x256x64 bfloat16)" in text
    assert "NOT RUN: no kernel for it in bundle B" in text and "2 case(s) not run" in text
    assert not (tmp_path / "results" / "nvidia-h200.jsonl").exists()  # README table untouched


def test_readme_summary_takes_each_cases_latest_record(tmp_path):
    """render_summary: per device and target, the latest record of each case counts (a
    rerun replaces it), fp16 and bf16 summarized apart; geomean is of the ratios."""
    import json
    d = tmp_path / "suites"
    d.mkdir()

    def rec(M, dt, ratio, target="matmul"):
        return {"M": M, "N": 8, "K": 8, "step": "v9", "arch": "sm_90a", "device": "GPU X",
                "verified": True,
                "ratio_to_torch": ratio, "dtype": dt,
                "suite": {"target": target, "dtype": dt}}
    rows = [rec(1, "float16", 0.25), rec(1, "float16", 1.0),  # rerun: 1.0 replaces 0.25
            rec(2, "float16", 4.0), rec(1, "bfloat16", 0.5), rec(1, "float16", 0.1, "v9")]
    (d / "gpu-x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = suite.render_summary(tmp_path)
    matmul = next(line for line in text.splitlines() if "| matmul |" in line)
    # fp16: geomean(1, 4) = 2; bf16: 0.5; all: (1 * 4 * 0.5) ** (1/3)
    assert "| 2.000 / 0.500 / 1.260 |" in matmul and "3/3 checked" in matmul
    assert "0.500 (1x8x8 bfloat16)" in matmul
    assert "| v9 | 1/1" in text


def test_an_entry_s_transposed_layouts_add_v15_s_kernels_on_sm_90a(tmp_path):
    """"layouts": ["NT", "TT"] on a gemm entry: the export carries v15's kernels for those
    views (A and B majors as the layout says) on sm_90a and nothing more on sm_100a; a bad
    layout or one on an fp8 entry is refused in one line naming the entry."""
    entry = {"M": 4096, "N": 4096, "K": 4096, "model": "m", "layer": "l", "why": "w"}
    base = {"name": "t", "description": "d", "dtypes": ["bfloat16"]}
    plain = suite.load_suite(write(tmp_path, {**base, "shapes": [entry]}))
    laid = suite.load_suite(write(tmp_path, {**base, "shapes": [{**entry,
                                                                 "layouts": ["NT", "TT"]}]}))
    assert laid.entries[0].layouts == ("NT", "TT") and plain.entries[0].layouts == ()
    extra = [(st.id, kw["A_MAJOR"], kw["B_MAJOR"]) for st, _, kw in
             suite.export_requests(laid, "matmul", "sm_90a", 132) if st.id == "v15"]
    assert extra == [("v15", "K", "MN"), ("v15", "MN", "MN")]
    assert not [st for st, _, _ in suite.export_requests(plain, "matmul", "sm_90a", 132)
                if st.id == "v15"]
    assert len(suite.export_requests(laid, "matmul", "sm_100a", 148)) == \
        len(suite.export_requests(plain, "matmul", "sm_100a", 148))
    with pytest.raises(ValueError, match=r"entry 0 .*layouts=\['NN'\] must be"):
        suite.load_suite(write(tmp_path, {**base, "shapes": [{**entry, "layouts": ["NN"]}]}))
    fp8 = {**entry, "kind": "fp8", "scales": ["tensor"], "layouts": ["NT"]}
    with pytest.raises(ValueError, match="layouts are for gemm entries"):
        suite.load_suite(write(tmp_path, {**base, "shapes": [fp8]}))


def test_bench_suite_skips_grouped_entries_and_names_the_lab_scripts(tmp_path, monkeypatch):
    """A grouped entry is skipped, not failed (the CLI's exit follows "failed"): its row says
    which lab scripts time it, by a path that exists, with this suite file."""
    from tirx_gemm.run import device, loader, runner
    grouped = {"kind": "grouped", "model": "Mixtral-8x7B", "layer": "gate/up", "why": "w",
               "E": 8, "top_k": 2, "N": 28672, "K": 4096, "tokens": [1, 4096]}
    path = write(tmp_path, {"name": "mixed", "dtypes": ["bfloat16"], "shapes": [GOOD, grouped]})
    monkeypatch.setattr(device, "gpu_arch", lambda: ("sm_90a", ""))
    monkeypatch.setattr(device, "check_device", lambda arch, query_smi=True: {
        "name": "NVIDIA H200", "sm_count": 132, "index": 0})
    monkeypatch.setattr(matmul, "kernel_source", lambda step, mnk, kw, bundle: (
        Path("k.so"), {"step": step.id, "arch": step.arch, "M": mnk[0], "N": mnk[1],
                       "K": mnk[2], "kwargs": kw}))
    monkeypatch.setattr(loader, "load_kernel", lambda lib: lib)
    monkeypatch.setattr(runner, "run_step", lambda kernel, meta, **kw: {
        **{k: meta[k] for k in ("step", "arch", "M", "N", "K")}, "device": "NVIDIA H200",
        "verified": True, "tflops": 1.0, "torch_tflops": 1.0, "ratio_to_torch": 1.0})
    lines = []
    out = suite.bench_suite(path, "matmul", log=lines.append, record=False)
    assert out["failed"] == [] and len(out["records"]) == 1
    [(case, why)] = out["skipped"]
    assert case == "grouped Mixtral-8x7B gate/up" and "\n" not in why
    scripts = re.findall(r"lab/moe_grouped_gemm/\w+\.py", why)
    assert scripts == ["lab/moe_grouped_gemm/bench_grouped.py",
                       "lab/moe_grouped_gemm/bench_moe_mlp.py"]
    assert all((ROOT / s).is_file() for s in scripts)
    assert f"--suite {path}" in why and "tirx_gemm.op.grouped's benchmark" not in why
    assert f"SKIPPED: {why}" in out["table"] and "1 case(s) skipped" in out["table"]
    assert "not run" not in out["table"]
