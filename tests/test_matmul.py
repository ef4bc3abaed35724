"""tirx_gemm.matmul on CPU: operand validation, the step choice, bundles and the kernel cache.

Launching needs an sm_90a/sm_100a GPU (tests/test_gpu.py's territory); everything a call
decides before the launch is checked here."""
import dataclasses
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import tirx_gemm
from tirx_gemm import matmul as mm
from tirx_gemm.op import cost_model as cm, rules
from tirx_gemm import registry, spec, splitk

ROOT = Path(__file__).resolve().parents[1]
from tirx_gemm.op import suite


def ops(M=128, N=256, K=64, dtype=torch.float16):
    return torch.randn(M, K).to(dtype), torch.randn(N, K).to(dtype)


def check(a, b, out=None):
    return mm.check_operands(a, b, out, require_cuda=False)


# --------------------------------------------------------------------------------------
# the module
# --------------------------------------------------------------------------------------
def test_importing_tirx_gemm_and_matmul_imports_neither_torch_nor_tvm():
    code = ("import sys, tirx_gemm; m = tirx_gemm.matmul; m.choose(128, 256, 64); "
            "import tirx_gemm.op.suite as s; s.plan(s.load_suite(), 'matmul', 'sm_90a', 132); "
            "bad = [x for x in ('torch', 'tvm') if x in sys.modules]; "
            "assert not bad, bad; print(callable(m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_module_is_callable_and_keeps_its_names():
    assert tirx_gemm.matmul is mm
    assert callable(mm) and mm.use_bundle and mm.choose
    a, b = ops()
    with pytest.raises(ValueError, match="this machine has no CUDA GPU"):
        tirx_gemm.matmul(a, b)  # the module call is matmul(): it validates first


# --------------------------------------------------------------------------------------
# operand validation: one line each, naming the fix
# --------------------------------------------------------------------------------------
def test_valid_operands_give_the_problem():
    assert check(*ops(1000, 1000, 1000)) == (1000, 1000, 1000, "float16")
    a, b = ops(3, 8, 16, torch.bfloat16)
    assert check(a, b, torch.empty(3, 8, dtype=torch.bfloat16)) == (3, 8, 16, "bfloat16")


@pytest.mark.parametrize("case, exc, pattern", [
    ("not a tensor", TypeError, "b must be a torch.Tensor, got list"),
    ("float32", TypeError, r"a has dtype torch.float32: matmul takes torch.float16 or "
                           r"torch.bfloat16 \(convert with a.half\(\) or a.bfloat16\(\)\)"),
    ("mixed", TypeError, "a is torch.float16 but b is torch.bfloat16: the operands"),
    ("out dtype", TypeError, "a is torch.float16 but out is torch.bfloat16"),
    ("3-D", ValueError, r"a must be 2-D, got shape \(2, 128, 64\) \(flatten"),
    ("K mismatch", ValueError, "a is 128x64 but b is 256x72: matmul computes a @ b.T"),
    ("out shape", ValueError, r"out has shape \(128, 128\), expected \(128, 256\)"),
    ("transposed", ValueError, r"b is not contiguous \(strides \(1, 256\), not row-major\)"),
    ("padded rows", ValueError, r"a is not contiguous \(row stride 72 for 64 columns"),
    ("K", ValueError, r"K=100 is not a multiple of 8: the rows of a and b .* pad K with "
                      r"zeros to 104"),
    ("N", ValueError, r"N=130 is not a multiple of 8: the rows of out .* to 136"),
    ("misaligned", ValueError, r"a's data pointer is not 16-byte aligned"),
    ("grad", ValueError, r"this direct kernel call records no gradient: call "
                         r"tirx_gemm.matmul\(a, b, ...\) or tirx_gemm.nn.Linear"),
])
def test_bad_operands_are_refused_in_one_line(case, exc, pattern):
    a, b = ops()
    out = None
    if case == "not a tensor":
        b = [[1.0]]
    elif case == "float32":
        a = a.float()
    elif case == "mixed":
        b = b.bfloat16()
    elif case == "out dtype":
        out = torch.empty(128, 256, dtype=torch.bfloat16)
    elif case == "3-D":
        a = torch.randn(2, 128, 64).half()
    elif case == "K mismatch":
        b = torch.randn(256, 72).half()
    elif case == "out shape":
        out = torch.empty(128, 128, dtype=torch.float16)
    elif case == "transposed":
        b = torch.randn(64, 256).half().t()
    elif case == "padded rows":
        a = torch.randn(128, 72).half()[:, :64]
    elif case == "K":
        a, b = ops(K=100)
    elif case == "N":
        a, b = ops(N=130)
    elif case == "misaligned":  # contiguous, but 8 bytes into a 16-byte aligned buffer
        a = torch.empty(128 * 64 + 8, dtype=torch.float16)[4:4 + 128 * 64].view(128, 64)
        assert a.is_contiguous() and a.data_ptr() % 16 == 8
    elif case == "grad":
        b.requires_grad_(True)
    with pytest.raises(exc, match=pattern) as info:
        check(a, b, out)
    assert "\n" not in str(info.value)


def test_grad_inputs_pass_under_no_grad():
    a, b = ops()
    b.requires_grad_(True)
    with torch.no_grad():
        assert check(a, b) == (128, 256, 64, "float16")


def test_cpu_tensors_are_refused_by_the_full_checks():
    a, b = ops()
    # the device first, in one message: on this CPU-only machine no other advice helps
    with pytest.raises(ValueError, match=r"^a, b on cpu and this machine has no CUDA GPU "
                       r"\(torch .*\): tirx_gemm.matmul runs on an sm_90a or sm_100a GPU"):
        mm.check_operands(a, b)
    with pytest.raises(ValueError, match="a, b, out on cpu and this machine has no CUDA GPU"):
        mm.matmul(a, b, out=torch.empty(128, 256, dtype=torch.float16))
    # a CPU float32 operand hears about the device, not about .half() first
    with pytest.raises(ValueError, match="no CUDA GPU"):
        mm.check_operands(a.float(), b)


def test_cpu_tensors_on_a_gpu_machine_are_told_to_move(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    a, b = ops()
    with pytest.raises(ValueError, match=r"a is on cpu: matmul runs on a CUDA GPU \(a.cuda\(\)\)"):
        mm.check_operands(a, b)


# --------------------------------------------------------------------------------------
# choose: the step for a shape
# --------------------------------------------------------------------------------------
SMS = spec.SM_COUNT  # the default pools: 132 (H200), 148 (B200)
def rt(step_id: str, arch: str) -> dict:
    """RUNTIME_M as matmul writes it: on sm_90a v9-v12, on sm_100a v9 (NumSim-checked)."""
    return {"RUNTIME_M": True} if mm.runtime_m(step_id, arch) else {}


@pytest.mark.parametrize("arch", registry.ARCHES)
@pytest.mark.parametrize("mnk", [(8192, 28672, 4096), (4096, 4096, 4096), (8192, 8192, 28672)])
def test_big_shapes_are_data_parallel_on_the_whole_gpu(arch, mnk):
    """sm_100a: v9 by tile count. sm_90a: the model's 128-row v12 tile (v9 takes its place
    only when predicted more than cm.V9_HANDICAP faster), persistent on the whole GPU,
    M at run time, N and K at build time."""
    for dtype in ("float16", "bfloat16"):
        step, kw = mm.choose(*mnk, dtype, arch, SMS[arch])
        dt = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
        if arch == "sm_100a":
            assert (step, kw) == ("v9", {**dt, "SM_COUNT": SMS[arch], "RUNTIME_M": True})
            continue
        assert step == "v12" and kw["BLK_M"] == 128 and kw["SM_COUNT"] == SMS[arch]
        assert kw["RUNTIME_M"] is True and "RUNTIME_NK" not in kw and "SPLIT_K" not in kw
        assert cm.best(*mnk, SMS[arch]) == cm.name(128, kw["BLK_N"])


@pytest.mark.parametrize("arch", registry.ARCHES)
def test_choose_never_refuses_a_suite_shape(arch):
    for e, dtype in suite.load_suite().cases():
        for sms in (SMS[arch], 133, 2):
            step_id, kw = mm.choose(e.M, e.N, e.K, dtype, arch, sms)
            step = registry.get(step_id, arch)  # a registered step of this arch
            assert step.dtype(kw) == dtype and ("dtype" in kw) == (dtype == "bfloat16")
            pool = kw[step.sm_count_kwarg]
            assert pool % 2 == 0 and 2 <= pool <= max(2, sms)


def test_odd_sm_counts_round_down_to_whole_clusters():
    assert mm.choose(8192, 8192, 8192, "float16", "sm_100a", 147) == (
        "v9", {"SM_COUNT": 146, "RUNTIME_M": True})
    step, kw = mm.choose(8192, 8192, 8192, "float16", "sm_90a", 131)
    assert step == "v12" and kw["SM_COUNT"] == 130  # the pool every pick shares


@pytest.mark.parametrize("args, pattern", [
    ((128, 130, 64), "N=130 is not a multiple of 8: TMA needs 16-byte row strides"),
    ((128, 128, 100), "K=100 is not a multiple of 8"),
    ((0, 128, 64), "M=0 must be a positive int"),
    ((128, 128, 64, "float32"), "dtype='float32' is not supported"),
    ((128, 128, 64, "float16", "sm_80"), "arch='sm_80': matmul runs on sm_90a or sm_100a"),
    ((128, 128, 64, "float16", "sm_90a", 0), "sm_count=0 must be a positive int"),
])
def test_choose_refuses_what_no_step_takes(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        mm.choose(*args)


@pytest.mark.parametrize("arch", registry.ARCHES)
@pytest.mark.parametrize("mnk", [(256, 256, 16384), (128, 128, 65536), (128, 4096, 14336),
                                 (128, 8192, 28672)])
def test_few_tiles_with_deep_k_go_to_split_k(arch, mnk):
    sms = SMS[arch]
    if arch == "sm_90a":  # v12's SPLIT_K where rules.split_plan says: every unit resident
        step, kw = mm.choose(*mnk, "bfloat16", arch, sms)
        plan = rules.split_plan(*mnk, sms)
        if plan is None:  # the data-parallel model's tile
            assert step != "v11" and kw.get("SPLIT_K", 1) == 1
            return
        assert step == "v12" and kw["SPLIT_K"] == plan[3] >= 2 and "RUNTIME_NK" not in kw
        tiles = -(-mnk[0] // kw["BLK_M"]) * -(-mnk[1] // kw["BLK_N"])
        assert tiles * kw["SPLIT_K"] <= sms and kw["SPLIT_K"] % kw["L2_GROUP"]
        return
    variant = splitk.choose_variant(*mnk, sms, arch)
    if variant["SPLIT_K"] == 1:
        # the split's own tile (sm_90a from 128 rows: 128x64) already fills the GPU
        tiles, _ = splitk.tile_counts(*mnk, arch, splitk.split_blk_n(mnk[0], arch))
        assert tiles * 2 > sms
        return
    if rt("v11", arch):  # runtime-M kernels: the split rounded down to the menu, never a
        # multiple of the build's L2 group
        group = variant.get("L2_GROUP", mm.V11_L2_GROUP[arch])
        variant["SPLIT_K"] = max(s for s in mm.SPLIT_MENU
                                 if s <= variant["SPLIT_K"] and (s == 1 or s % group))
    assert mm.choose(*mnk, "bfloat16", arch, sms) == (
        "v11", {"dtype": "bfloat16", "SM_COUNT": sms, **rt("v11", arch), **variant})


def test_sm90a_deep_k_few_tile_shapes_split_and_the_rest_follow_the_model():
    # the sweep measured v12 at 0.09-0.31x torch on these: split K (v12's SPLIT_K, 64x128)
    for mnk in ((256, 256, 16384), (128, 128, 65536), (128, 256, 32768), (384, 128, 12288)):
        step, kw = mm.choose(*mnk, "float16", "sm_90a", 132)
        assert step == "v12" and kw["SPLIT_K"] >= 2
        assert (kw["BLK_M"], kw["BLK_N"]) in cm.SPLIT_TILES and not kw.get("SWAP_AB")
    # 128x256x192: 3 K steps, never split; the model's tile of the menu
    assert rules.split_plan(128, 256, 192) is None
    step, kw = mm.choose(128, 256, 192, "float16", "sm_90a", 132)
    assert step == "v12" and f"{kw['BLK_M']}x{kw['BLK_N']}" == cm.best(128, 256, 192)
    # a plain one-CTA tile: M at run time, N and K built in (rules.RULES' static_n_k)
    assert kw["RUNTIME_M"] is True and "RUNTIME_NK" not in kw and kw["SHIFT_LAST"]
    assert mm.build_shape((128, 256, 192), kw) == (mm.NOMINAL_M, 256, 192)
    # an odd SM count: the model and the split rule see the even pool
    assert mm.choose(256, 256, 16384, "float16", "sm_90a", 131)[1]["SM_COUNT"] == 130


def test_sm100a_runtime_m_steps_are_simulated():
    # v9's and v11's runtime-M builds are simulated (registry sim cases with RUNTIME_M)
    assert mm.runtime_m("v9", "sm_100a") and mm.runtime_m("v11", "sm_100a")
    for sid in ("v9", "v11"):
        assert any(dict(kw).get("RUNTIME_M") for _, kw in registry.get(sid, "sm_100a").sim_cases)
    step, kw = mm.choose(128, 128, 65536, "float16", "sm_100a", 148)
    assert step == "v11" and kw["RUNTIME_M"] and kw["SPLIT_K"] % mm.V11_L2_GROUP["sm_100a"]
    assert mm.build_shape((77, 128, 65536), kw) == (mm.NOMINAL_M, 128, 65536)


def test_sm100a_v9_takes_m_at_run_time_and_its_plain_build_keeps_m_an_int():
    """One build: A's and D's rows are one int32 variable M (TVM's host code binds it from
    A.shape[0] and makes the TMA descriptors per call); RUNTIME_M=False keeps the int."""
    pytest.importorskip("tvm")
    v9 = registry.get("v9", "sm_100a")
    f = v9.build_primfunc(300, 264, 136, SM_COUNT=2, RUNTIME_M=True)
    A, B, D = f.params
    m = A.shape[0]
    assert type(m).__name__ == "Var" and m.name == "M" and str(m.ty) == "int32"
    assert D.shape[0].same_as(m) and [int(x) for x in B.shape] == [264, 136]
    plain = v9.build_primfunc(300, 264, 136, SM_COUNT=2).params
    assert [int(x) for x in plain[0].shape] == [300, 136]
    assert [int(x) for x in plain[2].shape] == [300, 264]
    with pytest.raises(ValueError, match="RUNTIME_M='yes' must be True or False"):
        v9.build_primfunc(300, 264, 136, SM_COUNT=2, RUNTIME_M="yes")


def test_sm100a_keeps_the_tile_count_rule():
    # no tile menu there: split only where v9's tiles leave clusters idle and the rule splits
    assert splitk.choose_split(128, 256, 192, 148, arch="sm_100a") == 1
    assert mm.choose(128, 256, 192, "float16", "sm_100a", 148) == (
        "v9", {"SM_COUNT": 148, "RUNTIME_M": True})
    assert mm.choose(1000, 6144, 4096, "float16", "sm_100a", 148)[0] == "v9"


def test_without_a_registered_split_k_step_few_tiles_stay_data_parallel(monkeypatch):
    monkeypatch.setattr(registry, "STEPS", [s for s in registry.STEPS if s.id != "v11"])
    assert mm.choose(128, 128, 65536, "float16", "sm_90a", 132)[0] in ("v9", "v12")
    assert mm.choose(128, 128, 65536, "float16", "sm_100a", 148) == (
        "v9", {"SM_COUNT": 148, "RUNTIME_M": True})


def test_the_model_picks_the_fastest_measured_tile_within_a_few_percent():
    """The chooser's picks against the H200 sweep it was fitted to (scripts/fit_chooser.py
    --report prints the table): within 5% of the fastest measured candidate in geomean."""
    import json
    import math
    rows = [json.loads(x) for x in (ROOT / "lab/cost_model_fit/records/v12_sweep_h200.jsonl").read_text().splitlines()]
    regrets = []
    for r in rows:
        meas = {c: v["ms"] for c, v in r["candidates"].items() if v.get("ok")}
        pick = next(c for _, c in cm.rank(r["M"], r["N"], r["K"]) if c in meas)
        regrets.append(meas[pick] / min(meas.values()))
    assert math.exp(sum(map(math.log, regrets)) / len(regrets)) < 1.05


def test_the_hbm_floor_bounds_every_prediction_and_brings_the_model_closer():
    """cm.hbm_floor: no data-parallel candidate is predicted faster than its bytes at
    the sustained HBM rate allow (PDL's saving aside), and over the sweeps' kernels the
    floor lowers the model's RMS error (scripts/fit_chooser.py --report prints both)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fit_chooser", ROOT / "scripts/fit_chooser.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    samples, _ = fit.load()
    for M, N, K in ((128, 28672, 8192), (1, 8192, 8192), (4096, 4096, 4096)):
        floor = cm.hbm_floor(M, N, K)
        assert floor > 0
        assert all(t >= floor - cm.pdl_saving() - 1e-9 for t, _ in cm.rank(M, N, K))
    assert cm.predict("128x224", 128, 28672, 8192) > 100  # 119 us measured; 78 before
    assert fit.model_error(samples) < fit.model_error(samples, floor=False)



def test_the_model_figures_are_the_fit_of_the_records():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(ROOT / "scripts/fit_chooser.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_off_menu_widths_are_the_64_row_widths_of_8_and_cost_what_the_note_says():
    """fit_chooser.OFF_MENU: the 64-row entries of the lab's widths-of-8 sweep, and the pick
    figures its comment quotes are what a refit with and without them gives."""
    import importlib.util
    import re

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    sweep = load("v12_sweep", "lab/tools/v12_sweep.py")
    tw = load("tail_wave_fit", "lab/cost_model_fit/tail_wave_fit.py")
    assert tw.F.OFF_MENU == {f"{bm}x{bn}" for bm, bn in sweep.WIDTHS8_MENU if bm == 64}
    without = tw.report(0.0, *tw.F.load())[0][-2]
    off, tw.F.OFF_MENU = tw.F.OFF_MENU, frozenset()
    try:
        with_them = tw.report(0.0, *tw.F.load())[0][-2]
    finally:
        tw.F.OFF_MENU = off
    geo = [re.search(r"within ([\d.]+)x", x).group(1) for x in (with_them, without)]
    note = re.sub(r"[\s#]+", " ", (ROOT / "scripts/fit_chooser.py").read_text())
    assert f"landed {geo[0]}x from the fastest tile (geomean) against {geo[1]}x" in note


def test_the_tail_wave_figures_lesson_v12_quotes_are_the_lab_script_s_output():
    """lab/cost_model_fit/tail_wave_fit.py's stored output (lab/cost_model_fit/logs/tail_wave_fit.log) is what
    it prints from today's records, and lesson v12 quotes that log's figures."""
    import re
    import subprocess
    import sys
    script = ROOT / "lab/cost_model_fit/tail_wave_fit.py"
    runs = [subprocess.run([sys.executable, str(script), *args], capture_output=True,
                           text=True, check=True).stdout
            for args in ((), ("--g", "0,0.2,0.3", "--min-intensity", "200"))]
    assert "\n".join(runs) == (ROOT / "lab/cost_model_fit/logs/tail_wave_fit.log").read_text(), \
        "lab/cost_model_fit/logs/tail_wave_fit.log is stale: rerun the two commands of the test"
    # the report ranks with the refitted figures, and the cost model's own come back after it
    import importlib.util
    spec = importlib.util.spec_from_file_location("tail_wave_fit", script)
    tw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tw)
    fitted, seen = dict(cm.params()), {}
    real = tw.F.report
    tw.F.report = lambda *_: seen.update(cm.params())
    try:
        tw.report(0.2, *tw.F.load())
    finally:
        tw.F.report = real
    assert seen["128x168"] != fitted["128x168"] and cm.params() == fitted

    def by_g(text):  # {g: its block of lines}
        return dict(re.findall(r"^g=([\d.]+): (.*?)(?=^g=|\Z)", text, re.M | re.S))

    def figures(block):  # geomean and worst regret, RMS without and with the HBM floor
        return re.search(r"within ([\d.]+)x \(geomean\), ([\d.]+)x .*?([\d.]+)% without "
                         r"the HBM floor, ([\d.]+)% with it", block, re.S).groups()

    every, compute_bound = by_g(runs[0]), by_g(runs[1])
    lesson = re.sub(r"\s+", " ", (ROOT / "steps/lessons/v12.md").read_text())
    base, g2, g3 = figures(every["0.0"]), figures(every["0.2"]), figures(every["0.3"])
    assert f"(RMS error {base[3]}% to {g2[3]}% with the HBM floor)" in lesson
    assert f"{g2[0]}x from the fastest tile against {base[0]}x" in lesson
    moved = [ln.split()[0] for ln in every["0.2"].splitlines()
             if re.match(r"\s+\d+x\d+x\d+ ", ln)]
    assert moved == ["77x7168x2048", "2049x3584x3584", "2304x2304x2304"], moved
    assert f"it moves {moved[0]}, {moved[1]} and {moved[2]} to" in lesson
    assert f"(g = 0.3: {g3[0]}x)" in lesson
    cb = figures(compute_bound["0.2"])
    assert cb[0] == base[0] and f"raises the error ({base[3]}% to {cb[3]}%)" in lesson


# --------------------------------------------------------------------------------------
# kernels: bundles, the build path, workspace, the in-process cache
# --------------------------------------------------------------------------------------
@pytest.fixture
def fake_bundle(tmp_path):
    """A bundle that passes bundle.verify (hashes, bindings, runtime/ listed) whose files
    are stand-ins: nothing here is loaded, only looked up."""
    from tirx_gemm.compile import bundle as bd
    kwargs = {"dtype": "bfloat16", "SM_COUNT": 132}
    lib = bd.lib_name("v9", "sm_90a", 1000, 1000, 1000, kwargs)
    (tmp_path / lib).write_bytes(b"stand-in kernel")
    (tmp_path / "runtime").mkdir()
    files = {lib: bd.file_sha256(tmp_path / lib)}
    for name in bd.RUNTIME_LIBS:
        (tmp_path / "runtime" / name).write_bytes(name.encode())
        files[f"runtime/{name}"] = bd.file_sha256(tmp_path / "runtime" / name)
    entry = {"step": "v9", "arch": "sm_90a", "M": 1000, "N": 1000, "K": 1000,
             "dtype": "bfloat16", "kwargs": kwargs, "watchdog_ms": None, "lib": lib,
             "sha256": files[lib], "tvm_version": "0.27.0.post1"}
    entry["binding"] = bd.kernel_binding(entry)
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"format": bd.FORMAT, "files": files, "kernels": [entry]}))
    return tmp_path


def test_bundle_kernels_are_found_by_shape_and_keywords(fake_bundle):
    v9 = registry.get("v9", "sm_90a")
    lib, meta = mm.kernel_source(v9, (1000, 1000, 1000),
                                 {"dtype": "bfloat16", "SM_COUNT": 132}, fake_bundle)
    assert lib.parent == fake_bundle and lib.name.startswith("v9_sm_90a_1000x1000x1000")
    assert meta["kwargs"] == {"dtype": "bfloat16", "SM_COUNT": 132}
    assert meta["lesson"] == v9.lesson
    with pytest.raises(ValueError) as info:
        mm.kernel_source(v9, (1000, 1000, 1000), {"SM_COUNT": 132}, fake_bundle)
    msg = str(info.value)
    assert msg.startswith(f"no kernel for v9@sm_90a 1000x1000x1000 float16 (SM_COUNT=132) "
                          f"in bundle {fake_bundle}")
    assert f"export it with `tirx-gemm export --suite FILE --arch sm_90a --num-sms 132 " \
           f"--out {fake_bundle}`" in msg and "\n" not in msg


def test_use_bundle_and_the_environment(fake_bundle, tmp_path, monkeypatch):
    monkeypatch.delenv(mm.BUNDLE_ENV, raising=False)
    mm.use_bundle(None)
    assert mm.bundle_path() is None
    monkeypatch.setenv(mm.BUNDLE_ENV, str(tmp_path / "elsewhere"))
    assert mm.bundle_path() == tmp_path / "elsewhere"
    try:
        mm.use_bundle(fake_bundle)
        assert mm.bundle_path() == fake_bundle  # use_bundle wins over the environment
    finally:
        mm.use_bundle(None)
    assert mm.bundle_path() == tmp_path / "elsewhere"
    with pytest.raises(ValueError, match="is not a bundle: no manifest.json"):
        mm.use_bundle(tmp_path / "empty")


def test_without_tvm_or_bundle_the_error_says_how_to_get_kernels(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tvm" else real(name, *a))
    with pytest.raises(RuntimeError, match=r"cannot get v9@sm_90a 8x8x8 float16 \(SM_COUNT="
                                           r"132\): no bundle is set and the TVM compiler is "
                                           r"not installed here.*TIRX_GEMM_BUNDLE"):
        mm.kernel_source(registry.get("v9", "sm_90a"), (8, 8, 8), {"SM_COUNT": 132})


@pytest.mark.parametrize("arch", registry.ARCHES)
def test_runtime_m_kernels_are_built_once_for_every_m(arch):
    sms = SMS[arch]
    kw = mm.choose(1000, 4096, 4096, "bfloat16", arch, sms)[1]  # v9 / v12's 128x256
    assert kw["RUNTIME_M"] is True
    assert mm.build_shape((1000, 4096, 4096), kw) == (mm.NOMINAL_M, 4096, 4096)
    assert mm.build_shape((1000, 4096, 4096), {"SM_COUNT": sms}) == (1000, 4096, 4096)
    # every M of a layer is served by a handful of kernels, listed in order of M
    vs = mm.variants(4096, 4096, "bfloat16", arch, sms)
    assert vs[0][2] == 1 and all(a[3] + 1 == b[2] for a, b in zip(vs, vs[1:]))
    for step_id, kwargs, lo, hi in vs:
        assert bool(kwargs.get("RUNTIME_M")) == mm.runtime_m(step_id, arch)
        for M in {lo, (lo + hi) // 2, hi}:
            assert mm.choose(M, 4096, 4096, "bfloat16", arch, sms) == (step_id, kwargs)
    # M ranges (the swap rules switch tiles every 16 rows in places, swap-AB's token tiles
    # every 8 up to 96, v12's widths past a thousand tokens every 128 rows as the waves
    # fill) over a few dozen kernels: one swap-AB K split per split token tile (this layer's
    # decode splits K), at most 22 others
    assert len(vs) <= 96 and vs[-1][3] >= mm.VARIANTS_MAX_M
    kernels = {(s, tuple(sorted(k.items()))) for s, k, _, _ in vs}
    splits = {k for k in kernels
              if dict(k[1]).get("SWAP_AB") and dict(k[1]).get("SPLIT_K", 1) > 1}
    assert len(splits) == (len(rules.SWAP_SPLIT_TILES) if arch == "sm_90a" else 0)
    assert len(kernels - splits) <= 22
    # swap-AB's one-CTA-per-unit decode kernels (SPLIT_K=1) take the whole shape at run
    # time (one build per tile and dtype); every other v12 kernel (plain and persistent
    # swap-AB tiles, swap-AB stored by TMA, pairs, K splits) is built for the layer's N, K
    for step_id, kwargs, _, _ in vs:
        if step_id == "v12" and kwargs.get("SPLIT_K") == 1:
            assert kwargs["SWAP_AB"] and kwargs["RUNTIME_NK"] is True
            assert mm.build_shape((5, 4096, 4096), kwargs) == (
                mm.NOMINAL_M, mm.NOMINAL_N, mm.NOMINAL_K)
        elif step_id == "v12":  # N and K fixed, M at run time
            assert "RUNTIME_NK" not in kwargs and kwargs["RUNTIME_M"] is True
            assert mm.build_shape((5, 4096, 4096), kwargs) == (mm.NOMINAL_M, 4096, 4096)


def test_kernels_are_loaded_once_per_step_build_shape_keywords_and_bundle(monkeypatch):
    got = []
    monkeypatch.setattr(mm, "kernel_source",
                        lambda step, mnk, kw, bundle: got.append((step.key, mnk, dict(kw)))
                        or ("lib.so", {}))
    monkeypatch.setattr(mm, "_Loaded", lambda step, lib, meta: object())
    monkeypatch.delenv(mm.BUNDLE_ENV, raising=False)
    mm.clear_cache()
    try:
        v9 = registry.get("v9", "sm_90a")
        first = mm._load(v9, (128, 256, 64), {"SM_COUNT": 132})
        assert mm._load(v9, (128, 256, 64), {"SM_COUNT": 132}) is first
        assert mm._load(v9, (128, 256, 64), {"SM_COUNT": 132, "dtype": "bfloat16"}) is not first
        assert mm._load(v9, (128, 256, 72), {"SM_COUNT": 132}) is not first
        assert mm._load(v9, (256, 256, 64), {"SM_COUNT": 132}) is not first
        rt = mm._load(v9, (7, 256, 64), {"SM_COUNT": 132, "RUNTIME_M": True})
        assert mm._load(v9, (77, 256, 64), {"SM_COUNT": 132, "RUNTIME_M": True}) is rt
        assert len(got) == 5
    finally:
        mm.clear_cache()


def test_matmuls_row_rule_is_the_kernels():
    """matmul (TVM-free) keeps its own copy of TMA's row rule; it must be the builders'."""
    pytest.importorskip("tvm")
    from tirx_gemm import helpers
    assert mm.ROW_MULTIPLE == helpers.TMA_ROW_MULTIPLE


def test_a_run_time_shape_kernel_is_recorded_at_the_callers_shape(monkeypatch, tmp_path):
    """A v12 kernel is built and exported once, at (NOMINAL_M, NOMINAL_N, NOMINAL_K); the
    metadata the runner checks and times with must name the caller's M, N and K (the H200
    suite run once timed such kernels at N = K = 256 when it kept the nominal ones)."""
    from tirx_gemm import bundle_format as bundles
    seen = []

    def find(bundle, step, mnk, kwargs=None, **_):
        seen.append(mnk)
        return {"step": step.id, "arch": step.arch, "M": mnk[0], "N": mnk[1], "K": mnk[2],
                "kwargs": kwargs, "lib": "k.so"}
    monkeypatch.setattr(bundles, "find", find)
    v12 = registry.get("v12", "sm_90a")
    kw = mm.choose(8, 14336, 4096, "bfloat16", "sm_90a", 132)[1]  # a swap-AB unit
    assert kw.get("RUNTIME_NK") is True
    _, meta = mm.kernel_source(v12, (8, 14336, 4096), kw, bundle=tmp_path)
    assert seen == [(mm.NOMINAL_M, mm.NOMINAL_N, mm.NOMINAL_K)]
    assert (meta["M"], meta["N"], meta["K"]) == (8, 14336, 4096)


# --------------------------------------------------------------------------------------
# fused epilogues: the routing to v12, the arguments' errors, SwiGLU's weight
# --------------------------------------------------------------------------------------
from tirx_gemm import epilogue as E  # noqa: E402


@pytest.mark.parametrize("mnk", [(8192, 28672, 4096), (4096, 4096, 4096), (1, 4096, 4096),
                                 (256, 256, 16384), (77, 7168, 2048)])
@pytest.mark.parametrize("epi", [{"BIAS": "bfloat16", "ACT": "gelu"}, {"SWIGLU": True},
                                 {"OUT_DTYPE": "float32"}])
def test_an_epilogue_always_gets_a_v12_tile(mnk, epi):
    """v9 and v11 have no epilogue: every shape, even v9's and v11's, goes to v12's
    model-best tile for the kernel's GEMM (SwiGLU: 2N columns), with the keywords."""
    M, N, K = mnk
    step, kw = mm.choose(M, N, K, "bfloat16", "sm_90a", 132, epilogue=epi)
    assert step == "v12"
    assert {k: kw[k] for k in epi} == epi and kw["RUNTIME_M"] and kw["RUNTIME_NK"]
    kn = 2 * N if epi.get("SWIGLU") else N
    assert f"{kw['BLK_M']}x{kw['BLK_N']}" == cm.best_tile(M, kn, K, 132,
                                                              rules.EPILOGUE_TILE_STEP)


def test_a_forced_v12_gets_a_v12_tile_where_the_model_ranks_v10_first():
    # 8192x2304x768: in v10's band its ping-pong leads the ranking; step="v12" takes the
    # best v12 tile
    from tirx_gemm.op import cost_model as cm, rules
    assert cm.rank(8192, 2304, 768)[0][1] == cm.V10
    st, kw = mm._pick(8192, 2304, 768, "bfloat16", "sm_90a", 132, "v12")
    assert st.id == "v12" and (kw["BLK_M"], kw["BLK_N"]) == cm.tile(next(
        c for _, c in cm.rank(8192, 2304, 768) if c not in (cm.V9, cm.V10)))[:2]


def test_a_plain_epilogue_is_the_plain_choice():
    plain = mm.choose(4096, 4096, 4096, "float16")
    assert mm.choose(4096, 4096, 4096, "float16", epilogue={"ACT": None}) == plain
    assert plain[0] == "v12" and "ACT" not in plain[1]


def test_epilogues_are_refused_on_sm100a_in_one_line():
    with pytest.raises(ValueError, match="runs on sm_90a only") as e:
        mm.choose(128, 256, 64, "float16", "sm_100a", 148, epilogue={"ACT": "relu"})
    assert "\n" not in str(e.value)


def test_variants_with_an_epilogue_list_v12_tiles_with_its_keywords():
    vs = mm.variants(14336, 4096, "bfloat16", epilogue={"SWIGLU": True})
    assert vs[0][2] == 1 and vs[-1][3] >= mm.VARIANTS_MAX_M
    assert all(s == "v12" and kw["SWIGLU"] is True and kw["dtype"] == "bfloat16"
               for s, kw, _, _ in vs)
    assert all(a[3] + 1 == b[2] for a, b in zip(vs, vs[1:]))  # contiguous M ranges


@pytest.mark.parametrize("kw, exc, words", [
    ({"activation": "tanh"}, ValueError, "activation='tanh' is not supported"),
    ({"out_dtype": torch.float64}, ValueError, "out_dtype=torch.float64 is not supported"),
    ({"bias": torch.zeros(255)}, ValueError, "expected (256,)"),
    ({"bias": torch.zeros(2, 128)}, ValueError, "expected (256,)"),
    ({"bias": torch.zeros(256, dtype=torch.int64)}, TypeError, "the fused bias takes"),
    ({"bias": [0.0] * 256}, TypeError, "bias must be a 1-D torch.Tensor of N values (or "
                                       "None), got list"),
    ({"bias": True}, TypeError, "bias must be a 1-D torch.Tensor of N values (or None), got "
                                "bool"),
    ({"bias": torch.zeros(512)[::2]}, ValueError, "not contiguous"),
    ({"bias": torch.zeros(256, device="meta")}, ValueError, "bias is on meta"),
])
def test_epilogue_arguments_are_refused_in_one_line(kw, exc, words):
    a, b = ops()
    args = dict(bias=None, activation=None, out_dtype=None, swiglu=False, out=None)
    args.update(kw)
    with pytest.raises(exc) as e:
        mm._epilogue_checks(a, b, args["bias"], args["activation"], args["out_dtype"],
                            args["swiglu"], args["out"], require_cuda=False)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_epilogue_checks_give_the_output():
    a, b = ops(M=77, N=256, K=64, dtype=torch.bfloat16)
    bias = torch.zeros(256, dtype=torch.float32)
    M, N, K, dt, epi, res = mm._epilogue_checks(a, b, bias, "gelu", torch.float32, False,
                                                None, require_cuda=False)
    assert (M, N, K, dt, res) == (77, 256, 64, "bfloat16", torch.float32)
    assert epi == {"BIAS": "float32", "ACT": "gelu", "OUT_DTYPE": "float32"}
    *_, epi, res = mm._epilogue_checks(a, b, None, None, torch.bfloat16, True, None,
                                       require_cuda=False)
    assert epi == {"SWIGLU": True} and res == torch.bfloat16  # out_dtype = input: plain
    with pytest.raises(ValueError, match="multiple of 8"):  # 2N = 264: N = 132
        mm._epilogue_checks(*ops(N=264), None, None, None, True, None, require_cuda=False)
    with pytest.raises(TypeError, match="out is torch.bfloat16 but the result is torch.float32"):
        mm._epilogue_checks(a, b, None, None, torch.float32, False,
                            torch.empty(77, 256, dtype=torch.bfloat16), require_cuda=False)


def test_epilogue_calls_on_cpu_and_a_plain_step_are_refused_in_one_line():
    a, b = ops()
    with pytest.raises(ValueError, match="cpu") as e:
        mm.matmul(a, b, activation="relu")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="needs w_gate and w_up"):
        mm.swiglu(a)
    with pytest.raises(ValueError, match="not both"):
        mm.swiglu(a, b[:128], b[128:], fused=b)
    with pytest.raises(ValueError, match="2N rows"):
        mm.swiglu(a, fused=b[:24])


def test_fuse_gate_up_is_the_numpy_layout():
    g = torch.randn(24, 16, dtype=torch.bfloat16)
    u = torch.randn(24, 16, dtype=torch.bfloat16)
    f = mm.fuse_gate_up(g, u)
    assert f.shape == (48, 16) and f.is_contiguous() and f.dtype == torch.bfloat16
    want = E.interleave_gate_up_np(g.float().numpy(), u.float().numpy())
    assert torch.equal(f.float(), torch.from_numpy(want))
    assert tirx_gemm.fuse_gate_up is mm.fuse_gate_up and tirx_gemm.swiglu is mm.swiglu
    with pytest.raises(ValueError, match="multiple of 8"):
        mm.fuse_gate_up(g[:20], u[:20])
    with pytest.raises(ValueError, match="one shape, dtype and device"):
        mm.fuse_gate_up(g, u.half())
    with pytest.raises(TypeError, match="w_up must be a torch.Tensor"):
        mm.fuse_gate_up(g, None)


def test_suite_entries_list_their_epilogues_and_export_adds_their_kernels(tmp_path):
    data = {"name": "t", "dtypes": ["bfloat16"], "shapes": [
        {"M": 1000, "N": 14336, "K": 4096, "model": "m", "layer": "mlp", "why": "w",
         "epilogues": [{"SWIGLU": True}, {"BIAS": "bfloat16", "ACT": "gelu"}]}]}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(data))
    s = suite.load_suite(p)
    assert s.entries[0].epilogues == ((("SWIGLU", True),),
                                      (("ACT", "gelu"), ("BIAS", "bfloat16")))
    reqs = suite.export_requests(s, "matmul", "sm_90a", 132)
    epis = {E.tag(kw) for _, _, kw in reqs}
    assert {"plain", "swiglu", "bias_bfloat16+gelu"} <= epis
    want = {(st, tuple(sorted(kw.items()))) for st, kw, _, _ in
            mm.variants(14336, 4096, "bfloat16", epilogue={"SWIGLU": True})}
    have = {(st.id, tuple(sorted(kw.items()))) for st, _, kw in reqs}
    assert want <= have
    # v12's plain kernel of each fused one's tile: what matmul(..., step="v12") runs
    for epi in ({"SWIGLU": True}, {"BIAS": "bfloat16", "ACT": "gelu"}):
        _, kw = mm.choose(1000, 14336, 4096, "bfloat16", "sm_90a", 132, epi)
        kn = 28672 if "SWIGLU" in epi else 14336
        st, plain = mm._pick(1000, kn, 4096, "bfloat16", "sm_90a", 132, "v12")
        assert ("v12", tuple(sorted(plain.items()))) in have
        assert {k: v for k, v in kw.items() if k not in E.WITH_EPILOGUE} == plain
    # all_m false: only the entry's own M (a lab suite of exact shapes)
    data["shapes"][0]["all_m"] = False
    p.write_text(json.dumps(data))
    few = suite.export_requests(suite.load_suite(p), "matmul", "sm_90a", 132)
    key = lambda r: (r[0].id, tuple(sorted(r[2].items())))  # noqa: E731
    assert len(few) < len(reqs) and {key(r) for r in few} <= {key(r) for r in reqs}
    assert {E.tag(r[2]) for r in few} == {"plain", "swiglu", "bias_bfloat16+gelu"}
    data["shapes"][0]["all_m"] = "no"
    p.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="all_m='no' must be true or false"):
        suite.load_suite(p)
    data["shapes"][0].pop("all_m")
    for bad, words in ((["x"], "non-empty object"), ([{"ACT": "elu"}], "ACT='elu'"),
                       ([{"act": "gelu"}], "unknown key 'act'"), ([{"ACT": None}], "plain"),
                       ({"ACT": "gelu"}, "must be a list")):
        data["shapes"][0]["epilogues"] = bad
        p.write_text(json.dumps(data))
        with pytest.raises(ValueError, match="epilogue") as e:
            suite.load_suite(p)
        assert words in str(e.value) and "\n" not in str(e.value)


