#!/usr/bin/env bash
# Install the engines the engine-code tests run (tests/engines/requirements.txt) into their own
# virtual environment over the main one (the python3 this runs with: CI's fresh venv), and print its
# python. Reuses an environment that already holds exactly these pins. Usage: bash .ci/engines.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-${CURATOR_ENGINES_VENV:-/tmp/curator-engines-venv}}"
req=tests/engines/requirements.txt
stamp="$venv/.curator-requirements"
# torch (CPU), numpy, safetensors, pytest and the toolkit come from the main environment, added
# after the venv's own packages so that the pins below shadow it where they differ (transformers).
# A venv made from a venv does not see its parent through --system-site-packages, so a .pth file
# adds the main one (rewritten every time: CI's main venv is a new folder on each run).
main_site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
link_main() {
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "import site; site.addsitedir('$main_site')" > "$site/_curator_main_env.pth"
}
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  link_main
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv" >&2
# --no-deps: the engines' declared dependencies pull CUDA builds (torch, torchvision, flashinfer,
# ...) that a CPU test does not use and that break `import transformers` beside a CPU torch.
"$venv/bin/python" -m pip install --quiet --no-deps -r "$req" >&2
# linked after the install, so that pip does not take the main environment's packages for its own
link_main
cp "$req" "$stamp"
echo "$venv/bin/python"
