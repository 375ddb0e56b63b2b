"""`generate()`: regenerate every answer of a mix through the target, resumably, with stats.

The run: open the mix (refused unless its manifest says it is whole), check the output directory
(lock, same model, stale temporaries), find what is done (ids in finished shards) and what failed
for good before (errors.jsonl), start the backend (the start-up check), then keep `workers`
conversations going until the mix is exhausted. Finished conversations go to the shard writer;
permanent failures, and answers that cannot be stored (text that is not Unicode), to the errors
file. generation.json ends as `complete` (every row done), `partial` (every row handled, some
failed), `failed` (every row failed) or `incomplete` (rows still missing: run again).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from curator import http
from curator.errors import ConfigError
from curator.engines.sampling import SamplingParams
from curator.generate.client import OpenAIBackend, RequestError, RetryPolicy
from curator.generate.conversation import output_record, regenerate
from curator.generate.local import TransformersBackend
from curator.generate.token_ids import PromptRenderer, TokenMode
from curator.generate.shards import (
    META_FILE,
    ErrorLog,
    OutputLock,
    ShardWriter,
    UnstorableRecord,
    remove_stale_temporaries,
    scan_shards,
    write_json_atomic,
)
from curator.rows.schema import BadRow, Mix, MixRow, first_context, open_mix
from curator.signals import kill_after_sigterm
from training.records.gen_shards import shard_paths

Backend = OpenAIBackend | TransformersBackend


class GenerateConfig(BaseModel):
    """Everything that defines a generation run (the CLI options, validated)."""

    model_config = ConfigDict(extra="forbid")

    mix: Path
    out: Path
    model: str
    endpoints: list[str] = Field(default_factory=list)
    backend: Literal["openai", "transformers"] = "openai"
    # Token-exact generation (docs/generation.md): "sglang" (native /generate with input_ids) or
    # "vllm" (/v1/completions with a token-id prompt and return_token_ids); "chat": text only.
    engine: str = "chat"  # "chat" or a name in curator.engines.ENGINES
    tokenizer: str | None = Field(None, description="the target's tokenizer (default: --model) for token-exact mode")
    concurrency: int = Field(64, ge=1, description="requests in flight per endpoint")
    temperature: float = Field(0.7, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int = Field(4096, ge=1)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    retry_errors: bool = False
    limit: int | None = Field(None, ge=0)
    batch_size: int = Field(16, ge=1)
    device: str | None = None
    seed: int = 0
    shard_rows: int = Field(1000, ge=1)
    shard_seconds: float = Field(30.0, gt=0.0)
    max_attempts: int = Field(8, ge=1)
    retry_base_s: float = Field(0.5, ge=0.0)
    request_timeout_s: float = Field(1800.0, gt=0.0, description="deadline of one whole request, answer included")
    max_answer_bytes: int = Field(http.DEFAULT_MAX_ANSWER_BYTES, ge=1024, description="largest answer read")
    # A row that offers tools the target's template does not render: generated and marked
    # `tools_dropped` (the default), or refused as a row error (retried with --retry-errors).
    refuse_dropped_tools: bool = False

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        # the registered engines, so that a third engine needs no change here
        from curator.engines import ENGINES

        if value != "chat" and value not in ENGINES:
            raise ValueError(f"engine {value!r} is none of chat, {', '.join(ENGINES)}")
        return value


# Settings that change the answers; endpoints, concurrency, retries, timeouts and shard sizes do not.
OUTPUT_SETTINGS = ("model", "backend", "engine", "tokenizer", "temperature", "top_p", "max_tokens", "extra_body", "seed")


@dataclass
class Snapshot:
    """The live view of a run, for progress displays."""

    total: int
    done: int
    generated: int
    errors: int
    in_flight: dict[str, int]
    requests_per_s: float
    output_tokens_per_s: float
    elapsed_s: float


@dataclass
class GenerationStats:
    """What a run did; also written to generation.json and the catalog."""

    run_id: str
    model: str
    backend: str
    endpoints: list[str]
    mix_rows: int = 0
    duplicate_ids_in_mix: int = 0
    already_done: int = 0
    skipped_errors: int = 0
    generated: int = 0
    kept: int = 0
    malformed: int = 0
    errors: int = 0
    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_length: int = 0
    tools_dropped: int = 0  # rows whose tools the target's chat template does not render (see docs/generation.md)
    wall_s: float = 0.0
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    done_total: int = 0
    errors_total: int = 0
    missing: int = 0
    status: str = "running"
    requests_by_endpoint: dict[str, int] = field(default_factory=dict)
    errors_by_endpoint: dict[str, int] = field(default_factory=dict)
    shards_written: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Return the stats as plain JSON-able data."""
        return asdict(self)


