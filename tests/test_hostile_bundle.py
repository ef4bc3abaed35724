"""Bundles pinned to a digest, wheels checked before pip sees them, and exports killed
between their two renames recovered by the next one. One real export of v1."""
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tirx_gemm import cli, registry
from tirx_gemm.compile import bundle

V1 = registry.get("v1", "sm_100a")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("pristine") / "bundle"
    assert bundle.export([(V1, V1.canonical, {})], out, progress=False) == 1
    return out


@pytest.fixture
def bnd(pristine, tmp_path, monkeypatch):
    monkeypatch.setenv(bundle.EXPECT_SHA256_ENV, "")  # restored (unset) after the test
    out = tmp_path / "bundle"
    shutil.copytree(pristine, out, symlinks=True)
    return out


def _one_line(capsys, rc, needle):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("tirx-gemm: error: ") \
        and needle in err[0], err


# --------------------------------------------------------------------------------------
# pinned to a digest
# --------------------------------------------------------------------------------------
def test_the_digest_is_the_manifests_sha256_and_pins_the_bundle(bnd, monkeypatch):
    digest = bundle.manifest_sha256(bnd)
    assert digest == hashlib.sha256((bnd / bundle.MANIFEST).read_bytes()).hexdigest()
    assert bundle.verify(bnd, digest)
    with pytest.raises(bundle.BundleError, match="not the bundle you exported"):
        bundle.verify(bnd, "0" * 64)
    monkeypatch.setenv(bundle.EXPECT_SHA256_ENV, "f" * 64)
    with pytest.raises(bundle.BundleError, match="not the bundle you exported"):
        bundle.verify(bnd)
    with pytest.raises(bundle.BundleError, match="not the bundle you exported"):
        bundle.find(bnd, V1, V1.canonical)
    monkeypatch.setenv(bundle.EXPECT_SHA256_ENV, "not-hex")
    with pytest.raises(ValueError, match="is not a sha256"):
        bundle.verify(bnd)


def test_a_rewritten_manifest_fails_the_pin_though_its_hashes_agree(bnd):
    """Hashes rewritten consistently pass verify() (integrity, not origin); the pin does
    not."""
    digest = bundle.manifest_sha256(bnd)
    data = json.loads((bnd / bundle.MANIFEST).read_text())
    data["kernels"][0]["registers"] = 1  # outside the binding: still verifies
    (bnd / bundle.MANIFEST).write_text(json.dumps(data))
    assert bundle.verify(bnd, expect_sha256="")
    with pytest.raises(bundle.BundleError, match="not the bundle you exported"):
        bundle.verify(bnd, digest)


def test_the_cli_checks_and_prints_the_digest(bnd, capsys):
    assert cli.main(["bundle", str(bnd)]) == 0
    assert bundle.manifest_sha256(bnd) in capsys.readouterr().out
    _one_line(capsys, cli.main(["bundle", str(bnd), "--expect-sha256", "1" * 64]),
              "not the bundle you exported")
    _one_line(capsys, cli.main(["bundle", str(bnd), "--expect-sha256", "xyz"]),
              "is not a sha256")


def test_run_with_a_wrong_pin_is_one_line(bnd, capsys):
    _one_line(capsys, cli.main(["run", "v1", "--bundle", str(bnd), "--expect-sha256",
                                "2" * 64]), "not the bundle you exported")


# --------------------------------------------------------------------------------------
# wheels
# --------------------------------------------------------------------------------------
def test_an_unlisted_wheel_is_refused(bnd, capsys):
    (bnd / "wheels").mkdir()
    (bnd / "wheels" / "apache_tvm_ffi-9-cp312-abi3-any.whl").write_bytes(b"planted")
    with pytest.raises(bundle.BundleError, match="wheels/apache_tvm_ffi-9.*not listed"):
        bundle.verify(bnd)
    _one_line(capsys, cli.main(["bundle", str(bnd), "--wheels"]), "not listed")


def test_listed_wheels_are_printed_after_the_check(bnd, capsys):
    (bnd / "wheels").mkdir()
    wheel = bnd / "wheels" / "apache_tvm_ffi-0.1-cp312-abi3-any.whl"
    wheel.write_bytes(b"a wheel")
    data = json.loads((bnd / bundle.MANIFEST).read_text())
    data["files"]["wheels/" + wheel.name] = hashlib.sha256(b"a wheel").hexdigest()
    (bnd / bundle.MANIFEST).write_text(json.dumps(data))
    assert cli.main(["bundle", str(bnd), "--wheels"]) == 0
    assert capsys.readouterr().out.split() == [str(wheel)]
    wheel.write_bytes(b"a changed wheel")
    _one_line(capsys, cli.main(["bundle", str(bnd), "--wheels"]), wheel.name)


def test_a_bundle_without_wheels_says_how_to_get_one(bnd, capsys):
    _one_line(capsys, cli.main(["bundle", str(bnd), "--wheels"]), "--ffi-wheel")


