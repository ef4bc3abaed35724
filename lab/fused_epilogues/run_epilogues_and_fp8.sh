#!/usr/bin/env bash
# One H200 run and 29 (fp8), from the checkout with bundles
# made here (CPU, TVM) and carried in .gpu/:
#   tirx-gemm export --suite tirx_gemm/op/suites/epilogue-h200.json --arch sm_90a --out .gpu/epilogue --ffi-wheel 3.12
#   python lab/fp8_on_hopper/fp8_export.py --out .gpu/fp8 --ffi-wheel 3.12
# carry: .gpu/epilogue .gpu/fp8. On the GPU host, from the repository root:
#   OUT=$OUT bash lab/fused_epilogues/run_epilogues_and_fp8.sh
# Stages, each under its own time limit (stage.sh):
#   epilogue  every epilogue checked at registry and edge shapes (fp16, bf16), then fused vs
#             plain v12, vs torch's unfused sequence and vs torch.compile (same run)
#   fp8       v13 checked in each scale mode at edges and the suite shapes, then timed
#             against torch._scaled_mm (per-tensor, rowwise) and bf16 torch.matmul
#   fp8run    the runner's record of v13 at 4096^3 (`tirx-gemm run`)
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/epilogue/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TAILN=40 stage epilogue 300 python3 lab/fused_epilogues/epilogue_h200.py --bundle .gpu/epilogue --out "$OUT/epilogue.jsonl"
TAILN=40 stage fp8 230 python3 lab/fp8_on_hopper/fp8_h200.py --bundle .gpu/fp8 --out "$OUT/fp8_h200.jsonl"
TAILN=15 stage fp8run 50 python3 -m tirx_gemm.cli run v13 --arch sm_90a --mnk 4096,4096,4096 --bundle .gpu/fp8
exit 0
