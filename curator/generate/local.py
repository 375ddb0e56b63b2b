"""The in-process backend: a transformers causal LM answering chat requests in batches.

For small targets, the demo and a GPU box without a server. It offers the same `complete()` as
the OpenAI backend, so the turn policy, shards and resume are shared: conversations run as
`batch_size` concurrent workers, and their pending requests are gathered into one left-padded
`generate` call (run on a worker thread, so progress keeps updating). Prompts are rendered and
tokenised as a server would (tools included) and every answer keeps its prompt ids and the ids the
model produced (end token included), so its records are token-exact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curator.errors import EndpointError
from curator.engines.sampling import SamplingParams
from curator.generate.client import Completion, RequestError
from curator.generate.token_ids import PromptRenderer, parse_answer

Conversation = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]  # (messages, tools offered)


@dataclass
class _Pending:
    messages: list[dict[str, Any]]
    future: asyncio.Future[Completion]
    tools: list[dict[str, Any]] | None = None


def pick_device(device: str | None = None) -> str:
    """Return `device`, or the best one present: cuda, then mps, then cpu."""
    import torch

    if device:
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def sampling_kwargs(params: SamplingParams, generation_config: Any) -> dict[str, Any]:
    """Return `generate()`'s sampling arguments, with what a server would use for the unset ones.

    SGLang and vLLM take top-p and top-k left unset from the model's generation_config.json, and
    sample from the whole vocabulary when it sets none. transformers would instead fill in its own
    top_k=50, so top_k and top_p are always passed: the answers then follow the law that
    `curator eval --temperature` and a server verify with.
    """
    if params.temperature <= 0:
        return {"do_sample": False}
    top_k = getattr(generation_config, "top_k", None) if generation_config is not None else None
    top_p = params.top_p if params.top_p is not None else getattr(generation_config, "top_p", None)
    return {"do_sample": True, "temperature": params.temperature,
            "top_k": int(top_k) if top_k and top_k > 0 else 0, "top_p": float(top_p) if top_p is not None else 1.0}


class TransformersBackend:
    """Batched greedy or sampled generation with a local model, stopping at end of turn."""

    def __init__(
        self,
        model_path: str | Path,
        params: SamplingParams,
        *,
        batch_size: int = 16,
        device: str | None = None,
        seed: int = 0,
    ) -> None:
        if batch_size < 1:
            raise EndpointError(f"--batch-size must be at least 1, not {batch_size}")
        self.model_path = str(model_path)
        self.params = params
        self.batch_size = batch_size
        self.device = pick_device(device)
        self.seed = seed
        self.name = f"transformers:{self.device}"
        self.retries = 0
        self.errors_by_endpoint = {self.name: 0}
        self._requests = 0
        self._queue: list[_Pending] = []
        self._running = 0
        self._wake: asyncio.Event | None = None
        self._batcher: asyncio.Task[None] | None = None
        self.model: Any = None
        self.tokenizer: Any = None

    @property
    def workers(self) -> int:
        """Return how many conversations run at once: enough to fill a batch."""
        return self.batch_size

    def in_flight(self) -> dict[str, int]:
        """Return the requests queued or being generated."""
        return {self.name: len(self._queue) + self._running}

    def requests_by_endpoint(self) -> dict[str, int]:
        """Return how many requests were answered or failed."""
        return {self.name: self._requests}

    @property
    def renderer(self) -> PromptRenderer | None:
        """Return the renderer of the target's prompts (None before `start`)."""
        return getattr(self, "_tokens", None)

    async def start(self) -> None:
        """Load the model and tokenizer (raise EndpointError in one line when they do not
        load or have no chat template) and start the batcher."""
        await asyncio.to_thread(self._load)
        self._wake = asyncio.Event()
        self._batcher = asyncio.create_task(self._batch_loop(), name="transformers-batcher")

    async def aclose(self) -> None:
        """Stop the batcher."""
        if self._batcher is not None:
            self._batcher.cancel()
            try:
                await self._batcher
            except asyncio.CancelledError:
                pass
            self._batcher = None

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from curator.ui import quiet_library_progress

        quiet_library_progress()  # transformers' "Loading weights" bar would break generate's own progress line
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
            model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EndpointError(f"cannot load model {self.model_path!r} with transformers: {first}") from exc
        if not getattr(tokenizer, "chat_template", None):
            raise EndpointError(f"tokenizer of {self.model_path!r} has no chat template; a chat target needs one")
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        torch.manual_seed(self.seed)
        # transformers types `to` through a decorator whose signature mypy misreads (it wants the model twice)
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]
        self.tokenizer = tokenizer
        chat_kwargs = self.params.extra_body.get("chat_template_kwargs") if isinstance(self.params.extra_body, dict) else None
        self._tokens = PromptRenderer(tokenizer, chat_kwargs if isinstance(chat_kwargs, dict) else None)
        eos = {tokenizer.eos_token_id}
        configured = getattr(model.generation_config, "eos_token_id", None)
        eos.update(configured if isinstance(configured, list) else [configured])
        self._eos_ids = sorted(i for i in eos if i is not None)
        self._max_positions = getattr(model.config, "max_position_embeddings", None)

    async def complete(self, messages: Sequence[Mapping[str, Any]], prefer: str | None = None,
                       tools: list[dict[str, Any]] | None = None) -> Completion:
        """Return the model's answer to `messages` with `tools` offered (queued into the next batch)."""
        if self._wake is None:
            raise EndpointError("the transformers backend was used before start()")
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending([dict(m) for m in messages], future, tools))
        self._wake.set()
        return await future

    async def _batch_loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Conversations woken by the last batch queue their next turn within a few loop
            # ticks; wait until the queue stops growing so batches stay full.
            size, idle = len(self._queue), 0
            while len(self._queue) < self.batch_size and idle < 2:
                await asyncio.sleep(0)
                idle = idle + 1 if len(self._queue) == size else 0
                size = len(self._queue)
            while self._queue:
                batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size:]
                self._running = len(batch)
                live = [p for p in batch if not p.future.done()]
                results = await asyncio.to_thread(self._generate_safe, [(p.messages, p.tools) for p in live])
                self._running = 0
                for pending, result in zip(live, results):
                    self._requests += 1
                    if pending.future.done():
                        continue
                    if isinstance(result, Exception):
                        self.errors_by_endpoint[self.name] += 1
                        pending.future.set_exception(result)
                    else:
                        pending.future.set_result(result)

    def _generate_safe(self, conversations: list[Conversation]) -> list[Completion | Exception]:
        # Out of memory on a batch: halve it rather than fail every conversation in it.
        try:
            return list(self._generate(conversations))
        except RuntimeError as exc:
            if len(conversations) > 1:
                half = len(conversations) // 2
                return self._generate_safe(conversations[:half]) + self._generate_safe(conversations[half:])
            return [RequestError(f"generation failed: {exc}", status=None, permanent=False, endpoint=self.name)]

    def _generate(self, conversations: list[Conversation]) -> list[Completion | Exception]:
        import torch

        tok = self.tokenizer
        start = time.perf_counter()
        results: list[Completion | Exception | None] = [None] * len(conversations)
        # The prompt is rendered and tokenised once, as a server would (tools and tool calls
        # included): the lengths decide what fits, and the same ids are what the record keeps.
        all_ids: list[list[int] | None] = []
        for i, (conv, tools) in enumerate(conversations):
            try:
                all_ids.append(self._tokens.prompt_ids(conv, tools))
            except RequestError as exc:
                results[i] = exc
                all_ids.append(None)
        kept, index = [], []
        for i, ids in enumerate(all_ids):
            if ids is None:
                continue
            n = len(ids)
            if self._max_positions is not None and n >= self._max_positions:
                results[i] = RequestError(
                    f"prompt has {n} tokens; the model's context is {self._max_positions}",
                    status=400, permanent=True, endpoint=self.name,
                )
                continue
            kept.append(ids)
            index.append(i)
        kept_ids = kept
        if kept:
            enc = tok.pad({"input_ids": kept}, padding=True, return_tensors="pt").to(self.device)
            prompt_len = enc["input_ids"].shape[1]
            max_new = self.params.max_tokens
            if self._max_positions is not None:
                max_new = max(1, min(max_new, self._max_positions - prompt_len))
            kwargs: dict[str, Any] = {"max_new_tokens": max_new, "eos_token_id": self._eos_ids,
                                      "pad_token_id": tok.pad_token_id,
                                      **sampling_kwargs(self.params, self.model.generation_config)}
            with torch.inference_mode():
                out = self.model.generate(**enc, **kwargs)
            latency = time.perf_counter() - start
            new_tokens = out[:, prompt_len:].tolist()
            prompt_tokens = enc["attention_mask"].sum(dim=1).tolist()
            eos = set(self._eos_ids)
            for row, i in enumerate(index):
                gen = new_tokens[row]
                stop = next((j for j, t in enumerate(gen) if t in eos), None)
                ids = gen if stop is None else gen[: stop + 1]  # the end-of-turn token is generated too
                text = tok.decode(gen if stop is None else gen[:stop], skip_special_tokens=False)
                content, reasoning, calls = parse_answer(text, self._tokens.format)
                results[i] = Completion(
                    content=content,
                    reasoning_content=reasoning,
                    finish_reason="length" if stop is None else "stop",
                    prompt_tokens=int(prompt_tokens[row]),
                    completion_tokens=len(ids),
                    endpoint=self.name,
                    latency_s=latency,
                    tool_calls=calls or None,
                    prompt_ids=list(kept_ids[row]),
                    completion_ids=list(ids),
                    mode="token",
                )
        return [r for r in results if r is not None]
