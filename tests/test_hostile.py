"""Trust nothing it did not make. Hostile inputs, each with its outcome asserted:
no traceback, no silent accept, no foreign code run, no data lost.

Bundles (tampered, swapped between steps, symlinked, a `../` or absolute `lib`, a replaced or
planted runtime library, concurrent and failed exports), records that claim what did not run
or hold wrong types, baselines and hang-guard values. The cache's own cases (damaged and
foreign entries, work-folder locks, a detached child, bad tool timeouts, a damaged stub) are
in tests/test_hostile_cache.py. The GPU host is emulated: loading stops where CUDA would
start, so what is proved is that nothing from a refused bundle is opened before that.
"""
import errno
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tirx_gemm import registry
from tirx_gemm.compile import bundle
from tirx_gemm.report import records
from tirx_gemm.report import regress
from tirx_gemm.compile.api import BuildError

ROOT = Path(__file__).resolve().parent.parent
V1 = registry.get("v1", "sm_100a")
V4 = registry.get("v4", "sm_90a")
EDGE = (1, 264, 72)
BF16 = {"dtype": "bfloat16"}
REQS = [(V1, V1.canonical, {}), (V4, EDGE, BF16)]  # cached by tests/test_bundle.py


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("pristine") / "bundle"
    assert bundle.export(REQS, out, progress=False) == 2
    return out


@pytest.fixture
def bnd(pristine, tmp_path):
    """A fresh copy of the exported bundle, for a test to damage."""
    out = tmp_path / "bundle"
    shutil.copytree(pristine, out, symlinks=True)
    return out


def _manifest(b: Path) -> dict:
    return json.loads((b / bundle.MANIFEST).read_text())


def _write_manifest(b: Path, data: dict) -> None:
    (b / bundle.MANIFEST).write_text(json.dumps(data))


def _lib(b: Path, step: str) -> str:
    return next(e["lib"] for e in _manifest(b)["kernels"] if e["step"] == step)


from support import cli  # noqa: E402


def _refused(b: Path, needle: str, via_cli: bool = False) -> None:
    """verify() and find() (and with ``via_cli`` the CLI, in one line, exit 2) refuse ``b``
    naming ``needle``."""
    with pytest.raises(bundle.BundleError, match=needle.replace(".", r"\.")):
        bundle.verify(b)
    with pytest.raises(bundle.BundleError, match="nothing from this bundle was loaded"):
        bundle.find(b, V1, V1.canonical)
    if not via_cli:
        return
    out = cli("run", "v1", "--bundle", str(b))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "export" in lines[0], out.stderr


# --------------------------------------------------------------------------------------
# bundles
# --------------------------------------------------------------------------------------
def test_an_intact_bundle_verifies_and_binds_each_hash(pristine):
    data = _manifest(pristine)
    assert data["format"] == bundle.FORMAT
    assert set(data["files"]) == {e["lib"] for e in data["kernels"]} | {
        f"runtime/{n}" for n in bundle.RUNTIME_LIBS}
    for e in data["kernels"]:
        assert e["sha256"] == data["files"][e["lib"]] == bundle.file_sha256(pristine / e["lib"])
        assert e["binding"] == bundle.kernel_binding(e)
    assert len(bundle.verify(pristine)) == 2


def test_tampered_library_is_refused(bnd):
    lib = bnd / _lib(bnd, "v1")
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    _refused(bnd, f"{lib.name} does not match the sha256", via_cli=True)


def test_truncated_library_is_refused(bnd):
    lib = bnd / _lib(bnd, "v1")
    lib.write_bytes(lib.read_bytes()[:100])
    _refused(bnd, f"{lib.name} does not match the sha256")


def test_library_swapped_between_steps_is_refused(bnd):
    """v4's library copied over v1's file: the hash differs."""
    shutil.copyfile(bnd / _lib(bnd, "v4"), bnd / _lib(bnd, "v1"))
    _refused(bnd, f"{_lib(bnd, 'v1')} does not match the sha256")


