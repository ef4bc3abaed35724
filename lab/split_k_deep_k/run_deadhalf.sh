#!/usr/bin/env bash
# On the H200: v11 (sm_90a) with a half wholly past M skipping its slab, count and
# store. Lab variants (lab/split_k_deep_k/suites/deadhalf.json: checks at M around the half
# boundary, both reductions; timings against torch) and matmul at the suite's two split
# decode shapes, eager and as CUDA graphs.
#   python lab/tools/h200_variants.py export lab/split_k_deep_k/suites/deadhalf.json --out .gpu/dh
#   (.gpu/models-decode.json: the models suite's 32x4096x14336 and 48x4096x14336, both dtypes)
#   tirx-gemm export --suite .gpu/models-decode.json --arch sm_90a --out .gpu/dec --ffi-wheel 3.12
# carry .gpu/dh .gpu/dec .gpu/models-decode.json; on the GPU host:
#   OUT=$OUT bash lab/split_k_deep_k/run_deadhalf.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/dec/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TAILN=40 stage lab 200 python3 lab/tools/h200_variants.py run --bundle .gpu/dh --records "$OUT/deadhalf_h200.jsonl" --passes 3
TAILN=14 stage suite_decode 100 python3 -m tirx_gemm.cli bench --suite .gpu/models-decode.json --target matmul --arch sm_90a --bundle .gpu/dec --record --results "$OUT/results"
TIRX_GEMM_BUNDLE=.gpu/dec TAILN=8 stage graph_decode 60 python3 lab/tools/matmul_graph_times.py .gpu/models-decode.json --out "$OUT/graph_decode.jsonl" --budget-s 50
exit 0
