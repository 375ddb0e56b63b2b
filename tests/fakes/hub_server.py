"""A local Hugging Face Hub on 127.0.0.1 for tests and benchmarks: the REST paths
huggingface_hub uses and the dataset-viewer API, served from an in-memory list of datasets.

Hub API:
  GET  /api/datasets              search (repeated, all must match the id), author, filter
                                  (repeated tags, all required), sort (descending), limit,
                                  full, expand; pages linked with `Link: <...>; rel="next"`
  GET  /api/datasets/{id}         one dataset with cardData and siblings; 401 (anonymous) or
  GET  /api/datasets/{id}/revision/{rev}      404 with X-Error-Code: RepoNotFound when unknown
  HEAD /datasets/{id}/resolve/{rev}/README.md X-Repo-Commit, ETag, Content-Length
  GET  /datasets/{id}/resolve/{rev}/README.md
Dataset viewer (same server, so point CURATOR_VIEWER_URL at `url`):
  GET /is-valid, /splits, /first-rows, /info, /size   ({"error": ...} with 404/422 on failure;
  a gated dataset asked without a token answers 404, as the real viewer does)

Every request is counted in `hits` by (method, path), so tests can prove that a cache worked;
`fail_next(prefix, statuses)` makes the next requests under a path fail (e.g. a 429 first).
`delay_s` adds latency to every answer (for benchmarks); `link_base` makes the `Link: next`
pages point at another server (a hostile or misconfigured Hub). Stdlib only:

    with FakeHubServer(datasets) as hub:
        HfApi(endpoint=hub.url); LiveHub(endpoint=hub.url, viewer_url=hub.url)
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit


@dataclass
class FakeDataset:
    """One dataset the fake Hub serves."""

    id: str
    downloads: int = 0
    likes: int = 0
    tags: list[str] = field(default_factory=list)
    card_data: dict[str, Any] = field(default_factory=dict)
    readme: str | None = None  # None: the repo has no README.md
    gated: bool | str = False
    sha: str = ""
    last_modified: str = "2024-06-01T00:00:00.000Z"
    splits: list[tuple[str, str, int]] | None = None  # (config, split, rows); None: no viewer
    features: dict[str, Any] = field(default_factory=dict)  # column -> viewer feature type
    rows: list[dict[str, Any]] = field(default_factory=list)
    num_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.sha:
            self.sha = hashlib.sha1(self.id.encode()).hexdigest()


def datasets_from_snapshot(path: str | Path) -> list[FakeDataset]:
    """Return the datasets of a curator Hub snapshot as fake-server datasets (same facts)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for dataset_id, rec in data["datasets"].items():
        tags = list(rec.get("tags", []))
        card = {"license": rec.get("license"), "task_categories": rec.get("task_categories", []),
                "language": rec.get("languages", [])}
        if rec.get("size_category"):
            card["size_categories"] = [rec["size_category"]]
        splits = rec.get("splits") or []
        out.append(FakeDataset(
            id=dataset_id,
            downloads=rec.get("downloads") or 0,
            likes=rec.get("likes") or 0,
            tags=tags,
            card_data={k: v for k, v in card.items() if v},
            readme=rec.get("card_text") or None,
            gated=rec.get("gated") or False,
            splits=[(s["config"], s["split"], s.get("num_rows") or 0) for s in splits] or None,
            features={name: _viewer_type(t) for name, t in (rec.get("features") or {}).items()},
            rows=list(rec.get("example_rows") or []),
            num_bytes=rec.get("num_bytes") or 0,
        ))
    return out


def _viewer_type(short: str) -> dict[str, Any]:
    # The snapshot keeps short type strings; the viewer speaks datasets' feature JSON.
    if short.startswith("list<") and short.endswith(">"):
        return {"_type": "List", "feature": _viewer_type(short[5:-1])}
    if short.startswith("struct{") and short.endswith("}"):
        fields = {}
        for part in _split_top(short[7:-1]):
            name, _, inner = part.partition(": ")
            fields[name.strip()] = _viewer_type(inner.strip())
        return fields
    return {"dtype": short, "_type": "Value"}


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "<{":
            depth += 1
        elif ch in ">}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]