# v10 (ping-pong) for BIAS / ACT epilogues, behind rules.EPILOGUE_STEP
# --------------------------------------------------------------------------------------
def test_epilogue_step_is_v12_until_the_flag_is_set():
    assert rules.EPILOGUE_STEP == "v12"  # off until the H200 comparison says otherwise
    epi = {"BIAS": "bfloat16", "ACT": "gelu"}
    assert mm.choose(4096, 14336, 4096, "bfloat16", epilogue=epi)[0] == "v12"
    assert rules.epilogue_step(4096, 14336, 4096, epi) == "v12"
    with pytest.raises(ValueError, match="EPILOGUE_STEP='v9' must be one of") as e:
        rules.epilogue_step(4096, 14336, 4096, epi, setting="v9")
    assert "\n" not in str(e.value)


def test_the_v10_rule_takes_bias_act_epilogues_with_two_tiles_per_cta(monkeypatch):
    monkeypatch.setattr(rules, "EPILOGUE_STEP", "v10")
    epi = {"BIAS": "bfloat16", "ACT": "gelu"}
    for mnk in [(4096, 14336, 4096), (1000, 14336, 4096), (8192, 8192, 8192)]:
        step, kw = mm.choose(*mnk, "bfloat16", "sm_90a", 132, epilogue=epi)
        assert step == "v10"
        assert kw == {"dtype": "bfloat16", "SM_COUNT": 132, "RUNTIME_M": True, **epi}
        # the same kernel for every M of the layer: one variant past the small-M v12 tiles
        assert mm.variants(mnk[1], mnk[2], "bfloat16", epilogue=epi)[-1][:2] == (step, kw)
    # one 128x128 tile per CTA or fewer (decode, small layers): nothing to alternate, v12
    assert mm.choose(16, 14336, 4096, "bfloat16", epilogue=epi)[0] == "v12"
    assert mm.choose(1024, 1024, 1024, "bfloat16", epilogue={"ACT": "relu"})[0] == "v12"
    # epilogues v10 does not build stay on v12 at any shape
    for other in ({"SWIGLU": True}, {"OUT_DTYPE": "float32"},
                  {"BIAS": "float32", "ACT": "silu", "OUT_DTYPE": "float32"}):
        assert mm.choose(8192, 8192, 8192, "bfloat16", epilogue=other)[0] == "v12"


