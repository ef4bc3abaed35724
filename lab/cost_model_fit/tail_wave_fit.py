"""Would the chooser pick better if a partly filled last wave counted as less than a wave?

A persistent kernel's last wave runs on fewer SMs than the others; with fewer SMs sharing
HBM, L2 and the power budget, each of its tiles may finish sooner. This refits
scripts/fit_chooser.py's per-candidate model with the last wave's K steps counted as
``1 - g * (1 - occupancy)`` waves (g = 0: chooser.py's model) and prints, per g, the RMS
error over the sweeps and how far the picks land from the fastest measured candidate
(fit_chooser.py --report's figures), plus the picks at the shapes where they change.
Offline: it reads the same H200 records fit_chooser.py reads, nothing is timed.

    python lab/cost_model_fit/tail_wave_fit.py [--g 0,0.1,0.2,0.3] [--min-intensity 200]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import fit_chooser as F  # noqa: E402
from tirx_gemm.op import cost_model as chooser  # noqa: E402


def tail_terms(g: float, min_intensity: float = 0.0):
    """chooser.shape_terms with the discount, on shapes of at least ``min_intensity``
    MACs per element moved (MNK / (MK + NK + MN); the H200's ridge is about 200: 989
    dense TFLOP/s over 4.8 TB/s)."""
    def terms(cand, M, N, K, sm_count):
        _, _, slots = chooser.geometry(cand, sm_count)
        steps, waves, tiles = PLAIN(cand, M, N, K, sm_count)
        if M * N * K < min_intensity * (M * K + N * K + M * N):
            return steps, waves, tiles
        full, rem = divmod(tiles, slots)
        eff = full + (1 - g * (1 - rem / slots) if rem else 0)
        return eff * chooser._ceil_div(K, chooser.BLK_K), waves, tiles
    return terms


PLAIN = chooser.shape_terms
# the public suite's and the held-out suite's shapes: where a refit changes chooser's
# data-parallel tile (best_tile), measured in a sweep or not
SHAPES = sorted({(e["M"], e["N"], e["K"]) for name in ("models", "heldout")
                 for e in json.loads((ROOT / "tirx_gemm/op/suites" / f"{name}.json")
                                     .read_text())["shapes"]})


def _forget() -> None:
    """Drop chooser's caches of the figures and the rankings, not of the document whose
    candidates report() swaps (chooser.params.cache_clear would reread the file)."""
    chooser._params_cache_clear()
    chooser.rank.cache_clear()


def report(g: float, samples, torch_us, min_intensity: float = 0.0):
    """(fit_chooser.py --report's lines, {shape: best_tile} over SHAPES), refitted under g."""
    chooser.shape_terms = tail_terms(g, min_intensity)
    cands = chooser._document()["candidates"]
    saved = dict(cands)
    try:
        cands.clear()
        cands.update(F.fit(samples))
        _forget()  # params() and rank() read the refit; the document stays in memory
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            F.report(samples, torch_us)
        picks = {shape: chooser.best_tile(*shape) for shape in SHAPES}
        return buf.getvalue().splitlines(), picks
    finally:
        cands.clear()
        cands.update(saved)
        _forget()
        chooser.shape_terms = PLAIN


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--g", default="0,0.1,0.2,0.3,0.4")
    p.add_argument("--min-intensity", type=float, default=0.0,
                   help="discount only shapes of at least this many MACs per element moved")
    a = p.parse_args(argv)
    samples, torch_us = F.load()
    base = None
    print(f"discounted: shapes of MNK / (MK + NK + MN) >= {a.min_intensity:g}")
    for g in (float(x) for x in a.g.split(",")):
        lines, picks = report(g, samples, torch_us, a.min_intensity)
        rows = {ln.split()[0]: ln for ln in lines[1:-2]}
        print(f"g={g}: {lines[-2]}\n       {lines[-1]}")
        if base is None:
            base = rows, picks
            continue
        for shape, ln in rows.items():
            if ln.split()[1] != base[0][shape].split()[1]:
                print(f"   {ln}\n     was {base[0][shape]}")
        moved = [f"{'x'.join(map(str, sh))} {base[1][sh]} -> {t}" for sh, t in picks.items()
                 if t != base[1][sh]]
        print(f"   best_tile changes at {len(moved)} of the {len(SHAPES)} suite and held-out "
              f"shapes" + (": " + "; ".join(moved) if moved else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
