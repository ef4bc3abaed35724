"""Export the bundle of v13 kernels that tirx_gemm.matmul_fp8 and the fp8 study's scripts load on
a Hopper GPU host.

Default: every kernel fp8.choose_fp8 can pick (fp8.export_requests: SCALE tensor / row / block,
fast_accum or not, BLK_M 64 / 128; RUNTIME_M and RUNTIME_NK, so they serve every shape), bf16
out, for a GPU of --num-sms SMs; the per-tensor variants fp8_h200.py times next to them
(fp8_lab_variants.lab_variants); and, unless --no-run-shapes, v13's registry builds at its GPU
shapes (registry.gpu_shapes), which `python -m tirx_gemm.cli run v13 --arch sm_90a --mnk M,N,K
--bundle DIR` runs.

With --suite FILE [FILE ...]: the kernels `tirx-gemm bench --suite FILE` runs (suite.export_requests:
the fp8 entries' picks over all M) and, with --candidates, the tile candidates fp8_suite_run.py
times beside each pick (fp8.tile_candidates); --split-suite FILE adds the picks and K splits
(fp8.split_candidates) of that suite's cases, --thin the other A stages of each pick at M <= 16
(fp8_lab_variants.thin_candidates), --cluster the pick on a CTA pair at M > 128
(fp8_lab_variants.cluster_candidates) and the pairs fp8_pair_check.py runs, --promotion (with
the picks of the suite's own cases only, not of every M) the staggered pick and the promotion's
isolating variants at M > 128 (fp8_lab_variants.promotion_candidates), the kernels
`fp8_pair_check.py --variant stagger` runs and fp8_trace.py's instrumented builds (the staggered
builds need `git apply lab/fp8_on_hopper/patches/stagger.patch` first: STAGGER left v13, and the
export says so in one line without it); --interval (the suite's own picks too) the promotion every
second stage and the L2 groups at M > 128 (fp8_lab_variants.interval_candidates) and the kernels
`fp8_pair_check.py --variant interval` runs (v13 builds PROMOTE=8 overlapped as it is: at
K >= 8192 it is the pick, and the candidate the pick promoted every stage). With --probe: the
variants fp8_probe.py times.

  .venv/bin/python lab/fp8_on_hopper/fp8_export.py --out .gpu/fp8/bundle [--suite FILE --candidates]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

from tirx_gemm import registry

from tirx_gemm.op import fp8
from tirx_gemm.op import suite as suites
from tirx_gemm.op.matmul import build_shape
from tirx_gemm.compile import bundle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import lab_patches  # noqa: E402  (STAGGER: its patch in patches/ applied first)
from fp8_lab_variants import (cluster_candidates, lab_variant_requests, lab_variants,  # noqa: E402,F401
                              interval_candidates, interval_check_kwargs,
                              pair_check_kwargs, promotion_candidates, stagger_check_kwargs,
                              thin_candidates, wide_candidates, wide_check_kwargs)  # (this folder)


def suite_requests(path, sms: int, candidates: bool, split_path=None, thin: bool = False,
                   cluster: bool = False, promotion: bool = False, wide: bool = False,
                   interval: bool = False):
    s = suites.load_suite(path)
    step = registry.get(fp8.FP8_STEP, fp8.ARCH)
    if promotion or wide or interval:  # only the picks of the suite's own cases (a smaller bundle)
        reqs = [(step, build_shape(e.shape, kw), kw) for e, dt, mode in s.fp8_cases()
                for kw in [fp8.choose_fp8(e.M, mode, False, dt, sms, N=e.N, K=e.K)]]
    else:
        reqs = suites.export_requests(s, suites.MATMUL, fp8.ARCH, sms)
    seen = set()
    reqs = [r for r in reqs if not (tuple(sorted(r[2].items())) in seen
                                    or seen.add(tuple(sorted(r[2].items()))))]

    def add(cases, fn):
        for e, dt, mode in cases:
            for _, kw in fn(e.M, e.N, e.K, mode, dt, sms):
                key = tuple(sorted(kw.items()))
                if key not in seen:
                    seen.add(key)
                    reqs.append((step, build_shape(e.shape, kw), kw))
    if candidates:
        add(s.fp8_cases(), fp8.tile_candidates)
    if thin:
        add(s.fp8_cases(), thin_candidates)
    if cluster:
        add(s.fp8_cases(), cluster_candidates)
        at = SimpleNamespace(M=4096, N=4096, K=4096, shape=(4096, 4096, 4096))
        add([(at, "bfloat16", m) for m in fp8.numerics.FP8_SCALES],
            lambda M, N, K, mode, dt, n: [(None, kw) for kw in pair_check_kwargs(mode, n)])
    if promotion:
        add(s.fp8_cases(), promotion_candidates)
        at = SimpleNamespace(M=4096, N=4096, K=4096, shape=(4096, 4096, 4096))
        add([(at, "bfloat16", m) for m in fp8.numerics.FP8_SCALES],
            lambda M, N, K, mode, dt, n: [(None, kw) for kw in stagger_check_kwargs(mode, n)])
        from fp8_trace import trace_requests
        for r in trace_requests(sms):
            key = tuple(sorted(r[2].items()))
            if key not in seen:
                seen.add(key)
                reqs.append(r)
    if wide:
        add(s.fp8_cases(), wide_candidates)
        at = SimpleNamespace(M=4096, N=4096, K=4096, shape=(4096, 4096, 4096))
        add([(at, "bfloat16", m) for m in fp8.numerics.FP8_SCALES],
            lambda M, N, K, mode, dt, n: [(None, kw) for w in (192, 144)
                                          for kw in wide_check_kwargs(mode, n, w) or ()])
    if interval:
        add(s.fp8_cases(), interval_candidates)
        at = SimpleNamespace(M=4096, N=4096, K=4096, shape=(4096, 4096, 4096))
        add([(at, "bfloat16", m) for m in fp8.numerics.FP8_SCALES],
            lambda M, N, K, mode, dt, n: [(None, kw) for kw in interval_check_kwargs(mode, n) or ()])
    if split_path:
        sp = suites.load_suite(split_path)
        add(sp.fp8_cases(), lambda M, N, K, mode, dt, n: [(None, fp8.choose_fp8(
            M, mode, False, dt, n, N=N, K=K))])
        add(sp.fp8_cases(), fp8.split_candidates)
    return reqs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-sms", type=int, default=132)
    ap.add_argument("--ffi-wheel", default="3.12", help="Python of the GPU host ('' for none)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--suite", nargs="+", default=None,
                    help="suite files with fp8 entries (their kernels together)")
    ap.add_argument("--candidates", action="store_true",
                    help="--suite: also the tile candidates (fp8.tile_candidates)")
    ap.add_argument("--thin", action="store_true",
                    help="--suite: also the other A stages of each pick at M <= 16 "
                         "(fp8_lab_variants.thin_candidates)")
    ap.add_argument("--cluster", action="store_true",
                    help="--suite: also the pick on a CTA pair at M > 128 "
                         "(fp8_lab_variants.cluster_candidates) and fp8_pair_check.py's kernels")
    ap.add_argument("--promotion", action="store_true",
                    help="--suite: also the staggered pick and the promotion's isolating variants "
                         "at M > 128 (fp8_lab_variants.promotion_candidates), the stagger check's "
                         "kernels and fp8_trace.py's instrumented builds")
    ap.add_argument("--wide", action="store_true",
                    help="--suite: also the widest promoted tiles at M > 128 "
                         "(fp8_lab_variants.wide_candidates) and the kernels "
                         "`fp8_pair_check.py --variant wide` runs (the picks of the suite's cases only)")
    ap.add_argument("--interval", action="store_true",
                    help="--suite: also the promotion every second stage and the L2 groups at M > 128 "
                         "(fp8_lab_variants.interval_candidates) and the kernels `fp8_pair_check.py "
                         "--variant interval` runs (the picks of the suite's cases only)")
    ap.add_argument("--split-suite", default=None,
                    help="--suite: also the picks and K-split candidates of this suite's fp8 "
                         "cases (fp8.split_candidates)")
    ap.add_argument("--probe", action="store_true",
                    help="only the variants fp8_probe.py times beside the picks")
    ap.add_argument("--no-run-shapes", action="store_true",
                    help="only matmul_fp8's kernels, not the registry shapes `run` takes")
    a = ap.parse_args(argv)
    out = Path(a.out)
    bundle.check_out_dir(out)
    if a.probe:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from fp8_probe import probe_requests
        reqs = probe_requests(a.num_sms)
    elif a.suite:
        reqs, seen = [], set()
        for path in a.suite:
            for r in suite_requests(path, a.num_sms, a.candidates, a.split_suite, a.thin,
                                    a.cluster, a.promotion, a.wide, a.interval):
                if tuple(sorted(r[2].items())) not in seen:
                    seen.add(tuple(sorted(r[2].items())))
                    reqs.append(r)
    else:
        reqs = fp8.export_requests(a.num_sms)
        seen = {tuple(sorted(kw.items())) for _, _, kw in reqs}
        reqs += [r for r in lab_variant_requests(a.num_sms)
                 if tuple(sorted(r[2].items())) not in seen]
        if not a.no_run_shapes:
            step = registry.get(fp8.FP8_STEP, fp8.ARCH)
            reqs += [(step, mnk, {}) for mnk in registry.gpu_shapes(step)]
    lab_patches.require([kw for _, _, kw in reqs])
    n = bundle.export(reqs, out, jobs=a.jobs, progress=True,
                      ffi_wheel_python=a.ffi_wheel or None)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"exported {n} v13 kernels to {out}/ ({size / 2**20:.1f} MiB, manifest sha256 "
          f"{bundle.manifest_sha256(out)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
