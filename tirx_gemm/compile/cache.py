"""The build cache: one folder per build under ``<cache>/builds/<key>``, trusted only as far
as it checks out.

- The key hashes everything a build depends on: BUILD_FORMAT, the step, shape, builder
  kwargs and watchdog, the sources that generate the kernel (KEY_SOURCES) and the resolved
  toolchain (toolchain.toolchain_id: nvcc, ptxas, cicc, headers, host compiler, TVM), so an
  entry built by another toolchain is never served.
- An entry appears only by renaming a finished work folder into place. Its meta.json holds the
  sha256 of every artefact; loading checks them, and refuses an entry with a symlink anywhere
  in it. An invalid entry is rebuilt, with a one-line notice. meta.json stores no absolute
  path, so a moved cache folder still works.
- A work folder (``<key>.<random>``) belongs to whoever holds the flock of its owner.lock; the
  stale sweep removes only folders whose lock is free (their builder is gone), which holds
  across PID namespaces (containers sharing a cache) and PID reuse.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

from tirx_gemm import settings
from tirx_gemm.compile.sass import KEY_SASS
from tirx_gemm.registry import Step
from tirx_gemm.stepshape import StepShape
from tirx_gemm.compile.toolchain import toolchain_id

__all__ = ["ARTEFACTS", "BUILD_FORMAT", "BuildResult", "InvalidEntry", "KEY_SOURCES", "META",
           "WorkFolder", "artefact_hashes", "cache_key", "cache_root", "count_prefix",
           "install_entry", "key_sources", "load_cached", "read_entry", "sha256_file", "sweep_stale",
           "verify_entry"]

BUILD_FORMAT = 6  # bump when the cached artefacts or their meaning change
PKG_DIR = Path(__file__).resolve().parents[1]

ARTEFACTS = ("kernel.cu", "kernel.cubin", "kernel.so", "kernel.sass", "kernel.tir.py")
META = "meta.json"  # written last: holds the artefacts' sha256
LOCK = "owner.lock"
# the package modules that shape what a build produces (besides the step's own source): the
# kernel-authoring library, and the pipeline and libcuda loading that compile and export it
# (paths below the package folder; every one must exist: a moved module is an error, never
# a source silently left out of the key; tests/test_hostile_errors.py checks them all)
KEY_SOURCES = {"sm_100a": ("helpers.py", "blackwell/__init__.py", "blackwell/tcgen05.py",
                           "blackwell/stores.py", "blackwell/cluster.py", "blackwell/clc.py",
                           "blackwell/fused.py", "blackwell/fp8.py", "blackwell/grouped.py",
                           "blackwell/layouts.py", "blackwell/act_grad.py", "hopper/fp8.py", "hopper/grouped.py",
                           "hopper/layouts.py",
                           "hopper/wgmma.py", "hopper/fused.py", "hopper/stores.py", "hopper/cluster.py", "timeline.py",
                           "splitk.py", "streamk.py", "pdl.py", "epilogue.py", "spec.py", "numerics.py",
                           "compile/pipeline.py", "compile/names.py", "compile/cudalibs.py"),
               "sm_90a": ("helpers.py", "hopper/__init__.py", "hopper/wgmma.py",
                          "hopper/stores.py", "hopper/fused.py", "hopper/cluster.py",
                          "hopper/fp8.py", "hopper/checks.py", "hopper/grouped.py", "hopper/layouts.py",
                          "timeline.py",
                          "splitk.py", "streamk.py", "pdl.py", "epilogue.py", "spec.py", "numerics.py",
                          "compile/pipeline.py", "compile/names.py", "compile/cudalibs.py")}
STALE_UNOWNED_S = 600  # a work folder without a lock file is a crash between two syscalls


def count_prefix(counts: dict, prefix: str) -> int:
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))


@dataclasses.dataclass
class BuildResult(StepShape):
    """One build of a step at a shape (stepshape.StepShape: step, arch, M, N, K first)."""
    kwargs: dict
    key: str
    dir: str
    registers: int | None
    smem_bytes: int | None          # dynamic shared memory per CTA (launch parameter)
    static_smem_bytes: int | None   # static shared memory reported by ptxas
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    sass_counts: dict               # opcode (full mnemonic) -> count
    times: dict                     # seconds: tvm, nvcc, sass, export, total
    tvm_version: str
    nvcc_version: str
    watchdog_ms: int | None = None  # bounded mbarrier waits (helpers.set_watchdog), or None
    sha256: dict = dataclasses.field(default_factory=dict)  # artefact name -> sha256 (hex)
    cached: bool = False

    # artefact paths
    @property
    def cuda_path(self) -> Path:
        return Path(self.dir) / "kernel.cu"

    @property
    def cubin_path(self) -> Path:
        return Path(self.dir) / "kernel.cubin"

    @property
    def sass_path(self) -> Path:
        return Path(self.dir) / "kernel.sass"

    @property
    def tir_path(self) -> Path:
        return Path(self.dir) / "kernel.tir.py"

    @property
    def lib_path(self) -> Path:
        return Path(self.dir) / "kernel.so"

    @property
    def cuda_source(self) -> str:
        return self.cuda_path.read_text()

    @property
    def sass(self) -> str:
        return self.sass_path.read_text()

    @property
    def tir(self) -> str:
        return self.tir_path.read_text()

    def key_sass(self) -> dict:
        """Counts of the opcodes the lessons talk about (prefix match on the mnemonic)."""
        return {k: n for k in KEY_SASS if (n := count_prefix(self.sass_counts, k))}

    def to_json(self) -> dict:
        """meta.json: everything but the folder, which is wherever the entry is found."""
        d = dataclasses.asdict(self)
        d.pop("cached")
        d.pop("dir")
        return d


class InvalidEntry(Exception):
    """A cache entry that must not be used (the message says why)."""


_usable_roots: set = set()  # cache roots checked by cache_root in this process


def cache_root() -> Path:
    """$TIRX_GEMM_CACHE, else ~/.cache/tirx-gemm (tirx_gemm.settings), checked once per
    process to be a folder or a place one can be made: a one-line ValueError naming the
    setting otherwise (a raw NotADirectoryError / FileExistsError of a path under it
    reached the user from the first build)."""
    root = settings.get("TIRX_GEMM_CACHE")
    if root not in _usable_roots:
        why = _unusable(Path(root))
        if why:
            raise ValueError(f"TIRX_GEMM_CACHE={root}: cannot hold the build cache ({why}): "
                             f"point TIRX_GEMM_CACHE at a folder you can write, or unset it "
                             f"for ~/.cache/tirx-gemm")
        _usable_roots.add(root)
    return root


def _unusable(root: Path) -> str | None:
    """Why no cache folder can be at ``root`` (no folder is made), or None."""
    if os.path.lexists(root) and not root.exists():
        return "a symlink to nothing"
    if root.exists():
        return None if root.is_dir() else "it is a file"
    near = next((d for d in root.parents if os.path.lexists(d)), None)
    if near is None or not near.is_dir():
        return f"{near} is not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tirx-gemm-probe-", dir=near))
    except OSError as exc:
        return f"no folder can be made in {near}: {exc.strerror or exc}"
    return None


def builds_dir() -> Path:
    return cache_root() / "builds"


def _mount_point(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def disk_full(path) -> str | None:
    """"the file system at MOUNT (holding PATH) is full: ..." when the file system holding
    ``path`` (or its nearest existing parent) has less free space than the largest build
    entry in the cache needs (1 MiB while the cache holds none); else None."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    sizes = []
    for entry in _listdir(builds_dir()):
        if "." in entry:  # a work folder (KEY.random), not a finished build
            continue
        d = builds_dir() / entry
        try:
            sizes.append(sum(f.stat().st_size for f in d.iterdir() if f.is_file()))
        except OSError:
            continue
    need = max(sizes, default=2**20)
    if free >= need:
        return None
    basis = (f"the largest of the {len(sizes)} builds in the cache" if sizes else
             "no build in the cache to measure")
    return (f"the file system at {_mount_point(where)} (holding {path}) is full: "
            f"{_mib(free)} free, a build needs about {_mib(need)} ({basis}); free some "
            f"space there, or point $TIRX_GEMM_CACHE at another file system")


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def cache_key(step: Step, M: int, N: int, K: int, kwargs: dict,
              watchdog_ms: int | None = None) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([BUILD_FORMAT, step.key, M, N, K, sorted(kwargs.items()), watchdog_ms,
                         toolchain_id()], default=str).encode())
    for path in key_sources(step):
        try:
            h.update(path.read_bytes())
        except OSError as exc:
            raise FileNotFoundError(
                f"cache key source {path} is not readable ({exc.strerror or exc}): the "
                "package is incomplete, or a module moved without cache.KEY_SOURCES "
                "following it; reinstall tirx-gemm or fix KEY_SOURCES") from None
    return h.hexdigest()[:20]


