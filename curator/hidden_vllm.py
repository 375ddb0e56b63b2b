"""Hidden states through vLLM's `extract_hidden_states` speculative method, for targets too large
for transformers (Kimi-K2.5 across 8 GPUs).

vLLM, started with `--speculative-config '{"method": "extract_hidden_states", ...}'` and the
ExampleHiddenStatesConnector, captures the requested layers during prefill and writes one
safetensors file per request ({hidden_states [seq, n_layers, H], token_ids [seq]}) into a shared
directory, returning its path in `kv_transfer_params.hidden_states_path`. This client tokenises
each conversation exactly as the transformers backend does (same ids, same loss mask), sends the
ids to /v1/completions (max_tokens 1), checks and reads the file, stores the sample in the same
shard store, and deletes the engine's file.

Layer ids: vLLM numbers aux layers like SGLang (id L = the residual stream entering layer L), so
the store's ids are passed through unchanged. Id N (num_hidden_layers) is the last layer's output
*before* the final norm; the client applies the target's final RMSNorm to it (weights read from
the target's safetensors) to store the same "final" state as the transformers backend.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from curator.errors import ConfigError, EndpointError
from training.hidden_states import ExtractStats, PreparedSample, prepare_samples
from training.store import HiddenStateSample, StoreMeta, StoreWriter
from training.target_config import read_target_config

TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class VllmOptions:
    """How to reach the engines: URLs, served model name, concurrency and retry policy."""

    endpoints: list[str]
    model: str
    concurrency: int = 8
    retries: int = 4
    timeout_s: float = 600.0
    backoff_s: float = 0.5
    # The engine's shared_storage_path as the client sees it, when mounted elsewhere: (engine, local).
    path_map: tuple[str, str] | None = None
    api_key: str | None = None


def engine_layer_ids(meta: StoreMeta) -> list[int]:
    """Return the ids vLLM must capture: the store's aux ids, plus N (last layer output) when it keeps the final state."""
    return [*meta.aux_layer_ids, meta.num_layers] if meta.has_final else list(meta.aux_layer_ids)


