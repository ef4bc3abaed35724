"""The bundle format, read side: layout, manifest, verify, find (no TVM; compile/ writes bundles).

Layout of a bundle directory::

    manifest.json                   "format": 2; "files": the sha256 of every other file;
                                    "kernels": one entry per kernel (step, arch, shape,
                                    dtype, kwargs, lib, its sha256 and the "binding" hash
                                    tying that sha256 to the rest of the entry)
    <step>_<arch>_<M>x<N>x<K>[_<kwarg><value>...][_wd<ms>].so
                                    exported TVM libraries (host code + embedded cubin);
                                    _dtypebfloat16: a bfloat16 build (float16 has no tag);
                                    _wd<ms>: a watchdog build (bounded barrier waits)
    runtime/libtvm_runtime.so       from the apache-tvm wheel (found next to the libraries
    runtime/libtvm_runtime_cuda.so  by tirx_gemm.run.loader.load_kernel)
    wheels/                         optional: apache-tvm-ffi wheel for the host's Python

Trust: :func:`verify` checks a bundle before anything from it is loaded (``find`` and
``loader.load_kernel`` call it): every listed file's sha256, no symlink, no path outside the
bundle, each kernel's name and hash bound to its step, arch, shape, dtype and kwargs, nothing
in runtime/ but TVM's two libraries. A failure is one line naming the file. The hashes catch
damage and mix-ups (a tampered, truncated or swapped library, a stray file); they are not a
signature: whoever can rewrite the whole bundle, manifest included, is trusted like its
author.

This module imports neither TVM nor torch nor tirx_gemm.compile: it sits below both the
exporter (tirx_gemm/compile/bundle.py, which writes bundles) and the run side (tirx_gemm/run/
and tirx_gemm/op/matmul.py, which read them).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.tvmruntime import RUNTIME_LIBS

MANIFEST = "manifest.json"
# the manifest's sha256 a user pins a bundle to (printed by export; --expect-sha256 sets it):
# every file's sha256 is in the manifest, so its digest names the whole bundle
EXPECT_SHA256_ENV = "TIRX_GEMM_BUNDLE_SHA256"
FORMAT = 2  # manifest format: 2 = every file's sha256 ("files"), kernels bound to them


def shapes_for(step: registry.Step, which, mnk=None) -> list[tuple[int, int, int]]:
    """The shapes to export or run: ``mnk``; else ``which``, a registry list name
    ("canonical", "test", "bench", "all") or explicit (M, N, K) shapes (any shape: the
    step's builder decides whether it accepts it)."""
    if mnk:
        return [tuple(mnk)]
    if not isinstance(which, str):
        return [tuple(int(x) for x in s) for s in which]
    if which == "canonical":
        return [step.canonical]
    if which == "test":
        return [step.canonical, *[s for s in step.test_shapes if s != step.canonical]]
    if which == "bench":
        return list(step.bench_shapes) or [step.canonical]
    return registry.gpu_shapes(step)



def lib_name(step: str, arch: str, M: int, N: int, K: int, kwargs: dict,
             watchdog_ms: int | None = None) -> str:
    extra = "".join(f"_{k}{v}" for k, v in sorted(kwargs.items()))
    if watchdog_ms is not None:
        extra += f"_wd{watchdog_ms}"
    return f"{step}_{arch}_{M}x{N}x{K}{extra}.so"



# ---------------------------------------------------------------------------------------
# integrity: every file's sha256 in the manifest, checked before anything is loaded
# ---------------------------------------------------------------------------------------
class BundleError(ValueError):
    """A bundle that must not be used: one line naming the file and what to do."""


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def open_plain(path: Path) -> int:
    """A read-only descriptor of ``path``: a regular file, not a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a regular file; a symlink or anything else is refused (OSError)."""
    return _sha256_fd(open_plain(Path(path)))


def plain_name(name) -> bool:
    """A file name that stays inside the folder it is joined to: no separator, not '.'
    or '..', not empty, no NUL."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and "\\" not in name and "\0" not in name)


def kernel_binding(entry: dict) -> str:
    """The sha256 that binds a kernel's library hash to what it was built for: step, arch,
    shape, dtype, builder keywords, watchdog and file name. A library renamed or listed
    under another step, shape or dtype no longer matches its entry."""
    ident = [entry.get(k) for k in ("step", "arch", "M", "N", "K", "dtype", "watchdog_ms",
                                     "lib", "sha256")]
    text = json.dumps([ident, entry.get("kwargs")], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _allowed_file(rel: str) -> bool:
    """Paths a manifest may list: a kernel library in the bundle folder, one of TVM's
    runtime libraries under runtime/, a wheel under wheels/."""
    head, _, tail = rel.partition("/")
    if not tail:
        return plain_name(head)
    if head == "runtime":
        return tail in RUNTIME_LIBS
    return head == "wheels" and plain_name(tail) and tail.endswith(".whl")


def _refuse(bundle: Path, rel: str, why: str) -> BundleError:
    return BundleError(f"bundle {bundle}: {rel} {why}; nothing from this bundle was loaded "
                       "(export it again with `tirx-gemm export`)")


def check_file(bundle: Path, rel: str, want) -> None:
    if not _allowed_file(rel):
        raise _refuse(bundle, repr(rel), "is not a plain file name inside the bundle")
    if "/" in rel:
        sub = bundle / rel.split("/")[0]
        if sub.is_symlink() or not sub.is_dir():
            raise _refuse(bundle, rel.split("/")[0] + "/", "is a symlink or not a folder")
    try:
        got = file_sha256(bundle / rel)
    except FileNotFoundError:
        raise _refuse(bundle, rel, "is missing") from None
    except OSError as exc:
        what = "is a symlink" if (bundle / rel).is_symlink() else \
            f"is not a readable file ({exc.strerror or exc})"
        raise _refuse(bundle, rel, what) from None
    if got != want:
        raise _refuse(bundle, rel, "does not match the sha256 in the manifest (changed after "
                                   "the export)")


def read_manifest(bundle: Path) -> dict:
    path = bundle / MANIFEST
    if not os.path.lexists(path):
        raise ValueError(f"{bundle} is not a bundle: no {MANIFEST} (make one with "
                         f"`tirx-gemm export`)")
    try:
        data = json.loads(_sha256_and_read(path))
    except OSError as exc:
        what = "is a symlink" if path.is_symlink() else f"is not readable ({exc.strerror})"
        raise _refuse(bundle, MANIFEST, what) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _refuse(bundle, MANIFEST, f"is not JSON ({exc})") from None
    except RecursionError:  # nesting no export writes; json's decoder would overflow
        raise _refuse(bundle, MANIFEST, "nests too deeply to be a manifest") from None
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), list):
        raise _refuse(bundle, MANIFEST, "has no list of kernels")
    if data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
        raise _refuse(bundle, MANIFEST, "holds no file hashes (made by an older tirx-gemm)")
    return data


def _sha256_and_read(path: Path) -> str:
    with os.fdopen(open_plain(path), "rb") as f:
        return f.read().decode("utf-8")


def manifest_sha256(bundle: Path) -> str:
    """The sha256 of a bundle's manifest.json (which holds every other file's sha256): the
    digest ``--expect-sha256`` pins."""
    try:
        return file_sha256(Path(bundle) / MANIFEST)
    except OSError as exc:
        raise _refuse(Path(bundle), MANIFEST, f"is not readable ({exc.strerror or exc})") from None


def check_sha256_text(text: str, what: str = "--expect-sha256") -> str:
    """A sha256 as 64 hex digits (lower-cased), else a one-line ValueError."""
    t = str(text).strip().lower()
    if len(t) != 64 or any(c not in "0123456789abcdef" for c in t):
        raise ValueError(f"{what} {text!r} is not a sha256 (64 hex digits): copy the one "
                         "`tirx-gemm export` printed")
    return t


def expected_sha256() -> str | None:
    """The manifest digest the user pinned ($TIRX_GEMM_BUNDLE_SHA256), or None. A misspelt
    pin (an undeclared TIRX_GEMM_* name) is warned about, once per process."""
    from tirx_gemm import settings
    settings.warn_unknown()
    text = os.environ.get(EXPECT_SHA256_ENV)
    return check_sha256_text(text, f"${EXPECT_SHA256_ENV}") if text else None


def check_kernel(bundle: Path, e, files: dict) -> None:
    if not isinstance(e, dict):
        raise _refuse(bundle, MANIFEST, "lists a kernel that is not a JSON object")
    lib = e.get("lib")
    if not plain_name(lib):
        raise _refuse(bundle, repr(lib), "is not a plain file name inside the bundle")
    try:
        ok_types = (all(isinstance(e.get(k), str) for k in ("step", "arch", "dtype"))
                    and all(isinstance(e.get(k), int) and not isinstance(e.get(k), bool)
                            and e[k] > 0 for k in ("M", "N", "K"))
                    and isinstance(e.get("kwargs"), dict))
        expect = lib_name(e["step"], e["arch"], e["M"], e["N"], e["K"], e["kwargs"],
                          e.get("watchdog_ms")) if ok_types else None
    except (KeyError, TypeError):
        expect = None
    if expect is None:
        raise _refuse(bundle, lib, "has a manifest entry with missing or wrong fields")
    if lib != expect or e["dtype"] != e["kwargs"].get("dtype", "float16"):
        raise _refuse(bundle, lib, f"is listed as {e['step']}@{e['arch']} "
                      f"{e['M']}x{e['N']}x{e['K']} {e['dtype']}, which would be named {expect}")
    if files.get(lib) != e.get("sha256") or e.get("binding") != kernel_binding(e):
        raise _refuse(bundle, lib, "has a sha256 not bound to its step, arch, shape, dtype "
                                   "and kwargs")


def verify(bundle: Path, expect_sha256: str | None = None) -> list[dict]:
    """Check a whole bundle before anything from it is loaded; return its kernels.

    Every file the manifest lists must be a regular file (no symlink, nor a symlinked
    runtime/ or wheels/ folder) whose sha256 is the one listed; paths must stay inside the
    bundle; every kernel's hash must be bound to its step, arch, shape, dtype and kwargs
    (:func:`kernel_binding`); TVM's runtime libraries must be listed, and runtime/ must hold
    nothing else (they find their dependencies next to themselves, $ORIGIN, so a planted
    library there would be loaded with them), and wheels/ nothing the manifest does not
    list. ``expect_sha256`` (None: $TIRX_GEMM_BUNDLE_SHA256 if set; "": none) pins the
    manifest's own sha256. BundleError names the first file that fails."""
    bundle = Path(bundle)
    expect = expected_sha256() if expect_sha256 is None else expect_sha256
    data = read_manifest(bundle)
    if expect:
        got = manifest_sha256(bundle)
        if got != check_sha256_text(expect):
            raise _refuse(bundle, MANIFEST, f"has sha256 {got}, not the {expect} pinned by "
                                            f"--expect-sha256 / ${EXPECT_SHA256_ENV}: this is "
                                            "not the bundle you exported")
    files = data["files"]
    for rel, want in files.items():
        check_file(bundle, rel, want)
    for e in data["kernels"]:
        check_kernel(bundle, e, files)
    for lib in RUNTIME_LIBS:
        if f"runtime/{lib}" not in files:
            raise _refuse(bundle, f"runtime/{lib}", "is not listed in the manifest")
    rt = bundle / "runtime"
    extra = sorted(set(os.listdir(rt)) - set(RUNTIME_LIBS))
    if extra:
        raise _refuse(bundle, f"runtime/{extra[0]}", "is not part of the export (a library "
                                                      "next to TVM's runtime would be loaded with it)")
    wheels = bundle / "wheels"
    if os.path.lexists(wheels):
        if wheels.is_symlink() or not wheels.is_dir():
            raise _refuse(bundle, "wheels", "is not a folder of the export")
        stray = sorted(n for n in os.listdir(wheels) if f"wheels/{n}" not in files)
        if stray:
            raise _refuse(bundle, f"wheels/{stray[0]}", "is not listed in the manifest (not "
                                                        "part of the export: remove it, never "
                                                        "install it)")
    return data["kernels"]


