"""The run side's errors a user can meet, in one torch-free module.

The CLI turns each of them into one line and exit 2 on every command, so it must be able to
name them without importing torch (or the modules that raise them). device.py, loader.py and
launcher.py raise these classes; the names stay importable from those modules as before.
Standard library only.
"""

from __future__ import annotations

__all__ = ["DeviceMismatchError", "KernelLaunchError", "RUN_ERRORS", "RuntimeLibraryError"]


class DeviceMismatchError(RuntimeError):
    """No CUDA GPU is visible, or its compute capability does not fit the step's arch."""


class RuntimeLibraryError(RuntimeError):
    """apache-tvm-ffi or TVM's runtime libraries could not be found or loaded."""


class KernelLaunchError(RuntimeError):
    """The kernel launch or its execution failed (surfaced when the host waits for it)."""


RUN_ERRORS = (DeviceMismatchError, RuntimeLibraryError, KernelLaunchError)