def server_command(
    model: str,
    meta: StoreMeta,
    shared_dir: str,
    *,
    port: int = 8000,
    tensor_parallel: int | None = None,
) -> str:
    """Return the `vllm serve` command that captures exactly the layers this store keeps."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": engine_layer_ids(meta)}},
    }
    kv = {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": shared_dir},
    }
    parts = ["vllm", "serve", model, "--port", str(port)]
    if tensor_parallel:
        parts += ["--tensor-parallel-size", str(tensor_parallel)]
    parts += [
        "--no-enable-chunked-prefill",  # each prompt must be captured in one prefill
        "--speculative-config", json.dumps(spec, separators=(",", ":")),
        "--kv-transfer-config", json.dumps(kv, separators=(",", ":")),
    ]
    return " ".join(shlex.quote(p) for p in parts)


def layer_explanation(meta: StoreMeta) -> str:
    """Return a few lines on which layers the engine captures and how they map to the store."""
    n = meta.num_layers
    ids = meta.aux_layer_ids
    lines = [
        "Layer ids use SGLang's convention, which vLLM shares: id L is the input of decoder layer L "
        "(= output of layer L-1 = transformers' hidden_states[L]).",
        f"Aux layers {ids} are the ones an EAGLE-3 draft is served with "
        f"(eagle_config.eagle_aux_hidden_state_layer_ids); SpecForge numbers them {[i - 1 for i in ids]}.",
    ]
    if meta.has_final:
        lines.append(
            f"Id {n} (= num_hidden_layers) is the last layer's output before the final norm; the client "
            "applies the target's final RMSNorm to it and stores it as the final state (the target's logits come from it)."
        )
    return "\n".join(lines)


def load_final_norm(target_dir: str | Path) -> tuple[torch.Tensor, float]:
    """Return (the final RMSNorm weight, eps) of the target, read from its safetensors without loading the rest."""
    root = Path(target_dir)
    eps = float(read_target_config(root).get("rms_norm_eps", 1e-6))
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    else:
        files = sorted(root.glob("*.safetensors"))
        weight_map = {}
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                weight_map.update({k: f.name for k in h.keys()})
    candidates = [k for k in weight_map if k.endswith("model.norm.weight") and "layers." not in k and "mtp" not in k]
    if not candidates:
        raise ConfigError(f"{root}: no model.norm.weight in the target's safetensors; the final state cannot be normed")
    key = min(candidates, key=len)  # "model.norm.weight" before "language_model.model.norm.weight"
    with safe_open(str(root / weight_map[key]), framework="pt") as h:
        return h.get_tensor(key), eps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Return RMSNorm(x) computed as transformers' Llama does (float32 statistics, weight in x's dtype)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(x.dtype) * h.to(x.dtype)


class _Fatal(Exception):
    """A failure every further request would hit too: stop the run."""


class _Retry(Exception):
    """A failure of one answer that a new request may not repeat."""


class VllmExtractor:
    """Drives one or more vLLM engines; validates each file; stores complete samples only."""

    def __init__(self, opts: VllmOptions, meta: StoreMeta, norm: tuple[torch.Tensor, float] | None) -> None:
        self.opts = opts
        self.meta = meta
        self.norm = norm
        self.layers = engine_layer_ids(meta)

    def local_path(self, engine_path: str) -> Path:
        """Return where the engine's file is on this machine (through --path-map when given)."""
        if self.opts.path_map:
            src, dst = self.opts.path_map
            if engine_path.startswith(src):
                return Path(dst + engine_path[len(src):])
        return Path(engine_path)

    async def request(self, client: httpx.AsyncClient, url: str, s: PreparedSample) -> HiddenStateSample:
        """Return the sample captured by the engine at `url`; retry transient failures."""
        ids = s.input_ids.tolist()
        body = {"model": self.opts.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "return_token_ids": True}
        last = ""
        file_problem = False
        for attempt in range(self.opts.retries + 1):
            if attempt:
                await asyncio.sleep(self.opts.backoff_s * 2 ** (attempt - 1))
            try:
                resp = await client.post(f"{url}/v1/completions", json=body)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code in TRANSIENT_STATUS:
                last = f"HTTP {resp.status_code}"
                continue
            if resp.status_code >= 400:
                raise EndpointError(f"{url} refused sample {s.id!r}: HTTP {resp.status_code} {resp.text[:200]}")
            try:
                return self.read_answer(resp.json(), s, ids)
            except _Retry as exc:
                last, file_problem = str(exc), True
                continue
        if file_problem:
            # The engine answers but its files do not arrive whole: a setup fault every sample would hit.
            raise _Fatal(
                f"{last} (sample {s.id!r}, {self.opts.retries + 1} tries): start vLLM with the --kv-transfer-config "
                "from --print-server-command and check that the shared directory's disk is not full; re-run to resume"
            )
        raise EndpointError(f"{url} failed sample {s.id!r} after {self.opts.retries + 1} tries ({last})")

    def read_answer(self, data: dict[str, Any], s: PreparedSample, ids: list[int]) -> HiddenStateSample:
        """Return the sample from an engine answer and its file; the file is removed once read."""
        choice = (data.get("choices") or [{}])[0]
        echoed = choice.get("prompt_token_ids", data.get("prompt_token_ids"))
        if echoed is None:
            raise _Fatal(f"{self.opts.model}: the answer has no prompt_token_ids; use a vLLM that supports return_token_ids")
        if list(echoed) != ids:
            raise _Fatal(
                f"the engine tokenised sample {s.id!r} differently ({len(echoed)} ids back for {len(ids)} sent); "
                "it must receive token ids unchanged: serve the same model and tokenizer as --target-dir"
            )
        params = data.get("kv_transfer_params") or choice.get("kv_transfer_params") or {}
        engine_path = params.get("hidden_states_path")
        if not engine_path:
            raise _Fatal(
                "the answer has no kv_transfer_params.hidden_states_path: start vLLM with the command from "
                "`curator hidden-states --backend vllm --print-server-command`"
            )
        path = self.local_path(str(engine_path))
        if not path.parent.is_dir():
            raise _Fatal(
                f"the engine writes into {Path(engine_path).parent}, which is not visible here ({path.parent} missing): "
                "mount its shared_storage_path on this machine, or pass --path-map ENGINE_DIR=LOCAL_DIR"
            )
        if not path.exists():
            raise _Retry(f"the engine's file {path} is missing")
        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            path.unlink(missing_ok=True)
            raise _Retry(f"the engine's file {path} is truncated or unreadable ({exc})") from exc
        path.unlink(missing_ok=True)
        return self.to_sample(tensors, s, ids, path)

    def to_sample(self, tensors: dict[str, torch.Tensor], s: PreparedSample, ids: list[int], path: Path) -> HiddenStateSample:
        """Return the store sample from the engine's tensors, after checking their shape against the target."""
        hs = tensors.get("hidden_states")
        if hs is None or hs.dim() != 3:
            raise _Retry(f"{path} has no [seq, n_layers, H] hidden_states tensor")
        t = len(ids)
        n, h = len(self.layers), self.meta.hidden_size
        if hs.shape[1] != n or hs.shape[2] != h:
            raise _Fatal(
                f"the engine captured {hs.shape[1]} layers of width {hs.shape[2]}, the target needs {n} x {h} "
                f"(layers {self.layers}): restart vLLM with the command from --print-server-command"
            )
        if hs.shape[0] < t:
            raise _Retry(f"{path} holds {hs.shape[0]} positions for {t} prompt tokens")
        token_ids = tensors.get("token_ids")
        if token_ids is not None and token_ids.reshape(-1)[:t].tolist() != ids:
            raise _Fatal(f"{path} holds states for other token ids than sample {s.id!r}: is the shared directory reused by another run?")
        hs = hs[:t]
        n_aux = len(self.meta.aux_layer_ids)
        aux = hs[:, :n_aux, :].reshape(t, n_aux * h)
        final = None
        if self.meta.has_final:
            weight, eps = self.norm
            final = rms_norm(hs[:, n_aux, :], weight, eps)
        return HiddenStateSample(s.id, s.input_ids, s.loss_mask, aux, final, s.category)