def make_backend(config: GenerateConfig) -> Backend:
    """Return the backend the config asks for (not started)."""
    params = SamplingParams(config.temperature, config.top_p, config.max_tokens, dict(config.extra_body))
    if config.backend == "transformers":
        return TransformersBackend(config.model, params, batch_size=config.batch_size, device=config.device,
                                   seed=config.seed)
    retry = RetryPolicy(max_attempts=config.max_attempts, base_delay_s=config.retry_base_s)
    return OpenAIBackend(config.endpoints, config.model, params, concurrency=config.concurrency, retry=retry,
                         timeout_s=config.request_timeout_s, max_answer_bytes=config.max_answer_bytes,
                         tokens=token_mode(config, params))


def token_mode(config: GenerateConfig, params: SamplingParams) -> TokenMode | None:
    """Return the token-exact request builder the config asks for (None: chat completions, text only)."""
    if config.engine == "chat":
        return None
    from transformers import AutoTokenizer

    source = config.tokenizer or config.model
    if _names_a_folder(source) and not Path(source).expanduser().is_dir():
        flag = "--tokenizer" if config.tokenizer else "--model"
        raise ConfigError(f"{flag} {source}: no such folder (give the target's model folder, or its Hub id)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the target's tokenizer from {source!r} for token-exact generation "
                          f"(pass --tokenizer PATH): {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"the tokenizer at {source!r} has no chat template; token-exact generation renders with it")
    kwargs = params.extra_body.get("chat_template_kwargs") if isinstance(params.extra_body, dict) else None
    renderer = PromptRenderer(tokenizer, kwargs if isinstance(kwargs, dict) else None)
    return TokenMode(renderer, config.engine, config.model, params)


def prompt_renderer(backend: Backend) -> PromptRenderer | None:
    """Return the renderer a backend makes its prompts with (None: the server renders them)."""
    if isinstance(backend, TransformersBackend):
        return backend.renderer
    return backend.tokens.renderer if isinstance(backend.tokens, TokenMode) else None


def _names_a_folder(source: str) -> bool:
    """Return whether `source` is written as a path, not a Hub id (`owner/name`)."""
    return source.startswith(("/", ".", "~")) or source.count("/") > 1 or Path(source).exists()


def generate(config: GenerateConfig, on_progress: Callable[[Snapshot], None] | None = None) -> GenerationStats:
    """Return the stats of a run that regenerates every missing answer of `config.mix` into
    `config.out` (resuming whatever an earlier run left). SIGTERM ends it as Ctrl-C does: the
    buffered rows are written, generation.json says `interrupted`, KeyboardInterrupt is raised; a
    process still busy `curator.signals.GRACE_S` seconds after SIGTERM is killed (a worker thread in a
    long model call would otherwise hold asyncio.run until it returns)."""

    async def until_sigterm(arm: Callable[[], None]) -> GenerationStats:
        # aio.cancel_on_sigterm's cancel, plus the watchdog: asyncio.run waits for the worker thread of
        # the transformers backend, which may be inside a minutes-long generate call.
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        if task is None:
            return await generate_async(config, on_progress)

        def stop() -> None:
            arm()
            task.cancel()

        try:
            loop.add_signal_handler(signal.SIGTERM, stop)
        except (ValueError, RuntimeError, NotImplementedError):  # off the main thread: the caller's signals
            return await generate_async(config, on_progress)
        try:
            return await generate_async(config, on_progress)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    with kill_after_sigterm() as arm:
        try:
            return asyncio.run(until_sigterm(arm))
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None


async def generate_async(config: GenerateConfig, on_progress: Callable[[Snapshot], None] | None = None) -> GenerationStats:
    """Return the stats of a run (the async body of `generate`)."""
    if config.backend == "openai" and not config.endpoints:
        raise ConfigError("no --endpoint given (the openai backend needs at least one server URL)")
    mix = open_mix(config.mix)  # before anything is created: an unfinished mix is refused
    out = Path(config.out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return await _generate_into(config, mix, out, on_progress)
    except BaseException:
        # a run refused before its first request (a server down, a bad tokenizer) leaves no empty folder
        if created and not (out / META_FILE).exists():
            shutil.rmtree(out, ignore_errors=True)
        raise


async def _generate_into(config: GenerateConfig, mix: Mix, out: Path,
                         on_progress: Callable[[Snapshot], None] | None) -> GenerationStats:
    with OutputLock(out):
        backend = make_backend(config)
        try:
            run = _Run(config, backend, mix)
            run.prepare()
            await backend.start()
            run.write_meta("running")
            try:
                await run.execute(on_progress)
            except BaseException:
                run.write_meta("interrupted")
                raise
            return run.finish()
        finally:
            await backend.aclose()


class _Run:
    """One generation run over one output directory (holds the mutable state of the run)."""

    def __init__(self, config: GenerateConfig, backend: Backend, mix: Mix) -> None:
        self.config = config
        self.backend = backend
        self.mix = mix
        self.out = Path(config.out)
        endpoints = list(backend.in_flight())
        self.stats = GenerationStats(
            run_id=f"gen-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}",
            model=config.model, backend=config.backend, endpoints=endpoints,
        )
        self.errors = ErrorLog(self.out)
        self.skip: set[str] = set()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.t0 = 0.0

    # ---- before -----------------------------------------------------------------------------

    def prepare(self) -> None:
        """Check the output directory's shards come from this model; find done and failed ids."""
        meta_path = self.out / META_FILE
        if meta_path.exists() and shard_paths(self.out):
            try:
                previous = json.loads(meta_path.read_text())
            except ValueError:
                previous = {}
            if previous.get("model") not in (None, self.config.model):
                raise ConfigError(
                    f"{self.out} holds generations of {previous['model']!r}, not {self.config.model!r}; "
                    "use another --out (mixing targets would teach the draft two distributions)"
                )
            before, now = previous.get("fingerprint") or {}, self.fingerprint()
            changed = [f"{k}: {before[k]!r} -> {now[k]!r}" for k in now if k in before and before[k] != now[k]]
            if changed:
                raise ConfigError(
                    f"{self.out} was generated with other settings ({'; '.join(changed)}); resuming would mix two "
                    "sampling distributions in one data set: use another --out, or the same settings"
                )
        remove_stale_temporaries(self.out)
        scan = scan_shards(self.out)
        self.writer = ShardWriter(self.out, scan.next_index, max_rows=self.config.shard_rows,
                                  max_age_s=self.config.shard_seconds)
        self.errors.load()
        self.errors.compact(scan.done_ids)
        ids = self.mix.ids(self.config.limit)
        unique = set(ids)
        self.stats.mix_rows = len(unique)
        self.stats.duplicate_ids_in_mix = len(ids) - len(unique)
        self.stats.already_done = len(unique & scan.done_ids)
        self.skip = set(scan.done_ids)
        if not self.config.retry_errors:
            # Permanent failures stay failed until --retry-errors; transient ones that ran out
            # of attempts (a server down for a while) are simply tried again.
            permanent = {i for i, r in self.errors.records.items() if r.get("permanent", True)}
            self.stats.skipped_errors = len((permanent - self.skip) & unique)
            self.skip |= permanent
        self.todo = len(unique - self.skip)

    def fingerprint(self) -> dict[str, Any]:
        """Return every setting that changes what the target answers (a resume must keep them all)."""
        cfg = self.config.model_dump(mode="json")
        parts = [p.get("sha256") for p in self.mix.manifest.get("parts", []) if isinstance(p, dict)]
        return {**{k: cfg[k] for k in OUTPUT_SETTINGS if k in cfg},
                "mix_parts_sha256": hashlib.sha256(json.dumps(parts).encode()).hexdigest()}

    def write_meta(self, status: str) -> None:
        """Write generation.json: config, sampling, status and the stats so far."""
        self.stats.status = status
        cfg = self.config.model_dump(mode="json")
        cfg["endpoints"] = [http.public_url(e) for e in cfg["endpoints"]]  # user:password is never recorded
        write_json_atomic(self.out / META_FILE, {
            "run_id": self.stats.run_id,
            "status": status,
            "failed_rows": self.stats.errors_total,
            "model": self.config.model,
            "backend": self.config.backend,
            "endpoints": self.stats.endpoints,
            "mix": str(Path(self.config.mix).resolve()),
            "sampling": {k: cfg[k] for k in ("temperature", "top_p", "max_tokens", "extra_body")},
            "config": cfg,
            "fingerprint": self.fingerprint(),
            "started_at": self.started_at,
            "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "stats": self.stats.as_dict(),
        })

    # ---- during -----------------------------------------------------------------------------

    async def execute(self, on_progress: Callable[[Snapshot], None] | None) -> None:
        """Run `backend.workers` conversations at a time until every pending row is handled;
        flush the shards (also when cancelled) and keep progress ticking."""
        self.t0 = time.perf_counter()
        rows = self._pending_rows()
        ticker = asyncio.create_task(self._tick(on_progress))
        try:
            await asyncio.gather(*(self._worker(rows) for _ in range(self.backend.workers)))
        finally:
            ticker.cancel()
            self.writer.flush()
            self.errors.close()
            self.stats.wall_s = time.perf_counter() - self.t0
            if on_progress is not None:
                on_progress(self.snapshot())

    def _pending_rows(self) -> Iterator[MixRow | BadRow]:
        seen: set[str] = set()
        for row in self.mix.rows(self.config.limit):
            if row.id in self.skip or row.id in seen:
                continue
            seen.add(row.id)
            yield row

    async def _worker(self, rows: Iterator[MixRow | BadRow]) -> None:
        # Workers share one iterator; taking the next row never awaits, so no row is taken twice.
        for row in rows:
            if isinstance(row, BadRow):
                self._fail(row.id, f"malformed mix row: {row.reason}", status="malformed", permanent=True)
                self.stats.malformed += 1
                continue
            dropped = self._drops_tools(row)
            if dropped:
                self.stats.tools_dropped += 1
                if self.config.refuse_dropped_tools:
                    self._fail(row.id, f"the target's chat template does not render the row's {len(row.tools or [])} "
                               "tools (the prompt would hold no tool definition)", status="tools_dropped",
                               permanent=True, source=row.source)
                    continue
            try:
                result = await regenerate(row, self.backend.complete)
            except RequestError as exc:
                self._fail(row.id, str(exc), status=exc.status, permanent=exc.permanent,
                           endpoint=exc.endpoint, attempts=exc.attempts, source=row.source)
                continue
            kwargs = self.config.extra_body.get("chat_template_kwargs")
            try:
                self.writer.add(output_record(row, result, self.config.model,
                                              kwargs if isinstance(kwargs, dict) else None, tools_dropped=dropped))
            except UnstorableRecord as exc:
                # At temperature 0 the same answer comes back on every run: record it, do not retry it.
                self._fail(row.id, f"answer cannot be stored: {exc}", status="unstorable", permanent=True,
                           source=row.source)
                continue
            if row.keep_responses:
                self.stats.kept += 1
            else:
                self.stats.generated += 1
                self.stats.prompt_tokens += result.prompt_tokens
                self.stats.completion_tokens += result.completion_tokens
                self.stats.finish_length += sum(1 for f in result.finish_reasons if f == "length")

    def _drops_tools(self, row: MixRow) -> bool:
        """Return whether the target's chat template ignores the tools `row` offers (the prompt rendered
        with them equals the one without). Known only where generate renders the prompt itself (token
        mode, the transformers backend); a chat-completions server renders it out of sight."""
        if not row.tools or row.keep_responses:
            return False
        renderer = prompt_renderer(self.backend)
        # the first prompt the target gets: later source turns may answer calls it has not made yet
        return bool(renderer is not None and renderer.drops_tools(first_context(row), row.tools))

    def _fail(self, row_id: str, error: str, *, status: int | str | None, permanent: bool, **extra: Any) -> None:
        self.stats.errors += 1
        self.errors.add({"id": row_id, "error": error, "status": status, "permanent": permanent,
                         "run_id": self.stats.run_id, **extra})

    async def _tick(self, on_progress: Callable[[Snapshot], None] | None) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.writer.flush_if_due()
            if on_progress is not None:
                on_progress(self.snapshot())

    def snapshot(self) -> Snapshot:
        """Return the live numbers of the run."""
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        requests = sum(self.backend.requests_by_endpoint().values())
        return Snapshot(
            total=self.todo,
            done=self.stats.generated + self.stats.kept + self.stats.errors,
            generated=self.stats.generated + self.stats.kept,
            errors=self.stats.errors,
            in_flight=self.backend.in_flight(),
            requests_per_s=requests / elapsed,
            output_tokens_per_s=self.stats.completion_tokens / elapsed,
            elapsed_s=elapsed,
        )

    # ---- after ------------------------------------------------------------------------------

    def finish(self) -> GenerationStats:
        """Compact the errors file, count what the directory now holds, write generation.json
        with the run's status (see `run_status`); return the stats."""
        stats = self.stats
        stats.requests_by_endpoint = self.backend.requests_by_endpoint()
        stats.errors_by_endpoint = dict(self.backend.errors_by_endpoint)
        stats.requests = sum(stats.requests_by_endpoint.values())
        stats.retries = self.backend.retries
        stats.shards_written = self.writer.shards_written
        stats.requests_per_s = stats.requests / stats.wall_s if stats.wall_s else 0.0
        stats.output_tokens_per_s = stats.completion_tokens / stats.wall_s if stats.wall_s else 0.0
        # Counted from the directory, not from memory: the figures are what a resumed run or the
        # next stage will find (a second read of the shards, once, at the end of a long run).
        done = scan_shards(self.out).done_ids
        self.errors.load()
        self.errors.compact(done)
        ids = set(self.mix.ids(self.config.limit))
        stats.done_total = len(ids & done)
        stats.errors_total = len((ids - done) & set(self.errors.records))
        stats.missing = len(ids) - stats.done_total - stats.errors_total
        stats.status = run_status(stats.done_total, stats.errors_total, stats.missing)
        self.write_meta(stats.status)
        return stats


def run_status(done: int, failed: int, missing: int) -> str:
    """Return what a finished run's output is: complete (every row done), partial (every row handled,
    `failed` of them failed), failed (every row failed) or incomplete (rows still to do)."""
    if missing:
        return "incomplete"
    if failed and not done:
        return "failed"
    return "partial" if failed else "complete"
