"""Would the chooser pick better if a partly filled last wave counted as less than a wave?

A persistent kernel's last wave runs on fewer SMs than the others; with fewer SMs sharing
HBM, L2 and the power budget, each of its tiles may finish sooner. This refits
scripts/fit_chooser.py's per-candidate model with the last wave's K steps counted as
``1 - g * (1 - occupancy)`` waves (g = 0: chooser.py's model) and prints, per g, the RMS
error over the sweeps and how far the picks land from the fastest measured candidate
(fit_chooser.py --report's figures), plus the picks at the shapes where they change.
Offline: it reads the same H200 records fit_chooser.py reads, nothing is timed.

    python scripts/lab/tail_wave_fit.py [--g 0,0.1,0.2,0.3]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import fit_chooser as F  # noqa: E402
from tirx_gemm import chooser  # noqa: E402


def tail_terms(g: float):
    def terms(cand, M, N, K, sm_count):
        _, _, slots = chooser.geometry(cand, sm_count)
        steps, waves, tiles = PLAIN(cand, M, N, K, sm_count)
        full, rem = divmod(tiles, slots)
        eff = full + (1 - g * (1 - rem / slots) if rem else 0)
        return eff * chooser._ceil_div(K, chooser.BLK_K), waves, tiles
    return terms


PLAIN = chooser.shape_terms


def report(g: float, samples, torch_us) -> list[str]:
    """fit_chooser.py --report's lines with the model refitted under ``g``."""
    chooser.shape_terms = tail_terms(g)
    cands = chooser._document()["candidates"]
    saved = dict(cands)
    try:
        cands.clear()
        cands.update(F.fit(samples))
        chooser.params.cache_clear()
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            F.report(samples, torch_us)
        return buf.getvalue().splitlines()
    finally:
        cands.clear()
        cands.update(saved)
        chooser.params.cache_clear()
        chooser.shape_terms = PLAIN


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--g", default="0,0.1,0.2,0.3,0.4")
    a = p.parse_args(argv)
    samples, torch_us = F.load()
    base = None
    for g in (float(x) for x in a.g.split(",")):
        lines = report(g, samples, torch_us)
        rows = {ln.split()[0]: ln for ln in lines[1:-2]}
        print(f"g={g}: {lines[-2]}\n       {lines[-1]}")
        if base is None:
            base = rows
            continue
        for shape, ln in rows.items():
            if ln.split()[1] != base[shape].split()[1]:
                print(f"   {ln}\n     was {base[shape]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