def key_sources(step: Step) -> list[Path]:
    """The files whose bytes go into ``step``'s cache keys: its builder, KEY_SOURCES of its
    arch and, for a step with a workspace (v11), the module that sizes it."""
    sources = [Path(step.source_file), *(PKG_DIR / f for f in KEY_SOURCES[step.arch])]
    if step.workspace:  # e.g. v11: its builder asks tirx_gemm.splitk for the split count
        module = step.workspace.split(":")[0]
        if not module.startswith("tirx_gemm."):
            raise ValueError(f"{step.key}: workspace {step.workspace!r} is not a tirx_gemm "
                             "module, so no cache key can cover it")
        sources.append(PKG_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py"))
    return sources


# ---------------------------------------------------------------------------------------
# entries: hashed artefacts, no symlinks
# ---------------------------------------------------------------------------------------
def _open_plain(path: Path) -> int:
    """A read-only descriptor of ``path``, which must be a regular file, not a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def sha256_file(path: Path) -> str:
    """sha256 (hex) of a regular file, refusing a symlink."""
    h = hashlib.sha256()
    with os.fdopen(_open_plain(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def artefact_hashes(folder: Path) -> dict:
    """{artefact: sha256} of a finished build's folder (written into its meta.json)."""
    return {name: sha256_file(folder / name) for name in ARTEFACTS}


def _symlink_in(folder: Path) -> str | None:
    """The first symlink in ``folder`` (itself included), relative to it, or None."""
    if folder.is_symlink():
        return "."
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                return os.path.relpath(os.path.join(dirpath, name), folder)
    return None


def read_entry(entry: Path, key: str) -> BuildResult:
    """The build stored in ``entry``, checked: no symlink anywhere in it, meta.json of this
    key, every artefact a non-empty regular file whose sha256 is the one meta.json holds.
    InvalidEntry says why it cannot be used."""
    link = _symlink_in(entry)
    if link is not None:
        raise InvalidEntry("the entry is a symlink" if link == "." else f"{link} is a symlink")
    try:
        with os.fdopen(_open_plain(entry / META), "rb") as f:
            data = json.loads(f.read().decode())
    except FileNotFoundError:
        raise InvalidEntry("no meta.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidEntry(f"meta.json is not readable JSON: {exc}") from None
    except RecursionError:  # nesting no build writes
        raise InvalidEntry("meta.json nests too deeply to be a build's") from None
    if not isinstance(data, dict) or data.get("key") != key:
        raise InvalidEntry("meta.json does not describe this build")
    try:
        res = BuildResult(**data, dir=str(entry))
    except TypeError as exc:
        raise InvalidEntry(f"meta.json has the wrong fields: {exc}") from None
    wrong = _wrong_type(data)
    if wrong:
        raise InvalidEntry(f"meta.json's {wrong}")
    for name in ARTEFACTS:
        path = entry / name
        if not path.is_file() or path.stat().st_size == 0:
            raise InvalidEntry(f"{name} is missing or empty")
    _check_hashes(res)
    return res


_TYPES = {"int": (int,), "str": (str,), "dict": (dict,), "bool": (bool,), "float": (int, float),
          "None": (type(None),)}


def _wrong_type(data: dict) -> str | None:
    """"<field> is <value>, not <type>" for the first meta.json field whose JSON type is not
    the one BuildResult declares (a bool is no int), or for a count or time that is not a
    number: such an entry is rebuilt, not served to crash whatever reads it."""
    for f in dataclasses.fields(BuildResult):
        if f.name not in data:
            continue
        v = data[f.name]
        allowed = [_TYPES[t.strip()] for t in str(f.type).split("|") if t.strip() in _TYPES]
        if not allowed:
            continue
        ok = any(isinstance(v, t) for ts in allowed for t in ts)
        if isinstance(v, bool) and not any(bool in ts for ts in allowed):
            ok = False
        if not ok:
            return f"{f.name} is {v!r:.60}, not {str(f.type).replace(' | ', ' or ')}"
    for name, kind in (("sass_counts", int), ("times", (int, float))):
        bad = [k for k, n in data.get(name, {}).items()
               if isinstance(n, bool) or not isinstance(n, kind)]
        if bad:
            return f"{name}[{bad[0]!r}] is {data[name][bad[0]]!r:.60}, not a number"
    return None


def _check_hashes(res: BuildResult) -> None:
    if not isinstance(res.sha256, dict):
        raise InvalidEntry("meta.json's sha256 is not a table of artefacts")
    for name in ARTEFACTS:
        want = res.sha256.get(name)
        if not isinstance(want, str) or len(want) != 64:
            raise InvalidEntry(f"meta.json holds no sha256 of {name}")
        try:
            got = sha256_file(Path(res.dir) / name)
        except OSError as exc:
            raise InvalidEntry(f"{name} is not readable: {exc.strerror or exc}") from None
        if got != want:
            raise InvalidEntry(f"{name} does not match the sha256 in meta.json (changed "
                               "after the build)")


def verify_entry(res: BuildResult) -> None:
    """Check a BuildResult's folder again (before exporting it, say): InvalidEntry if an
    artefact changed since it was loaded, or a symlink appeared."""
    link = _symlink_in(Path(res.dir))
    if link is not None:
        raise InvalidEntry(f"{Path(res.dir) / link} is a symlink")
    _check_hashes(res)


def load_cached(step: Step, M, N, K, kwargs, watchdog_ms=None) -> BuildResult | None:
    """The cache's valid entry for this build, or None (an invalid one is named on stderr,
    in one line, and left for the build to replace)."""
    key = cache_key(step, M, N, K, kwargs, watchdog_ms)
    entry = builds_dir() / key
    if not os.path.lexists(entry):
        return None
    try:
        res = read_entry(entry, key)
    except InvalidEntry as exc:
        print(f"tirx-gemm: cache entry {entry} is invalid ({exc}); rebuilding", file=sys.stderr)
        return None
    res.cached = True
    return res


# ---------------------------------------------------------------------------------------
# work folders: owned through a lock, never through a PID
# ---------------------------------------------------------------------------------------
class WorkFolder:
    """A fresh ``<builds>/<key>.<random>`` folder, owned for this object's life by an flock
    on its owner.lock. The lock file is locked before it takes its name, so there is no
    moment at which a sweep could find it unlocked."""

    def __init__(self, key: str):
        builds = builds_dir()
        builds.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=builds))
        tmp = self.path / f".{LOCK}.new"
        self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.rename(tmp, self.path / LOCK)

    def disown(self) -> None:
        """Remove the lock file (before the folder becomes a cache entry); still owned until
        release()."""
        (self.path / LOCK).unlink(missing_ok=True)

    def release(self) -> None:
        """Remove what is left of the folder (nothing, once renamed into place), then
        unlock."""
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None


