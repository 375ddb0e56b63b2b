"""Engine-fed states: the serving engine captures each sample's hidden states just before the
trainer needs them, so nothing but a bounded window (and, across epochs, an optional cache up to
a disk budget) is ever held.

`EngineStates` is the read side of a store (meta, ids, length, category, tokens, load_many) over a
generation output tokenised up front with the target's tokenizer, as `OnlineStates` is; the
states of each sample come from a `Capture` (one or more engines behind one submit call; the
vLLM client is curator.hidden.engine_feed, which training/ does not import: see docs/engine-fed.md).

The trainer tells the feed its own order (`start`: the rank's samples of each step from the
resume step on, the same `epoch_batches` order a store-fed run reads), and the feed keeps the
captures of the coming steps in flight, up to `window_samples` samples and `window_bytes` bytes
not yet released, always allowing the samples of the next step to train (so a window smaller than
a step slows the run, never stops it). `release(step)` after each optimizer step drops that
step's samples from the window. The captured states live in host memory until their step is
packed; the engine's files are read and removed as the answers come (by the client).

Epochs: with `cache_budget` bytes, the first samples the trainer consumes are also written to a
local cache (one safetensors file per sample, named by the hash of its id) until the budget is
spent, and read from there in later epochs; the others are captured again. Which samples are kept
depends only on the order of consumption, so a resumed run keeps the same ones.

Whatever the engine sends is checked against the sample (token count, widths) before it enters a
batch: a wrong one stops the run (EngineFeedError) rather than training on it.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from training.capture.prepare import OnDemandStates, PreparedSample, prepare_samples, store_meta
from training.capture.stats import ExtractStats
from training.errors import TrainingError
from training.records.chat_tokens import GenerationReadStats, iter_generation
from training.storage.format import HiddenStateSample, StoreMeta, bytes_per_token

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class EngineFeedError(TrainingError):
    """The engines cannot deliver a sample's states (all down, or what they send is wrong): the run
    stops at its last checkpoint and resumes from there."""


def parse_bytes(text: str | int | None) -> int:
    """Return the bytes of "500GB", "8 GiB", "1.5TB" or a plain integer; 0 for empty or "0"."""
    if text is None or text == "":
        return 0
    if isinstance(text, int):
        if text < 0:
            raise TrainingError(f"a byte size must be >= 0, not {text}")
        return text
    s = str(text).strip().lower().replace(" ", "").replace("_", "")
    num = s.rstrip("kmgtib")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        raise TrainingError(f"{text!r} is not a size like 500GB, 8GiB or 1000000") from None
    if unit not in _UNITS or value < 0:
        raise TrainingError(f"{text!r} is not a size like 500GB, 8GiB or 1000000")
    return int(value * _UNITS[unit])


class Capture(Protocol):
    """One or more engines behind one call: capture a sample's states, on another thread."""

    def submit(self, sample: PreparedSample) -> Future[HiddenStateSample]:
        """Start capturing `sample` (its ids as given) and return the future of its states; the
        future fails with EngineFeedError when no engine can deliver them."""
        ...

    def close(self) -> None:
        """Stop, and remove what this client left in the engines' shared folders."""
        ...


CaptureFactory = Callable[[StoreMeta, Path, int], Capture]  # (meta, run dir, rank) -> capture


@dataclass
class FeedStats:
    """What the feed did this session: captures, cache reads, waits, the window's high-water marks."""

    captured: int = 0
    captured_tokens: int = 0  # target prefill spent
    cache_hits: int = 0
    cache_writes: int = 0
    on_demand: int = 0  # samples asked for outside the schedule (held-out evaluation)
    wait_s: float = 0.0  # time the trainer waited for states
    window_high_samples: int = 0
    window_high_bytes: int = 0
    cache_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def sample_bytes(meta: StoreMeta, tokens: int) -> int:
    """Return the bytes one sample of `tokens` takes in the window or the cache (bf16 states, ids and mask)."""
    return tokens * (bytes_per_token(meta.hidden_size, len(meta.aux_layer_ids), "bf16", meta.has_final) + 5)


def as_stored(s: HiddenStateSample) -> HiddenStateSample:
    """Return `s` with its states rounded to bf16 as a store writes them (training.storage.writer), so that
    an engine serving in float32 feeds the draft exactly what a store of its states would."""
    s.aux = s.aux.detach().cpu().to(torch.bfloat16)
    if s.final is not None:
        s.final = s.final.detach().cpu().to(torch.bfloat16)
    return s


