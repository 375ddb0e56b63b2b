#!/usr/bin/env bash
# Download, into pip's own cache, the wheels of the two engine environments that .ci/run builds
# after the suite (tests/engines/requirements.txt, tests/serving/requirements.txt). .ci/run starts
# this in the background before the suite: the downloads (most of a cold vLLM venv's 15 min) then
# overlap the tests, and the installs later find their wheels cached. A download that fails here
# costs nothing: the install downloads it again, and fails there with pip's own error.
set -uo pipefail
cd "$(dirname "$0")/.."
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python3 -m pip download --quiet --no-deps -d "$scratch/engines" -r tests/engines/requirements.txt
python3 -m pip download --quiet -d "$scratch/vllm" -r tests/serving/requirements.txt
