#!/usr/bin/env bash
# On the H200: v12's SPLIT_K (a CTA per unit; S > 1 with v11's spread reduction)
# beside torch.mm in the same run (lab/cost_model_fit/v12_split_sweep.py).
#   here:  python lab/cost_model_fit/v12_split_sweep.py export --out .gpu/v12s
# carry .gpu/v12s; on the GPU host: OUT=$OUT bash lab/cost_model_fit/run_split_sweep.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/v12s/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TAILN=80 stage split "${SWEEP_LIMIT:-540}" python3 lab/cost_model_fit/v12_split_sweep.py run \
  --bundle .gpu/v12s --out "$OUT/v12_split_h200.jsonl" --dtypes bfloat16 \
  --budget-s "${SWEEP_BUDGET:-480}"
exit 0