def verified_wheels(bundle: Path, expect_sha256: str | None = None) -> list[Path]:
    """The wheels of a bundle, after :func:`verify` (every wheel listed, its sha256 the
    manifest's): what `tirx-gemm bundle DIR --wheels` prints for ``pip install``."""
    verify(bundle, expect_sha256)
    wheels = Path(bundle) / "wheels"
    return sorted(wheels / n for n in os.listdir(wheels)) if wheels.is_dir() else []


def verify_library(lib_path: Path) -> None:
    """Before loading ``lib_path`` from a bundle (a folder with a manifest): the whole
    bundle checks out and the library is one of its kernels. A library outside any bundle
    (a build-cache entry) is left to the cache's own checks."""
    lib_path = Path(lib_path)
    bundle = lib_path.parent
    if not os.path.lexists(bundle / MANIFEST):
        return
    kernels = verify(bundle)
    if lib_path.name not in {e.get("lib") for e in kernels}:
        raise _refuse(bundle, lib_path.name, "is not a kernel of this bundle's manifest")



class KernelNotInBundle(ValueError):
    """:func:`find` on a bundle that checks out but has no such kernel: one line saying what
    it has instead (other shapes, dtypes, arches, watchdog or timeline builds)."""


def load_manifest(bundle: Path) -> list[dict]:
    """The kernels of a bundle, after :func:`verify` (every file checked)."""
    return verify(Path(bundle))


