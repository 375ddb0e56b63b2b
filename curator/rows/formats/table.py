"""The format table: every row format by name, the order auto-detection tries them in, and the turn
policy each gets when a recipe does not say.

A format is one module of this folder that registers itself here (`register`, once per name it
answers to); `curator/rows/formats/__init__.py` imports every module, so the table is whole as soon
as any part of the package is imported. Adding a format is that module and its line in `__init__`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curator.errors import ConfigError
from curator.rows.formats.conversation import Conversation

Normaliser = Callable[[Mapping[str, Any]], Conversation]
FileRows = Callable[[Path, Iterable[Any]], Iterable[Any]]


@dataclass(frozen=True)
class RowFormat:
    """One row format: its normaliser, the column sets auto-detection knows it by, and its turn policy."""

    name: str
    normalise: Normaliser
    columns: tuple[frozenset[str], ...] = ()  # a row holding every column of one set is of this format
    # Auto-detection tries formats lowest rank first and takes the first match, so a column set
    # ranks below any set it contains (OpenThoughts' {system, conversations} before ShareGPT's).
    rank: int = 0
    turns: str = "all"  # the turn policy when the recipe does not say (see to_prompt)
    aliases: tuple[str, ...] = ()  # other names a recipe may give it
    answered: Normaliser | None = None  # where it differs: the normaliser when the source's own answers are kept
    file_rows: FileRows | None = None  # a local file's rows completed from the files beside it (ToolTalk's APIs)

    def normaliser(self, keep_responses: bool) -> Normaliser:
        """Return the normaliser of a source that keeps its own answers (`keep_responses`) or not."""
        return self.answered if keep_responses and self.answered is not None else self.normalise


FORMATS: dict[str, RowFormat] = {}
_ALIASES: dict[str, str] = {}
_DETECT: list[RowFormat] = []  # the formats auto-detection knows, in the order it tries them (kept by register)


def register(fmt: RowFormat) -> RowFormat:
    """Return `fmt`, entered in the table under its name and aliases (a name taken twice is refused)."""
    for name in (fmt.name, *fmt.aliases):
        if name in FORMATS or name in _ALIASES:
            raise ValueError(f"row format name {name!r} is registered twice")
    FORMATS[fmt.name] = fmt
    _ALIASES.update({alias: fmt.name for alias in fmt.aliases})
    if fmt.columns:  # sorted here, once, not on every row a request log detects
        _DETECT.append(fmt)
        _DETECT.sort(key=lambda f: f.rank)
    return fmt


def aliases() -> dict[str, str]:
    """Return {alias: format name} over the table."""
    return dict(_ALIASES)


def format_names() -> tuple[str, ...]:
    """Return every name a recipe may give a format (names and aliases), sorted."""
    return tuple(sorted({*FORMATS, *_ALIASES}))


def detect_format(columns: Iterable[str]) -> str | None:
    """Return the format whose columns a row has, or None."""
    have = set(columns)
    for fmt in _DETECT:
        if any(needed <= have for needed in fmt.columns):
            return fmt.name
    return None


def resolve_format(requested: str, columns: Iterable[str], where: str) -> str:
    """Return the canonical format name for a source; `auto` is detected from `columns`."""
    if requested != "auto":
        return _ALIASES.get(requested, requested)
    columns = list(columns)
    found = detect_format(columns)
    if found is None:
        known = ", ".join(sorted(FORMATS))
        raise ConfigError(
            f"{where}: format: auto found no format for columns [{', '.join(columns)}]; "
            f"set `format:` to one of {known}, or convert the data"
        )
    return found


def default_turns(fmt: str) -> str:
    """Return the turn policy a format gets when the recipe does not say."""
    return FORMATS[fmt].turns if fmt in FORMATS else "all"


def local_rows(path: Path, rows: Iterable[Any]) -> Iterable[Any]:
    """Return the rows of the local file `path`, completed by each format that reads files beside it."""
    for fmt in FORMATS.values():
        if fmt.file_rows is not None:
            rows = fmt.file_rows(path, rows)
    return rows
