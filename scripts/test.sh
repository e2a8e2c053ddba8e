#!/usr/bin/env bash
# The whole test suite on a fresh machine (what CI runs through .ci/run):
#   1. installs mlabench with its test extras (scripts/setup.sh: CPU torch where there is none),
#   2. installs Debian's chromium (the HTML report is opened in it headless) if it is missing,
#   3. sets up the CPU vLLM test server's venv and tiny model (cached in ~/.cache/mlabench), unless
#      MLABENCH_E2E=0,
#   4. runs pytest: unit tests, Triton kernels under TRITON_INTERPRET=1 (set by tests/conftest.py
#      when there is no GPU), and tests/e2e against a real vLLM server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo -n"
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium; } >/dev/null 2>&1; then
    echo "note: chromium could not be installed; the HTML report browser test will skip" >&2
  fi
fi
if [ "${MLABENCH_E2E:-1}" != "0" ]; then
  bash scripts/cpu_vllm_server.sh setup
fi
python3 -m pytest -q -p no:cacheprovider tests "$@"
