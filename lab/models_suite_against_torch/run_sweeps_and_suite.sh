#!/usr/bin/env bash
# H200 runs (fast at every shape), from the checkout with bundles made here:
#   python lab/tools/v12_sweep.py export --out .gpu/v12 --dtypes bfloat16          (sweep)
#   python scripts/bench_overhead.py --print-suite > /tmp/overhead.json
#   tirx-gemm export --suite /tmp/overhead.json --arch sm_90a --out .gpu/overhead   (overhead)
# carry .gpu/v12 .gpu/overhead; on the GPU host: OUT=$OUT bash lab/models_suite_against_torch/run_sweeps_and_suite.sh sweep
# Stages under their own time limits (stage.sh).
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
WHL=$(ls .gpu/*/wheels/*.whl | head -1)
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHL" || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
case "${1:-sweep}" in
sweep)
TIRX_GEMM_BUNDLE=.gpu/overhead TAILN=22 stage overhead 80 python3 scripts/bench_overhead.py --out "$OUT/overhead.jsonl"
TAILN=60 stage sweep 420 python3 lab/tools/v12_sweep.py run --bundle .gpu/v12 --out "$OUT/v12_sweep.jsonl" --budget-s 380
;;
esac
exit 0
