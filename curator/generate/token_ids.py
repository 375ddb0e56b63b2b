"""Token-exact generation: each prompt rendered with the target's own chat template (tools included),
sent to the engine as token ids, and the ids the target produced kept as they are.

What each engine is sent and answers (SGLang's native `/generate`, vLLM's `/v1/completions` with a
token-id prompt) is its own module's: curator/engines/sglang.py and vllm.py.

An engine that answers without the completion ids (an older vLLM ignores return_token_ids) is used
in text mode for that answer, and the record says so. An engine that did not take the prompt ids
as sent, or whose ids do not decode to its own text, fails that record with a permanent error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from curator.engines import ENGINES
from curator.engines.answer import AnswerError
from curator.engines.sampling import SamplingParams
from curator.generate.client import Completion, RequestError, split_reasoning
from training.records.chat_tokens import MalformedRecordError, render, template_messages



@dataclass
class TokenRequest:
    """One request in token mode: where it goes, its body, and the prompt ids it carries."""

    path: str
    body: dict[str, Any]
    prompt_ids: list[int]


# ------------------------------------------------------------------------------ the answer's structure

ToolCalls = list[dict[str, Any]]


def _call(name: str, arguments: Any, index: int) -> dict[str, Any]:
    if isinstance(arguments, str):
        arguments = json.loads(arguments)  # JSONDecodeError is a ValueError: the caller keeps the text
    if not isinstance(arguments, dict):
        raise ValueError("arguments are not an object")
    return {"id": f"call_{index}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _hermes(text: str) -> tuple[str, ToolCalls]:
    blocks = re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S)
    calls: ToolCalls = []
    for i, block in enumerate(blocks):
        obj = json.loads(block)
        calls.append(_call(obj["name"], obj.get("arguments", {}), i))
    return re.sub(r"\s*<tool_call>.*?</tool_call>", "", text, flags=re.S).strip(), calls


def _kimi(text: str) -> tuple[str, ToolCalls]:
    section = re.search(r"<\|tool_calls_section_begin\|>(.*?)(?:<\|tool_calls_section_end\|>|$)", text, re.S)
    if section is None:
        return text, []
    calls: ToolCalls = []
    for call_id, args in re.findall(r"<\|tool_call_begin\|>\s*(.*?)\s*<\|tool_call_argument_begin\|>(.*?)"
                                    r"<\|tool_call_end\|>", section.group(1), re.S):
        name = call_id.split(".", 1)[-1].rsplit(":", 1)[0]
        call = _call(name, args, len(calls))
        call["id"] = call_id
        calls.append(call)
    return text[: section.start()].strip(), calls


def _llama3(text: str) -> tuple[str, ToolCalls]:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):]
    if not body.startswith("{"):
        return text, []
    obj = json.loads(body)
    if not isinstance(obj, dict) or "name" not in obj:
        return text, []
    return "", [_call(obj["name"], obj.get("parameters", obj.get("arguments", {})), 0)]


def _deepseek(text: str) -> tuple[str, ToolCalls]:
    begin = text.find("<｜tool▁calls▁begin｜>")
    if begin < 0:
        return text, []
    calls: ToolCalls = []
    for body in re.findall(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁call▁end｜>", text[begin:], re.S):
        # DeepSeek-V3 writes `function<｜tool▁sep｜>NAME` then the arguments in a ```json block;
        # DeepSeek-V3.1 writes `NAME<｜tool▁sep｜>ARGUMENTS`.
        v3 = re.fullmatch(r"(?:function)?<｜tool▁sep｜>(.*?)\n```json\n(.*?)\n```\s*", body, re.S)
        if v3 is not None:
            name, args = v3.groups()
        else:
            name, sep, args = body.partition("<｜tool▁sep｜>")
            if not sep:
                raise ValueError("a DeepSeek call without <｜tool▁sep｜>")
        calls.append(_call(name.strip(), args, len(calls)))
    return text[:begin].strip(), calls


def _glm(text: str) -> tuple[str, ToolCalls]:
    """GLM-4.5's calls: <tool_call>NAME then <arg_key>K</arg_key><arg_value>V</arg_value> pairs."""
    blocks = re.findall(r"<tool_call>(.*?)</tool_call>", text, re.S)
    calls: ToolCalls = []
    for block in blocks:
        name, _, rest = block.partition("<arg_key>")
        arguments: dict[str, Any] = {}
        for key, value in re.findall(r"(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*(?:<arg_key>|$)", rest, re.S):
            # The template writes a string as it is and any other value as JSON: a value that is not
            # JSON is a string (and "42" comes back as 42: the format itself cannot tell them apart).
            try:
                arguments[key.strip()] = json.loads(value)
            except ValueError:
                arguments[key.strip()] = value
        calls.append(_call(name.strip(), arguments, len(calls)))
    return re.sub(r"\s*<tool_call>.*?</tool_call>", "", text, flags=re.S).strip(), calls