class FakeHubServer:
    """The fake Hub + dataset viewer; a context manager that serves on a free port."""

    def __init__(self, datasets: list[FakeDataset], page_size: int = 1000, delay_s: float = 0.0) -> None:
        self.datasets = {d.id: d for d in datasets}
        self.page_size = page_size
        self.delay_s = delay_s
        self.link_base: str | None = None  # where `Link: next` points (default: this server)
        self.hits: Counter[tuple[str, str]] = Counter()
        self.auth: list[str | None] = []
        self._failures: dict[str, list[int]] = defaultdict(list)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeHubServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                fake._handle(self, "GET")

            def do_HEAD(self) -> None:  # noqa: N802
                fake._handle(self, "HEAD")

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- test controls ---------------------------------------------------------------------

    def fail_next(self, path_prefix: str, statuses: list[int]) -> None:
        """Answer the next requests under `path_prefix` with these statuses, in order."""
        with self._lock:
            self._failures[path_prefix].extend(statuses)

    def count(self, path_prefix: str, method: str | None = None) -> int:
        """Return how many requests went to paths starting with `path_prefix`."""
        with self._lock:
            return sum(n for (m, p), n in self.hits.items() if p.startswith(path_prefix) and (method is None or m == method))

    # -- dispatch --------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        path = parts.path
        query = parse_qs(parts.query)
        with self._lock:
            self.hits[(method, path)] += 1
            self.auth.append(h.headers.get("Authorization"))
            status = None
            for prefix, queue in self._failures.items():
                if path.startswith(prefix) and queue:
                    status = queue.pop(0)
                    break
        if self.delay_s:
            time.sleep(self.delay_s)
        if status is not None:
            self._send_json(h, method, status, {"error": f"injected failure {status}"}, {"Retry-After": "0"})
            return
        try:
            self._route(h, method, path, query)
        except _HTTPError as err:
            self._send_json(h, method, err.status, {"error": err.message}, err.headers)

    def _route(self, h: BaseHTTPRequestHandler, method: str, path: str, q: dict[str, list[str]]) -> None:
        if path == "/api/datasets":
            return self._list(h, method, q)
        if path.startswith("/api/datasets/"):
            rest = path[len("/api/datasets/"):]
            dataset_id = rest.split("/revision/")[0]
            return self._send_json(h, method, 200, self._item(self._get(dataset_id, h), full=True))
        if path.startswith("/datasets/") and "/resolve/" in path:
            return self._resolve(h, method, path)
        viewer = {"/is-valid": self._is_valid, "/splits": self._splits, "/first-rows": self._first_rows,
                  "/info": self._info, "/size": self._size}
        if path in viewer:
            name = (q.get("dataset") or [""])[0]
            if not name:
                raise _HTTPError(422, "Parameter 'dataset' is required")
            dataset = self.datasets.get(name)
            if dataset is None or (dataset.gated and not h.headers.get("Authorization")):
                raise _HTTPError(404, "The dataset does not exist, or is not accessible without authentication (private or gated). Please check the spelling of the dataset name or retry with authentication.")
            return self._send_json(h, method, 200, viewer[path](dataset, q))
        raise _HTTPError(404, f"no route for {path}")

    def _get(self, dataset_id: str, h: BaseHTTPRequestHandler) -> FakeDataset:
        dataset = self.datasets.get(dataset_id)
        if dataset is None:
            # as the real Hub: 401 to anonymous callers (it will not say whether a private repo
            # exists), 404 to authenticated ones; both carry X-Error-Code: RepoNotFound
            status = 404 if h.headers.get("Authorization") else 401
            raise _HTTPError(status, "Repository not found", {"X-Error-Code": "RepoNotFound",
                                                              "X-Error-Message": "Repository not found"})
        return dataset

    # -- Hub API ---------------------------------------------------------------------------

    def _list(self, h: BaseHTTPRequestHandler, method: str, q: dict[str, list[str]]) -> None:
        items = list(self.datasets.values())
        for term in q.get("search", []):
            items = [d for d in items if term.lower() in d.id.lower()]
        for author in q.get("author", []):
            items = [d for d in items if d.id.split("/")[0] == author]
        for tag in q.get("filter", []):
            items = [d for d in items if tag in d.tags]
        sort = (q.get("sort") or [None])[0]
        keys = {"downloads": lambda d: d.downloads, "likes": lambda d: d.likes,
                "lastModified": lambda d: d.last_modified, "createdAt": lambda d: d.last_modified,
                "trendingScore": lambda d: d.likes}
        if sort is not None:
            if sort not in keys:
                raise _HTTPError(400, f"Invalid sort parameter {sort!r}")
            items.sort(key=keys[sort], reverse=True)
        limit = int((q.get("limit") or ["0"])[0] or 0)
        page = min(self.page_size, limit) if limit else self.page_size
        cursor = int((q.get("cursor") or ["0"])[0] or 0)
        full = (q.get("full") or ["false"])[0].lower() in ("1", "true")
        expand = q.get("expand") or q.get("expand[]") or None
        if full and expand:
            raise _HTTPError(400, "full and expand are exclusive")
        chunk = items[cursor:cursor + page]
        body = [self._item(d, full=full, expand=expand) for d in chunk]
        headers = {}
        if cursor + page < len(items) and (not limit or cursor + page < limit):
            params = {k: v for k, v in q.items() if k != "cursor"}
            params["cursor"] = [str(cursor + page)]
            headers["Link"] = f'<{self.link_base or self.url}/api/datasets?{urlencode(params, doseq=True)}>; rel="next"'
        self._send_json(h, method, 200, body, headers)

    def _item(self, d: FakeDataset, full: bool, expand: list[str] | None = None) -> dict[str, Any]:
        item = {
            "_id": d.sha[:24], "id": d.id, "author": d.id.split("/")[0], "sha": d.sha,
            "lastModified": d.last_modified, "createdAt": d.last_modified, "private": False,
            "gated": d.gated, "disabled": False, "downloads": d.downloads, "likes": d.likes,
            "tags": list(d.tags), "description": (d.readme or "")[:300], "trendingScore": 0, "key": "",
        }
        if full:
            item["cardData"] = dict(d.card_data)
            item["siblings"] = [{"rfilename": ".gitattributes"}] + ([{"rfilename": "README.md"}] if d.readme is not None else [])
        if expand:
            wanted = set(expand) | {"id", "_id"}
            names = {"cardData": "cardData", "siblings": "siblings"}
            item = {k: v for k, v in item.items() if k in wanted}
            for key in names:
                if key in wanted:
                    item[key] = dict(d.card_data) if key == "cardData" else [{"rfilename": "README.md"}]
        return item

    def _resolve(self, h: BaseHTTPRequestHandler, method: str, path: str) -> None:
        rest = path[len("/datasets/"):]
        repo_part, _, file_part = rest.partition("/resolve/")
        dataset = self._get(repo_part, h)
        revision, _, filename = file_part.partition("/")
        if revision not in ("main", dataset.sha):
            raise _HTTPError(404, "Invalid rev id", {"X-Error-Code": "RevisionNotFound"})
        if filename != "README.md" or dataset.readme is None:
            raise _HTTPError(404, "Entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": dataset.sha})
        body = dataset.readme.encode("utf-8")
        headers = {
            "X-Repo-Commit": dataset.sha,
            "ETag": f'"{hashlib.sha256(body).hexdigest()}"',
            "Content-Type": "text/plain; charset=utf-8",
        }
        self._send(h, method, 200, body, headers)

    # -- dataset viewer --------------------------------------------------------------------

    def _is_valid(self, d: FakeDataset, q: dict) -> dict[str, Any]:
        ok = d.splits is not None
        return {"preview": ok, "viewer": ok, "search": ok, "filter": ok, "statistics": ok}

    def _need_viewer(self, d: FakeDataset) -> list[tuple[str, str, int]]:
        if d.splits is None:
            raise _HTTPError(501, "The dataset viewer is not available for this dataset.")
        return d.splits

    def _splits(self, d: FakeDataset, q: dict) -> dict[str, Any]:
        splits = self._need_viewer(d)
        return {"splits": [{"dataset": d.id, "config": c, "split": s} for c, s, _ in splits], "pending": [], "failed": []}

    def _first_rows(self, d: FakeDataset, q: dict) -> dict[str, Any]:
        splits = self._need_viewer(d)
        config, split = (q.get("config") or [""])[0], (q.get("split") or [""])[0]
        if (config, split) not in {(c, s) for c, s, _ in splits}:
            raise _HTTPError(404, "Not found.")
        features = [{"feature_idx": i, "name": n, "type": t} for i, (n, t) in enumerate(d.features.items())]
        rows = [{"row_idx": i, "row": r, "truncated_cells": []} for i, r in enumerate(d.rows[:100])]
        return {"dataset": d.id, "config": config, "split": split, "features": features, "rows": rows, "truncated": False}

    def _info(self, d: FakeDataset, q: dict) -> dict[str, Any]:
        splits = self._need_viewer(d)
        by_config: dict[str, dict[str, Any]] = {}
        for c, s, n in splits:
            info = by_config.setdefault(c, {"dataset_name": d.id.split("/")[1], "config_name": c,
                                             "features": d.features, "splits": {}})
            info["splits"][s] = {"name": s, "num_bytes": 0, "num_examples": n, "dataset_name": d.id.split("/")[1]}
        config = (q.get("config") or [None])[0]
        if config is not None:
            if config not in by_config:
                raise _HTTPError(404, "Not found.")
            return {"dataset_info": by_config[config], "partial": False, "pending": [], "failed": []}
        return {"dataset_info": by_config, "partial": False, "pending": [], "failed": []}

    def _size(self, d: FakeDataset, q: dict) -> dict[str, Any]:
        splits = self._need_viewer(d)
        total = sum(n for _, _, n in splits) or 1
        configs: dict[str, int] = {}
        for c, _, n in splits:
            configs[c] = configs.get(c, 0) + n
        return {
            "size": {
                "dataset": {"dataset": d.id, "num_bytes_original_files": d.num_bytes, "num_bytes_parquet_files": d.num_bytes,
                            "num_bytes_memory": d.num_bytes, "num_rows": sum(configs.values())},
                "configs": [{"dataset": d.id, "config": c, "num_bytes_original_files": 0, "num_bytes_parquet_files": 0,
                             "num_bytes_memory": 0, "num_rows": n, "num_columns": len(d.features)} for c, n in configs.items()],
                "splits": [{"dataset": d.id, "config": c, "split": s, "num_bytes_parquet_files": d.num_bytes * n // total,
                            "num_bytes_memory": 0, "num_rows": n, "num_columns": len(d.features)} for c, s, n in splits],
            },
            "pending": [], "failed": [], "partial": False,
        }

    # -- wire ------------------------------------------------------------------------------

    def _send_json(self, h: BaseHTTPRequestHandler, method: str, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self._send(h, method, status, json.dumps(payload).encode("utf-8"), {"Content-Type": "application/json", **(headers or {})})

    def _send(self, h: BaseHTTPRequestHandler, method: str, status: int, body: bytes, headers: dict[str, str]) -> None:
        h.send_response(status)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(body)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that hung up (a cancelled agent) is normal here, not a server fault
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}