def _lock_is_free(folder: Path) -> bool | None:
    """Whether the folder's owner.lock is free (True: its owner is gone; the lock is
    taken and dropped again), held (False), or absent (None)."""
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return True  # a lock file that is not one (a symlink, say) protects nothing
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        try:  # the owner may have just disowned it (renaming the folder into place)
            same = os.stat(folder / LOCK, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        return same
    finally:
        os.close(fd)


def sweep_stale(builds: Path | None = None) -> list[Path]:
    """Remove work folders (``<key>.<random>``) whose lock is free: what a build killed
    outright (SIGKILL, power loss, a container stopped) leaves behind. A folder without a
    lock file is removed once older than STALE_UNOWNED_S. Returns what was removed."""
    builds = builds_dir() if builds is None else builds
    removed = []
    if not builds.is_dir():
        return removed
    for d in builds.glob("*.*"):
        if d.is_symlink():
            d.unlink(missing_ok=True)
            removed.append(d)
            continue
        if not d.is_dir():
            continue
        free = _lock_is_free(d)
        if free is None:
            try:
                free = time.time() - d.stat().st_mtime > STALE_UNOWNED_S
            except OSError:
                free = False
        if free:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def install_entry(work: WorkFolder, key: str) -> BuildResult:
    """Validate a finished work folder and rename it into place as the entry of ``key``,
    replacing an entry already there (a --no-cache build, or one found invalid)."""
    read_entry(work.path, key)
    final = builds_dir() / key
    work.disown()
    (work.path / "worker.pid").unlink(missing_ok=True)
    if os.path.lexists(final):
        old = WorkFolder(key)
        try:
            final.rename(old.path / "entry")
        except OSError:
            pass  # a concurrent build replaced it first
        finally:
            old.release()
    try:
        work.path.rename(final)
    except OSError:
        if not final.is_dir() or final.is_symlink():
            raise  # else a concurrent build of the same key won: use theirs
    return read_entry(final, key)
