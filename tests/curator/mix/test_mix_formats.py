"""Row formats: one fixture per documented dataset schema, auto-detection, malformed rows, turn policy."""

from __future__ import annotations

import json

import pytest

from curator.errors import ConfigError
from curator.rows.formats.conversation import MalformedRow, as_messages, to_prompt
from curator.rows.formats.table import FORMATS, default_turns, detect_format, resolve_format
from curator.rows.formats.tools import render_tool_calls

# One row per format, shaped like the dataset's documented schema (docs/reference.md).
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
    # prompt packages on PyPI (tests/curator/rows/test_prompt_packages.py reads their files)
    ({"id": "simple_0", "question": [[{"role": "user", "content": "Area of a 10 by 5 triangle?"}]],
      "function": [{"name": "area", "parameters": {"type": "dict", "properties": {"b": {"type": "integer"}}}}]}, "bfcl"),
    ({"task_id": "HumanEval/0", "prompt": "def f(x):\n    \"\"\"Return x.\"\"\"\n", "entry_point": "f",
      "canonical_solution": "    return x\n", "test": ""}, "humaneval"),
    ({"question_id": 81, "category": "writing", "turns": ["Write a post.", "Shorten it."]}, "mtbench"),
    ({"key": "0", "prompt": "Answer in three words.", "instruction_id_list": ["count:words"], "kwargs": [{}]}, "ifbench"),
]


@pytest.mark.parametrize(("row", "fmt"), CASES, ids=[f for _, f in CASES])
def test_auto_detects_each_documented_schema(row, fmt):
    assert detect_format(row.keys()) == fmt
    conv = FORMATS[fmt].normalise(row)
    assert conv and all(role in {"system", "user", "assistant", "tool"} for role, _ in conv)
    assert any(role == "user" for role, _ in conv)


def test_sharegpt_maps_every_vendor_role():
    conv = FORMATS["sharegpt"].normalise(SHAREGPT)
    assert [r for r, _ in conv] == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "assistant"]


def test_pairs_keep_prompt_and_answer_text():
    assert FORMATS["input-output"].normalise(OPENCODEINSTRUCT) == [("user", "Write fib(n)."), ("assistant", "def fib(n): ...")]
    assert FORMATS["query-answer"].normalise(CODEFEEDBACK)[0] == ("user", "Fix my SQL.")
    assert FORMATS["alpaca"].normalise(ALPACA)[0] == ("user", "Translate to French.\n\nGood morning")
    assert FORMATS["alpaca"].normalise({"instruction": "Hi", "input": "", "output": "Yo"})[0] == ("user", "Hi")


def test_swe_agent_uses_system_prompt_and_maps_ai_to_assistant():
    conv = FORMATS["swe-agent"].normalise(SWE_AGENT)
    assert conv[0] == ("system", "You are an autonomous programmer.")
    assert [r for r, _ in conv] == ["system", "user", "assistant", "user", "assistant"]


