"""Research briefs: one markdown file per data domain, with YAML front matter.

    ---
    id: agentic-trajectories          # unique; the agent's name in the catalog
    title: Agentic and tool-use trajectories
    category: agentic                 # what record_candidate files its finds under
    weight: 0.23                      # share of the proposed mix before goal weighting
    traffic: agentic                  # the traffic category it serves (scout --profile); optional
    seed_queries: [swe-agent, trajectories]
    keywords: [agent, trajectory, tool]   # words that mark a good find (rules planner score)
    good_find: >
      what a good dataset looks like
    avoid: [what to skip]
    ---
    Free markdown: the brief itself, given to the agent.

A user adds a domain by adding a file; unknown keys are errors that name the file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from curator.errors import ConfigError
from curator.traffic.schema import CATEGORIES
from training.io.config_file import parse_config, read_text

AGENTS_DIR_ENV = "CURATOR_AGENTS_DIR"
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)(.*)\Z", re.S)
_SLUG = r"^[a-z0-9][a-z0-9_.-]*$"


class BriefSpec(BaseModel):
    """The front matter of a brief file."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=_SLUG, max_length=64)
    title: str = Field(min_length=1, max_length=200)
    category: str = Field(pattern=_SLUG, max_length=64)
    weight: float = Field(0.1, ge=0.0, le=1.0)
    traffic: Optional[str] = None
    seed_queries: list[str] = Field(min_length=1)
    keywords: list[str] = Field(default_factory=list)
    good_find: str = Field(min_length=1)
    avoid: list[str] = Field(default_factory=list)

    @field_validator("seed_queries", "keywords", "avoid", mode="before")
    @classmethod
    def _listify(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("traffic")
    @classmethod
    def _known_traffic(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and value not in CATEGORIES:
            raise ValueError(f"must be one of {', '.join(CATEGORIES)} (the traffic profile's categories)")
        return value

    @field_validator("seed_queries")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        cleaned = [" ".join(q.split()) for q in value if q.strip()]
        if not cleaned:
            raise ValueError("needs at least one non-empty query")
        return cleaned


@dataclass
class Brief:
    """One research domain: what an agent looks for and how its finds are filed."""

    id: str
    title: str
    category: str
    weight: float
    seed_queries: list[str]
    keywords: list[str]
    good_find: str
    avoid: list[str] = field(default_factory=list)
    traffic: str | None = None  # the traffic profile category it serves (curator.traffic.schema.CATEGORIES)
    body: str = ""
    path: Path | None = None

    def prompt_text(self) -> str:
        """Return the brief as the agent reads it: title, what to find, what to avoid, then the body."""
        lines = [f"# {self.title}", "", f"Category: {self.category}", "", f"A good find: {self.good_find.strip()}"]
        if self.avoid:
            lines += ["", "Avoid: " + "; ".join(self.avoid)]
        lines += ["", "Queries to start from: " + ", ".join(self.seed_queries)]
        if self.body.strip():
            lines += ["", self.body.strip()]
        return "\n".join(lines)


def default_agents_dir() -> Path:
    """Return $CURATOR_AGENTS_DIR, else ./agents if present, else the agents/ folder of this checkout."""
    env = os.environ.get(AGENTS_DIR_ENV)
    if env:
        return Path(env)
    local = Path.cwd() / "agents"
    if local.is_dir():
        return local
    return Path(__file__).resolve().parents[2] / "agents"


def parse_brief(text: str, path: Path | None = None) -> Brief:
    """Return the brief in one file's text; ConfigError naming the file and key when invalid."""
    where = str(path) if path else "brief"
    match = _FRONT_MATTER.match(text.lstrip("\ufeff"))
    if not match:
        raise ConfigError(f"{where}: a brief starts with YAML front matter between '---' lines")
    meta = parse_config(match.group(1), f"{where}: front matter", "yaml")
    if not isinstance(meta, dict):
        raise ConfigError(f"{where}: front matter must be a mapping of keys")
    try:
        spec = BriefSpec.model_validate(meta)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'front matter'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{where}: {problems}") from exc
    return Brief(**spec.model_dump(), body=match.group(2), path=path)


def load_briefs(directory: str | Path | None = None, limit: int | None = None) -> list[Brief]:
    """Return the briefs in `directory` (*.md), heaviest first, the first `limit` of them.

    Heaviest first so that `--agents 3` runs the three domains that weigh most in the mix.
    """
    root = Path(directory) if directory is not None else default_agents_dir()
    if not root.is_dir():
        raise ConfigError(f"briefs folder {root} does not exist; pass --agents-dir or set ${AGENTS_DIR_ENV}")
    briefs = [parse_brief(read_text(p, "brief", "a Markdown file"), p) for p in sorted(root.glob("*.md"))]
    if not briefs:
        raise ConfigError(f"no briefs (*.md) in {root}")
    seen: dict[str, Path | None] = {}
    for brief in briefs:
        if brief.id in seen:
            raise ConfigError(f"brief id {brief.id!r} is used by both {seen[brief.id]} and {brief.path}")
        seen[brief.id] = brief.path
    briefs.sort(key=lambda b: (-b.weight, b.id))
    return take(briefs, limit)


def take(briefs: list[Brief], limit: int | None) -> list[Brief]:
    """Return the first `limit` briefs (all when None), heaviest first as `load_briefs` orders them."""
    if limit is None:
        return briefs
    if limit < 1:
        raise ConfigError(f"--agents must be at least 1, got {limit}")
    return briefs[:limit]


def categories(briefs: list[Brief]) -> set[str]:
    """Return the categories the briefs file their finds under."""
    return {b.category for b in briefs}
