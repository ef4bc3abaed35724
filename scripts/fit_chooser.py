"""Fit tirx_gemm/op/cost_model.py's cost model to the H200 records and write chooser_h200.json.

    python scripts/fit_chooser.py            # refit and write tirx_gemm/op/chooser_h200.json
    python scripts/fit_chooser.py --check    # exit 1 if the file differs from a refit
    python scripts/fit_chooser.py --report   # per suite shape: pick, predicted, measured

Inputs: lab/cost_model_fit/records/v12_sweep_h200.jsonl, v12_cluster_sweep_h200.jsonl (CLUSTER=2 pairs)
v12_widths_sweep_h200.jsonl (BLK_N between the menu's) and v12_widths8_sweep_h200.jsonl
(BLK_N odd multiples of 8) (every entry at every suite shape,
bf16, GPU time per call from CUDA-graph replays, torch.mm in the same run; where a shape
was swept again, after a kernel change, the latest sweep counts) and the v9
records of results/suites/nvidia-h200.jsonl (bf16, checked), each turned into a time on
the sweep's scale as sweep_torch_time / (v9's ratio to torch in its own run); v10's
ping-pong from lab/cost_model_fit/records/v10_suite_graph_h200.jsonl the same way and from
lab/cost_model_fit/records/v12_shortk_h200.jsonl and v12_midk_h200.jsonl (its own s, e, f, fitted to its
times in chooser.pingpong_band only, where the model rates it).
For each v12 entry: time = s * steps + e * waves + f (cost_model.py's terms), weighted least
squares on the relative error, coefficients kept non-negative. v9 takes e and f from
v12's 128x256 and fits s alone.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tirx_gemm.op import cost_model as chooser  # noqa: E402  (the model fitted here)

# v12's sweeps in the order they ran: the one-CTA menu; CLUSTER=2 pairs beside it (the
# one-CTA menu re-timed in the same run); the widths between the menu's
SWEEPS = tuple(ROOT / "lab/cost_model_fit/records" / f for f in (
    "v12_sweep_h200.jsonl", "v12_cluster_sweep_h200.jsonl", "v12_widths_sweep_h200.jsonl",
    "v12_widths8_sweep_h200.jsonl"))
SUITE = ROOT / "results/suites/nvidia-h200.jsonl"
# measured but not on the menu: the 64-row tiles of an odd multiple of 8 columns. Their
# use is decode widths, where matmul runs swap-AB tiles; fitted with the rest, the model
# ranked 64x120 first at 8, 16 and 48 x 14336 x 4096 where it ran 10% slower than 64x112
# (bandwidth-bound shapes that one (s, e, f) per tile cannot tell apart), and its picks
# landed 1.024x from the fastest tile (geomean) against 1.016x without them
# (lab/cost_model_fit/records/v12_widths8_sweep_h200.jsonl has their times)
OFF_MENU = frozenset({"64x72", "64x88", "64x104", "64x120"})
# v10's ping-pong (plain) at the suite shapes as CUDA graphs beside torch.mm
# (lab/cost_model_fit/run_v10_suite_sweep.sh): each time scaled to the sweep's torch time of the shape
V10_SWEEP = ROOT / "lab/cost_model_fit/records/v10_suite_graph_h200.jsonl"
# v10 beside v9 and v12's 128-row tiles at a thousand tokens or more on a K of 640-2560
# (lab/tools/streaming_sweep.py --set shortk, both dtypes, two passes; bf16 read
# here, GPU time per call from CUDA-graph replays): read for v10 alone, whose figures are
# fitted in chooser.pingpong_band only; the other candidates keep the sweeps above (their
# one-line fits would trade the large shapes' accuracy for these)
SHORTK_SWEEP = ROOT / "lab/cost_model_fit/records/v12_shortk_h200.jsonl"
# the same kernels at a K of 1536-2560 (--set midk, the same protocol): v10 alone
MIDK_SWEEP = ROOT / "lab/cost_model_fit/records/v12_midk_h200.jsonl"
# v12 with and without PDL=True (lab/tools/v12_sweep.py export --pdl): the saving PDL
# brings a kernel under chooser.PDL_MAX_US, the median over those pairs
PDL_SWEEP = ROOT / "lab/cost_model_fit/records/v12_pdl_sweep_h200.jsonl"


# v12's SPLIT_K kernels (lab/cost_model_fit/v12_split_sweep.py): the split model's data
SPLIT_SWEEP = ROOT / "lab/cost_model_fit/records/v12_split_h200.jsonl"


def split_samples(path=SPLIT_SWEEP) -> list[tuple]:
    """[(BLK_M, BLK_N, swap, S, M, N, K, us)] of every S > 1 kernel checked in the sweep."""
    out = []
    for line in (Path(path).read_text().splitlines() if Path(path).exists() else ()):
        r = json.loads(line)
        for name, c in r["candidates"].items():
            if name.startswith("np") or not c.get("ok") or "ms" not in c:
                continue
            tile, split = name.rsplit("s", 1)
            swap = tile.endswith("w")
            bm, bn, _ = chooser.tile(tile.rstrip("w"))
            if int(split) > 1:
                out.append((bm, bn, swap, int(split), r["M"], r["N"], r["K"], c["ms"] * 1e3))
    return out


def fit_split(samples) -> dict | None:
    """chooser.predict_split's f, r, hbm_tb_s, u: a grid over the two rates (HBM in steps
    of 0.1 TB/s, a unit's us per KB in steps of 0.001), least squares on the relative error
    for f and r at each point, the point of smallest RMS relative error kept."""
    if len(samples) < 4:
        return None
    terms = [chooser.split_terms(bm, bn, sp, M, N, K) for bm, bn, _, sp, M, N, K, _
             in samples]
    y = np.array([t for *_, t in samples])
    best = None
    for bw in np.round(np.arange(2.0, 5.01, 0.1), 1):
        for u in np.round(np.arange(0.002, 0.0401, 0.001), 3):
            floor = np.array([max(h / bw, u * k) for _, h, k in terms])
            X = np.array([[1.0, slab] for slab, _, _ in terms])
            f, r = _lstsq(X, np.maximum(y - floor, 1e-3))
            err = float(np.sqrt(np.mean(((f + r * X[:, 1] + floor) / y - 1) ** 2)))
            if best is None or err < best[0]:
                best = (err, float(bw), float(u), f, r)
    err, bw, u, f, r = best
    return {"f": round(f, 4), "r": round(r, 5), "hbm_tb_s": bw, "u": u,
            "rms_rel_err": round(err, 4), "kernels": len(samples)}


def pdl_saving(path=PDL_SWEEP) -> float:
    savings = []
    for line in (Path(path).read_text().splitlines() if Path(path).exists() else ()):
        c = json.loads(line)["candidates"]
        for name, off in c.items():
            on = c.get(name + "p")
            if (not name.endswith("p") and off.get("ok") and on and on.get("ok")
                    and off["ms"] * 1e3 <= chooser.PDL_MAX_US):
                savings.append((off["ms"] - on["ms"]) * 1e3)
    return round(statistics.median(savings), 3) if savings else 0.0


def load(sweeps=SWEEPS, suite=SUITE, v10=V10_SWEEP, shortk=(SHORTK_SWEEP, MIDK_SWEEP)):
    """(samples [(cand, M, N, K, us)], torch us per shape) from the records."""
    rows = [json.loads(x) for sweep in sweeps if Path(sweep).exists()
            for x in Path(sweep).read_text().splitlines() if x.strip()]
    # the latest sweep of a shape replaces the earlier ones (a kernel change is re-swept);
    # a candidate it lacks keeps its earlier time, scaled by the two runs' torch times
    latest, torch_us = {}, {}
    for r in rows:
        shape = (r["M"], r["N"], r["K"])
        old = latest.get(shape, {})
        scale = (r["torch_ms"] * 1e3 / torch_us[shape]) if shape in torch_us else 1.0
        merged = {c: v * scale for c, v in old.items()}
        merged.update({c: v["ms"] * 1e3 for c, v in r["candidates"].items() if v.get("ok")})
        for c, v in r["candidates"].items():
            if not v.get("ok"):
                merged.pop(c, None)
        latest[shape] = merged
        torch_us[shape] = r["torch_ms"] * 1e3
    out = [(c, *shape, t) for shape, cands in sorted(latest.items())
           for c, t in sorted(cands.items()) if c not in OFF_MENU]
    v9 = {}
    for line in Path(suite).read_text().splitlines():
        r = json.loads(line)
        if (r.get("step") == "v9" and r.get("verified") is True
                and r.get("dtype") == "bfloat16"):
            v9.setdefault((r["M"], r["N"], r["K"]), []).append(r["ratio_to_torch"])
    for shape, ratios in sorted(v9.items()):
        if shape in torch_us:
            out.append((chooser.V9, *shape, torch_us[shape] / statistics.median(ratios)))
    pingpong = {}
    for line in (Path(v10).read_text().splitlines() if Path(v10).exists() else ()):
        r = json.loads(line)
        if r.get("step") == chooser.V10 and r.get("ok") and r.get("dtype") == "bfloat16":
            pingpong[(r["M"], r["N"], r["K"])] = r["torch_ms"] / r["ms"]  # the latest run
    for shape, ratio in sorted(pingpong.items()):
        if shape in torch_us:
            out.append((chooser.V10, *shape, torch_us[shape] / ratio))
    times = {}  # shortk, midk: each shape's v10 times (its passes), bf16, checked
    for line in (x for f in shortk if Path(f).exists() for x in Path(f).read_text().splitlines()):
        r = json.loads(line)
        c = r["candidates"].get(chooser.V10, {})
        if r.get("dtype") == "bfloat16" and c.get("ok") and "ms" in c:
            times.setdefault((r["M"], r["N"], r["K"]), []).append(c["ms"] * 1e3)
    for shape, ts in sorted(times.items()):
        if shape not in pingpong:
            out.append((chooser.V10, *shape, statistics.median(ts)))
    return out, torch_us


def _lstsq(X, y):
    w = 1.0 / y
    sol = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)[0]
    return [max(0.0, float(x)) for x in sol]


def fit(samples, sm_count: int = chooser.SMS_H200) -> dict:
    cands = sorted({c for c, *_ in samples if c != chooser.V9})
    out = {}
    for c in cands:
        # v10 by its measurements in the band where the model rates it (chooser.pingpong_band)
        rows = [s for s in samples if s[0] == c
                and (c != chooser.V10 or chooser.pingpong_band(*s[1:4], sm_count))]
        X = np.array([[*chooser.shape_terms(c, M, N, K, sm_count)[:2], 1.0]
                      for _, M, N, K, _ in rows])
        y = np.array([t for *_, t in rows])
        out[c] = [round(x, 4) for x in _lstsq(X, y)]
    big = chooser.name(128, 256)
    rows = [s for s in samples if s[0] == chooser.V9]
    if rows and big in out:
        _, e, f = out[big]
        X = np.array([[chooser.shape_terms(chooser.V9, M, N, K, sm_count)[0]]
                      for _, M, N, K, _ in rows])
        y = np.array([t - e * chooser.shape_terms(chooser.V9, M, N, K, sm_count)[1] - f
                      for _, M, N, K, t in rows])
        w = 1.0 / np.array([t for *_, t in rows])
        s = float(np.linalg.lstsq(X * w[:, None], y * w, rcond=None)[0][0])
        out[chooser.V9] = [round(max(0.0, s), 4), e, f]
    return out


def document(cands: dict) -> dict:
    return {"about": "tirx_gemm/op/cost_model.py's cost model, fitted by scripts/fit_chooser.py "
                     "to lab/cost_model_fit/records/v12_sweep_h200.jsonl and the v9 records of "
                     "results/suites/nvidia-h200.jsonl (NVIDIA H200, bf16); per candidate "
                     "[s us per K step, e us per wave, f us fixed]; pdl_saving_us: the "
                     "median saving of PDL=True on v12 kernels under chooser.PDL_MAX_US "
                     "(lab/cost_model_fit/records/v12_pdl_sweep_h200.jsonl); split: chooser.predict_split's "
                     "figures, fitted to lab/cost_model_fit/records/v12_split_h200.jsonl",
            "device": "NVIDIA H200", "candidates": cands, "pdl_saving_us": pdl_saving(),
            "split": fit_split(split_samples())}


def model_error(samples, floor: bool = True) -> float:
    """The RMS relative error of chooser's data-parallel predictions (without PDL) over the
    samples, with or without its HBM floor (chooser.hbm_floor)."""
    errs = []
    for c, M, N, K, t in samples:
        p = (chooser.predict(c, M, N, K, pdl=False) if floor
             else chooser._predict_plain(c, M, N, K, chooser.SMS_H200))
        errs.append((p - t) / t)
    return math.sqrt(sum(e * e for e in errs) / len(errs))


def report(samples, torch_us) -> None:
    by_shape = {}
    for c, M, N, K, t in samples:
        by_shape.setdefault((M, N, K), {})[c] = t
    regrets = []
    print(f"{'shape':18} {'pick':8} {'pred us':>8} {'meas us':>8} {'x torch':>7}  best")
    for shape in sorted(torch_us):
        meas = by_shape.get(shape, {})
        ranked = [c for _, c in chooser.rank(*shape) if c in meas]
        if not ranked:
            continue
        pick, top = ranked[0], min(meas, key=meas.get)
        regrets.append(meas[pick] / meas[top])
        print(f"{'x'.join(map(str, shape)):18} {pick:8} {chooser.predict(pick, *shape):8.1f} "
              f"{meas[pick]:8.1f} {torch_us[shape] / meas[pick]:7.2f}  "
              f"{top} {torch_us[shape] / meas[top]:.2f}")
    print(f"picks within {statistics.geometric_mean(regrets):.3f}x (geomean), "
          f"{max(regrets):.3f}x (worst) of the fastest measured candidate")
    print(f"RMS error of the predictions over {len(samples)} kernels: "
          f"{model_error(samples, floor=False):.1%} without the HBM floor, "
          f"{model_error(samples):.1%} with it")


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true")
    p.add_argument("--report", action="store_true")
    a = p.parse_args(argv)
    samples, torch_us = load()
    doc = document(fit(samples))
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if a.check:
        same = chooser.PARAMS_FILE.read_text() == text
        print("chooser_h200.json is " + ("up to date" if same else
              "stale: run python scripts/fit_chooser.py"))
        return 0 if same else 1
    if a.report:
        report(samples, torch_us)
        return 0
    chooser.PARAMS_FILE.write_text(text)
    chooser.params.cache_clear()
    print(f"wrote {chooser.PARAMS_FILE} ({len(doc['candidates'])} candidates)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