def test_manifest_pointing_a_step_at_another_steps_library_is_refused(bnd):
    """v1's entry rewritten to name v4's library (its files hash then matches): the name,
    and the binding, say the library was built as something else."""
    data = _manifest(bnd)
    v1, v4 = (next(e for e in data["kernels"] if e["step"] == s) for s in ("v1", "v4"))
    v1["lib"], v1["sha256"] = v4["lib"], v4["sha256"]
    _write_manifest(bnd, data)
    _refused(bnd, f"{v4['lib']} is listed as v1@sm_100a 128x128x64 float16")


def test_rebound_hash_without_binding_is_refused(bnd):
    """A kernel's file and its files hash replaced consistently, its own sha256 too, but
    not the binding: refused."""
    data = _manifest(bnd)
    v1 = next(e for e in data["kernels"] if e["step"] == "v1")
    shutil.copyfile(bnd / _lib(bnd, "v4"), bnd / v1["lib"])
    v1["sha256"] = data["files"][v1["lib"]] = bundle.file_sha256(bnd / v1["lib"])
    _write_manifest(bnd, data)
    _refused(bnd, f"{v1['lib']} has a sha256 not bound to its step")


def test_symlinked_library_is_refused(bnd, tmp_path):
    lib = bnd / _lib(bnd, "v1")
    target = tmp_path / "elsewhere.so"
    shutil.copyfile(lib, target)  # same bytes: only the link is wrong
    lib.unlink()
    lib.symlink_to(target)
    _refused(bnd, f"{lib.name} is a symlink")


def test_symlinked_runtime_folder_is_refused(bnd, tmp_path):
    shutil.move(bnd / "runtime", tmp_path / "rt")
    (bnd / "runtime").symlink_to(tmp_path / "rt")
    _refused(bnd, "runtime/ is a symlink")


@pytest.mark.parametrize("lib", ["../evil.so", "/tmp/evil.so", "sub/evil.so", ".."])
def test_lib_outside_the_bundle_is_refused(bnd, lib):
    data = _manifest(bnd)
    entry = next(e for e in data["kernels"] if e["step"] == "v1")
    entry["lib"] = lib
    _write_manifest(bnd, data)
    _refused(bnd, f"{lib!r} is not a plain file name inside the bundle",
             via_cli=lib == "../evil.so")


def test_files_entry_outside_the_bundle_is_refused(bnd):
    data = _manifest(bnd)
    data["files"]["../x.so"] = "0" * 64
    _write_manifest(bnd, data)
    _refused(bnd, "'../x.so' is not a plain file name inside the bundle")


def test_bundle_without_hashes_is_refused(bnd):
    data = _manifest(bnd)
    del data["files"], data["format"]
    _write_manifest(bnd, data)
    _refused(bnd, "holds no file hashes")


PLANTED = textwrap.dedent("""
    #include <stdio.h>
    __attribute__((constructor)) static void planted(void) {
        FILE *f = fopen(MARKER, "w"); if (f) { fputs("ran", f); fclose(f); }
    }
    int tvm_planted_symbol(void) { return 1; }
""")

# emulates a GPU host: CUDA "initialises" (a no-op), then load_kernel goes on to dlopen
LOAD = textwrap.dedent("""
    import sys
    from tirx_gemm.run import loader
    loader._init_cuda_via_torch = lambda: None
    try:
        loader.load_kernel(sys.argv[1])
    except Exception as exc:
        print(type(exc).__name__ + ": " + str(exc).splitlines()[0])
""")


@pytest.fixture
def planted_lib(tmp_path):
    marker = tmp_path / "constructor-ran"
    src = tmp_path / "planted.c"
    src.write_text(PLANTED)
    so = tmp_path / "planted.so"
    subprocess.run(["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(so), str(src)],
                   check=True, capture_output=True, timeout=120)
    return so, marker


def _load_in_child(lib: Path) -> str:
    out = subprocess.run([sys.executable, "-c", LOAD, str(lib)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "TIRX_GEMM_TVM_RUNTIME_DIR": ""})
    assert "Traceback" not in out.stderr, out.stderr
    return out.stdout.strip()


def test_the_planted_library_would_run_if_loaded(planted_lib):
    """The control: the marker mechanism works, so the next tests can fail."""
    so, marker = planted_lib
    subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(so)!r})"],
                   check=True, timeout=60)
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("where", ["runtime/libtvm_runtime.so", "runtime/libcudart.so.13",
                                   "kernel"])
