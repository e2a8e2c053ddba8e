#!/usr/bin/env bash
# The whole test suite on a fresh machine (what CI runs through .ci/run):
#   1. installs mlabench with its test extras (scripts/setup.sh: CPU torch where there is none),
#   2. installs Debian's packages the tests use where missing: chromium (the HTML report is opened
#      in it headless), postgresql (the tuner tests start a throwaway cluster of their own, no
#      system service) and g++ (the tuner's C++ policy header is compiled),
#   3. sets up the CPU vLLM test server's venv and tiny model (cached in ~/.cache/mlabench), unless
#      MLABENCH_E2E=0,
#   4. runs pytest: unit tests, Triton kernels under TRITON_INTERPRET=1 (set by tests/conftest.py
#      when there is no GPU), and tests/e2e against a real vLLM server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v g++ >/dev/null 2>&1 || need+=(g++)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo -n"
  if [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; then
    if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
             --no-install-recommends "${need[@]}"; } >/dev/null 2>&1; then
      echo "warning: could not install ${need[*]}: the tests that need them skip or fail, saying why" >&2
    fi
  else
    echo "warning: cannot install ${need[*]} (not root, no sudo): the tests that need them skip or fail, saying why" >&2
  fi
fi
if [ "${MLABENCH_E2E:-1}" != "0" ]; then
  bash scripts/cpu_vllm_server.sh setup
fi
python3 -m pytest -q -p no:cacheprovider tests "$@"
