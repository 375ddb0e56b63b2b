#!/usr/bin/env bash
# Build (or reuse) the virtual environment that runs a real vLLM server for tests/serving/: the CPU
# build of vLLM pinned in tests/serving/requirements.txt, and print its python. The tests run in the
# main environment and start `$CURATOR_VLLM_PYTHON -m vllm.entrypoints.openai.api_server`.
# Reuses an environment that already holds exactly these pins. Usage: bash .ci/vllm.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-${CURATOR_VLLM_VENV:-/tmp/curator-vllm-venv}}"
req=tests/serving/requirements.txt
stamp="$venv/.curator-requirements"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
# Its own environment, no --system-site-packages: vLLM pins its own transformers, fastapi, ...
python3 -m venv "$venv" >&2
# torch first, so that pip takes the CPU wheel on disk rather than resolving a CUDA build.
"$venv/bin/python" -m pip install --quiet "$(grep -m1 '^torch==' "$req")" >&2
"$venv/bin/python" -m pip install --quiet -r "$req" >&2
# PyPI's torchvision/torchaudio/torchcodec are not built against the CPU torch: with them,
# `import transformers` fails (operator torchvision::nms does not exist). vLLM's text models do not
# need them.
"$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
"$venv/bin/python" -c 'import vllm, transformers; print("vllm", vllm.__version__)' >&2
cp "$req" "$stamp"
echo "$venv/bin/python"
