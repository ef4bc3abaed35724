#!/usr/bin/env bash
# One H200 run: sm_90a v10 (ping-pong consumers), ~6 minutes.
# Run from a snapshot of the checkout (.gpu/src) with bundles exported here. Here (CPU,
# after v10 is committed), from the repository root:
#   rm -rf .gpu/src && mkdir -p .gpu/src && git archive HEAD | tar -x -C .gpu/src
#   tirx-gemm export v10 --arch sm_90a --shapes all --out .gpu/b10 --ffi-wheel 3.12 -q
#   tirx-gemm export v10 --arch sm_90a --shapes all --dtype bfloat16 --out .gpu/b10 -q
#   tirx-gemm export v10 --arch sm_90a --shapes all --watchdog-ms 2000 --out .gpu/b10 -q
#   python lab/tools/h200_variants.py export lab/steps_on_h200/suites/pingpong.json --out .gpu/lab10
#   mkdir -p .gpu/peers && cp -r /work/shared/peers/fastcu .gpu/peers/   (if not there yet)
# and carry .gpu/src .gpu/b10 .gpu/lab10 .gpu/peers (~16 MiB). Then on the GPU host:
#   bash lab/steps_on_h200/run_v10_ping_pong.sh          (from the repository root; OUT=$OUT)
# Stages, each with its own time limit (one hung stage cannot take the others with it):
#   check_fp16 / check_bf16  every registry shape of v10, checked only; a kernel that does
#                            not finish within TIRX_GEMM_KERNEL_TIMEOUT s is stopped by the
#                            host's guard; if the fp16 check fails, the watchdog build runs
#                            the same checks and names the mbarrier that stalled
#   lab                      lab/steps_on_h200/suites/pingpong.json: corners (checked), then v10
#                            variants and v9 timed against torch.matmul, 2 passes
#   fastcu                   fast.cu kernel 12 vs torch.matmul at the three large shapes
# Logs and records go to $OUT.
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
G=$PWD/.gpu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/results"
WHEELS=$(ls "$G"/b10/wheels/*.whl "$G"/bench/wheels/*.whl 2>/dev/null | head -1)
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS" || exit 3
cd "$G/src" || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
R="--results $OUT/results --record"
case "${1:-a}" in
a)  # round 1: checks, every variant, the peer
if ! stage check_fp16 90 python3 -m tirx_gemm.cli bench v10 --arch sm_90a --shapes all --no-time --bundle "$G/b10" $R -q; then
  TAILN=40 stage check_fp16_watchdog 90 python3 -m tirx_gemm.cli bench v10 --arch sm_90a --shapes all --no-time --watchdog-ms 2000 --bundle "$G/b10" -q
fi
stage check_bf16 90 python3 -m tirx_gemm.cli bench v10 --arch sm_90a --shapes all --no-time --dtype bfloat16 --bundle "$G/b10" $R -q
TAILN=45 stage lab 240 python3 lab/tools/h200_variants.py run --bundle "$G/lab10" --records "$OUT/lab_v10_variants.jsonl" --passes 2
TAILN=8 FASTCU_TIMEOUT_S=60 stage fastcu 90 python3 "$G/peers/fastcu/fastcu_bench.py" 4096x4096x4096 8192x8192x8192 4096x14336x4096
;;
final1)  # round 2, part 1 (bundle .gpu/lab10f from lab/steps_on_h200/suites/v10_bench.json): v9 and v10
         # against torch over 3 passes, with the peer before and after in the same call
TAILN=8 FASTCU_TIMEOUT_S=60 stage fastcu 90 python3 "$G/peers/fastcu/fastcu_bench.py" 4096x4096x4096 8192x8192x8192 4096x14336x4096
TAILN=30 stage lab_final 200 python3 lab/tools/h200_variants.py run --bundle "$G/lab10f" --records "$OUT/lab_lab/steps_on_h200/suites/v10_bench.jsonl" --passes 3
TAILN=8 FASTCU_TIMEOUT_S=60 stage fastcu_after 90 python3 "$G/peers/fastcu/fastcu_bench.py" 4096x4096x4096 8192x8192x8192 4096x14336x4096
;;
final2)  # round 2, part 2 (bundle .gpu/bench: every sm_90a step at its benchmark shapes):
         # v10's benchmark shapes timed for the results table, one Nsight Compute launch
         # of v9 and v10 at 4096^3 (clocks left alone), the regression baseline with v10
TAILN=12 stage bench_v10 90 python3 -m tirx_gemm.cli bench v10 --arch sm_90a --shapes bench --bundle "$G/bench" $R -q
STEPS="v9 v10" TAILN=4 stage ncu 200 bash lab/ncu_profiles/ncu_profile.sh "$G/bench" "$OUT/ncu"
(cd "$OUT/ncu" 2>/dev/null && tar -czf "$OUT/ncu.tgz" .)
# first against the committed baseline (--update-baseline alone compares nothing), then a
# fresh baseline from a second run (copy it to goldens/baselines/ if the first passed)
TAILN=30 stage regress 150 python3 -m tirx_gemm.cli regress --bundle "$G/bench" -q
cp goldens/baselines/nvidia-h200.json "$OUT/baseline.json"
TAILN=5 stage regress_update 150 python3 -m tirx_gemm.cli regress --bundle "$G/bench" --baseline "$OUT/baseline.json" --update-baseline -q
;;
esac
# records flat in $OUT (nested result folders do not always come back), logs in one archive
cp "$OUT"/results/*.jsonl "$OUT/" 2>/dev/null
(cd "$OUT" && tar -czf "logs18_${1:-a}.tgz" *.log gpu.txt 2>/dev/null && rm -f *.log)
echo "stages done in ${SECONDS}s"
