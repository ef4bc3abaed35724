#!/usr/bin/env bash
# The SM clock beside the two graph timings (lab/graph_timing_method/graph_timing_clocks.py), bf16, with
# the bundle .gpu/$BUNDLE-bfloat16 (matmul's picks): nvidia-smi samples every 10 ms.
#   BUNDLE=models SHAPES=4096x4096x14336,384x128x12288,128x6144x4096 OUT=$OUT bash lab/graph_timing_method/h200_graph_clocks.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/${BUNDLE:-models}-bfloat16/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 10 > "$OUT/clocks.csv" &
smi=$!
TIRX_GEMM_BUNDLE=.gpu/${BUNDLE:-models}-bfloat16 timeout 240 python3 lab/graph_timing_method/graph_timing_clocks.py --out "$OUT/replays.jsonl" --shapes "$SHAPES"
rc=$?
kill $smi
date +%s.%N > "$OUT/host_clock.txt"; date -u '+%Y/%m/%d %H:%M:%S.%N' >> "$OUT/host_clock.txt"
exit $rc
