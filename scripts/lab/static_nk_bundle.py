"""One bundle for matmul before and after plain one-CTA v12 tiles were built for their
layer's N and K (matmul_choice._tile_kwargs), so both packages can be timed from one
carry: every kernel this checkout's matmul asks for over the given suites, plus each of its
plain one-CTA v12 kernels as the package before built it (RUNTIME_NK, at the nominal
shape). Extra kernels in a bundle are never asked for; each package finds its own.

    python scripts/lab/static_nk_bundle.py --out .gpu/nkab-bfloat16 SUITE.json [SUITE.json]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def requests(suites, sm_count: int = 132) -> list[tuple]:
    from tirx_gemm import suite as S
    from tirx_gemm.matmul_choice import build_shape
    out, seen = [], set()

    def add(step, mnk, kw):
        key = (step.key, build_shape(mnk, kw), tuple(sorted(kw.items())))
        if key not in seen:
            seen.add(key)
            out.append((step, build_shape(mnk, kw), dict(kw)))

    for path in suites:
        for step, mnk, kw in S.export_requests(S.load_suite(path), "matmul", "sm_90a",
                                               sm_count):
            add(step, mnk, kw)
            plain = (step.id == "v12" and kw.get("RUNTIME_M") and "RUNTIME_NK" not in kw
                     and not kw.get("SWAP_AB") and kw.get("CLUSTER", 1) == 1
                     and "SPLIT_K" not in kw and kw.get("SHIFT_LAST"))
            if plain:  # the package before: N and K at run time
                add(step, mnk, {**kw, "RUNTIME_NK": True})
    return out


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("suites", nargs="+")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    from tirx_gemm.compile import bundle
    reqs = requests(a.suites)
    print(f"{len(reqs)} kernels")
    bundle.export(reqs, a.out, ffi_wheel_python="3.12")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
