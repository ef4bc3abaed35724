"""Export the bundle of v13 kernels that tirx_gemm.matmul_fp8 and lab/fp8_on_hopper/fp8_h200.py
load on the H200: every kernel fp8.choose_fp8 can pick (fp8.export_requests:
SCALE tensor / row / block, fast_accum or not, BLK_M 64 / 128; RUNTIME_M and RUNTIME_NK,
so they serve every shape), bf16 out, for a GPU of --num-sms SMs; the per-tensor
variants fp8_h200.py times next to them (fp8.lab_variants: the first run's serial promotion and
the 128 x 128 tile without promotion); and, unless
--no-run-shapes, v13's registry builds at its GPU shapes (registry.gpu_shapes: canonical,
tests, benchmarks; per-tensor scales, fp16 out, the builder's defaults), which
`python -m tirx_gemm.cli run v13 --arch sm_90a --mnk M,N,K --bundle DIR` runs.

  .venv/bin/python lab/fp8_on_hopper/fp8_export.py --out .gpu/fp8 [--ffi-wheel 3.12]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tirx_gemm import registry

from tirx_gemm.op import fp8
from tirx_gemm.compile import bundle


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-sms", type=int, default=132)
    ap.add_argument("--ffi-wheel", default="3.12", help="Python of the GPU host ('' for none)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--no-run-shapes", action="store_true",
                    help="only matmul_fp8's kernels, not the registry shapes `run` takes")
    a = ap.parse_args(argv)
    out = Path(a.out)
    bundle.check_out_dir(out)
    reqs = fp8.export_requests(a.num_sms)
    seen = {tuple(sorted(kw.items())) for _, _, kw in reqs}
    reqs += [r for r in fp8.lab_variant_requests(a.num_sms)
             if tuple(sorted(r[2].items())) not in seen]
    if not a.no_run_shapes:
        step = registry.get(fp8.FP8_STEP, fp8.ARCH)
        reqs += [(step, mnk, {}) for mnk in registry.gpu_shapes(step)]
    n = bundle.export(reqs, out, jobs=a.jobs, progress=True,
                      ffi_wheel_python=a.ffi_wheel or None)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"exported {n} v13 kernels to {out}/ ({size / 2**20:.1f} MiB, manifest sha256 "
          f"{bundle.manifest_sha256(out)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
