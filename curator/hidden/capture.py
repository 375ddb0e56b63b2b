"""The hidden-states stage as one library call: check the inputs, plan the disk for what is left,
then capture with the chosen backend: transformers in this process, or an engine's capture operation
(curator/engines/base.py `Engine.capture`; vLLM's drives servers running `extract_hidden_states`).

`curator hidden-states` and the demo call `capture_hidden_states`; the command only parses flags
and draws progress.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from curator.engines import ENGINES
from curator.engines.base import CaptureJob
from curator.engines.vllm import CAPTURE_SHARED_DIR
from curator.errors import ConfigError
from training.records.chat_tokens import GenerationReadStats, generation_files, iter_generation
from training.capture.prepare import max_positions, store_meta
from training.capture.stats import ExtractStats
from training.capture.plan import ModelShape, data_lengths, load_shape, make_plan, refuse_if_it_will_not_fit
from training.storage.format import StoreMeta
from training.storage.index import read_index
from training.target.config import read_target_config

IN_PROCESS = "transformers"  # the backend that loads the target here; every other is an engine that captures
BACKENDS = (IN_PROCESS, *(name for name, engine in ENGINES.items() if engine.capture is not None))
DTYPES = ("bf16", "fp8")


@dataclass
class CaptureSettings:
    """What one capture run is asked to do (the flags of `curator hidden-states`)."""

    model: str  # local model folder, or the served name with target_dir set (vllm)
    data: Path  # generation output
    out: Path  # the store
    target_dir: Path | None = None  # local folder with config, tokenizer, norm weights
    layer_ids: list[int] | None = None  # layer inputs; None: the default
    dtype: str = "bf16"
    has_final: bool = True
    final_prenorm: bool = False  # also keep the final state before the norm (speculators' layout)
    max_len: int | None = None
    batch_tokens: int = 16384
    backend: str = "transformers"
    endpoints: list[str] = field(default_factory=list)  # an engine backend's servers
    concurrency: int = 8  # engine requests in flight per endpoint
    retries: int = 4  # engine
    path_map: str | None = None  # engine: ENGINE_DIR=LOCAL_DIR
    shared_dir: str = CAPTURE_SHARED_DIR  # engine: the shared folder the engine writes into (what it names)
    check_disk: bool = True

    @property
    def local(self) -> Path | None:
        """Return the local target folder, if there is one."""
        return self.target_dir or (Path(self.model) if Path(self.model).is_dir() else None)


def load_tokenizer(model_dir: Path) -> Any | None:
    """Return the target's tokenizer when `model_dir` holds one, else None."""
    if not model_dir.is_dir() or not any((model_dir / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def capture_op(backend: str) -> Callable[[CaptureJob], ExtractStats] | None:
    """Return the capture operation of the engine a backend names (None: the in-process transformers
    backend); ConfigError for a backend that is neither."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be {' or '.join(BACKENDS)}, not {backend!r}")
    return None if backend == IN_PROCESS else ENGINES[backend].capture


def _check(s: CaptureSettings) -> Path:
    if s.dtype not in DTYPES:
        raise ConfigError(f"--dtype must be bf16 or fp8, not {s.dtype!r}")
    by_engine = capture_op(s.backend) is not None
    if s.local is None:
        if by_engine:  # the server holds the weights; the config and tokenizer are read here
            raise ConfigError(f"{s.model} is not a local directory: pass --target-dir with the target's config "
                              "and tokenizer")
        raise ConfigError(f"--model {s.model}: no such folder (the transformers backend loads the target from its "
                          "local folder: config.json, weights and tokenizer)")
    if by_engine and (s.concurrency < 1 or s.retries < 0):
        raise ConfigError("--concurrency must be at least 1 and --retries at least 0")
    if s.path_map is not None and "=" not in s.path_map:
        raise ConfigError("--path-map takes ENGINE_DIR=LOCAL_DIR")
    generation_files(s.data)
    return s.local


def remaining_samples(
    shape: ModelShape, tokenizer: Any, data: Path, out: Path, done: set[str], meta: StoreMeta, max_len: int | None,
    positions: int | None = None,
) -> int:
    """Raise when the rest of the run will not fit at `out`; return the samples still to capture (those
    longer than the target's `positions` after `max_len` are skipped by the run, and left out here)."""
    left: Iterator[dict[str, Any]] = (r for r in iter_generation(data) if r["id"] not in done)
    lengths, how, _ = data_lengths(left, tokenizer, shape.vocab_size)
    if positions is not None:
        lengths = [n for n in lengths if min(n, max_len or n) <= positions]
    if not lengths:
        return 0
    result = make_plan(shape, lengths=lengths, max_len=max_len, dtype=meta.dtype, n_aux=len(meta.aux_layer_ids),
                       has_final=meta.has_final, has_final_prenorm=meta.has_final_prenorm, out_dir=out, lengths_from=how)
    refuse_if_it_will_not_fit(result)
    return len(lengths)


def capture_hidden_states(
    s: CaptureSettings,
    *,
    read: GenerationReadStats | None = None,
    on_total: Callable[[int | None], None] | None = None,
    on_samples: Callable[[int], None] | None = None,
) -> ExtractStats:
    """Capture the generation output `s.data` into the store `s.out` (resuming it); return the counts.

    `on_total` gets the samples still to capture once the disk is planned (None without the
    check); `on_samples` gets each batch's count as it is stored.
    """
    local = _check(s)
    read = read if read is not None else GenerationReadStats()
    tokenizer = load_tokenizer(local)
    if tokenizer is None:
        raise ConfigError(f"{local} has no tokenizer; the chat template of the target is needed to tokenise")
    config = read_target_config(local)
    meta = store_meta(config, tokenizer, target=s.model, layer_ids=s.layer_ids, dtype=s.dtype,
                      has_final=s.has_final, has_final_prenorm=s.final_prenorm,
                      extra={"backend": s.backend, "max_len": s.max_len})
    done: set[str] = set()
    if (s.out / "meta.json").exists():
        stored, skipped = read_index(s.out)
        done = set(stored) | set(skipped)
    total = remaining_samples(load_shape(local), tokenizer, s.data, s.out, done, meta, s.max_len,
                              max_positions(config)) if s.check_disk else None
    if on_total is not None:
        on_total(total)
    advance = on_samples or (lambda _n: None)
    capture = capture_op(s.backend)
    if capture is None:
        from training.capture.hidden_states import run

        return run(local, s.data, s.out, layer_ids=meta.aux_layer_ids, dtype=s.dtype, has_final=s.has_final,
                   final_prenorm=s.final_prenorm, max_len=s.max_len, batch_tokens=s.batch_tokens, read_stats=read,
                   on_batch=lambda n, _tokens: advance(n))
    mapping: tuple[str, str] | None = None
    if s.path_map:  # ENGINE_DIR=LOCAL_DIR (checked to hold "=" when the settings were read)
        engine_dir, _, local_dir = s.path_map.partition("=")
        mapping = (engine_dir, local_dir)
    return capture(CaptureJob(
        model=s.model, local=local, records=iter_generation(s.data, read), out=s.out, meta=meta, tokenizer=tokenizer,
        endpoints=list(s.endpoints), concurrency=s.concurrency, retries=s.retries, shared_dir=s.shared_dir,
        path_map=mapping, max_len=s.max_len, positions=max_positions(config), on_sample=advance))
