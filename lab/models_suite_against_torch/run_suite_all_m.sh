#!/usr/bin/env bash
# The closing H200 runs, from bundles exported here:
#   (copies of tirx_gemm/op/suites/models.json, one dtype each, every entry "all_m": false)
#   tirx-gemm export --suite .gpu/models-DT.json --arch sm_90a --out .gpu/s-DT --ffi-wheel 3.12
#   tirx-gemm export --suite tirx_gemm/op/suites/llama3-8b.json --arch sm_90a --out .gpu/llama --ffi-wheel 3.12
# carry .gpu/s-bfloat16 .gpu/s-float16 .gpu/models-*.json .gpu/llama; on the GPU host:
#   OUT=$OUT bash lab/models_suite_against_torch/run_suite_all_m.sh suites     (each dtype's suite; graphs)
#   OUT=$OUT bash lab/models_suite_against_torch/run_suite_all_m.sh model      (the suite shapes whose choice
#       changed after the suites call, from .gpu/recheck; decoder block; op tests)
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/llama/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
case "${1:-suites}" in
suites)
for dt in bfloat16 float16; do
  TAILN=56 stage suite_$dt 150 python3 -m tirx_gemm.cli bench --suite .gpu/models-$dt.json --target matmul --arch sm_90a --bundle .gpu/s-$dt --record --results "$OUT/results"
done
TIRX_GEMM_BUNDLE=.gpu/s-bfloat16 TAILN=30 stage graph_bfloat16 90 python3 lab/tools/matmul_graph_times.py .gpu/models-bfloat16.json --out "$OUT/graph_bfloat16.jsonl" --budget-s 80
;;
model)
TAILN=30 stage recheck 120 python3 -m tirx_gemm.cli bench --suite .gpu/models-recheck.json --target matmul --arch sm_90a --bundle .gpu/recheck --record --results "$OUT/results"
TIRX_GEMM_BUNDLE=.gpu/llama TAILN=45 stage model 230 python3 scripts/bench_model.py --budget-s 200 --out "$OUT/model.jsonl"
TIRX_GEMM_BUNDLE=.gpu/llama TAILN=12 stage gpu_op 90 python3 -m pytest -m gpu tests/test_gpu_op.py -q -p no:cacheprovider
;;
esac
exit 0
