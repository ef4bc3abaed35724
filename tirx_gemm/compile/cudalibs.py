"""The CUDA libraries a build process loads before TVM: the CUDA runtime, and the GPU driver's
libcuda.so.1 or, on a machine without a driver, a stub built from ``tirx_gemm/stub/libcuda_stub.c``.
With them loaded first, TVM embeds the compiled kernel into the exported library instead of
keeping CUDA source only; that library then runs on a GPU host that has just torch,
apache-tvm-ffi and TVM's two runtime libraries.

The stub lives in the cache (``<cache>/stub/<source digest>/libcuda.so.1``, with the sha256
it was built with beside it) and is checked before use: an ELF shared object of soname
libcuda.so.1 defining every entry point of the source, with its recorded sha256. A damaged one
is rebuilt, with a one-line notice; the doctor checks it too (:func:`stub_status`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import struct
import sys
from pathlib import Path

from tirx_gemm.compile.cache import cache_root, sha256_file
from tirx_gemm.compile.procs import BuildError, run_tool
from tirx_gemm.compile.toolchain import use_system_cuda, wheel_cuda_root

__all__ = ["STUB_SONAME", "ensure_cudart", "ensure_libcuda", "ensure_stub", "stub_path",
           "stub_problem", "stub_status", "stub_symbols"]

STUB_SOURCE = Path(__file__).resolve().parents[1] / "stub" / "libcuda_stub.c"
STUB_SONAME = "libcuda.so.1"
# part of the stub's folder name: a stub of an older layout (no recorded sha256) is not used
STUB_FORMAT = b"stub-2\n"

_LOADED: dict[str, str] = {}  # what ensure_libcuda loaded in this process: {"libcuda": ...}


def ensure_cudart() -> str | None:
    """Load the CUDA runtime library that TVM's CUDA module (libtvm_runtime_cuda.so needs
    libcudart.so.13) links against: the nvidia-cuda-runtime wheel's, found from the installed
    packages; with TIRX_GEMM_SYSTEM_CUDA=1 the system's first (the loader's search path).
    Without it TVM silently keeps CUDA source only. Returns the path loaded, or None."""
    root = wheel_cuda_root()
    wheel = [str(p) for p in sorted((root / "lib").glob("libcudart.so.*[0-9]"))] if root else []
    for cand in (["libcudart.so.13"] + wheel) if use_system_cuda() else wheel:
        try:
            ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
            return cand
        except OSError:
            continue
    return None


def ensure_libcuda() -> str:
    """Load the CUDA runtime (ensure_cudart), then the real libcuda if there is one, else
    the stub (checked, rebuilt when damaged). Returns "driver" or "stub"."""
    if "libcuda" in _LOADED:
        return _LOADED["libcuda"]
    ensure_cudart()
    try:
        ctypes.CDLL(STUB_SONAME, mode=ctypes.RTLD_GLOBAL)
        _LOADED["libcuda"] = "driver"
        return "driver"
    except OSError:
        pass
    path = ensure_stub()
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:  # checked, yet it does not load: build it again, once
        print(f"tirx-gemm: the stub libcuda {path} does not load ({exc}); rebuilding",
              file=sys.stderr)
        _build_stub(path)
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    _LOADED["libcuda"] = "stub"
    return "stub"


# ---------------------------------------------------------------------------------------
# the stub
# ---------------------------------------------------------------------------------------
def stub_path() -> Path:
    digest = hashlib.sha256(STUB_FORMAT + STUB_SOURCE.read_bytes()).hexdigest()[:12]
    return cache_root() / "stub" / digest / STUB_SONAME


def stub_symbols() -> list[str]:
    """The entry points the stub's source defines (each one must be in the library)."""
    text = STUB_SOURCE.read_text()
    return re.findall(r"^STUB\((\w+)\)", text, re.M) + re.findall(r"^int (cu\w+)\(", text, re.M)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _build_stub(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        gcc = run_tool(["gcc", "-shared", "-fPIC", "-O1", f"-Wl,-soname,{STUB_SONAME}", "-o",
                        str(tmp), str(STUB_SOURCE)])
        if gcc.returncode != 0:
            raise BuildError("gcc failed to build the libcuda stub: "
                             + ((gcc.stderr.strip().splitlines() or ["no output"])[-1]))
        why = _elf_problem(tmp)
        if why:
            raise BuildError(f"gcc built a libcuda stub that is not usable ({why})")
        sidecar_tmp = _sidecar(tmp)
        sidecar_tmp.write_text(sha256_file(tmp) + "\n")
        os.replace(sidecar_tmp, _sidecar(path))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        _sidecar(tmp).unlink(missing_ok=True)


def ensure_stub() -> Path:
    """The stub's path, built when missing and rebuilt (with a one-line notice) when
    damaged."""
    path = stub_path()
    if os.path.lexists(path):
        why = stub_problem(path)
        if why is None:
            return path
        print(f"tirx-gemm: the stub libcuda {path} is damaged ({why}); rebuilding",
              file=sys.stderr)
        path.unlink()
    _build_stub(path)
    return path


def stub_problem(path: Path) -> str | None:
    """Why the file at ``path`` is not the stub this package builds, or None."""
    if path.is_symlink():
        return "it is a symlink"
    if not path.is_file():
        return "it is not a file"
    try:
        want = _sidecar(path).read_text().strip()
    except OSError:
        return "its recorded sha256 is missing"
    try:
        if sha256_file(path) != want:
            return "its sha256 differs from the one recorded when it was built"
    except OSError as exc:
        return f"it is not readable: {exc.strerror or exc}"
    return _elf_problem(path)


# ELF64 little-endian: header, section header and dynamic-symbol layouts
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_DYN = struct.Struct("<qQ")
_ET_DYN, _SHT_DYNAMIC, _SHT_DYNSYM, _DT_SONAME = 3, 6, 11, 14


def _elf_problem(path: Path) -> str | None:
    """Why ``path`` is not an ELF64 shared object with soname libcuda.so.1 defining every
    entry point of the stub's source, or None."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"it is not readable: {exc.strerror or exc}"
    try:
        (ident, e_type, _, _, _, _, shoff, _, _, _, _, shentsize, shnum, _) = \
            _EHDR.unpack_from(data)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            return "it is not a 64-bit little-endian ELF file"
        if e_type != _ET_DYN:
            return "it is not a shared object"
        sections = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]

        def body(sec):
            off, size = sec[4], sec[5]
            if off + size > len(data):
                raise ValueError("a section runs past the end of the file")
            return data[off:off + size]

        def string(table: bytes, at: int) -> str:
            return table[at:table.index(b"\0", at)].decode(errors="replace")

        soname, defined = None, set()
        for sec in sections:
            if sec[1] == _SHT_DYNAMIC:
                strtab = body(sections[sec[6]])
                raw = body(sec)
                for i in range(0, len(raw) - _DYN.size + 1, _DYN.size):
                    tag, val = _DYN.unpack_from(raw, i)
                    if tag == _DT_SONAME:
                        soname = string(strtab, val)
            elif sec[1] == _SHT_DYNSYM:
                strtab = body(sections[sec[6]])
                raw = body(sec)
                for i in range(0, len(raw) - _SYM.size + 1, _SYM.size):
                    name, _, _, shndx, _, _ = _SYM.unpack_from(raw, i)
                    if shndx != 0:
                        defined.add(string(strtab, name))
    except (struct.error, ValueError, IndexError) as exc:
        return f"it is not a well-formed ELF file ({exc})"
    if soname != STUB_SONAME:
        return f"its soname is {soname!r}, not {STUB_SONAME!r}"
    missing = [s for s in stub_symbols() if s not in defined]
    if missing:
        return f"it lacks {', '.join(missing)}"
    return None


_LOAD_PROBE = ("import ctypes, sys\n"
               "try:\n    ctypes.CDLL('libcuda.so.1'); print('driver'); sys.exit(0)\n"
               "except OSError:\n    pass\n"
               "lib = ctypes.CDLL(sys.argv[1])\n"
               "for s in sys.argv[2:]:\n    getattr(lib, s)\n"
               "print('stub')\n")


def stub_status() -> tuple[bool, str]:
    """(ok, text) for the doctor: whether the GPU driver's libcuda loads here, else whether
    the stub is built, well-formed, unchanged since its build, and loads (in a separate
    process, so a damaged file never runs here)."""
    path = stub_path()
    exists = os.path.lexists(path)
    why = stub_problem(path) if exists else None
    if why:
        return False, (f"stub {path} is damaged ({why}); the next build rebuilds it, or "
                       "delete it")
    probe = run_tool([sys.executable, "-c", _LOAD_PROBE, str(path), *stub_symbols()],
                     probe=True, name="libcuda load probe")
    answer = probe.stdout.strip()
    if answer == "driver":
        return True, "the GPU driver's libcuda.so.1 (no stub needed)"
    if not exists:
        return True, f"stub {path} not built yet (the first build makes it)"
    if answer != "stub":
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"stub {path} does not load ({last}); delete it to have it rebuilt"
    return True, (f"stub {path} (ELF shared object, soname {STUB_SONAME}, "
                  f"{len(stub_symbols())} entry points, sha256 as built, loads)")
