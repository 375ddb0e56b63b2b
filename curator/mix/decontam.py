"""Decontamination: prompts that must never enter a mix (benchmarks, eval sets, the traffic's held-out split).

Each prompt of a recipe's `decontaminate:` list is remembered by a Deduper with the same engine and
threshold as the mix's dedup (exact digest of the normalised text, MinHash near matches confirmed by
the exact 5-gram Jaccard). A mix row is contaminated when its whole dedup text, or any one of its
user turns, matches a remembered prompt exactly or nearly: a benchmark question asked as the second
turn of a conversation counts too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from curator.errors import ConfigError
from curator.mix.dedup import Deduper, Match, Prepared
from curator.rows.formats.conversation import Conversation, MalformedRow
from curator.rows.formats.table import FORMATS, resolve_format
from curator.rows.readers import BrokenRow, open_source
from curator.mix.recipe import DecontamSpec

DEFAULT_NEAR = 0.85  # where the recipe switches near-dedup off, decontamination still matches near copies
HELDOUT_OWNER = "held-out traffic"
# One turn of a multi-turn conversation is compared on its own only when it has this many words:
# "thanks" or "go on" in a benchmark's second turn must not take every such turn out of the mix.
MIN_TURN_WORDS = 8


def dedup_text(prompt: Conversation) -> str:
    """Return the text dedup compares: the user and tool turns (system prompts are often shared boilerplate)."""
    return "\n".join(content for role, content in prompt if role in ("user", "tool"))


def row_texts(prompt: Conversation) -> list[str]:
    """Return the texts of a row compared for contamination: its dedup text, and each of its user turns
    of MIN_TURN_WORDS words or more when it has several."""
    users = [content for role, content in prompt if role == "user"]
    whole = dedup_text(prompt)
    if len(users) < 2:
        return [whole]
    return [whole, *(u for u in users if len(u.split()) >= MIN_TURN_WORDS)]


@dataclass
class SetReport:
    """One decontamination set: its name, the prompts remembered and the rows that held none."""

    name: str
    prompts: int = 0
    malformed: int = 0
    matches: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "prompts": self.prompts, "malformed": self.malformed, "mix_rows_dropped": self.matches}


@dataclass
class Decontaminator:
    """The prompts no mix row may match, and how many rows each set took out."""

    near: float | None
    sets: list[SetReport] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._dedup = Deduper(exact=True, near=self.near if self.near is not None else DEFAULT_NEAR)

    @property
    def active(self) -> bool:
        return len(self._dedup) > 0

    def add(self, name: str, texts: Iterable[str], malformed: int = 0) -> SetReport:
        """Remember `texts` as set `name` (blank texts are skipped); return its report."""
        report = SetReport(name, malformed=malformed)
        owner = len(self.sets)
        self.sets.append(report)
        texts = iter(texts)
        while chunk := [t for t in islice(texts, 512) if t.strip()]:
            for item in self._dedup.prepare(chunk):
                self._dedup.remember(item, owner)
            report.prompts += len(chunk)
        return report

    def check(self, prompts: Sequence[Conversation]) -> list[Match | None]:
        """Return, for each prompt, the match that makes it contaminated, or None (`count` the ones dropped)."""
        return self.screen(prompts)[0]

    def screen(self, prompts: Sequence[Conversation]) -> tuple[list[Match | None], list[Prepared | None]]:
        """Return `check`'s matches and each prompt's whole-text (dedup_text) keys, for the mix's dedup to
        reuse through `Deduper.adopt` (None for every prompt when no set is loaded: nothing was prepared)."""
        if not self.active:
            return [None] * len(prompts), [None] * len(prompts)
        flat: list[str] = []
        owner: list[int] = []
        for i, prompt in enumerate(prompts):
            texts = row_texts(prompt)  # the first is the whole dedup text
            flat.extend(texts)
            owner.extend([i] * len(texts))
        found: list[Match | None] = [None] * len(prompts)
        whole: list[Prepared | None] = [None] * len(prompts)
        for i, item in zip(owner, self._dedup.prepare(flat)):
            if whole[i] is None:
                whole[i] = item
            if found[i] is None:
                found[i] = self._dedup.find(item)
        return found, whole

    def count(self, match: Match) -> None:
        """Count one mix row dropped for `match` against the set it matched."""
        self.sets[match.owner].matches += 1

    def load(self, spec: DecontamSpec, base_dir: Path, seed: int, confine_to: Path | None) -> SetReport:
        """Remember the prompts of one `decontaminate:` entry: a text column (`field`) or conversations' user turns."""
        rows = open_source(spec, base_dir, seed, confine_to)()
        counts = {"malformed": 0}
        report = self.add(spec.label(), _prompts(rows, spec, counts))
        report.malformed = counts["malformed"]
        if not report.prompts:
            what = f"field {spec.field!r} (text, or a list of texts)" if spec.field else "a user turn"
            raise ConfigError(f"decontaminate {spec.label()!r}: no prompt read ({report.malformed:,} rows without {what}); "
                              "a set that keeps nothing out is a mistake: fix `field:`/`format:` or remove it")
        return report


def _prompts(rows: Iterable[Any], spec: DecontamSpec, counts: dict[str, int]) -> Iterable[str]:
    normalise = None
    for row in rows:
        if isinstance(row, BrokenRow):
            counts["malformed"] += 1
            continue
        if spec.field is not None:
            value = row.get(spec.field)
            if isinstance(value, str):
                yield value
            elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                yield from value  # a multi-turn benchmark's turns (MT-Bench's `prompt`)
            else:
                counts["malformed"] += 1
            continue
        if normalise is None:
            normalise = FORMATS[resolve_format(spec.format, row.keys(), f"decontaminate {spec.label()!r}")].normalise
        try:
            conv = normalise(row)
        except MalformedRow:
            counts["malformed"] += 1
            continue
        if not any(role == "user" for role, _ in conv):
            counts["malformed"] += 1
            continue
        yield from row_texts(conv)
