#!/usr/bin/env bash
# Sets up .venv on a fresh CPU machine: torch (CPU build), veRL 0.9.1, maspo-verl with its test and speech extras.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -c scripts/constraints.txt -e ".[test,speech]"
for extra in scripts/setup.d/*.sh; do
    [ -e "$extra" ] && bash "$extra"
done
echo "setup done: $(.venv/bin/python -c 'import torch, verl, maspo_verl; print("torch", torch.__version__, "verl", verl.__version__, "maspo_verl", maspo_verl.__version__)')"
