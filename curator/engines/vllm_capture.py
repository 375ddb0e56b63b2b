"""Hidden states through vLLM's `extract_hidden_states` speculative method, for targets too large
for transformers (Kimi-K2.5 across 8 GPUs): the vLLM engine's capture operation (`capture` in
curator/engines/vllm.py hands each job to `capture_store` here), and the client engine-fed training
builds on (curator/hidden/engine_feed.py).

vLLM, started with `--speculative-config '{"method": "extract_hidden_states", ...}'` and the
ExampleHiddenStatesConnector, captures the requested layers during prefill and writes one
safetensors file per request ({hidden_states [seq, n_layers, H], token_ids [seq]}) into a shared
directory, returning its path in `kv_transfer_params.hidden_states_path`. This client tokenises
each conversation exactly as the transformers backend does (same ids, same loss mask), sends the
ids to /v1/completions (max_tokens 1), checks and reads the file, stores the sample in the same
shard store, and deletes the engine's file.

What an answer names is untrusted: the client reads and removes only a `*.safetensors` file
directly inside the shared folder it was configured with (--shared-dir, seen through --path-map),
never through a symlink. vLLM names each file `<shared_storage_path>/<request id>.safetensors`
(ExampleHiddenStatesConnector.request_finished); any other path is refused with a named error and
nothing is read or removed.

vLLM answers before the file is written: the connector creates `path + ".lock"` holding an
exclusive flock before the answer leaves, writes the file on a background thread, and releases the
lock when the write is done (vllm/distributed/kv_transfer/kv_connector/v1/
example_hidden_states_connector.py, whose own reader takes a shared flock on the `.lock` file,
then removes both). This client does the same: it waits for the shared lock (bounded by the
request timeout) before reading, so it never reads or re-requests a half-written file, and it
removes the file and its lock once read.

Layer ids: vLLM numbers aux layers like SGLang (id L = the residual stream entering layer L), so
the store's ids are passed through unchanged. Id N (num_hidden_layers) is the last layer's output
*before* the final norm; the client applies the target's final RMSNorm to it (weights read from
the target's safetensors) to store the same "final" state as the transformers backend.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import os
import shlex
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from curator import http
from curator.engines.base import CaptureJob
from curator.errors import ConfigError, EndpointError
from training.capture.prepare import PreparedSample, prepare_samples
from training.capture.stats import ExtractStats
from training.storage.format import HiddenStateSample, StoreMeta
from training.storage.index import merge_index
from training.storage.writer import StoreWriter, claim_store
from training.target.config import read_target_config

LOCK_POLL_S = 0.01  # how often a reader retries the shared lock while the engine writes


@dataclass
class VllmOptions:
    """How to reach the engines: URLs, served model name, concurrency and retry policy."""

    endpoints: list[str]
    model: str
    # The engine's shared_storage_path: the one folder whose files this client reads and removes.
    shared_dir: str
    concurrency: int = 8
    retries: int = 4
    timeout_s: float = 600.0
    backoff_s: float = 0.5
    # An engine started with use_synchronization_lock false makes no .lock file: how long to wait
    # for its file to appear and parse.
    file_wait_s: float = 60.0
    # The engine's shared_storage_path as the client sees it, when mounted elsewhere: (engine, local).
    path_map: tuple[str, str] | None = None
    api_key: str | None = None
    # Basic auth per endpoint root, from user:password in an --endpoint URL (which is shown without it).
    auth: dict[str, httpx.Auth] = dataclasses.field(default_factory=dict)

    def auth_for(self, url: str) -> Any:
        """Return the credentials to send to `url` (the client's default when it came without any)."""
        return self.auth.get(url, httpx.USE_CLIENT_DEFAULT)


CAPTURE_PATH = "/v1/completions"


def capture_server_command(model: str, layer_ids: Sequence[int], shared_dir: str, *, port: int = 8000,
                           tensor_parallel: int | None = None) -> str:
    """Return the `vllm serve` command that writes the states of layers `layer_ids` of each prompt into `shared_dir`."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
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


def capture_request(prompt_ids: Sequence[int], model: str) -> dict[str, Any]:
    """Return the body of the one-token request whose prefill the engine captures."""
    return {"model": model, "prompt": list(prompt_ids), "max_tokens": 1, "temperature": 0.0, "return_token_ids": True}


def capture_answer(data: dict[str, Any]) -> tuple[list[int] | None, str | None]:
    """Return (the prompt ids the engine echoes, the hidden-states file it names) from a capture answer."""
    choice = (data.get("choices") or [{}])[0]
    echoed = choice.get("prompt_token_ids", data.get("prompt_token_ids"))
    params = data.get("kv_transfer_params") or choice.get("kv_transfer_params") or {}
    path = params.get("hidden_states_path") if isinstance(params, dict) else None
    return (list(echoed) if echoed is not None else None), (str(path) if path else None)


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
    return capture_server_command(model, engine_layer_ids(meta), shared_dir, port=port,
                                       tensor_parallel=tensor_parallel)


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


def _plain_file(path: Path) -> bool:
    """Return whether `path` is a plain file, not a symlink (False when missing); _Fatal for anything else."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise _Fatal(f"{path} in the shared folder is a symlink or not a plain file; it was not read or removed")
    return True


def _remove_plain(path: Path) -> None:
    # Only what the engine wrote, a plain file, is removed: never a symlink or what it points to.
    try:
        if stat.S_ISREG(path.lstat().st_mode):
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        pass


def _load(path: Path) -> dict[str, torch.Tensor]:
    """Return the tensors of a safetensors file; _Retry when it is missing or unreadable."""
    if not _plain_file(path):
        raise _Retry(f"the engine's file {path} is missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise _Retry(f"the engine's file {path} is truncated or unreadable ({exc})") from exc


async def read_engine_file(path: Path, *, lock_wait_s: float, file_wait_s: float) -> dict[str, torch.Tensor]:
    """Return the tensors of the engine's file once its writer is done with it (the shared lock
    on `path + ".lock"`, waited for up to `lock_wait_s`; without a lock file, a file that parses
    within `file_wait_s`). The file and its lock are removed afterwards, whatever happened: a
    new request writes a new file."""
    lock = Path(f"{path}.lock")
    try:
        if lock.exists():
            return await _read_under_shared_lock(path, lock, lock_wait_s, file_wait_s)
        return await _read_when_parsable(path, file_wait_s)
    finally:
        _remove_plain(lock)
        _remove_plain(path)


async def _read_under_shared_lock(path: Path, lock: Path, lock_wait_s: float, file_wait_s: float) -> dict[str, torch.Tensor]:
    deadline = time.monotonic() + lock_wait_s
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return await _read_when_parsable(path, file_wait_s)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise _Retry(f"the engine kept writing {path} for more than {lock_wait_s:.0f} s") from None
                await asyncio.sleep(LOCK_POLL_S)
        # the writer has let go of its exclusive lock: the file is whole, or it never will be
        return _load(path)
    finally:
        os.close(fd)


async def _read_when_parsable(path: Path, file_wait_s: float) -> dict[str, torch.Tensor]:
    # Without a lock the only sign of a finished write is a file that parses whole.
    deadline = time.monotonic() + file_wait_s
    while True:
        try:
            return _load(path)
        except _Retry:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(LOCK_POLL_S * 10)


class VllmExtractor:
    """Drives one or more vLLM engines; validates each file; stores complete samples only."""

    def __init__(self, opts: VllmOptions, meta: StoreMeta, norm: tuple[torch.Tensor, float] | None) -> None:
        if meta.has_final and norm is None:
            raise ValueError("a store with the final state needs the target's final norm to apply to it")
        self.opts = opts
        self.meta = meta
        self.norm = norm
        self.layers = engine_layer_ids(meta)
        self.shared = self.local_path(opts.shared_dir)  # the engine's shared folder, as seen here
        self.where = f"--shared-dir {opts.shared_dir}" + (f" seen here as {self.shared}" if str(self.shared) != opts.shared_dir else "")
        # Checked and resolved once, at the first answer (the engine may make the folder at its first write).
        self._shared_real: Path | None = None

    def local_path(self, engine_path: str) -> Path:
        """Return where the engine's file is on this machine (through --path-map when given)."""
        if self.opts.path_map:
            src, dst = self.opts.path_map
            if engine_path.startswith(src):
                return Path(dst + engine_path[len(src):])
        return Path(engine_path)

    def shared_folder(self) -> Path:
        """Return the real path of the engine's shared folder (checked and resolved at the first call
        only); _Fatal when it is not a folder visible here."""
        if self._shared_real is None:
            if not self.shared.is_dir():
                raise _Fatal(
                    f"the engine's shared folder ({self.where}) is not visible here: mount its shared_storage_path on this "
                    "machine, or pass --path-map ENGINE_DIR=LOCAL_DIR"
                )
            self._shared_real = self.shared.resolve()
        return self._shared_real

    def engine_file(self, engine_path: str) -> Path:
        """Return the local path of the file an answer names, once it is one this client may read and
        remove: a `*.safetensors` name directly inside the shared folder, neither it nor its lock a
        symlink or anything but a plain file. _Fatal otherwise, before anything is read or removed."""
        shared = self.shared_folder()
        path = self.local_path(engine_path)
        inside = path.is_absolute() and path.parent.resolve() == shared
        if not inside or not path.name.endswith(".safetensors") or path.name.startswith("."):
            raise _Fatal(
                f"the engine named {engine_path!r} as its hidden-states file, which is not a .safetensors file "
                f"directly inside its shared folder ({self.where}); nothing was read or removed. Start vLLM with the "
                "--kv-transfer-config of --print-server-command (same --shared-dir), or pass --path-map ENGINE_DIR=LOCAL_DIR"
            )
        for p in (path, Path(f"{path}.lock")):
            _plain_file(p)  # missing is fine: not written yet, or an engine that makes no lock
        return path

    async def request(self, client: httpx.AsyncClient, url: str, s: PreparedSample) -> HiddenStateSample:
        """Return the sample captured by the engine at `url`; retry transient failures."""
        ids = s.input_ids.tolist()
        body = capture_request(ids, self.opts.model)
        policy = http.RetryPolicy(self.opts.retries + 1, self.opts.backoff_s, http.RetryPolicy().max_delay_s)
        file_problem = False

        async def once(attempt: int) -> HiddenStateSample:
            nonlocal file_problem
            resp = await client.post(f"{url}{CAPTURE_PATH}", json=body, auth=self.opts.auth_for(url))
            resp.raise_for_status()
            try:
                data = resp.json()
            except ValueError as exc:
                raise _Retry(f"{url} answered something that is not JSON") from exc
            try:
                return await self.read_answer(data, s, ids)
            except _Retry:
                file_problem = True
                raise

        def classify(exc: Exception) -> http.Failure | None:
            return http.Failure(str(exc), True) if isinstance(exc, _Retry) else http.httpx_failure(exc, f"{url}{CAPTURE_PATH}")

        tries = f"{policy.max_attempts} tries"
        try:
            return await http.retrying(once, policy, classify)
        except (_Retry, httpx.HTTPStatusError, httpx.TransportError) as exc:
            last = classify(exc)
            assert last is not None  # classify knows each of these
            if file_problem:
                # The engine answers but its files do not arrive whole: a setup fault every sample would hit.
                raise _Fatal(
                    f"{last.reason} (sample {s.id!r}, {tries}): start vLLM with the --kv-transfer-config "
                    "from --print-server-command and check that the shared directory's disk is not full; re-run to resume"
                ) from exc
            if not last.transient:
                raise EndpointError(f"{url} refused sample {s.id!r}: {last.reason}") from exc
            raise EndpointError(f"{url} failed sample {s.id!r} after {tries} ({last.reason})") from exc

    async def read_answer(self, data: dict[str, Any], s: PreparedSample, ids: list[int]) -> HiddenStateSample:
        """Return the sample from an engine answer and its file; the file and its lock are removed once read."""
        echoed, engine_path = capture_answer(data)
        if echoed is None:
            raise _Fatal(f"{self.opts.model}: the answer has no prompt_token_ids; use a vLLM that supports return_token_ids")
        if echoed != ids:
            raise _Fatal(
                f"the engine tokenised sample {s.id!r} differently ({len(echoed)} ids back for {len(ids)} sent); "
                "it must receive token ids unchanged: serve the same model and tokenizer as --target-dir"
            )
        if not engine_path:
            raise _Fatal(
                "the answer has no kv_transfer_params.hidden_states_path: start vLLM with the command from "
                "`curator hidden-states --backend vllm --print-server-command`"
            )
        path = self.engine_file(str(engine_path))
        tensors = await read_engine_file(path, lock_wait_s=self.opts.timeout_s, file_wait_s=self.opts.file_wait_s)
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
            assert self.norm is not None  # __init__ refuses a final state without its norm
            weight, eps = self.norm
            final = rms_norm(hs[:, n_aux, :], weight, eps)
        prenorm = hs[:, n_aux, :].to(torch.bfloat16) if self.meta.has_final_prenorm else None
        return HiddenStateSample(s.id, s.input_ids, s.loss_mask, aux, final, final_prenorm=prenorm, category=s.category)


async def check_endpoints(client: httpx.AsyncClient, opts: VllmOptions) -> None:
    """Raise EndpointError unless every endpoint is up and serves `opts.model`."""
    for url in opts.endpoints:
        try:
            resp = await client.get(f"{url}/v1/models", auth=opts.auth_for(url))
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
    positions: int | None = None,
    on_sample: Callable[[int], None] | None = None,
) -> ExtractStats:
    """Capture every not-yet-stored record through the engines into the store; return the counts
    (a record longer than the target's `positions` is skipped as too_long, as the transformers backend does)."""
    if not opts.endpoints:
        raise ConfigError("--backend vllm needs at least one --endpoint URL")
    try:
        roots, auth = http.endpoint_roots(opts.endpoints)
    except ValueError as exc:
        raise ConfigError(f"--endpoint {exc}") from exc
    opts = dataclasses.replace(opts, endpoints=roots, auth=auth)
    stats = ExtractStats()
    start = time.perf_counter()
    extractor = VllmExtractor(opts, meta, norm)
    headers = http.bearer(opts.api_key)
    limits = httpx.Limits(max_connections=opts.concurrency * len(opts.endpoints) + 4)
    timeout = http.timeout(opts.timeout_s)
    with StoreWriter(out_dir, meta, writer_id="vllm") as writer:
        async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
            await check_endpoints(client, opts)
            work: asyncio.Queue[PreparedSample | None] = asyncio.Queue(maxsize=4 * opts.concurrency * len(opts.endpoints))
            samples = prepare_samples(records, tokenizer, stats, done=writer.done_ids(), max_len=max_len,
                                      vocab_size=meta.vocab_size, positions=positions)

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


def capture_store(job: CaptureJob) -> ExtractStats:
    """Capture `job.records` through the engines into the store `job.out` (claimed for the run, its index
    merged at the end); return the counts."""
    opts = VllmOptions(endpoints=[e.rstrip("/") for e in job.endpoints], model=job.model, shared_dir=job.shared_dir,
                       concurrency=job.concurrency, retries=job.retries, path_map=job.path_map,
                       api_key=api_key_from_env())
    norm = load_final_norm(job.local) if job.meta.has_final else None
    with claim_store(job.out):  # one run per store; what a killed run left is removed first
        stats = asyncio.run(extract_vllm(opts, job.tokenizer, job.records, job.out, job.meta, norm=norm,
                                         max_len=job.max_len, positions=job.positions,
                                         on_sample=lambda _t: job.on_sample(1)))
        merge_index(job.out)
    return stats
