"""SGLang, as the toolkit speaks to it (checked in SGLang 0.5.23's source).

- launch flags the doctor reads (`python -m sglang.launch_server` / `sglang serve`), its start-up
  rules for the draft steps (srt/arg_groups/speculative_hook.py), and the command that serves a draft;
- token-exact generation: native `POST /generate` (srt/managers/io_struct.py GenerateReqInput,
  tokenizer_manager.py's answer): request {"input_ids", "sampling_params": {"temperature", "top_p",
  "max_new_tokens", "skip_special_tokens"}, "stream"}; answer {"text", "output_ids", "meta_info":
  {"finish_reason": {"type", "matched"}, "prompt_tokens", "completion_tokens", ...}};
- bench-serve's acceptance (managers/tokenizer_manager.py): `meta_info.spec_verify_ct` (target verify
  forwards of that request) beside `completion_tokens` on every `/generate` answer of a speculating
  server; completion_tokens / spec_verify_ct is SGLang's own spec_accept_length;
- hidden-state capture: the target class's layer rule (training/target/sglang_rules.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curator.engines.answer import AnswerError, EngineAnswer, ignored_prompt, int_list, malformed
from curator.engines.launch import Check, LaunchSpec, int_opt, kept_args, option_map
from curator.errors import EndpointError

if TYPE_CHECKING:
    from curator.engines.draft import DraftLayout
    from curator.engines.sampling import SamplingParams

NAME = "sglang"
LABEL = "SGLang"
GENERATE_PATH = "/generate"
BENCH_TAKES_TOKEN_IDS = True  # bench-serve sends rendered ids to /generate
spec_counters = None  # no acceptance on /metrics: each answer carries its own verify count (bench_counts)
capture = None  # no hidden-state capture through SGLang here (transformers or vLLM capture the states)
NEEDS_SERVED_MODEL_NAME = False

FLAGS = {
    "model": ("--model-path", "--model"),
    "algorithm": ("--speculative-algorithm", "--speculative-algo"),
    "draft_path": ("--speculative-draft-model-path", "--speculative-draft-model"),
    "steps": ("--speculative-num-steps",),
    "topk": ("--speculative-eagle-topk",),
    "num_draft_tokens": ("--speculative-num-draft-tokens",),
}


def recognises(argv: list[str]) -> bool:
    """Return whether a launch command starts an SGLang server."""
    return "sglang.launch_server" in " ".join(argv) or (len(argv) > 1 and argv[0].endswith("sglang") and argv[1] == "serve")


def parse(argv: list[str]) -> LaunchSpec:
    """Return the speculative settings of an SGLang launch command."""
    opts, _ = option_map(argv)
    spec = LaunchSpec(engine=NAME, argv=argv)

    def first(key: str) -> str | None:
        return next((opts[f] for f in FLAGS[key] if f in opts), None)

    spec.target = first("model")
    spec.algorithm = first("algorithm")
    spec.draft_path = first("draft_path")
    spec.steps = int_opt(spec, "--speculative-num-steps", first("steps"))
    spec.topk = int_opt(spec, "--speculative-eagle-topk", first("topk"))
    spec.num_draft_tokens = int_opt(spec, "--speculative-num-draft-tokens", first("num_draft_tokens"))
    return spec


def max_draft_tokens(steps: int, topk: int) -> int:
    """Return the most nodes, the root included, of a draft tree of `steps` steps with top-`topk`
    (the largest --speculative-num-draft-tokens that means anything)."""
    return 1 + topk + (steps - 1) * topk * topk


def draft_tokens(steps: int, topk: int, given: int | None = None) -> int:
    """Return the --speculative-num-draft-tokens to serve `steps` steps with top-`topk`: `given` when
    it fits the tree (topk > 1), else steps + 1 for a chain (topk 1) and at most 2 * steps + 2 nodes
    of a tree."""
    if given and topk > 1 and 2 <= given <= max_draft_tokens(steps, topk):
        return given
    return steps + 1 if topk == 1 else min(max_draft_tokens(steps, topk), 2 * steps + 2)


def step_checks(spec: LaunchSpec) -> list[Check]:
    """Return the check of the draft-step flags as SGLang's start-up reads them."""
    # SGLang 0.5.23 (srt/arg_groups/speculative_hook.py): without --speculative-num-steps it asserts
    # that topk and num_draft_tokens are unset too and picks all three per model; with topk 1 it
    # adjusts num_draft_tokens to steps + 1 (a warning in its log)
    steps, topk, ndt = spec.steps, spec.topk, spec.num_draft_tokens
    if steps is None and (topk is not None or ndt is not None):
        return [Check("draft steps", "error",
                      "--speculative-eagle-topk or --speculative-num-draft-tokens without --speculative-num-steps: "
                      "SGLang fails an assertion at start-up; give all three (or none)")]
    given = {"--speculative-num-steps": steps, "--speculative-eagle-topk": topk, "--speculative-num-draft-tokens": ndt}
    unset = [k for k, v in given.items() if v is None]
    if unset:
        return [Check("draft steps", "warn", f"{', '.join(unset)} not given: SGLang picks its own per model; "
                                             f"state them so the run measures what you meant")]
    assert steps is not None and topk is not None and ndt is not None
    if steps < 1 or topk < 1 or ndt < 2:
        return [Check("draft steps", "error", f"steps {steps}, topk {topk}, draft tokens {ndt}: need steps>=1, topk>=1, draft tokens>=2")]
    if topk == 1 and ndt != steps + 1:
        return [Check("draft steps", "warn",
                      f"with topk 1 the draft is a chain of {steps} tokens, verified with the root as {steps + 1}; "
                      f"SGLang adjusts --speculative-num-draft-tokens {ndt} to {steps + 1}: say {steps + 1}")]
    most = max_draft_tokens(steps, topk)
    if ndt > most:
        return [Check("draft steps", "error",
                      f"a tree of {steps} steps with top-{topk} has at most {most} nodes incl. the root; "
                      f"--speculative-num-draft-tokens {ndt} is more")]
    return [Check("draft steps", "ok", f"steps {steps}, topk {topk}, draft tokens {ndt}")]


