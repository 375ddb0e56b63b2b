"""Hugging Face Hub access for the scouts: search, dataset details, a per-run cache, offline snapshots.

Two backends share one interface (`HubClient.search`, `HubClient.inspect`):
- `LiveHub`: `huggingface_hub.HfApi` (`list_datasets`, `dataset_info`) plus `DatasetCard` for the
  README, and the dataset-viewer REST API through httpx. `HF_ENDPOINT` and `HF_TOKEN` work as in
  huggingface_hub; the viewer's base URL comes from `CURATOR_VIEWER_URL` (huggingface_hub hard-codes
  the viewer and ignores `HF_ENDPOINT` for it, so it needs its own setting).
- `SnapshotHub`: a JSON file written by `build_snapshot`, for machines without network.

Both cache answers for the life of the object (one scout run) and merge concurrent identical
requests, so ten agents asking for the same dataset cause one fetch.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from curator import http
from curator.errors import HubError
from training.io.atomic import write_json
from training.io.jsonfile import JSONFileError, read_json

VIEWER_URL_ENV = "CURATOR_VIEWER_URL"
DEFAULT_VIEWER_URL = "https://datasets-server.huggingface.co"
SNAPSHOT_FORMAT = "curator-hub-snapshot"
SNAPSHOT_VERSION = 1
EXAMPLE_ROWS = 3
CARD_CHARS = 20_000  # what a snapshot keeps of a card; tools truncate further for the model

T = TypeVar("T")
HUB_THREADS = 32  # blocking Hub calls in flight at once (ten agents search and read cards together)
# The viewer's waits: 1 s doubling (1-8 s over the default 4 retries, as huggingface_hub waits
# for the Hub API), or what its Retry-After asks for, up to a minute.
VIEWER_BASE_DELAY_S = 1.0
VIEWER_MAX_DELAY_S = 60.0


class UnknownDatasetError(HubError):
    """The Hub has no dataset with this id (or it is private to someone else)."""


@dataclass
class DatasetHit:
    """One search result: what a model needs to decide whether to inspect a dataset."""

    id: str
    downloads: int | None = None
    likes: int | None = None
    tags: list[str] = field(default_factory=list)
    license: str | None = None
    size_category: str | None = None
    gated: bool | str = False
    last_modified: str | None = None


@dataclass
class SplitInfo:
    """One config/split of a dataset and its row count (None when the viewer does not know)."""

    config: str
    split: str
    num_rows: int | None = None


@dataclass
class DatasetDetails:
    """Everything `inspect_dataset` reports about one dataset."""

    id: str
    sha: str | None = None
    author: str | None = None
    license: str | None = None
    gated: bool | str = False
    downloads: int | None = None
    likes: int | None = None
    tags: list[str] = field(default_factory=list)
    task_categories: list[str] = field(default_factory=list)
    languages: list[str] = field(default_factory=list)
    size_category: str | None = None
    last_modified: str | None = None
    card_text: str = ""
    splits: list[SplitInfo] = field(default_factory=list)
    num_rows: int | None = None  # rows of the largest config (a recipe source reads one config)
    num_bytes: int | None = None  # parquet bytes of the whole dataset
    features: dict[str, str] = field(default_factory=dict)  # column -> type, from the previewed split
    preview_config: str | None = None
    preview_split: str | None = None
    example_rows: list[dict[str, Any]] = field(default_factory=list)
    viewer_error: str | None = None

    def max_rows(self) -> int | None:
        """Return the row count, or the upper bound of the size category when the viewer has none."""
        if self.num_rows is not None:
            return self.num_rows
        return size_category_upper_bound(self.size_category)

    def hit(self) -> DatasetHit:
        """Return the search-result view of these details."""
        return DatasetHit(
            id=self.id, downloads=self.downloads, likes=self.likes, tags=list(self.tags), license=self.license,
            size_category=self.size_category, gated=self.gated, last_modified=self.last_modified,
        )

    def catalog_record(self) -> dict[str, Any]:
        """Return the row for the catalog's `datasets` table (keys are its column names)."""
        return {
            "dataset_id": self.id,
            "author": self.author,
            "sha": self.sha,
            "last_modified": _naive_utc(self.last_modified),
            "downloads": self.downloads,
            "likes": self.likes,
            "tags": list(self.tags),
            "license": self.license,
            "gated": str(self.gated) if self.gated else None,
            "size_category": self.size_category,
            "num_rows": self.num_rows,
            "num_bytes": self.num_bytes,
            "features": dict(self.features),
            "configs": [asdict(s) for s in self.splits],
            "task_categories": list(self.task_categories),
            "card_excerpt": self.card_text[:2000],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DatasetDetails:
        """Return details rebuilt from `asdict` output (as stored in a snapshot).

        A snapshot is a file anyone can edit: every field is checked against its type here
        (ValueError naming the first that is not), so a `downloads: "many"` or `tags: 5` is a
        skipped record, not a TypeError inside an agent's tool call.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a dataset record is a {type(data).__name__}, not an object")
        known = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in data.items() if k in known}
        for name, value in fields.items():
            if not _FIELD_TYPES[name](value):
                raise ValueError(f"{name} is {type(value).__name__} {_shown(value)}, not {_FIELD_WORDS[name]}")
        splits = fields.get("splits", [])
        fields["splits"] = [SplitInfo(config=s["config"], split=s["split"], num_rows=s.get("num_rows")) for s in splits]
        return cls(**fields)


def _shown(value: Any) -> str:
    """Return a snapshot value for a message, cut short (it may be a 4,000-digit number or nested 900 deep)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return "(not shown)"
    return text if len(text) <= 40 else text[:37] + "..."


def _count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _split(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("config"), str) and isinstance(value.get("split"), str)
            and _count(value.get("num_rows")))