def test_planted_library_never_runs(bnd, planted_lib, where):
    """A replaced runtime library, one planted next to them (found through their $ORIGIN
    runpath), a kernel library replaced: refused before anything is loaded."""
    so, marker = planted_lib
    target = bnd / (_lib(bnd, "v1") if where == "kernel" else where)
    shutil.copyfile(so, target)
    said = _load_in_child(bnd / _lib(bnd, "v1"))
    assert said.startswith("BundleError: ") and target.name in said, said
    assert not marker.exists(), "the planted library's constructor ran"


def test_an_intact_bundle_gets_past_verification(bnd):
    """The same child on an intact bundle goes on to load (and fails later, without a GPU
    or TVM's runtime here, but not on verification)."""
    said = _load_in_child(bnd / _lib(bnd, "v1"))
    assert not said.startswith("BundleError"), said


# --------------------------------------------------------------------------------------
# exports: locked and atomic
# --------------------------------------------------------------------------------------
EXPORT_ONE = ("import sys; from pathlib import Path; from tirx_gemm import registry; from tirx_gemm.compile import bundle; "
              "s = registry.get(sys.argv[1], sys.argv[2]); "
              "mnk = tuple(int(x) for x in sys.argv[3].split(',')); "
              "kw = {'dtype': sys.argv[4]} if sys.argv[4] != 'float16' else {}; "
              "bundle.export([(s, mnk, kw)], Path(sys.argv[5]), progress=False)")


def test_concurrent_exports_keep_every_kernel(tmp_path):
    jobs = [("v1", "sm_100a", "128,128,64", "float16"), ("v1", "sm_100a", "128,128,64", "bfloat16"),
            ("v4", "sm_90a", "1,264,72", "bfloat16")]
    for attempt in range(3):
        out = tmp_path / f"b{attempt}"
        procs = [subprocess.Popen([sys.executable, "-c", EXPORT_ONE, *job, str(out)], cwd=ROOT,
                                  stderr=subprocess.PIPE, text=True) for job in jobs]
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0 and "Traceback" not in err, err
        kernels = bundle.verify(out)
        assert sorted((e["step"], e["dtype"]) for e in kernels) == [
            ("v1", "bfloat16"), ("v1", "float16"), ("v4", "bfloat16")], f"attempt {attempt}"
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".b{attempt}.")]


def test_a_failed_build_leaves_the_previous_bundle_intact(bnd):
    before = {p.name: p.read_bytes() for p in bnd.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match="exceeds 2\\^31-1"):  # fails before any build
        bundle.export([(V1, (1 << 20, 1 << 20, 64), {})], bnd, progress=False)
    assert {p.name: p.read_bytes() for p in bnd.iterdir() if p.is_file()} == before
    assert len(bundle.verify(bnd)) == 2


def test_a_full_disk_during_export_leaves_the_previous_bundle_intact(bnd, monkeypatch):
    before = (bnd / bundle.MANIFEST).read_bytes()
    real = bundle._copy_checked
    calls = []

    def fill_up(src, dst, want=None):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, want)

    monkeypatch.setattr(bundle, "_copy_checked", fill_up)
    with pytest.raises(BuildError) as exc:
        bundle.export([(V1, V1.canonical, BF16)], bnd, progress=False)
    msg = str(exc.value)
    assert "no space left on" in msg and "mounted at" in msg and "unchanged" in msg, msg
    assert "\n" not in msg
    assert (bnd / bundle.MANIFEST).read_bytes() == before and len(bundle.verify(bnd)) == 2
    assert not [p for p in bnd.parent.iterdir() if p.name.startswith(".bundle.")]


def test_export_keeps_earlier_kernels_and_drops_tampered_ones(bnd, capsys):
    lib = bnd / _lib(bnd, "v4")
    lib.write_bytes(b"not a library")
    bundle.export([(V1, V1.canonical, BF16)], bnd, progress=False)
    kernels = bundle.verify(bnd)
    assert sorted((e["step"], e["dtype"]) for e in kernels) == [("v1", "bfloat16"),
                                                               ("v1", "float16")]
    assert "dropping 1 kernel(s)" in capsys.readouterr().err


