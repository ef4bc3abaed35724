#!/usr/bin/env bash
# The second H200 runs and 29 (after the first run's findings: the epilogue's bias
# loads moved before the last wgmma wait, v10's ping-pong epilogue; v13's promotion
# overlapped with the next stage's wgmmas). From the checkout, bundles made here:
#   tirx-gemm export --suite tirx_gemm/op/suites/epilogue-h200.json --arch sm_90a --out .gpu/epilogue --ffi-wheel 3.12
#   tirx-gemm export --suite tirx_gemm/op/suites/epilogue-v10.json --arch sm_90a --out .gpu/epilogue --ffi-wheel 3.12
#   python lab/fp8_on_hopper/fp8_export.py --out .gpu/fp8 --ffi-wheel 3.12
# carry: .gpu/epilogue .gpu/fp8. On the GPU host: OUT=$OUT bash lab/fused_epilogues/run_epilogues_and_fp8_recheck.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/epilogue/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TAILN=40 stage epilogue 120 python3 lab/fused_epilogues/epilogue_h200.py --bundle .gpu/epilogue --out "$OUT/epilogue.jsonl" --budget-s 100
TAILN=40 stage epilogue_v10 150 python3 lab/fused_epilogues/epilogue_h200.py --v10 --suite tirx_gemm/op/suites/epilogue-v10.json --bundle .gpu/epilogue --out "$OUT/epilogue_v10.jsonl" --budget-s 130
TAILN=60 stage fp8 130 python3 lab/fp8_on_hopper/fp8_h200.py --bundle .gpu/fp8 --budget-s 110 --out "$OUT/fp8_h200.jsonl"
TAILN=30 stage fp8_suite 120 python3 lab/fp8_on_hopper/fp8_suite.py --bundle .gpu/fp8 --budget-s 85 --out "$OUT/fp8_suite.jsonl"
exit 0