def check_sample(got: HiddenStateSample, want: PreparedSample, meta: StoreMeta, tokens: int, where: str) -> None:
    """Raise EngineFeedError unless `got` holds `tokens` positions of `want`'s ids at the store's widths."""
    n_aux, h = len(meta.aux_layer_ids), meta.hidden_size
    problems = []
    if got.id != want.id:
        problems.append(f"it is sample {got.id!r}")
    if got.aux.dim() != 2 or tuple(got.aux.shape) != (tokens, n_aux * h):
        problems.append(f"aux states {tuple(got.aux.shape)}, not ({tokens}, {n_aux * h})")
    if meta.has_final and (got.final is None or tuple(got.final.shape) != (tokens, h)):
        problems.append(f"final states {None if got.final is None else tuple(got.final.shape)}, not ({tokens}, {h})")
    if got.input_ids.shape[0] != tokens or not torch.equal(got.input_ids.long(), want.input_ids[:tokens].long()):
        problems.append("other token ids")
    if problems:
        raise EngineFeedError(f"{where}: the states for sample {want.id!r} are wrong ({'; '.join(problems)}); "
                              "nothing was trained on them")


class SampleCache:
    """Captured samples kept on local disk up to a byte budget, one file per sample.

    Files are named by the sha256 of the sample id, written atomically (a temporary name, then a
    rename), and checked when read; only names of this run's samples are looked at.
    """

    def __init__(self, root: str | Path, budget: int, meta: StoreMeta, ids: list[str]) -> None:
        self.root = Path(root)
        self.budget = budget
        self.meta = meta
        self.root.mkdir(parents=True, exist_ok=True)
        self._names = {sid: self.name(sid) for sid in ids}
        self._kept: dict[str, int] = {}
        present = {p.name: p for p in self.root.iterdir() if p.is_file()}
        for sid, name in self._names.items():
            path = present.get(name)
            if path is not None:
                self._kept[sid] = path.stat().st_size
        for name, path in present.items():  # a write cut by a kill: only our own temporary names
            if name.startswith(".tmp-") and name.endswith(".safetensors"):
                path.unlink(missing_ok=True)
        self.bytes = sum(self._kept.values())

    @staticmethod
    def name(sid: str) -> str:
        return hashlib.sha256(sid.encode("utf-8", "surrogatepass")).hexdigest()[:40] + ".safetensors"

    def __contains__(self, sid: object) -> bool:
        return sid in self._kept

    def put(self, s: HiddenStateSample) -> bool:
        """Keep `s` when its file fits what is left of the budget (its real size, header included);
        return whether it was kept."""
        if self.bytes >= self.budget:
            return False
        tensors = {"input_ids": s.input_ids.contiguous(), "loss_mask": s.loss_mask.contiguous(),
                   "aux": s.aux.contiguous()}
        if s.final is not None:
            tensors["final"] = s.final.contiguous()
        data = save(tensors)
        if self.bytes + len(data) > self.budget:
            return False
        final_path = self.root / self._names[s.id]
        tmp = self.root / f".tmp-{os.getpid()}-{final_path.name}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final_path)
        self._kept[s.id] = len(data)
        self.bytes += len(data)
        return True

    def get(self, want: PreparedSample, tokens: int) -> HiddenStateSample:
        path = self.root / self._names[want.id]
        try:
            t = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise EngineFeedError(f"the cached states {path} of sample {want.id!r} are unreadable ({exc}); "
                                  "remove the file and resume") from exc
        got = HiddenStateSample(want.id, t["input_ids"], t["loss_mask"], t["aux"], t.get("final"), want.category)
        check_sample(got, want, self.meta, tokens, f"cache {path}")
        return got


@dataclass
class _Held:
    step: int
    sid: str
    n_bytes: int
    future: Future[HiddenStateSample] | None  # None: read from the cache at load time


@dataclass
class _Window:
    samples: int = 0
    bytes: int = 0
    per_step: dict[int, list[int]] = field(default_factory=dict)  # step -> [samples, bytes]