def test_export_refuses_a_folder_that_is_not_a_bundle(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a bundle"):
        bundle.export(REQS, mine, progress=False)
    assert (mine / "notes.txt").read_text() == "keep me"


# --------------------------------------------------------------------------------------
# records: they say only what ran, with the right types
# --------------------------------------------------------------------------------------
SIM = {"kind": "numsim", "step": "v4", "arch": "sm_100a", "M": 256, "N": 128, "K": 192,
       "device": "NumSim, CPU model of sm_100a", "kwargs": {}, "dtype": "float16",
       "numsim": "correct", "synccheck": "clean", "racecheck": "clean",
       "checks": ["numsim", "sync", "race"], "verified": True, "rel_err": 2e-4,
       "git_sha": "abc", "timestamp": "2026-01-01T00:00:00+00:00"}


def _write_jsonl(d: Path, recs, name="x.jsonl") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / name
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in recs))
    return path


def test_a_numsim_only_record_claims_no_checker(tmp_path):
    rec = {**SIM, "checks": ["numsim"], "synccheck": "skipped", "racecheck": "skipped"}
    _write_jsonl(tmp_path, [rec])
    recs = records.load_records(tmp_path)
    table = records.render_table([], [("v4", "sm_100a", "")], sim_records=recs)
    cell = next(line for line in table.splitlines() if line.startswith("| v4"))
    assert "clean" not in cell and "correct" in cell and "not run: synccheck, racecheck" in cell
    full = records.render_table([], [("v4", "sm_100a", "")], sim_records=[SIM])
    assert "correct, sync/race clean" in full


def test_a_bf16_case_checked_by_numbers_only_leans_on_its_fp16_twin(tmp_path):
    """The gate gives a bfloat16 case whose float16 twin is in the run numsim only
    (sim.cases.checks_for): the run still claims sync/race clean, through the twin; a
    bfloat16 record without such a twin (another shape) does not."""
    bf16 = {**SIM, "dtype": "bfloat16", "kwargs": {"dtype": "bfloat16"}, "checks": ["numsim"],
            "synccheck": "skipped", "racecheck": "skipped"}

    def cell(recs):
        table = records.render_table([], [("v4", "sm_100a", "")], sim_records=recs)
        return next(line for line in table.splitlines() if line.startswith("| v4"))

    assert "2/2 cases correct, sync/race clean" in cell([SIM, bf16])
    assert "not run: synccheck, racecheck" in cell([SIM, {**bf16, "K": 64}])


@pytest.mark.parametrize("change,needle", [
    ({"checks": None}, 'must list the checkers that ran in "checks"'),
    ({"checks": []}, 'must list the checkers that ran in "checks"'),
    ({"checks": ["numsim", "fast"]}, 'must list the checkers that ran in "checks"'),
    ({"checks": ["numsim"]}, 'synccheck says \'clean\' but "checks" does not list sync'),
    ({"racecheck": "race", "checks": ["numsim", "sync", "race"]},
     "verified is true but racecheck is 'race'"),
])
def test_sim_records_that_claim_what_did_not_run_are_refused(tmp_path, change, needle):
    rec = {k: v for k, v in {**SIM, **change}.items() if v is not None}
    path = _write_jsonl(tmp_path, [SIM, rec])
    with pytest.raises(ValueError, match=f"{path}:2: .*{needle}".replace("[", r"\[")):
        records.load_records(tmp_path)


GPU = {"step": "v4", "arch": "sm_90a", "M": 4096, "N": 4096, "K": 4096, "device": "NVIDIA H200",
       "verified": True, "tflops": 500.0, "ratio_to_torch": 0.7, "median_ms": 0.27,
       "timestamp": "2026-01-01T00:00:00+00:00"}