# What each DatasetDetails field may hold in a snapshot, and how a refusal says it
_FIELD_TYPES: dict[str, Callable[[Any], bool]] = {
    "id": lambda v: isinstance(v, str) and bool(v), "sha": _text, "author": _text, "license": _text,
    "gated": lambda v: isinstance(v, (bool, str)), "downloads": _count, "likes": _count, "tags": _texts,
    "task_categories": _texts, "languages": _texts, "size_category": _text, "last_modified": _text,
    "card_text": lambda v: isinstance(v, str), "splits": lambda v: isinstance(v, list) and all(_split(s) for s in v),
    "num_rows": _count, "num_bytes": _count,
    "features": lambda v: isinstance(v, dict) and all(isinstance(t, str) for t in v.values()),
    "preview_config": _text, "preview_split": _text,
    "example_rows": lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v), "viewer_error": _text,
}
_FIELD_WORDS = {**dict.fromkeys(_FIELD_TYPES, "text or null"), "id": "a dataset id", "gated": "true/false or text",
                **dict.fromkeys(("downloads", "likes", "num_rows", "num_bytes"), "a count or null"),
                **dict.fromkeys(("tags", "task_categories", "languages"), "a list of text"), "card_text": "text",
                "splits": "a list of {config, split, num_rows}", "features": "an object of column: type",
                "example_rows": "a list of objects"}


@dataclass
class HubStats:
    """Counters of one hub object: requests that went out and answers served from the cache."""

    fetches: int = 0
    cache_hits: int = 0
    errors: int = 0
    first_error: str | None = None  # what the first failed request said, for a run that got nothing

    def all_failed(self) -> bool:
        """Return whether requests went out and every one failed (the Hub answered nothing useful)."""
        return self.fetches > 0 and self.errors == self.fetches


