#!/usr/bin/env bash
# Install mlabench (editable) into the current Python, with the extras named in $1 (e.g. "test").
#
# torch: an installed torch (a CUDA or ROCm build on a GPU machine) is kept.  With no torch at all,
# a machine with an NVIDIA or AMD driver gets PyPI's default torch, and a machine without one gets
# the CPU build of torch 2.13.0: first from the local wheel folder ($MLABENCH_WHEELS, default
# /opt/wheels) where it exists, without asking any index (an offline machine); else from PyTorch's
# CPU index (PyPI's Linux torch is the CUDA build, GBs of libraries a CPU cannot use).
# Triton comes with GPU torch builds; on the CPU it is a dependency of mlabench (its interpreter
# runs the kernel tests).
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
target="."
[ -n "$extra" ] && target=".[${extra}]"
args=(-e "$target")
if ! python3 -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 || command -v rocm-smi >/dev/null 2>&1; then
    args+=("torch")
  else
    wheels="${MLABENCH_WHEELS:-/opt/wheels}"
    if ! { [[ -d "$wheels" ]] && python3 -m pip install -q --disable-pip-version-check --no-index \
             --find-links "$wheels" "torch==2.13.0"; }; then
      python3 -m pip install -q --disable-pip-version-check --index-url https://download.pytorch.org/whl/cpu \
        "torch==2.13.0"
    fi
  fi
fi
python3 -m pip install -q --disable-pip-version-check "${args[@]}"
python3 -c "import mlabench, torch; print(f'mlabench {mlabench.__version__} installed (torch {torch.__version__})')"
