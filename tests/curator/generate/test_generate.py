"""`curator generate` against a local OpenAI-compatible server (tests/fakes/openai_server.py)
and with the in-process transformers backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curator.cli import main
from curator.catalog import Catalog
from curator.errors import ConfigError, EndpointError
from curator.generate import GenerateConfig, generate
from tests.fakes.openai_server import FakeOpenAIServer, write_mix


def config(mix: Path, out: Path, *servers: FakeOpenAIServer, **kw) -> GenerateConfig:
    kw.setdefault("retry_base_s", 0.01)
    kw.setdefault("concurrency", 4)
    return GenerateConfig(mix=mix, out=out, model="target", endpoints=[s.url for s in servers], **kw)


def records(out: Path) -> list[dict]:
    """Every line of every shard, parsed with the stdlib json only (as hidden-states reads it)."""
    lines = []
    for shard in sorted(out.glob("shard-*.jsonl")):
        lines += [json.loads(line) for line in shard.read_text().splitlines()]
    return lines


def error_lines(out: Path) -> list[dict]:
    path = out / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def one_turn_rows(n: int, prefix: str = "q") -> list[dict]:
    return [{"id": f"{prefix}{i}", "turns": "last", "messages": [{"role": "user", "content": f"{prefix}{i} please"}]}
            for i in range(n)]


def test_server_sees_the_configured_concurrency(tmp_path: Path) -> None:
    # 500 ms answers: the client's own work per request stays small beside them on a loaded
    # 2-core machine (at 50 ms, load ~6 took the average down to 2.7 of 6; at 200 ms, load ~11 to 3.4).
    mix = write_mix(tmp_path / "mix", one_turn_rows(48))
    with FakeOpenAIServer(latency=0.5) as server:
        stats = generate(config(mix, tmp_path / "out", server, concurrency=6))
        seen = server.stats()
    assert seen["max_in_flight"] == 6
    # Kept busy, not just touched once (the average includes the start-up check and the tail;
    # the bench measures saturation precisely).
    assert seen["avg_in_flight"] > 0.6 * 6
    assert stats.done_total == 48 and stats.missing == 0


def test_two_endpoints_share_the_load(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(80))
    with FakeOpenAIServer(latency=0.03) as a, FakeOpenAIServer(latency=0.03) as b:
        stats = generate(config(mix, tmp_path / "out", a, b, concurrency=4))
        sa, sb = a.stats(), b.stats()
    # Each did a fair part of the 80 requests (+1 start-up check), neither above its concurrency.
    assert sa["chat_requests"] >= 25 and sb["chat_requests"] >= 25
    assert sa["max_in_flight"] <= 4 and sb["max_in_flight"] <= 4
    assert {r["endpoint"] for r in records(tmp_path / "out")} == {a.url, b.url}
    assert stats.done_total == 80


def test_every_user_turn_is_answered_with_the_targets_own_history(tmp_path: Path) -> None:
    rows = [
        {"id": "multi", "turns": "all", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first question"},
            {"role": "user", "content": "second question"},
            {"role": "tool", "content": "tool output"},
        ]},
        {"id": "last", "turns": "last", "messages": [
            {"role": "user", "content": "old question"},
            {"role": "assistant", "content": "an answer from another model"},
            {"role": "user", "content": "final question"},
        ]},
        {"id": "kept", "keep_responses": True, "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "the target's own answer"},
        ]},
    ]
    mix = write_mix(tmp_path / "mix", rows)
    with FakeOpenAIServer(reasoning="field") as server:
        generate(config(mix, tmp_path / "out", server))
        sent = [r["messages"] for r in server.requests if r["max_tokens"] > 1]
    by_id = {r["id"]: r for r in records(tmp_path / "out")}

    multi = by_id["multi"]["messages"]
    assert [(m["role"], m["train"]) for m in multi] == [
        ("system", False), ("user", False), ("assistant", True), ("user", False), ("assistant", True),
        ("tool", False), ("assistant", True)]
    assert multi[2]["content"] == "answer 1 to: first question"
    assert multi[4]["content"] == "answer 2 to: second question"
    assert multi[2]["reasoning_content"] == "thinking about turn 1"
    # The second request carried the target's first answer (not the dataset's), without reasoning.
    second = next(m for m in sent if m[-1]["content"] == "second question")
    assert second[2] == {"role": "assistant", "content": "answer 1 to: first question"}

    last = by_id["last"]["messages"]
    assert [m["train"] for m in last] == [False, False, False, True]
    assert last[1]["content"] == "an answer from another model"
    assert by_id["last"]["turns"] == "last"

    kept = by_id["kept"]
    assert [m["train"] for m in kept["messages"]] == [False, True]
    assert kept["finish_reason"] == "kept"
    assert not any(m[-1]["content"] == "hello" for m in sent)  # no request for a kept row

    for record in by_id.values():
        assert set(record) >= {"id", "source", "category", "turns", "model", "messages", "finish_reason",
                               "usage", "endpoint", "latency_s"}
    assert by_id["multi"]["usage"]["completion_tokens"] > 0


def test_think_tags_become_reasoning_content(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(3))
    with FakeOpenAIServer(reasoning="think") as server:
        generate(config(mix, tmp_path / "out", server))
    answer = records(tmp_path / "out")[0]["messages"][-1]
    assert answer["reasoning_content"] == "thinking about turn 1"
    assert answer["content"].startswith("answer 1 to:") and "<think>" not in answer["content"]


def test_sampling_options_and_extra_body_reach_the_server(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(2))
    extra = {"chat_template_kwargs": {"enable_thinking": True}, "separate_reasoning": True}
    with FakeOpenAIServer() as server:
        generate(config(mix, tmp_path / "out", server, temperature=0.3, top_p=0.9, max_tokens=77, extra_body=extra))
        body = next(r for r in server.requests if r["max_tokens"] == 77)
    assert body["temperature"] == 0.3 and body["top_p"] == 0.9
    assert body["chat_template_kwargs"] == {"enable_thinking": True} and body["separate_reasoning"] is True


def test_429_500_and_dropped_connections_are_retried_until_success(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(10))
    faults = {"q3 ": [429, 429], "q5 ": [500, "drop"]}
    with FakeOpenAIServer(faults_by_marker=faults) as server:
        stats = generate(config(mix, tmp_path / "out", server))
        seen = server.stats()
    assert seen["statuses"][429] == 2 and seen["statuses"][500] == 1 and seen["dropped"] == 1
    assert stats.retries == 4 and stats.errors == 0
    assert sorted(r["id"] for r in records(tmp_path / "out")) == sorted(f"q{i}" for i in range(10))
    assert error_lines(tmp_path / "out") == []


def test_poison_prompt_is_recorded_once_and_retried_only_with_retry_errors(tmp_path: Path) -> None:
    rows = one_turn_rows(5) + [{"id": "poison", "turns": "last",
                                "messages": [{"role": "user", "content": "POISON " * 10}]}]
    mix = write_mix(tmp_path / "mix", rows)
    out = tmp_path / "out"
    with FakeOpenAIServer() as server:
        first = generate(config(mix, out, server))
        assert first.errors == 1 and first.done_total == 5 and first.missing == 0
        [err] = error_lines(out)
        assert err["id"] == "poison" and err["status"] == 400 and err["permanent"] is True
        assert "maximum context length" in err["error"]
        poisoned = sum(1 for r in server.requests if "POISON" in r["messages"][-1]["content"])
        assert poisoned == 1  # a 400 is not retried

        again = generate(config(mix, out, server))
        assert again.skipped_errors == 1 and again.requests == 0
        assert len(error_lines(out)) == 1

        retried = generate(config(mix, out, server, retry_errors=True))
        assert retried.requests == 1 and retried.errors == 1
        assert len(error_lines(out)) == 1  # still one line for the id, not two
    with FakeOpenAIServer(poison="") as healed:  # e.g. a server restarted with a longer context
        fixed = generate(config(mix, out, healed, retry_errors=True))
    assert fixed.generated == 1 and fixed.missing == 0 and fixed.errors_total == 0
    assert error_lines(out) == []
    assert sorted(r["id"] for r in records(out)) == sorted([f"q{i}" for i in range(5)] + ["poison"])


def test_malformed_rows_are_counted_and_recorded_not_fatal(tmp_path: Path) -> None:
    rows = one_turn_rows(3) + [
        {"id": "bad-role", "messages": [{"role": "narrator", "content": "x"}]},
        {"id": "no-user", "messages": [{"role": "system", "content": "only a system prompt"}]},
        {"id": "answered", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
    ]
    mix = write_mix(tmp_path / "mix", rows)
    with FakeOpenAIServer() as server:
        stats = generate(config(mix, tmp_path / "out", server))
    assert stats.malformed == 3 and stats.done_total == 3
    reasons = {e["id"]: e["error"] for e in error_lines(tmp_path / "out")}
    assert set(reasons) == {"bad-role", "no-user", "answered"}
    assert "narrator" in reasons["bad-role"]


def test_limit_takes_the_first_rows_of_the_mix(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(20), files=3)
    with FakeOpenAIServer() as server:
        stats = generate(config(mix, tmp_path / "out", server, limit=8))
    assert stats.mix_rows == 8
    assert sorted(r["id"] for r in records(tmp_path / "out")) == sorted(f"q{i}" for i in range(8))


def test_output_of_another_model_is_refused(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(2))
    with FakeOpenAIServer() as server:
        generate(config(mix, tmp_path / "out", server))
    with FakeOpenAIServer(model="other") as other:
        with pytest.raises(ConfigError, match="holds generations of 'target'"):
            generate(GenerateConfig(mix=mix, out=tmp_path / "out", model="other", endpoints=[other.url]))


def test_resume_with_another_temperature_is_refused_but_other_concurrency_is_not(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(4))
    with FakeOpenAIServer() as server:
        generate(config(mix, tmp_path / "out", server, limit=2))
        with pytest.raises(ConfigError, match="temperature: 0.7 -> 0.0"):
            generate(config(mix, tmp_path / "out", server, temperature=0.0))
        stats = generate(config(mix, tmp_path / "out", server, concurrency=3))  # changes nothing answered
    assert stats.done_total == 4 and stats.already_done == 2


def test_startup_check_names_the_wrong_model_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(2))
    with FakeOpenAIServer(model="served-model") as server:
        with pytest.raises(EndpointError, match="serves served-model, not 'target'"):
            generate(config(mix, tmp_path / "out", server))
        assert server.stats()["chat_requests"] == 0
        code = main(["generate", "--mix", str(mix), "--out", str(tmp_path / "out"), "--model", "target",
                     "--endpoint", server.url, "--catalog", str(tmp_path / "c.duckdb")])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0 and "serves served-model, not 'target'" in err


def test_startup_check_reports_an_endpoint_that_is_down(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(2))
    with FakeOpenAIServer() as server:
        dead = server.url  # the port is free again once the server stops
    with pytest.raises(EndpointError, match="is not reachable"):
        generate(GenerateConfig(mix=mix, out=tmp_path / "out", model="target", endpoints=[dead]))


def test_cli_generates_and_records_the_run_in_the_catalog(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(12))
    catalog = tmp_path / "catalog.duckdb"
    with FakeOpenAIServer() as server:
        code = main(["generate", "--mix", str(mix), "--out", str(tmp_path / "out"), "--model", "target",
                     "--endpoint", server.url + "/v1", "--concurrency", "3", "--max-tokens", "32",
                     "--extra-body", '{"chat_template_kwargs": {"enable_thinking": false}}', "--catalog", str(catalog)])
    assert code == 0
    assert len(records(tmp_path / "out")) == 12
    meta = json.loads((tmp_path / "out" / "generation.json").read_text())
    assert meta["status"] == "complete" and meta["model"] == "target" and meta["stats"]["done_total"] == 12
    with Catalog.open(catalog) as cat:
        _, rows = cat.query("SELECT * FROM generation_runs", [])
    assert len(rows) == 1 and meta["run_id"] in rows[0]


def test_cli_rejects_bad_extra_body_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--mix", str(tmp_path), "--out", str(tmp_path / "o"), "--model", "m",
                 "--endpoint", "http://127.0.0.1:9", "--extra-body", "{not json"])
    assert code == 1 and "--extra-body is not valid JSON" in capsys.readouterr().err


def test_transformers_backend_writes_shards_in_the_same_format(tmp_path: Path, tiny_target: Path) -> None:
    rows = [
        {"id": "m", "turns": "all", "messages": [{"role": "user", "content": "def return import"},
                                                  {"role": "user", "content": "class self value"}]},
        {"id": "l", "turns": "last", "messages": [{"role": "user", "content": "list dict"},
                                                   {"role": "assistant", "content": "print"},
                                                   {"role": "user", "content": "for while"}]},
        {"id": "k", "keep_responses": True, "messages": [{"role": "user", "content": "if"},
                                                          {"role": "assistant", "content": "else"}]},
    ] + [{"id": f"s{i}", "turns": "last", "messages": [{"role": "user", "content": "tensor shape " * (i + 1)}]}
         for i in range(5)]
    mix = write_mix(tmp_path / "mix", rows)
    cfg = GenerateConfig(mix=mix, out=tmp_path / "out", model=str(tiny_target), backend="transformers",
                         batch_size=4, max_tokens=6, temperature=0.0)
    stats = generate(cfg)
    assert stats.done_total == 8 and stats.errors == 0 and stats.kept == 1
    by_id = {r["id"]: r for r in records(tmp_path / "out")}
    assert [(m["role"], m["train"]) for m in by_id["m"]["messages"]] == [
        ("user", False), ("assistant", True), ("user", False), ("assistant", True)]
    assert [m["train"] for m in by_id["l"]["messages"]] == [False, False, False, True]
    for record in by_id.values():
        assert record["model"] == str(tiny_target)
        assert record["finish_reason"] in ("stop", "length", "kept")
    answer = by_id["s0"]
    assert 1 <= answer["usage"]["completion_tokens"] <= 6 and answer["usage"]["prompt_tokens"] > 0
    assert answer["endpoint"].startswith("transformers:")
    # Greedy generation is deterministic: a second output directory gets the same answers.
    again = generate(cfg.model_copy(update={"out": tmp_path / "again"}))
    assert again.done_total == 8
    assert {r["id"]: r["messages"] for r in records(tmp_path / "again")} == {i: r["messages"] for i, r in by_id.items()}


def test_transformers_backend_reports_an_unloadable_model_in_one_line(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(1))
    with pytest.raises(EndpointError, match="cannot load model"):
        generate(GenerateConfig(mix=mix, out=tmp_path / "out", model=str(tmp_path / "nothing"), backend="transformers"))


def test_request_timeout_and_max_attempts_flags_bound_a_hung_server(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(2))
    out = tmp_path / "out"
    # answers the one-token start-up check at once, then hangs 30 s on every real request
    hung = lambda req: 0.0 if req.get("max_tokens") == 1 else 30.0  # noqa: E731
    with FakeOpenAIServer(latency=hung) as server:
        code = main(["generate", "--mix", str(mix), "--out", str(out), "--model", "target", "--endpoint", server.url,
                     "--request-timeout", "0.3", "--max-attempts", "2", "--concurrency", "2",
                     "--catalog", str(tmp_path / "c.duckdb")])
        chats = server.stats()["chat_requests"]
    assert code == 1  # every row failed: the run says so in its exit code
    errors = error_lines(out)
    assert sorted(e["id"] for e in errors) == ["q0", "q1"]
    assert all("timed out" in e["error"] and e["attempts"] == 2 for e in errors)
    assert chats == 1 + 2 * 2  # the start-up check, then two tries per row


def test_error_bodies_that_echo_a_key_are_stored_redacted(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", one_turn_rows(1))
    out = tmp_path / "out"
    key = "sk-proj-4f9KxW2mZq8RtY6uVb3NcL1pE7sA0dHj"
    with FakeOpenAIServer(faults_by_marker={"q0": [403]}, fault_message=f"Incorrect API key provided: {key}. Authorization: Bearer {key}") as server:
        generate(config(mix, out, server))
    [err] = error_lines(out)
    assert err["status"] == 403 and "[REDACTED]" in err["error"]
    assert key not in (out / "errors.jsonl").read_text()


def test_a_path_with_markup_is_printed_literally(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "[/x]" / "[bold]mix"
    code = main(["generate", "--mix", str(odd), "--out", str(tmp_path / "out"), "--model", "target",
                 "--endpoint", "http://127.0.0.1:9"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "[/x]/[bold]mix" in err and "MarkupError" not in err


def test_transformers_sampling_uses_the_models_settings_not_transformers_top_k_50() -> None:
    from types import SimpleNamespace

    from curator.generate.local import sampling_kwargs
    from curator.engines.sampling import SamplingParams

    bare = SimpleNamespace(top_k=None, top_p=None)  # a generation_config.json without sampling settings
    assert sampling_kwargs(SamplingParams(0.7, None, 16, {}), bare) == {
        "do_sample": True, "temperature": 0.7, "top_k": 0, "top_p": 1.0}
    tuned = SimpleNamespace(top_k=20, top_p=0.8)
    assert sampling_kwargs(SamplingParams(0.6, None, 16, {}), tuned)["top_k"] == 20
    assert sampling_kwargs(SamplingParams(0.6, 0.95, 16, {}), tuned)["top_p"] == 0.95  # the user's own wins
    assert sampling_kwargs(SamplingParams(0.0, 0.9, 16, {}), tuned) == {"do_sample": False}