class EngineStates(OnDemandStates):
    """The trainer's view of a store whose states the engines capture on demand (see module doc)."""

    def __init__(
        self,
        samples: dict[str, PreparedSample],
        meta: StoreMeta,
        make_capture: Callable[[], Capture],
        *,
        root: str | Path,
        max_length: int,
        window_samples: int = 64,
        window_bytes: int = 0,
        cache: SampleCache | None = None,
    ) -> None:
        if window_samples < 1:
            raise TrainingError("prefetch_samples must be >= 1")
        self.root = Path(root)
        self.meta = meta
        self._samples = samples
        self._make_capture = make_capture
        self._capture_obj: Capture | None = None  # made at the first capture: a run refused in setup starts nothing
        self.max_length = max_length
        self.window_samples = window_samples
        self.window_bytes = window_bytes
        self.cache = cache
        self.stats = FeedStats(cache_bytes=cache.bytes if cache else 0)
        self._cond = threading.Condition()
        self._held: dict[tuple[int, str], _Held] = {}
        self._window = _Window()
        self._released = -1  # every step up to this one is done
        self._error: BaseException | None = None
        self._closed = False
        self._feeder: threading.Thread | None = None

    @classmethod
    def open(cls, target_dir: str | Path, gen_dir: str | Path, capture_factory: CaptureFactory, *, run_dir: Path,
             rank: int, max_length: int, window_samples: int, window_bytes: int, cache_budget: int,
             cache_dir: str | Path | None = None, layer_ids: list[int] | None = None) -> EngineStates:
        """Return engine-fed states of the generation output `gen_dir`, tokenised with the target's
        tokenizer (its config and tokenizer only: the engines hold the weights)."""
        from transformers import AutoTokenizer

        from training.target.config import read_target_config

        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
        meta = store_meta(read_target_config(target_dir), tokenizer, target=str(target_dir), layer_ids=layer_ids,
                          dtype="bf16", has_final=True, extra={"backend": "engine"})
        read, prep = GenerationReadStats(), ExtractStats()
        prepared = prepare_samples(iter_generation(gen_dir, read), tokenizer, prep, done=set(),
                                   vocab_size=meta.vocab_size)
        samples = {s.id: s for s in prepared}
        cache = None
        if cache_budget > 0:
            where = Path(cache_dir) if cache_dir else run_dir / "engine-cache"
            cache = SampleCache(where / f"rank-{rank}", cache_budget, meta, list(samples))
        return cls(samples, meta, lambda: capture_factory(meta, run_dir, rank), root=gen_dir, max_length=max_length, window_samples=window_samples,
                   window_bytes=window_bytes, cache=cache)

    @property
    def _capture(self) -> Capture:
        with self._cond:
            if self._capture_obj is None:
                self._capture_obj = self._make_capture()
            return self._capture_obj

    # the read side of a store (ids, lengths, categories, tokens): OnDemandStates

    def _cut(self, sid: str) -> PreparedSample:
        """Return the sample as the engine is asked for it: at most max_length tokens (the trainer
        cuts there anyway, and a causal target's states of a prefix are the prefix's states)."""
        s = self._samples[sid]
        if s.input_ids.shape[0] <= self.max_length:
            return s
        return PreparedSample(s.id, s.category, s.input_ids[: self.max_length], s.loss_mask[: self.max_length], s.mode)

    def load_many(self, ids: list[str], step: int | None = None) -> list[HiddenStateSample]:
        """Return the samples `ids` (each cut to max_length): with `step`, the feed's captures for
        that step (waited for); without, captured now (held-out evaluation, naming bad samples)."""
        out = []
        for sid in ids:
            want = self._cut(sid)
            tokens = int(want.input_ids.shape[0])
            t0 = time.perf_counter()
            held = self._take(step, sid) if step is not None else None
            if held is None:
                self.stats.on_demand += 1
                got = as_stored(self._wait(self._capture.submit(want), want, scheduled=False))
                check_sample(got, want, self.meta, tokens, "the engine")
            elif held.future is None:
                got = self.cache.get(want, tokens)  # type: ignore[union-attr]
            else:
                got = as_stored(self._wait(held.future, want))
                check_sample(got, want, self.meta, tokens, "the engine")
                if self.cache is not None and sid not in self.cache and self.cache.put(got):
                    self.stats.cache_writes += 1
                    self.stats.cache_bytes = self.cache.bytes
            self.stats.wait_s += time.perf_counter() - t0
            out.append(got)
        return out

    def for_step(self, step: int) -> _StepView:
        """Return this store as `pack_samples` reads it for the scheduled samples of `step`."""
        return _StepView(self, step)

    def _take(self, step: int, sid: str) -> _Held:
        """Return the feed's entry for (step, sid), waiting for the feed to reach it."""
        key = (step, sid)
        with self._cond:
            while key not in self._held:
                if self._error is not None:
                    raise EngineFeedError(f"the feed stopped: {self._error}") from self._error
                if self._closed:
                    raise EngineFeedError("the feed was closed")
                if self._feeder is None or (not self._feeder.is_alive() and key not in self._held):
                    raise EngineFeedError(f"sample {sid!r} is not in the feed's schedule for step {step}")
                self._cond.wait(0.5)
            return self._held.pop(key)

    def _wait(self, future: Future[HiddenStateSample], want: PreparedSample, scheduled: bool = True) -> HiddenStateSample:
        while True:
            if scheduled and self._closed and not future.done():
                raise EngineFeedError("the feed was closed")
            try:
                return future.result(timeout=0.5)
            except TimeoutError:
                continue
            except EngineFeedError:
                raise
            except Exception as exc:  # a client bug must stop the run, named, not hang it
                raise EngineFeedError(f"capturing sample {want.id!r} failed: {exc!r}") from exc

    # ------------------------------------------------------------- the schedule

    def start(self, steps: Iterator[tuple[int, list[str]]]) -> None:
        """Capture the samples of `steps` ((step, this rank's ids in load order), in step order)
        ahead of the trainer, within the window."""
        self._feeder = threading.Thread(target=self._feed, args=(steps,), daemon=True, name="engine-feed")
        self._feeder.start()

    def _room(self, step: int, n_bytes: int) -> bool:
        w = self._window
        if step <= self._released + 1:
            return True  # the next step to train always gets its samples
        if w.samples + 1 > self.window_samples:
            return False
        return not self.window_bytes or w.bytes + n_bytes <= self.window_bytes

    def _feed(self, steps: Iterator[tuple[int, list[str]]]) -> None:
        try:
            for step, ids in steps:
                for sid in ids:
                    want = self._cut(sid)
                    n_bytes = sample_bytes(self.meta, int(want.input_ids.shape[0]))
                    with self._cond:
                        while not self._closed and not self._room(step, n_bytes):
                            self._cond.wait(0.5)
                        if self._closed:
                            return
                        cached = self.cache is not None and sid in self.cache
                        if not cached:
                            w = self._window
                            w.samples += 1
                            w.bytes += n_bytes
                            per = w.per_step.setdefault(step, [0, 0])
                            per[0] += 1
                            per[1] += n_bytes
                            self.stats.window_high_samples = max(self.stats.window_high_samples, w.samples)
                            self.stats.window_high_bytes = max(self.stats.window_high_bytes, w.bytes)
                    if cached:
                        held = _Held(step, sid, n_bytes, None)
                        self.stats.cache_hits += 1
                    else:
                        held = _Held(step, sid, n_bytes, self._capture.submit(want))
                        self.stats.captured += 1
                        self.stats.captured_tokens += int(want.input_ids.shape[0])
                    with self._cond:
                        self._held[(step, sid)] = held
                        self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001  (handed to the trainer's thread by _wait)
            self._error = exc

    def release(self, step: int) -> None:
        """Mark `step` done: its samples leave the window, so the feed may capture further ahead."""
        with self._cond:
            for s in [s for s in self._window.per_step if s <= step]:
                n, b = self._window.per_step.pop(s)
                self._window.samples -= n
                self._window.bytes -= b
            self._released = max(self._released, step)
            self._cond.notify_all()

    def stop_schedule(self) -> None:
        """Stop capturing ahead (a session ends, or fails): captures not yet used are cancelled, a
        load waiting for one fails at once; on-demand captures (the final eval) still work."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            pending = list(self._held.values())
            self._held.clear()
        if self._feeder is not None:
            self._feeder.join(timeout=30)
        for h in pending:
            if h.future is not None:
                h.future.cancel()

    def close(self) -> None:
        """Stop the feed, and let the client clean up after itself (idempotent)."""
        self.stop_schedule()
        with self._cond:
            capture, self._capture_obj = self._capture_obj, None
            self._make_capture = _closed_capture
        if capture is not None:
            capture.close()


def _closed_capture() -> Capture:
    raise EngineFeedError("the engine feed is closed")


class _StepView:
    """EngineStates seen by pack_samples for one step: load_many draws that step's captures."""

    def __init__(self, states: EngineStates, step: int) -> None:
        self.states, self.step = states, step
        self.root, self.meta = states.root, states.meta

    def load_many(self, ids: list[str]) -> list[HiddenStateSample]:
        return self.states.load_many(ids, step=self.step)
