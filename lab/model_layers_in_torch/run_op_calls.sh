#!/usr/bin/env bash
# One H200 run, from the checkout with bundles made
# here (CPU, TVM) and carried in .gpu/:
#   tirx-gemm export --suite tirx_gemm/op/suites/llama3-8b.json --arch sm_90a --out .gpu/llama --ffi-wheel 3.12
#   python scripts/bench_overhead.py --print-suite > /tmp/overhead.json
#   tirx-gemm export --suite /tmp/overhead.json --arch sm_90a --out .gpu/overhead
# carry: .gpu/llama .gpu/overhead. On the GPU host, from the repository root:
#   OUT=$OUT bash lab/model_layers_in_torch/run_op_calls.sh
# Stages, each under its own time limit (a hung one cannot take the others with it):
#   runtime_m  one bundle, every token count: matmul at ~40 M per layer, checked
#   gpu_op     tests/test_gpu_op.py (torch op, CUDA graphs, torch.compile, nn.Linear, patch)
#   overhead   back-to-back wall time per call against F.linear, eager and CUDA-graphed
#   model      a Llama-3-8B decoder block, prefill and decode, eager and CUDA-graphed
#   suite      the block's GEMMs as a suite against torch.matmul (records)
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/llama/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
TIRX_GEMM_BUNDLE=.gpu/llama TAILN=6 stage runtime_m 90 python3 lab/one_kernel_every_token_count/runtime_m_check.py --out "$OUT/runtime_m.jsonl"
TIRX_GEMM_BUNDLE=.gpu/llama TAILN=20 stage gpu_op 80 python3 -m pytest -m gpu tests/test_gpu_op.py -q -p no:cacheprovider
TIRX_GEMM_BUNDLE=.gpu/overhead TAILN=30 stage overhead 90 python3 scripts/bench_overhead.py --out "$OUT/overhead.jsonl"
TIRX_GEMM_BUNDLE=.gpu/llama TAILN=40 stage model 190 python3 scripts/bench_model.py --budget-s 150 --out "$OUT/model.jsonl"
TAILN=30 stage suite 100 python3 -m tirx_gemm.cli bench --suite tirx_gemm/op/suites/llama3-8b.json --target matmul --arch sm_90a --bundle .gpu/llama --record --results "$OUT/results" -q
exit 0
