#!/usr/bin/env bash
# The prepared device check (scripts/gpu_check.py says what each stage does):
#   scripts/gpu_check.sh [--cpu] --out DIR      # make gpu-check OUT=DIR
# On a GPU machine with no network, from the working tree alone: it installs nothing from an index and
# pulls no CUDA wheel. The python is $PYTHON, else the repo's .venv, else python3 (the GPU image's torch).
set -u
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x .venv/bin/python ]; then py=.venv/bin/python
else py=python3
fi
exec "$py" scripts/gpu_check.py "$@"