def _naive_utc(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    try:
        value = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value.astimezone(timezone.utc).replace(tzinfo=None) if value.tzinfo else value


_SIZE_BOUND = re.compile(r"n\s*<\s*([0-9.]+)\s*([KMBT]?)", re.I)
_SUFFIX = {"": 1, "K": 1_000, "M": 1_000_000, "B": 1_000_000_000, "T": 1_000_000_000_000}


def size_category_upper_bound(category: str | None) -> int | None:
    """Return the upper bound of a Hub size category such as '10K<n<100K' (None if open-ended)."""
    if not category:
        return None
    match = _SIZE_BOUND.search(category.split(":", 1)[-1])
    if not match:
        return None
    return int(float(match.group(1)) * _SUFFIX[match.group(2).upper()])


def _tag_values(tags: Iterable[str], prefix: str) -> list[str]:
    return [t.split(":", 1)[1] for t in tags if t.startswith(prefix + ":")]


def _first(values: Any) -> str | None:
    if isinstance(values, list):
        return str(values[0]) if values else None
    return str(values) if values else None


def feature_type(t: Any) -> str:
    """Return a short type string for a `datasets` feature as the viewer serialises it."""
    if isinstance(t, list):  # the legacy list-of-one form means a sequence
        return f"list<{feature_type(t[0]) if t else '?'}>"
    if not isinstance(t, dict):
        return str(t)
    kind = t.get("_type")
    if kind == "Value":
        return str(t.get("dtype", "?"))
    if kind == "ClassLabel":
        return "label"
    if kind in ("Sequence", "List", "LargeList"):
        return f"list<{feature_type(t.get('feature'))}>"
    if kind is None:  # a plain dict is a struct of named fields
        return "struct{" + ", ".join(f"{k}: {feature_type(v)}" for k, v in t.items()) + "}"
    return str(kind)


PROBE_TIMEOUT_S = http.PROBE_TIMEOUT_S  # the Hub probe's wait (http.py's), importable from here too


def unreachable(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Return why the Hub at `endpoint` cannot be reached (the transport error), or None when it
    answers at all: any HTTP status, even an error, shows that the network reaches it."""
    return http.unreachable(f"{endpoint.rstrip('/')}/api/datasets", timeout_s)


class HubClient(ABC):
    """The scouts' view of the Hub; subclasses implement `_search` and `_inspect`.

    Answers are cached for the object's life; concurrent identical requests share one fetch.
    Unknown ids stay cached as unknown; transient failures are not cached, so a retry refetches.
    """

    def __init__(self) -> None:
        self.stats = HubStats()
        self._done: dict[tuple, tuple[bool, Any]] = {}
        self._inflight: dict[tuple, asyncio.Future] = {}

    async def search(self, query: str, limit: int = 20) -> list[DatasetHit]:
        """Return up to `limit` datasets matching `query`, most downloaded first."""
        query = " ".join(query.split())
        if not query:
            raise HubError("search query is empty")
        limit = max(1, min(int(limit), 100))
        return await self._once(("search", query.lower(), limit), lambda: self._search(query, limit))

    async def inspect(self, dataset_id: str) -> DatasetDetails:
        """Return the details of one dataset; raises UnknownDatasetError for an id the Hub lacks."""
        dataset_id = dataset_id.strip()
        if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", dataset_id):
            raise UnknownDatasetError(f"{dataset_id!r} is not a dataset id of the form owner/name")
        return await self._once(("inspect", dataset_id), lambda: self._inspect(dataset_id))

    async def aclose(self) -> None:
        """Release network resources (nothing to do for offline backends)."""

    @abstractmethod
    async def _search(self, query: str, limit: int) -> list[DatasetHit]:
        """Fetch one search (LiveHub: the Hub API; SnapshotHub: the saved file)."""

    @abstractmethod
    async def _inspect(self, dataset_id: str) -> DatasetDetails:
        """Fetch one dataset's details."""

    async def _once(self, key: tuple, fetch: Callable[[], Awaitable[T]]) -> T:
        if key in self._done:
            self.stats.cache_hits += 1
            ok, value = self._done[key]
            if ok:
                return value
            raise value
        future = self._inflight.get(key)
        if future is None:
            self.stats.fetches += 1
            future = asyncio.ensure_future(self._settle(key, fetch))
            self._inflight[key] = future
        else:
            self.stats.cache_hits += 1
        # shield: one agent being cancelled must not cancel the fetch the others wait on
        return await asyncio.shield(future)

    async def _settle(self, key: tuple, fetch: Callable[[], Awaitable[T]]) -> T:
        try:
            value = await fetch()
        except UnknownDatasetError as exc:
            self._done[key] = (False, exc)
            raise
        except Exception as exc:
            self.stats.errors += 1
            self.stats.first_error = self.stats.first_error or str(exc)
            raise
        else:
            self._done[key] = (True, value)
            return value
        finally:
            self._inflight.pop(key, None)


def _query_words(query: str) -> list[str]:
    return [w for w in re.split(r"[\s,;:]+", query.lower()) if len(w) >= 2]


def _matches_all(hit: DatasetHit, words: list[str], extra: str = "") -> int:
    haystack = " ".join([hit.id.lower(), " ".join(hit.tags).lower(), extra.lower()])
    return sum(1 for w in words if w in haystack)


class LiveHub(HubClient):
    """The real Hub (or any server speaking its API) through huggingface_hub and httpx."""

    def __init__(
        self,
        endpoint: str | None = None,
        token: str | None = None,
        viewer_url: str | None = None,
        timeout: float = 30.0,
        cache_dir: str | Path | None = None,
        viewer_retries: int = 4,
    ) -> None:
        super().__init__()
        from huggingface_hub import HfApi, constants, get_token

        # read the variables now rather than at huggingface_hub's import, so a caller (or test)
        # that sets HF_ENDPOINT after import is still honoured
        try:
            self.endpoint = http.base_url(endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
            self.viewer_url = http.base_url(viewer_url or os.environ.get(VIEWER_URL_ENV) or DEFAULT_VIEWER_URL)
        except ValueError as exc:
            raise HubError(f"Hub or viewer URL: {exc} (check HF_ENDPOINT and {VIEWER_URL_ENV})") from exc
        self._token = token or get_token()
        self.timeout = timeout
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.viewer_retry = http.RetryPolicy(viewer_retries + 1, VIEWER_BASE_DELAY_S, VIEWER_MAX_DELAY_S)
        self._api = HfApi(endpoint=self.endpoint, token=self._token)
        self._http = httpx.AsyncClient(base_url=self.viewer_url, timeout=http.timeout(timeout), headers=http.bearer(self._token))
        # huggingface_hub blocks: its calls run on the hub's own threads, enough for ten agents'
        # searches and card reads at once whatever the event loop's default executor is.
        self._pool = ThreadPoolExecutor(max_workers=HUB_THREADS, thread_name_prefix="hub")

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        _keep_token_on_the_hub(self.endpoint)
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    async def aclose(self) -> None:
        await self._http.aclose()
        self._pool.shutdown(wait=False)

    def require_reachable(self, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        """Raise HubError within `timeout_s` when the Hub cannot be reached, naming what works offline."""
        why = unreachable(self.endpoint, timeout_s)
        if why is not None:
            raise HubError(
                f"cannot reach the Hub at {self.endpoint} ({why}): check the network and HF_ENDPOINT; without "
                "network, use a snapshot: --hub bundled, or --hub FILE from `curator hub snapshot` run where "
                "there is network"
            )

    async def _search(self, query: str, limit: int) -> list[DatasetHit]:
        hits = await self._list(query, limit)
        words = _query_words(query)
        if hits or len(words) < 2:
            return hits
        # The Hub matches `search` as one substring of the id, so "tool use trajectories" finds
        # nothing; fall back to the longest word and keep the hits that match most words.
        broad = await self._list(max(words, key=len), 100)
        ranked = sorted(broad, key=lambda h: (-_matches_all(h, words), -(h.downloads or 0)))
        return [h for h in ranked if _matches_all(h, words) >= 2][:limit]

    async def _list(self, query: str, limit: int) -> list[DatasetHit]:
        def call() -> list[DatasetHit]:
            infos = self._api.list_datasets(search=query, sort="downloads", limit=limit)
            return [_hit_from_info(info) for info in infos]

        return await self._in_thread(self._hub_call, call, f"searching the Hub for {query!r}")

    async def _inspect(self, dataset_id: str) -> DatasetDetails:
        info = await self._in_thread(
            self._hub_call, lambda: self._api.dataset_info(dataset_id), f"reading {dataset_id}"
        )
        details = _details_from_info(info)
        card, _ = await asyncio.gather(
            self._in_thread(self._card_text, dataset_id, info.sha), self._fill_from_viewer(details)
        )
        details.card_text = card
        return details

    def _hub_call(self, fn: Callable[[], T], what: str) -> T:
        from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

        try:
            return fn()
        except RepositoryNotFoundError as exc:
            raise UnknownDatasetError(f"no such dataset on {self.endpoint} while {what}") from exc
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else "?"
            raise HubError(f"the Hub answered HTTP {status} while {what}; check HF_ENDPOINT/HF_TOKEN") from exc
        except _NETWORK_ERRORS as exc:
            raise HubError(f"cannot reach the Hub at {self.endpoint} while {what}: {type(exc).__name__}") from exc

    def _card_text(self, dataset_id: str, revision: str | None) -> str:
        from huggingface_hub import DatasetCard, hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

        try:
            path = hf_hub_download(
                dataset_id, "README.md", repo_type="dataset", revision=revision, endpoint=self.endpoint,
                token=self._token, cache_dir=self.cache_dir, etag_timeout=self.timeout,
            )
        except EntryNotFoundError:
            return ""
        except (HfHubHTTPError, *_NETWORK_ERRORS):  # type: ignore[misc]  # mypy does not read a starred tuple here
            # the card is helpful, not essential: metadata and rows still describe the dataset
            return ""
        return DatasetCard.load(path).text[:CARD_CHARS]

    async def _viewer(self, path: str, **params: str) -> dict[str, Any]:
        async def once(attempt: int) -> dict[str, Any]:
            response = await self._http.get(path, params=params)
            response.raise_for_status()
            return response.json()

        try:
            return await http.retrying(once, self.viewer_retry, lambda exc: http.httpx_failure(exc, path))
        except httpx.HTTPStatusError as exc:
            status = exc.response.status_code
            raise HubError(f"dataset viewer {path} answered HTTP {status}: {http.error_text(exc.response, 200)}") from exc
        except httpx.HTTPError as exc:
            raise HubError(f"dataset viewer at {self.viewer_url} unreachable: {type(exc).__name__}") from exc

    async def _fill_from_viewer(self, details: DatasetDetails) -> None:
        name = details.id
        try:
            valid = await self._viewer("/is-valid", dataset=name)
            if not (valid.get("preview") or valid.get("viewer")):
                details.viewer_error = "the dataset viewer has no preview of this dataset"
                return
            answers: tuple[dict[str, Any] | BaseException, ...] = await asyncio.gather(
                self._viewer("/splits", dataset=name), self._viewer("/size", dataset=name), return_exceptions=True
            )
            splits_answer, size_answer = answers
            if isinstance(splits_answer, BaseException):
                raise splits_answer
            apply_viewer_splits(details, splits_answer, size_answer if isinstance(size_answer, dict) else None)
            if details.preview_config is not None and details.preview_split is not None:  # set together
                rows = await self._viewer(
                    "/first-rows", dataset=name, config=details.preview_config, split=details.preview_split
                )
                apply_viewer_first_rows(details, rows)
        except HubError as exc:
            details.viewer_error = str(exc)


def _network_errors() -> tuple[type[Exception], ...]:
    # huggingface_hub 1.x raises httpx errors; 2.x its own httpx2 fork's
    errors: list[type[Exception]] = [httpx.HTTPError, OSError]
    try:
        import httpx2
    except ImportError:
        return tuple(errors)
    return (*errors, httpx2.HTTPError)


_NETWORK_ERRORS: tuple[type[Exception], ...] = _network_errors()

# The Hub endpoints this process was given a token for. huggingface_hub sends the token with
# every request of a listing, including the `Link: next` pages, wherever they point; the hook
# below drops it on any request to another origin (the page is still read, anonymously).
_TOKEN_HOMES: set[str] = set()
_TOKEN_HOOK = http.credentials_stay_home(lambda: tuple(_TOKEN_HOMES))
_TOKEN_LOCK = threading.Lock()


def _keep_token_on_the_hub(endpoint: str) -> None:
    """Make huggingface_hub's shared session send the token to `endpoint` (and the other Hub
    endpoints named so far) only. Called before each Hub call: the session is re-created after
    a fork or a close, and the hook must be on the one in use."""
    from huggingface_hub import constants, get_session

    with _TOKEN_LOCK:
        _TOKEN_HOMES.update((endpoint, constants.ENDPOINT))  # other users of huggingface_hub keep theirs
        hooks = get_session().event_hooks
        if _TOKEN_HOOK not in hooks["request"]:
            hooks["request"] = [*hooks["request"], _TOKEN_HOOK]
            get_session().event_hooks = hooks


def apply_viewer_splits(details: DatasetDetails, splits: dict[str, Any], size: dict[str, Any] | None) -> None:
    """Fill splits, row counts and the previewed split from viewer /splits and /size answers."""
    rows_by_split: dict[tuple[str, str], int] = {}
    rows_by_config: dict[str, int] = {}
    if size:
        body = size.get("size", {})
        for s in body.get("splits", []):
            if isinstance(s.get("num_rows"), int):
                rows_by_split[(s.get("config"), s.get("split"))] = s["num_rows"]
        for c in body.get("configs", []):
            if isinstance(c.get("num_rows"), int):
                rows_by_config[c.get("config")] = c["num_rows"]
        total_bytes = body.get("dataset", {}).get("num_bytes_parquet_files")
        details.num_bytes = total_bytes if isinstance(total_bytes, int) else None
    details.splits = [
        SplitInfo(config=str(s.get("config")), split=str(s.get("split")), num_rows=rows_by_split.get((s.get("config"), s.get("split"))))
        for s in splits.get("splits", [])
        if s.get("config") is not None and s.get("split") is not None
    ]
    if not rows_by_config:
        for s in details.splits:
            if s.num_rows is not None:
                rows_by_config[s.config] = rows_by_config.get(s.config, 0) + s.num_rows
    details.num_rows = max(rows_by_config.values()) if rows_by_config else None
    if details.splits:
        configs = [s.config for s in details.splits]
        config = "default" if "default" in configs else configs[0]
        names = [s.split for s in details.splits if s.config == config]
        details.preview_config = config
        details.preview_split = "train" if "train" in names else names[0]


def apply_viewer_first_rows(details: DatasetDetails, answer: dict[str, Any], keep: int = EXAMPLE_ROWS) -> None:
    """Fill the column schema and a few example rows from a viewer /first-rows answer."""
    details.features = {
        str(f.get("name")): feature_type(f.get("type")) for f in answer.get("features", []) if f.get("name") is not None
    }
    details.example_rows = [r.get("row", {}) for r in answer.get("rows", [])[:keep] if isinstance(r, dict)]


def _hit_from_info(info: Any) -> DatasetHit:
    tags = list(getattr(info, "tags", None) or [])
    card = getattr(info, "card_data", None)
    card_license = _first(card.get("license")) if card is not None else None
    last: Any = getattr(info, "last_modified", None)
    return DatasetHit(
        id=info.id,
        downloads=getattr(info, "downloads", None),
        likes=getattr(info, "likes", None),
        tags=tags,
        license=card_license or _first(_tag_values(tags, "license")),
        size_category=_first(_tag_values(tags, "size_categories")),
        gated=getattr(info, "gated", False) or False,
        last_modified=last.isoformat() if hasattr(last, "isoformat") else last,
    )


def _details_from_info(info: Any) -> DatasetDetails:
    hit = _hit_from_info(info)
    card = getattr(info, "card_data", None)
    tags = hit.tags

    def card_list(key: str) -> list[str]:
        value = card.get(key) if card is not None else None
        if isinstance(value, str):
            return [value]
        return [str(v) for v in value] if isinstance(value, list) else []

    return DatasetDetails(
        id=hit.id, sha=getattr(info, "sha", None), author=getattr(info, "author", None), license=hit.license,
        gated=hit.gated, downloads=hit.downloads, likes=hit.likes, tags=tags,
        task_categories=card_list("task_categories") or _tag_values(tags, "task_categories"),
        languages=card_list("language") or _tag_values(tags, "language"),
        size_category=_first(card_list("size_categories")) or hit.size_category,
        last_modified=hit.last_modified,
    )


class SnapshotHub(HubClient):
    """The Hub as saved in a snapshot file: recorded searches replay; others match locally."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        try:
            data = read_json(self.path)  # nesting 100K deep or a 5,000-digit number: named, not a RecursionError
        except FileNotFoundError as exc:
            raise HubError(f"Hub snapshot {self.path} does not exist; make one with `curator hub snapshot --out FILE`") from exc
        except JSONFileError as exc:
            raise HubError(f"Hub snapshot {exc}") from None
        if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
            raise HubError(f"{self.path} is not a curator Hub snapshot (expected format {SNAPSHOT_FORMAT!r})")
        searches, datasets = data.get("searches", {}), data.get("datasets", {})
        for key, value, holds in (("searches", searches, "query: [dataset ids]"), ("datasets", datasets, "id: record")):
            if not isinstance(value, dict):
                raise HubError(f"Hub snapshot {self.path}: {key} is a {type(value).__name__}, not an object of "
                               f"{holds}; make the file again with `curator hub snapshot --out FILE`")
        self.meta = {k: v for k, v in data.items() if k not in ("datasets", "searches")}
        self.skipped = 0
        self.searches: dict[str, list[str]] = {}
        for query, ids in searches.items():
            if _texts(ids):
                self.searches[query.lower()] = list(ids)
            else:
                self.skipped += 1  # a recorded search that is not a list of ids: left out (the query matches locally)
        self.datasets: dict[str, DatasetDetails] = {}
        first: str | None = None  # why the first record was skipped
        for dataset_id, record in datasets.items():
            try:
                self.datasets[dataset_id] = DatasetDetails.from_dict({**record, "id": dataset_id}
                                                                     if isinstance(record, dict) else record)
            except (TypeError, ValueError) as exc:
                self.skipped += 1  # a hand-edited record that no longer parses: count it, keep the rest
                first = first or f"{dataset_id}: {exc}"
        if datasets and not self.datasets:  # nothing left to scout: said here, not as "no candidates" later
            raise HubError(f"Hub snapshot {self.path}: none of its {len(datasets)} dataset records parses "
                           f"(the first: {first}); make the file again with `curator hub snapshot --out FILE`")

    async def _search(self, query: str, limit: int) -> list[DatasetHit]:
        recorded = self.searches.get(query.lower())
        if recorded is not None:
            return [self.datasets[i].hit() for i in recorded if i in self.datasets][:limit]
        words = _query_words(query)
        scored = []
        for details in self.datasets.values():
            text = " ".join([details.card_text[:400], " ".join(details.task_categories)])
            n = _matches_all(details.hit(), words, text)
            # a phrase found whole in the id counts like all its words
            if query.lower() in details.id.lower():
                n = max(n, len(words))
            if n:
                scored.append((n, details.downloads or 0, details.id))
        scored.sort(key=lambda s: (-s[0], -s[1], s[2]))
        return [self.datasets[i].hit() for _, _, i in scored[:limit]]

    async def _inspect(self, dataset_id: str) -> DatasetDetails:
        details = self.datasets.get(dataset_id)
        if details is None:
            raise UnknownDatasetError(f"{dataset_id} is not in the Hub snapshot {self.path.name}")
        return details


def bundled_snapshot_path() -> Path:
    """Return the path of the snapshot shipped with the package (real dataset metadata, for the demo)."""
    return Path(__file__).parent / "data" / "hub_snapshot.json"


def open_hub(source: str | Path | None = None, **live_options: Any) -> HubClient:
    """Return a SnapshotHub for a snapshot file, 'bundled' for the shipped one, or the live Hub for None."""
    if source is None:
        return LiveHub(**live_options)
    if str(source) == "bundled":
        return SnapshotHub(bundled_snapshot_path())
    return SnapshotHub(source)


@dataclass
class SnapshotSummary:
    """What `build_snapshot` saved."""

    path: Path
    queries: int
    datasets: int
    failed: list[str]
    wall_s: float


async def build_snapshot(
    hub: HubClient,
    queries: Iterable[str],
    out: str | Path,
    per_query: int = 10,
    extra_ids: Iterable[str] = (),
    concurrency: int = 8,
) -> SnapshotSummary:
    """Run the searches, inspect every hit (and `extra_ids`), and write a snapshot file atomically."""
    start = time.perf_counter()
    searches: dict[str, list[str]] = {}
    failed: list[str] = []
    limit = asyncio.Semaphore(concurrency)

    async def search(q: str) -> None:
        async with limit:
            try:
                searches[q] = [h.id for h in await hub.search(q, per_query)]
            except HubError as exc:
                failed.append(f"search {q!r}: {exc}")

    query_list = list(dict.fromkeys(" ".join(q.split()) for q in queries if q.strip()))
    await asyncio.gather(*(search(q) for q in query_list))
    ids = list(dict.fromkeys([*(i for q in query_list for i in searches.get(q, [])), *extra_ids]))
    datasets: dict[str, dict[str, Any]] = {}

    async def inspect(dataset_id: str) -> None:
        async with limit:
            try:
                details = await hub.inspect(dataset_id)
            except HubError as exc:
                failed.append(f"inspect {dataset_id}: {exc}")
                return
            record = asdict(details)
            record.pop("id")
            record["card_text"] = record["card_text"][:CARD_CHARS]
            datasets[dataset_id] = record

    await asyncio.gather(*(inspect(i) for i in ids))
    payload: dict[str, Any] = {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": getattr(hub, "endpoint", type(hub).__name__),
        "searches": {q: searches[q] for q in query_list if q in searches},
        "datasets": {i: datasets[i] for i in ids if i in datasets},
    }
    path = Path(out)
    if not datasets:  # an empty file would only fail later, in the scout that reads it
        first = f"; the first failure: {failed[0]}" if failed else ""
        raise HubError(f"the snapshot would hold no datasets, so {path} was not written; check HF_ENDPOINT, "
                       f"HF_TOKEN and the queries{first}")
    write_json(path, payload, ensure_ascii=False, indent=1, default=str)
    return SnapshotSummary(path, len(payload["searches"]), len(payload["datasets"]), failed, time.perf_counter() - start)
