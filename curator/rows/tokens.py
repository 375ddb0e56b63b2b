"""A prompt's length in the target's tokens: what build-mix's token filter and the traffic profile's
`--tokenizer` lengths both count."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from curator.errors import ConfigError


class TokenCounter:
    """Counts a prompt's tokens with the target's tokenizer (message contents, no chat template)."""

    def __init__(self, tokenizer_path: str | Path) -> None:
        from transformers import AutoTokenizer  # heavy import; only token filtering pays for it

        try:
            self._tok = AutoTokenizer.from_pretrained(str(tokenizer_path))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load a tokenizer from {tokenizer_path}: {str(exc).splitlines()[0]}") from None

    def count(self, prompt: Iterable[tuple[str, Any]]) -> int:
        """Return the number of tokens in the prompt's message contents."""
        encoded = self._tok([content for _, content in prompt], add_special_tokens=False)["input_ids"]
        return sum(len(ids) for ids in encoded)
