# Sourced by the H200 session scripts: `stage NAME SECONDS CMD...` runs CMD under a time
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
