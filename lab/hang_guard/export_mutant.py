"""Export a deliberately broken step (tirx_gemm/mutants.py) into a bundle for a GPU host.

Used to prove, on a real GPU, that a protocol bug ends in an error and not a frozen
process: once built with ``--watchdog-ms`` (the kernel traps and names the barrier that
stalled) and once without (the host's hang guard reports the kernel hang). The bundle then
runs with the ordinary CLI, for example on an H200:

    python lab/hang_guard/export_mutant.py producer-phase-0 --mnk 256,512,320 --num-sms 132 \\
        --out build/bundle-hang                       # once plain,
    python lab/hang_guard/export_mutant.py producer-phase-0 --mnk 256,512,320 --num-sms 132 \\
        --watchdog-ms 1500 --out build/bundle-hang    # once with the watchdog
    python -m tirx_gemm.cli run v7 --arch sm_90a --bundle build/bundle-hang \\
        --mnk 256,512,320 [--watchdog-ms 1500]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm.compile import bundle
from tirx_gemm import mutants


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mutant", choices=sorted(mutants.MUTANTS))
    ap.add_argument("--mnk", required=True, help="M,N,K")
    ap.add_argument("--num-sms", type=int, help="persistent steps: the GPU's SM count")
    ap.add_argument("--watchdog-ms", type=int, help="bounded mbarrier waits (ms)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    m = mutants.get(args.mutant)
    step = registry.get(m.step, m.arch)
    try:
        mnk = tuple(int(x) for x in args.mnk.split(","))
        if len(mnk) != 3:
            raise ValueError
    except ValueError:
        print(f"export_mutant: error: --mnk wants M,N,K, got {args.mnk!r}", file=sys.stderr)
        return 2
    kwargs = {"mutant": m.name, **step.with_sm_count(args.num_sms)}
    try:
        n = bundle.export([(step, mnk, kwargs)], Path(args.out), watchdog_ms=args.watchdog_ms)
    except (ValueError, RuntimeError) as e:
        print(f"export_mutant: error: {e}", file=sys.stderr)
        return 2
    print(f"exported {n} kernel(s): {step.key} {args.mnk} mutant {m.name} "
          f"(watchdog {args.watchdog_ms or 'off'}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
