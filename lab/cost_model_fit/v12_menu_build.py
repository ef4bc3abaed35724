"""Build sm_90a v12 at every tile of its menu (and at edge shapes) and print a table of what
ptxas reports: registers, shared memory, spills, and the ring depth each build got.

    python lab/cost_model_fit/v12_menu_build.py              # the whole list (~40 builds)
    python lab/cost_model_fit/v12_menu_build.py --quick      # one build per menu entry
    python lab/cost_model_fit/v12_menu_build.py --runtime    # the run-time-shape builds only
    python lab/cost_model_fit/v12_menu_build.py --jobs 1     # on a busy machine

A build with spills, a stack frame or a failure is flagged in the last column and the
script exits 1. Nothing runs on a GPU: this checks that each entry compiles to sane SASS.
"""

from __future__ import annotations

import argparse
import sys

# (BLK_M, BLK_N): decode tiles, the mid sizes, the large tiles, two that need a partial
# 64-column chunk on top of full ones (80 = 64 + 16, 144 = 2 x 64 + 16), and the rest of
# lab/tools/v12_sweep.py's menu (64x256: 192 accumulator + packed values, no setmaxnreg)
MENU = ((64, 16), (64, 32), (64, 64), (128, 64), (128, 128), (128, 192), (128, 256),
        (64, 80), (128, 144), (64, 48), (64, 96), (64, 128), (64, 256), (128, 96))
SHAPES = ((1024, 1024, 1024), (16, 14336, 4096))
# edge shapes: a single row, odd token counts, N not a multiple of any tile, K below BLK_K
EDGE_SHAPES = ((1, 4104, 72), (77, 4104, 8), (333, 4104, 4104))
EDGE_TILES = ((64, 16), (64, 48), (128, 144), (128, 256))


def requests(quick: bool):
    out = []
    for bm, bn in MENU:
        for dtype in (("float16",) if quick else ("float16", "bfloat16")):
            for rt in ((False,) if quick else (False, True)):
                out.append(((1024, 1024, 1024) if bm == 128 else (16, 14336, 4096),
                            dict(BLK_M=bm, BLK_N=bn, dtype=dtype, RUNTIME_M=rt)))
    if not quick:
        for bm, bn in EDGE_TILES:
            for shape in EDGE_SHAPES:
                out.append((shape, dict(BLK_M=bm, BLK_N=bn, RUNTIME_M=shape[0] == 77)))
        # the whole shape at run time (one kernel per tile): the lab sweep's builds
        for bm, bn in MENU:
            out.append(((128, 256, 256), dict(BLK_M=bm, BLK_N=bn, RUNTIME_M=True,
                                              RUNTIME_NK=True)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fp16, RUNTIME_M off, menu only")
    ap.add_argument("--runtime", action="store_true",
                    help="only the RUNTIME_M + RUNTIME_NK build of each menu entry")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-cache", action="store_true")
    args = ap.parse_args(argv)

    from tirx_gemm import registry
    from tirx_gemm.compile import api
    import importlib
    v12 = importlib.import_module(registry.get("v12", "sm_90a").module)

    step = registry.get("v12", "sm_90a")
    reqs = requests(args.quick)
    if args.runtime:
        reqs = [r for r in requests(False) if r[1].get("RUNTIME_NK")]
    results = api.build_many([(step, shape, kw) for shape, kw in reqs], jobs=args.jobs,
                             use_cache=not args.no_cache)
    head = (f"{'BLK':>8} {'dtype':>5} {'RT':>4} {'M,N,K':>16} {'depth':>5} {'regs':>4} "
            f"{'smem KB':>7} {'spills':>6} {'stack':>5} {'HGMMA':>16}  note")
    print(head)
    print("-" * len(head))
    bad = 0
    for (shape, kw), r in zip(reqs, results):
        tile = f"{kw['BLK_M']}x{kw['BLK_N']}"
        dt = "bf16" if kw.get("dtype") == "bfloat16" else "fp16"
        mnk = ",".join(map(str, shape))
        if isinstance(r, Exception):
            bad += 1
            print(f"{tile:>8} {dt:>5} {_rt(kw):>4} {mnk:>16}  FAILED: "
                  f"{str(r).splitlines()[0][:100]}")
            continue
        depth = _depth(v12, kw)
        spills = r.spill_stores + r.spill_loads
        hgmma = sorted(k for k in r.sass_counts if k.startswith("HGMMA"))
        note = "SPILLS" if spills or r.stack_bytes else ""
        bad += bool(note)
        print(f"{tile:>8} {dt:>5} {_rt(kw):>4} {mnk:>16} {depth:>5} "
              f"{r.registers or 0:>4} {(r.smem_bytes or 0) / 1024:>7.1f} {spills:>6} "
              f"{r.stack_bytes:>5} {(hgmma[0].split('.')[1] if hgmma else '-'):>16}  {note}")
    print(f"{len(reqs)} builds, {bad} with a failure, spills or a stack frame")
    return 1 if bad else 0


def _rt(kw) -> str:
    """What is a run-time variable: M, MNK or nothing (-)."""
    return ("MNK" if kw.get("RUNTIME_NK") else "M") if kw.get("RUNTIME_M") else (
        "NK" if kw.get("RUNTIME_NK") else "-")


def _depth(v12, kw) -> int:
    """The ring depth the builder picks by default (as its own rule computes it)."""
    bm, bn = kw["BLK_M"], kw["BLK_N"]
    chunks = bn // 64
    staging = (bm // 64) * (2 if chunks % 2 == 0 else 1) * 8192 if chunks else 0
    from tirx_gemm import spec
    return min(v12.AUTO_DEPTH_MAX, spec.ring_stages((bm + bn) * 128, staging))


if __name__ == "__main__":
    sys.exit(main())
