"""Bundles: what `tirx-gemm export` writes for a GPU host without TVM, and the errors a
user gets for a kernel built for another shape or arch."""
import json
from pathlib import Path

import pytest

from tirx_gemm import registry
from tirx_gemm.compile import bundle


BF16 = {"dtype": "bfloat16"}
EDGE = (1, 264, 72)  # one row; N and K multiples of 8 only (a v4+ shape off every tile grid)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle")
    v1, v6 = registry.get("v1", "sm_100a"), registry.get("v6", "sm_90a")
    v4 = registry.get("v4", "sm_90a")
    n = bundle.export([(v1, v1.canonical, {}), (v6, (256, 384, 576), v6.with_sm_count(132)),
                       (v1, v1.canonical, BF16), (v4, EDGE, BF16)],
                      out, progress=False)
    assert n == 4
    return out


def test_manifest_libraries_and_runtime(exported):
    kernels = json.loads((exported / bundle.MANIFEST).read_text())["kernels"]
    assert {(k["step"], k["arch"]) for k in kernels} == {("v1", "sm_100a"), ("v6", "sm_90a"),
                                                        ("v4", "sm_90a")}
    for k in kernels:
        lib = exported / k["lib"]
        assert lib.stat().st_size > 10_000
        assert k["tvm_version"] and k["spills"] == 0 and k["registers"]
    v6 = next(k for k in kernels if k["step"] == "v6")
    assert v6["kwargs"] == {"SM_COUNT": 132} and "SM_COUNT132" in v6["lib"]
    assert v6["dtype"] == "float16" and "dtype" not in v6["lib"]
    bf = [k for k in kernels if k["dtype"] == "bfloat16"]
    assert {(k["step"], k["M"], k["N"], k["K"]) for k in bf} == {("v1", 128, 128, 64),
                                                                 ("v4", *EDGE)}
    assert all(k["kwargs"] == BF16 and "_dtypebfloat16" in k["lib"] for k in bf)
    for lib in bundle.RUNTIME_LIBS:
        assert (exported / "runtime" / lib).stat().st_size > 100_000


def test_find_and_its_errors(exported):
    v1 = registry.get("v1", "sm_100a")
    assert bundle.find(exported, v1, (128, 128, 64))["lib"].startswith("v1_sm_100a_")
    with pytest.raises(ValueError, match=r"built for 128x128x64, not 256x128x64"):
        bundle.find(exported, v1, (256, 128, 64))
    with pytest.raises(ValueError, match=r"has v1 only for sm_100a, not sm_90a"):
        bundle.find(exported, registry.get("v1", "sm_90a"), (128, 128, 64))
    with pytest.raises(ValueError, match=r"has no v5@sm_100a"):
        bundle.find(exported, registry.get("v5", "sm_100a"), (4096, 4096, 4096))
    with pytest.raises(ValueError, match="not a bundle"):
        bundle.find(Path(exported) / "runtime", v1, (128, 128, 64))


def test_a_refused_or_malformed_digest_pin_is_not_reported_as_a_missing_kernel(
        exported, monkeypatch):
    """tirx_gemm.matmul tells "no such kernel: export it" (KernelNotInBundle) from a bundle
    that must not be used: a pin that does not match, or is not a digest, is neither."""
    from tirx_gemm import bundle_format
    v1 = registry.get("v1", "sm_100a")
    monkeypatch.setenv(bundle_format.EXPECT_SHA256_ENV, "ab" * 32)
    with pytest.raises(bundle_format.BundleError, match=r"not the (ab)+ pinned by") as e:
        bundle.find(exported, v1, (128, 128, 64))
    assert not isinstance(e.value, bundle_format.KernelNotInBundle)
    monkeypatch.setenv(bundle_format.EXPECT_SHA256_ENV, "abc")
    with pytest.raises(ValueError, match=r"'abc' is not a sha256") as e:
        bundle.find(exported, v1, (128, 128, 64))
    assert not isinstance(e.value, bundle_format.KernelNotInBundle)
    monkeypatch.delenv(bundle_format.EXPECT_SHA256_ENV)
    with pytest.raises(bundle_format.KernelNotInBundle):
        bundle.find(exported, v1, (256, 128, 64))


def test_find_matches_the_dtype(exported):
    v1, v4 = registry.get("v1", "sm_100a"), registry.get("v4", "sm_90a")
    fp16 = bundle.find(exported, v1, (128, 128, 64))
    bf16 = bundle.find(exported, v1, (128, 128, 64), dtype="bfloat16")
    assert fp16["kwargs"] == {} and bf16["kwargs"] == BF16 and fp16["lib"] != bf16["lib"]
    assert bundle.find(exported, v1, (128, 128, 64), kwargs=BF16) == bf16
    assert bundle.find(exported, v1, (128, 128, 64), kwargs={}) == fp16
    assert bundle.find(exported, v4, EDGE, dtype="bfloat16")["lib"].startswith("v4_sm_90a_1x264x72")
    with pytest.raises(ValueError, match=r"has v4@sm_90a at 1x264x72 only in bfloat16, not "
                                         r"float16 \(export with --dtype float16\)"):
        bundle.find(exported, v4, EDGE)
    with pytest.raises(ValueError, match="contradicts"):
        bundle.find(exported, v4, EDGE, kwargs={}, dtype="bfloat16")


def test_shapes_for_takes_registry_lists_and_explicit_shapes():
    v4 = registry.get("v4", "sm_90a")
    assert bundle.shapes_for(v4, "canonical") == [v4.canonical]
    assert bundle.shapes_for(v4, [(1, 264, 72), (1000, 1000, 1000)]) == [EDGE, (1000, 1000, 1000)]
    assert bundle.shapes_for(v4, "bench", (5, 8, 8)) == [(5, 8, 8)]


def test_records_name_the_code_the_bundle_was_exported_from(exported, monkeypatch):
    # a device copy's git state can be older than its files: a record made from a bundle
    # names the export's revision (what the kernels are), and TIRX_GEMM_GIT_SHA overrides git
    from tirx_gemm import bundle_format, gitinfo
    shas = {k["git_sha"] for k in json.loads((exported / bundle.MANIFEST).read_text())["kernels"]}
    assert len(shas) == 1 and bundle_format.code_git_sha(exported) == shas.pop()
    monkeypatch.setenv(gitinfo.SHA_ENV, "0123abc-dirty")
    assert gitinfo.git_sha() == "0123abc-dirty"
    monkeypatch.setenv(gitinfo.SHA_ENV, "")
    assert gitinfo.git_sha() != ""
    monkeypatch.setenv(gitinfo.SHA_ENV, "HEAD")
    with pytest.raises(ValueError, match="TIRX_GEMM_GIT_SHA='HEAD' must be a git commit"):
        gitinfo.git_sha()
