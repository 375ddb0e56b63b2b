"""Token mode keeps a tool call whose markers are special tokens: only the end-of-turn and
end-of-sequence tokens of the template's format are stripped before the answer is read.

Each case uses the family's tokenizer (tests/training/records/test_chat_templates.py) with every tool-call marker of
its format registered as a special token, as Kimi-K2's and DeepSeek-V3's tokenizers do."""

from __future__ import annotations

import pytest

from curator.engines.sampling import SamplingParams
from curator.generate.token_ids import PromptRenderer, TokenMode, TokenRequest
from tests.training.records.test_chat_templates import TOOLS, tokenizer

ARGS = '{"city": "Paris"}'
# family -> (tool-call markers registered as special, the completion as the target writes it, its stop token)
CASES = {
    "qwen3": (["<tool_call>", "</tool_call>"],
              '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "<|im_end|>"),
    "kimi_k2": (["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                 "<|tool_call_argument_begin|>", "<|tool_call_end|>"],
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                f"{ARGS}<|tool_call_end|><|tool_calls_section_end|>", "<|im_end|>"),
    "deepseek_v3": (["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁sep｜>"],
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                    f"{ARGS}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "<｜end▁of▁sentence｜>"),
    "llama31": (["<|python_tag|>", "<|eom_id|>"],
                '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "<|eom_id|>"),
    "gpt_oss": (["<|channel|>", "<|constrain|>", "<|message|>", "<|call|>"],
                "<|channel|>analysis<|message|>look it up<|end|><|start|>assistant to=functions.get_weather"
                f"<|channel|>commentary <|constrain|>json<|message|>{ARGS}", "<|call|>"),
}


def sglang_answer(tok: object, completion: str, stop: str, prompt_ids: list[int]) -> dict:
    """Return SGLang's /generate answer for `completion`: the ids without the stop token, which it names."""
    ids = tok(completion, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    stop_id = tok.convert_tokens_to_ids(stop)  # type: ignore[attr-defined]
    return {"text": completion, "output_ids": ids,
            "meta_info": {"finish_reason": {"type": "stop", "matched": stop_id}, "prompt_tokens": len(prompt_ids),
                          "completion_tokens": len(ids) + 1}}


@pytest.mark.parametrize("family", sorted(CASES))
def test_a_tool_call_with_special_token_markers_is_kept_as_a_structured_call(family: str) -> None:
    markers, completion, stop = CASES[family]
    tok = tokenizer(family)
    tok.add_special_tokens({"additional_special_tokens": [*markers, stop]})
    assert set(markers) <= set(tok.all_special_tokens)
    mode = TokenMode(PromptRenderer(tok), "sglang", "target", SamplingParams(max_tokens=64))
    request: TokenRequest = mode.request([{"role": "user", "content": "What is the weather in Paris?"}], TOOLS)
    result = mode.completion(sglang_answer(tok, completion, stop, request.prompt_ids), request, "http://e", 0.0)
    assert result.tool_calls is not None and len(result.tool_calls) == 1
    call = result.tool_calls[0]["function"]
    assert call["name"] == "get_weather" and call["arguments"] == ARGS
    assert "get_weather" not in (result.content or "")  # the call is not left behind as text
    assert tok.decode(result.completion_ids, skip_special_tokens=False) == completion + stop  # ids as generated


def test_only_end_of_turn_tokens_are_stripped_from_a_plain_answer() -> None:
    tok = tokenizer("kimi_k2")
    mode = TokenMode(PromptRenderer(tok), "sglang", "target", SamplingParams(max_tokens=64))
    assert mode._strip_end("yes<|tool_call_end|><|im_end|>") == "yes<|tool_call_end|>"
    assert mode._strip_end("yes<|im_end|><|im_end|>") == "yes"
