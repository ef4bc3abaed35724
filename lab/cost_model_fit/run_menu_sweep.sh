#!/usr/bin/env bash
# On the H200: a v12 sweep (lab/tools/v12_sweep.py), every entry at every shape
# of tirx_gemm/op/suites/models.json (bf16), checked and timed against torch.mm in the same run.
#   cluster: v12 with CLUSTER=2 (a CTA pair along M sharing B by multicast) beside the
#            one-CTA menu:  python lab/tools/v12_sweep.py export --out .gpu/v12c --cluster
#   widths:  the widths between the menu's (BLK_N 80..240, WIDTHS_MENU):
#                           python lab/tools/v12_sweep.py export --out .gpu/v12w --widths
#   streamk: STREAM_K=True against STREAM_K=False and torch (checked, bitwise repeat, timed):
#                           python lab/tools/v12_sweep.py export --out .gpu/v12sk --streamk
#   pdl:     PDL_MENU with and without PDL=True (graph and eager back-to-back times):
#                           python lab/tools/v12_sweep.py export --out .gpu/v12p --pdl
# carry .gpu/v12c, .gpu/v12w, .gpu/v12sk or .gpu/v12p; on the GPU host: OUT=$OUT bash lab/cost_model_fit/run_menu_sweep.sh KIND
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
case "${1:-}" in
  cluster) BUNDLE=.gpu/v12c ;;
  widths) BUNDLE=.gpu/v12w ;;
  streamk) BUNDLE=.gpu/v12sk ;;
  pdl) BUNDLE=.gpu/v12p ;;
  *) echo "usage: run_menu_sweep.sh cluster|widths|streamk|pdl"; exit 2 ;;
esac
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site $BUNDLE/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if [ "$1" = streamk ]; then
  TAILN=60 stage streamk "${SWEEP_LIMIT:-520}" python3 lab/tools/v12_sweep.py streamk \
    --bundle $BUNDLE --out "$OUT/v12_streamk_h200.jsonl" --dtypes bfloat16 \
    --budget-s "${SWEEP_BUDGET:-480}"
  exit 0
fi
TAILN=60 stage sweep "${SWEEP_LIMIT:-520}" python3 lab/tools/v12_sweep.py run --bundle $BUNDLE \
  --out "$OUT/v12_${1}_sweep_h200.jsonl" --dtypes bfloat16 --budget-s "${SWEEP_BUDGET:-480}"
exit 0
