"""Print a bench_grouped.py records file as a Markdown table, with the geomeans of the ratios.

    python lab/moe_grouped_gemm/summarize.py records/FILE.jsonl
"""
import json
import math
import sys


def _f(v, fmt):
    return "n/a" if v is None else format(v, fmt)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    recs = [json.loads(line) for line in open(argv[0]) if line.strip()]
    print(f"card: {', '.join(sorted({r.get('device', '?') for r in recs}))}\n")
    print("| model | layer | tokens | dtype | torch grouped_mm us | loop us | tirx us | tirx TFLOP/s "
          "| x grouped_mm | x loop | / floor | kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        if "error" in r:
            print(f"| {r['model']} | {r['layer']} | {r['tokens']} | {r['dtype']} | error: "
                  f"{r['error'][:80]} |||||||")
            continue
        t, k = r["t_us"], r.get("kernel") or {}
        tile = (f"{k.get('BLK_M')}x{k.get('BLK_N')}{' swap' if k.get('SWAP_AB') else ''}"
                if k else "")
        print(f"| {r['model']} | {r['layer'].split(' (')[0]} | {r['tokens']} | {r['dtype']} | "
              f"{_f(t['torch_grouped_mm'], '.1f')} | {_f(t['loop'], '.1f')} | "
              f"{_f(t['tirx'], '.1f')} | {_f(r['tflops']['tirx'], '.0f')} | "
              f"{_f(r.get('ratio_vs_torch_grouped_mm'), '.2f')} | "
              f"{_f(r.get('ratio_vs_loop'), '.2f')} | {_f(r.get('over_floor'), '.2f')} | {tile} |")
    for key in ("ratio_vs_torch_grouped_mm", "ratio_vs_loop"):
        vals = [r[key] for r in recs if r.get(key)]
        if vals:
            g = math.exp(sum(math.log(v) for v in vals) / len(vals))
            print(f"\n{key}: geomean {g:.3f}, min {min(vals):.3f}, {len(vals)} cases, "
                  f"{sum(v >= 1 for v in vals)} at 1.0 or more")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
