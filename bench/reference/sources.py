"""Read text files up to a budget: the reference benches' source corpora (the standard library only,
so that build-mix's worker processes import it without torch)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

MAX_FILE_BYTES = 200_000  # larger files are mostly generated tables or vendored bundles


def read_texts(paths: Iterable[Path], max_bytes: int, *, keep_blank: bool = True) -> list[tuple[str, str]]:
    """Return (path, text) of `paths` in their order until `max_bytes` of text are read (files that
    are not regular, over MAX_FILE_BYTES, unreadable or not UTF-8 skipped; blank ones too unless
    `keep_blank`). `paths` is read lazily: a small budget stops the walk behind it early."""
    out: list[tuple[str, str]] = []
    total = 0
    for path in paths:
        try:
            if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if keep_blank or text.strip():
            out.append((str(path), text))
            total += len(text)
        if total >= max_bytes:
            break
    return out
