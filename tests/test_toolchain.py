"""The CUDA toolchain comes from the nvidia-* wheels that `pip install -e .`
installs; a system CUDA is used only with TIRX_GEMM_SYSTEM_CUDA=1; compiling needs no torch.

The full proof (a fresh venv, every step built where no system CUDA is visible, the output
compared byte for byte with a system CUDA's) is scripts/check_wheel_toolchain.sh; here one
step is built that way, in a mount namespace that hides /usr/local/cuda* where unshare works.
"""
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tirx_gemm.compile import toolchain as B
from tirx_gemm.compile.procs import BuildError

ROOT = Path(__file__).resolve().parent.parent
STEP_ARGS = ("v1", "--arch", "sm_90a")


def cli(*args, env=None, timeout=300, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "tirx_gemm.cli", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env if env is not None else dict(os.environ))


def _doctor(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        label, _, value = line.partition(":")
        out.setdefault(label.strip(), []).append(value.strip())
    return out


@pytest.fixture
def no_system_cuda(monkeypatch):
    monkeypatch.delenv(B.SYSTEM_CUDA_ENV, raising=False)


def _fake_tool(tmp_path: Path, name: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / name).chmod(0o755)
    return bin_dir


def test_the_wheels_hold_a_complete_toolchain():
    root = B.wheel_cuda_root()
    assert root is not None, "pip install -e . must install the nvidia-cuda-nvcc wheel"
    assert Path(sys.prefix) in root.parents, "the toolchain belongs to this Python's packages"
    for rel in ("bin/nvcc", "bin/ptxas", "nvvm/bin/cicc", "include/cuda_runtime.h",
                "include/crt/host_defines.h", "include/cuda_fp16.h",
                "include/cccl/cuda/std/cstdint"):
        assert (root / rel).is_file(), f"{rel} is missing from {root}"


def test_wheels_by_default_even_with_nvcc_on_path(tmp_path, monkeypatch, no_system_cuda):
    bin_dir = _fake_tool(tmp_path, "nvcc")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert B.find_tool("nvcc") == str(B.wheel_cuda_root() / "bin" / "nvcc")
    assert Path(B.find_tool("cuobjdump")).parent.parent.parent == B.wheel_cuda_root().parent


def test_system_cuda_only_when_asked(tmp_path, monkeypatch):
    bin_dir = _fake_tool(tmp_path, "nvcc")
    monkeypatch.setenv(B.SYSTEM_CUDA_ENV, "1")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    assert B.find_tool("nvcc") == str(bin_dir / "nvcc")
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    shutil.copy(bin_dir / "nvcc", home / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert B.find_tool("nvcc") == str(home / "bin" / "nvcc"), "CUDA_HOME comes before PATH"
    assert B.toolchain_env()["PATH"] == os.environ["PATH"], "the user's environment is kept"
    monkeypatch.setenv(B.SYSTEM_CUDA_ENV, "0")
    assert B.find_tool("nvcc") == str(B.wheel_cuda_root() / "bin" / "nvcc")


def test_system_cuda_missing_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(B.SYSTEM_CUDA_ENV, "1")
    monkeypatch.setenv("CUDA_HOME", "")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError, match="nvcc not found on PATH.*TIRX_GEMM_SYSTEM_CUDA=1"):
        B.find_tool("nvcc")


def test_toolchain_env_leads_with_the_wheels(no_system_cuda):
    root = B.wheel_cuda_root()
    env = B.toolchain_env({"PATH": "/usr/bin:/bin", "CUDA_HOME": "/usr/local/cuda"})
    assert env["PATH"].split(os.pathsep) == [str(root / "bin"), "/usr/bin", "/bin"]
    assert env["CUDA_HOME"] == env["CUDA_PATH"] == str(root)
    assert B.toolchain_env(env) == env, "applying it twice changes nothing"


def test_tvm_finds_the_same_toolchain(no_system_cuda):
    """In a build process (toolchain_env applied), TVM's own CUDA lookups name the wheels."""
    env = {k: v for k, v in os.environ.items() if k != B.SYSTEM_CUDA_ENV}
    code = ("import os; from tirx_gemm.compile import toolchain; "
            "os.environ.update(toolchain.toolchain_env()); "
            "from tvm.support import nvcc; print(nvcc.find_cuda_path()); "
            "print(nvcc.get_cuda_version()); print(nvcc.find_libdevice_path('sm_90a'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    root = str(B.wheel_cuda_root())
    path, version, libdevice = out.stdout.strip().splitlines()[-3:]
    assert path == root and version.startswith("(13, 0") and libdevice.startswith(root + "/nvvm/")


def test_doctor_names_the_wheel_toolchain(no_system_cuda):
    env = {k: v for k, v in os.environ.items() if k != B.SYSTEM_CUDA_ENV}
    out = cli("doctor", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    d = _doctor(out.stdout)
    root = str(B.wheel_cuda_root())
    assert d["toolchain"][0].startswith("nvidia-* wheels")
    assert d["nvcc"][0].startswith(root + "/bin/nvcc (") and "release 13.0" in d["nvcc"][0]
    assert d["ptxas"][0].startswith(root + "/bin/ptxas (")
    assert d["cicc"][0] == root + "/nvvm/bin/cicc (Cuda compilation tools, release 13.0, V13.0.88)"
    assert d["headers"][0] == f"{root}/include (CUDA_VERSION=13000, CUDART_VERSION=13000, " \
                              "CCCL_VERSION=3000001)"
    assert "nvidia-cuda-nvcc==13.0.88" in d["wheels"][0]
    assert "libcuda" in d and "warning" not in d, out.stdout
    assert d["toolchain id"][0].endswith("(part of every cache key)")


def test_build_and_export_import_no_torch(tmp_path, no_system_cuda):
    """A torch that cannot be imported (as in a venv without it) shadows the real one; the
    build and the export must work, and no module of this project may try to import torch
    (tvm_ffi tries, and copes)."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import os, traceback\n"
        "with open(os.environ['FAKE_TORCH_LOG'], 'a') as f:\n"
        "    f.write(repr([fr.filename for fr in traceback.extract_stack()[:-1]]) + '\\n')\n"
        "raise ImportError('torch is not installed (fake)')\n")
    log = tmp_path / "imports.log"
    env = {k: v for k, v in os.environ.items() if k != B.SYSTEM_CUDA_ENV}
    env.update(PYTHONPATH=str(fake.parent), FAKE_TORCH_LOG=str(log),
               TIRX_GEMM_CACHE=str(tmp_path / "cache"))
    out = cli("build", *STEP_ARGS, "-q", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    out = cli("export", *STEP_ARGS, "-q", "--out", str(tmp_path / "bundle"), env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "bundle" / "v1_sm_90a_128x128x64.so").is_file()
    for line in (log.read_text().splitlines() if log.exists() else []):
        frames = [f for f in eval(line) if not f.startswith("<frozen")]  # noqa: S307
        importer = frames[-1]
        # the project's own code (a venv may live inside the checkout, as .ci/run's does)
        ours = [str(ROOT / d) + os.sep for d in ("tirx_gemm", "steps", "scripts")]
        assert not any(importer.startswith(o) for o in ours), f"{importer} imports torch: {frames}"


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_build_where_no_system_cuda_is_visible(tmp_path):
    """PATH holds only this Python's bin/, /usr/bin and /bin; CUDA_HOME, CUDA_PATH and
    TIRX_GEMM_SYSTEM_CUDA are unset; where unshare works, every /usr/local/cuda* folder is
    an empty mount as well. The build works and doctor names the wheel's nvcc."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"HOME": os.environ.get("HOME", str(tmp_path)), "LANG": "C.UTF-8",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin",
           "TIRX_GEMM_CACHE": str(tmp_path / "cache")}
    hide = ""
    if _can_unshare():
        hide = "".join(f'mount --bind {empty} {d} && ' for d in sorted(Path("/usr/local").glob(
            "cuda*")) if d.is_dir() and not d.is_symlink())
    script = (f"{hide}! command -v nvcc && ! ls /usr/local/cuda*/bin/nvcc 2>/dev/null && "
              f"{sys.executable} -m tirx_gemm.cli doctor && "
              f"{sys.executable} -m tirx_gemm.cli build {' '.join(STEP_ARGS)} --no-cache")
    prefix = ["unshare", "-rm"] if hide else []
    out = subprocess.run([*prefix, "bash", "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    d = _doctor(out.stdout)
    assert d["nvcc"][0].startswith(str(B.wheel_cuda_root() / "bin" / "nvcc"))
    assert "1/1 built" in out.stdout and not re.search(r"^v\d+ .* cached ", out.stdout, re.M)
