#!/usr/bin/env bash
# One H200 run: in-kernel timelines of sm_90a v4..v10 at 4096^3 (~3 min).
# Each step's instrumented build (TIMELINE=True: the verbs record globaltimer events into an
# extra operand after D) is checked against the fp32 reference, launched once more to record
# the timeline, and timed against the same step's plain build (alternating launches, CUDA
# events, inputs rotated past L2): the cost figure. Per step, `trace` writes
# <step>_sm_90a_4096x4096x4096.json (Chrome trace of CTAs 0-3 around CTA 0's first tile
# boundary, < 1 MB: ui.perfetto.dev opens it), .png (its Gantt chart) and .txt (the whole
# run summarised, with the instrumented/plain times). They are meant for results/timelines/.
#
# Here (CPU), from the repository root, once the timeline work is committed:
#   rm -rf .gpu/tl/src && mkdir -p .gpu/tl/src && git archive HEAD | tar -x -C .gpu/tl/src
#   for v in v4 v5 v6 v7 v8 v9 v10; do for tl in --timeline ""; do
#     tirx-gemm export $v --arch sm_90a --mnk 4096,4096,4096 --num-sms 132 $tl \
#         --ffi-wheel 3.12 --out .gpu/tl/bundle; done; done
# (14 kernels: each step instrumented and plain; ~4 min on 2 cores, bundle ~10 MiB with
# TVM's runtime and the apache-tvm-ffi wheel.)
# Carry .gpu/tl (src + bundle). Then on the GPU host, from the repository root:
#   bash lab/steps_on_h200/h200_timelines.sh            (OUT=$OUT)
# Comes back flat in $OUT (at most 8 files): gpu.txt, timelines.log (every step's output),
# costs.txt (one line per step: plain vs instrumented), timelines.tar.gz (the .json, .png
# and .txt of every step: `tar -xzf timelines.tar.gz -C results/timelines`).
# Every step runs under its own time limit, so one hung kernel cannot take the others with
# it (TIRX_GEMM_KERNEL_TIMEOUT also bounds each launch inside).
set -uo pipefail
G=$PWD/.gpu/tl
OUT=${OUT:-/tmp/out}
WORK=${WORK:-/tmp/tl_work}
STEPS=${STEPS:-"v4 v5 v6 v7 v8 v9 v10"}
MNK=${MNK:-4096,4096,4096}
mkdir -p "$OUT" "$WORK/timelines"
if ls "$G"/bundle/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site \
    "$G"/bundle/wheels/*.whl || exit 3
fi
cd "$G/src" || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
  --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
LOG=$OUT/timelines.log
: > "$LOG"
status=0
for v in $STEPS; do
  echo "== $v (limit 150 s)" | tee -a "$LOG"
  t0=$SECONDS
  timeout 150 python3 -m tirx_gemm.cli trace "$v" --arch sm_90a --mnk "$MNK" \
    --bundle "$G/bundle" --out "$WORK/timelines" >> "$LOG" 2>&1
  rc=$?
  echo "== $v rc=$rc in $((SECONDS - t0))s" | tee -a "$LOG"
  [ "$rc" -eq 0 ] || status=1
done
# the cost figure: one line per step from the summaries
grep -H "^cost:" "$WORK"/timelines/*.txt | sed "s#^$WORK/timelines/##" > "$OUT/costs.txt"
cat "$OUT/costs.txt"
tar -C "$WORK/timelines" -czf "$OUT/timelines.tar.gz" .
ls -la "$WORK/timelines" | tee -a "$LOG"
echo "done in ${SECONDS}s, status $status" | tee -a "$LOG"
exit $status
