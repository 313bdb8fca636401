#!/usr/bin/env bash
# Creates .venv and installs Tandem into it. torch goes first and stays pinned: any other torch spec pulls
# gigabytes of CUDA wheels. A stamp keyed on pyproject.toml makes a second run a no-op.
# Usage: scripts/install.sh [test]
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-}"
python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python_bin="$candidate"; break; fi
  done
fi
if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "Tandem needs Python 3.11 or newer; found ${python_bin:-none}. Set PYTHON=/path/to/python3.11." >&2
  exit 1
fi

[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
stamp=".venv/.installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)${extras:+-$extras}"
if [ -f "$stamp" ]; then
  exit 0
fi
echo "Installing Tandem into .venv (first run only; a few minutes)..."
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
target="."
[ -n "$extras" ] && target=".[$extras]"
.venv/bin/python -m pip install -q -c constraints.txt -e "$target"
touch "$stamp"
