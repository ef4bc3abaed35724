# Sourced by the H200 run scripts: `stage NAME SECONDS CMD...` runs CMD under a time
# limit with its output in $OUT/NAME.log, prints the log's last ${TAILN:-25} lines and the
# exit status, and returns it; one slow or hung stage cannot take the others with it.
stage() {
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n "${TAILN:-25}" "$OUT/$name.log"
  echo "== $name rc=$rc in $((SECONDS - t0))s"
  return $rc
}

# `lab_begin NAME BUNDLE`: the opening every H200 lab call shares. Installs BUNDLE's wheels
# (TVM's FFI and runtime) into /tmp/site and puts it and the checkout on PYTHONPATH, makes
# the work folder W=/tmp/NAME and points OUT at it (each stage's log lands there), logs the
# GPU's clocks to gpu.txt, and packs W into NAME.tgz under the caller's OUT at every `snap`
# and at exit, so a call cut off by its time limit still brings back what it finished.
lab_begin() {
  local name=$1 bundle=$2
  LAB_OUT=${OUT:-/tmp/out}
  W=/tmp/$name
  LAB_TGZ=$LAB_OUT/$name.tgz
  mkdir -p "$LAB_OUT" "$W"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$bundle"/wheels/*.whl \
    || { echo "lab_begin: error: no wheels installed from $bundle/wheels" >&2; exit 3; }
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TIRX_GEMM_KERNEL_TIMEOUT=20
  OUT=$W
  trap snap EXIT
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv \
    | tee "$W/gpu.txt"
}
snap() { tar -czf "$LAB_TGZ" -C "$W" .; }
