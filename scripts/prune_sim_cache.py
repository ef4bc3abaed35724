#!/usr/bin/env python3
"""Make room on the disk that NumSim's cache lives on: when less than ``--min-free`` GiB are
free there, delete the cache's least recently used kernels until that much is free or none
unused for ``--keep-minutes`` is left (tirx_gemm/sim/disk.py says what an entry is and where
the cache lives). Standard library only: CI's first step, before any venv exists.

    python3 scripts/prune_sim_cache.py --min-free 24

Prints one line of what it did (or that nothing was needed), a warning when the disk is
still short, and exits 0; exits 2 only on bad arguments."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tirx_gemm.sim import disk  # noqa: E402 (standard library only, no venv needed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-free", type=float, default=24.0,
                    help="GiB that must be free on the cache's disk (default 24)")
    ap.add_argument("--keep-minutes", type=float, default=60.0,
                    help="never delete an entry used in the last N minutes (default 60)")
    args = ap.parse_args(argv)
    if args.min_free <= 0 or args.keep_minutes < 0:
        ap.error("--min-free must be > 0 and --keep-minutes >= 0")
    root, build = disk.cache_roots()
    done = disk.make_room(root, build, min_free=int(args.min_free * disk.GIB),
                          keep_s=args.keep_minutes * 60)
    gib = lambda b: f"{b / disk.GIB:.1f} GiB"  # noqa: E731
    if done["removed"]:
        print(f"NumSim cache ({root}): removed the {done['removed']} least recently used entries "
              f"({gib(done['freed'])}); free {gib(done['free_before'])} -> {gib(done['free_after'])}")
    else:
        print(f"NumSim cache ({root}): nothing removed; {gib(done['free_before'])} free"
              f" (needed {args.min_free:g} GiB)")
    if done["free_after"] < args.min_free * disk.GIB:
        print(f"warning: only {gib(done['free_after'])} free on the disk of {root} after pruning;"
              " what needs space may fail with 'No space left on device'", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
