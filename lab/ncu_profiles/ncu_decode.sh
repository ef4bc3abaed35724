#!/usr/bin/env bash
# why matmul trails cuBLAS at some decode shapes. Nsight Compute on one launch of
# tirx_gemm.matmul's pick and of torch.matmul at each shape (same sections for both; ncu's
# default cache flush before the launch; clocks left alone), on the GPU host:
#   BUNDLE=.gpu/s7-bfloat16 OUT=$OUT bash lab/ncu_profiles/ncu_decode.sh
# SHAPES="M N K,M N K,..." picks the shapes; EXTRA_SECS adds sections (e.g. "--section
# ComputeWorkloadAnalysis" for the tensor pipes of the mid-size shapes). The logs land in
# $OUT/ncu_{ours,torch}_MxNxK.log; lab/ncu_profiles/logs/ncu/h200_{decode,mid}_{ours,torch}_MxNxK.txt
# keep them (lab/tools/logs_to_records.py reads both).
set -u
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
BUNDLE=${BUNDLE:?bundle folder}; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$BUNDLE"/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD TIRX_GEMM_KERNEL_TIMEOUT=60 TIRX_GEMM_BUNDLE=$BUNDLE
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -z "$NCU" ] && { echo "ncu_decode: error: no ncu on PATH or under /usr/local/cuda*/bin" >&2; exit 2; }
SECS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats ${EXTRA_SECS:-}"
IFS=, read -ra LIST <<< "${SHAPES:-64 6144 4096,77 7168 2048,128 6144 4096,8 14336 4096,48 14336 4096,128 28672 8192}"
for shape in "${LIST[@]}"; do
  set -- $shape
  tag="$1x$2x$3"
  TAILN=3 stage "ncu_ours_$tag" 90 "$NCU" --clock-control none --kernel-name kernel_kernel \
    --launch-skip 3 --launch-count 1 $SECS python3 lab/ncu_profiles/ncu_decode.py ours $1 $2 $3
  TAILN=3 stage "ncu_torch_$tag" 90 "$NCU" --clock-control none --kernel-name regex:"nvjet|gemm|cutlass|xmma" \
    --launch-skip 3 --launch-count 1 $SECS python3 lab/ncu_profiles/ncu_decode.py torch $1 $2 $3
done
exit 0