def launch_command(model: str, draft: str, steps: int, topk: int, draft_tokens: int, spec: LaunchSpec | None) -> str:
    """Return the SGLang command that serves `draft` on `model`, keeping the user's other flags."""
    dropped = {f for names in FLAGS.values() for f in names}
    kept = kept_args(spec, dropped) if spec else []
    return shlex.join(["python", "-m", "sglang.launch_server", "--model-path", model, *kept,
                       "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
                       "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                       "--speculative-num-draft-tokens", str(draft_tokens)])


def suggested_launch(model: str, draft: str, steps: int, spec: LaunchSpec | None) -> str:
    """Return the SGLang command that serves `draft` on `model` at `steps`, keeping the user's topk
    (else a chain) and a draft-token count SGLang accepts for it."""
    topk = spec.topk if spec and spec.topk and spec.topk >= 1 else 1
    return launch_command(model, draft, steps, topk, draft_tokens(steps, topk, spec.num_draft_tokens if spec else None), spec)


def export_checks(spec: LaunchSpec, draft: DraftLayout, target: str | Path | None) -> list[Check]:
    """Return the checks of how the command reaches the export: SGLang reads the draft path it is given."""
    return []


def layout_problems(draft: DraftLayout) -> list[Check]:
    """Return why SGLang cannot serve an export of this layout as trained (nothing when it can)."""
    if draft.fmt != "sglang":
        return [Check("layout vs server", "error",
                      "SGLang picks the draft's class from config.json `architectures` and has no "
                      f"{(draft.architectures or ['?'])[0]} class (nor reads transformer_layer_config), so it "
                      "fails at start-up: export with --format sglang")]
    return []


def missing_algorithm(spec: LaunchSpec, layout_name: str) -> Check:
    """Return the check for a command that names no speculative algorithm."""
    return Check("algorithm", "error", "no speculative algorithm given: add --speculative-algorithm EAGLE3")


# ---------------------------------------------------------------- token-exact generation


def token_request(prompt_ids: Sequence[int], params: SamplingParams, model: str) -> dict[str, Any]:
    """Return the body of SGLang's native /generate request for prompt ids."""
    sampling: dict[str, Any] = {"temperature": params.temperature, "max_new_tokens": params.max_tokens,
                                "skip_special_tokens": False}
    if params.top_p is not None:
        sampling["top_p"] = params.top_p
    return {"input_ids": list(prompt_ids), "sampling_params": sampling, "stream": False}


def parse_token_answer(payload: Any, prompt_ids: Sequence[int], endpoint: str) -> EngineAnswer:
    """Return the answer in a /generate response; AnswerError when it is not one or the prompt was not taken."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("meta_info"), Mapping):
        raise malformed(endpoint, "no meta_info in the /generate response")
    meta = payload["meta_info"]
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, Mapping) else finish
    if kind == "abort":
        message = finish.get("message") if isinstance(finish, Mapping) else None
        raise AnswerError(f"{endpoint} aborted the request: {message or 'no reason given'}", permanent=False)
    prompt_tokens = meta.get("prompt_tokens")
    if isinstance(prompt_tokens, int) and prompt_tokens != len(prompt_ids):
        raise ignored_prompt(endpoint, f"it counted {prompt_tokens} prompt tokens, {len(prompt_ids)} were sent")
    ids = payload.get("output_ids")
    matched = finish.get("matched") if isinstance(finish, Mapping) else None
    return EngineAnswer(
        completion_ids=list(ids) if int_list(ids) else None,
        text=str(payload.get("text") or ""),
        finish_reason=str(kind or "unknown"),
        prompt_tokens=int(prompt_tokens or len(prompt_ids)),
        completion_tokens=int(meta.get("completion_tokens") or (len(ids) if int_list(ids) else 0)),
        stop_token=matched if isinstance(matched, int) and not isinstance(matched, bool) else None,
    )


# ---------------------------------------------------------------- bench-serve


def verify_counts(meta_info: Any) -> tuple[int, int | None]:
    """Return (completion_tokens, spec_verify_ct or None when the server does not speculate)."""
    if not isinstance(meta_info, dict) or not isinstance(meta_info.get("completion_tokens"), int):
        raise EndpointError("the SGLang /generate answer has no meta_info.completion_tokens: not an SGLang server?")
    verify = meta_info.get("spec_verify_ct")
    if verify is not None and not isinstance(verify, int):
        raise EndpointError(f"meta_info.spec_verify_ct is {verify!r}, not a count")
    return meta_info["completion_tokens"], verify


def bench_request(prompt: Any, model: str | None, max_tokens: int, temperature: float) -> tuple[str, dict[str, Any]]:
    """Return (path, body) of one streamed bench-serve request: native /generate with token ids."""
    return GENERATE_PATH, {"input_ids": prompt, "stream": True,
                           "sampling_params": {"temperature": temperature, "max_new_tokens": max_tokens}}


def streamed_output(event: dict[str, Any]) -> bool:
    """Return whether a streamed event carries generated text (every /generate event does)."""
    return True


def bench_counts(last: dict[str, Any], usage: dict[str, Any], where: str) -> tuple[int, int | None]:
    """Return (completion tokens, verify forwards) read from a streamed answer's last event."""
    return verify_counts(last.get("meta_info"))
