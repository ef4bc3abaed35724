#!/usr/bin/env bash
# Issue 32 on the H200: v12 at the widths between its menu's (BLK_N 80..240, WIDTHS_MENU)
# every entry at every shape of tirx_gemm/suites/models.json
# (bf16), checked and timed against torch.mm in the same run (scripts/lab/v12_sweep.py).
#   python scripts/lab/v12_sweep.py export --out .gpu/v12w --dtypes bfloat16 --widths   # here
# carry .gpu/v12w; on the GPU host: OUT=$OUT bash scripts/lab/h200_issue32_widths.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/v12w/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TAILN=60 stage sweep "${SWEEP_LIMIT:-520}" python3 scripts/lab/v12_sweep.py run --bundle .gpu/v12w \
  --out "$OUT/v12_widths_sweep_h200.jsonl" --dtypes bfloat16 --budget-s "${SWEEP_BUDGET:-480}"
exit 0
