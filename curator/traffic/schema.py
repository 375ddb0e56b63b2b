"""The traffic profile's file format (PROFILE.json): the one contract between `curator profile`
and its readers (`scout --profile`, `build-mix --match`, `eval --profile`).

A profile holds statistics only: shares, percentiles, hashed feature counts, and at most a
few scrubbed examples per category (none with --no-examples); docs/traffic.md says what
the scrubber finds and what an example can still copy.
"""

from __future__ import annotations

import math

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from curator.errors import ConfigError
from training.errors import ConfigFileError
from training.io.config_file import parse_config, read_text

PROFILE_KIND = "curator-traffic-profile"
PROFILE_VERSION = 1
CATEGORIES = ("agentic", "code", "reasoning", "chat")


def serves(category: str, named: Iterable[str | None] = ()) -> str | None:
    """Return the traffic category that `category` (a brief's, a recipe source's) serves: the one
    `named` names (its briefs' or its source's `traffic:`) when they all agree, else the category
    itself when it is one of CATEGORIES, else None. The one rule the scouts, build-mix and the eval
    share, on plain values so that each floor above can apply it to its own records."""
    mapped = set(named) - {None}
    if len(mapped) == 1:
        return mapped.pop()
    return category if category in CATEGORIES else None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CategoryShare(_Strict):
    share: float = Field(ge=0.0, le=1.0)
    rows: int = Field(ge=0)


class SparseCounts(_Strict):
    """Non-zero feature buckets and their counts (see curator.traffic.features)."""

    indices: list[int]
    counts: list[float]

    @model_validator(mode="after")
    def _same_length(self) -> SparseCounts:
        if len(self.indices) != len(self.counts):
            raise ValueError("indices and counts differ in length")
        # a NaN or negative count would silently change which rows --match selects
        if not all(math.isfinite(c) and c >= 0 for c in self.counts):
            raise ValueError("feature counts must be finite numbers >= 0")
        return self


# features.py hashes into 2**14 buckets; a profile naming more than this is not one curator wrote
# (1e12 buckets would be a terabyte of dense counts)
MAX_BUCKETS = 1 << 20


class Features(_Strict):
    method: str
    buckets: int = Field(gt=0, le=MAX_BUCKETS)
    per_category: dict[str, SparseCounts]


class Profile(_Strict):
    """A traffic profile. `categories` always names every category in CATEGORIES (share 0 allowed)."""

    model_config = ConfigDict(extra="allow", frozen=True)  # statistics may grow; readers use what they know

    kind: str = PROFILE_KIND
    version: int = PROFILE_VERSION
    categories: dict[str, CategoryShare]
    features: Features | None = None

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.kind != PROFILE_KIND:
            raise ValueError(f"not a traffic profile (kind {self.kind!r})")
        if self.version > PROFILE_VERSION:
            raise ValueError(f"profile version {self.version} is newer than this curator reads ({PROFILE_VERSION})")
        total = sum(c.share for c in self.categories.values())
        if self.categories and abs(total - 1.0) > 1e-6:
            raise ValueError(f"category shares sum to {total:.6f}, not 1")
        return self

    def shares(self) -> dict[str, float]:
        """Return {category: share} for the categories with a non-zero share."""
        return {name: c.share for name, c in self.categories.items() if c.share > 0}


# Keys a request-log line has (an OpenAI request, a wrapped request, a prompt/response pair) and a profile has not.
_LOG_KEYS = {"messages", "request", "prompt", "body", "conversations", "input"}


def _looks_like_log(text: str) -> bool:
    """Whether `text` is JSON lines whose first line is a request (a log given where a profile belongs)."""
    first = text.lstrip().split("\n", 1)[0]
    try:
        line = json.loads(first)
    except (ValueError, RecursionError):  # RecursionError: a first line nested too deeply is no request either
        return False
    return isinstance(line, dict) and bool(_LOG_KEYS & set(line))


def load_profile(path: str | Path) -> Profile:
    """Return the profile in `path`; a missing, unreadable or malformed file is a ConfigFileError naming it,
    a profile that does not validate a ConfigError."""
    path = Path(path)
    log_hint = (f"{path}: this looks like a request log, not a traffic profile: make the profile with "
                f"`curator profile --traffic {path} --out profile.json` and give profile.json")
    try:
        text = read_text(path, "profile", "a JSON file")
    except ConfigFileError as exc:
        if exc.reason == "missing":
            raise ConfigFileError(f"{path}: no such profile (make one with `curator profile --traffic FILE --out {path}`)",
                                  exc.reason) from None
        if exc.reason == "not text" and path.suffix == ".parquet":  # a request log as parquet: the profile is JSON
            raise ConfigFileError(log_hint, exc.reason) from None
        raise
    try:
        data = parse_config(text, str(path), "json")
    except ConfigFileError:
        if _looks_like_log(text):
            raise ConfigFileError(log_hint) from None
        raise
    if isinstance(data, dict) and "categories" not in data and _LOG_KEYS & set(data):
        raise ConfigFileError(log_hint)  # a log of one line
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(f"{path}: not a valid traffic profile: {where}: {first['msg']}") from None
