"""The bias gradient of a Linear with a bias and gelu: from the fused kernel's column sums, or
from a pass over dz.

For y = gelu(x @ w.T + b) at the up projections of three models whose MLPs carry a bias
(BIAS_LAYERS), 4096 to 16384 tokens, bf16, in one run on one card, each arm timed in CUDA
graphs (bench.py's ``_time``: GPU time):

* ``dbias_sum``: what the backward runs by default: dz by v15 with ACT_GRAD and BIAS
  (act_grad.dz), then ``dz.sum(0)`` in fp32 (autograd._weight_grads);
* ``dbias_fused``: v15 built with ACT_GRAD_DBIAS (act_grad.dz_dbias): the same dz, plus
  the fp32 column sums of each warp's 16 rows, then ``partials.sum(0)``.

Before timing, both arms' dz must agree exactly and their bias gradients within 1e-3 of
max |db| (fp32 sums in another order); a case that fails writes a ``what: "error"`` row.
Records: one JSON line per (layer, M, arm) with ms and, on the fused row, ``speedup``
(dbias_sum's time / this one). The rule, stated before the first run: act_grad.DBIAS goes
on by default only if the fused arm is correct at every case and at least as fast at each,
in the same run on the same card.

    python lab/training_backward/bench_dbias.py --out F.jsonl [--budget-s 60]
    python lab/training_backward/bench_dbias.py --export DIR   # its kernels, into a bundle
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# (model, layer, N, K): MLP up projections with a bias (gelu)
BIAS_LAYERS = (("gpt2_xl", "c_fc", 6400, 1600), ("bert_large", "intermediate", 4096, 1024),
               ("phi2", "fc1", 10240, 2560))
TOKENS = (4096, 8192, 16384)
ACT = "gelu"


def requests(sm_count: int = 132) -> list:
    """The bundle.export requests of both arms' kernels (M at run time: one per layer)."""
    from tirx_gemm.op import act_grad as AGR
    return [AGR.request(TOKENS[0], N, K, "bfloat16", ACT, True, sm_count, dbias=d)
            for _model, _layer, N, K in BIAS_LAYERS for d in (False, True)]


def run(out: Path, budget_s: float) -> int:
    import torch

    import bench as B
    from tirx_gemm.op import act_grad as AGR
    from tirx_gemm.op import autograd as AG
    card, date = torch.cuda.get_device_name(0), datetime.date.today().isoformat()
    t_end = time.monotonic() + budget_s
    bf, n = torch.bfloat16, 0
    with out.open("a") as f:
        for M in TOKENS:
            for model, layer, N, K in BIAS_LAYERS:
                if time.monotonic() > t_end:
                    print(f"budget spent: stopped before {model} {layer} M={M}")
                    return n
                head = {"date": date, "card": card, "model": model, "layer": layer, "act": ACT,
                        "M": M, "N": N, "K": K, "dtype": "bfloat16"}
                try:
                    g = torch.Generator(device="cuda").manual_seed(M + N + K)
                    x = torch.randn(M, K, device="cuda", dtype=bf, generator=g)
                    w = torch.randn(N, K, device="cuda", dtype=bf, generator=g) / K ** 0.5
                    b = torch.randn(N, device="cuda", dtype=bf, generator=g) / 10
                    dy = torch.randn(M, N, device="cuda", dtype=bf, generator=g)
                    arch = AG._arch(x.device)

                    def summed():
                        return AGR.dz(x, w, dy, b, ACT, arch).sum(0, dtype=torch.float32)

                    def fused():
                        AGR.DBIAS = True
                        try:
                            dz, parts = AGR.dz_dbias(x, w, dy, b, ACT, arch)
                        finally:
                            AGR.DBIAS = False
                        return dz, parts.sum(0)

                    dz0 = AGR.dz(x, w, dy, b, ACT, arch)
                    dz1, db1 = fused()
                    if not torch.equal(dz0, dz1):
                        raise AssertionError("dz differs between the two builds")
                    db0 = dz0.sum(0, dtype=torch.float32)
                    err = float((db1 - db0).abs().max() / db0.abs().max().clamp_min(1e-30))
                    if err > 1e-3:
                        raise AssertionError(f"bias gradient off by {err:.2e} of max |db|")
                    t0, how0 = B._time(summed, torch)
                    t1, how1 = B._time(fused, torch)
                    for what, ms, how, extra in (("dbias_sum", t0, how0, {}),
                                                 ("dbias_fused", t1, how1,
                                                  {"speedup": round(t0 / t1, 4),
                                                   "db_rel_err": err})):
                        f.write(json.dumps({**head, "what": what, "timing": how,
                                            "ms": round(ms, 4), **extra}) + "\n")
                    f.flush()
                    n += 1
                    print(f"{model} {layer} M={M}: dz.sum {t0:.3f} ms, fused {t1:.3f} ms, "
                          f"{t0 / t1:.3f}x (db rel err {err:.1e})", flush=True)
                except Exception as e:  # noqa: BLE001 (the row says it; the others stand)
                    why = f"{type(e).__name__}: {str(e)[:300]}"
                    print(f"{model} {layer} M={M} FAILED: {why}", flush=True)
                    f.write(json.dumps({**head, "what": "error", "error": why}) + "\n")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="records (JSON lines, appended)")
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--export", metavar="DIR", help="export both arms' kernels into DIR")
    ap.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args(argv)
    if a.export:
        from tirx_gemm.compile import bundle
        n = bundle.export(requests(), Path(a.export), jobs=a.jobs, progress=True)
        print(f"exported {n} kernels to {a.export}")
        return 0
    if a.out is None:
        ap.error("--out F.jsonl (or --export DIR)")
    n = run(a.out, a.budget_s)
    print(f"{n} cases timed into {a.out}")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
