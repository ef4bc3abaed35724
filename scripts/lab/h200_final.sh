#!/usr/bin/env bash
# The closing H200 call for issues 27 and 32 (one dtype per call: the bundle of one dtype
# fits the 64 MiB carry). Here, with DT=bfloat16 or float16:
#   python - (a copy of tirx_gemm/suites/models.json with "dtypes": [DT]) > .gpu/models-DT.json
#   for s in .gpu/models-DT.json [tirx_gemm/suites/llama3-8b.json .gpu/overhead.json]; do
#     tirx-gemm export --suite $s --arch sm_90a --out .gpu/DT --ffi-wheel 3.12; done
# carry .gpu/DT and the suite copies; on the GPU host: OUT=$OUT bash scripts/lab/h200_final.sh DT
# Everything lands in $OUT/final-DT.tgz (the call returns at most 8 files).
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stage.sh"
DT=${1:-bfloat16}
B=.gpu/$DT
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site $B/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20 TIRX_GEMM_BUNDLE=$B
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TAILN=55 stage suite_$DT 150 python3 -m tirx_gemm.cli bench --suite .gpu/models-$DT.json --target matmul --arch sm_90a --bundle $B --record --results "$OUT/results" -q
TAILN=52 stage graph_$DT 110 python3 scripts/lab/matmul_graph_times.py .gpu/models-$DT.json --out "$OUT/graph_$DT.jsonl" --budget-s 95
if [ "$DT" = bfloat16 ]; then
TAILN=4 stage runtime_m 50 python3 scripts/lab/runtime_m_check.py --out "$OUT/runtime_m.jsonl"
TAILN=30 stage overhead 50 python3 scripts/bench_overhead.py --out "$OUT/overhead.jsonl"
TAILN=22 stage model 100 python3 scripts/bench_model.py --budget-s 75 --out "$OUT/model.jsonl"
TAILN=8 stage gpu_op 50 python3 -m pytest -m gpu tests/test_gpu_op.py -q -p no:cacheprovider
fi
cd "$OUT" && tar czf /tmp/final-$DT.tgz . && mv /tmp/final-$DT.tgz "$OUT/" && find "$OUT" -mindepth 1 ! -name "final-$DT.tgz" -delete
exit 0