def code_git_sha(bundle: Path) -> str | None:
    """The git revision of the code a bundle's kernels were exported from (the manifest's
    ``git_sha``; "A+B" when its entries were exported at several). A record made from the
    bundle on another machine names this, not that machine's checkout: a device copy's git
    state can be older than its files (the lab scripts under lab/ record it)."""
    shas = list(dict.fromkeys(str(e.get("git_sha")) for e in load_manifest(bundle)
                              if e.get("git_sha")))
    return "+".join(shas) if shas else None


def find(bundle: Path, step: registry.Step, mnk, kwargs: dict | None = None,
         watchdog_ms: int | None = None, dtype: str | None = None,
         timeline: bool = False) -> dict:
    """The manifest entry for (step, arch, shape, dtype) built with ``watchdog_ms`` (None:
    the normal build); a clear error if the bundle has the step only for other shapes,
    dtypes, arches or watchdog settings. ``kwargs`` given: exactly those builder keywords
    (the dtype among them); else any, with operand ``dtype`` (default float16).
    ``timeline``: an instrumented build (export --timeline) whatever its keywords."""
    kernels = load_manifest(bundle)
    M, N, K = mnk
    want_dtype = step.dtype(kwargs) if kwargs is not None else (dtype or "float16")
    if kwargs is not None and dtype is not None and dtype != want_dtype:
        raise ValueError(f"find: dtype={dtype!r} contradicts kwargs {kwargs}")
    mine = [e for e in kernels if e["step"] == step.id and e["arch"] == step.arch]
    # an instrumented build (export --timeline) is found only when asked for (by its
    # kwargs, or timeline=True): run, bench and regress never time or check a timeline kernel
    instrumented = timeline or bool((kwargs or {}).get("TIMELINE"))
    timeline_only = bool(mine) and all(
        bool((e.get("kwargs") or {}).get("TIMELINE")) != instrumented for e in mine)
    mine = [e for e in mine
            if bool((e.get("kwargs") or {}).get("TIMELINE")) == instrumented]
    if timeline_only:
        raise KernelNotInBundle(f"bundle {bundle} has {step.key} only as "
                                + ("normal builds, no timeline build (export --timeline)"
                                   if instrumented else "timeline builds (export --timeline, "
                                   "for `tirx-gemm trace`): export it without --timeline"))
    same = [e for e in mine if e.get("watchdog_ms") == watchdog_ms]
    if mine and not same:
        have = sorted({str(e.get("watchdog_ms")) for e in mine})
        raise KernelNotInBundle(f"bundle {bundle} has {step.key} built with watchdog_ms "
                                f"{', '.join(have)}, not {watchdog_ms} (export with the same "
                                "--watchdog-ms)")
    at_shape = [e for e in same if (e["M"], e["N"], e["K"]) == (M, N, K)]
    hits = [e for e in at_shape if step.dtype(e.get("kwargs")) == want_dtype
            and (kwargs is None or (e.get("kwargs") or {}) == kwargs)]
    if hits:
        return hits[-1]
    if at_shape:
        have = sorted({step.dtype(e.get("kwargs")) for e in at_shape})
        if want_dtype not in have:
            raise KernelNotInBundle(f"bundle {bundle} has {step.key} at {M}x{N}x{K} only in "
                             f"{', '.join(have)}, not {want_dtype} (export with --dtype "
                             f"{want_dtype})")
        kws = "; ".join(json.dumps(e.get("kwargs") or {}, sort_keys=True) for e in at_shape)
        raise KernelNotInBundle(f"bundle {bundle} has {step.key} at {M}x{N}x{K} built with "
                                f"{kws}, not {json.dumps(kwargs, sort_keys=True)}")
    if same:
        have = ", ".join(dict.fromkeys(f"{e['M']}x{e['N']}x{e['K']}" for e in same))
        raise KernelNotInBundle(f"bundle {bundle} has {step.key} built for {have}, not "
                                f"{M}x{N}x{K}: a kernel runs only at the shape it was built for")
    others = sorted({e["arch"] for e in kernels if e["step"] == step.id})
    if others:
        raise KernelNotInBundle(f"bundle {bundle} has {step.id} only for {', '.join(others)}, "
                                f"not {step.arch}")
    raise KernelNotInBundle(f"bundle {bundle} has no {step.key}")
