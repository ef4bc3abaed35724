"""GPU correctness per step (marked `gpu`): every step of the present GPU's arch, at its
canonical shape and at every test/benchmark shape of the registry, checked against the fp32
torch reference (fresh random inputs + exact small-integer inputs, output poisoned first).

Every step is also checked in bfloat16 at its canonical shape and at its shapes off the tile
grid (bfloat16 inputs, reference and tolerances of numerics; the rest as for float16).

Skipped where no GPU of the step's arch exists. Kernels come from a bundle when
TIRX_GEMM_BUNDLE names one (a GPU host without the TVM compiler), else they are built here.
Run on a GPU host:  TIRX_GEMM_BUNDLE=build/bundle python -m pytest -m gpu tests/test_gpu.py
(the bundle then holds both dtypes: `tirx-gemm export --all --arch sm_90a --shapes all
--watchdog-ms 2000`, once more with `--dtype bfloat16`)

Correctness kernels are watchdog builds (WATCHDOG_MS): a step that deadlocks traps naming
the stalled barrier instead of hanging the test run (from a bundle: its watchdog build if
exported with --watchdog-ms 2000, else the normal one). The runner's host-side guard bounds
every wait either way.
"""
import os
from pathlib import Path

import pytest
import torch

from tirx_gemm import numerics, registry
from tirx_gemm.run import device
from tirx_gemm.run import launcher
from tirx_gemm.run import loader
from tirx_gemm.run import runner

pytestmark = pytest.mark.gpu

BUNDLE = os.environ.get("TIRX_GEMM_BUNDLE")
WATCHDOG_MS = 2000  # far above any check here (the slowest, 8192^3, takes milliseconds)


def _gpu_capability():
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


CAP = _gpu_capability()


def _off_grid(mnk) -> bool:
    M, N, K = mnk
    return M % 128 != 0 or N % 128 != 0 or K % 64 != 0


# bfloat16: the canonical shape and every shape off the 128x128x64 tile grid (edges)
CASES = ([(s, mnk, "float16") for s in registry.STEPS for mnk in registry.gpu_shapes(s)]
         + [(s, mnk, "bfloat16") for s in registry.STEPS for mnk in registry.gpu_shapes(s)
            if mnk == s.canonical or _off_grid(mnk)])


def _skip_unless_arch(arch):
    if CAP is None:
        pytest.skip("no CUDA GPU visible")
    if not device.capability_matches(arch, CAP):
        pytest.skip(f"{arch} needs compute capability {device.required_capability_text(arch)}; "
                    f"this GPU is {CAP[0]}.{CAP[1]}")


def _load(step, mnk, dtype="float16"):
    if BUNDLE:
        from tirx_gemm.compile import bundle
        try:
            entry = bundle.find(Path(BUNDLE), step, mnk, watchdog_ms=WATCHDOG_MS, dtype=dtype)
        except ValueError:
            entry = bundle.find(Path(BUNDLE), step, mnk, dtype=dtype)
        return loader.load_kernel(str(Path(BUNDLE) / entry["lib"])), entry
    from tirx_gemm.compile.api import build
    from tirx_gemm.run.measure import dtype_kwargs
    r = build(step.id, *mnk, arch=step.arch, watchdog_ms=WATCHDOG_MS, **dtype_kwargs(dtype))
    return loader.load_kernel(str(r.lib_path)), {"step": r.step, "arch": r.arch, "M": r.M,
                                                 "N": r.N, "K": r.K, "kwargs": r.kwargs}


@pytest.mark.parametrize("step,mnk,dtype", CASES,
                         ids=[f"{s.key}-{'x'.join(map(str, m))}" + ("" if d == "float16" else "-bf16")
                              for s, m, d in CASES])
def test_step_correct(step, mnk, dtype):
    _skip_unless_arch(step.arch)
    kernel, meta = _load(step, mnk, dtype)
    rec = runner.run_step(kernel, meta, check=True, time=False, log=lambda m: None)
    assert rec["dtype"] == dtype
    assert rec["verified"], rec["check"]
    assert rec["rel_err"] is not None
    assert rec["rel_err"] < numerics.tolerances(dtype).max_rel_err
    assert any(c["kind"] == "int" and c["exact"] and c["ok"] for c in rec["check"])


def test_bad_inputs_never_launch():
    steps = [s for s in registry.STEPS if CAP and device.capability_matches(s.arch, CAP)]
    if not steps:
        pytest.skip("no GPU of a registered arch")
    step = steps[0]
    kernel, meta = _load(step, step.canonical)
    M, N, K = step.canonical
    dev = "cuda"
    good = dict(A=torch.randn(M, K, device=dev).half(), B=torch.randn(N, K, device=dev).half(),
                D=torch.full((M, N), float("nan"), device=dev).half())
    bad_cases = {
        "cpu": dict(good, A=good["A"].cpu()),
        "dtype": dict(good, B=good["B"].float()),
        "bf16-into-fp16": dict(good, A=good["A"].bfloat16(), B=good["B"].bfloat16(),
                               D=good["D"].bfloat16()),
        "shape": dict(good, A=torch.randn(M + 128, K, device=dev).half()),
        "non-contiguous": dict(good, A=torch.randn(K, M, device=dev).half().t()),
    }
    for name, t in bad_cases.items():
        t["D"].fill_(float("nan"))
        with pytest.raises((ValueError, TypeError)):
            launcher.launch(kernel, meta, t["A"], t["B"], t["D"])
        assert torch.isnan(good["D"].float()).all(), f"{name}: the kernel must not have run"
