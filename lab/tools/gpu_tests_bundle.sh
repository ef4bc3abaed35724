#!/usr/bin/env bash
# The GPU tests of every op module (test_gpu_op, test_gpu_grouped, test_serving_gpu, test_fp8_gpu,
# test_gpu_autograd with test_layout_step) from ONE bundle, and the device's 64 MiB limit on what
# travels: the checkout is about 42 MiB, so the bundle (357 kernels with the runtime and the
# wheel, about 22 MiB) travels packed (tar.xz, about 5 MiB) and is unpacked there.
#
#   bash lab/tools/gpu_tests_bundle.sh export [B]   # here (TVM): every test's kernels into B
#                                                   # (default .gpu/all), then B.tar.xz
#   bash lab/tools/gpu_tests_bundle.sh run [B]      # GPU host: unpack B.tar.xz if B is absent,
#                                                   # then each test file as a stage
#                                                   # (lab/tools/stage.sh; logs in $OUT/tests.tgz)
#
# Every suite export names --card all: the bundle then holds both cards' picks and records both
# (tirx_gemm.op.cards), so matmul runs the H100's picks on an H100 and the H200's on an H200.
#
# The study runs queued beside the tests add their own kernels to the same bundle before it is
# packed (each study's README names its export command), e.g. lab/bf16_ceiling's suite.
set -uo pipefail
cmd=${1:-}
B=${2:-.gpu/all}
case "$cmd" in
export)
  set -e
  tmp=$(mktemp -d)
  # the block's shapes in both 16-bit dtypes: tests/test_gpu_op.py checks every token count in each
  python scripts/bench_model.py --print-shapes | python -c 'import json, sys; d = json.load(sys.stdin)
d["dtypes"] = ["bfloat16", "float16"]; json.dump(d, sys.stdout)' > "$tmp/llama8b_block.json"
  tirx-gemm export --suite "$tmp/llama8b_block.json" --arch sm_90a --card all --num-sms 132 --ffi-wheel 3.12 \
    --jobs 2 --out "$B"
  python lab/moe_grouped_gemm/export_bundle.py --tests --fp8 --out "$B" --jobs 2
  tirx-gemm export --suite lab/serving_stacks/suites/serving_block.json --arch sm_90a --card all \
    --num-sms 132 --jobs 2 --out "$B"
  tirx-gemm export --suite tirx_gemm/op/suites/fp8-models.json --arch sm_90a --card all --num-sms 132 \
    --jobs 2 --out "$B"
  # every kernel matmul_fp8 can pick (run-time shapes): the fp8 tests' small layers pick splits
  # the fp8 suite's layers never do
  python lab/fp8_on_hopper/fp8_export.py --out "$B" --no-run-shapes --jobs 2
  python lab/training_backward/export.py --out "$B" --what tests,layouts,act_save --jobs 2
  tar -C "$(dirname "$B")" -cJf "$B.tar.xz" "$(basename "$B")"
  ls -l "$B.tar.xz"
  ;;
run)
  [ -d "$B" ] || tar -C "$(dirname "$B")" -xJf "$B.tar.xz" || exit 3
  . "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stage.sh"
  lab_begin tests "$B"
  export TIRX_GEMM_BUNDLE=$PWD/$B
  PT=(python3 -m pytest -m gpu -q -p no:cacheprovider)
  stage t_op 110 "${PT[@]}" tests/test_gpu_op.py; snap
  stage t_grouped 130 "${PT[@]}" tests/test_gpu_grouped.py; snap
  stage t_serving 130 "${PT[@]}" tests/test_serving_gpu.py; snap
  stage t_fp8 70 "${PT[@]}" tests/test_fp8_gpu.py; snap
  stage t_train 110 "${PT[@]}" tests/test_gpu_autograd.py tests/test_layout_step.py
  ;;
*)
  echo "usage: bash lab/tools/gpu_tests_bundle.sh export|run [BUNDLE]" >&2
  exit 2
  ;;
esac
