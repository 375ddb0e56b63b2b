"""The vLLM side of engine-fed training: `curator train engine=URL[,URL...]` draws each sample's
hidden states from vLLM servers running `extract_hidden_states` as the trainer needs them.

training/ imports no curator code (it must run on a bare GPU node), so the trainer takes the client
as a factory (training.feed.engine.CaptureFactory) and this module is it. The HTTP and file side is
curator.engines.vllm_capture's VllmExtractor, the client `curator hidden-states --backend vllm` uses (the
same request, the same checks of the engine's answer and file, the same wait for the engine's
lock); this module adds what training needs on top:

- several engines kept busy, least-loaded first (each sample goes to the live engine with the
  fewest requests in flight, up to `concurrency` each), as `curator generate` spreads its requests;
- an engine that fails a sample after its retries, or sends a file of the wrong shape, layer count
  or token ids, is taken out of the run by name, and the sample goes to another engine; with none
  left the trainer stops (EngineFeedError) at its last finished step, resumable;
- request ids of our own (`X-Request-Id: curator-<session>-<n>`, which vLLM turns into the file
  name `cmpl-<id>-<prompt index>-<8 hex>.safetensors`); an answer that names any other file is
  refused, and the ids still in flight are kept in a journal in the run directory, so that what a
  killed run left in the shared folder is found by those names alone and removed on resume (and
  at the end of each session). Nothing else in the shared folder is ever read or removed.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import fcntl
import json
import os
import re
import secrets
import stat
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from curator import http
from curator.engines.vllm import CAPTURE_SHARED_DIR
from curator.engines.vllm_capture import VllmExtractor, VllmOptions, api_key_from_env, load_final_norm
from training.capture.prepare import PreparedSample
from training.feed.engine import CaptureFactory, EngineFeedError
from training.io.atomic import write_text
from training.storage.format import HiddenStateSample, StoreMeta
from training.train.config import TrainConfig

REQUEST_ID = contextvars.ContextVar[str | None]("curator_engine_request_id", default=None)
ID_PREFIX = "curator-"
# vLLM 0.32: completion id "cmpl-<X-Request-Id>", one request per prompt "-<i>", made unique inside
# the engine with "-<8 hex>" (vllm/v1/engine/input_processor.py); the connector names the file after it.
_FILE = re.compile(r"^cmpl-(?P<rid>curator-[0-9a-f]{8}-[0-9]+)(?:-[0-9]+)?(?:-[0-9a-f]{8})?\.safetensors(?P<lock>\.lock)?$")
SWEEP_LOCK_WAIT_S = 5.0  # at close: how long a file the engine is still writing is waited for


def file_request_id(name: str) -> str | None:
    """Return the request id a shared-folder file name belongs to, when it is one of ours."""
    m = _FILE.match(name)
    return m.group("rid") if m else None


class RequestJournal:
    """The request ids this rank has sent whose files may still be in the shared folder.

    Written atomically at every change, so that after a SIGKILL the next session knows exactly
    which names to look for (and nothing else is touched)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pending: set[str] = set()
        self._lock = threading.Lock()
        if path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                self.pending = {r for r in data.get("pending", []) if isinstance(r, str) and r.startswith(ID_PREFIX)}
            except (ValueError, AttributeError):
                self.pending = set()  # a journal cut by a kill (atomic writes make this a foreign file): start clean

    def _write(self) -> None:
        write_text(self.path, json.dumps({"pending": sorted(self.pending)}), fsync=True)

    def add(self, rid: str) -> None:
        with self._lock:
            self.pending.add(rid)
            self._write()

    def discard(self, rids: set[str]) -> None:
        with self._lock:
            if rids & self.pending:
                self.pending -= rids
                self._write()


