"""Demo data: a few hundred small prompts with answers, written for this project, in each row
format that build-mix reads (ShareGPT, messages, alpaca, instruction/response, SWE-agent
trajectories, glaive, xlam, OpenThoughts, and OpenAI-style messages with structured tool calls).

The demo target writes tool calls as real agentic targets do: in its own special tokens
(`<tool_call>`/`</tool_call>`, added by `add_tool_tokens`), from tools declared by its chat template
(DEMO_CHAT_TEMPLATE), so generation, masks and acceptance on the agentic category are exercised.

DEMO DATA, NOT A REAL DATA SET. The rows are generated from templates with a fixed seed so
that a tiny target trained on them for a minute has answers with structure (code shapes,
tool-call syntax, stock phrases) that a draft can learn to predict. The formats are exactly
those of the public data sets named beside each writer, so the demo exercises the same
normalisers as a real mix.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import AddedToken

NAMES = ["total", "largest", "smallest", "product", "count_even", "mean", "clamp", "reverse", "unique", "flatten",
         "merge", "chunk", "rotate", "window", "running_sum", "parse_int", "strip_all", "join_words"]
OPS = [("sum", "0", "+"), ("product", "1", "*"), ("difference", "0", "-")]
CONCEPTS = ["list", "dictionary", "tuple", "set", "generator", "decorator", "class", "module", "context manager",
            "exception", "iterator", "lambda", "f-string", "coroutine", "dataclass", "type hint"]
REPOS = ["tinyhttp", "csvkit", "datefmt", "pathlib2", "textwrapx", "minijson", "queuelib", "retrylib"]
TOOLS = ["get_weather", "search_flights", "convert_currency", "get_stock_price", "translate_text", "book_table"]
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Seoul", "Quito", "Perth"]


def coding_pair(rng: random.Random) -> tuple[str, str]:
    """Return a (prompt, answer) pair asking for a small Python function."""
    name = rng.choice(NAMES)
    op_name, init, op = rng.choice(OPS)
    arg = rng.choice(["values", "numbers", "items", "data"])
    prompt = f"Write a Python function `{name}` that returns the {op_name} of a list of {arg}."
    answer = (
        f"Here is a function that computes the {op_name}:\n\n"
        f"def {name}({arg}):\n"
        f"    result = {init}\n"
        f"    for value in {arg}:\n"
        f"        result = result {op} value\n"
        f"    return result\n\n"
        f"It walks over `{arg}` once, so it runs in linear time."
    )
    return prompt, answer


def concept_pair(rng: random.Random) -> tuple[str, str]:
    """Return a (prompt, answer) pair asking to explain a Python concept."""
    concept = rng.choice(CONCEPTS)
    prompt = rng.choice(["Explain what a {c} is in Python.", "What is a {c} in Python?", "How do I use a {c}?"]).format(c=concept)
    answer = (
        f"A {concept} is one of the building blocks of Python programs. "
        f"You use a {concept} when you want clear and reusable code. "
        f"For example, the standard library uses a {concept} in many modules. "
        f"In short: a {concept} keeps your program simple."
    )
    return prompt, answer


def debug_pair(rng: random.Random) -> tuple[str, str]:
    """Return a (prompt, answer) pair about a failing test."""
    repo, name = rng.choice(REPOS), rng.choice(NAMES)
    prompt = f"The test test_{name} in {repo} fails with an IndexError. What should I check?"
    answer = (
        f"Check the loop in `{name}` first. An IndexError usually means the index goes past the end of the list.\n"
        f"1. Print the length of the list before the loop.\n"
        f"2. Use `for value in values` instead of indexing.\n"
        f"3. Run `pytest tests/test_{name}.py -x` again."
    )
    return prompt, answer


def swe_trajectory(rng: random.Random) -> list[tuple[str, str]]:
    """Return a SWE-agent style trajectory as (role, text) steps: system, user, then ai/user pairs."""
    repo, name = rng.choice(REPOS), rng.choice(NAMES)
    return [
        ("system", "You are an autonomous programmer. Use the tools `bash` and `edit` to fix the issue."),
        ("user", f"Issue in {repo}: calling {name}([]) raises IndexError instead of returning None."),
        ("ai", f"Let me find where {name} is defined.\n<function=execute_bash><parameter=command>grep -rn 'def {name}' {repo}/</parameter></function>"),
        ("user", f"{repo}/core.py:42:def {name}(values):"),
        ("ai", f"I will open the file at that line.\n<function=execute_bash><parameter=command>sed -n 40,50p {repo}/core.py</parameter></function>"),
        ("user", f"def {name}(values):\n    return values[0]"),
        ("ai", f"The function reads values[0] without a check. I will add a guard.\n<function=file_editor><parameter=path>{repo}/core.py</parameter><parameter=old>    return values[0]</parameter><parameter=new>    if not values:\n        return None\n    return values[0]</parameter></function>"),
    ]


def glaive_chat(rng: random.Random) -> tuple[str, str]:
    """Return a glaive-function-calling-v2 (system, chat) pair."""
    tool, city = rng.choice(TOOLS), rng.choice(CITIES)
    system = (
        "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required - "
        + json.dumps({"name": tool, "description": f"Call {tool}", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})
    )
    chat = (
        f"USER: Can you use {tool} for {city}? ASSISTANT: <functioncall> "
        + json.dumps({"name": tool, "arguments": json.dumps({"city": city})})
        + f" <|endoftext|> FUNCTION RESPONSE: {json.dumps({'city': city, 'result': 'ok'})} "
        f"ASSISTANT: I called {tool} for {city} and the result is ok. <|endoftext|>"
    )
    return system, chat


def xlam_row(rng: random.Random, index: int) -> dict[str, object]:
    """Return an xlam-function-calling-60k row (tools/answers as JSON strings)."""
    tool, city = rng.choice(TOOLS), rng.choice(CITIES)
    tools = [{"name": tool, "description": f"Call {tool}", "parameters": {"city": {"type": "str", "description": "City"}}}]
    answers = [{"name": tool, "arguments": {"city": city}}]
    return {"id": index, "query": f"Please run {tool} for {city}.", "tools": json.dumps(tools), "answers": json.dumps(answers)}


TOOL_CALL_TOKENS = ["<tool_call>", "</tool_call>"]

# The toy template (training/target/toy.py) with tools: declared in a system turn, calls written in
# the assistant turn between the tool-call special tokens, results in tool turns.
DEMO_CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>\nTools: ' }}{% for t in tools %}{{ t['function']['name'] + ' ' }}{% endfor %}"
    "{{ '<|end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    "{{ '<think>' + message['reasoning_content'] + '</think>' }}"
    "{% endif %}"
    "{{ message['content'] }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set args = call['function']['arguments'] %}"
    "{{ '<tool_call>{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    "{{ args if args is string else args | tojson }}{{ '}</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def add_tool_tokens(model: Any, tokenizer: Any) -> None:
    """Give the demo target its tool-call special tokens and DEMO_CHAT_TEMPLATE (the embeddings grow to fit)."""
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in TOOL_CALL_TOKENS],
                         special_tokens=True)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    tokenizer.chat_template = DEMO_CHAT_TEMPLATE


def tool_schema(name: str) -> dict[str, object]:
    """Return the OpenAI-shape schema of a demo tool (one string argument, `city`)."""
    return {"type": "function", "function": {"name": name, "description": f"Call {name}", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def tool_conversation(rng: random.Random, index: int) -> dict[str, Any]:
    """Return an OpenAI-style messages row: tools offered, a structured call, its result, the answer."""
    tool, city = rng.choice(TOOLS), rng.choice(CITIES)
    call_id = f"call_{index}"
    return {"id": f"tc{index}", "tools": [tool_schema(tool)], "messages": [
        {"role": "user", "content": f"Please run {tool} for {city}."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function", "function": {
            "name": tool, "arguments": json.dumps({"city": city})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"city": city, "result": "ok"})},
        {"role": "assistant", "content": f"I called {tool} for {city} and the result is ok."},
    ]}


def write_demo_sources(out_dir: str | Path, seed: int = 0, rows_per_source: int = 48) -> dict[str, Path]:
    """Write one demo file per row format into `out_dir`; return {format: path}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    n = rows_per_source
    paths: dict[str, Path] = {}

    def jsonl(name: str, rows: list[dict[str, object]]) -> Path:
        path = out / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    def pairs(make: Callable[[random.Random], tuple[str, str]], k: int) -> list[tuple[str, str]]:
        return [make(rng) for _ in range(k)]

    # ShareGPT (anon8231489123/ShareGPT_Vicuna_unfiltered): a JSON array, human/gpt turns.
    sharegpt = []
    for i in range(n):
        (p1, a1), (p2, a2) = concept_pair(rng), coding_pair(rng)
        sharegpt.append({"id": f"sg{i}", "conversations": [
            {"from": "human", "value": p1}, {"from": "gpt", "value": a1},
            {"from": "human", "value": p2}, {"from": "gpt", "value": a2}]})
    paths["sharegpt"] = out / "sharegpt.json"
    paths["sharegpt"].write_text(json.dumps(sharegpt))

    # messages (HuggingFaceH4/ultrachat_200k): prompt, prompt_id, messages.
    paths["messages"] = jsonl("ultrachat.jsonl", [
        {"prompt": p, "prompt_id": f"uc{i}", "messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}]}
        for i, (p, a) in enumerate(pairs(concept_pair, n))
    ])
    # alpaca: instruction, input, output.
    paths["alpaca"] = jsonl("alpaca.jsonl", [
        {"instruction": p, "input": "", "output": a} for p, a in pairs(debug_pair, n)
    ])
    # instruction/response (ise-uiuc/Magicoder-Evol-Instruct-110K), as parquet.
    magic = pairs(coding_pair, n)
    paths["magicoder"] = out / "magicoder.parquet"
    pq.write_table(pa.table({"instruction": [p for p, _ in magic], "response": [a for _, a in magic]}), paths["magicoder"])
    # SWE-agent trajectories (nebius/SWE-agent-trajectories).
    paths["swe-agent"] = jsonl("swe_agent.jsonl", [
        {"instance_id": f"{i}", "model_name": "demo", "target": True, "exit_status": "submitted",
         "trajectory": [{"role": r, "text": t, "mask": r != "ai", "system_prompt": None, "cutoff_date": None}
                        for r, t in swe_trajectory(rng)]}
        for i in range(n // 2)
    ])
    # glaive-function-calling-v2.
    paths["glaive"] = jsonl("glaive.jsonl", [
        {"system": s, "chat": c} for s, c in (glaive_chat(rng) for _ in range(n // 2))
    ])
    # xlam-function-calling-60k.
    paths["xlam"] = jsonl("xlam.jsonl", [xlam_row(rng, i) for i in range(n // 2)])
    # OpenAI-style messages with `tools` and structured `tool_calls` (the agentic case's shape).
    paths["tools"] = jsonl("tool_calls.jsonl", [tool_conversation(rng, i) for i in range(n)])
    # OpenThoughts-114k: system + from/value conversations with reasoning in the answer.
    ot: list[dict[str, object]] = []
    for p, a in pairs(coding_pair, n // 2):
        ot.append({"system": "Think step by step before you answer.", "conversations": [
            {"from": "user", "value": p},
            {"from": "assistant", "value": f"<|begin_of_thought|>I need a loop.<|end_of_thought|>\n{a}"}]})
    paths["openthoughts"] = jsonl("openthoughts.jsonl", ot)
    (out / "README.txt").write_text(
        "DEMO DATA written for the curator project from templates (seed %d). Not a real data set.\n" % seed
    )
    return paths


def demo_conversations(seed: int = 0, n: int = 1200) -> list[list[dict[str, Any]]]:
    """Return `n` chat conversations with answers, like the demo sources' (to train the target on);
    every fifth is a tool-calling one, so the target learns to write calls in its special tokens."""
    rng = random.Random(seed + 1)
    makers = [coding_pair, concept_pair, debug_pair]
    convs: list[list[dict[str, Any]]] = []
    for i in range(n):
        if i % 5 == 4:
            convs.append(tool_conversation(rng, i)["messages"])
            continue
        if i % 10 == 9:
            steps = swe_trajectory(rng)
            role = {"system": "system", "user": "user", "ai": "assistant"}
            convs.append([{"role": role[r], "content": t} for r, t in steps])
            continue
        p, a = makers[i % len(makers)](rng)
        convs.append([{"role": "user", "content": p}, {"role": "assistant", "content": a}])
    return convs


def demo_texts(seed: int = 0, n: int = 1200) -> list[str]:
    """Return the demo's text (for training the demo tokenizer)."""
    texts = [m["content"] for conv in demo_conversations(seed, n) for m in conv]
    rng = random.Random(seed + 2)
    texts += [c for _ in range(50) for c in glaive_chat(rng)]
    texts += [json.dumps(xlam_row(rng, i)) for i in range(50)]
    return texts


# The mix the demo traffic is drawn from: tool-calling, coding and chat requests. The profile's rules
# count some tool-calling coding requests as code: the demo's profile reads code 52%, agentic 42%.
TRAFFIC_SHARES = {"agentic": 0.45, "code": 0.35, "chat": 0.20}


def write_demo_traffic(path: str | Path, seed: int = 7, n: int = 120) -> Path:
    """Write `n` requests as an OpenAI-compatible server's request log (one request a line, every
    third wrapped as a request-log middleware writes it: `{"ts", "body": {...}}`); return the path.

    The requests come from the same templates as the demo sources (so the demo target knows them),
    in the skewed mix of TRAFFIC_SHARES: tool-calling requests with `tools` declared, coding and
    debugging requests, and concept questions. One request in ten carries an e-mail address, which
    the profile must never copy.
    """
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        draw = rng.random()
        if draw < TRAFFIC_SHARES["agentic"]:
            conv = tool_conversation(rng, i)
            request: dict[str, Any] = {"model": "demo", "messages": conv["messages"][:1], "tools": conv["tools"]}
        else:
            make = (rng.choice((coding_pair, debug_pair)) if draw < TRAFFIC_SHARES["agentic"] + TRAFFIC_SHARES["code"]
                    else concept_pair)
            prompt, _ = make(rng)
            if i % 10 == 3:
                prompt += " Reply to dev@example.com."
            request = {"model": "demo", "messages": [{"role": "user", "content": prompt}]}
        lines.append(json.dumps({"ts": 1_764_600_000 + i, "body": request} if i % 3 == 0 else request))
    out = Path(path)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
