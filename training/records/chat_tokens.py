"""Token ids and loss masks of one generation record: the training rows it yields.

The contract: every loss-masked token is a token the target generated, at the position and after
exactly the prefix ids it had when it generated it.

Token mode (the record stores each generation's prompt ids and completion ids, see
training/records/gen_record.py): a row is one generation's prompt + completion; an earlier generation of
the same conversation shares the row when its prompt + completion ids are a true prefix of that
row, otherwise it gets a row of its own. Nothing is re-tokenised.

Text mode (only text is known): message k's answer is what the template adds between the
conversation up to k rendered with the generation prompt (which ends where the target started
writing) and the conversation through k. Spans are found by rendering prefixes, never by searching
the text: a row is the rendering through its last answer, and an earlier answer shares it only
when its own prefix rendering is a prefix of the row (templates such as Qwen3, Kimi-K2-Thinking
and gpt-oss re-render history differently, e.g. dropping earlier reasoning: such an answer gets
its own row, as the target saw it). Each prompt and each answer is tokenised on its own, as a
server tokenises the prompt and the target emits the answer, and a shared row is kept only when
the ids before each answer equal the ids of that answer's own prompt.
Trailing whitespace after an answer's end-of-turn token is never masked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.errors import TrainingError
from training.records.gen_record import messages_problem, record_problem
from training.records.gen_shards import SHARD_GLOB, record_lines, shard_paths

class MalformedRecordError(TrainingError):
    """A generation-output record cannot be tokenised (missing fields, template refuses it)."""


@dataclass
class ChatTokens:
    """A tokenised training row: ids [T], loss mask [T], how many answers it trains on and how it was made."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    train_messages: int
    truncated: bool = False
    mode: str = "text"  # "token": the target's stored ids; "text": re-rendered and re-tokenised
    suffix: str = ""  # "" for the row holding the last answer; "#k" for a row of its own ending at message k

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    # Templates take the arguments as a mapping (they print them with tojson); the record keeps
    # OpenAI's JSON text, checked to be an object by record_problem.
    fn = call["function"]
    args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
    return {"id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": args}}


def template_messages(record: dict[str, Any]) -> tuple[list[dict[str, Any]], list[bool]]:
    """Return (messages as the chat template takes them, train flag per message) from a record."""
    raw = record.get("messages")
    problem = messages_problem(raw)
    if problem:
        raise MalformedRecordError(f"record {record.get('id')!r}: {problem}")
    assert isinstance(raw, list)  # messages_problem passed it, so it is a non-empty list
    messages, train = [], []
    for m in raw:
        out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        reasoning = m.get("reasoning_content")
        if m["role"] == "assistant" and isinstance(reasoning, str) and reasoning:
            # Qwen3/Kimi templates read reasoning_content, gpt-oss's reads thinking.
            out["reasoning_content"] = reasoning
            out["thinking"] = reasoning
        if m.get("tool_calls"):
            out["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                out[key] = m[key]
        messages.append(out)
        train.append(bool(m.get("train", False)))
    return messages, train


def template_options(record: dict[str, Any]) -> dict[str, Any]:
    """Return the keyword arguments the record's prompts were rendered with (tools, template kwargs)."""
    options: dict[str, Any] = dict(record.get("chat_template_kwargs") or {})
    if record.get("tools"):
        options["tools"] = record["tools"]
    return options


def render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, **options: Any) -> str:
    """Return the chat template's text for `messages` ("" for none); MalformedRecordError if it refuses them."""
    if not messages:
        return ""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                             **options)
    except Exception as exc:  # jinja raises TemplateError and others for conversations a template refuses
        raise MalformedRecordError(f"the chat template refused the conversation: {exc}") from exc


def _special_strings(tokenizer: Any) -> list[str]:
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    added = getattr(tokenizer, "get_added_vocab", None)
    if added is not None:
        specials.update(added())
    return sorted((s for s in specials if s), key=len, reverse=True)


@dataclass
class Answer:
    """One train answer in text mode: its index, the prompt text it was generated after, its text."""

    message: int
    head: str
    text: str
    tail: str = ""  # what the template writes after the answer (a newline after the end-of-turn token)


def text_answers(tokenizer: Any, messages: list[dict[str, Any]], train: list[bool],
                 **options: Any) -> list[Answer]:
    """Return every train answer as (its prompt rendering, the text the template adds for it)."""
    answers = []
    for k, is_train in enumerate(train):
        if not is_train:
            continue
        head = render(tokenizer, messages[:k], True, **options)
        through = render(tokenizer, messages[: k + 1], False, **options)
        if not through.startswith(head):
            raise MalformedRecordError(
                f"the chat template renders answer {k} differently from the prompt it was generated after "
                "(its rendering does not start with the generation prompt)"
            )
        text = through[len(head):].rstrip()
        answers.append(Answer(k, head, text, through[len(head) + len(text):]))
    return answers


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _text_rows(tokenizer: Any, answers: list[Answer]) -> list[tuple[list[int], list[bool], list[int]]]:
    """Return rows (ids, mask, answer message indices), latest answer first."""
    rows = []
    pending = list(answers)
    while pending:
        last = pending.pop()
        row_text = last.head + last.text
        members = [a for a in pending if row_text.startswith(a.head + a.text)] + [last]
        ids: list[int] = []
        mask: list[bool] = []
        kept: list[Answer] = []
        cursor = 0
        for a in members:
            between = _ids(tokenizer, row_text[cursor:len(a.head)])
            prompt = ids + between
            if kept and prompt != _ids(tokenizer, a.head):
                continue  # its own prompt tokenises differently: it goes to a row of its own
            answer = _ids(tokenizer, a.text)
            ids, mask = prompt + answer, mask + [False] * len(between) + [True] * len(answer)
            cursor = len(a.head) + len(a.text)
            kept.append(a)
        if kept[-1] is not last:  # the last answer's prompt always fits: it is the row's start
            raise MalformedRecordError("internal: a row lost its last answer")
        tail = _ids(tokenizer, last.tail)  # unmasked, so a row reads as the template writes it
        ids, mask = ids + tail, mask + [False] * len(tail)
        pending = [a for a in pending if a not in kept]
        rows.append((ids, mask, [a.message for a in kept]))
    return rows


