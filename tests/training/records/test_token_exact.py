"""Token-exact generation: prompts rendered with the target's template and sent as ids to SGLang's
/generate or vLLM's completions (tests/fakes/token_servers.py), the ids kept per generation, and
training rows made from those ids with nothing re-tokenised."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from curator.generate import GenerateConfig, generate
from curator.engines.sampling import SamplingParams
from curator.engines.sglang import token_request as sglang_request
from curator.engines.vllm import token_request as vllm_request
from curator.generate.token_ids import parse_answer
from curator.mix.publish import write_tables
from curator.rows.schema import SCHEMA
from tests.fakes.token_servers import FakeSGLangServer, FakeVLLMServer
from tests.training.records.test_chat_templates import TOOLS, tokenizer
from training.records.chat_tokens import render, template_messages, tokenize_rows
from training.records.gen_record import record_problem

CALL = '<think>\nlook it up\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
OTHER_CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>'
ANSWER = "<think>\nit is sunny\n</think>\n\nyes<|im_end|>"


def weather_policy(prompt: str) -> str:
    """A target that calls get_weather when it has not seen the weather yet, then answers."""
    if "get_weather" in prompt and '{"sky"' not in prompt and "time please" not in prompt:
        return CALL
    if "time please" in prompt:
        return OTHER_CALL
    return ANSWER


AGENTIC_ROW = {"id": "agent", "turns": "all", "category": "agentic", "tools": json.dumps(TOOLS), "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": "src_0", "name": "get_weather"},
]}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen3_tok")
    tokenizer("qwen3").save_pretrained(out)
    return out


def write_mix(mix: Path, rows: list[dict[str, Any]]) -> Path:
    mix.mkdir(parents=True, exist_ok=True)
    full = [{"source": "test", "category": "chat", "turns": "all", "keep_responses": False, "tools": None, **r}
            for r in rows]
    write_tables(mix, [pa.Table.from_pylist(full, schema=SCHEMA)], name="test")
    return mix


def run(tmp_path: Path, server: Any, tok_dir: Path, rows: list[dict[str, Any]]) -> tuple[dict[str, dict], list[dict]]:
    mix = write_mix(tmp_path / "mix", rows)
    generate(GenerateConfig(mix=mix, out=tmp_path / "out", model="target", endpoints=[server.url],
                            engine=server.engine, tokenizer=str(tok_dir), concurrency=2, retry_base_s=0.01,
                            max_attempts=2))
    recs = [json.loads(line) for s in sorted((tmp_path / "out").glob("shard-*.jsonl")) for line in s.read_text().splitlines()]
    errors_path = tmp_path / "out" / "errors.jsonl"
    errors = [json.loads(line) for line in errors_path.read_text().splitlines()] if errors_path.exists() else []
    return {r["id"]: r for r in recs}, errors


@pytest.mark.parametrize("server_cls", [FakeSGLangServer, FakeVLLMServer])
def test_agentic_row_keeps_the_targets_ids_tool_calls_and_the_source_result(tmp_path: Path, tok_dir: Path,
                                                                            server_cls: Any) -> None:
    tok = tokenizer("qwen3")
    with server_cls(tok, weather_policy) as server:
        recs, errors = run(tmp_path, server, tok_dir, [AGENTIC_ROW])
        sent = [body for path, body in server.requests if path in ("/generate", "/v1/completions")]
    assert errors == []
    rec = recs["agent"]
    assert rec["mode"] == "token" and record_problem(rec) is None
    msgs = rec["messages"]
    assert [(m["role"], m["train"]) for m in msgs] == [
        ("system", False), ("user", False), ("assistant", True), ("tool", False), ("assistant", True)]
    call = msgs[2]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert msgs[2]["reasoning_content"] == "look it up"
    assert msgs[3]["tool_call_id"] == call["id"] and msgs[3]["content"] == '{"sky": "sunny"}'
    assert msgs[4]["content"] == "yes"
    # The ids sent are the target's own template over the conversation so far, tools included.
    for gen, body in zip(rec["generations"], sent):
        prompt_key = "input_ids" if server.engine == "sglang" else "prompt"
        assert body[prompt_key] == gen["prompt_ids"]
        history, _ = template_messages({"id": "", "messages": msgs[: gen["message"]]})
        text = render(tok, history, True, tools=TOOLS)
        assert gen["prompt_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert [tok.decode(g["completion_ids"], skip_special_tokens=False) for g in rec["generations"]] == [CALL, ANSWER]
    # Training uses those ids as they are: one row (Qwen3 keeps this history as written), two spans.
    (row,) = tokenize_rows(rec)
    last = rec["generations"][-1]
    assert row.input_ids.tolist() == last["prompt_ids"] + last["completion_ids"]
    assert row.mode == "token" and int(row.loss_mask.sum()) == sum(len(g["completion_ids"]) for g in rec["generations"])


def test_vllm_without_token_ids_falls_back_to_text_mode_and_says_so(tmp_path: Path, tok_dir: Path) -> None:
    with FakeVLLMServer(tokenizer("qwen3"), weather_policy, legacy=True) as server:
        recs, errors = run(tmp_path, server, tok_dir, [AGENTIC_ROW])
    rec = recs["agent"]
    assert errors == [] and rec["mode"] == "text" and "without token ids" in rec["mode_reason"]
    assert "generations" not in rec and rec["messages"][2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert tokenize_rows(rec, tokenizer("qwen3"))[0].mode == "text"


@pytest.mark.parametrize("server_cls,fault,message", [
    (FakeSGLangServer, "ignore_input_ids", "did not take the prompt token ids"),
    (FakeVLLMServer, "reprompt", "did not take the prompt token ids"),
    (FakeSGLangServer, "garble_ids", "do not decode to its text"),
])
def test_an_engine_that_breaks_the_ids_fails_that_record_and_the_run_goes_on(
        tmp_path: Path, tok_dir: Path, server_cls: Any, fault: str, message: str) -> None:
    rows = [AGENTIC_ROW, {"id": "plain", "messages": [{"role": "user", "content": "hello"}]}]
    with server_cls(tokenizer("qwen3"), weather_policy, **{fault: True}) as server:
        recs, errors = run(tmp_path, server, tok_dir, rows)
    assert recs == {} and {e["id"] for e in errors} == {"agent", "plain"}
    assert all(message in e["error"] and e["permanent"] for e in errors)


def test_the_conversation_ends_where_the_target_leaves_the_source_trajectory(tmp_path: Path, tok_dir: Path) -> None:
    rows = [
        {**AGENTIC_ROW, "id": "other", "messages": [
            {"role": "user", "content": "time please"},
            {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": "src_0", "name": "get_weather"},
            {"role": "user", "content": "thanks"}]},
        {**AGENTIC_ROW, "id": "none", "tools": None, "messages": [
            {"role": "user", "content": "hello"},
            {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": "src_0", "name": "get_weather"}]},
    ]
    with FakeSGLangServer(tokenizer("qwen3"), weather_policy) as server:
        recs, errors = run(tmp_path, server, tok_dir, rows)
    assert errors == []
    assert recs["other"]["stop_reason"] == "other_tool" and recs["none"]["stop_reason"] == "no_tool_call"
    for rec in recs.values():  # the last message is the target's own answer, still trained
        assert rec["messages"][-1]["role"] == "assistant" and rec["messages"][-1]["train"]
        assert len(rec["generations"]) == 1


def test_request_bodies_carry_the_engines_own_fields() -> None:
    params = SamplingParams(temperature=0.0, top_p=0.9, max_tokens=7)
    assert sglang_request([1, 2], params, "m") == {
        "input_ids": [1, 2], "stream": False,
        "sampling_params": {"temperature": 0.0, "top_p": 0.9, "max_new_tokens": 7, "skip_special_tokens": False}}
    assert vllm_request([1, 2], params, "m") == {
        "model": "m", "prompt": [1, 2], "max_tokens": 7, "temperature": 0.0, "top_p": 0.9,
        "return_token_ids": True, "skip_special_tokens": False, "stream": False}


@pytest.mark.parametrize("fmt,text,calls", [
    ("kimi", "<think>r</think>ok<|tool_calls_section_begin|><|tool_call_begin|>functions.ls:0"
             '<|tool_call_argument_begin|>{"p":"."}<|tool_call_end|><|tool_calls_section_end|>',
     [{"id": "functions.ls:0", "type": "function", "function": {"name": "ls", "arguments": '{"p": "."}'}}]),
    ("llama3", '{"name": "ls", "parameters": {"p": "."}}',
     [{"id": "call_0", "type": "function", "function": {"name": "ls", "arguments": '{"p": "."}'}}]),
    ("deepseek", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>ls\n```json\n{"p": "."}\n```'
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     [{"id": "call_0", "type": "function", "function": {"name": "ls", "arguments": '{"p": "."}'}}]),
    ("harmony", '<|channel|>analysis<|message|>r<|end|><|start|>assistant to=functions.ls<|channel|>commentary '
                '<|constrain|>json<|message|>{"p": "."}<|call|>',
     [{"id": "call_0", "type": "function", "function": {"name": "ls", "arguments": '{"p": "."}'}}]),
])
def test_tool_calls_are_read_back_from_each_targets_own_format(fmt: str, text: str, calls: list[dict]) -> None:
    _, reasoning, got = parse_answer(text, fmt)
    assert got == calls
    assert reasoning == ("r" if fmt in ("kimi", "harmony") else None)


def test_hidden_states_and_plan_read_the_stored_ids_and_say_which_mode_made_each_sample() -> None:
    from training.capture.prepare import prepare_samples
    from training.capture.stats import ExtractStats
    from training.capture.plan import data_lengths

    token = {"id": "t", "mode": "token", "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "train": True}],
        "generations": [{"message": 1, "prompt_ids": [5, 6, 7], "completion_ids": [8, 9]}]}
    text = {"id": "x", "messages": [{"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": "yes", "train": True}]}
    samples = list(prepare_samples([token, text], tokenizer("qwen3"), ExtractStats(), done=set()))
    assert [(s.id, s.mode) for s in samples] == [("t", "token"), ("x", "text")]
    assert samples[0].input_ids.tolist() == [5, 6, 7, 8, 9] and samples[0].loss_mask.tolist() == [0, 0, 0, 1, 1]
    assert data_lengths([token], None)[:2] == ([5], "stored ids")


def test_the_store_records_which_mode_made_each_sample(tmp_path: Path, tiny_target: Path) -> None:
    from training.capture.forward import load_target
    from training.capture.hidden_states import extract
    from training.capture.prepare import store_meta
    from training.storage.reader import HiddenStateStore

    model, tok = load_target(tiny_target, "cpu")
    prompt = tok.apply_chat_template([{"role": "user", "content": "def value"}], tokenize=True,
                                     add_generation_prompt=True, return_dict=False)
    token = {"id": "t", "mode": "token", "messages": [
        {"role": "user", "content": "def value"}, {"role": "assistant", "content": "return self", "train": True}],
        "generations": [{"message": 1, "prompt_ids": prompt,
                         "completion_ids": tok("return self<|end|>", add_special_tokens=False)["input_ids"]}]}
    text = {**token, "id": "x", "mode": "text"}
    meta = store_meta(model.config, tok, target="tiny", layer_ids=None, dtype="bf16", has_final=True)
    extract(model, tok, [token, text], tmp_path / "store", meta)
    store = HiddenStateStore.open(tmp_path / "store")
    assert (store.mode("t"), store.mode("x")) == ("token", "text")


def test_reference_bench_counts_answers_whose_ids_change_when_retokenised(tmp_path: Path) -> None:
    from bench.reference.modes import mismatch_share, text_copy

    tok = tokenizer("qwen3")
    prompt = tok(render(tok, [{"role": "user", "content": "reply with the word yes"}], True, enable_thinking=False),
                 add_special_tokens=False)["input_ids"]
    canonical = tok("yes<|im_end|>", add_special_tokens=False)["input_ids"]
    spelled = [i for ch in "yes" for i in tok(ch, add_special_tokens=False)["input_ids"]] + canonical[-1:]
    assert spelled != canonical  # the target chose a non-canonical split, as real targets sometimes do
    messages = [{"role": "user", "content": "reply with the word yes"}, {"role": "assistant", "content": "yes", "train": True}]
    recs = [{"id": f"r{i}", "mode": "token", "messages": messages, "chat_template_kwargs": {"enable_thinking": False},
             "generations": [{"message": 1, "prompt_ids": prompt, "completion_ids": ids}]}
            for i, ids in enumerate([canonical, spelled, canonical[:-1]])]  # the last: cut off at max_tokens
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "shard-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    share = mismatch_share(gen, tok)
    assert (share["records"], share["mismatched"], share["end_token_added_only"]) == (3, 2, 1)
    assert share["share_answer_tokens_changed"] == round(1 / 3, 4)
    twin = [json.loads(line) for line in (text_copy(gen, tmp_path / "text") / "shard-00000.jsonl").read_text().splitlines()]
    assert all(r["mode"] == "text" and "generations" not in r for r in twin)


def test_cli_generate_with_engine_and_tokenizer_writes_token_records(tmp_path: Path, tok_dir: Path) -> None:
    from curator.cli import main

    mix = write_mix(tmp_path / "mix", [AGENTIC_ROW])
    with FakeSGLangServer(tokenizer("qwen3"), weather_policy) as server:
        code = main(["generate", "--mix", str(mix), "--out", str(tmp_path / "out"), "--model", "target",
                     "--endpoint", server.url, "--engine", "sglang", "--tokenizer", str(tok_dir),
                     "--catalog", str(tmp_path / "c.duckdb")])
    assert code in (0, None)
    (line,) = (tmp_path / "out" / "shard-00000.jsonl").read_text().splitlines()
    assert json.loads(line)["mode"] == "token"
