"""Row formats: one fixture per documented dataset schema, auto-detection, malformed rows, turn policy."""

from __future__ import annotations

import json

import pytest

from curator.errors import ConfigError
from curator.mix.formats import NORMALISERS, MalformedRow, default_turns, detect_format, resolve_format, to_prompt

# One row per format, shaped like the dataset's documented schema (shared/REFERENCE.md).
SHAREGPT = {  # Aeala/ShareGPT_Vicuna_unfiltered
    "id": "abc_0",
    "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "What is a mutex?"},
        {"from": "gpt", "value": "A lock."},
        {"from": "human", "value": "And a semaphore?"},
        {"from": "chatgpt", "value": "A counter."},
        {"from": "human", "value": "Thanks"},
        {"from": "bard", "value": "Welcome."},
        {"from": "bing", "value": "Anytime."},
    ],
}
ULTRACHAT = {  # HuggingFaceH4/ultrachat_200k
    "prompt": "Write a haiku about rust.",
    "prompt_id": "p1",
    "messages": [
        {"content": "Write a haiku about rust.", "role": "user"},
        {"content": "Borrow checker hums", "role": "assistant"},
        {"content": "Another about Go?", "role": "user"},
        {"content": "Goroutines drift", "role": "assistant"},
    ],
}
OPENAI_TOOLS = {  # nvidia/Open-SWE-Traces-style messages with OpenAI tool calls
    "messages": [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]},
        {"role": "tool", "content": "a.py\nb.py"},
        {"role": "assistant", "content": "Two files."},
    ]
}
MAGICODER = {"instruction": "Reverse a list in Python.", "response": "Use xs[::-1]."}
OPENCODEINSTRUCT = {
    "id": "oci-1", "input": "Write fib(n).", "output": "def fib(n): ...", "domain": "generic",
    "generation_algorithm": "self-instruct", "llm_judgement": "{}", "unit_tests": "[]",
    "tests_execution_status": "[]", "average_test_score": "1.0",
}
CODEFEEDBACK = {"query": "Fix my SQL.", "answer": "Add a GROUP BY.", "resource": "x", "lang": "sql"}
ALPACA = {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"}
SWE_AGENT = {  # nebius/SWE-agent-trajectories
    "instance_id": "django__django-1", "model_name": "swe-agent-llama-70b", "target": True,
    "trajectory": [
        {"cutoff_date": "01.01.2023", "mask": False, "role": "system", "system_prompt": "You are an autonomous programmer.", "text": ""},
        {"cutoff_date": "01.01.2023", "mask": False, "role": "user", "system_prompt": "", "text": "ISSUE: crash on save"},
        {"cutoff_date": "01.01.2023", "mask": True, "role": "ai", "system_prompt": "", "text": "open models.py"},
        {"cutoff_date": "01.01.2023", "mask": False, "role": "user", "system_prompt": "", "text": "[File: models.py (10 lines)]"},
        {"cutoff_date": "01.01.2023", "mask": True, "role": "ai", "system_prompt": "", "text": "submit"},
    ],
    "exit_status": "submitted", "generated_patch": "diff", "eval_logs": "",
}
GLAIVE = {  # glaiveai/glaive-function-calling-v2
    "system": "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"
    '{"name": "get_weather", "parameters": {"city": {"type": "string"}}}',
    "chat": "USER: Weather in Paris?\n\n\nASSISTANT: <functioncall> {\"name\": \"get_weather\", \"arguments\": '{\"city\": \"Paris\"}'} <|endoftext|>\n\n\n"
    "FUNCTION RESPONSE: {\"temp\": 21}\n\n\nASSISTANT: It is 21 degrees in Paris. <|endoftext|>\n\n\nUSER: Thanks!\n\n\nASSISTANT: You're welcome. <|endoftext|>\n",
}
XLAM = {  # Salesforce/xlam-function-calling-60k
    "id": 7,
    "query": "Where can I find live giveaways for beta access?",
    "answers": json.dumps([{"name": "live_giveaways_by_type", "arguments": {"type": "beta"}}]),
    "tools": json.dumps([{"name": "live_giveaways_by_type", "description": "Giveaways", "parameters": {"type": {"type": "str"}}}]),
}
OPENTHOUGHTS = {  # open-thoughts/OpenThoughts-114k
    "system": "Your role as an assistant involves thoroughly exploring questions.",
    "conversations": [{"from": "user", "value": "Prove 1+1=2."}, {"from": "assistant", "value": "<|begin_of_thought|>..."}],
}
MIXTURE_OF_THOUGHTS = {
    "messages": [{"content": "Solve x^2=4", "role": "user"}, {"content": "<think>..</think> x=±2", "role": "assistant"}],
    "num_tokens": 120, "source": "open-r1/OpenR1-Math",
}

CASES = [
    (SHAREGPT, "sharegpt"),
    (ULTRACHAT, "messages"),
    (MIXTURE_OF_THOUGHTS, "messages"),
    (MAGICODER, "instruction-response"),
    (OPENCODEINSTRUCT, "input-output"),
    (CODEFEEDBACK, "query-answer"),
    (ALPACA, "alpaca"),
    (SWE_AGENT, "swe-agent"),
    (GLAIVE, "glaive"),
    (XLAM, "xlam"),
    (OPENTHOUGHTS, "openthoughts"),
]


@pytest.mark.parametrize(("row", "fmt"), CASES, ids=[f for _, f in CASES])
def test_auto_detects_each_documented_schema(row, fmt):
    assert detect_format(row.keys()) == fmt
    conv = NORMALISERS[fmt](row)
    assert conv and all(role in {"system", "user", "assistant", "tool"} for role, _ in conv)
    assert any(role == "user" for role, _ in conv)


def test_sharegpt_maps_every_vendor_role():
    conv = NORMALISERS["sharegpt"](SHAREGPT)
    assert [r for r, _ in conv] == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "assistant"]


