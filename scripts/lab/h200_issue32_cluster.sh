#!/usr/bin/env bash
# Issue 32 on the H200: v12 with CLUSTER=2 (a CTA pair along M sharing B by multicast)
# beside v12's one-CTA menu, every entry at every shape of tirx_gemm/suites/models.json
# (bf16), checked and timed against torch.mm in the same run (scripts/lab/v12_sweep.py).
#   python scripts/lab/v12_sweep.py export --out .gpu/v12c --dtypes bfloat16 --cluster   # here
# carry .gpu/v12c; on the GPU host: OUT=$OUT bash scripts/lab/h200_issue32_cluster.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/v12c/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TAILN=60 stage sweep "${SWEEP_LIMIT:-520}" python3 scripts/lab/v12_sweep.py run --bundle .gpu/v12c \
  --out "$OUT/v12_cluster_sweep_h200.jsonl" --dtypes bfloat16 --budget-s "${SWEEP_BUDGET:-480}"
exit 0
