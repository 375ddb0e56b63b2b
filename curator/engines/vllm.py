"""vLLM, as the toolkit speaks to it (checked in vLLM 0.33.0's source).

- launch flags the doctor reads (`vllm serve`, engine/arg_utils.py): `--speculative-config` JSON or
  `--spec-method/--spec-model/--spec-tokens`, and `vllm serve EXPORT`, where vLLM builds the
  speculative config from a speculators export (transformers_utils/config.py);
- token-exact generation: `POST /v1/completions` with a token-id prompt (entrypoints/openai
  CompletionRequest/CompletionResponseChoice): request {"model", "prompt": [int], "max_tokens",
  "temperature", "top_p", "return_token_ids": true, "skip_special_tokens": false}; answer
  {"choices": [{"text", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids"}], "usage"};
- bench-serve's acceptance (v1/spec_decode/metrics.py): Prometheus counters on `/metrics`,
  `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens` and
  `..._num_accepted_tokens_per_pos` (label `position`), with prometheus_client's `_total` suffix and
  labelled per engine and model; mean acceptance length = 1 + accepted / drafts, position k's rate =
  per_pos[k] / drafts. They are server-wide and cumulative: a run reads them before and after and
  takes the difference, so nothing else may use the server meanwhile;
- hidden-state capture: the draft config's ids taken as layer inputs (training.target.layers.vllm_captured);
  the `extract_hidden_states` method (v1/spec_decode/extract_hidden_states.py) with the
  ExampleHiddenStatesConnector (distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py):
  `vllm serve` with `--speculative-config {"method": "extract_hidden_states", ...}` and
  `--kv-transfer-config` naming the shared folder; one `POST /v1/completions` per sample (token-id
  prompt, max_tokens 1, return_token_ids) whose answer names the file in
  `kv_transfer_params.hidden_states_path` (curator/engines/vllm_capture.py sends it, reads and removes the file).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curator.engines.answer import EngineAnswer, ignored_prompt, int_list, malformed
from curator.engines.launch import Check, LaunchSpec, int_opt, kept_args, option_map, same_path
from curator.engines.prometheus import is_counter, parse_prometheus
from curator.engines.spec_counters import SpecCounters
from curator.errors import EndpointError
from training.io.jsonfile import parse_json

if TYPE_CHECKING:
    from curator.engines.base import CaptureJob
    from curator.engines.draft import DraftLayout
    from curator.engines.sampling import SamplingParams
    from training.capture.stats import ExtractStats

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

NAME = "vllm"
LABEL = "vLLM"
GENERATE_PATH = "/v1/completions"
BENCH_TAKES_TOKEN_IDS = False  # bench-serve sends chat messages
NEEDS_SERVED_MODEL_NAME = True  # chat completions name the model


def recognises(argv: list[str]) -> bool:
    """Return whether a launch command starts a vLLM server."""
    return "vllm.entrypoints" in " ".join(argv) or (len(argv) > 1 and argv[0].endswith("vllm") and argv[1] == "serve")


# vLLM 0.33 (engine/arg_utils.py): `--speculative-config`/`-sc` takes JSON; `--spec-method`,
# `--spec-model` and `--spec-tokens` fill its keys and are refused when the JSON sets the same key.
# What vLLM 0.32.0 (CPU build, tests/serving/test_served_doctor.py) does with "method": "eagle" on an
# EAGLE-3 export: it refuses at start-up rather than serving it with fc skipped, as SGLang does.
EAGLE_FOR_EAGLE3 = ("vLLM refuses to start: method eagle loads the draft as EagleLlamaForCausalLMEagle3, "
                    "an architecture it does not have (\"Model architectures ... are not supported\"); "
                    "use \"method\": \"eagle3\"")
SHORT_FLAGS = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "num_speculative_tokens"}


def parse(argv: list[str]) -> LaunchSpec:
    """Return the speculative settings of a vLLM launch command."""
    opts, positionals = option_map(argv)
    spec = LaunchSpec(engine=NAME, argv=argv)
    after_serve = positionals[positionals.index("serve") + 1:] if "serve" in positionals else []
    spec.target = opts.get("--model") or (after_serve[0] if after_serve else None)
    if "--speculative-model" in opts or "--num-speculative-tokens" in opts:
        spec.problems.append(Check("speculative config", "error",
                                   "--speculative-model/--num-speculative-tokens were removed from vLLM; use "
                                   "--spec-model/--spec-tokens or --speculative-config '{\"method\": \"eagle3\", ...}'"))
    raw = opts.get("--speculative-config", opts.get("-sc"))
    config: dict[str, Any] = {}
    if raw is not None:
        try:
            parsed = parse_json(raw or "")  # ValueError also for a 5,000-digit number or nesting 100K deep
        except ValueError as exc:
            spec.problems.append(Check("speculative config", "error", f"--speculative-config is not JSON ({exc})"))
            return spec
        if not isinstance(parsed, dict):
            spec.problems.append(Check("speculative config", "error", "--speculative-config must be a JSON object"))
            return spec
        config = {k.replace("-", "_"): v for k, v in parsed.items()}
        spec.user_config = dict(config)
    for flag, key in SHORT_FLAGS.items():
        if flag not in opts:
            continue
        spec.short_flags = True
        if key in config:
            spec.problems.append(Check("speculative config", "error",
                                       f"{flag} and --speculative-config['{key}'] are mutually exclusive: vLLM refuses "
                                       "to start; give each setting once"))
        config[key] = opts[flag]
    if not config and "--speculative-model" in opts:
        spec.draft_path = opts.get("--speculative-model")
        return spec
    if not config:
        return spec
    spec.algorithm = config.get("method")
    spec.draft_path = config.get("model")
    tokens = config.get("num_speculative_tokens")
    spec.steps = int_opt(spec, "num_speculative_tokens", None if tokens is None else str(tokens))
    spec.topk = 1
    spec.num_draft_tokens = spec.steps + 1 if spec.steps is not None else None
    return spec


def resolve_served_export(spec: LaunchSpec, draft: DraftLayout, target: str | Path | None) -> list[Check]:
    """Fill `spec` with what vLLM makes of `vllm serve EXPORT`, and return the checks of that form.

    vLLM 0.33 (transformers_utils/config.py `maybe_override_with_speculators`, configs/speculators/
    base.py) reads the export's config.json: the method is `speculators_model_type` and the draft
    is the export, whatever --speculative-config says (both are locked); num_speculative_tokens is
    `proposal_methods[0].speculative_tokens` unless --speculative-config sets it; the served model
    and tokenizer become `verifier.name_or_path`, which must be a Hub repository id and not a
    local path. It refuses a config without proposal_methods, speculative_tokens or
    transformer_layer_config.
    """
    checks: list[Check] = []
    spec.serves_export = True
    if spec.short_flags:
        checks.append(Check("speculative config", "error",
                            "`vllm serve EXPORT` fills method, model and num_speculative_tokens from the export, and "
                            "vLLM then refuses --spec-method/--spec-model/--spec-tokens as set twice: drop them (a "
                            "token count goes in --speculative-config '{\"num_speculative_tokens\": N}')"))
    if "--tokenizer" in option_map(spec.argv)[0]:
        checks.append(Check("tokenizer", "warn", "--tokenizer is ignored: vLLM serves the verifier's tokenizer"))
    export = draft.path
    tokens = spec.export_steps = draft.speculative_tokens
    if tokens is None or not draft.has_transformer_layer_config:
        checks.append(Check("speculators config", "error",
                            "vLLM refuses this export at start-up: its config.json needs speculators_config."
                            "proposal_methods[0].speculative_tokens and a transformer_layer_config; re-export it"))
    method = draft.speculators_model_type
    if spec.algorithm is not None and str(spec.algorithm).lower() != str(method).lower():
        checks.append(Check("speculative config", "warn",
                            f"method {spec.algorithm!r} is ignored: vLLM takes {method!r} from the export"))
    if spec.draft_path is not None and same_path(spec.draft_path, export) != "ok":
        checks.append(Check("speculative config", "warn",
                            f"model {spec.draft_path!r} is ignored: vLLM drafts with the export it serves"))
    spec.algorithm, spec.draft_path = (str(method) if method else None), str(export)
    if spec.steps is None and tokens is not None:
        spec.steps, spec.topk, spec.num_draft_tokens = tokens, 1, tokens + 1

    verifier = draft.verifier or ""
    if not takes_verifier(verifier):
        checks.append(Check("verifier", "error",
                            f"`vllm serve` on the export serves its verifier, {verifier!r}: not a Hub repository "
                            "id (or a local path too), which vLLM refuses; re-export with curator export "
                            "--verifier ORG/NAME, or serve the target with --speculative-config"))
        return checks
    spec.target = verifier
    checks.append(Check("launch form", "ok",
                        f"`vllm serve EXPORT`: vLLM serves the verifier {verifier} with this draft "
                        f"({method}, {spec.steps} tokens per step)"))
    if target is not None:
        same_name = Path(str(target).rstrip("/")).name.lower() == verifier.rsplit("/", 1)[-1].lower()
        checks.append(Check("target model", "warn",
                            f"vLLM downloads the verifier {verifier} from the Hub; the draft was checked against "
                            f"{target}" + ("" if same_name else ", whose folder name differs")
                            + ": make sure they are the same model and revision"))
    return checks


def takes_verifier(name: str) -> bool:
    """Return whether vLLM 0.33 accepts `name` as a speculators verifier: a valid Hub repository id
    (huggingface_hub's own `validate_repo_id`, which vLLM calls; bare ids like "gpt2" pass) that is
    not also a local path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return not (Path(name).exists() or Path(name).is_symlink())


def step_checks(spec: LaunchSpec) -> list[Check]:
    """Return the check of the draft-token count vLLM reads (a chain: topk 1)."""
    if spec.steps is None and spec.serves_export:
        return [Check("draft steps", "error", "the export's speculators_config names no speculative_tokens")]
    if spec.steps is None:
        return [Check("draft steps", "error", "num_speculative_tokens missing from --speculative-config")]
    if spec.steps < 1:
        return [Check("draft steps", "error", f"num_speculative_tokens={spec.steps} must be >= 1")]
    return [Check("draft steps", "ok", f"{spec.steps} tokens per step (chain)")]


def suggested_launch(model: str, draft: str, steps: int, spec: LaunchSpec | None) -> str:
    """Return the vLLM command that serves `draft` on `model`, keeping the user's other flags and form."""
    if spec is not None and spec.serves_export and spec.target != draft:
        # `vllm serve EXPORT` resolved to a Hub verifier: keep that form, with the user's own options
        kept = kept_args(spec, {"--speculative-config", "-sc", "--model", "--tokenizer", *SHORT_FLAGS})
        # the user's other keys stay (vLLM merges them); method and model are the export's anyway
        own = {k: v for k, v in spec.user_config.items() if k not in ("method", "model")}
        if steps != spec.export_steps:
            own["num_speculative_tokens"] = steps
        return shlex.join(["vllm", "serve", draft, *kept, *(["--speculative-config", json.dumps(own)] if own else [])])
    dropped = {"--speculative-config", "-sc", "--model", "--speculative-model", "--num-speculative-tokens", *SHORT_FLAGS}
    kept = kept_args(spec, dropped) if spec else []
    if spec is not None and spec.short_flags:
        return shlex.join(["vllm", "serve", model, *kept, "--spec-method", "eagle3", "--spec-model", draft,
                           "--spec-tokens", str(steps)])
    config = json.dumps({"method": "eagle3", "model": draft, "num_speculative_tokens": steps})
    return shlex.join(["vllm", "serve", model, *kept, "--speculative-config", config])


def layout_problems(draft: DraftLayout) -> list[Check]:
    """Return why vLLM cannot serve an export of this layout as trained (nothing when it can)."""
    # vLLM's reader asks only whether the top-level key is there (its value is the layout's to check)
    if draft.fmt == "sglang" and draft.config.get("eagle_aux_hidden_state_layer_ids") is None:
        return [Check("layout vs server", "error",
                      "vLLM serves this layout as Eagle3LlamaForCausalLM but reads its layer ids from the top-level "
                      "eagle_aux_hidden_state_layer_ids (then, per runner, eagle_config's ids as layer inputs or "
                      "eagle_config.layer_ids), which this export lacks: re-export with curator export")]
    return []


def missing_algorithm(spec: LaunchSpec, layout_name: str) -> Check:
    """Return the check for a command that names no method: a speculators export says eagle3 itself."""
    if layout_name == "speculators" and spec.draft_path:
        return Check("algorithm", "warn", "no \"method\": vLLM reads eagle3 from the speculators config; say it explicitly")
    return Check("algorithm", "error", 'no speculative algorithm given: add "method": "eagle3"')


def serves_export_directly(spec: LaunchSpec, export: Path, layout_name: str) -> bool:
    """Return whether the command is `vllm serve EXPORT` on a speculators export (vLLM then serves its verifier)."""
    return layout_name == "speculators" and spec.target is not None and same_path(spec.target, export) == "ok"


def export_checks(spec: LaunchSpec, draft: DraftLayout, target: str | Path | None) -> list[Check]:
    """Return the checks of how the command reaches the export: `vllm serve EXPORT` serves the verifier
    the export names (transformers_utils/config.py, maybe_override_with_speculators); with the target
    given and the draft in the speculative config, the verifier is not read."""
    if serves_export_directly(spec, draft.path, draft.fmt):
        return resolve_served_export(spec, draft, target)
    return []


# ---------------------------------------------------------------- token-exact generation


def token_request(prompt_ids: Sequence[int], params: SamplingParams, model: str) -> dict[str, Any]:
    """Return the body of a vLLM /v1/completions request with a token-id prompt that asks for the ids back."""
    body: dict[str, Any] = {"model": model, "prompt": list(prompt_ids), "max_tokens": params.max_tokens,
                            "temperature": params.temperature, "return_token_ids": True,
                            "skip_special_tokens": False, "stream": False}
    if params.top_p is not None:
        body["top_p"] = params.top_p
    return body


def parse_token_answer(payload: Any, prompt_ids: Sequence[int], endpoint: str) -> EngineAnswer:
    """Return the answer in a /v1/completions response; AnswerError when it is not one or the prompt was not taken."""
    try:
        choice = payload["choices"][0]
        text = choice["text"]
    except (KeyError, IndexError, TypeError) as exc:
        raise malformed(endpoint, f"no choices[0].text ({type(exc).__name__})") from exc
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != list(prompt_ids):
        raise ignored_prompt(endpoint, "prompt_token_ids differ from the ids sent")
    usage = payload.get("usage") or {}
    ids = choice.get("token_ids")
    stop = choice.get("stop_reason")
    return EngineAnswer(
        completion_ids=list(ids) if int_list(ids) else None,
        text=str(text or ""),
        finish_reason=str(choice.get("finish_reason") or "unknown"),
        prompt_tokens=int(usage.get("prompt_tokens") or len(prompt_ids)),
        completion_tokens=int(usage.get("completion_tokens") or (len(ids) if int_list(ids) else 0)),
        stop_token=stop if isinstance(stop, int) and not isinstance(stop, bool) else None,
    )


# ---------------------------------------------------------------- hidden-state capture


# The shared folder (shared_storage_path) when none is given: `curator hidden-states --shared-dir`.
CAPTURE_SHARED_DIR = "/tmp/curator-hidden-states"


def capture(job: CaptureJob) -> ExtractStats:
    """Capture a generation output's hidden states through vLLM servers running `extract_hidden_states`
    into the store `job.out`; return the counts (the client: curator/engines/vllm_capture.py)."""
    from curator.engines.vllm_capture import capture_store  # torch and safetensors: only a capture pays for them

    return capture_store(job)


# ---------------------------------------------------------------- bench-serve


def spec_counters(text: str) -> SpecCounters:
    """Return vLLM's speculative-decoding counters in a `/metrics` page (summed over engines); refused
    when it has none (the server runs without speculation)."""
    c, found = SpecCounters(), False
    for name, labels, value in parse_prometheus(text):
        if is_counter(VLLM_ACCEPTED_PER_POS, name):
            pos = int(labels.get("position", "0"))
            c.accepted_per_pos[pos] = c.accepted_per_pos.get(pos, 0.0) + value
        elif is_counter(VLLM_DRAFTS, name):
            c.drafts += value
            found = True
        elif is_counter(VLLM_DRAFT_TOKENS, name):
            c.draft_tokens += value
        elif is_counter(VLLM_ACCEPTED, name):
            c.accepted += value
    if not found:
        raise EndpointError(f"the /metrics page has no {VLLM_DRAFTS} counter: the server runs without speculative decoding")
    return c


CHAT_PATH = "/v1/chat/completions"


def bench_request(prompt: Any, model: str | None, max_tokens: int, temperature: float) -> tuple[str, dict[str, Any]]:
    """Return (path, body) of one streamed bench-serve request: chat completions with the usage chunk."""
    return CHAT_PATH, {"model": model, "messages": prompt, "temperature": temperature, "max_tokens": max_tokens,
                       "stream": True, "stream_options": {"include_usage": True}}


def streamed_output(event: dict[str, Any]) -> bool:
    """Return whether a streamed chunk carries generated text (the first may be the role alone)."""
    return any((c.get("delta") or {}).get("content") for c in event.get("choices") or [])


def bench_counts(last: dict[str, Any], usage: dict[str, Any], where: str) -> tuple[int, int | None]:
    """Return (completion tokens, None): vLLM counts speculation server-wide, on /metrics."""
    if not isinstance(usage.get("completion_tokens"), int):
        raise EndpointError(f"{where} streamed no usage.completion_tokens (stream_options.include_usage)")
    return usage["completion_tokens"], None
