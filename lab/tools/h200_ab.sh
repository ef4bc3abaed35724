#!/usr/bin/env bash
# On the H200: matmul as this checkout chooses it ("new") against other packages (OTHERS,
# default "old": each a copy of its tirx_gemm/, steps/ and scripts/ in .gpu/<name>code, an
# earlier commit or a lab variant), all served from one bundle per dtype
# (lab/tools/ab_bundle.py --before DIR --out .gpu/$BUNDLE-DT SUITES, once per package),
# as CUDA graphs interleaved with torch (lab/tools/matmul_graph_times.py), each package
# in turn for each suite file, PASSES times; then FULL suites timed for the new package
# alone, and eager `tirx-gemm bench` of EAGER suites for EAGER_PKGS (default: new and
# OTHERS). Suite files: .gpu/SET-DT.json (copies with "all_m": false). Outputs:
# $OUT/ab.tgz (a log and a .jsonl per run, named SET_PKG{PASS}_DT).
#   OUT=$OUT SETS="modelschg heldoutchg" XSETS=xnk FULL="models heldout" EAGER=modelschg \
#     bash lab/tools/h200_ab.sh
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stage.sh"
R=$PWD
B=${BUNDLE:-ab}
lab_begin ab ".gpu/$B-bfloat16"
codedir() { if [ "$1" = new ]; then echo "$R"; else echo "$R/.gpu/$1code"; fi; }
graph() {  # graph PKG SET DT TAG
  local dir; dir=$(codedir "$1")
  [ -f "$R/.gpu/$2-$3.json" ] || return 0
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir TIRX_GEMM_BUNDLE=$R/.gpu/$B-$3 TAILN=4 \
     stage "$2_$1$4_$3" 150 python3 lab/tools/matmul_graph_times.py "$R/.gpu/$2-$3.json" \
       --out "$W/$2_$1$4_$3.jsonl" --budget-s 140)
}
for p in $(seq 1 "${PASSES:-2}"); do
  for set in ${SETS:-} ${XSETS:-}; do
    for dt in float16 bfloat16; do
      for pkg in new ${OTHERS:-old}; do graph "$pkg" "$set" $dt $p; done
    done
  done
  snap
done
for set in ${FULL:-}; do
  for dt in float16 bfloat16; do graph new "$set" $dt full; done
  snap
done
for set in ${EAGER:-}; do
  for dt in float16 bfloat16; do
    for pkg in ${EAGER_PKGS:-new ${OTHERS:-old}}; do
      dir=$(codedir $pkg)
      (cd "$dir" && PYTHONPATH=/tmp/site:$dir TAILN=4 stage "eager_${set}_${pkg}_$dt" 120 \
         python3 -m tirx_gemm.cli bench --suite "$R/.gpu/$set-$dt.json" --target matmul \
           --arch sm_90a --bundle "$R/.gpu/$B-$dt" --record --results "$W/eager_${set}_${pkg}_$dt")
    done
  done
  snap
done
exit 0
