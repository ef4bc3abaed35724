#!/usr/bin/env bash
# matmul with and without the data-parallel swap-AB rule (chooser.dp_swap_tile, SWAP_TMA) on
# the H200, in matmul's own protocol (lab/tools/matmul_graph_times.py: CUDA graphs
# alternated with torch.mm), at the shapes where the rule changes the pick
# (lab/swap_ab_tma_store/suites/dpswap.json; .gpu/dpswap-DT.json: a copy with "dtypes": [DT]), both
# dtypes, two passes. The "old" runs use the
# package as it was before the rule (its own chooser and bundle), the "new" runs this one:
#   tirx-gemm export --suite .gpu/dpswap-DT.json --arch sm_90a --out .gpu/dpn-DT --ffi-wheel 3.12
#   (and from a checkout before the rule, into .gpu/dpo-DT; copy its tirx_gemm, steps and
#   scripts into .gpu/oldcode)
# carry .gpu/call holding dpn-*, dpo-*, dpswap-*.json and oldcode; on the GPU host:
#   OUT=$OUT bash lab/swap_ab_tma_store/h200_dpswap.sh
# Other shape sets: NAME=dpswap16 NEW=dp16n OLD=dp16o (lab/swap_ab_tma_store/suites/dpswap16.json: where
# counting M in 16-row blocks changes the rule's pick); NAME=dpswapw NEW=dpwn OLD=dpwo
# (lab/swap_ab_tma_store/suites/dpswapw.json: wide weights past 512 tokens). MODE=eager NAME=dpswape NEW=dpen OLD=dpeo:
# the rule's shapes under 20 us (lab/swap_ab_tma_store/suites/dpswape.json) timed eagerly by `tirx-gemm bench`.
# NAME=tailtma NEW=ttn OLD=tto STAGE_S=70 (lab/tail_tma_store/suites/tailtma.json: where matmul's pick stores its
# tail by TMA, chooser.tail_tma). DTYPES (commas or spaces) picks the dtypes. Everything comes back as
# $OUT/$NAME.tgz.
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
NAME=${NAME:-dpswap}
STAGE_S=${STAGE_S:-120}  # seconds per (pass, dtype, package) in graphs mode
NEW=${NEW:-dpn}
OLD=${OLD:-dpo}
lab_begin $NAME .gpu/$NEW-bfloat16  # each stage sets PYTHONPATH: the old package's runs from .gpu/oldcode
if [ "${MODE:-graphs}" = eager ]; then  # tirx-gemm bench: CUDA events around alternating launches
  for pass in 1 2; do
    for dt in $(echo ${DTYPES:-bfloat16 float16} | tr , " "); do
      PYTHONPATH=/tmp/site:$PWD TAILN=14 stage enew${pass}_$dt 150 python3 -m tirx_gemm.cli bench --suite .gpu/$NAME-$dt.json --target matmul --arch sm_90a --bundle .gpu/$NEW-$dt --record --results "$W/results_new"; snap
      (cd .gpu/oldcode && PYTHONPATH=/tmp/site:$PWD TAILN=14 stage eold${pass}_$dt 150 python3 -m tirx_gemm.cli bench --suite ../$NAME-$dt.json --target matmul --arch sm_90a --bundle ../$OLD-$dt --record --results "$W/results_old"); snap
    done
  done
  exit 0
fi
for pass in 1 2; do
  for dt in $(echo ${DTYPES:-bfloat16 float16} | tr , " "); do
    PYTHONPATH=/tmp/site:$PWD TIRX_GEMM_BUNDLE=.gpu/$NEW-$dt TAILN=14 stage new${pass}_$dt $STAGE_S python3 lab/tools/matmul_graph_times.py .gpu/$NAME-$dt.json --out "$W/new_$dt.jsonl" --budget-s $((STAGE_S - 10)); snap
    (cd .gpu/oldcode && PYTHONPATH=/tmp/site:$PWD TIRX_GEMM_BUNDLE=../$OLD-$dt TAILN=14 stage old${pass}_$dt $STAGE_S python3 lab/tools/matmul_graph_times.py ../$NAME-$dt.json --out "$W/old_$dt.jsonl" --budget-s $((STAGE_S - 10))); snap
  done
done
exit 0
