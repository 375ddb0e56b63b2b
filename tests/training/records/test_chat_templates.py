"""Loss masks under the chat formats real targets use: the mask is exactly what the target generated.

Each template in tests/fixtures/chat_templates is written by the project to a model's documented
format (Llama-3.1, Qwen3, Kimi-K2(-Thinking), DeepSeek-V3, gpt-oss harmony); each test builds a
byte-level BPE tokenizer on the spot with that family's special tokens.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from training.records.chat_tokens import MalformedRecordError, render, template_messages, template_options, tokenize_rows

TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates"

# family -> (bos, eos, special tokens, added non-special tokens)
FAMILIES: dict[str, tuple[str | None, str, list[str], list[str]]] = {
    "llama31": ("<|begin_of_text|>", "<|eot_id|>",
                ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"], []),
    "qwen3": (None, "<|im_end|>", ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
              ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]),
    "kimi_k2": (None, "<|im_end|>",
                ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>",
                 "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                 "<|tool_call_argument_begin|>", "<|tool_call_end|>"], ["<think>", "</think>"]),
    "deepseek_v3": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                    ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                     "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                     "<｜tool▁output▁end｜>"], []),
    "gpt_oss": (None, "<|return|>",
                ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"], []),
}

CORPUS = [
    "You are a helpful assistant. What is the weather in Paris? Answer yes or no: is it sunny?",
    "I should look up the weather. The sky is sunny. reply with the word yes, again",
    '{"name": "get_weather", "parameters": {"city": "Paris"}} {"sky": "sunny"} functions.get_weather:0',
    "Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024 Environment: ipython",
    "Given the following functions, please respond with a JSON for a function call with its proper arguments",
    "system user assistant tool analysis commentary final json namespace functions type string object",
] * 4

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}


@cache
def tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained here, with the family's special tokens and chat template."""
    bos, eos, specials, added = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = (TEMPLATES / f"{family}.jinja").read_text()
    return fast


def agentic_record(**extra: Any) -> dict[str, Any]:
    """System, user, a reasoned tool call, its result, a reasoned final answer (both answers trained)."""
    return {"id": "a1", "tools": TOOLS, **extra, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris? Answer yes or no: is it sunny?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should look up the weather.",
         "tool_calls": [CALL], "train": True},
        {"role": "tool", "tool_call_id": CALL["id"], "content": '{"sky": "sunny"}'},
        {"role": "assistant", "content": "yes", "reasoning_content": "The sky is sunny.", "train": True},
    ]}


def masked_spans(tok: Any, ids: list[int], mask: list[bool]) -> list[tuple[int, str]]:
    """Return (start position, decoded text) of every run of masked tokens."""
    spans, i = [], 0
    while i < len(ids):
        if mask[i]:
            j = i
            while j < len(ids) and mask[j]:
                j += 1
            spans.append((i, tok.decode(ids[i:j], skip_special_tokens=False)))
            i = j
        else:
            i += 1
    return spans


def assert_exact(record: dict[str, Any], family: str, want: list[list[str]]) -> None:
    """Each row masks exactly `want` (per row, in order), and the ids before each answer are exactly
    the ids of the prompt the target answered (the conversation up to it, with the generation prompt)."""
    tok = tokenizer(family)
    rows = tokenize_rows(record, tok)
    messages, train = template_messages(record)
    options = template_options(record)
    answer_at = [k for k, t in enumerate(train) if t]
    got = []
    for row in rows:
        ids, mask = row.input_ids.tolist(), row.loss_mask.tolist()
        spans = masked_spans(tok, ids, mask)
        got.append([text for _, text in spans])
        last = answer_at.index(int(row.suffix[1:])) if row.suffix else len(answer_at) - 1
        for (start, _), k in zip(spans, answer_at[last - len(spans) + 1 : last + 1]):
            prompt = render(tok, messages[:k], True, **options)
            assert ids[:start] == tok(prompt, add_special_tokens=False)["input_ids"]
    assert got == want


# ------------------------------------------------------------------ one agentic conversation, five formats

AGENTIC = {
    "llama31": [['{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>', "yes<|eot_id|>"]],
    "qwen3": [['<think>\nI should look up the weather.\n</think>\n\n<tool_call>\n'
               '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
               "<think>\nThe sky is sunny.\n</think>\n\nyes<|im_end|>"]],
    "kimi_k2": [["<think>I should look up the weather.</think><|tool_calls_section_begin|><|tool_call_begin|>"
                 'functions.get_weather:0<|tool_call_argument_begin|>{"city":"Paris"}<|tool_call_end|>'
                 "<|tool_calls_section_end|><|im_end|>",
                 "<think>The sky is sunny.</think>yes<|im_end|>"]],
    "deepseek_v3": [["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                     '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
                     "yes<｜end▁of▁sentence｜>"]],
    "gpt_oss": [["<|channel|>analysis<|message|>I should look up the weather.<|end|><|start|>assistant "
                 'to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
                 "<|channel|>analysis<|message|>The sky is sunny.<|end|><|start|>assistant<|channel|>final"
                 "<|message|>yes<|return|>"]],
}


@pytest.mark.parametrize("family", sorted(AGENTIC))
def test_mask_is_exactly_the_generated_reasoning_tool_call_answer_and_end_of_turn(family: str) -> None:
    assert_exact(agentic_record(), family, AGENTIC[family])


