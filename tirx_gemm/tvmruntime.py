"""TVM's runtime libraries: their names and the installed apache-tvm wheel's folder of them,
found without importing tvm. The loader (which loads them) and the bundle exporter (which
ships them in a bundle's runtime/ folder) both read them here. Standard library only."""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["RUNTIME_LIBS", "tvm_package_lib_dir"]

RUNTIME_LIBS = ("libtvm_runtime.so", "libtvm_runtime_cuda.so")


def tvm_package_lib_dir() -> Path | None:
    """site-packages/tvm/lib of an installed apache-tvm wheel, located WITHOUT importing tvm."""
    try:
        spec = importlib.util.find_spec("tvm")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for loc in locations:
        cand = Path(loc) / "lib"
        if cand.is_dir():
            return cand
    return None
