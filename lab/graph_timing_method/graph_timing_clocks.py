"""On a GPU host: what the SM clock does while matmul_graph_times times torch's graph and
matmul's, in the old order (torch's first, five replays each) and interleaved (a warm-up,
then alternately). Every replay is logged with its wall-clock start and GPU time; run
``nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 10`` beside it
and match the two by time (lab/graph_timing_method/h200_graph_clocks.sh does both).

    TIRX_GEMM_BUNDLE=B python lab/graph_timing_method/graph_timing_clocks.py --out FILE.jsonl \
        --shapes 4096x4096x14336,384x128x12288
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from v12_sweep import (GRAPH_ROUNDS, GRAPH_WARM_MS, _capture, _inputs,  # noqa: E402
                       _replay_ms)


def main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", required=True, help="MxNxK,... (bfloat16)")
    p.add_argument("--idle-s", type=float, default=1.0, help="idle time before each phase")
    args = p.parse_args(argv)
    import torch
    import tirx_gemm
    from tirx_gemm import settings
    from tirx_gemm.bundle_format import code_git_sha
    from tirx_gemm.gitinfo import git_sha
    bundle = settings.get("TIRX_GEMM_BUNDLE")
    sha = (code_git_sha(Path(bundle)) if bundle else None) or git_sha()
    dtype = "bfloat16"
    log = []

    def replay(g, which, phase, n_launch):
        t0 = time.time()
        ms = _replay_ms(g)
        log.append({"phase": phase, "which": which, "wall_start": t0, "wall_end": time.time(),
                    "us_per_launch": ms * 1e3 / n_launch})

    for text in args.shapes.split(","):
        M, N, K = (int(x) for x in text.split("x"))
        ins, ref, pick, _ = _inputs(M, N, K, dtype, time_torch=False)
        tirx_gemm.matmul(ins[0][0], ins[0][1], out=ins[0][2], sync=True)
        fns = {"torch": [lambda a=a, b=b, d=d: torch.mm(a, b.t(), out=d) for a, b, d in pick],
               "matmul": [lambda a=a, b=b, d=d: tirx_gemm.matmul(a, b, out=d)
                          for a, b, d in pick]}
        n = len(pick)
        # the old order: torch's graph (captured, replayed once, 5 timed), then matmul's
        time.sleep(args.idle_s)
        for which in ("torch", "matmul"):
            g = _capture(fns[which])
            for _ in range(5):
                replay(g, which, f"{text} sequential", n)
        # interleaved: both captured, GRAPH_WARM_MS of replays, then alternately
        time.sleep(args.idle_s)
        gs = {w: _capture(f) for w, f in fns.items()}
        spent = 0.0
        while spent < GRAPH_WARM_MS:
            for g in gs.values():
                spent += _replay_ms(g)
        for r in range(GRAPH_ROUNDS):
            for w in (("torch", "matmul") if r % 2 == 0 else ("matmul", "torch")):
                replay(gs[w], w, f"{text} interleaved", n)
        del ins, ref, fns, gs
    with open(args.out, "w") as f:
        for row in log:
            f.write(json.dumps({**row, "device": torch.cuda.get_device_name(), "git_sha": sha})
                    + "\n")
    for phase in dict.fromkeys(r["phase"] for r in log):
        for w in ("torch", "matmul"):
            us = sorted(r["us_per_launch"] for r in log if r["phase"] == phase and r["which"] == w)
            print(f"{phase:32} {w:7} median {us[len(us) // 2]:8.1f} us/launch")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
