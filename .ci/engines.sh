#!/usr/bin/env bash
# Install the engines the engine-code tests run (tests/engines/requirements.txt) into their own
# virtual environment over the main one, and print its python. Reuses an environment that already
# holds exactly these pins. Usage: bash .ci/engines.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-${CURATOR_ENGINES_VENV:-/tmp/curator-engines-venv}}"
req=tests/engines/requirements.txt
stamp="$venv/.curator-requirements"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
# --system-site-packages: torch (CPU), numpy, safetensors, pytest and the toolkit come from the
# main environment; the pins below shadow it where they differ (transformers).
python3 -m venv --system-site-packages "$venv" >&2
# --no-deps: the engines' declared dependencies pull CUDA builds (torch, torchvision, flashinfer,
# ...) that a CPU test does not use and that break `import transformers` beside a CPU torch.
"$venv/bin/python" -m pip install --quiet --no-deps -r "$req" >&2
cp "$req" "$stamp"
echo "$venv/bin/python"
