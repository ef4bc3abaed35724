#!/usr/bin/env bash
# on the H200: what the K-split shapes matmul still trails cuBLAS at spend their time
# on, and which kernels cuBLAS runs in fp16 (its fp16 kernels beat its bf16 ones at 1000^3 and
# 128x256x32768, where ours take the same time in both dtypes).
#   1. Nsight Compute, one launch each of matmul's pick and of torch.matmul (every kernel of
#      the call: cuBLAS's split-K GEMM and its reduce kernel) at SHAPES in DTYPE
#      (ncu's default cache flush before each profiled launch; clocks left alone).
#   2. cuBLAS's kernels per shape of the models and held-out suites, fp16 and bf16.
#   3. EAGER_SUITE (a suite file) timed eagerly by `tirx-gemm bench` over EAGER_BUNDLE.
# BUNDLE serves matmul's picks at SHAPES. TORCH_LAUNCHES: the kernels one torch.matmul call
# launches there (2 for cuBLAS's split-K GEMM and reduce, the default; 1 without split-K);
# CUBLAS=0 skips step 2. Outputs: $OUT/splitprof.tgz (a log per stage).
#   OUT=$OUT BUNDLE=.gpu/sf-float16 SHAPES="128 256 32768,128 128 65536" DTYPE=float16 \
#     EAGER_SUITE=.gpu/heldout-bfloat16.json EAGER_BUNDLE=.gpu/fin-bfloat16 \
#     bash lab/ncu_profiles/h200_splitprof.sh
# an earlier run's decode profiles (lab/ncu_profiles/logs/ncu/h200_mdec_*) ran these ncu commands from the
# device call's command line; to repeat them (then rename the logs):
#   OUT=$OUT BUNDLE=.gpu/models-bfloat16 DTYPE=bfloat16 TORCH_LAUNCHES=1 CUBLAS=0 \
#     SHAPES="72 4608 4096,88 10240 8192,64 8192 8192" bash lab/ncu_profiles/h200_splitprof.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
R=$PWD
BUNDLE=${BUNDLE:?bundle folder}
lab_begin splitprof "$BUNDLE"
export TIRX_GEMM_BUNDLE=$R/$BUNDLE TIRX_GEMM_KERNEL_TIMEOUT=60
DT=${DTYPE:-float16}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
SECS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats"
TL=${TORCH_LAUNCHES:-2}
if [ -n "$NCU" ]; then
  IFS=, read -ra LIST <<< "${SHAPES:-128 256 32768,128 128 65536}"
  for shape in "${LIST[@]}"; do
    set -- $shape
    tag="$1x$2x$3_$DT"
    TAILN=3 stage "ncu_ours_$tag" 90 "$NCU" --clock-control none --kernel-name kernel_kernel \
      --launch-skip 3 --launch-count 1 $SECS python3 lab/ncu_profiles/ncu_decode.py ours $1 $2 $3 $DT
    # cuBLAS: every kernel of the 4th call (its GEMM and, split-K, its reduce kernel), after
    # the 3 calls of TL kernels each before it
    TAILN=3 stage "ncu_torch_$tag" 90 "$NCU" --clock-control none \
      --kernel-name regex:"nvjet|gemm|cutlass|xmma|splitKreduce" \
      --launch-skip $((3 * TL)) --launch-count "$TL" $SECS \
      python3 lab/ncu_profiles/ncu_decode.py torch $1 $2 $3 $DT
  done
else
  echo "h200_splitprof: no ncu on PATH or under /usr/local/cuda*/bin: profiles skipped" >&2
fi
snap
for suite in $([ "${CUBLAS:-1}" = 0 ] || echo models heldout); do
  TAILN=2 stage "cublas_$suite" 120 python3 lab/cublas_kernels/cublas_kernels.py tirx_gemm/op/suites/$suite.json \
    --dtypes float16,bfloat16 --out "$W/cublas_kernels_${suite}.jsonl"
done
snap
if [ -n "${EAGER_SUITE:-}" ]; then
  TAILN=4 TIRX_GEMM_BUNDLE=$R/$EAGER_BUNDLE stage eager 150 python3 -m tirx_gemm.cli bench \
    --suite "$R/$EAGER_SUITE" --target matmul --arch sm_90a --bundle "$R/$EAGER_BUNDLE" \
    --record --results "$W/eager"
fi
exit 0