@pytest.mark.parametrize("line,needle", [
    ({**GPU, "verified": "false"}, "verified must be true or false, got 'false'"),
    ({**GPU, "verified": 1}, "verified must be true or false"),
    ({k: v for k, v in GPU.items() if k != "verified"}, "record lacks verified"),
    (json.dumps({**GPU, "tflops": math.nan}) + "\n", "tflops must be a finite number > 0"),
    ({**GPU, "tflops": -3.0}, "tflops must be a finite number > 0"),
    ({**GPU, "tflops": "500"}, "tflops must be a finite number > 0"),
    (json.dumps({**GPU, "median_ms": math.inf}) + "\n", "median_ms must be a finite"),
    ({**GPU, "M": "4096"}, "M must be positive integers"),
    ({**GPU, "M": 0}, "M must be positive integers"),
    ({**GPU, "device": 7}, "device must be a non-empty string"),
    ({**GPU, "dtype": "fp8"}, "dtype must be one of"),
    ({**GPU, "kwargs": [1]}, "kwargs must be an object"),
    ({**GPU, "rel_err": -1.0}, "rel_err must be a finite number >= 0"),
    ("[1, 2]\n", "a record must be a JSON object"),
])
def test_bad_record_types_are_refused_with_file_and_line(tmp_path, line, needle):
    path = _write_jsonl(tmp_path / "results", [GPU, line])
    with pytest.raises(ValueError, match=f"{path}:2: ") as exc:
        records.load_records(tmp_path / "results")
    assert needle in str(exc.value)
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- results:begin -->\nold\n<!-- results:end -->\n")
    out = subprocess.run([sys.executable, "scripts/render_results.py", "--results",
                          str(tmp_path / "results"), "--readme", str(readme)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{path}:2: " in out.stderr and needle in out.stderr
    assert "old" in readme.read_text(), "a bad record must leave the README untouched"


def test_records_with_wrong_types_are_not_appended(tmp_path):
    with pytest.raises(ValueError, match="verified must be true or false"):
        records.append_record({**GPU, "verified": "yes"}, tmp_path)
    with pytest.raises(ValueError, match="tflops must be a finite number > 0"):
        records.append_record({**GPU, "tflops": -1.0}, tmp_path)
    assert not list(tmp_path.iterdir())
    records.append_record({**GPU, "tflops": math.nan}, tmp_path)  # not measured: null
    assert records.load_records(tmp_path)[0]["tflops"] is None


@pytest.mark.parametrize("entries,needle", [
    ({"v4@sm_90a:4096x4096x4096": {"tflops": "fast"}}, "needs a finite tflops > 0"),
    ({"v4@sm_90a:4096x4096x4096": {"tflops": -1}}, "needs a finite tflops > 0"),
    ({"v4@sm_90a:4096x4096x4096": 5}, "needs a finite tflops > 0"),
    ({"v4": {"tflops": 5.0}}, "is not step@arch:MxNxK"),
    ([], "no 'entries' object"),
])
def test_bad_baselines_are_refused_before_any_gpu_work(tmp_path, entries, needle):
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"entries": entries}))
    with pytest.raises(ValueError, match=needle) as exc:
        regress.load_baseline(path)
    assert str(path) in str(exc.value)


def test_the_cli_reads_the_baseline_before_measuring():
    import inspect

    from tirx_gemm import cli
    src = inspect.getsource(cli.cmd_regress)
    assert src.index("regress.load_baseline(") < src.index("measure_plan(")


# --------------------------------------------------------------------------------------
# the hang guard can be widened, never switched off
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "0", "-5", "3601", "never"])
def test_the_hang_guard_cannot_be_switched_off(monkeypatch, value):
    from tirx_gemm.run import launcher
    monkeypatch.setenv(launcher.KERNEL_TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match="at most 3600"):
        launcher.kernel_timeout()


def test_the_hang_guard_can_be_widened_to_an_hour(monkeypatch):
    from tirx_gemm.run import launcher
    monkeypatch.setenv(launcher.KERNEL_TIMEOUT_ENV, "3600")
    assert launcher.kernel_timeout() == 3600.0
    monkeypatch.delenv(launcher.KERNEL_TIMEOUT_ENV)
    assert launcher.kernel_timeout() == launcher.KERNEL_TIMEOUT_S
