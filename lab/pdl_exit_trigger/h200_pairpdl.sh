#!/usr/bin/env bash
# On the H200: CTA pairs launched with PDL (v12 CLUSTER=2 PDL=True) against today's
# pairs and one-CTA PDL kernels, checked and timed against torch.mm in the same run.
#   python lab/tools/v12_sweep.py export --out .gpu/pairpdl --dtypes bfloat16,float16 --pairpdl
# carry .gpu/pairpdl; on the GPU host: OUT=$OUT bash lab/pdl_exit_trigger/h200_pairpdl.sh
# First a smoke launch of one PDL pair in a process of its own (a launch the driver refuses,
# or a hang, stops there), then two passes over lab/pdl_exit_trigger/suites/pairpdl.json.
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)/stage.sh"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/pairpdl/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
stage smoke 60 python3 - <<'PY' || exit 4
import json, torch
from pathlib import Path
from tirx_gemm.compile.bundle import load_manifest
from tirx_gemm.run.loader import load_kernel
b = Path(".gpu/pairpdl")
for e in load_manifest(b):
    kw = e["kwargs"]
    if kw.get("CLUSTER") == 2 and kw.get("PDL") and kw["BLK_N"] == 128 and kw.get("dtype") == "bfloat16":
        k = load_kernel(str(b / e["lib"]))
        for M, N, K in ((1000, 1000, 1000), (2304, 2304, 2304), (77, 4096, 520)):
            a = torch.randn(M, K, device="cuda").bfloat16(); w = torch.randn(N, K, device="cuda").bfloat16()
            d = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                k(a, w, d)
            torch.cuda.synchronize()
            ref = torch.nn.functional.linear(a.float(), w.float())
            err = ((d.float() - ref).norm() / ref.norm()).item()
            print(M, N, K, kw, "rel_err", err); assert err < 1e-2, err
        break
PY
for pass in 1 2; do
  TAILN=24 stage pass$pass 250 python3 lab/tools/v12_sweep.py run --bundle .gpu/pairpdl \
    --suite lab/pdl_exit_trigger/suites/pairpdl.json --dtypes bfloat16,float16 \
    --out "$OUT/pairpdl_pass$pass.jsonl" --budget-s 230
done
exit 0
