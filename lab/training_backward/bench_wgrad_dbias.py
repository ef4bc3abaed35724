"""The bias gradient beside wgrad: from wgrad's own kernel, or from a pass over dz after it.

For a Linear with a bias, the weight and bias gradients from dz (M x N) and x (M x K), bf16,
at the up projections of SUITE (the three models of bench_dbias.py) and HELD_OUT (three MLP
up projections not measured before), 4096 to 16384 tokens, in one run on one card, each arm
timed in CUDA graphs (bench.py's ``_time``: GPU time):

* ``wgrad_sum``: what the backward runs by default: wgrad on v15 in place (K at run time),
  then ``dz.sum(0)`` in fp32 (autograd._weight_grads);
* ``wgrad_dbias``: v15 built with WGRAD_DBIAS (tirx_gemm.op.wgrad_dbias): db and dbias;
* ``wgrad_torch``: the peer, ``dz.T @ x`` and ``dz.sum(0)`` in fp32 by torch.

Before timing, a case must be correct: db of the two tirx arms bitwise equal and within 2e-2
of max |torch's|, dbias within 1e-3 of max |dz.sum(0)| (fp32 sums in another order); a case
that fails writes a ``what: "error"`` row. Records: one JSON line per (layer, M, arm) with
ms; the wgrad_dbias row has ``speedup`` (wgrad_sum's time / its own) and ``vs_torch``.
The rules are stated in this folder's README before their runs.

``--cases all`` (the default) times SUITE and HELD_OUT at each of TOKENS (the rule over all
shapes); ``--cases bounded`` times only BOUNDED, real-model layers not timed before, each at
the token counts where the bounded rule (tokens x in-features <= BOUND) would take the kernel.

    python lab/training_backward/bench_wgrad_dbias.py --out F.jsonl [--budget-s 150] [--cases C]
    python lab/training_backward/bench_wgrad_dbias.py --export DIR [--cases C]  # its kernels
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

# (model, layer, N, K): MLP up projections
SUITE = (("gpt2_xl", "c_fc", 6400, 1600), ("bert_large", "intermediate", 4096, 1024),
         ("phi2", "fc1", 10240, 2560))
HELD_OUT = (("llama3.2_3b", "up", 8192, 3072), ("mistral_7b", "up", 14336, 4096),
            ("qwen2.5_14b", "up", 13824, 5120))
TOKENS = (4096, 8192, 16384)
TOL = 2e-2
# the bounded rule: the fused kernel only where tokens x in-features (M x K) <= BOUND
from tirx_gemm.op.wgrad_dbias import BOUND  # noqa: E402
# (model, layer, N, K, token counts): layers with a bias in real models (or, for Gemma-2-9B
# and Qwen2.5-7B, their MLP shapes), none timed by the cases above, at token counts in BOUND
BOUNDED = (("gemma2_9b", "up", 14336, 3584, (2048, 4096, 8192)),
           ("qwen2.5_7b", "up", 18944, 3584, (2048, 4096, 8192)),
           ("starcoder2_7b", "c_fc", 18432, 4608, (2048, 4096)),
           ("pythia_1.4b", "dense_h_to_4h", 8192, 2048, (4096, 8192, 16384)),
           ("qwen2.5_1.5b", "up", 8960, 1536, (8192, 16384)),
           ("gpt2_xl", "c_proj", 1600, 6400, (2048, 4096)))
CASE_SETS = ("all", "bounded")


def cases(which: str = "all") -> list:
    """(class, model, layer, M, N, K) in the order timed: ``all`` is SUITE and HELD_OUT at each
    of TOKENS; ``bounded`` is BOUNDED (class ``bounded_held_out``)."""
    if which == "all":
        return [(cls, model, layer, M, N, K) for M in TOKENS
                for cls, layers in (("suite", SUITE), ("held_out", HELD_OUT))
                for model, layer, N, K in layers]
    if which == "bounded":
        out = [("bounded_held_out", model, layer, M, N, K)
               for model, layer, N, K, tokens in BOUNDED for M in tokens]
        assert all(M * K <= BOUND for *_, M, _N, K in out)
        return sorted(out, key=lambda c: c[3])
    raise ValueError(f"cases {which!r}: one of {CASE_SETS}")


def requests(sm_count: int = 132, which: str = "all") -> list:
    """The bundle.export requests of both tirx arms' kernels (one each per layer)."""
    from tirx_gemm.op import wgrad_dbias as WD
    from calls import layout_request
    out, seen = [], set()
    for *_, N, K in cases(which):
        if (N, K) in seen:
            continue
        seen.add((N, K))
        out.append(layout_request(N, K, TOKENS[0], "bfloat16", True, True, sm_count))
        out.append(WD.request(N, K, TOKENS[0], "bfloat16", sm_count))
    return out


