#!/usr/bin/env bash
# H200 runs: v11's tile widths and reduction depth at few-tile
# deep-K and split decode shapes, and v12's MMA_LAG at decode and mid-size shapes, each
# against torch.matmul timed in the same run. Bundles made here:
#   python lab/tools/h200_variants.py export lab/split_k_deep_k/suites/splitk_depths.json --out .gpu/i32
#   python lab/tools/h200_variants.py export lab/mma_lag_and_l2_hints/suites/mmalag.json --out .gpu/i32b
# carry .gpu/i32 .gpu/i32b; on the GPU host: OUT=$OUT bash lab/mma_lag_and_l2_hints/run_widths_depth_mma_lag.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
WHL=$(ls .gpu/*/wheels/*.whl | head -1)
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHL" || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TAILN=70 stage splitk "${SPLITK_S:-280}" python3 lab/tools/h200_variants.py run --bundle .gpu/i32 --records "$OUT/splitk_widths.jsonl" --passes 2
TAILN=45 stage mmalag "${MMALAG_S:-200}" python3 lab/tools/h200_variants.py run --bundle .gpu/i32b --records "$OUT/mma_lag.jsonl" --passes 2
exit 0
