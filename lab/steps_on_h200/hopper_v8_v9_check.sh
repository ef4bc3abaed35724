#!/usr/bin/env bash
# On an H100/H200 host (torch + the GPU; no TVM compiler needed): check sm_90a v8 and v9 at
# every registry shape (canonical, the non-square test shapes, the bench shapes), then time
# v7, v8, v9 and torch.matmul at 4096^3 and 8192^3 in ONE process and print one table.
# Nothing waits forever: every command runs under `timeout`, and the runner's own kernel
# deadline (TIRX_GEMM_KERNEL_TIMEOUT) turns a hung kernel into a one-line error.
#
# Bundle (made on the build machine): every sm_90a step at every registry shape (v7's bench
# shapes, v8/v9's canonical, test and bench shapes among them), plus, optionally, watchdog
# builds of v8/v9 that name the stalled barrier if a check hangs:
#   tirx-gemm export --all --arch sm_90a --shapes all --num-sms 132 --ffi-wheel 3.12 --out build/bundle-v89
#   for s in v8 v9; do tirx-gemm export $s --arch sm_90a --shapes test --num-sms 132 --watchdog-ms 2000 --out build/bundle-v89; done
#
#   lab/steps_on_h200/hopper_v8_v9_check.sh [BUNDLE_DIR=build/bundle-v89] [LOG_DIR=lab/steps_on_h200/logs]
# Exit status: 0 all checks passed, 1 a check failed or hung, 2 no usable GPU / bundle.
set -uo pipefail
BUNDLE=${1:-build/bundle-v89}
LOGS=${2:-lab/steps_on_h200/logs}
cd "$(dirname "$0")/../.."
[ -f "$BUNDLE/manifest.json" ] || { echo "no bundle at $BUNDLE (see the export commands at the top)"; exit 2; }
if ! python3 -c "import tvm_ffi" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/tirx-gemm-site "$BUNDLE"/wheels/*.whl || exit 2
    export PYTHONPATH=/tmp/tirx-gemm-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=${TIRX_GEMM_KERNEL_TIMEOUT:-20}
mkdir -p "$LOGS"
STAMP=$(date +%Y%m%d-%H%M%S)
LOG=$LOGS/hopper_v8_v9_$STAMP.log
exec > >(tee "$LOG") 2>&1
echo "log: $LOG   bundle: $BUNDLE   git: $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null
timeout 60 python3 -c "import torch; c=torch.cuda.get_device_capability(); assert c==(9,0), c" \
    || { echo "no sm_90 GPU (H100/H200) here"; exit 2; }

CLI="python3 -m tirx_gemm.cli"
status=0
declare -A RESULT

# shapes of a step in the bundle (normal builds), one "M,N,K" per line
bundle_shapes() {
    python3 - "$BUNDLE" "$1" "${2:-}" <<'EOF'
import json, sys
bundle, step, wd = sys.argv[1], sys.argv[2], (int(sys.argv[3]) if sys.argv[3] else None)
for e in json.load(open(f"{bundle}/manifest.json"))["kernels"]:
    if e["step"] == step and e["arch"] == "sm_90a" and e.get("watchdog_ms") == wd:
        print(f"{e['M']},{e['N']},{e['K']}")
EOF
}

for step in v8 v9; do
    echo
    echo "== correctness: $step at every registry shape (one process, 600 s)"
    timeout -k 10 600 $CLI bench $step --arch sm_90a --shapes all --no-time --bundle "$BUNDLE" -q
    rc=$?
    if [ $rc -eq 0 ]; then RESULT[$step]="all shapes ok"; continue; fi
    status=1
    echo "-- $step: rc=$rc (124 = timeout, 3 = kernel hang); isolating shape by shape"
    bad=""
    for mnk in $(bundle_shapes $step); do
        timeout -k 10 120 $CLI bench $step --arch sm_90a --mnk "$mnk" --no-time --bundle "$BUNDLE" -q \
            > /tmp/hv89_one.log 2>&1
        r=$?
        if [ $r -eq 0 ]; then echo "   $step $mnk ok"; continue; fi
        bad="$bad $mnk(rc=$r)"
        echo "   $step $mnk FAILED rc=$r:"; tail -n 8 /tmp/hv89_one.log | sed 's/^/      /'
        if [ $r -eq 124 ] || [ $r -eq 3 ] || [ $r -eq 137 ]; then
            if bundle_shapes $step 2000 | grep -qx "$mnk"; then
                echo "   re-run with the 2000 ms watchdog build (names the stalled barrier):"
                timeout -k 10 120 $CLI bench $step --arch sm_90a --mnk "$mnk" --no-time \
                    --bundle "$BUNDLE" --watchdog-ms 2000 -q 2>&1 | tail -n 12 | sed 's/^/      /'
            fi
        fi
    done
    RESULT[$step]="FAILED at:$bad"
done

echo
echo "== timing: v7, v8, v9 and torch.matmul at 4096^3 and 8192^3, one process (900 s)"
timeout -k 10 900 python3 - "$BUNDLE" <<'EOF'
import sys
from tirx_gemm import cli, registry
from tirx_gemm.run import device
bundle = sys.argv[1]
plan = []
for mnk in ((4096, 4096, 4096), (8192, 8192, 8192)):
    for sid in ("v7", "v8", "v9"):
        plan.append((registry.get(sid, "sm_90a"), mnk))
dev = device.check_device("sm_90a")
recs = cli.measure_plan(plan, bundle=bundle, log=lambda m: None if m.startswith("    ") else print(m, flush=True))
print("\n" + cli.BENCH_HEAD)
for r in recs:
    print(cli._bench_row(r))
print(f"device: {dev['name']} (cc {dev['capability']}, {dev['sm_count']} SMs)")
by = {(r["step"], r["M"]): r for r in recs}
for M in (4096, 8192):
    t = [by.get((s, M), {}).get("tflops") for s in ("v7", "v8", "v9")]
    if all(isinstance(x, (int, float)) for x in t):
        print(f"{M}^3: v8/v7 {t[1] / t[0]:.3f}  v9/v8 {t[2] / t[1]:.3f}  v9/v7 {t[2] / t[0]:.3f}")
sys.exit(0 if all(r["verified"] for r in recs) else 1)
EOF
rc=$?
[ $rc -eq 0 ] || { status=1; echo "-- timing run: rc=$rc (124 = timeout, 3 = kernel hang)"; }

echo
echo "== summary"
for step in v8 v9; do echo "$step correctness: ${RESULT[$step]}"; done
echo "timing run: rc=$rc"
echo "log: $LOG"
exit $status
