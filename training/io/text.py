"""Text that every stage can store, hash and tokenise: valid Unicode, i.e. no lone surrogates.

JSON allows "\\ud800" on its own and Python decodes it into a str, but such a str cannot be encoded
as UTF-8, so a hash, a parquet column, a JSONL shard or a tokenizer raises on it. Stages check text
with this and count the record as malformed instead.
"""

from __future__ import annotations


def is_valid_unicode(text: str) -> bool:
    """Return whether `text` encodes as UTF-8 (False for a lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