def sweep(shared: Path, rids: set[str], lock_wait_s: float = 0.0) -> set[str]:
    """Remove the files (and locks) of requests `rids` from the shared folder: plain files whose
    names are those requests', nothing else, and a file only once its writer let go of its lock.
    Return the ids whose files are all gone."""
    if not rids or not shared.is_dir():
        return set(rids)
    busy: set[str] = set()
    entries = sorted(os.scandir(shared), key=lambda e: e.name.endswith(".lock"))  # files before their locks
    for entry in entries:
        rid = file_request_id(entry.name)
        if rid is None or rid not in rids:
            continue
        try:
            if not stat.S_ISREG(os.lstat(entry.path).st_mode):
                continue  # a symlink or anything but a plain file is never followed or removed
        except FileNotFoundError:
            continue
        if not entry.name.endswith(".lock") and not _writer_done(Path(entry.path + ".lock"), lock_wait_s):
            busy.add(rid)
            continue
        if entry.name.endswith(".lock") and rid in busy:
            continue
        Path(entry.path).unlink(missing_ok=True)
    return set(rids) - busy


def _writer_done(lock: Path, wait_s: float) -> bool:
    """Return whether the engine's writer has released `lock` (or made none), waiting up to `wait_s`."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, OSError):
        return True
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)
    finally:
        os.close(fd)


class ForeignFileError(Exception):
    """The engine named a file that is not the one of the request sent: nothing is read or removed."""


class _NamedExtractor(VllmExtractor):
    """VllmExtractor that accepts only the file named after the request id it sent."""

    def engine_file(self, engine_path: str) -> Path:
        path = super().engine_file(engine_path)
        rid = REQUEST_ID.get()
        if rid is not None and file_request_id(path.name) != rid:
            raise ForeignFileError(
                f"the engine named {path.name!r} as the file of request {rid}, which is not the name vLLM gives it "
                f"(cmpl-{rid}-<n>-<8 hex>.safetensors); nothing was read or removed. Is the shared folder "
                "shared with another engine or run?")
        return path


@dataclass
class _Engine:
    url: str
    in_flight: int = 0
    down: str | None = None  # why it was taken out of the run
    served: int = 0


@dataclass
class CaptureCounters:
    requests: int = 0
    failovers: int = 0
    per_engine: dict[str, int] = field(default_factory=dict)


class VllmCapture:
    """training.feed.engine.Capture over vLLM engines (see module doc); its own event loop thread."""

    def __init__(self, opts: VllmOptions, meta: StoreMeta, norm: Any, journal: Path) -> None:
        try:
            roots, auth = http.endpoint_roots(opts.endpoints)
        except ValueError as exc:
            raise EngineFeedError(f"engine {exc}") from exc
        if not roots:
            raise EngineFeedError("engine= names no endpoint URL")
        self.opts = dataclasses.replace(opts, endpoints=roots, auth=auth)
        self.extractor = _NamedExtractor(self.opts, meta, norm)
        self.engines = [_Engine(u) for u in roots]
        self.counters = CaptureCounters()
        self.journal = RequestJournal(journal)
        self._session = secrets.token_hex(4)
        self._seq = 0
        self._stale: set[str] = set()  # sent, failed or cancelled: their files may still come
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="engine-capture")
        self._thread.start()
        self._closed = False
        # what a killed session left: found by the journal's names, removed before anything is sent
        self._stale |= self.journal.pending
        self.journal.discard(sweep(self.extractor.shared, set(self.journal.pending)))
        self._call(self._open())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _open(self) -> None:
        limits = httpx.Limits(max_connections=self.opts.concurrency * len(self.engines) + 4)

        async def name_request(request: httpx.Request) -> None:
            rid = REQUEST_ID.get()
            if rid is not None:
                request.headers["X-Request-Id"] = rid

        self._client = httpx.AsyncClient(timeout=http.timeout(self.opts.timeout_s), limits=limits,
                                         headers=http.bearer(self.opts.api_key),
                                         event_hooks={"request": [name_request]})
        self._free = asyncio.Condition()
        for e in self.engines:
            try:
                resp = await self._client.get(f"{e.url}/v1/models", auth=self.opts.auth_for(e.url))
                resp.raise_for_status()
                served = [m.get("id") for m in resp.json().get("data", [])]
            except (httpx.HTTPError, ValueError) as exc:
                e.down = f"not answering /v1/models ({type(exc).__name__})"
                continue
            if self.opts.model not in served:
                e.down = f"serves {served}, not {self.opts.model!r} (set engine_model to the served name)"
        self._check_some_up()

    def _check_some_up(self) -> None:
        if all(e.down for e in self.engines):
            reasons = "; ".join(f"{http.public_url(e.url)}: {e.down}" for e in self.engines)
            raise EngineFeedError(f"no engine can capture hidden states ({reasons}); the run stops at its last "
                                  "finished step: fix or restart the engines and --resume")

    # ------------------------------------------------------------- Capture

    def submit(self, sample: PreparedSample) -> Future[HiddenStateSample]:
        if self._closed:
            raise EngineFeedError("the engine client is closed")
        return asyncio.run_coroutine_threadsafe(self._capture(sample), self._loop)

    async def _pick(self) -> _Engine:
        async with self._free:
            while True:
                self._check_some_up()
                live = [e for e in self.engines if not e.down and e.in_flight < self.opts.concurrency]
                if live:
                    best = min(live, key=lambda e: e.in_flight)  # least loaded; the first among equals
                    best.in_flight += 1
                    return best
                await self._free.wait()

    async def _done(self, e: _Engine) -> None:
        async with self._free:
            e.in_flight -= 1
            self._free.notify_all()

    async def _capture(self, s: PreparedSample) -> HiddenStateSample:
        while True:
            e = await self._pick()
            self._seq += 1
            rid = f"{ID_PREFIX}{self._session}-{self._seq}"
            self.journal.add(rid)
            token = REQUEST_ID.set(rid)
            ok = False
            try:
                self.counters.requests += 1
                sample = await self.extractor.request(self._client, e.url, s)
                ok = True
                e.served += 1
                self.counters.per_engine[e.url] = e.served
                return sample
            except Exception as exc:  # noqa: BLE001  (every engine fault: EndpointError, a wrong file, a foreign name)
                # after its retries, or a wrong answer: this engine is out of the run, the sample goes elsewhere
                e.down = str(exc) or type(exc).__name__
                self.counters.failovers += 1
            finally:
                REQUEST_ID.reset(token)
                await self._done(e)
                if ok:
                    self.journal.discard({rid})  # its file was read and removed
                else:
                    self._stale.add(rid)  # its file may come later: swept by name

    def close(self) -> None:
        """Cancel what is in flight, remove the files of our requests from the shared folder, stop."""
        if self._closed:
            return
        self._closed = True

        async def stop() -> None:
            tasks = [t for t in asyncio.all_tasks(self._loop) if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._client.aclose()

        try:
            self._call(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        pending = self._stale | self.journal.pending
        self.journal.discard(sweep(self.extractor.shared, pending, lock_wait_s=SWEEP_LOCK_WAIT_S))


def _path_map(text: str) -> tuple[str, str] | None:
    if not text:
        return None
    engine, sep, local = text.partition("=")
    if not sep or not engine or not local:
        raise EngineFeedError(f"engine_path_map must be ENGINE_DIR=LOCAL_DIR, not {text!r}")
    return engine, local


@dataclass(frozen=True)
class VllmCaptureFactory:
    """The factory the trainer calls (per rank) to reach the engines a run's config names; a plain
    dataclass, so that it crosses to spawned ranks (training.train.trainer.train_local_ranks)."""

    cfg: dict[str, Any]

    def __call__(self, meta: StoreMeta, run_dir: Path, rank: int) -> VllmCapture:
        cfg = TrainConfig.from_dict(self.cfg)
        opts = VllmOptions(
            endpoints=[u.strip() for u in cfg.engine.split(",") if u.strip()],
            model=cfg.engine_model or cfg.target,
            shared_dir=cfg.engine_shared_dir or CAPTURE_SHARED_DIR,
            concurrency=cfg.engine_concurrency,
            retries=cfg.engine_retries,
            timeout_s=cfg.engine_timeout_s,
            path_map=_path_map(cfg.engine_path_map),
            api_key=api_key_from_env(),
        )
        norm = load_final_norm(cfg.target) if meta.has_final else None  # one tensor, not the target
        return VllmCapture(opts, meta, norm, run_dir / "engine" / f"requests-rank-{rank}.json")


def capture_factory(cfg: TrainConfig) -> CaptureFactory:
    """Return the factory the trainer calls (per rank) to reach the engines `cfg.engine` names."""
    return VllmCaptureFactory(cfg.to_dict())
