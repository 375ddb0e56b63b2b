"""The traffic classifier's rules and the traffic reader: categories, sureness, request-log wrapping, bad lines."""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curator.errors import ConfigError
from curator.rows.readers import BrokenRow
from curator.mix.publish import write_tables
from curator.traffic.classify import Decision, classify
from curator.traffic.read import TrafficRow, iter_traffic, parse_request
from curator.traffic.schema import CATEGORIES
from curator.traffic.synthetic import LABEL, records


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_declared_tools_calls_or_results_make_a_request_agentic_and_sure() -> None:
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}
    assert classify(user("Write a poem"), [tool]) == Decision("agentic", "agentic:tools-declared", True)
    assert classify(user("List files") + [call], None).rule == "agentic:tool-calls"
    assert classify(user("List files") + [{"role": "tool", "content": "a.py"}], None).rule == "agentic:tool-results"
    system = [{"role": "system", "content": "You have access to the following tools: search, fetch."}]
    assert classify(system + user("Find the docs"), None).category == "agentic"


@pytest.mark.parametrize(("text", "category"), [
    ("Why does this fail?\n```\nimport os\nos.remove(path)\n```", "code"),
    ("Traceback (most recent call last):\n  File \"a.py\", line 3\nKeyError: 'x'", "code"),
    ("Evaluate $\\int_0^1 x^2 \\, dx$ and \\frac{1}{3}.", "reasoning"),
    ("Prove by induction that 1 + 2 + ... + n = n(n+1)/2. Show your work step by step.", "reasoning"),
    ("Write a short story about a lighthouse keeper.", "chat"),
    ("What is the capital of Mongolia?", "chat"),
])
def test_clear_requests_are_decided_surely(text: str, category: str) -> None:
    decision = classify(user(text), None)
    assert (decision.category, decision.sure) == (category, True), decision


def test_mixed_or_weak_evidence_is_left_unsure() -> None:
    # a program about a math topic: both sides have evidence, neither twice the other
    mixed = classify(user("Write a Python function that computes the probability that a random integer is prime."), None)
    assert not mixed.sure
    weak = classify(user("Any tips for a 3-day visit?"), None)  # one number is no evidence of math
    assert weak.category == "chat"


