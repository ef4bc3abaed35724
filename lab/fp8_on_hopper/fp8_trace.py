"""On a Hopper GPU host: in-kernel timelines of v13 fp8 kernels (instrumented builds, v13 TIMELINE=True, from
a bundle), one JSON line per kernel: where a CTA's time goes (consumers waiting on full stages, the producer on
empty ones, the share of time some consumer warpgroup has wgmmas in flight) and the summary text beside it.

  TIRX_GEMM_BUNDLE=B python3 lab/fp8_on_hopper/fp8_trace.py --out F.jsonl --logdir DIR
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tirx_gemm import registry
from tirx_gemm import timeline as TL
from tirx_gemm.op import fp8, fp8_bench
from tirx_gemm.report import timeline_view as TV

TRACE_SHAPE = (2048, 4096, 8192)  # 512 tiles: about 4 a CTA, 64 stages each (a buffer of ~50 MB)


def trace_kernels(sm_count: int = 132) -> list[tuple[str, dict]]:
    """(name, v13 keywords without TIMELINE) traced: the pick and the staggered pick, per tensor and block;
    per tensor also the serial promotion (a drain every stage, PROMOTE_OVERLAP=False)."""
    out = []
    for mode in ("tensor", "block"):
        kw = fp8.choose_fp8(4096, mode, False, "bfloat16", sm_count, N=4096, K=4096)
        out += [(f"{mode} pick", kw), (f"{mode} stagger", {**kw, "STAGGER": True})]
        if mode == "tensor":
            out.append(("tensor serial", {**kw, "PROMOTE_OVERLAP": False}))
    return out


def trace_requests(sm_count: int = 132):
    """trace_kernels as bundle requests (instrumented builds at TRACE_SHAPE)."""
    step = registry.get(fp8.FP8_STEP, fp8.ARCH)
    return [(step, TRACE_SHAPE, {**kw, TL.KWARG: True}) for _, kw in trace_kernels(sm_count)]


def _union(intervals) -> int:
    tot, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            tot += b - a
            end = b
        elif b > end:
            tot += b - end
            end = b
    return tot


def measures(tl) -> dict:
    """Shares of the CTAs' time (each CTA: its first to its last consumer event): consumers waiting on full
    stages (summed over both, / 2), the producer waiting on empty ones, some consumer with wgmmas in flight."""
    sp, _ = TV.spans(tl)
    by_cta: dict = {}
    for s in sp:
        by_cta.setdefault(s.cta, []).append(s)
    full, empty, mma, both = [], [], [], []
    for cta, ss in by_cta.items():
        cons = [s for s in ss if s.role != TL.PRODUCER]
        if not cons:
            continue
        lo = min(s.start_ns for s in cons)
        hi = max(s.start_ns + s.dur_ns for s in cons)
        span = max(hi - lo, 1)
        full.append(sum(s.dur_ns for s in cons if s.kind == TL.FULL_WAIT) / 2 / span)
        empty.append(sum(s.dur_ns for s in ss if s.kind == TL.EMPTY_WAIT) / span)
        per = [[(s.start_ns, s.start_ns + s.dur_ns) for s in cons
                if s.kind == TL.WGMMA and s.role == r and not s.point] for r in (1, 2)]
        mma.append(_union(per[0] + per[1]) / span)
        both.append((_union(per[0]) + _union(per[1]) - _union(per[0] + per[1])) / span)
    med = (lambda v: round(statistics.median(v), 4) if v else None)
    return {"ctas": len(full), "consumer_full_wait_share": med(full), "producer_empty_wait_share": med(empty),
            "wgmma_in_flight_share": med(mma), "wgmma_both_in_flight_share": med(both)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--logdir", required=True)
    a = ap.parse_args(argv)
    import os

    import torch
    from tirx_gemm.kernels import kernel_for
    from tirx_gemm.run import loader
    bundle = os.environ["TIRX_GEMM_BUNDLE"]
    step = registry.get(fp8.FP8_STEP, fp8.ARCH)
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    M, N, K = TRACE_SHAPE
    Path(a.logdir).mkdir(parents=True, exist_ok=True)
    rc = 0
    with open(a.out, "a", encoding="utf-8") as f:
        for label, kw in trace_kernels(sms):
            mode = kw["SCALE"]
            rec = {"kind": "fp8_trace", "name": label, "M": M, "N": N, "K": K, "build_kwargs": kw,
                   "device": name, "torch": torch.__version__}
            try:
                lib, _, _ = kernel_for(step, TRACE_SHAPE, bundle, kwargs={**kw, TL.KWARG: True}, timeline=True)
                kernel = loader.load_kernel(str(lib))
                qa, qb, sa, sb = fp8_bench.make_inputs(M, N, K, mode, 11)
                ksa, ksb = fp8.kernel_scales(sa, sb, mode)
                (_, shape, _), = TL.buffer_specs(M, N, K, kw, persistent=True)
                buf = torch.zeros(shape, dtype=torch.int64, device="cuda")
                out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
                for _ in range(3):
                    buf.zero_()
                    kernel(qa.view(torch.uint8), qb.view(torch.uint8), out, ksa, ksb, buf)
                torch.cuda.synchronize()
                ref = fp8.reference(qa[:256], qb, sa if mode == "tensor" else sa[:256], sb, mode)
                rec["rel_err_first_rows"] = float((out[:256].float() - ref).norm() / ref.norm())
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                ev[0].record()
                buf.zero_()
                kernel(qa.view(torch.uint8), qb.view(torch.uint8), out, ksa, ksb, buf)
                ev[1].record()
                torch.cuda.synchronize()
                rec["instrumented_ms_with_zeroing"] = ev[0].elapsed_time(ev[1])
                tl = TV.decode(buf)
                rec.update(measures(tl))
                text = TV.summary(tl, {"step": "v13", "arch": "sm_90a", "M": M, "N": N, "K": K,
                                       "dtype": "bfloat16", "device": name, "sm_count": sms, "build_kwargs": kw})
                (Path(a.logdir) / f"fp8_trace_{label.replace(' ', '_')}.txt").write_text(text + "\n")
                print(f"== {label}\n{text}\n{json.dumps({k: v for k, v in rec.items() if 'share' in k})}",
                      flush=True)
            except Exception as exc:  # noqa: BLE001 - a failed trace is a result; the others still run
                rec["error"] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                print(f"== {label}: {rec['error']}", flush=True)
                rc = 1
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main())
