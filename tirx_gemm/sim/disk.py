"""NumSim's cache on disk: how big it is, and room made by deleting its least recently used
kernels. Standard library only: CI's first step (scripts/prune_sim_cache.py) runs it before
any venv exists, since a full disk fails the first ``pip install`` before anything can say why.

NumSim keeps one content-addressed entry per transpiled kernel under ``artifacts/`` and
``build/artifacts/`` (about 10 MB each; a full ``tirx-gemm sim --all --mutants`` writes about
500 of each, about 11 GB) and deletes none. An entry removed here is rebuilt the next time its
kernel is simulated; nothing else is touched (not the cargo target, not the engines). The
cache is found as NumSim finds it: ``NUMSIM_CACHE_DIR`` / ``NUMSIM_BUILD_CACHE_DIR``, else
``$XDG_CACHE_HOME/tirx-numsim``, else ``~/.cache/tirx-numsim``. An entry's last use is the
latest access or write time of its files (the kernel library is read on every cache hit; on
a disk mounted relatime the access time moves at least once a day)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

GIB = 1 << 30
CACHE_MAX_GIB = 20.0  # `tirx-gemm sim` keeps the cache under this: about two full runs


def cache_roots(env: dict | None = None) -> tuple[Path, Path]:
    """(artifact cache root, build cache root), as NumSim resolves them."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    root = Path(env.get("NUMSIM_CACHE_DIR") or base / "tirx-numsim").expanduser()
    build = Path(env.get("NUMSIM_BUILD_CACHE_DIR") or base / "tirx-numsim" / "build").expanduser()
    return root, build


def _use_and_size(path: Path) -> tuple[float, int]:
    """(last use: the latest atime or mtime of the entry's files, bytes)."""
    last, size = 0.0, 0
    try:
        st = path.lstat()
    except FileNotFoundError:
        return last, size
    if not path.is_dir() or path.is_symlink():
        return max(st.st_atime, st.st_mtime), st.st_size
    last = st.st_mtime  # not a folder's atime: listing it (this walk too) moves that
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            last, size = max(last, st.st_atime, st.st_mtime), size + st.st_size
    return last, size


def entries(root: Path, build: Path) -> list[tuple[float, int, Path]]:
    """Every artifact entry under both roots, least recently used first: (last use, bytes,
    path)."""
    found = []
    for folder in {root / "artifacts", build / "artifacts"}:
        if folder.is_dir():
            found += [(*_use_and_size(p), p) for p in folder.iterdir()]
    return sorted(found, key=lambda e: (e[0], str(e[2])))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _probe(path: Path) -> Path:
    """The nearest existing folder at or above ``path`` (disk_usage needs one)."""
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(root: Path) -> int:
    return shutil.disk_usage(_probe(root)).free


def make_room(root: Path, build: Path, *, min_free: int, keep_s: float, free=None,
              now: float | None = None) -> dict:
    """Delete the least recently used entries until ``free()`` reports at least ``min_free``
    bytes, never one used in the last ``keep_s`` seconds. ``free`` defaults to the free bytes
    of the disk holding ``root``. Returns what was done."""
    free = free or (lambda: free_bytes(root))
    now = time.time() if now is None else now
    before = free()
    removed, freed = 0, 0
    if before < min_free:
        for last, size, path in entries(root, build):
            if free() >= min_free or now - last < keep_s:
                break
            _remove(path)
            removed, freed = removed + 1, freed + size
    return {"free_before": before, "free_after": free(), "removed": removed, "freed": freed}


def cap(root: Path, build: Path, *, max_bytes: int, keep_since: float) -> dict:
    """Keep the artifact entries under ``max_bytes`` in all: delete the least recently used
    first, never one used at or after ``keep_since`` (a run's start). Returns what was done."""
    found = entries(root, build)
    total = sum(size for _, size, _ in found)
    removed, freed = 0, 0
    for last, size, path in found:
        if total - freed <= max_bytes or last >= keep_since:
            break
        _remove(path)
        removed, freed = removed + 1, freed + size
    return {"entries": len(found) - removed, "bytes": total - freed, "removed": removed,
            "freed": freed}


def cap_line(max_gib: float, keep_since: float, env: dict | None = None) -> str:
    """`tirx-gemm sim`'s last line on the cache: its size after keeping it under ``max_gib``."""
    root, build = cache_roots(env)
    done = cap(root, build, max_bytes=int(max_gib * GIB), keep_since=keep_since)
    line = (f"NumSim cache: {done['bytes'] / GIB:.1f} GiB in {done['entries']} kernel entries "
            f"under {root} (kept under {max_gib:g} GiB: --cache-max-gib")
    if done["removed"]:
        line += f"; removed the {done['removed']} least recently used, {done['freed'] / GIB:.1f} GiB"
    if done["bytes"] > max_gib * GIB:
        line += "; this run's own entries alone are more"
    return line + ")"
