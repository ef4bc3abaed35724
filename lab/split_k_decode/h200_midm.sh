#!/usr/bin/env bash
# a few hundred tokens on a deep K, and the held-out suite with the tail rule, in
# one H200 call: streaming_sweep.py's midm set (plain tiles against swap-AB tiles stored by
# TMA, interleaved with torch, two passes, every kernel checked), the kernels torch.matmul
# launches at those shapes (cublas_kernels.py, lab/split_k_decode/suites/midm.json), then the
# held-out suite through matmul (CUDA graphs interleaved with torch, two passes) from the
# bundles .gpu/$HELDOUT-DT. Here:
#   python lab/tools/streaming_sweep.py export --set midm --dtypes bfloat16,float16 --out .gpu/midm
#   tirx-gemm export --suite .gpu/heldout-DT.json --arch sm_90a --out .gpu/heldout-DT --ffi-wheel 3.12
# carry .gpu/call holding midm, heldout-DT bundles and heldout-*.json; on the GPU host:
#   HELDOUT=heldout OUT=$OUT bash lab/split_k_decode/h200_midm.sh
# Everything comes back as $OUT/midm.tgz.
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
HO=${HELDOUT:-heldout}
lab_begin midm .gpu/midm
for pass in 1 2; do
  TAILN=22 stage midm$pass 150 python3 lab/tools/streaming_sweep.py run --set midm --bundle .gpu/midm --dtypes bfloat16,float16 --out "$W/midm.jsonl" --budget-s 140; snap
done
TAILN=12 stage cublas 90 python3 lab/cublas_kernels/cublas_kernels.py lab/split_k_decode/suites/midm.json --out "$W/cublas_midm.jsonl"; snap
for pass in 1 2; do
  for dt in bfloat16 float16; do
    TIRX_GEMM_BUNDLE=.gpu/$HO-$dt TAILN=3 stage ${HO}_heldout${pass}_$dt 90 python3 lab/tools/matmul_graph_times.py .gpu/heldout-$dt.json --out "$W/heldout_graph_${HO}_$dt.jsonl" --budget-s 80; snap
  done
done
exit 0