def test_pairs_keep_prompt_and_answer_text():
    assert NORMALISERS["input-output"](OPENCODEINSTRUCT) == [("user", "Write fib(n)."), ("assistant", "def fib(n): ...")]
    assert NORMALISERS["query-answer"](CODEFEEDBACK)[0] == ("user", "Fix my SQL.")
    assert NORMALISERS["alpaca"](ALPACA)[0] == ("user", "Translate to French.\n\nGood morning")
    assert NORMALISERS["alpaca"]({"instruction": "Hi", "input": "", "output": "Yo"})[0] == ("user", "Hi")


def test_swe_agent_uses_system_prompt_and_maps_ai_to_assistant():
    conv = NORMALISERS["swe-agent"](SWE_AGENT)
    assert conv[0] == ("system", "You are an autonomous programmer.")
    assert [r for r, _ in conv] == ["system", "user", "assistant", "user", "assistant"]


def test_glaive_calls_and_responses_become_assistant_and_tool_turns():
    conv = NORMALISERS["glaive"](GLAIVE)
    assert conv[0][0] == "system" and conv[0][1].startswith("You are a helpful assistant")
    assert [r for r, _ in conv] == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert conv[2][1].startswith("<functioncall> {") and "Paris" in conv[2][1]
    assert conv[3][1] == '{"temp": 21}'
    assert all("<|endoftext|>" not in c for _, c in conv)


def test_xlam_tools_go_to_system_and_answers_to_tool_calls():
    conv = NORMALISERS["xlam"](XLAM)
    assert conv[0][0] == "system" and "live_giveaways_by_type" in conv[0][1]
    assert conv[1] == ("user", XLAM["query"])
    assert conv[2][0] == "assistant" and '"arguments": {"type": "beta"}' in conv[2][1]


def test_openai_tool_calls_are_rendered_not_lost():
    conv = NORMALISERS["messages"](OPENAI_TOOLS)
    assert [r for r, _ in conv] == ["user", "assistant", "tool", "assistant"]
    assert '"name": "ls"' in conv[1][1] and '"path": "."' in conv[1][1]
    assert conv[2] == ("tool", "a.py\nb.py")


def test_openthoughts_prepends_system():
    conv = NORMALISERS["openthoughts"](OPENTHOUGHTS)
    assert conv[0] == ("system", OPENTHOUGHTS["system"]) and conv[1] == ("user", "Prove 1+1=2.")


@pytest.mark.parametrize(
    ("fmt", "row", "reason"),
    [
        ("sharegpt", {"conversations": []}, "empty"),
        ("sharegpt", {"id": "x"}, "missing field 'conversations'"),
        ("sharegpt", {"conversations": "hello"}, "not a list"),
        ("sharegpt", {"conversations": [{"from": "alien", "value": "hi"}]}, "unknown role"),
        ("messages", {"messages": [{"role": "user", "content": 5}]}, "not a string"),
        ("instruction-response", {"instruction": "x", "response": None}, "missing field 'response'"),
        ("input-output", {"input": ["x"], "output": "y"}, "not a string"),
        ("xlam", {"query": "q", "tools": "[{broken", "answers": "[]"}, "not valid JSON"),
        ("glaive", {"system": "SYSTEM: x", "chat": "just text"}, "no USER:/ASSISTANT: parts"),
        ("swe-agent", {"trajectory": [{"role": "ai"}]}, "no text"),
    ],
)
def test_malformed_rows_raise_with_a_reason(fmt, row, reason):
    with pytest.raises(MalformedRow, match=reason):
        NORMALISERS[fmt](row)


def test_unknown_columns_error_lists_what_was_seen():
    with pytest.raises(ConfigError, match=r"columns \[text, label\]"):
        resolve_format("auto", ["text", "label"], "source 'x'")


def test_aliases_resolve_to_their_format():
    assert resolve_format("magicoder", [], "s") == "instruction-response"
    assert resolve_format("opencodeinstruct", [], "s") == "input-output"
    assert resolve_format("codefeedback", [], "s") == "query-answer"


def test_turns_all_drops_answers_and_keeps_tool_turns():
    conv = NORMALISERS["glaive"](GLAIVE)
    assert [r for r, _ in to_prompt(conv, "all", False)] == ["system", "user", "tool", "user"]


def test_turns_last_ends_at_the_last_user_or_tool_turn():
    conv = NORMALISERS["swe-agent"](SWE_AGENT)
    prompt = to_prompt(conv, "last", False)
    assert prompt == conv[:4] and prompt[-1][0] == "user"
    assert default_turns("swe-agent") == "last" and default_turns("sharegpt") == "all"


def test_keep_responses_keeps_the_whole_conversation():
    conv = NORMALISERS["messages"](ULTRACHAT)
    assert to_prompt(conv, "all", True) == conv
    with pytest.raises(MalformedRow, match="no assistant"):
        to_prompt([("user", "hi")], "all", True)
    with pytest.raises(MalformedRow, match="no user turn"):
        to_prompt([("system", "s"), ("assistant", "a")], "all", False)