def test_decisions_are_deterministic_and_frozen() -> None:
    a = classify(user("Solve 3x + 4 = 19"), None)
    assert a == classify(user("Solve 3x + 4 = 19"), None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.category = "chat"  # type: ignore[misc]
    with pytest.raises(ValueError):
        Decision("poetry", "x", True)


def test_the_latest_user_turns_decide_not_the_system_prompt() -> None:
    messages = [{"role": "system", "content": "You are a Python coding assistant. def f(): pass"},
                {"role": "user", "content": "Write a haiku about the sea."}]
    assert classify(messages, None).category == "chat"


# Written for this test, never used to tune the rules: requests as users phrase them.
HELD_OUT = {
    "code": [
        "how to reverse a string in java without using StringBuilder",
        "getting 'ModuleNotFoundError: No module named requests' even after pip install, why",
        "Can you explain what a closure is in JavaScript with an example?",
        "optimize this query, it takes 30s:\nSELECT * FROM orders WHERE YEAR(created_at) = 2023",
        "write a bash script that backs up my home folder every night",
        "whats the big-O of quicksort in the worst case and why",
        "In React, why does useEffect run twice in development?",
        "convert this to async/await:\nfetch(url).then(r => r.json()).then(d => console.log(d))",
    ],
    "reasoning": [
        "A rectangle has perimeter 36 and its length is twice its width. What is its area?",
        "what's 15% of 240, then add 18",
        "Prove that there are infinitely many primes.",
        "Find the limit of (1 + 1/n)^n as n goes to infinity.",
        "If 5 machines make 5 widgets in 5 minutes, how long do 100 machines take to make 100 widgets?",
        "Let a, b > 0 with a + b = 1. Show that ab ≤ 1/4.",
        "How many ways can 6 people sit around a round table?",
        "Solve the system: x + y = 10, x - y = 4",
    ],
    "chat": [
        "I'm visiting my grandmother this weekend, what board games are good for all ages?",
        "Write a toast for my brother's wedding, funny but heartfelt",
        "What are the main causes of the French Revolution?",
        "can you make this email sound less passive aggressive: 'As per my last email...'",
        "Suggest a name for my golden retriever puppy",
        "Is it better to rent or buy a home in your opinion?",
        "Describe a sunset over the desert in vivid language.",
        "What does a project manager do all day?",
    ],
}


def test_held_out_requests_are_mostly_classified_right() -> None:
    wrong = [(cat, text) for cat, texts in HELD_OUT.items() for text in texts if classify(user(text), None).category != cat]
    total = sum(len(t) for t in HELD_OUT.values())
    assert len(wrong) <= total // 8, wrong  # at least 7 in 8 right


def test_shares_recovered_within_a_few_points_on_a_labelled_sample() -> None:
    shares = {"agentic": 0.15, "code": 0.40, "reasoning": 0.10, "chat": 0.35}
    true, found = collections.Counter(), collections.Counter()
    for record in records(2000, shares, seed=2024):
        row = parse_request(record, "sample")
        assert isinstance(row, TrafficRow)
        true[record[LABEL]] += 1
        found[classify(row.messages, row.tools).category] += 1
    for cat in CATEGORIES:
        assert abs(found[cat] - true[cat]) / 2000 < 0.03, (cat, true, found)


# ---------------------------------------------------------------------------- reading


def _write_lines(path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_request_logs_plain_and_wrapped_are_read_alike(tmp_path) -> None:
    request = {"model": "m", "messages": [{"role": "developer", "content": "Be brief."},
                                          {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                                       {"type": "image_url", "image_url": {"url": "x"}},
                                                                       {"type": "text", "text": "there"}]}],
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
    _write_lines(tmp_path / "log.jsonl", [
        json.dumps(request),
        json.dumps({"body": request, "headers": {"x": "y"}, "ts": 1}),
        json.dumps({"body": json.dumps(request), "status": 200}),
        json.dumps({"model": "m", "prompt": "Complete this: once upon a time"}),
    ])
    rows = list(iter_traffic(tmp_path / "log.jsonl"))
    assert all(isinstance(r, TrafficRow) for r in rows), rows
    assert rows[0].messages == rows[1].messages == rows[2].messages
    assert rows[0].messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert rows[0].tools and rows[0].tools[0]["function"]["name"] == "f"
    assert rows[3].messages == [{"role": "user", "content": "Complete this: once upon a time"}]
    assert rows[1].where == "log.jsonl record 2"


def test_malformed_lines_are_yielded_as_broken_rows_and_reading_goes_on(tmp_path) -> None:
    _write_lines(tmp_path / "log.jsonl", [
        "{not json",
        json.dumps({"model": "m"}),                                     # no conversation
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),  # unknown role
        json.dumps({"messages": [{"role": "system", "content": "only a system turn"}]}),
        "[1, 2]",
        json.dumps({"messages": [{"role": "user", "content": "fine"}]}),
    ])
    rows = list(iter_traffic(tmp_path / "log.jsonl"))
    assert [isinstance(r, BrokenRow) for r in rows] == [True, True, True, True, True, False]
    assert "wizard" in rows[2].reason and "record 3" in rows[2].reason


def test_a_folder_of_parquet_and_jsonl_and_a_mix_folder_are_read(tmp_path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": "from parquet"}]}]), logs / "a.parquet")
    _write_lines(logs / "b.jsonl", [json.dumps({"conversations": [{"from": "human", "value": "from sharegpt"}]})])
    texts = [r.messages[-1]["content"] for r in iter_traffic(logs)]
    assert texts == ["from parquet", "from sharegpt"]

    mix = tmp_path / "mix"
    table = pa.Table.from_pylist([{"id": "r1", "source": "s", "category": "chat", "turns": "all", "keep_responses": False,
                                   "messages": [{"role": "user", "content": "from a mix"}]}])
    write_tables(mix, [table], "t")
    rows = list(iter_traffic(mix))
    assert [r.messages[0]["content"] for r in rows] == ["from a mix"] and rows[0].where == "mix:r1"


def test_a_missing_path_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        list(iter_traffic(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize(("text", "category"), [
    ("Write a function that parses a CSV file", "code"),
    ("Implement a function that parses a CSV file", "code"),
    ("Write a SQL query that lists the customers with no orders", "code"),
    ("Write a poem about recursion", "chat"),
    ("Write an email to my landlord about the broken heating", "chat"),
])
def test_a_verbs_object_decides_its_request_write_a_function_is_code_and_write_a_poem_is_chat(
        text: str, category: str) -> None:
    decision = classify(user(text), None)
    assert decision.category == category, decision
    assert decision.sure, decision


LABELLED = Path(__file__).resolve().parents[2] / "fixtures" / "traffic_labelled.jsonl"
# Measured on the set (HumanEval, BFCL, ToolTalk, MT-Bench, IFBench, hand-labelled ShareGPT; 374 requests):
# agentic 64/64, code 80/100, chat 159/183, reasoning 15/27. The floors sit a little below, so a rule
# change that costs a category a few requests fails here; docs/traffic.md gives the figures and confusions.
FLOORS = {"agentic": 0.98, "code": 0.77, "chat": 0.84, "reasoning": 0.50}


def test_the_classifier_holds_its_measured_accuracy_per_category_on_the_labelled_set() -> None:
    rows = [json.loads(line) for line in LABELLED.read_text(encoding="utf-8").splitlines()]
    right: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter(r["label"] for r in rows)
    for r in rows:
        right[r["label"]] += classify(r["messages"], r.get("tools")).category == r["label"]
    assert set(total) == set(FLOORS) and len(rows) >= 300
    accuracy = {cat: right[cat] / total[cat] for cat in total}
    assert all(accuracy[cat] >= floor for cat, floor in FLOORS.items()), accuracy
