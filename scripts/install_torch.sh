#!/usr/bin/env bash
# Makes sure the environment's python has a torch, without ever pulling CUDA wheels onto a machine
# that has no GPU. Usage: scripts/install_torch.sh PYTHON
#   - a torch that is already importable (the user's own, CPU or CUDA) is kept as it is;
#   - on a machine with an NVIDIA GPU, the registry's default torch build is installed;
#   - otherwise the CPU build 2.13.0+cpu: from a local wheel when pip's find-links has one,
#     else from the PyTorch CPU index.
set -euo pipefail
PY=${1:-python3}
if "$PY" -c "import torch" 2>/dev/null; then
    echo "torch: using the installed $("$PY" -c 'import torch; print(torch.__version__)')"
    exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "torch: GPU found, installing the default (CUDA) build"
    "$PY" -m pip install torch
else
    echo "torch: no GPU, installing the CPU build"
    "$PY" -m pip install "torch==2.13.0+cpu" 2>/dev/null \
        || "$PY" -m pip install torch --index-url https://download.pytorch.org/whl/cpu
fi
