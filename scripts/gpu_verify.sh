#!/usr/bin/env bash
# On a GPU host (torch + the GPU; no TVM compiler needed): check every step of the GPU's arch
# at every registry shape, time the benchmark shapes against torch.matmul, and run the
# per-step regression against the device baseline. Kernels come from a bundle made on a
# build machine in two exports into one folder (the second adds the bfloat16 kernels that
# tests/test_gpu.py checks at the canonical and off-grid shapes):
#   tirx-gemm export --all --arch <arch> --shapes all --ffi-wheel 3.12 --out B
#   tirx-gemm export --all --arch <arch> --shapes all --dtype bfloat16 --out B
#
#   scripts/gpu_verify.sh [BUNDLE_DIR=build/bundle] [RESULTS_DIR=results]
set -uo pipefail
BUNDLE=${1:-build/bundle}
RESULTS=${2:-results}
cd "$(dirname "$0")/.."
if ! python3 -c "import tvm_ffi" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/tirx-gemm-site "$BUNDLE"/wheels/*.whl || exit 3
    export PYTHONPATH=/tmp/tirx-gemm-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PYTHONPATH TIRX_GEMM_BUNDLE=$BUNDLE PYTHONUNBUFFERED=1
ARCH=$(python3 -m tirx_gemm.run.device) || exit 2  # the one device probe (prints why if none)
if ! grep -q '"bfloat16"' "$BUNDLE/manifest.json"; then
    echo "gpu_verify: $BUNDLE has no bfloat16 kernels; export them too (see the top of $0)" >&2
    exit 2
fi
status=0
echo "== GPU tests ($ARCH)"
python3 -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider || status=1
echo "== correctness at every registry shape (records)"
python3 -m tirx_gemm.cli bench --all --arch "$ARCH" --shapes all --no-time --bundle "$BUNDLE" \
    --record --results "$RESULTS" -q || status=1
echo "== timing at the benchmark shapes (records)"
python3 -m tirx_gemm.cli bench --all --arch "$ARCH" --shapes bench --bundle "$BUNDLE" \
    --record --results "$RESULTS" -q || status=1
echo "== per-step regression"
python3 -m tirx_gemm.cli regress --bundle "$BUNDLE" --results "$RESULTS" -q || status=1
exit $status
