"""Bundles: what `tirx-gemm export` writes for a GPU host without TVM, and the errors a
user gets for a kernel built for another shape or arch."""
import json
from pathlib import Path

import pytest

from tirx_gemm import bundle, registry


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle")
    v1, v6 = registry.get("v1", "sm_100a"), registry.get("v6", "sm_90a")
    n = bundle.export([(v1, v1.canonical, {}), (v6, (256, 384, 576), v6.with_sm_count(132))],
                      out, progress=False)
    assert n == 2
    return out


def test_manifest_libraries_and_runtime(exported):
    kernels = json.loads((exported / bundle.MANIFEST).read_text())["kernels"]
    assert {(k["step"], k["arch"]) for k in kernels} == {("v1", "sm_100a"), ("v6", "sm_90a")}
    for k in kernels:
        lib = exported / k["lib"]
        assert lib.stat().st_size > 10_000
        assert k["tvm_version"] and k["spills"] == 0 and k["registers"]
    v6 = next(k for k in kernels if k["step"] == "v6")
    assert v6["kwargs"] == {"SM_COUNT": 132} and "SM_COUNT132" in v6["lib"]
    for lib in bundle.RUNTIME_LIBS:
        assert (exported / "runtime" / lib).stat().st_size > 100_000


def test_find_and_its_errors(exported):
    v1 = registry.get("v1", "sm_100a")
    assert bundle.find(exported, v1, (128, 128, 64))["lib"].startswith("v1_sm_100a_")
    with pytest.raises(ValueError, match=r"built for 128x128x64, not 256x128x64"):
        bundle.find(exported, v1, (256, 128, 64))
    with pytest.raises(ValueError, match=r"has v1 only for sm_100a, not sm_90a"):
        bundle.find(exported, registry.get("v1", "sm_90a"), (128, 128, 64))
    with pytest.raises(ValueError, match=r"has no v4@sm_100a"):
        bundle.find(exported, registry.get("v4", "sm_100a"), (4096, 4096, 4096))
    with pytest.raises(ValueError, match="not a bundle"):
        bundle.find(Path(exported) / "runtime", v1, (128, 128, 64))
