#!/usr/bin/env python3
"""Keep the disk that NumSim's cache lives on from filling up: when less than ``--min-free``
GiB are free there, delete the cache's oldest entries (least recently written first) until
that much is free or no entry older than ``--keep-minutes`` is left. Standard library only:
it runs before any venv exists (CI's first step), since a full disk fails the first
``pip install`` before anything else can say why.

    python3 scripts/prune_sim_cache.py --min-free 24

NumSim keeps one content-addressed entry per transpiled kernel under ``artifacts/`` and
``build/artifacts/`` (about 10 MB each; one CI run writes about 500 of each, about 11 GB),
and never deletes any. An entry removed here is rebuilt the next time its kernel is
simulated; nothing else is touched (not the cargo target, not the engines). The cache is
found as NumSim finds it: ``NUMSIM_CACHE_DIR`` / ``NUMSIM_BUILD_CACHE_DIR``, else
``$XDG_CACHE_HOME/tirx-numsim``, else ``~/.cache/tirx-numsim``. Prints one line of what it
did (or that nothing was needed) and exits 0; exits 1 only on bad arguments."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

GIB = 1 << 30


def cache_roots(env: dict | None = None) -> tuple[Path, Path]:
    """(artifact cache root, build cache root), as NumSim resolves them."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    root = Path(env.get("NUMSIM_CACHE_DIR") or base / "tirx-numsim").expanduser()
    build = Path(env.get("NUMSIM_BUILD_CACHE_DIR") or base / "tirx-numsim" / "build").expanduser()
    return root, build


def entries(root: Path, build: Path) -> list[tuple[float, Path]]:
    """Every artifact entry under both roots, oldest first: (mtime, path)."""
    found = []
    for folder in {root / "artifacts", build / "artifacts"}:
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            try:
                found.append((path.lstat().st_mtime, path))
            except FileNotFoundError:
                continue
    return sorted(found, key=lambda e: (e[0], str(e[1])))


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


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


def prune(root: Path, build: Path, *, min_free: int, keep_s: float, free=None,
          now: float | None = None) -> dict:
    """Delete the oldest entries until ``free()`` reports at least ``min_free`` bytes or
    only entries younger than ``keep_s`` seconds are left. ``free`` defaults to the free
    bytes of the disk holding ``root``. Returns what was done."""
    if free is None:
        probe = _probe(root)
        free = lambda: shutil.disk_usage(probe).free  # noqa: E731
    now = time.time() if now is None else now
    before = free()
    removed, freed = 0, 0
    if before < min_free:
        for mtime, path in entries(root, build):
            if free() >= min_free or now - mtime < keep_s:
                break
            freed += _size(path)
            _remove(path)
            removed += 1
    return {"free_before": before, "free_after": free(), "removed": removed, "freed": freed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-free", type=float, default=24.0,
                    help="GiB that must be free on the cache's disk (default 24)")
    ap.add_argument("--keep-minutes", type=float, default=60.0,
                    help="never delete an entry written in the last N minutes (default 60)")
    args = ap.parse_args(argv)
    if args.min_free <= 0 or args.keep_minutes < 0:
        ap.error("--min-free must be > 0 and --keep-minutes >= 0")
    root, build = cache_roots()
    done = prune(root, build, min_free=int(args.min_free * GIB), keep_s=args.keep_minutes * 60)
    gib = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
    if done["removed"]:
        print(f"NumSim cache ({root}): removed {done['removed']} oldest entries ({gib(done['freed'])});"
              f" free {gib(done['free_before'])} -> {gib(done['free_after'])}")
    else:
        print(f"NumSim cache ({root}): nothing removed; {gib(done['free_before'])} free"
              f" (needed {args.min_free:g} GiB)")
    if done["free_after"] < args.min_free * GIB:
        print(f"warning: only {gib(done['free_after'])} free on the disk of {root} after pruning;"
              " what needs space may fail with 'No space left on device'", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