def _harmony(text: str) -> tuple[str, str | None, ToolCalls]:
    reasoning = re.findall(r"<\|channel\|>analysis<\|message\|>(.*?)(?:<\|end\|>|$)", text, re.S)
    final = re.search(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|return\|>|<\|end\|>|$)", text, re.S)
    calls: ToolCalls = []
    # The recipient stands before the channel (`to=functions.X<|channel|>commentary`, as the template
    # renders history) or after it (`<|channel|>commentary to=functions.X`, as gpt-oss often writes).
    for before, after, args in re.findall(
            r"(?:to=functions\.([\w.\-]+)\s*)?<\|channel\|>commentary(?:\s*to=functions\.([\w.\-]+))?[^<]*"
            r"(?:<\|constrain\|>\w+)?<\|message\|>(.*?)(?:<\|call\|>|<\|end\|>|$)", text, re.S):
        if before or after:
            calls.append(_call(before or after, args, len(calls)))
    return (final.group(1) if final else ""), ("\n".join(reasoning) or None), calls


# The tokens that end a turn or the sequence in each template format: the only ones stripped from a
# completion before its structure is read. Tool-call markers are often special tokens too (Kimi-K2's
# <|tool_call_end|>, DeepSeek's <｜tool▁calls▁end｜>), and stripping them loses the call.
END_OF_TURN: dict[str, tuple[str, ...]] = {
    "hermes": ("<|im_end|>", "<|endoftext|>"),
    "kimi": ("<|im_end|>", "[EOS]"),
    "llama3": ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    "deepseek": ("<｜end▁of▁sentence｜>",),
    "glm": ("<|user|>", "<|observation|>", "<|endoftext|>"),  # GLM-4.5 stops on the next turn's marker
    "harmony": ("<|return|>", "<|end|>"),  # <|call|> closes a call: the harmony reader needs it
    "none": (),
}


# Each format's tool-call markers, most specific first: GLM's template also writes <tool_call>, and a
# Llama-3 template names no call marker at all (a call is a bare JSON object after the header).
FORMAT_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kimi", ("<|tool_calls_section_begin|>",)),
    ("harmony", ("<|channel|>",)),
    ("deepseek", ("<｜tool▁calls▁begin｜>",)),
    ("glm", ("<arg_key>",)),
    ("hermes", ("<tool_call>",)),
    ("llama3", ("<|python_tag|>", "<|start_header_id|>")),
)


def _token_strings(tokenizer: Any) -> set[str]:
    """Return the strings of a tokenizer's special and added tokens and of its vocabulary."""
    if tokenizer is None:
        return set()
    tokens = {str(t) for t in getattr(tokenizer, "all_special_tokens", None) or []}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    tokens |= {str(getattr(t, "content", t)) for t in decoder.values()}
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if callable(get_vocab):
        tokens |= set(get_vocab())
    return tokens


def answer_format(chat_template: str, tokenizer: Any = None) -> str:
    """Return the tool-call format a target answers in (hermes, kimi, llama3, deepseek, glm, harmony, none).

    The chat template is read first; a template that writes no call markers (Kimi-K2-Instruct's first
    template renders earlier calls as plain text) still belongs to a tokenizer whose vocabulary holds
    its format's marker tokens, and the target writes those tokens when it calls a tool."""
    template = chat_template or ""
    for name, markers in FORMAT_MARKERS:
        if any(marker in template for marker in markers):
            return name
    tokens = _token_strings(tokenizer)
    for name, markers in FORMAT_MARKERS:
        if any(marker in tokens for marker in markers):
            return name
    return "none"


def parse_answer(text: str, fmt: str) -> tuple[str, str | None, ToolCalls]:
    """Return (content, reasoning, tool_calls) of an answer the target wrote in its own format; a call that
    does not parse stays in the content as text."""
    if fmt == "harmony":
        try:
            return _harmony(text)
        except (ValueError, KeyError, TypeError):
            return text, None, []
    content, reasoning = split_reasoning(text, None)
    parser = {"hermes": _hermes, "kimi": _kimi, "llama3": _llama3, "deepseek": _deepseek, "glm": _glm}.get(fmt)
    if parser is None:
        return content, reasoning, []
    try:
        content, calls = parser(content)
    except (ValueError, KeyError, TypeError):
        return content, reasoning, []
    return content, reasoning, calls


# ------------------------------------------------------------------------------ the mode