async def check_endpoints(client: httpx.AsyncClient, opts: VllmOptions) -> None:
    """Raise EndpointError unless every endpoint is up and serves `opts.model`."""
    for url in opts.endpoints:
        try:
            resp = await client.get(f"{url}/v1/models")
            resp.raise_for_status()
            served = [m.get("id") for m in resp.json().get("data", [])]
        except (httpx.HTTPError, ValueError) as exc:
            raise EndpointError(f"{url} is not answering /v1/models ({exc}); is vLLM running there?") from exc
        if opts.model not in served:
            raise EndpointError(f"{url} serves {served}, not {opts.model!r}; pass --model with the served name")


async def extract_vllm(
    opts: VllmOptions,
    tokenizer: Any,
    records: Iterable[dict[str, Any]],
    out_dir: str | Path,
    meta: StoreMeta,
    *,
    norm: tuple[torch.Tensor, float] | None,
    max_len: int | None = None,
    on_sample: Callable[[int], None] | None = None,
) -> ExtractStats:
    """Capture every not-yet-stored record through the engines into the store; return the counts."""
    if not opts.endpoints:
        raise ConfigError("--backend vllm needs at least one --endpoint URL")
    stats = ExtractStats()
    start = time.perf_counter()
    extractor = VllmExtractor(opts, meta, norm)
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(max_connections=opts.concurrency * len(opts.endpoints) + 4)
    timeout = httpx.Timeout(opts.timeout_s, connect=10.0)
    with StoreWriter(out_dir, meta, writer_id="vllm") as writer:
        async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
            await check_endpoints(client, opts)
            work: asyncio.Queue[PreparedSample | None] = asyncio.Queue(maxsize=4 * opts.concurrency * len(opts.endpoints))
            samples = prepare_samples(records, tokenizer, stats, done=writer.done_ids(), max_len=max_len)

            async def produce() -> None:
                for s in samples:
                    await work.put(s)
                for _ in range(opts.concurrency * len(opts.endpoints)):
                    await work.put(None)

            async def consume(url: str) -> None:
                while (s := await work.get()) is not None:
                    try:
                        sample = await extractor.request(client, url, s)
                    except EndpointError:
                        stats.failed += 1  # this sample only; the others go on
                        continue
                    if writer.add(sample):
                        stats.loss_tokens += int(sample.loss_mask.sum())
                    if on_sample is not None:
                        on_sample(len(sample))

            tasks = [asyncio.create_task(produce())]
            tasks += [asyncio.create_task(consume(url)) for url in opts.endpoints for _ in range(opts.concurrency)]
            try:
                await asyncio.gather(*tasks)
            except _Fatal as exc:
                raise EndpointError(str(exc)) from None
            finally:
                for t in tasks:
                    t.cancel()
        writer.flush()
        stats.stored = writer.stored
        stats.tokens = writer.stored_tokens
        stats.nonfinite = writer.skipped_nonfinite
        stats.bytes_written = writer.bytes_written
    stats.wall_s = time.perf_counter() - start
    return stats


def api_key_from_env() -> str | None:
    """Return the engine API key from VLLM_API_KEY (vLLM's own variable), if set."""
    return os.environ.get("VLLM_API_KEY") or None
