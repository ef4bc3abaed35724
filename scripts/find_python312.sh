#!/usr/bin/env bash
# Print the path of a Python 3.12 or 3.13 interpreter (the simulator, tirx-harness NumSim,
# needs one): python3.12, python3.13 or python3 on PATH if it really is one (a pyenv shim
# of a version that is not selected fails and is skipped), else the newest 3.12/3.13 that
# pyenv has installed (3.12 before 3.13). Exit 1 with a one-line hint when there is none.
#   "$(scripts/find_python312.sh)" -m venv .simvenv
set -uo pipefail
ok() { "$1" -c 'import sys; sys.exit(not (3, 12) <= sys.version_info[:2] < (3, 14))' 2>/dev/null; }
for c in python3.12 python3.13 python3; do
  if command -v "$c" >/dev/null 2>&1 && ok "$c"; then
    "$c" -c 'import sys; print(sys.executable)'; exit 0
  fi
done
if command -v pyenv >/dev/null 2>&1; then
  for minor in 12 13; do
    v=$(pyenv versions --bare 2>/dev/null | grep -E "^3\.$minor(\.[0-9]+)?\$" | sort -V | tail -1)
    if [ -n "$v" ] && ok "$(pyenv prefix "$v")/bin/python3"; then
      echo "$(pyenv prefix "$v")/bin/python3"; exit 0
    fi
  done
fi
echo "no Python 3.12 or 3.13 found: install one (e.g. 'pyenv install 3.12' or your package manager's python3.12) for the simulator" >&2
exit 1
