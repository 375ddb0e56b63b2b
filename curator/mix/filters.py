"""Prompt filters: empty prompts, prompts too long in characters or target tokens, licenses."""

from __future__ import annotations

from collections.abc import Sequence

from curator.rows.formats.conversation import Conversation
from curator.rows.tokens import TokenCounter

EMPTY = "empty_prompt"
TOO_LONG_CHARS = "too_long_chars"
TOO_LONG_TOKENS = "too_long_tokens"


def prompt_chars(prompt: Conversation) -> int:
    """Return the number of characters in all of a prompt's messages."""
    return sum(len(content) for _, content in prompt)


def cheap_filter(prompt: Conversation, max_chars: int | None) -> str | None:
    """Return why the prompt is filtered (empty user turn, too many characters), or None to keep it."""
    if any(role == "user" and not content.strip() for role, content in prompt):
        return EMPTY
    if max_chars is not None and prompt_chars(prompt) > max_chars:
        return TOO_LONG_CHARS
    return None


def token_filter(prompt: Conversation, counter: TokenCounter | None, max_tokens: int | None) -> str | None:
    """Return TOO_LONG_TOKENS if the prompt has more than `max_tokens` tokens, else None."""
    if counter is None or max_tokens is None:
        return None
    return TOO_LONG_TOKENS if counter.count(prompt) > max_tokens else None


def license_refusal(license: str | None, allowed: Sequence[str] | None) -> str | None:
    """Return why a source's license is refused by the allow-list, or None when it may be used."""
    if allowed is None:
        return None
    if not license:
        return "license unknown (set `license:` on the source or scout it into the catalog)"
    if license.strip().lower() not in {a.strip().lower() for a in allowed}:
        return f"license {license!r} not in the allow-list"
    return None
