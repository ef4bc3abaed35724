#!/usr/bin/env bash
# On a Hopper GPU host: prove that a deadlocked kernel ends in an error, not a frozen process.
# The bundle holds sm_90a v7 with its TMA producer starting at the wrong phase (mutant
# producer-phase-0, a certain deadlock), once built normally and once with the watchdog:
#
#   python lab/hang_guard/export_mutant.py producer-phase-0 --mnk 256,512,320 --num-sms 132 --out B
#   python lab/hang_guard/export_mutant.py producer-phase-0 --mnk 256,512,320 --num-sms 132 \
#       --watchdog-ms 1500 --out B
#   lab/hang_guard/gpu_watchdog_demo.sh B
#
# Expected: the watchdog build traps after ~1.5 s naming the barrier, stage, phase and role;
# the normal build is reported by the host's hang guard after TIRX_GEMM_KERNEL_TIMEOUT s.
# Each run is also bounded by `timeout 120`, so this script itself cannot hang.
set -uo pipefail
BUNDLE=${1:-build/bundle-hang}
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
status=0

attempt() {  # label, text the output must contain, extra CLI arguments...
    local label=$1 want=$2 out rc t0 t1
    shift 2
    t0=$(date +%s%N)
    out=$(timeout 120 python3 -m tirx_gemm.cli run v7 --arch sm_90a --bundle "$BUNDLE" \
          --mnk 256,512,320 --no-time "$@" 2>&1)
    rc=$?
    t1=$(date +%s%N)
    echo "$out"
    echo "== $label: exit code $rc after $(( (t1 - t0) / 1000000 )) ms"
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -qF "$want" <<<"$out"; then
        echo "== $label: NOT AS EXPECTED (wanted a non-zero exit before the 120 s limit and '$want')"
        status=1
    else
        echo "== $label: as expected"
    fi
}

echo "== 1. watchdog build (--watchdog-ms 1500): the kernel traps and says where it waited"
attempt "watchdog build" "tirx-gemm watchdog: mma2tma" --watchdog-ms 1500
echo
echo "== 2. normal build, TIRX_GEMM_KERNEL_TIMEOUT=10: the host reports the hang"
TIRX_GEMM_KERNEL_TIMEOUT=10 attempt "normal build" "no completion within 10 s (kernel hang)"
exit $status
