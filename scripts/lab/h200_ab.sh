#!/usr/bin/env bash
# On the H200: matmul as this checkout chooses it ("new") against an earlier package
# ("old", a copy of its tirx_gemm/, steps/ and scripts/ in .gpu/oldcode), both served from
# one bundle per dtype (scripts/lab/ab_bundle.py --before OLD --out .gpu/ab-DT SUITES),
# as CUDA graphs interleaved with torch (scripts/lab/matmul_graph_times.py), new then old
# for each suite file, PASSES times; then FULL suites timed for the new package alone, and
# eager `tirx-gemm bench` of EAGER suites for EAGER_PKGS (default: both). Suite files: .gpu/SET-DT.json (copies
# with "all_m": false). Outputs: $OUT/ab.tgz (a log and a .jsonl per run).
#   OUT=$OUT SETS="modelschg heldoutchg" XSETS=xnk FULL="models heldout" EAGER=modelschg \
#     bash scripts/lab/h200_ab.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stage.sh"
R=$PWD
lab_begin ab .gpu/ab-bfloat16
graph() {  # graph PKG SET DT TAG
  local dir=$R; [ "$1" = old ] && dir=$R/.gpu/oldcode
  [ -f "$R/.gpu/$2-$3.json" ] || return 0
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir TIRX_GEMM_BUNDLE=$R/.gpu/ab-$3 TAILN=4 \
     stage "$2_$1$4_$3" 150 python3 scripts/lab/matmul_graph_times.py "$R/.gpu/$2-$3.json" \
       --out "$W/$2_$1$4_$3.jsonl" --budget-s 140)
}
for p in $(seq 1 "${PASSES:-2}"); do
  for set in ${SETS:-} ${XSETS:-}; do
    for dt in float16 bfloat16; do graph new "$set" $dt $p; graph old "$set" $dt $p; done
  done
  snap
done
for set in ${FULL:-}; do
  for dt in float16 bfloat16; do graph new "$set" $dt full; done
  snap
done
for set in ${EAGER:-}; do
  for dt in float16 bfloat16; do
    for pkg in ${EAGER_PKGS:-new old}; do
      dir=$R; [ $pkg = old ] && dir=$R/.gpu/oldcode
      (cd "$dir" && PYTHONPATH=/tmp/site:$dir TAILN=4 stage "eager_${set}_${pkg}_$dt" 120 \
         python3 -m tirx_gemm.cli bench --suite "$R/.gpu/$set-$dt.json" --target matmul \
           --arch sm_90a --bundle "$R/.gpu/ab-$dt" --record --results "$W/eager_${set}_${pkg}_$dt")
    done
  done
  snap
done
exit 0
