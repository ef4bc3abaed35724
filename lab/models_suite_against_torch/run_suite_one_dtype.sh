#!/usr/bin/env bash
# The closing H200 runs and 32 (one dtype per call: the bundle of one dtype
# fits the 64 MiB carry). Here, with DT=bfloat16 or float16:
#   python - (a copy of tirx_gemm/op/suites/models.json with "dtypes": [DT]) > .gpu/models-DT.json
#   for s in .gpu/models-DT.json [tirx_gemm/op/suites/llama3-8b.json .gpu/overhead.json]; do
#     tirx-gemm export --suite $s --arch sm_90a --out .gpu/DT --ffi-wheel 3.12; done
# carry .gpu/DT and the suite copies; on the GPU host: OUT=$OUT bash lab/models_suite_against_torch/run_suite_one_dtype.sh DT
# Everything lands in $OUT/final-DT.tgz (the call returns at most 8 files).
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
DT=${1:-bfloat16}
B=.gpu/$DT
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ "$DT" = both ]; then  # the closing call: each dtype's suite, checked, timed, graphed
  for d in float16 bfloat16; do SKIP_TAR=1 OUT="$OUT" bash "$0" "$d-suite"; done
  cd "$OUT" && tar czf /tmp/final-both.tgz . && mv /tmp/final-both.tgz "$OUT/" && find "$OUT" -mindepth 1 ! -name "final-both.tgz" -delete
  exit 0
fi
SUITE_ONLY=0
case "$DT" in *-suite) DT=${DT%-suite}; B=.gpu/$DT; SUITE_ONLY=1;; esac
python3 -m pip install -q --no-index --no-deps --target /tmp/site $B/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20 TIRX_GEMM_BUNDLE=$B
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TAILN=12 stage suite_$DT 140 python3 -m tirx_gemm.cli bench --suite .gpu/models-$DT.json --target matmul --arch sm_90a --bundle $B --record --results "$OUT/results" -q
TAILN=3 stage graph_$DT 100 python3 lab/tools/matmul_graph_times.py .gpu/models-$DT.json --out "$OUT/graph_$DT.jsonl" --budget-s 85
if [ "$DT" = bfloat16 ] && [ "$SUITE_ONLY" = 0 ]; then
TAILN=52 stage sweep 70 python3 lab/tools/v12_sweep.py run --bundle $B --suite .gpu/models-$DT.json --out "$OUT/v12_sweep.jsonl" --budget-s 60
TAILN=4 stage runtime_m 40 python3 lab/one_kernel_every_token_count/runtime_m_check.py --out "$OUT/runtime_m.jsonl"
TAILN=30 stage overhead 40 python3 scripts/bench_overhead.py --out "$OUT/overhead.jsonl"
TAILN=22 stage model 80 python3 scripts/bench_model.py --budget-s 60 --out "$OUT/model.jsonl"
TAILN=8 stage gpu_op 40 python3 -m pytest -m gpu tests/test_gpu_op.py -q -p no:cacheprovider
fi
[ -n "${SKIP_TAR:-}" ] && exit 0
cd "$OUT" && tar czf /tmp/final-$DT.tgz . && mv /tmp/final-$DT.tgz "$OUT/" && find "$OUT" -mindepth 1 ! -name "final-$DT.tgz" -delete
exit 0
