#!/usr/bin/env bash
# Proof that a machine with Python and a C/C++ compiler needs nothing else.
#
#  1. a fresh venv gets the README install (`pip install -e .`): no torch, no system CUDA;
#  2. in a mount namespace (unshare) where every /usr/local/cuda* folder is an empty mount,
#     with PATH holding only the venv, /usr/bin and /bin, and CUDA_HOME/CUDA_PATH unset:
#     `tirx-gemm doctor` names the toolchain, every step of both arches builds
#     (`tirx-gemm build --all`), `tirx-gemm regress --cpu` compares every build with
#     goldens/expectations/build.json, and `tirx-gemm export` bundles the canonical kernels;
#  3. where this machine has a system nvcc (outside the namespace): the same builds with
#     TIRX_GEMM_SYSTEM_CUDA=1, and the generated CUDA and the SASS of every build compared
#     byte for byte with the wheel toolchain's.
#
# Usage: scripts/check_wheel_toolchain.sh [WORK_DIR]   (default: a new /tmp folder)
#   PYTHON=python3.12 picks the interpreter; NO_UNSHARE=1 skips the namespace (then step 2
#   only hides CUDA from PATH and the environment, and says so).
# Every command runs under `timeout`; exit status 0 only if every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-$(mktemp -d /tmp/tirx-gemm-wheel-toolchain.XXXXXX)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
PY=${PYTHON:-python3}
VENV=$WORK/venv
start=$(date +%s)
stamp() { echo "[check $(( $(date +%s) - start ))s] $*"; }
fail() { echo "check_wheel_toolchain: FAIL: $*" >&2; exit 1; }

# --- 1. fresh venv, README install, no torch ---------------------------------------------
rm -rf "$VENV"
timeout 120 "$PY" -m venv "$VENV"
timeout 300 "$VENV/bin/python" -m pip install -q --upgrade pip
t0=$(date +%s)
timeout 900 "$VENV/bin/python" -m pip install -q -e "$ROOT"
stamp "pip install -e . took $(( $(date +%s) - t0 ))s ($("$VENV/bin/python" --version))"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  fail "torch is installed in the fresh venv: the main install must not need it"
fi
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "torch: not installed (as intended)"
echo "nvidia-* wheels on disk: $(du -sh "$SITE/nvidia" | cut -f1) ($SITE/nvidia)"
echo "whole venv on disk:      $(du -sh "$VENV" | cut -f1)"

# --- 2. build everything where no system CUDA is visible ----------------------------------
cat > "$WORK/inner.sh" <<'INNER'
set -euo pipefail
cd "$ROOT"
hidden=()
if [ "${HIDE:-1}" = 1 ]; then
  mkdir -p "$WORK/empty"
  for d in /usr/local/cuda* /opt/cuda*; do
    if [ -d "$d" ] && [ ! -L "$d" ]; then mount --bind "$WORK/empty" "$d"; hidden+=("$d"); fi
  done
fi
echo "hidden by empty mounts: ${hidden[*]:-(none)}"
echo "PATH=$PATH"
echo "CUDA_HOME=${CUDA_HOME-<unset>} CUDA_PATH=${CUDA_PATH-<unset>}"
if command -v nvcc; then echo "a system nvcc is visible on PATH" >&2; exit 1; fi
echo "nvcc on PATH: none"
for d in /usr/local/cuda* /opt/cuda*; do
  if [ -e "$d/bin/nvcc" ]; then echo "$d/bin/nvcc is still visible" >&2; exit 1; fi
done
echo "/usr/local/cuda*/bin/nvcc: none visible"
timeout 120 tirx-gemm doctor | tee "$WORK/doctor.txt"
grep -q "^nvcc: *$SITE/nvidia/" "$WORK/doctor.txt" || { echo "doctor names another nvcc" >&2; exit 1; }
grep -q "^ptxas: *$SITE/nvidia/" "$WORK/doctor.txt" || { echo "doctor names another ptxas" >&2; exit 1; }
for arch in sm_100a sm_90a; do
  timeout 1200 tirx-gemm build --all --arch "$arch" -q
done
timeout 1200 tirx-gemm regress --cpu -q
timeout 600 tirx-gemm export --all --arch sm_90a --out "$WORK/bundle" -q
timeout 600 tirx-gemm export --all --arch sm_100a --out "$WORK/bundle" -q
echo "bundle: $(ls "$WORK/bundle"/*.so | wc -l) kernels in $WORK/bundle"
echo "nvcc recorded in the builds: $(cat "$TIRX_GEMM_CACHE"/builds/*/meta.json | grep -h '"nvcc_version"' | sort -u | tr -s ' ')"
INNER

WHEEL_CACHE=$WORK/cache-wheels
rm -rf "$WHEEL_CACHE"
run_env=(env -i HOME="$HOME" LANG=C.UTF-8 PATH="$VENV/bin:/usr/bin:/bin" ROOT="$ROOT"
         WORK="$WORK" SITE="$SITE" TIRX_GEMM_CACHE="$WHEEL_CACHE")
if [ "${NO_UNSHARE:-0}" != 1 ] && unshare -rm true 2>/dev/null; then
  stamp "namespace: unshare -rm, /usr/local/cuda* hidden"
  unshare -rm "${run_env[@]}" HIDE=1 bash "$WORK/inner.sh" || fail "the hidden-CUDA build"
else
  stamp "namespace: not available (or NO_UNSHARE=1): CUDA hidden from PATH and env only"
  "${run_env[@]}" HIDE=0 bash "$WORK/inner.sh" || fail "the build without CUDA on PATH"
fi
stamp "hidden-CUDA build, regress --cpu and export passed"

# --- 3. byte-for-byte against a system CUDA, where there is one ---------------------------
if SYS_NVCC=$(command -v nvcc) || SYS_NVCC=$(ls /usr/local/cuda/bin/nvcc 2>/dev/null); then
  SYS_CACHE=$WORK/cache-system
  rm -rf "$SYS_CACHE"
  sys_path=$PATH
  command -v nvcc >/dev/null || sys_path=$(dirname "$SYS_NVCC"):$PATH
  env PATH="$VENV/bin:$sys_path" TIRX_GEMM_SYSTEM_CUDA=1 TIRX_GEMM_CACHE="$SYS_CACHE" \
    timeout 120 tirx-gemm doctor | sed -n '1,3p'
  env PATH="$VENV/bin:$sys_path" TIRX_GEMM_SYSTEM_CUDA=1 TIRX_GEMM_CACHE="$SYS_CACHE" \
    timeout 1200 tirx-gemm regress --cpu -q
  same=0; differ=0
  for entry in "$WHEEL_CACHE"/builds/*/; do
    key=$(basename "$entry")
    [ -d "$SYS_CACHE/builds/$key" ] || continue
    for f in kernel.cu kernel.sass; do
      if cmp -s "$entry/$f" "$SYS_CACHE/builds/$key/$f"; then same=$((same + 1))
      else differ=$((differ + 1)); echo "differs: $key/$f"; fi
    done
  done
  echo "system CUDA vs wheels: $same files identical, $differ differ (kernel.cu + kernel.sass of each build both caches hold)"
  [ "$same" -gt 0 ] && [ "$differ" = 0 ] || fail "system and wheel toolchains disagree"
else
  stamp "no system nvcc here: byte comparison skipped"
fi
stamp "all checks passed (work folder: $WORK)"
