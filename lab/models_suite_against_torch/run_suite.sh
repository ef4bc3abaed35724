#!/usr/bin/env bash
# On the H200: tirx_gemm.matmul over the models suite (the chooser with v12 tiles,
# pairs, v10 and PDL), both dtypes, eager (cli bench, records) and as CUDA graphs.
#   (copies of tirx_gemm/op/suites/models.json, one dtype each, every entry "all_m": false)
#   tirx-gemm export --suite .gpu/models-DT.json --arch sm_90a --out .gpu/s3-DT --ffi-wheel 3.12
# carry .gpu/s3-bfloat16 .gpu/s3-float16 .gpu/models-*.json; on the GPU host:
#   OUT=$OUT bash lab/models_suite_against_torch/run_suite.sh
# SUITE_BUNDLE=sN picks .gpu/sN-DT; EXTRA=x5 also runs .gpu/extra-DT.json (shapes off the
# suite, a check of the chooser's rules where they were not fitted) from .gpu/x5-DT;
# EXTRA_SPEC=heldout runs .gpu/heldout-DT.json instead (real-model shapes never fitted:
# tirx_gemm/op/suites/heldout.json, one dtype per copy, exported to .gpu/hN-DT).
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/${SUITE_BUNDLE:-s3}-bfloat16/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
for dt in bfloat16 float16; do
  TAILN=56 stage suite_$dt 170 python3 -m tirx_gemm.cli bench --suite .gpu/models-$dt.json --target matmul --arch sm_90a --bundle .gpu/${SUITE_BUNDLE:-s3}-$dt --record --results "$OUT/results"
done
for dt in bfloat16 float16; do
  TIRX_GEMM_BUNDLE=.gpu/${SUITE_BUNDLE:-s3}-$dt TAILN=12 stage graph_$dt 80 python3 lab/tools/matmul_graph_times.py .gpu/models-$dt.json --out "$OUT/graph_$dt.jsonl" --budget-s 70
done
if [ -n "${EXTRA:-}" ]; then
  for dt in bfloat16 float16; do
    TAILN=24 stage extra_$dt 90 python3 -m tirx_gemm.cli bench --suite .gpu/${EXTRA_SPEC:-extra}-$dt.json --target matmul --arch sm_90a --bundle .gpu/$EXTRA-$dt --record --results "$OUT/results_extra"
    TIRX_GEMM_BUNDLE=.gpu/$EXTRA-$dt TAILN=24 stage extra_graph_$dt 60 python3 lab/tools/matmul_graph_times.py .gpu/${EXTRA_SPEC:-extra}-$dt.json --out "$OUT/extra_graph_$dt.jsonl" --budget-s 50
  done
fi
exit 0
