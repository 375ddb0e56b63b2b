#!/usr/bin/env bash
# Regenerate constraints.txt, the locked environment, from what a fresh install resolves today.
# Figures the README and the suite state exactly come from that environment: after a new lock,
# run the demo figures again (bench/demo_figures.py says how) and update what moved.
# Usage: bash .ci/lock.sh [PYTHON]   (default python3; Python 3.11, as CI)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
"${1:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet torch==2.13.0
"$venv/bin/python" -m pip install --quiet -e '.[test]'
{
  sed -n '1,/^# Regenerate/p' constraints.txt | sed 's/resolved on [0-9-]*/resolved on '"$(date -u +%F)"'/'
  # the local label (+cpu) names one build of torch; ==2.13.0 admits the build of each machine
  "$venv/bin/python" -m pip freeze --exclude eagle-curator | sed 's/+cpu$//'
} > constraints.txt.new
mv constraints.txt.new constraints.txt
rm -rf "$(dirname "$venv")"
git diff --stat constraints.txt
