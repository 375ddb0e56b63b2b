"""Capture backends: transformers here, or an engine's capture operation, read off the engine registry."""

from __future__ import annotations

import pytest

from curator.engines import ENGINES, vllm
from curator.errors import ConfigError
from curator.hidden.capture import BACKENDS, capture_op


def test_the_backends_are_transformers_and_every_engine_that_captures() -> None:
    assert BACKENDS == ("transformers", "vllm")
    assert ENGINES["sglang"].capture is None
    assert capture_op("transformers") is None and capture_op("vllm") is vllm.capture


def test_an_unknown_backend_is_refused_naming_the_ones_there_are() -> None:
    with pytest.raises(ConfigError, match="--backend must be transformers or vllm, not 'sglang'"):
        capture_op("sglang")
