#!/usr/bin/env bash
# v12's exit wait on the H200: matmul over the models suite with the bundle before
# (SUITE_A, wait_group 0 at exit: every TMA store's write done) and after (SUITE_B,
# wait_group.read 0: only their SMEM reads) in one call, both dtypes, eager (cli bench,
# records) and CUDA graphs, then the graphs once more in the other order.
#   tirx-gemm export --suite .gpu/models-DT.json --arch sm_90a --out .gpu/NAME-DT --ffi-wheel 3.12
# carry .gpu/$SUITE_A-* .gpu/$SUITE_B-* .gpu/models-*.json; on the GPU host:
#   SUITE_A=before SUITE_B=after OUT=$OUT bash lab/pdl_exit_trigger/h200_exitread.sh
# Everything comes back as $OUT/exitread.tgz (the device returns at most 8 files).
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
A=${SUITE_A:-before}
B=${SUITE_B:-after}
lab_begin exitread .gpu/$B-bfloat16  # snap after every stage: a cut-off call still brings the rest back
for s in $A $B; do
  for dt in bfloat16 float16; do
    TAILN=3 stage ${s}_suite_$dt 170 python3 -m tirx_gemm.cli bench --suite .gpu/models-$dt.json --target matmul --arch sm_90a --bundle .gpu/$s-$dt --record --results "$W/results_$s"; snap
  done
  for dt in bfloat16 float16; do
    TIRX_GEMM_BUNDLE=.gpu/$s-$dt TAILN=2 stage ${s}_graph_$dt 80 python3 lab/tools/matmul_graph_times.py .gpu/models-$dt.json --out "$W/graph_${s}_$dt.jsonl" --budget-s 70; snap
  done
done
for s in $B $A; do
  for dt in bfloat16 float16; do
    TIRX_GEMM_BUNDLE=.gpu/$s-$dt TAILN=2 stage ${s}_graph2_$dt 80 python3 lab/tools/matmul_graph_times.py .gpu/models-$dt.json --out "$W/graph2_${s}_$dt.jsonl" --budget-s 70; snap
  done
done
if [ -n "${HELDOUT_A:-}" ]; then  # the held-out shapes, before and after (.gpu/hN-DT)
  for s in $HELDOUT_B $HELDOUT_A; do
    for dt in bfloat16 float16; do
      TAILN=3 stage ${s}_heldout_$dt 60 python3 -m tirx_gemm.cli bench --suite .gpu/heldout-$dt.json --target matmul --arch sm_90a --bundle .gpu/$s-$dt --record --results "$W/results_$s"; snap
      TIRX_GEMM_BUNDLE=.gpu/$s-$dt TAILN=2 stage ${s}_heldout_graph_$dt 40 python3 lab/tools/matmul_graph_times.py .gpu/heldout-$dt.json --out "$W/heldout_graph_${s}_$dt.jsonl" --budget-s 35; snap
    done
  done
fi
exit 0
