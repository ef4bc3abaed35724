#!/usr/bin/env bash
# On the H200: v10's ping-pong (plain, no epilogue) at every shape of the models
# suite (bf16), as CUDA graphs against torch.mm in the same run, for the chooser's model
# (scripts/fit_chooser.py reads lab/cost_model_fit/records/v10_suite_graph_h200.jsonl).
#   tirx-gemm export --suite .gpu/models-bfloat16.json --target v10 --arch sm_90a --out .gpu/v10suite
#   (the apache-tvm-ffi wheel for Python 3.12 in .gpu/wheels312: `--ffi-wheel 3.12` of any export)
# carry .gpu/v10suite .gpu/wheels312 .gpu/models-bfloat16.json; on the GPU host:
#   OUT=$OUT bash lab/cost_model_fit/run_v10_suite_sweep.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels312/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TIRX_GEMM_BUNDLE=.gpu/v10suite TAILN=52 stage v10_graph 150 python3 lab/tools/matmul_graph_times.py \
  .gpu/models-bfloat16.json --step v10 --out "$OUT/v10_suite_graph_h200.jsonl" --budget-s 130
exit 0
