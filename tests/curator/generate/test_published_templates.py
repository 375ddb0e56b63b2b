"""The answer format of a target is found from its published chat template and its tokenizer's
vocabulary, and its tool calls are stored as structured calls, for each family's own template.

The templates in tests/fixtures/chat_templates/published are the families' published files (their
sources are in SOURCES.md there). Each tokenizer is a byte-level BPE trained here on a few lines,
with the family's special and added tokens as its tokenizer_config.json lists them: nothing is
downloaded.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from curator.generate.client import SamplingParams
from curator.generate.token_ids import PromptRenderer, TokenMode, answer_format, parse_answer

PUBLISHED = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates" / "published"

KIMI_SPECIAL = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                "<|media_start|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
                "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>", "<|tool_call_end|>"]
# file -> (bos, eos, special tokens, added tokens that are not special)
FAMILIES: dict[str, tuple[str | None, str, list[str], list[str]]] = {
    "kimi_k2_instruct": ("[BOS]", "[EOS]", KIMI_SPECIAL, []),
    "kimi_k2_thinking": ("[BOS]", "[EOS]", KIMI_SPECIAL, ["<think>", "</think>"]),
    "deepseek_v3_1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                      ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                       "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                       "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                       "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"], ["<think>", "</think>"]),
    "qwen3": (None, "<|im_end|>", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]),
    "gpt_oss": ("<|startoftext|>", "<|return|>",
                ["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                 "<|constrain|>", "<|return|>", "<|call|>"], []),
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>",
                 ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"], []),
    "glm_4_5": (None, "<|endoftext|>",
                ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                 "<|assistant|>", "<|observation|>"],
                ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                 "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink"]),
}

CORPUS = [
    "Read parser.py and tell me what it does. I should open the file first. The parser reads JSON lines.",
    '{"path": "parser.py"} {"name": "read_file", "parameters": {"path": "parser.py"}} functions.read_file:0',
    "You are a helpful assistant. system user assistant tool analysis commentary final json functions",
    "Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024 Environment: ipython Reasoning: medium",
    "Given the following functions, please respond with a JSON for a function call with its proper arguments",
] * 4

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
ARGS = {"path": "parser.py"}

# file -> (the format, the answer exactly as the target writes it, the token it stops on)
ANSWERS: dict[str, tuple[str, str, str]] = {
    # The answer of issue 33: Kimi-K2-Instruct's first template names none of these tokens.
    "kimi_k2_instruct": ("kimi", "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0"
                                 '<|tool_call_argument_begin|>{"path": "parser.py"}<|tool_call_end|>'
                                 "<|tool_calls_section_end|>", "<|im_end|>"),
    "kimi_k2_thinking": ("kimi", "<think>I should open the file first.</think><|tool_calls_section_begin|>"
                                 '<|tool_call_begin|>functions.read_file:0<|tool_call_argument_begin|>{"path": '
                                 '"parser.py"}<|tool_call_end|><|tool_calls_section_end|>', "<|im_end|>"),
    # DeepSeek-V3.1 writes NAME<｜tool▁sep｜>ARGUMENTS (V3 wrote the arguments in a ```json block).
    "deepseek_v3_1": ("deepseek", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{"path": "parser.py"}'
                                  "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "<｜end▁of▁sentence｜>"),
    "qwen3": ("hermes", '<think>\nI should open the file first.\n</think>\n\n<tool_call>\n{"name": "read_file", '
                        '"arguments": {"path": "parser.py"}}\n</tool_call>', "<|im_end|>"),
    # gpt-oss names the recipient after the channel when it writes a call.
    "gpt_oss": ("harmony", "<|channel|>analysis<|message|>I should open the file first.<|end|><|start|>assistant"
                           '<|channel|>commentary to=functions.read_file <|constrain|>json<|message|>{"path": '
                           '"parser.py"}', "<|call|>"),
    "llama3_1": ("llama3", '{"name": "read_file", "parameters": {"path": "parser.py"}}', "<|eot_id|>"),
    "glm_4_5": ("glm", "\n<think>I should open the file first.</think>\n<tool_call>read_file\n<arg_key>path</arg_key>"
                       "\n<arg_value>parser.py</arg_value>\n</tool_call>", "<|observation|>"),
}


@cache
def tokenizer(family: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained here, with the family's tokens and its published template."""
    bos, eos, specials, added = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   additional_special_tokens=[s for s in specials if s not in (bos, eos)],
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = (PUBLISHED / f"{family}.jinja").read_text(encoding="utf-8")
    return fast


