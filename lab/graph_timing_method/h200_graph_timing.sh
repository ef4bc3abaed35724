#!/usr/bin/env bash
# The CUDA-graph timing of matmul against torch.mm on the H200, both ways in one call:
# "sequential" (torch's graph timed first, then matmul's: the method of the earlier suite runs) and
# "interleaved" (both replayed past the GPU's boost, then alternately: the default since),
# over the models suite (bundle .gpu/$SUITE-DT), then the held-out suite (.gpu/$HELDOUT-DT)
# interleaved. carry .gpu/call holding the bundles and the suites' one-dtype copies:
#   SUITE=models HELDOUT=heldout OUT=$OUT bash lab/graph_timing_method/h200_graph_timing.sh
# TIMINGS=interleaved times only the interleaved way; EAGER=1 adds `tirx-gemm bench` over the
# models suite from the same bundles, one pass per dtype (CUDA events around each launch).
# Everything comes back as $OUT/graph_timing.tgz.
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
S=${SUITE:-models}
HO=${HELDOUT:-}
lab_begin graph_timing .gpu/$S-bfloat16
for pass in 1 2; do
  for dt in bfloat16 float16; do
    for t in ${TIMINGS:-sequential interleaved}; do
      TIRX_GEMM_BUNDLE=.gpu/$S-$dt TAILN=2 stage ${S}_${t}${pass}_$dt 150 python3 lab/tools/matmul_graph_times.py .gpu/models-$dt.json --timing $t --out "$W/graph_${S}_${t}${pass}_$dt.jsonl" --budget-s 140; snap
    done
  done
done
if [ -n "${EAGER:-}" ]; then
  for dt in bfloat16 float16; do
    TAILN=3 stage ${S}_eager_$dt 150 python3 -m tirx_gemm.cli bench --suite .gpu/models-$dt.json --target matmul --arch sm_90a --bundle .gpu/$S-$dt --record --results "$W/results_$S"; snap
  done
fi
if [ -n "$HO" ]; then
  for dt in bfloat16 float16; do
    TIRX_GEMM_BUNDLE=.gpu/$HO-$dt TAILN=2 stage ${HO}_interleaved_$dt 100 python3 lab/tools/matmul_graph_times.py .gpu/heldout-$dt.json --out "$W/heldout_graph_${HO}_interleaved_$dt.jsonl" --budget-s 90; snap
  done
fi
exit 0