def _token_rows(record: dict[str, Any]) -> list[tuple[list[int], list[bool], list[int]]]:
    """Return rows (ids, mask, answer message indices) from a token-mode record's generations, latest first."""
    pending = sorted(record["generations"], key=lambda g: g["message"])
    rows = []
    while pending:
        last = pending.pop()
        ids = last["prompt_ids"] + last["completion_ids"]
        mask = [False] * len(ids)
        members = []
        for g in pending + [last]:
            start = len(g["prompt_ids"])
            end = start + len(g["completion_ids"])
            if ids[:end] == g["prompt_ids"] + g["completion_ids"]:
                mask[start:end] = [True] * (end - start)
                members.append(g)
        pending = [g for g in pending if g not in members]
        rows.append((ids, mask, [g["message"] for g in members]))
    return rows


def tokenize_rows(record: dict[str, Any], tokenizer: Any | None = None,
                  max_len: int | None = None, vocab_size: int | None = None) -> list[ChatTokens]:
    """Return the training rows of a record (the one holding the last answer first), each clipped to max_len.

    Token-mode records need no tokenizer; text-mode records need the target's (with its chat template).
    A stored id the target cannot take (negative, past int64, at/past `vocab_size`) is a MalformedRecordError.
    """
    problem = record_problem(record, vocab_size)
    if problem:
        raise MalformedRecordError(f"record {record.get('id')!r}: {problem}")
    if record.get("mode") == "token":
        rows, mode = _token_rows(record), "token"
    else:
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            raise TrainingError("the target's tokenizer has no chat template; pass a tokenizer that has one")
        messages, train = template_messages(record)
        if not any(train):
            raise MalformedRecordError(f"record {record.get('id')!r} has no assistant message marked train")
        rows, mode = _text_rows(tokenizer, text_answers(tokenizer, messages, train, **template_options(record))), "text"
    out = []
    for n, (ids, mask, members) in enumerate(rows):
        truncated = max_len is not None and len(ids) > max_len
        if truncated:
            ids, mask = ids[:max_len], mask[:max_len]
        out.append(ChatTokens(
            input_ids=torch.tensor(ids, dtype=torch.long),
            loss_mask=torch.tensor(mask, dtype=torch.bool),
            train_messages=len(members),
            truncated=truncated,
            mode=mode,
            suffix="" if n == 0 else f"#{max(members)}",
        ))
    return out


def tokenize_record(record: dict[str, Any], tokenizer: Any, max_len: int | None = None) -> ChatTokens:
    """Return the record's row that holds its last answer (see tokenize_rows for all of them)."""
    return tokenize_rows(record, tokenizer, max_len)[0]


def chat_template_sha256(tokenizer: Any) -> str:
    """Return the SHA-256 of the tokenizer's chat template text ("" when it has none)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = json.dumps(template, sort_keys=True)
    return hashlib.sha256(template.encode("utf-8")).hexdigest() if template else ""


def tokenizer_sha256(tokenizer: Any) -> str:
    """Return the SHA-256 of the tokenizer's vocabulary and special tokens (same ids <=> same hash)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    payload = json.dumps({"vocab": vocab, "special": sorted(_special_strings(tokenizer))}, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass
class GenerationReadStats:
    """Counts from reading a generation output directory."""

    files: int = 0
    records: int = 0
    malformed: int = 0


def generation_files(gen_dir: str | Path) -> list[Path]:
    """Return the generation output's shard files in order (shard-00000.jsonl, ...)."""
    root = Path(gen_dir)
    if not root.is_dir():
        raise TrainingError(f"{root} is not a directory; pass the --out directory of `curator generate`")
    files = shard_paths(root)
    if not files:
        raise TrainingError(f"{root} has no {SHARD_GLOB} files; is it the output of `curator generate`?")
    return files


def iter_generation(gen_dir: str | Path, stats: GenerationReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Yield every well-formed record (a dict with a string id and a messages list); count the rest."""
    stats = stats if stats is not None else GenerationReadStats()
    for path in generation_files(gen_dir):
        stats.files += 1
        for rec in record_lines(path):
            if rec is None or not isinstance(rec.get("id"), str) or not isinstance(rec.get("messages"), list):
                stats.malformed += 1
                continue
            stats.records += 1
            yield rec