def test_every_published_template_is_here_with_its_source() -> None:
    sources = (PUBLISHED / "SOURCES.md").read_text(encoding="utf-8")
    assert sorted(p.stem for p in PUBLISHED.glob("*.jinja")) == sorted(FAMILIES)
    for family in FAMILIES:
        assert f"| {family}.jinja |" in sources


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_the_answer_format_comes_from_the_template_and_the_tokenizer(family: str) -> None:
    tok = tokenizer(family)
    assert answer_format(tok.chat_template, tok) == ANSWERS[family][0]


def test_kimi_k2_instructs_first_template_alone_names_no_format_and_its_vocabulary_does() -> None:
    tok = tokenizer("kimi_k2_instruct")
    assert "<|tool_calls_section_begin|>" not in tok.chat_template
    assert answer_format(tok.chat_template) == "none"
    assert answer_format(tok.chat_template, tok) == "kimi"


def sglang_answer(tok: PreTrainedTokenizerFast, completion: str, stop: str, prompt_ids: list[int]) -> dict:
    """SGLang's /generate answer for `completion`: the ids without the stop token, which it names."""
    ids = tok(completion, add_special_tokens=False)["input_ids"]
    stop_id = tok.convert_tokens_to_ids(stop)
    return {"text": completion, "output_ids": ids,
            "meta_info": {"finish_reason": {"type": "stop", "matched": stop_id}, "prompt_tokens": len(prompt_ids),
                          "completion_tokens": len(ids) + 1}}


@pytest.mark.parametrize("family", sorted(ANSWERS))
def test_a_token_exact_tool_call_is_stored_as_a_structured_call(family: str) -> None:
    _, completion, stop = ANSWERS[family]
    tok = tokenizer(family)
    mode = TokenMode(PromptRenderer(tok), "sglang", "target", SamplingParams(max_tokens=64))
    request = mode.request([{"role": "user", "content": "Read parser.py and tell me what it does."}], TOOLS)
    prompt = tok.decode(request.prompt_ids, skip_special_tokens=False)
    # Each template declares the tool, but DeepSeek-V3.1's, which leaves `tools` out (its model card has
    # the caller describe tools in the system message).
    assert ("read_file" in prompt) == (family != "deepseek_v3_1")
    result = mode.completion(sglang_answer(tok, completion, stop, request.prompt_ids), request, "http://e", 0.0)
    assert result.mode == "token"
    assert result.tool_calls is not None and len(result.tool_calls) == 1, (result.content, result.tool_calls)
    call = result.tool_calls[0]["function"]
    assert call["name"] == "read_file" and json.loads(call["arguments"]) == ARGS
    assert "read_file" not in (result.content or "") and "parser.py" not in (result.content or "")
    assert tok.decode(result.completion_ids, skip_special_tokens=False) == completion + stop  # ids as generated
    if "<think>" in completion or "analysis" in completion:
        assert result.reasoning_content == "I should open the file first."


def test_deepseek_v3_calls_with_a_json_block_still_parse() -> None:
    text = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n"
            '{"path": "parser.py"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    _, _, calls = parse_answer(text, "deepseek")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("read_file", ARGS)]


def test_glm_arguments_keep_strings_as_strings_and_read_json_values() -> None:
    text = ("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>open files</arg_value>\n"
            "<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n<arg_key>tags</arg_key>\n"
            '<arg_value>["a", "b"]</arg_value>\n</tool_call>')
    content, _, calls = parse_answer(text, "glm")
    assert content == ""
    assert json.loads(calls[0]["function"]["arguments"]) == {"query": "open files", "limit": 5, "tags": ["a", "b"]}


def test_a_harmony_preamble_without_a_recipient_does_not_swallow_the_call_after_it() -> None:
    text = ("<|channel|>commentary<|message|>Opening the file.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.read_file <|constrain|>json<|message|>{"path": "parser.py"}<|call|>')
    _, _, calls = parse_answer(text, "harmony")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("read_file", ARGS)]