class PromptRenderer:
    """Renders prompts with the target's own chat template and tokenizer, as its server would."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise RequestError("the target's tokenizer has no chat template; token-exact generation needs one",
                               status=None, permanent=True, endpoint="")
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.format = answer_format(tokenizer.chat_template, tokenizer)

    def drops_tools(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None) -> bool | None:
        """Return whether the target's template ignores `tools` for `messages`: the prompt rendered with
        them equals the one rendered without (ChatML templates such as SmolLM2's have no tools). None
        when there are no tools, or the template refuses the conversation (generating it says why)."""
        if not tools:
            return None
        try:
            history, _ = template_messages({"id": "", "messages": [dict(m) for m in messages]})
            bare = render(self.tokenizer, history, True, **self.chat_template_kwargs)
            offered = render(self.tokenizer, history, True, **{**self.chat_template_kwargs, "tools": tools})
        except MalformedRecordError:
            return None
        return bare == offered

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Return the ids of `messages` rendered with the target's template and its generation prompt."""
        try:
            history, _ = template_messages({"id": "", "messages": [dict(m) for m in messages]})
            options: dict[str, Any] = dict(self.chat_template_kwargs)
            if tools:
                options["tools"] = tools
            text = render(self.tokenizer, history, True, **options)
        except MalformedRecordError as exc:
            raise RequestError(f"cannot render the prompt with the target's template: {exc}", status=None,
                               permanent=True, endpoint="") from exc
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


class TokenMode:
    """Builds token-id requests for one engine and turns its answers into Completions with ids."""

    def __init__(self, renderer: PromptRenderer, engine: str, model: str, params: SamplingParams) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        self.renderer = renderer
        self.tokenizer = renderer.tokenizer
        self.format = renderer.format
        self.engine = engine
        self.model = model
        self.params = params
        self._specials = sorted({s for s in getattr(self.tokenizer, "all_special_tokens", []) if s}, key=len,
                                reverse=True)
        eos = getattr(self.tokenizer, "eos_token", None)
        self._end_strings = {*END_OF_TURN[self.format], *([eos] if isinstance(eos, str) and eos else [])}
        self.vocab = len(self.tokenizer)  # ids at or past this cannot be decoded, checked, or embedded later

    def request(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None) -> TokenRequest:
        """Return the engine request for the target's answer to `messages`."""
        ids = self.renderer.prompt_ids(messages, tools)
        engine = ENGINES[self.engine]
        return TokenRequest(engine.GENERATE_PATH, engine.token_request(ids, self.params, self.model), ids)

    def completion(self, payload: Any, request: TokenRequest, endpoint: str, latency_s: float) -> Completion:
        """Return the Completion in an engine's answer, with its ids (or in text mode when it sent none)."""
        try:
            answer = ENGINES[self.engine].parse_token_answer(payload, request.prompt_ids, endpoint)
        except AnswerError as exc:
            raise RequestError(str(exc), status=200, permanent=exc.permanent, endpoint=endpoint) from exc
        ids = answer.completion_ids
        if ids is None:
            content, reasoning, calls = parse_answer(answer.text, self.format)
            return Completion(content, reasoning, answer.finish_reason, answer.prompt_tokens,
                              answer.completion_tokens, endpoint, latency_s, tool_calls=calls or None,
                              mode="text", mode_reason=f"{self.engine} engine returned text without token ids")
        if answer.stop_token is not None and (not ids or ids[-1] != answer.stop_token):
            ids = ids + [answer.stop_token]  # the end-of-turn token is part of what the draft must learn
        bad = next((i for i in ids if not 0 <= i < self.vocab), None)
        if bad is not None:  # never stored: hidden-states would index past the target's embedding
            raise RequestError(f"{endpoint} returned token id {bad}, outside the tokenizer's {self.vocab} ids",
                               status=200, permanent=True, endpoint=endpoint)
        decoded = self.tokenizer.decode(ids, skip_special_tokens=False)
        if not self._matches(decoded, answer.text):
            raise RequestError(f"{endpoint} returned token ids that do not decode to its text "
                               f"({len(ids)} ids decode to {decoded[:60]!r}, text is {answer.text[:60]!r})",
                               status=200, permanent=True, endpoint=endpoint)
        stop = self.tokenizer.decode([answer.stop_token], skip_special_tokens=False) if answer.stop_token is not None else None
        content, reasoning, calls = parse_answer(self._strip_end(decoded, stop), self.format)
        return Completion(content, reasoning, answer.finish_reason, len(request.prompt_ids), len(ids), endpoint,
                          latency_s, tool_calls=calls or None, prompt_ids=request.prompt_ids, completion_ids=ids,
                          mode="token")

    def _strip_end(self, text: str, stop: str | None = None) -> str:
        """Return `text` without its trailing end-of-turn/end-of-sequence tokens (and the engine's stop token)."""
        ends = sorted(self._end_strings | ({stop} if stop else set()), key=len, reverse=True)
        changed = True
        while changed:
            changed = False
            for s in ends:
                if text.endswith(s):
                    text, changed = text[: -len(s)], True
        return text

    def _matches(self, decoded: str, text: str) -> bool:
        # Engines leave the stop token out of their text (and may strip other specials): compare
        # with the special-token strings taken out of both.
        def plain(s: str) -> str:
            for special in self._specials:
                s = s.replace(special, "")
            return s.strip()

        return plain(decoded) == plain(text)