# --------------------------------------------------------------------------------------
# an export killed between its two renames
# --------------------------------------------------------------------------------------
def _aside(b: Path, kind: str, suffix: str) -> Path:
    d = b.parent / f".{b.name}.{kind}-{suffix}"
    d.mkdir()
    return d


def test_killed_after_the_first_rename_the_previous_bundle_comes_back(bnd, capsys):
    old = _aside(bnd, "old", "a1")
    os.rename(bnd, old / "bundle")
    partial = _aside(bnd, "new", "b2")  # a stage killed while copying: no manifest
    (partial / "half.so").write_bytes(b"x")
    lines = bundle.recover_interrupted(bnd)
    assert bundle.verify(bnd) and not old.exists() and not partial.exists()
    assert any("recovered the bundle" in ln for ln in lines)
    assert "recovered the bundle" in capsys.readouterr().err


def test_a_finished_stage_wins_over_the_previous_bundle(bnd, pristine):
    old = _aside(bnd, "old", "c3")
    shutil.copytree(pristine, old / "bundle")
    stage = bnd.parent / f".{bnd.name}.new-d4"
    os.rename(bnd, stage)
    (stage / "marker").touch()  # not a bundle file: tells which one came back
    data = json.loads((stage / bundle.MANIFEST).read_text())
    (stage / "marker").unlink()
    (stage / bundle.MANIFEST).write_text(json.dumps(data, indent=2))  # a distinct digest
    want = bundle.manifest_sha256(stage)
    bundle.recover_interrupted(bnd)
    assert bundle.manifest_sha256(bnd) == want and not old.exists()


def test_leftovers_beside_a_bundle_are_removed_and_the_bundle_kept(bnd):
    digest = bundle.manifest_sha256(bnd)
    old = _aside(bnd, "old", "e5")
    (old / "bundle").mkdir()
    stage = _aside(bnd, "new", "f6")
    lines = bundle.recover_interrupted(bnd)
    assert bundle.manifest_sha256(bnd) == digest
    assert not old.exists() and not stage.exists() and len(lines) == 2


def test_the_next_export_recovers_and_keeps_the_old_kernels(bnd, capsys):
    """The probe's case: a SIGKILL between the renames, then an export of another kernel
    used to ship only that kernel; now it starts from the recovered bundle."""
    before = {e["lib"] for e in bundle.verify(bnd)}
    old = _aside(bnd, "old", "g7")
    os.rename(bnd, old / "bundle")
    assert bundle.export([(V1, V1.canonical, {"dtype": "bfloat16"})], bnd,
                         progress=False) == 1
    after = {e["lib"] for e in bundle.verify(bnd)}
    assert before < after and len(after) == len(before) + 1
    assert "recovered the bundle" in capsys.readouterr().err
    assert not [p for p in bnd.parent.iterdir() if p.name.startswith(f".{bnd.name}.")]


def test_out_at_a_mount_point_is_refused_before_building(tmp_path, monkeypatch, capsys):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: str(p) == str(mnt) or real(p))
    rc = cli.main(["export", "v1", "--out", str(mnt)])
    _one_line(capsys, rc, "is a mount point")
    assert not list(mnt.iterdir())


@pytest.mark.parametrize("out", ["/proc/tirx-gemm-nowhere/b", "/proc/b"])
def test_out_where_no_folder_can_be_made_is_refused_before_building(out, capsys):
    """The staging folder is made beside the bundle after every build: a place where no
    folder can be made (here /proc, even for root) is refused first, in one line."""
    rc = cli.main(["export", "v1", "--out", out])
    _one_line(capsys, rc, "cannot make a folder in /proc")


@pytest.mark.parametrize("pyver", ["2.7", "abc", "3", "312"])
def test_an_ffi_wheel_version_that_is_no_python_is_refused_before_building(pyver, tmp_path,
                                                                         capsys):
    """pip download of the wheel runs after the builds: a bad PYVER is refused up front."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["export", "v1", "--ffi-wheel", pyver, "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"{pyver!r} is not a CPython version" in err, err
    assert not (tmp_path / "b").exists()


def test_the_gpu_host_hint_installs_the_checked_wheel():
    hint = cli.way_on("sm_90a", "v4")
    assert "pip install $(python -m tirx_gemm.cli bundle build/bundle --wheels)" in hint
    assert hint.index("--ffi-wheel 3.12") < hint.index("pip install") < hint.index("run v4")


def test_trace_takes_the_pin_for_every_bundle_it_verifies(bnd, capsys):
    """trace's --expect-sha256 pins every bundle the process verifies (bundle.verify reads
    it); the GPU-side refusal itself is tested through run above."""
    pytest.importorskip("torch")
    rc = cli.main(["trace", "v1", "--arch", "sm_100a", "--bundle", str(bnd),
                   "--expect-sha256", "3" * 64])
    assert rc == 2  # sm_100a has no timeline: refused first, in one line
    assert os.environ.get(bundle.EXPECT_SHA256_ENV) == "3" * 64