@pytest.mark.parametrize("family", sorted(AGENTIC))
def test_tools_reach_the_template_and_system_user_tool_tokens_stay_unmasked(family: str) -> None:
    tok = tokenizer(family)
    row = tokenize_rows(agentic_record(), tok)[0]
    unmasked = tok.decode(row.input_ids[~row.loss_mask].tolist(), skip_special_tokens=False)
    for given in ("Weather of a city",  # the tool's schema, as the template declares it
                  "What is the weather in Paris? Answer yes or no: is it sunny?", '{"sky": "sunny"}'):
        assert given in unmasked
    assert row.mode == "text"


# ------------------------------------------------------------------ history the template re-renders


def test_qwen3_short_answer_quoted_by_the_user_is_masked_where_the_target_wrote_it() -> None:
    """The old text search took the user's `yes<|im_end|>` for the answer; rendering prefixes cannot."""
    record = {"id": "q", "chat_template_kwargs": {"enable_thinking": False}, "messages": [
        {"role": "user", "content": "reply with the word yes"},
        {"role": "assistant", "content": "yes", "train": True},
        {"role": "user", "content": "again, reply with the word yes"},
        {"role": "assistant", "content": "yes", "train": True},
    ]}
    # Thinking off: the generation prompt wrote the empty think block, the target wrote "yes".
    # The first answer is re-rendered without that block in history: it gets a row of its own.
    assert_exact(record, "qwen3", [["yes<|im_end|>"], ["yes<|im_end|>"]])


@pytest.mark.parametrize("family,want", [
    ("qwen3", [["<think>\nsecond thought\n</think>\n\nyes<|im_end|>"],
               ["<think>\nfirst thought\n</think>\n\nyes<|im_end|>"]]),
    ("kimi_k2", [["<think>second thought</think>yes<|im_end|>"], ["<think>first thought</think>yes<|im_end|>"]]),
    ("gpt_oss", [["<|channel|>analysis<|message|>second thought<|end|><|start|>assistant<|channel|>final"
                  "<|message|>yes<|return|>"],
                 ["<|channel|>analysis<|message|>first thought<|end|><|start|>assistant<|channel|>final"
                  "<|message|>yes<|return|>"]]),
])
def test_an_answer_whose_reasoning_history_drops_gets_its_own_row(family: str, want: list[list[str]]) -> None:
    record = {"id": "m", "messages": [
        {"role": "user", "content": "reply with the word yes"},
        {"role": "assistant", "content": "yes", "reasoning_content": "first thought", "train": True},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "yes", "reasoning_content": "second thought", "train": True},
    ]}
    assert_exact(record, family, want)
    assert [r.suffix for r in tokenize_rows(record, tokenizer(family))] == ["", "#1"]


@pytest.mark.parametrize("family", ["llama31", "deepseek_v3"])
def test_templates_that_keep_history_as_written_give_one_row_with_every_answer(family: str) -> None:
    record = {"id": "p", "messages": [
        {"role": "user", "content": "reply with the word yes"},
        {"role": "assistant", "content": "yes", "train": True},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "no", "train": True},
    ]}
    eos = FAMILIES[family][1]
    assert_exact(record, family, [[f"yes{eos}", f"no{eos}"]])


def test_context_answers_of_a_turns_last_row_are_not_masked() -> None:
    record = {"id": "l", "messages": [
        {"role": "user", "content": "reply with the word yes"},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "no", "train": True},
    ]}
    assert_exact(record, "llama31", [["no<|eot_id|>"]])


# ------------------------------------------------------------------ token mode: the stored ids, as they are


def test_token_mode_rows_are_the_stored_ids_with_one_span_per_generation_that_is_a_true_prefix() -> None:
    record = {"id": "t", "mode": "token", "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "train": True},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d", "train": True},
        {"role": "user", "content": "e"}, {"role": "assistant", "content": "f", "train": True},
    ], "generations": [
        {"message": 1, "prompt_ids": [1, 2], "completion_ids": [3, 4]},
        {"message": 3, "prompt_ids": [1, 2, 3, 4, 5], "completion_ids": [6]},
        # The template re-rendered history here (ids 3, 4 became 9): not a prefix, a row of its own.
        {"message": 5, "prompt_ids": [1, 2, 9, 5, 6, 7], "completion_ids": [8, 0]},
    ]}
    rows = tokenize_rows(record)  # no tokenizer: nothing is re-tokenised
    assert [r.input_ids.tolist() for r in rows] == [[1, 2, 9, 5, 6, 7, 8, 0], [1, 2, 3, 4, 5, 6]]
    assert [r.loss_mask.tolist() for r in rows] == [[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 0, 1]]
    assert [r.suffix for r in rows] == ["", "#3"]
    assert {r.mode for r in rows} == {"token"}


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("change,reason", [
    (lambda r: r["messages"][2]["tool_calls"][0]["function"].update(arguments="{city: Paris"), "not valid JSON"),
    (lambda r: r["messages"][3].update(tool_call_id="call_9"), "no earlier assistant message made"),
    (lambda r: r["messages"][1].update(train=True), "marked train but is 'user'"),
    (lambda r: r.update(mode="token"), "no generations"),
])
def test_bad_records_raise_a_clear_malformed_error(change: Any, reason: str) -> None:
    record = json.loads(json.dumps(agentic_record()))
    change(record)
    with pytest.raises(MalformedRecordError, match=reason):
        tokenize_rows(record, tokenizer("qwen3"))
