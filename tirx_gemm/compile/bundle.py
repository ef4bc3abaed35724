"""Export: built kernels into a bundle for a GPU host without TVM (the format: bundle_format.py).

A bundle holds built kernels, a manifest and TVM's runtime libraries, for a GPU host that has
torch and apache-tvm-ffi but not the TVM compiler (or no network to install it). Its layout,
its integrity checks (:func:`verify`) and the lookup a GPU host does (:func:`find`) live in
:mod:`tirx_gemm.bundle_format`, which the run side imports without this module.
:func:`export` is locked (flock on the parent folder) and atomic (a staging folder renamed
into place), and verifies what it wrote before swapping it in.

The reading names (verify, find, load_manifest, MANIFEST, ...) are imported here too, so
``from tirx_gemm.compile import bundle; bundle.find(...)`` keeps working for the lab scripts
(lab/) that read bundles through this module.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.bundle_format import (  # noqa: F401 (the reading names, re-exported: see above)
    EXPECT_SHA256_ENV, FORMAT, MANIFEST, RUNTIME_LIBS, BundleError, check_file, check_kernel,
    check_sha256_text, expected_sha256, file_sha256, find, kernel_binding, lib_name,
    load_manifest, manifest_sha256, open_plain, plain_name, read_manifest, shapes_for,
    verified_wheels, verify, verify_library)
from tirx_gemm.tvmruntime import tvm_package_lib_dir
from tirx_gemm.compile.procs import BuildError

FFI_VERSION = "0.1.15.post2"  # the apache-tvm-ffi that apache-tvm 0.27.0.post1 ships with


def build_kwargs(step: registry.Step, args) -> dict:
    """Builder keywords chosen at export time: the SM count of persistent steps and the
    operand dtype (written only for bfloat16; float16 is every builder's default)."""
    kw = step.with_sm_count(getattr(args, "num_sms", None))
    if getattr(args, "dtype", None) not in (None, "float16"):
        kw["dtype"] = args.dtype
    if getattr(args, "timeline", False):  # export --timeline: for `trace` only
        kw["TIMELINE"] = True
    return kw


def check_out_dir(out: Path) -> None:
    """Refuse, before building, a bundle folder that cannot be created: it or one of its
    parents is an existing file, or it is a mount point (an export swaps the finished
    bundle in by renaming, which a mount point refuses with "Device or resource busy")."""
    if os.path.ismount(out):
        raise ValueError(f"--out {out} is a mount point, which an export cannot replace (it "
                         f"renames the finished bundle into place): use a folder inside it, "
                         f"e.g. --out {out / 'bundle'}")
    for d in (out, *out.parents):
        if d.exists():
            if not d.is_dir():
                what = "it is a file" if d == out else f"{d} is a file"
                raise ValueError(f"--out {out}: cannot make a bundle folder there ({what})")
            break
    # the export writes its staging folder beside the bundle: prove now, not after the
    # builds, that a folder can be made in the nearest existing ancestor of out's parent
    parent = out.absolute().parent
    near = next((d for d in (parent, *parent.parents) if d.is_dir()), None)
    if near is not None:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".tirx-gemm-probe-", dir=near))
        except OSError as exc:
            raise ValueError(f"--out {out}: cannot make a folder in {near} "
                             f"({exc.strerror or exc}): export to a folder you can write") from None


def _tvm_lib_dir() -> Path:
    lib = tvm_package_lib_dir()
    if lib is None:
        raise RuntimeError("the apache-tvm package is not installed: cannot copy its runtime")
    return lib


# ---------------------------------------------------------------------------------------
# export: locked, built in a staging folder, swapped into place
# ---------------------------------------------------------------------------------------
LOCK_WAIT_S = 600.0  # an export holds the lock only while copying (builds run before)