def _case(torch, B, AG, WD, M, N, K):
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    bf = torch.bfloat16
    x = torch.randn(M, K, device="cuda", dtype=bf, generator=g)
    dz = torch.randn(M, N, device="cuda", dtype=bf, generator=g)

    def summed():
        return AG._in_place(dz, True, x, True), dz.sum(0, dtype=torch.float32)

    def fused():
        return WD.run(dz, x)

    def peer():
        return dz.T @ x, dz.sum(0, dtype=torch.float32)

    (db0, s0), (db1, s1), (db2, _) = summed(), fused(), peer()
    if not torch.equal(db0, db1):
        raise AssertionError("db differs between the plain and the WGRAD_DBIAS build")
    err_db = float((db1.float() - db2.float()).abs().max() / db2.float().abs().max())
    if err_db > TOL:
        raise AssertionError(f"db off torch's by {err_db:.2e} of max |db|")
    err = float((s1 - s0).abs().max() / s0.abs().max().clamp_min(1e-30))
    if err > 1e-3:
        raise AssertionError(f"bias gradient off by {err:.2e} of max |dz.sum(0)|")
    times = {w: B._time(f, torch) for w, f in (("wgrad_sum", summed), ("wgrad_dbias", fused),
                                               ("wgrad_torch", peer))}
    return times, err, err_db


def run(out: Path, budget_s: float, which: str = "all") -> int:
    import torch

    import bench as B
    from tirx_gemm.op import autograd as AG
    from tirx_gemm.op import wgrad_dbias as WD
    card, date = torch.cuda.get_device_name(0), datetime.date.today().isoformat()
    t_end = time.monotonic() + budget_s
    n = 0
    with out.open("a") as f:
        for cls, model, layer, M, N, K in cases(which):
            if time.monotonic() > t_end:
                print(f"budget spent: stopped before {model} {layer} M={M}")
                return n
            head = {"date": date, "card": card, "class": cls, "model": model,
                    "layer": layer, "M": M, "N": N, "K": K, "dtype": "bfloat16"}
            try:
                times, err, err_db = _case(torch, B, AG, WD, M, N, K)
                t0, t1, t2 = (times[w][0] for w in ("wgrad_sum", "wgrad_dbias", "wgrad_torch"))
                for what, (ms, how) in times.items():
                    extra = {"speedup": round(t0 / t1, 4), "vs_torch": round(t2 / t1, 4),
                             "db_rel_err": err, "dw_rel_err": err_db} \
                        if what == "wgrad_dbias" else {}
                    tf = 2 * M * N * K / ms / 1e9
                    f.write(json.dumps({**head, "what": what, "timing": how,
                                        "ms": round(ms, 4), "tflops": round(tf, 1),
                                        **extra}) + "\n")
                f.flush()
                n += 1
                print(f"{cls} {model} {layer} M={M}: sum {t0:.3f} ms, fused {t1:.3f} ms "
                      f"({t0 / t1:.3f}x), torch {t2:.3f} ms (fused {t2 / t1:.3f}x "
                      f"torch); db rel err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001 (the row says it; the others stand)
                why = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"{model} {layer} M={M} FAILED: {why}", flush=True)
                f.write(json.dumps({**head, "what": "error", "error": why}) + "\n")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="records (JSON lines, appended)")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--export", metavar="DIR", help="export both tirx arms' kernels into DIR")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--cases", choices=CASE_SETS, default="all",
                    help="all: SUITE and HELD_OUT at TOKENS; bounded: BOUNDED only")
    a = ap.parse_args(argv)
    if a.export:
        from tirx_gemm.compile import bundle
        n = bundle.export(requests(which=a.cases), Path(a.export), jobs=a.jobs, progress=True)
        print(f"exported {n} kernels to {a.export}")
        return 0
    if a.out is None:
        ap.error("--out F.jsonl (or --export DIR)")
    n = run(a.out, a.budget_s, a.cases)
    print(f"{n} cases timed into {a.out}")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
