"""Loading an exported step library: TVM's runtime libraries, found and loaded once.

The one lookup of TVM's runtime libraries (:func:`find_runtime_dir`; their names and the
tvm wheel's folder are in tvmruntime.py, which the bundle exporter reads too);
:func:`load_kernel` returns a step library's ``main``. Standard library only at import
(torch and tvm_ffi are imported when a kernel is loaded). Never imports the TVM compiler.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from tirx_gemm.run.errors import RuntimeLibraryError
from tirx_gemm.tvmruntime import RUNTIME_LIBS, tvm_package_lib_dir

__all__ = [
    "RUNTIME_DIR_ENV",
    "RUNTIME_LIBS",
    "RuntimeLibraryError",
    "find_runtime_dir",
    "tvm_package_lib_dir",
    "loaded_runtime_dir",
    "load_kernel",
]

RUNTIME_DIR_ENV = "TIRX_GEMM_TVM_RUNTIME_DIR"


def _has_runtime_libs(d: Path) -> bool:
    return all((d / name).is_file() for name in RUNTIME_LIBS)


def find_runtime_dir(lib_path: str | os.PathLike | None = None) -> Path:
    """Folder holding libtvm_runtime.so and libtvm_runtime_cuda.so.

    Looked up in order: $TIRX_GEMM_TVM_RUNTIME_DIR; a ``runtime/`` folder next to the library
    (a bundle); the installed tvm package's ``lib/`` folder (found without importing tvm).
    Raises RuntimeLibraryError listing every place it looked.
    """
    tried: list[str] = []
    env = os.environ.get(RUNTIME_DIR_ENV)
    if env:
        d = Path(env)
        if _has_runtime_libs(d):
            return d
        # an explicit setting that is wrong is an error, not something to fall past silently
        raise RuntimeLibraryError(
            f"${RUNTIME_DIR_ENV}={env} does not contain {' and '.join(RUNTIME_LIBS)}"
        )
    tried.append(f"${RUNTIME_DIR_ENV} (not set)")
    if lib_path is not None:
        d = Path(lib_path).resolve().parent / "runtime"
        if _has_runtime_libs(d):
            return d
        tried.append(f"{d} (bundle folder next to the library)")
    d = tvm_package_lib_dir()
    if d is not None and _has_runtime_libs(d):
        return d
    tried.append(f"{d} (installed tvm package)" if d else "installed tvm package (not found)")
    raise RuntimeLibraryError(
        f"cannot find TVM's runtime libraries {', '.join(RUNTIME_LIBS)}; looked in: "
        + "; ".join(tried)
        + f". Set ${RUNTIME_DIR_ENV} to a folder holding them (they ship in the apache-tvm "
        "wheel under tvm/lib/), or put them in a runtime/ folder next to the step library."
    )


# TVM's runtime may be dlopen'ed once per process: a second copy from another folder aborts the
# process (duplicate global function registration; C++ terminate, not catchable). The first
# folder loaded wins for the life of the process.
_RUNTIME_LOADED: dict = {"dir": None, "handles": []}


def loaded_runtime_dir() -> Path | None:
    """The folder TVM's runtime was loaded from by load_kernel in this process, if any."""
    return _RUNTIME_LOADED["dir"]


def _init_cuda_via_torch() -> None:
    import torch  # noqa: PLC0415  (lazy: reading RUNTIME_LIBS needs no torch)
    from tirx_gemm.run.device import DeviceMismatchError, cuda_unavailable_reason
    if not torch.cuda.is_available():
        raise DeviceMismatchError(
            f"no CUDA GPU visible: {cuda_unavailable_reason()}; loading a CUDA step library "
            "needs one"
        )
    torch.cuda.init()
    torch.cuda.current_device()  # forces the primary context into existence


def load_kernel(lib_path: str | os.PathLike):
    """Load an exported step library and return its ``main`` function, f(A, B, D).

    Works on a host with only apache-tvm-ffi and TVM's two runtime libraries (no compiler):
    ``import tvm_ffi``; dlopen libtvm_runtime.so and libtvm_runtime_cuda.so with RTLD_GLOBAL
    (see :func:`find_runtime_dir`); ``tvm_ffi.load_module(lib_path)["main"]``. When tvm is
    already imported in this process, ``tvm.runtime.load_module`` is used instead. CUDA is
    initialised through torch first. Call the result with torch CUDA tensors (DLPack).

    A library inside a bundle (a folder with manifest.json) is loaded only after
    ``bundle.verify_library`` found the bundle intact (bundle.BundleError otherwise).

    The runtime libraries are loaded once per process (from the folder found by the first
    call); later calls reuse them, since a second copy would abort the process. For the same
    reason, do not ``import tvm`` in a process after this path has loaded the runtime.
    """
    path = Path(lib_path)
    if not path.is_file():
        raise FileNotFoundError(f"step library {path} does not exist")
    # a library from a bundle: the whole bundle (this library, the runtime libraries next to
    # it) is checked against its manifest before anything is loaded
    from tirx_gemm.bundle_format import verify_library  # noqa: PLC0415 (lazy: reads files only)
    verify_library(path)
    _init_cuda_via_torch()
    tvm = sys.modules.get("tvm")
    if tvm is not None and hasattr(tvm, "runtime"):
        mod = tvm.runtime.load_module(str(path))
        return mod["main"]
    try:
        import tvm_ffi  # noqa: PLC0415  (lazy: only needed to load a library)
    except ImportError as e:
        raise RuntimeLibraryError(
            f"loading {path} needs the apache-tvm-ffi package (import tvm_ffi failed: {e}); "
            "install the apache-tvm-ffi wheel matching this Python"
        ) from e
    if _RUNTIME_LOADED["dir"] is None:
        rt_dir = find_runtime_dir(path)
        handles = []
        for name in RUNTIME_LIBS:
            try:
                handles.append(ctypes.CDLL(str(rt_dir / name), mode=ctypes.RTLD_GLOBAL))
            except OSError as e:
                raise RuntimeLibraryError(f"cannot load {rt_dir / name}: {e}") from e
        _RUNTIME_LOADED.update(dir=rt_dir, handles=handles)
    try:
        mod = tvm_ffi.load_module(str(path))
    except Exception as e:  # tvm_ffi raises its own error types
        raise RuntimeLibraryError(f"tvm_ffi.load_module({str(path)!r}) failed: {e}") from e
    try:
        return mod["main"]
    except Exception as e:
        raise RuntimeLibraryError(f"{path} has no function 'main': {e}") from e
