"""Rows that offer tools, generated through a target whose chat template does not render them (issue 47),
and answers whose tool calls cannot be stored (issue 49 item 5).

A template without tools (SmolLM2's ChatML, the toy target's) gives the same prompt with and without
the row's tools: the run finds that before generating, marks each such record `tools_dropped` and
counts it (or refuses the row with refuse_dropped_tools). A tool call whose arguments are not a JSON
object is a permanent row error that --retry-errors tries again, never a stored "complete" answer.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from curator.generate import GenerateConfig, generate
from curator.generate.client import RequestError, parse_completion
from curator.generate.token_ids import PromptRenderer
from tests.fakes.hostile_server import HostileServer, Reply, chat_answer
from tests.fakes.openai_server import write_mix as write_chat_mix
from tests.fakes.token_servers import FakeVLLMServer
from tests.training.records.test_chat_templates import TOOLS, tokenizer
from tests.training.records.test_token_exact import AGENTIC_ROW, weather_policy, write_mix

# SmolLM2-135M-Instruct's template shape: ChatML with no tools anywhere (written here, not copied).
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
          "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")
PLAIN_ROW = {"id": "plain", "turns": "all", "messages": [{"role": "user", "content": "Is it sunny?"}]}


def chatml_tokenizer() -> Any:
    """The qwen3 test tokenizer (a copy: the original is cached and shared) with a ChatML template."""
    tok = copy.deepcopy(tokenizer("qwen3"))
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chatml_tok")
    chatml_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen3_tok")
    tokenizer("qwen3").save_pretrained(out)
    return out


def records(out: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for s in sorted(out.glob("shard-*.jsonl")) for r in map(json.loads, s.read_text().splitlines())}


def errors(out: Path) -> list[dict[str, Any]]:
    path = out / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_renderer_tells_a_template_that_drops_tools_from_one_that_renders_them() -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    qwen = PromptRenderer(tokenizer("qwen3"))
    assert qwen.drops_tools(messages, TOOLS) is False
    assert qwen.drops_tools(messages, None) is None
    assert PromptRenderer(chatml_tokenizer()).drops_tools(messages, TOOLS) is True


@pytest.mark.parametrize("refuse", [False, True])
def test_token_mode_marks_or_refuses_rows_whose_tools_the_template_drops(tmp_path: Path, chatml_dir: Path,
                                                                         refuse: bool) -> None:
    mix = write_mix(tmp_path / "mix", [AGENTIC_ROW, PLAIN_ROW])
    out = tmp_path / "out"
    with FakeVLLMServer(tokenizer("qwen3"), weather_policy) as server:
        stats = generate(GenerateConfig(mix=mix, out=out, model="target", endpoints=[server.url], engine="vllm",
                                        tokenizer=str(chatml_dir), retry_base_s=0.01, max_attempts=2,
                                        refuse_dropped_tools=refuse))
    assert stats.tools_dropped == 1
    recs = records(out)
    assert "tools_dropped" not in recs["plain"]
    if refuse:
        assert "agent" not in recs and stats.status == "partial"
        [err] = errors(out)
        assert err["id"] == "agent" and err["status"] == "tools_dropped" and err["permanent"] is True
    else:
        rec = recs["agent"]
        assert rec["tools_dropped"] is True and rec["tools"] == TOOLS
        # the prompt the target was given holds no tool definition: what the mark says
        assert "get_weather" not in tokenizer("qwen3").decode(rec["generations"][0]["prompt_ids"])
        meta = json.loads((out / "generation.json").read_text())
        assert meta["stats"]["tools_dropped"] == 1


def test_token_mode_with_a_template_that_renders_tools_marks_nothing(tmp_path: Path, qwen3_dir: Path) -> None:
    mix = write_mix(tmp_path / "mix", [AGENTIC_ROW])
    with FakeVLLMServer(tokenizer("qwen3"), weather_policy) as server:
        stats = generate(GenerateConfig(mix=mix, out=tmp_path / "out", model="target", endpoints=[server.url],
                                        engine="vllm", tokenizer=str(qwen3_dir), retry_base_s=0.01, max_attempts=2))
    assert stats.tools_dropped == 0
    assert "tools_dropped" not in records(tmp_path / "out")["agent"]


def test_the_transformers_backend_marks_rows_whose_tools_its_template_drops(tmp_path: Path, tiny_target: Path) -> None:
    rows = [{"id": "t", "turns": "last", "tools": json.dumps(TOOLS), "messages": [{"role": "user", "content": "def value"}]},
            {"id": "u", "turns": "last", "messages": [{"role": "user", "content": "def value"}]}]
    mix = write_mix(tmp_path / "mix", rows)
    stats = generate(GenerateConfig(mix=mix, out=tmp_path / "out", model=str(tiny_target), backend="transformers",
                                    batch_size=2, max_tokens=3, temperature=0.0))
    assert stats.tools_dropped == 1
    recs = records(tmp_path / "out")
    assert recs["t"]["tools_dropped"] is True and "tools_dropped" not in recs["u"]


def test_the_cli_summary_says_how_many_rows_lost_their_tools(tmp_path: Path, chatml_dir: Path) -> None:
    from typer.testing import CliRunner

    from curator.cli import build_app

    mix = write_mix(tmp_path / "mix", [AGENTIC_ROW])
    with FakeVLLMServer(tokenizer("qwen3"), weather_policy) as server:
        result = CliRunner().invoke(build_app(), [
            "generate", "--mix", str(mix), "--out", str(tmp_path / "out"), "--model", "target", "--endpoint",
            server.url, "--engine", "vllm", "--tokenizer", str(chatml_dir), "--catalog", str(tmp_path / "c.duckdb")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "rows whose tools the template drops" in text
    assert "1 rows offer tools that the target's chat template does not render" in text


# ---------------------------------------------------------------- tool calls that cannot be stored


def call_answer(arguments: Any) -> bytes:
    body = json.loads(chat_answer(""))
    body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}
    body["choices"][0]["finish_reason"] = "tool_calls"
    return json.dumps(body).encode()


@pytest.mark.parametrize("arguments", ['{"city": "Par', "[1, 2]", '"Paris"'])
def test_tool_call_arguments_that_are_not_a_json_object_are_a_permanent_row_error(arguments: str) -> None:
    with pytest.raises(RequestError, match="unusable tool call") as info:
        parse_completion(json.loads(call_answer(arguments)), "http://h", 0.1)
    assert info.value.permanent is True


def test_a_server_that_sends_the_arguments_as_an_object_is_stored_as_json_text() -> None:
    completion = parse_completion(json.loads(call_answer({"city": "Paris"})), "http://h", 0.1)
    assert completion.tool_calls is not None
    assert json.loads(completion.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_bad_tool_call_answers_are_row_errors_that_retry_errors_brings_back(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "turns": "all", "messages": [{"role": "user", "content": f"weather {i}"}]} for i in range(3)]
    mix = write_chat_mix(tmp_path / "mix", rows)
    out = tmp_path / "out"
    good = {"now": False}

    def script(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]["content"]
        if last == "weather 1" and not good["now"]:
            return Reply(call_answer('{"city": "Paris"'))  # cut off inside the object
        return Reply(call_answer('{"city": "Paris"}'))

    with HostileServer(script) as server:
        cfg = GenerateConfig(mix=mix, out=out, model="target", endpoints=[server.url], retry_base_s=0.0)
        first = generate(cfg)
        assert first.status == "partial" and first.errors_total == 1 and set(records(out)) == {"r0", "r2"}
        [err] = errors(out)
        assert err["id"] == "r1" and err["permanent"] is True and "not valid JSON" in err["error"]
        assert generate(cfg).generated == 0  # permanent: not asked again without --retry-errors
        good["now"] = True
        again = generate(cfg.model_copy(update={"retry_errors": True}))
    assert again.generated == 1 and again.status == "complete" and set(records(out)) == {"r0", "r1", "r2"}
