"""The op's kernel caches (tirx_gemm/op/launch_site.py's registry): tirx_gemm.matmul.clear_cache
forgets every one of them -- matmul's own, the transposed calls' (op.layouts), the backward's
(op.act_grad, op.act_save) -- so a bundle re-exported at the same path is read again; use_bundle
drops the calls seen only. On CPU: loaders stand in for the GPU."""
import ast
from pathlib import Path

import pytest
import torch

from tirx_gemm import matmul as mm
from tirx_gemm.op import act_grad, act_save, launch_site, layouts

OP = Path(__file__).resolve().parents[1] / "tirx_gemm" / "op"
CACHES = {"matmul._kernels": mm._kernels, "layouts._layout_kernels": layouts._layout_kernels,
          "act_grad._kernels": act_grad._kernels, "act_save._kernels": act_save._kernels}


@pytest.fixture
def clean():
    mm.clear_cache()
    yield
    mm.clear_cache()


def test_each_kernel_cache_is_registered_once():
    for name, cache in CACHES.items():
        assert sum(c is cache for c in launch_site.KERNEL_CACHES) == 1, name
    assert sum(c is mm._calls for c in launch_site.CALL_CACHES) == 1


# the other ops' kernel caches, each emptied by that op's own clear_cache
OWN_CLEAR = {"fp8.py": "clear_cache", "grouped_kernels.py": "clear"}


def test_every_module_level_kernel_cache_of_the_op_registers():
    """A module-level ``*_kernels`` dict under tirx_gemm/op/ is made by new_cache (else
    matmul's clear_cache would keep it), except the other ops' (:data:`OWN_CLEAR`)."""
    found = []
    for name, clear in OWN_CLEAR.items():
        assert f"def {clear}() -> None:" in (OP / name).read_text(encoding="utf-8"), name
    for path in sorted(p for p in OP.glob("*.py") if p.name not in OWN_CLEAR):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                if any(n.endswith("_kernels") for n in names) and isinstance(node.value,
                                                                             ast.Dict):
                    found.append(f"{path.name}: {names}")
    assert not found, "kernel caches clear_cache does not reach:\n" + "\n".join(found)


def test_clear_cache_empties_every_cache(clean):
    for name, cache in CACHES.items():
        cache[("sentinel", name)] = object()
    act_save._kernels[("miss",)] = None  # a kernel found missing: the recompute path
    mm._calls["sentinel"] = object()
    mm.clear_cache()
    assert not mm._calls
    for name, cache in CACHES.items():
        assert not cache, name


def test_use_bundle_drops_the_calls_and_keeps_the_kernels(clean, monkeypatch):
    monkeypatch.setattr(mm, "_bundle_override", None)
    mm._kernels["sentinel"] = kept = object()
    layouts._layout_kernels["sentinel"] = kept
    mm._calls["sentinel"] = object()
    mm.use_bundle(None)
    assert not mm._calls
    assert mm._kernels["sentinel"] is kept and layouts._layout_kernels["sentinel"] is kept


class _Loaded:
    def __init__(self, kernel):
        self.kernel = kernel


@pytest.fixture
def loads(clean, monkeypatch):
    """mm._load stood in: each load returns a fresh kernel object (what a re-exported bundle's
    library would be); the list holds the step ids loaded."""
    got = []

    def load(step, mnk, kw):
        got.append(step.id)
        return _Loaded(object())

    monkeypatch.setattr(mm, "_load", load)
    monkeypatch.setattr(mm, "_gpu_arch", lambda device: ("sm_90a", 132))
    monkeypatch.setattr(mm, "_bundle_override", Path("/nonexistent/bundle"))
    return got


def test_a_transposed_calls_kernel_is_loaded_again_after_clear_cache(loads):
    first = mm.v15_kernel(torch.float16, 256, 512, 128, True, True, "cpu")
    assert mm.v15_kernel(torch.float16, 256, 512, 128, True, True, "cpu") is first
    mm.clear_cache()
    again = mm.v15_kernel(torch.float16, 256, 512, 128, True, True, "cpu")
    assert again is not first and loads == ["v15", "v15"]


def test_the_backwards_kernels_are_loaded_again_after_clear_cache(loads):
    first = act_grad.kernel(torch.float16, 256, 512, 128, "gelu", True, "cpu")
    assert act_grad.kernel(torch.float16, 256, 512, 128, "gelu", True, "cpu") is first
    mm.clear_cache()
    assert act_grad.kernel(torch.float16, 256, 512, 128, "gelu", True, "cpu") is not first
    assert loads == ["v15", "v15"]


def test_a_missing_act_save_kernel_is_looked_for_again_after_clear_cache(loads, monkeypatch):
    """act_save remembers a miss (the recompute path): after the bundle is re-exported with the
    kernel, clear_cache makes the next call find it."""
    def missing(step, mnk, kw):
        raise ValueError("no kernel for v15 in bundle")

    monkeypatch.setattr(mm, "_load", missing)
    assert act_save.kernel(torch.float16, 256, 512, 128, "gelu", False, "cpu") is None
    monkeypatch.setattr(mm, "_load", lambda step, mnk, kw: _Loaded("found"))
    assert act_save.kernel(torch.float16, 256, 512, 128, "gelu", False, "cpu") is None  # kept
    mm.clear_cache()
    assert act_save.kernel(torch.float16, 256, 512, 128, "gelu", False, "cpu") == "found"