@contextlib.contextmanager
def _export_lock(parent: Path, out: Path):
    """flock on the bundle's parent folder: one export into it at a time (waits at most
    LOCK_WAIT_S, saying so)."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BuildError(f"another export into {parent} held its lock for "
                                     f"{LOCK_WAIT_S:g} s: wait for it, or export to another "
                                     "--out") from None
                if not told:
                    print(f"waiting for another export into {parent} to finish",
                          file=sys.stderr, flush=True)
                    told = True
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)


def _mount_of(path: Path) -> tuple[str, str]:
    """(device, mount point) of the file system holding ``path`` (from /proc/self/mounts;
    the st_dev numbers where that cannot be read)."""
    real = os.path.realpath(path)
    best = ("", "")
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2:
                    mnt = parts[1].replace("\\040", " ")
                    if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) \
                            and len(mnt) >= len(best[1]):
                        best = (parts[0], mnt)
    except OSError:
        pass
    if not best[1]:
        try:
            st = os.stat(real if os.path.exists(real) else os.path.dirname(real))
            best = (f"device {os.major(st.st_dev)}:{os.minor(st.st_dev)}", "?")
        except OSError:
            best = ("an unknown device", "?")
    return best


def _write_error(exc: OSError, out: Path) -> BuildError:
    where = exc.filename or str(out)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        dev, mnt = _mount_of(Path(where).parent)
        return BuildError(f"no space left on {dev} (mounted at {mnt}) while writing {where}: "
                          f"free space there or export to another --out; {_kept(out)}")
    return BuildError(f"cannot write {where}: {exc.strerror or exc}; {_kept(out)}")


def _kept(out: Path) -> str:
    return (f"the bundle at {out} is unchanged" if os.path.lexists(out / MANIFEST)
            else f"no bundle was written at {out}")


def _previous_kernels(out: Path, progress: bool) -> tuple[list[dict], list[str]]:
    """The kernels (and wheels) of the bundle already at ``out`` that still check out;
    the others are dropped, with one line saying so."""
    if not os.path.lexists(out / MANIFEST):
        return [], []
    try:
        data = read_manifest(out)
    except BundleError as exc:
        print(f"tirx-gemm: replacing the bundle at {out}, whose kernels cannot be kept: {exc}",
              file=sys.stderr)
        return [], []
    files, kept, dropped = data["files"], [], []
    for e in data["kernels"]:
        try:
            check_kernel(out, e, files)
            check_file(out, e["lib"], files.get(e["lib"]))
            kept.append(e)
        except BundleError:
            dropped.append(str(e.get("lib") if isinstance(e, dict) else e))
    if dropped:
        print(f"tirx-gemm: dropping {len(dropped)} kernel(s) of {out} that no longer match "
              f"the manifest ({', '.join(dropped[:3])}{', ...' if len(dropped) > 3 else ''}); "
              "export them again", file=sys.stderr)
    wheels = []
    for rel, want in files.items():
        if rel.startswith("wheels/"):
            try:
                check_file(out, rel, want)
                wheels.append(rel)
            except BundleError:
                pass
    return kept, wheels


def _copy_checked(src: Path, dst: Path, want: str | None = None) -> str:
    """Copy a regular file (never through a symlink) and return the copy's sha256, which
    must equal ``want`` when given."""
    with os.fdopen(open_plain(src), "rb") as fin, open(dst, "xb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())
    got = file_sha256(dst)
    if want is not None and got != want:
        raise BuildError(f"{src} changed while being exported (sha256 {got[:12]}..., "
                         f"expected {want[:12]}...): export again")
    return got


def export(requests, out: Path, *, jobs=None, progress=True, ffi_wheel_python=None,
           watchdog_ms: int | None = None) -> int:
    """Build ``requests`` and add them to the bundle at ``out`` (made if absent; a kernel
    already there with the same file name is replaced). Locked against concurrent exports
    into the same folder, and atomic: the new bundle is written beside it and renamed into
    place, so a failed export leaves the previous bundle as it was (or none)."""
    from tirx_gemm.compile.api import build_many
    from tirx_gemm.compile.cache import InvalidEntry, verify_entry

    out = Path(out)
    check_out_dir(out)
    if out.is_dir() and not out.is_symlink() and any(out.iterdir()) \
            and not os.path.lexists(out / MANIFEST):
        raise ValueError(f"--out {out} is a folder that is not a bundle (no {MANIFEST}): "
                         "export into a new or empty folder")
    if out.is_symlink():
        raise ValueError(f"--out {out} is a symlink: export into a real folder")

    from tirx_gemm.progress import Progress
    prog = Progress("building", len(requests), enabled=bool(progress))

    def show(done, total, req, res):
        prog.build_done(req, res)

    with prog:
        results = build_many(requests, jobs=jobs, progress=show, watchdog_ms=watchdog_ms)
    errors = [(req, r) for req, r in zip(requests, results) if isinstance(r, Exception)]
    if errors:  # nothing is written: a bundle never ships part of what was asked
        why = "; ".join(f"{req[0].key} {'x'.join(map(str, req[1]))}: "
                        f"{(str(r).strip() or type(r).__name__).splitlines()[0]}"
                        for req, r in errors)
        raise BuildError(f"{len(errors)} of {len(requests)} build(s) failed, nothing exported: "
                         f"{why}")
    for r in results:  # the cache entry as it is now, not as it was when it was loaded
        try:
            verify_entry(r)
        except InvalidEntry as exc:
            raise BuildError(f"cache entry {r.dir} of {r.step}@{r.arch} changed after it was "
                             f"built ({exc}): build it again with `tirx-gemm build {r.step} "
                             f"--arch {r.arch} --no-cache`, then export") from None
    rt_src = _tvm_lib_dir()
    from tirx_gemm.gitinfo import git_sha
    sha = git_sha()
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    with _export_lock(parent, out):
        recover_interrupted(out)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=parent))
        os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes it private; a bundle is not
        try:
            kernels, wheels = _previous_kernels(out, progress)
            record = out / "cards.json"  # tirx_gemm.op.cards.RECORD: the cards suite exports picked for
            if record.is_file() and not record.is_symlink():
                shutil.copyfile(record, stage / "cards.json")
            files: dict[str, str] = {}
            for e in kernels:
                files[e["lib"]] = _copy_checked(out / e["lib"], stage / e["lib"], e["sha256"])
            for r in results:
                name = lib_name(r.step, r.arch, r.M, r.N, r.K, r.kwargs, r.watchdog_ms)
                if name in files:
                    (stage / name).unlink()
                files[name] = _copy_checked(r.lib_path, stage / name, r.sha256.get("kernel.so"))
                entry = {"step": r.step, "arch": r.arch, "M": r.M, "N": r.N, "K": r.K,
                         "kwargs": r.kwargs, "dtype": r.kwargs.get("dtype", "float16"),
                         "watchdog_ms": r.watchdog_ms, "lib": name, "sha256": files[name],
                         "tvm_version": r.tvm_version, "build_key": r.key, "git_sha": sha,
                         "registers": r.registers, "smem_bytes": r.smem_bytes,
                         "spills": r.spill_stores + r.spill_loads}
                entry["binding"] = kernel_binding(entry)
                kernels = [e for e in kernels if e["lib"] != name] + [entry]
            (stage / "runtime").mkdir()
            for lib in RUNTIME_LIBS:
                files[f"runtime/{lib}"] = _copy_checked(rt_src / lib, stage / "runtime" / lib)
            if wheels or ffi_wheel_python:
                (stage / "wheels").mkdir()
            for rel in wheels:
                files[rel] = _copy_checked(out / rel, stage / rel)
            if ffi_wheel_python:
                for rel, digest in _download_ffi_wheel(ffi_wheel_python, stage).items():
                    files[rel] = digest
            manifest = {"format": FORMAT, "kernels": kernels, "files": files}
            with open(stage / MANIFEST, "x", encoding="utf-8") as f:
                f.write(json.dumps(manifest, indent=1))
                f.flush()
                os.fsync(f.fileno())
            verify(stage, expect_sha256="")  # what is swapped in is what a GPU host accepts
            _swap_in(stage, out)
        except OSError as exc:
            raise _write_error(exc, out) from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return len(results)


def recover_interrupted(out: Path) -> list[str]:
    """What an export killed outright (SIGKILL, power loss) left beside ``out``: its staging
    folders (``.<name>.new-*``) and the previous bundle renamed aside (``.<name>.old-*``).
    Called under the export lock, so no export is using them. With no bundle at ``out``
    (killed between the two renames) the newest of them that verifies is renamed into place
    (a finished stage first: it holds the old kernels and the new); the rest are removed.
    Each action is one line on stderr; returns those lines."""
    out = Path(out)
    parent = out.absolute().parent
    news = [p for p in parent.glob(f".{out.name}.new-*") if p.is_dir() and not p.is_symlink()]
    olds = [p for p in parent.glob(f".{out.name}.old-*") if p.is_dir() and not p.is_symlink()]

    def newest(paths):
        return sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True)

    lines = []
    if not os.path.lexists(out):
        for cand in [*newest(news), *(p / "bundle" for p in newest(olds))]:
            try:
                verify(cand, expect_sha256="")
            except (ValueError, OSError):  # BundleError is a ValueError; no manifest too
                continue
            os.rename(cand, out)
            lines.append(f"tirx-gemm: recovered the bundle at {out} from {cand}, left by an "
                         "interrupted export")
            break
    for p in news + olds:
        if os.path.lexists(p):
            shutil.rmtree(p, ignore_errors=True)
            lines.append(f"tirx-gemm: removed {p}, left by an interrupted export")
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return lines


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _download_ffi_wheel(python: str, stage: Path) -> dict:
    from tirx_gemm.compile.api import run_tool
    py = python.replace(".", "")
    dest = stage / "wheels"
    before = set(os.listdir(dest))
    pip = run_tool([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", python,
                    "--implementation", "cp", "--abi", f"cp{py}",
                    "--platform", "manylinux_2_28_x86_64", "-d", str(dest),
                    f"apache-tvm-ffi=={FFI_VERSION}"], name="pip download")
    if pip.returncode != 0:
        tail = (pip.stderr.strip().splitlines() or ["no output"])[-1]
        raise BuildError(f"pip download of apache-tvm-ffi=={FFI_VERSION} for Python "
                         f"{python} failed: {tail}; {_kept(stage.parent)}")
    return {f"wheels/{n}": file_sha256(dest / n) for n in sorted(set(os.listdir(dest)) - before)}


def _swap_in(stage: Path, out: Path) -> None:
    """Rename the finished bundle into place; the previous one (if any) is renamed aside
    first and removed after. A crash between the two renames leaves no bundle at ``out``
    (and the previous one beside it), never a mixed one."""
    fsync_dir(stage)
    if not os.path.lexists(out):
        os.rename(stage, out)
    else:
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=stage.parent))
        os.rename(out, old / "bundle")
        try:
            os.rename(stage, out)
        except OSError:
            os.rename(old / "bundle", out)
            raise
        finally:
            shutil.rmtree(old, ignore_errors=True)
    fsync_dir(out.absolute().parent)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