def test_an_epilogue_can_be_forced_onto_v10_or_v12():
    epi = {"BIAS": "bfloat16", "ACT": "silu"}
    step, kw = mm.choose_epilogue_on("v10", 1000, 14336, 4096, "bfloat16", "sm_90a", 132, epi)
    assert step == "v10" and kw["ACT"] == "silu" and kw["RUNTIME_M"] and "BLK_N" not in kw
    assert mm.choose_epilogue_on("v12", 4096, 14336, 4096, "bfloat16", "sm_90a", 132,
                                 epi) == mm.choose(4096, 14336, 4096, "bfloat16",
                                                   epilogue=epi)
    with pytest.raises(ValueError, match="step='v10' takes bias and activation only") as e:
        mm.choose_epilogue_on("v10", 1024, 1024, 1024, "bfloat16", "sm_90a", 132,
                              {"SWIGLU": True})
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="step='v9' has no fused epilogue"):
        mm.choose_epilogue_on("v9", 1024, 1024, 1024, "bfloat16", "sm_90a", 132, epi)


def test_a_suite_with_epilogue_steps_exports_their_fused_and_plain_kernels(tmp_path):
    path = ROOT / "tirx_gemm" / "op" / "suites" / "epilogue-v10.json"
    s = suite.load_suite(path)
    assert s.epilogue_steps == ("v10",)
    reqs = suite.export_requests(s, "matmul", "sm_90a", 132)
    v10 = [(shape, kw) for st, shape, kw in reqs if st.id == "v10"]
    # per (N, K): plain + gelu + silu + relu (1000 and 4096 tokens share the runtime-M ones)
    assert len(v10) == 2 * 4
    assert {kw.get("ACT") for _, kw in v10} == {None, "gelu", "silu", "relu"}
    for e in s.entries:
        for epi in e.epilogues:
            for step in ("v10", "v12"):
                st_id, kw = mm.choose_epilogue_on(step, *e.shape, "bfloat16", "sm_90a", 132,
                                                  dict(epi))
                assert any(st.id == st_id and k == kw for st, _, k in reqs)
    data = json.loads(path.read_text())
    data["epilogue_steps"] = ["v9"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'epilogue_steps' must be a list") as e:
        suite.load_suite(bad)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------------------
# transposed views (NT, TN, TT): v15 in place on sm_90a (tirx_gemm.op.layouts)
# --------------------------------------------------------------------------------------
def _fake_sm90a(monkeypatch, seen):
    """The GPU said to be sm_90a, v15's kernel a CPU product recording what it was given."""
    from tirx_gemm.op import layouts as L, matmul as M

    def fake_kernel(dtype, rows_a, rows_b, red, a_mn, b_mn, device, tune=None):
        def run(a, b, out):
            seen.append(((rows_a, rows_b, red), a_mn, b_mn, a.data_ptr(), b.data_ptr()))
            out.copy_(((a.T if a_mn else a).float() @ (b.T if b_mn else b).float().T)
                      .to(out.dtype))
        return run

    monkeypatch.setattr(M, "v15_kernel", fake_kernel)
    monkeypatch.setattr(L, "_arch_of", lambda ops, probe: "sm_90a")


@pytest.mark.parametrize("layout", ("NT", "TN", "TT"))
def test_transposed_views_run_v15_on_the_tensors_as_they_lie(monkeypatch, layout):
    from tirx_gemm.op import layouts as L
    seen = []
    _fake_sm90a(monkeypatch, seen)
    M, N, K = 24, 16, 40
    st = {"a": torch.randn(K, M).bfloat16(), "b": torch.randn(K, N).bfloat16()}  # T: stored
    rm = {"a": torch.randn(M, K).bfloat16(), "b": torch.randn(N, K).bfloat16()}  # N
    a = st["a"].t() if layout[0] == "T" else rm["a"]
    b = st["b"].t() if layout[1] == "T" else rm["b"]
    assert L.layout_of(a, b) == layout and L.has_transposed(a, b)
    want = (a.float() @ b.float().T).bfloat16()
    torch.testing.assert_close(mm.matmul(a, b), want)
    (mnk, a_mn, b_mn, pa, pb), = seen
    assert mnk == (M, N, K) and (a_mn, b_mn) == (layout[0] == "T", layout[1] == "T")
    assert (pa, pb) == (a.data_ptr(), b.data_ptr())  # the views' own storage: no copy
    out = torch.empty(M, N, dtype=torch.bfloat16)
    assert mm.matmul(a, b, out=out, step="v15") is out
    torch.testing.assert_close(out, want)
    if layout[1] == "T":  # no rows: a (0, K) is row-major whatever it views
        assert mm.matmul(a[:0], b).shape == (0, N) and len(seen) == 2


def test_layout_of_names_each_operand():
    from tirx_gemm.op import layouts as L
    a, b = torch.randn(16, 8), torch.randn(24, 8)
    assert [L.layout_of(x, y) for x, y in ((a, b), (a, b.T.contiguous().T),
                                           (a.T.contiguous().T, b))] == ["NN", "NT", "TN"]
    assert L.layout_of(a[:, ::2], b) is None and not L.has_transposed(a[:, ::2], b)
    assert not L.has_transposed(a, b) and not L.has_transposed("a", None)


def _refusal(pattern, fn):
    with pytest.raises((ValueError, TypeError), match=pattern) as e:
        fn()
    assert "\n" not in str(e.value)


def test_transposed_views_are_refused_in_one_line_where_nothing_reads_them(monkeypatch):
    from tirx_gemm.op import layouts as L
    _fake_sm90a(monkeypatch, [])
    bf = torch.bfloat16
    at, b = torch.randn(40, 24).to(bf), torch.randn(16, 40).to(bf)  # a = at.T: TN
    _refusal(r"step='v9' reads K-major operands and a is transposed \(layout TN\): pass "
             r"step=None .* or a.contiguous\(\)", lambda: mm.matmul(at.T, b, step="v9"))
    _refusal(r"a is a transposed view of a 40 x 300 tensor: its rows are M=300 .* "
             r"a.contiguous\(\)", lambda: mm.matmul(torch.randn(40, 300).to(bf).T, b))
    _refusal(r"K=36 is not a multiple of 8: b is row-major, .* \(TT takes any K\)",
             lambda: mm.matmul(at[:36].T, b[:, :36].contiguous()))
    _refusal(r"b has strides \(5, 80\): neither row-major nor the transpose",
             lambda: mm.matmul(at.T, torch.randn(40, 80).to(bf).T[::5]))
    grad = at.clone().requires_grad_()
    _refusal("direct kernel call records no gradient", lambda: mm.matmul(grad.T, b))
    _refusal(r"a is a transposed view \(layout TN\): the fused epilogues \(v12\) read K-major "
             r".* pass a.contiguous\(\), or call matmul\(a, b\)",
             lambda: mm.matmul(at.T, b, activation="relu"))
    _refusal(r"b is a transposed view \(layout NT\): the fused epilogues",
             lambda: mm.matmul(at.T.contiguous(), b.T.contiguous().T, bias=torch.zeros(16)))
    monkeypatch.setattr(L, "_arch_of", lambda ops, probe: "sm_100a")
    _refusal(r"a and b are transposed views \(layout TT\): on sm_100a matmul reads K-major "
             r"operands only .* pass a.contiguous\(\) and b.contiguous\(\)",
             lambda: mm.matmul(at.T, b.T.contiguous().T))
    monkeypatch.undo()
    _refusal(r"a, b on cpu and this machine has no CUDA GPU .* use torch.nn.functional.linear",
             lambda: mm.matmul(at.T, b))


def test_explain_says_the_layout_and_what_runs():
    text = mm.explain(4096, 4096, 4096, "bfloat16")
    assert text.startswith(rules.explain(4096, 4096, 4096, "bfloat16"))
    assert text.splitlines()[-1].startswith("  layout: NN (a and b row-major, K-major")
    for lay, majors in (("NT", "A_MAJOR=K B_MAJOR=MN"), ("TN", "A_MAJOR=MN B_MAJOR=K"),
                        ("TT", "A_MAJOR=MN B_MAJOR=MN")):
        head, card, kernel, *why = mm.explain(8192, 4096, 4096, "bfloat16",
                                              layout=lay).splitlines()
        assert head.startswith(f"8192x4096x4096 bfloat16 on sm_90a (132 SMs), layout {lay}: "
                               f"v15 RUNTIME_M=True {majors} CLUSTER=1 PDL=True")
        assert ("RUNTIME_K=True" in head) == (lay == "TT") and card.startswith("  card: ")
        assert f"layout {lay}: " in why[0] and "read in place by v15" in why[0]
        assert kernel.startswith("  kernel: tirx_v15_bf16_") and f"_{lay.lower()}" in kernel
    assert "layout TT" in mm.explain(4096, 4096, 333, layout="TT")  # any K for TT
    from tirx_gemm.op import layouts as L
    assert L.choose(4096, 4096, 4096, "bfloat16") == mm.choose(4096, 4096, 4096, "bfloat16")
    assert L.choose(4096, 4096, 4096, "bfloat16", layout="TN") == (
        "v15", L.kwargs_for("TN", "bfloat16"))
    _refusal("on sm_100a matmul reads K-major operands only",
             lambda: mm.explain(4096, 4096, 4096, arch="sm_100a", layout="NT"))
    _refusal("layout 'NX': one of NN, NT, TN, TT", lambda: mm.explain(64, 64, 64, layout="NX"))


def test_choose_takes_the_layout():
    """The public choose takes ``layout=`` as explain does: a transposed layout is v15 with
    layouts.choose's keywords; NN (the default) is rules.choose's pick, epilogue or not."""
    from tirx_gemm.op import layouts as L
    for lay in ("NT", "TN", "TT"):
        got = mm.choose(8192, 4096, 4096, "bfloat16", layout=lay)
        assert got == L.choose(8192, 4096, 4096, "bfloat16", layout=lay)
        assert got == ("v15", L.kwargs_for(lay, "bfloat16"))
    assert mm.choose(4096, 4096, 333, layout="TT")[0] == "v15"  # any K for TT
    assert mm.choose(64, 4096, 4096, "float16", "sm_90a", 114, card="h100", layout="TT") == (
        L.choose(64, 4096, 4096, "float16", "sm_90a", 114, card="h100", layout="TT"))
    epi = {"BIAS": "float16", "ACT": "gelu"}
    for args in ((8192, 4096, 4096, "bfloat16"), (5, 4096, 4096), (8192, 8192, 8192,
                 "float16", "sm_100a", 148), (64, 4096, 4096, "float16", "sm_90a", 132, epi)):
        assert mm.choose(*args) == mm.choose(*args, layout="NN") == rules.choose(*args)
    _refusal("the fused epilogues", lambda: mm.choose(64, 4096, 4096, epilogue=epi, layout="TN"))
    _refusal("layout 'NX': one of NN, NT, TN, TT", lambda: mm.choose(64, 64, 64, layout="NX"))
    _refusal("on sm_100a matmul reads K-major operands only",
             lambda: mm.choose(4096, 4096, 4096, arch="sm_100a", layout="NT"))


def test_suite_layouts_give_v15_requests_on_sm90a_only():
    """A suite entry's "layouts" (tirx_gemm.op.layouts.suite_layouts) become v15's export
    requests at the builds matmul loads for those views: M at run time; TT K at run time too."""
    from tirx_gemm.op import layouts as L
    assert L.suite_layouts(["TT", "NT", "TT"], "x") == ("TT", "NT")
    for bad in (["NN"], [], "TT", ["TX"]):
        _refusal(r"x: layouts=.* must be a non-empty list of NT, TN, TT",
                 lambda: L.suite_layouts(bad, "x"))
    reqs = L.suite_requests(4096, 4096, 1000, "bfloat16", ("NT", "TT"), "sm_90a", 132)
    assert [(st.id, shape, kw["A_MAJOR"], kw["B_MAJOR"], kw.get("RUNTIME_K")) for st, shape, kw
            in reqs] == [("v15", (mm.NOMINAL_M, 4096, 1000), "K", "MN", None),
                         ("v15", (mm.NOMINAL_M, 4096, mm.NOMINAL_K), "MN", "MN", True)]
    assert all(kw == L.kwargs_for(lay, "bfloat16") for (_, _, kw), lay in zip(reqs, ("NT", "TT")))
    assert L.suite_requests(4096, 4096, 1000, "bfloat16", ("NT",), "sm_100a", 148) == []
    _refusal("a is a transposed view of a 1000 x 300 tensor",
             lambda: L.suite_requests(300, 4096, 1000, "bfloat16", ("TN",), "sm_90a", 132))
