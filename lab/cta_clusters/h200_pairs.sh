#!/usr/bin/env bash
# A set of streaming_sweep.py on the H200 (SETS, default "pairs": one-CTA v12 tiles against
# their CTA pairs, CLUSTER=2, at a few hundred tokens on a wide weight with a deep K and at
# mid-size squares; "shortk", "midk": v9 and v10 beside v12's tiles), both dtypes, every
# kernel checked. MODE=set (default): all kernels of a shape interleaved with torch.mm
# together, two passes (PASS_S seconds each, 260 by default); MODE=pairwise: each kernel
# interleaved with torch.mm alone
# (--pairwise, matmul_graph_times' protocol), the SM clock and power logged beside it
# (nvidia-smi every 20 ms; records carry each kernel's wall span).
#   python lab/tools/streaming_sweep.py export --set pairs --dtypes bfloat16,float16 --out .gpu/pairs
# carry .gpu/pairs; on the GPU host:  OUT=$OUT [MODE=pairwise] [SETS="pairs streaming"] bash lab/cta_clusters/h200_pairs.sh
# (a set's bundle is .gpu/<set>, streaming's .gpu/stream; DTYPES (commas or spaces) picks the dtypes)
# Everything comes back as $OUT/pairs.tgz.
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
MODE=${MODE:-set}
bundle() { case $1 in streaming) echo .gpu/stream ;; *) echo .gpu/$1 ;; esac; }  # each set's export
first=$(bundle ${SETS:-pairs}); first=${first%% *}
lab_begin pairs $first
if [ "$MODE" = pairwise ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 20 > "$W/clocks.csv" 2>&1 &
  smi=$!
  for set in ${SETS:-pairs}; do
    TAILN=40 stage ${set}_pairwise 280 python3 lab/tools/streaming_sweep.py run --set $set --pairwise --bundle $(bundle $set) --dtypes $(echo ${DTYPES:-bfloat16,float16} | tr " " ,) --out "$W/${set}_pairwise.jsonl" --budget-s 270; snap
  done
  kill $smi
else
  for set in ${SETS:-pairs}; do
    for pass in 1 2; do
      TAILN=30 stage $set$pass ${PASS_S:-260} python3 lab/tools/streaming_sweep.py run --set $set --bundle $(bundle $set) --dtypes $(echo ${DTYPES:-bfloat16,float16} | tr " " ,) --out "$W/$set.jsonl" --budget-s $(( ${PASS_S:-260} - 10 )); snap
    done
  done
fi
exit 0
