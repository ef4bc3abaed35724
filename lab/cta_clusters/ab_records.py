"""The records and logs of one card's A/B run (`.gpu/run_ab.sh`'s ab.tgz, unpacked), as
ab_summary.py reads them: each stage's SET_PKG{PASS}_DT.jsonl lines with ``package`` and
``pass`` added from the file's name (the measured fields as the run wrote them) into
records/ab_c4next_<card>.jsonl, ab_m128_pairs_<card>.jsonl and ab_c4mis_quads_<card>.jsonl;
the eager `tirx-gemm bench` records of c4next with ``package`` into
ab_c4next_eager_<card>.jsonl; the stages' logs, gpu.txt, sms.txt and summary.txt into
logs/ab_<card>/, with run.log the summary the run printed (the stdout's tail).

    python lab/cta_clusters/ab_records.py UNPACKED_DIR --card h200 [--stdout FILE]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CARDS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}
RECORDS = {"c4next": "ab_c4next_{card}.jsonl", "m128": "ab_m128_pairs_{card}.jsonl",
           "c4mis": "ab_c4mis_quads_{card}.jsonl"}
STAGE = re.compile(r"(c4next|m128|c4mis)_(new|old|pairs|quads)(\d)_(float16|bfloat16)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--card", choices=sorted(CARDS), required=True)
    ap.add_argument("--stdout", type=Path, default=None,
                    help="the run's stdout (run.log); default: its summary.txt")
    a = ap.parse_args(argv)
    out: dict[str, list[str]] = {name: [] for name in RECORDS}
    for f in sorted(a.run_dir.glob("*.jsonl")):
        m = STAGE.fullmatch(f.stem)
        if not m:
            continue
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if r["device"] != CARDS[a.card]:
                print(f"error: {f.name} ran on {r['device']}, not {CARDS[a.card]}", file=sys.stderr)
                return 2
            out[m[1]].append(json.dumps({**r, "package": m[2], "pass": int(m[3])}))
    eager = []
    for d in sorted(a.run_dir.glob("eager_c4next_*_*")):
        m = re.fullmatch(r"eager_c4next_(new|old)_(float16|bfloat16)", d.name)
        if not m or not d.is_dir():
            continue
        for f in sorted(d.rglob("*.jsonl")):
            eager += [json.dumps({**json.loads(line), "package": m[1]})
                      for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    rec_dir, log_dir = HERE / "records", HERE / "logs" / f"ab_{a.card}"
    log_dir.mkdir(parents=True, exist_ok=True)
    for name, lines in out.items():
        if lines:
            (rec_dir / RECORDS[name].format(card=a.card)).write_text("\n".join(lines) + "\n")
            print(f"{RECORDS[name].format(card=a.card)}: {len(lines)} records")
    if eager:
        (rec_dir / f"ab_c4next_eager_{a.card}.jsonl").write_text("\n".join(eager) + "\n")
        print(f"ab_c4next_eager_{a.card}.jsonl: {len(eager)} records")
    for f in sorted(a.run_dir.iterdir()):
        if f.is_file() and f.suffix in (".log", ".txt"):
            shutil.copy(f, log_dir / f.name)
    run_log = a.stdout or a.run_dir / "summary.txt"
    shutil.copy(run_log, log_dir / "run.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