def test_glaive_functions_become_tools_and_functioncalls_structured_calls():
    conv = FORMATS["glaive"].normalise(GLAIVE)
    assert conv[0] == ("system", "You are a helpful assistant with access to the following functions. Use them if required")
    assert [r for r, _ in conv] == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert conv.tools == [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    # glaive's single-quoted arguments object is read as the JSON it quotes
    assert conv[2].tool_calls == [{"id": "call_0", "type": "function",
                                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert conv[3] == ("tool", '{"temp": 21}') and (conv[3].tool_call_id, conv[3].name) == ("call_0", "get_weather")
    assert all("<|endoftext|>" not in c and "<functioncall>" not in c for _, c in conv)


def test_xlam_tools_and_answers_are_structured():
    conv = FORMATS["xlam"].normalise(XLAM)
    assert conv[0] == ("user", XLAM["query"])
    assert conv.tools[0]["function"]["name"] == "live_giveaways_by_type"
    assert conv.tools[0]["function"]["parameters"] == {"type": "object", "properties": {"type": {"type": "str"}}}
    assert conv[1] == ("assistant", "") and conv[1].tool_calls[0]["function"] == {
        "name": "live_giveaways_by_type", "arguments": '{"type": "beta"}'}


def test_openai_tool_calls_keep_their_shape_and_tool_turns_their_call():
    conv = FORMATS["messages"].normalise({**OPENAI_TOOLS, "tools": [{"type": "function", "function": {"name": "ls"}}]})
    assert [r for r, _ in conv] == ["user", "assistant", "tool", "assistant"]
    assert conv[1].tool_calls == [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}]
    assert conv[2] == ("tool", "a.py\nb.py") and conv[2].tool_call_id == "c1" and conv[2].name == "ls"
    assert conv.tools == [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]
    assert as_messages(to_prompt(conv, "last", False))[1] == {
        "role": "assistant", "content": "", "tool_calls": conv[1].tool_calls}


HERMES = {  # NousResearch/hermes-function-calling-v1
    "id": "h1", "category": "x", "task": "y",
    "conversations": [
        {"from": "system", "value": "You are a function calling AI model. <tools> [{'type': 'function'}] </tools>".replace(
            "[{'type': 'function'}]", json.dumps([{"type": "function", "function": {
                "name": "get_stock", "description": "Price", "parameters": {"type": "object", "properties": {"s": {"type": "string"}}}}}]))},
        {"from": "human", "value": "Price of ACME?"},
        {"from": "gpt", "value": '<tool_call>\n{"name": "get_stock", "arguments": {"s": "ACME"}}\n</tool_call>'},
        {"from": "tool", "value": '<tool_response>\n{"price": 3}\n</tool_response>'},
        {"from": "gpt", "value": "ACME trades at 3."},
    ],
}


def test_hermes_tool_blocks_become_structure():
    conv = FORMATS["hermes"].normalise(HERMES)
    assert conv.tools[0]["function"]["name"] == "get_stock"
    assert conv[2] == ("assistant", "") and conv[2].tool_calls[0]["function"]["arguments"] == '{"s": "ACME"}'
    assert conv[3] == ("tool", '{"price": 3}') and conv[3].tool_call_id == conv[2].tool_calls[0]["id"]


DEEPSWE = {  # SWE-Factory/DeepSWE-Agent-Kimi-K2-Trajectories: inline actions, observations as user turns
    "messages": [
        {"role": "system", "content": "You are a software agent."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "Look first.\n<function=execute_bash>\n<parameter=command>ls</parameter>\n</function>"},
        {"role": "user", "content": "a.py"},
        {"role": "assistant", "content": "<function=finish>\n</function>"},
    ]
}


def test_deepswe_actions_become_tool_calls_and_observations_their_results():
    conv = FORMATS["deepswe"].normalise(DEEPSWE)
    assert [r for r, _ in conv] == ["system", "user", "assistant", "tool", "assistant"]
    assert conv[2] == ("assistant", "Look first.")
    assert conv[2].tool_calls[0]["function"] == {"name": "execute_bash", "arguments": '{"command": "ls"}'}
    assert conv[3].tool_call_id == "call_0" and conv[3].name == "execute_bash"
    assert [t["function"]["name"] for t in conv.tools] == ["execute_bash", "finish"]
    assert default_turns("deepswe") == "last"


def test_turns_all_keeps_tool_turns_naming_the_call_they_answered():
    prompt = to_prompt(FORMATS["messages"].normalise(OPENAI_TOOLS), "all", False)
    assert as_messages(prompt) == [{"role": "user", "content": "List the files."},
                                   {"role": "tool", "content": "a.py\nb.py", "tool_call_id": "c1", "name": "ls"}]


def test_sources_without_structure_fall_back_to_text_tool_calls():
    assert render_tool_calls([{"name": "ls", "arguments": {"path": "."}}]) == (
        '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>')
    assert not FORMATS["swe-agent"].normalise(SWE_AGENT).has_tools()


def test_openthoughts_prepends_system():
    conv = FORMATS["openthoughts"].normalise(OPENTHOUGHTS)
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
        ("messages", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "function": {"name": "ls", "arguments": "{path: ."}}]}]}, "arguments are not JSON"),
        ("messages", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "function": {"name": "ls", "arguments": "[1]"}}]}]}, "not a JSON object"),
        ("messages", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "function": {"name": "ls", "arguments": "{}"}}]}, {"role": "tool", "content": "x"},
            {"role": "tool", "content": "y"}]}, "answers no tool call"),
        ("messages", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "function": {"name": "ls", "arguments": "{}"}}]}, {"role": "tool", "content": "x",
            "tool_call_id": "zz"}]}, "which was not made"),
        ("xlam", {"query": "q", "tools": "[]", "answers": json.dumps([{"name": "f", "arguments": "not json"}])}, "not JSON"),
    ],
)
def test_malformed_rows_raise_with_a_reason(fmt, row, reason):
    with pytest.raises(MalformedRow, match=reason):
        FORMATS[fmt].normalise(row)


def test_unknown_columns_error_lists_what_was_seen():
    with pytest.raises(ConfigError, match=r"columns \[text, label\]"):
        resolve_format("auto", ["text", "label"], "source 'x'")


def test_aliases_resolve_to_their_format():
    assert resolve_format("magicoder", [], "s") == "instruction-response"
    assert resolve_format("opencodeinstruct", [], "s") == "input-output"
    assert resolve_format("codefeedback", [], "s") == "query-answer"


def test_turns_all_drops_answers_and_keeps_tool_turns():
    conv = FORMATS["glaive"].normalise(GLAIVE)
    assert [r for r, _ in to_prompt(conv, "all", False)] == ["system", "user", "tool", "user"]


def test_turns_last_ends_at_the_last_user_or_tool_turn():
    conv = FORMATS["swe-agent"].normalise(SWE_AGENT)
    prompt = to_prompt(conv, "last", False)
    assert prompt == conv[:4] and prompt[-1][0] == "user"
    assert default_turns("swe-agent") == "last" and default_turns("sharegpt") == "all"


def test_keep_responses_keeps_the_whole_conversation():
    conv = FORMATS["messages"].normalise(ULTRACHAT)
    assert to_prompt(conv, "all", True) == conv
    with pytest.raises(MalformedRow, match="no assistant"):
        to_prompt([("user", "hi")], "all", True)
    with pytest.raises(MalformedRow, match="no user turn"):
        to_prompt([("system", "s"), ("assistant", "a")], "all", False)


def test_build_mix_stores_tools_and_calls_and_counts_rows_with_tools(tmp_path):
    from curator.mix.build import build_mix
    from curator.mix.recipe import recipe_from_dict
    from curator.rows.schema import open_mix

    rows = [{**OPENAI_TOOLS, "tools": [{"type": "function", "function": {"name": "ls"}}]}, ULTRACHAT]
    (tmp_path / "src.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    recipe = recipe_from_dict({"name": "t", "sources": [
        {"path": str(tmp_path / "src.jsonl"), "samples": 2, "turns": "last", "category": "agentic"}]})
    manifest = build_mix(recipe, tmp_path / "mix")
    assert manifest["sources"][0]["with_tools"] == 1 and manifest["sources"][0]["kept"] == 2
    (row,) = [r for r in open_mix(tmp_path / "mix").rows() if getattr(r, "tools", None)]
    assert row.tools == [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]
    assert row.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}]}
    assert row.messages[2] == {"role": "tool", "content": "a.py\nb.py", "tool_call_id": "c1", "name": "ls"}
