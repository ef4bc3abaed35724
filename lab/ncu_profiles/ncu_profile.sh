#!/usr/bin/env bash
# Profile one launch of sm_90a v7, v8, v9 (or the steps in $STEPS) and of torch.matmul at 4096^3 with Nsight Compute
# (speed of light, warp state, compute and memory workload, occupancy), on a GPU host, from a
# bundle made here:
#   for v in ${STEPS:-v7 v8 v9}; do tirx-gemm export $v --arch sm_90a --mnk 4096,4096,4096 \
#       --num-sms 132 --ffi-wheel 3.12 --out build/bundle-ncu; done
#   bash lab/ncu_profiles/ncu_profile.sh build/bundle-ncu OUTDIR          # on the GPU host
# --clock-control none: ncu's default locks the GPU's clocks at base while it profiles; this
# script leaves the clocks alone (the logs in lab/ncu_profiles/logs/ncu/ were made before this flag
# was added, with ncu's default, so their SM clock reads 1.25 GHz).
set -u
BUNDLE=${1:?bundle folder}; OUT=${2:?output folder}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$BUNDLE"/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD TIRX_GEMM_KERNEL_TIMEOUT=60
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -z "$NCU" ] && { echo "ncu_profile: error: no ncu on PATH or under /usr/local/cuda*/bin" >&2; exit 2; }
SECS="--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy"
for v in ${STEPS:-v7 v8 v9}; do
  timeout 120 "$NCU" --clock-control none --kernel-name kernel_kernel --launch-skip 0 \
    --launch-count 1 $SECS python3 -m tirx_gemm.cli run $v --arch sm_90a \
    --mnk 4096,4096,4096 --bundle "$BUNDLE" --no-time > "$OUT/h200_4096_$v.txt" 2>&1
  echo "$v: exit $?"
done
cat > /tmp/ncu_torch.py <<'P'
import torch
A, B = (torch.randn(4096, 4096, device="cuda", dtype=torch.float16) for _ in range(2))
D = torch.empty(4096, 4096, device="cuda", dtype=torch.float16)
for _ in range(5):
    torch.matmul(A, B.T, out=D)
torch.cuda.synchronize()
P
timeout 120 "$NCU" --clock-control none --kernel-name regex:"gemm|xmma|cutlass|nvjet" \
  --launch-skip 2 --launch-count 1 $SECS python3 /tmp/ncu_torch.py > "$OUT/h200_4096_torch.txt" 2>&1
echo "torch: exit $?"
