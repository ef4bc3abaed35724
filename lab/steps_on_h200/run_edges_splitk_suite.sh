#!/usr/bin/env bash
# One H200 run, run from a snapshot
# of the checkout (.gpu/src, `git archive HEAD`) with bundles exported here:
#   .gpu/b16, .gpu/bbf   every sm_90a step at every registry shape, fp16 / bf16
#   .gpu/lab, .gpu/labk  lab variants (lab/steps_on_h200/suites/corners.json, lab/split_k_deep_k/suites/splitk_variants.json)
#   .gpu/suite, .gpu/suite9  the shape suite for tirx_gemm.matmul's choice / for v9 alone
# Each stage has its own time limit so that one slow or hung stage cannot take the others
# with it; logs and records go to $OUT. Two runs: `run_edges_splitk_suite.sh a` (checks, lab
# variants) and `run_edges_splitk_suite.sh b` (the suite, matmul, the benchmark shapes).
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
G=$PWD/.gpu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/results"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$G"/b16/wheels/*.whl || exit 3
cd "$G/src" || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
R="--results $OUT/results --record"
case "${1:-a}" in
a)
stage check_fp16 110 python3 -m tirx_gemm.cli bench --all --arch sm_90a --shapes all --no-time --bundle "$G/b16" $R -q
stage check_bf16 110 python3 -m tirx_gemm.cli bench --all --arch sm_90a --shapes all --no-time --dtype bfloat16 --bundle "$G/bbf" $R -q
TAILN=40 stage lab_corners 100 python3 lab/tools/h200_variants.py run --bundle "$G/lab" --records "$OUT/lab_corners.jsonl" --passes 3
TAILN=30 stage lab_splitk 150 python3 lab/tools/h200_variants.py run --bundle "$G/labk" --records "$OUT/lab_splitk.jsonl" --passes 3
;;
b)
TAILN=12 stage suite_matmul 150 python3 -m tirx_gemm.cli bench --suite --target matmul --arch sm_90a --bundle "$G/suite" $R -q
TAILN=12 stage suite_v9 130 python3 -m tirx_gemm.cli bench --suite --target v9 --arch sm_90a --bundle "$G/suite9" $R -q
TAILN=5 TIRX_GEMM_BUNDLE="$G/suite" stage matmul_smoke 80 python3 lab/tools/matmul_smoke.py
stage bench_fp16 120 python3 -m tirx_gemm.cli bench --all --arch sm_90a --shapes bench --bundle "$G/b16" $R -q
;;
c)  # the final round: the main table's checks, the suite with the retuned rule, the
    # benchmark shapes, and the regression baseline (with v11) from the same bundle
stage check_fp16 80 python3 -m tirx_gemm.cli bench --all --arch sm_90a --shapes all --no-time --bundle "$G/b16" $R -q
stage check_bf16 80 python3 -m tirx_gemm.cli bench --all --arch sm_90a --shapes all --no-time --dtype bfloat16 --bundle "$G/bbf" $R -q
TAILN=12 stage suite_matmul 120 python3 -m tirx_gemm.cli bench --suite --target matmul --arch sm_90a --bundle "$G/suite" $R -q
TAILN=5 TIRX_GEMM_BUNDLE="$G/suite" stage matmul_smoke 60 python3 lab/tools/matmul_smoke.py
stage bench_fp16 90 python3 -m tirx_gemm.cli bench --all --arch sm_90a --shapes bench --bundle "$G/b16" $R -q
cp goldens/baselines/nvidia-h200.json "$OUT/baseline.json"  # rewritten from this run (--update-baseline compares nothing)
stage regress 120 python3 -m tirx_gemm.cli regress --bundle "$G/b16" --baseline "$OUT/baseline.json" --update-baseline -q
;;
esac
# records flat in $OUT (nested result folders do not always come back)
cp "$OUT"/results/*.jsonl "$OUT/" 2>/dev/null
for f in "$OUT"/results/suites/*.jsonl; do [ -f "$f" ] && cp "$f" "$OUT/suite_$(basename "$f")"; done
echo "stages done in ${SECONDS}s"
