"""Token ids and loss mask of one regenerated conversation, rendered with the target's chat template.

The loss mask covers exactly what the draft must learn to predict: the content of the assistant
messages marked `train: true` (with their reasoning text and their end-of-turn token), never the
role headers, never system/user/tool turns, never the context answers of `turns: last` rows.

It is found without knowing the template: message k's answer is the text between the conversation
rendered up to k with the generation prompt (which ends with the assistant header) and the
conversation rendered through k. Trailing whitespace after the end-of-turn token is left out.
Where a template renders history differently from a prefix (Qwen3-style templates drop the
reasoning of earlier turns), the answer is located in the full rendering by its text instead.
Character spans become token positions through the fast tokenizer's offsets (or, for a slow
tokenizer, by tokenizing prefixes).
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
from training.text import is_valid_unicode

ROLES = ("system", "user", "assistant", "tool")


class MalformedRecordError(TrainingError):
    """A generation-output record cannot be tokenised (missing fields, template refuses it)."""


@dataclass
class ChatTokens:
    """A tokenised conversation: ids [T], loss mask [T] and how many answers it trains on."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    train_messages: int
    truncated: bool = False

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def template_messages(record: dict[str, Any]) -> tuple[list[dict[str, str]], list[bool]]:
    """Return (messages as the chat template takes them, train flag per message) from a record."""
    raw = record.get("messages")
    if not isinstance(raw, list) or not raw:
        raise MalformedRecordError(f"record {record.get('id')!r} has no messages")
    messages, train = [], []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise MalformedRecordError(f"record {record.get('id')!r}: message {i} lacks a valid role or string content")
        if not is_valid_unicode(m["content"]) or not is_valid_unicode(m.get("reasoning_content") or ""):
            raise MalformedRecordError(f"record {record.get('id')!r}: message {i} holds a lone surrogate (not Unicode text)")
        out = {"role": m["role"], "content": m["content"]}
        if m["role"] == "assistant" and isinstance(m.get("reasoning_content"), str) and m["reasoning_content"]:
            out["reasoning_content"] = m["reasoning_content"]
        messages.append(out)
        is_train = bool(m.get("train", False))
        if is_train and m["role"] != "assistant":
            raise MalformedRecordError(f"record {record.get('id')!r}: message {i} is marked train but is {m['role']!r}")
        train.append(is_train)
    return messages, train


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    if not messages:
        return ""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as exc:  # jinja raises TemplateError and others for conversations a template refuses
        raise MalformedRecordError(f"the chat template refused the conversation: {exc}") from exc


def _special_strings(tokenizer: Any) -> list[str]:
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    added = getattr(tokenizer, "get_added_vocab", None)
    if added is not None:
        specials.update(added())
    return sorted((s for s in specials if s), key=len, reverse=True)


def answer_spans(tokenizer: Any, messages: list[dict[str, str]], train: list[bool]) -> tuple[str, list[tuple[int, int]]]:
    """Return (the full rendering, character spans of every train message's answer in it)."""
    full = _render(tokenizer, messages, False)
    spans: list[tuple[int, int]] = []
    cursor = 0
    specials = None
    for k, is_train in enumerate(train):
        if not is_train:
            continue
        head = _render(tokenizer, messages[:k], True)
        through = _render(tokenizer, messages[: k + 1], False)
        if full.startswith(through) and through.startswith(head) and len(head) >= cursor:
            start, end = len(head), len(through)
            while end > start and through[end - 1].isspace():
                end -= 1
        else:
            specials = specials if specials is not None else _special_strings(tokenizer)
            start, end = _locate(full, messages[k], cursor, specials)
        spans.append((start, end))
        cursor = end
    return full, spans


def _locate(full: str, message: dict[str, str], cursor: int, specials: list[str]) -> tuple[int, int]:
    """Return the span of an answer found by its text: reasoning (if rendered) to content end + end token."""
    content = message["content"]
    pos = full.find(content, cursor) if content else -1
    if pos < 0:
        raise MalformedRecordError("an assistant answer is not found in the rendered conversation")
    start, end = pos, pos + len(content)
    reasoning = message.get("reasoning_content")
    if reasoning:
        rpos = full.find(reasoning, cursor, pos)
        if rpos >= 0:
            start = rpos
    for s in specials:  # longest first, so "<|im_end|>" is not read as a shorter token
        if full.startswith(s, end):
            end += len(s)
            break
    return start, end


def _token_starts(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """Return (token ids of `text`, character start of each token)."""
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [int(a) for a, _ in enc["offset_mapping"]]
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    # Slow tokenizers have no offsets: decode growing prefixes to find where each token starts.
    starts, pos = [], 0
    for i in range(len(ids)):
        starts.append(pos)
        pos = len(tokenizer.decode(ids[: i + 1]))
    return ids, starts


def tokenize_record(record: dict[str, Any], tokenizer: Any, max_len: int | None = None) -> ChatTokens:
    """Return the record's token ids and loss mask under the tokenizer's chat template (clipped to max_len)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TrainingError("the target's tokenizer has no chat template; pass a tokenizer that has one")
    messages, train = template_messages(record)
    if not any(train):
        raise MalformedRecordError(f"record {record.get('id')!r} has no assistant message marked train")
    text, spans = answer_spans(tokenizer, messages, train)
    ids, starts = _token_starts(tokenizer, text)
    mask = [False] * len(ids)
    j = 0
    for i, s in enumerate(starts):
        while j < len(spans) and s >= spans[j][1]:
            j += 1
        if j < len(spans) and spans[j][0] <= s < spans[j][1]:
            mask[i] = True
    truncated = max_len is not None and len(ids) > max_len
    if truncated:
        ids, mask = ids[:max_len], mask[:max_len]
    return ChatTokens(
        input_ids=torch.tensor(ids, dtype=torch.long),
        loss_mask=torch.tensor(mask, dtype=torch.bool),
        train_messages=sum(train),
        truncated=truncated,
    )


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
    files = sorted(root.glob("shard-*.jsonl"))
    if not files:
        raise TrainingError(f"{root} has no shard-*.jsonl files; is it the output of `curator generate`?")
    return files


def iter_generation(gen_dir: str | Path, stats: GenerationReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Yield every well-formed record (a dict with a string id and a messages list); count the rest."""
    stats = stats if stats is not None else GenerationReadStats()
    for path in generation_files(gen_dir):
        stats.files += 1
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except (json.JSONDecodeError, RecursionError):  # RecursionError: nested too deep to parse
                    stats.malformed += 1
                    continue
                if not isinstance(rec, dict) or not isinstance(rec.get("id"), str) or not isinstance(rec.get("messages"), list):
                    stats.malformed += 1
                    continue
                stats.records += 1
                yield rec
