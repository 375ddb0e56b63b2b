"""`curator bench-serve` against local stand-ins for SGLang and vLLM that publish the engines' fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.fakes.serving_servers import FakeServingServer

from curator.errors import ConfigError, EndpointError
from curator.serve_bench.client import Endpoint
from curator.engines.prometheus import parse_prometheus
from curator.engines.sglang import verify_counts as sglang_verify_counts
from curator.engines import vllm
from curator.serve_bench.report import verdict
from curator.serve_bench.run import BenchPrompt, bench_serve

CODE_MARK = 7  # a token id (SGLang) / word (vLLM) the stand-ins read as "a code prompt"


def by_category(prompt) -> float:
    """Acceptance the stand-ins give: code prompts 3.0, others 1.5."""
    text = json.dumps(prompt)
    return 3.0 if (isinstance(prompt, list) and CODE_MARK in prompt) or "code:" in text else 1.5


def prompts(n: int = 6) -> list[BenchPrompt]:
    out = []
    for i in range(n):
        code = i % 2 == 0
        out.append(BenchPrompt(f"p{i}", "code" if code else "chat",
                               [{"role": "user", "content": f"{'code:' if code else 'chat:'} question {i}"}],
                               [1, 2, CODE_MARK if code else 9, i + 10]))
    return out


def test_sglang_acceptance_per_category_and_a_draft_slower_than_no_speculation() -> None:
    # the original case: acceptance ~2 does not pay for the draft's own forwards
    with FakeServingServer("sglang", acceptance=by_category, step_s=0.004, draft_step_s=0.006) as spec, \
         FakeServingServer("sglang", speculative=False, step_s=0.004) as plain:
        report = bench_serve(Endpoint("sglang", spec.url), Endpoint("sglang", plain.url), prompts(),
                             concurrencies=[1], max_tokens=12, source="test")
    draft = {g.category: g for g in report.groups if g.endpoint == "draft"}
    # 12 tokens in cycles of mean 3.0 (code) and 1.5 (chat): exactly what spec_verify_ct says
    assert draft["code"].acceptance_length == pytest.approx(12 / 4)
    assert draft["chat"].acceptance_length == pytest.approx(12 / 8)
    assert all(g.acceptance_length is None for g in report.groups if g.endpoint == "baseline")
    assert report.acceptance_length(1) == pytest.approx(48 / 24)
    speedup = report.speedup(1)
    assert speedup is not None and speedup < 0.98
    assert report.verdicts()[1] == f"speedup {speedup:.2f}x: slower than no speculation"
    tpot = draft["chat"].to_json()["time_per_output_token_ms"]
    assert tpot > 0 and draft["chat"].output_tokens == 3 * 12


def test_vllm_acceptance_comes_from_metric_deltas_per_category_at_each_concurrency() -> None:
    with FakeServingServer("vllm", acceptance=by_category, step_s=0.004, draft_step_s=0.0) as spec:
        report = bench_serve(Endpoint("vllm", spec.url), None, prompts(8), concurrencies=[1, 4], max_tokens=12,
                             source="test")
        assert spec.max_in_flight == 4
    for c in (1, 4):
        groups = {g.category: g for g in report.groups if g.concurrency == c}
        assert groups["code"].acceptance_length == pytest.approx(3.0)
        assert groups["chat"].acceptance_length == pytest.approx(1.5)
        # per-position rates (tokens 1..k all accepted) can only fall with the position
        rates = groups["code"].position_rates
        assert len(rates) == 3 and rates[0] >= rates[1] >= rates[2]
    assert report.verdicts()[1].startswith("speedup unknown")


def test_verdict_lines() -> None:
    assert verdict(0.912) == "speedup 0.91x: slower than no speculation"
    assert verdict(1.35) == "speedup 1.35x: faster than no speculation"
    assert verdict(1.0).endswith("no faster than no speculation")


def test_prometheus_counters_sum_engines_and_skip_created_samples() -> None:
    page = "\n".join([
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 30.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 50',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 15',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 35',
    ])
    c = vllm.spec_counters(page)
    assert (c.drafts, c.accepted) == (40.0, 50.0) and c.acceptance_length == pytest.approx(2.25)
    assert c.position_rates() == [35 / 40, 15 / 40]
    assert len(parse_prometheus(page)) == 6
    with pytest.raises(EndpointError, match="without speculative decoding"):
        vllm.spec_counters('vllm:num_requests_running{engine="0"} 1')


def test_sglang_meta_info_without_completion_tokens_is_refused() -> None:
    assert sglang_verify_counts({"completion_tokens": 12, "spec_verify_ct": 5}) == (12, 5)
    assert sglang_verify_counts({"completion_tokens": 12}) == (12, None)
    with pytest.raises(EndpointError, match="completion_tokens"):
        sglang_verify_counts({"text": "x"})


def write_prompt_file(path: Path) -> Path:
    rows = [{"id": f"q{i}", "category": "code" if i % 2 == 0 else "chat",
             "messages": [{"role": "user", "content": f"{'code:' if i % 2 == 0 else 'chat:'} q{i}"}]} for i in range(4)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_cli_prints_the_verdict_and_writes_the_report(tmp_path: Path, capsys) -> None:
    from curator.cli import main

    out = tmp_path / "bench.json"
    with FakeServingServer("vllm", acceptance=by_category, step_s=0.001, draft_step_s=0.0) as spec, \
         FakeServingServer("vllm", speculative=False, step_s=0.012) as plain:  # 12 ms a token: far slower
        code = main(["bench-serve", "--engine", "vllm", "--endpoint", spec.url, "--baseline", plain.url,
                     "--prompts", str(write_prompt_file(tmp_path / "p.jsonl")), "--concurrency", "1,2",
                     "--max-tokens", "16", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report["concurrency"]) == {"1", "2"}
    assert report["concurrency"]["1"]["verdict"].endswith("faster than no speculation")
    assert {g["category"] for g in report["groups"]} == {"code", "chat"}
    assert "concurrency 1: speedup" in capsys.readouterr().out


def test_cli_refuses_sglang_without_a_tokenizer_in_one_line(tmp_path: Path, capsys) -> None:
    from curator.cli import main

    code = main(["bench-serve", "--endpoint", "http://127.0.0.1:9", "--prompts",
                 str(write_prompt_file(tmp_path / "p.jsonl"))])
    assert code == 1 and "--tokenizer" in capsys.readouterr().err


def test_sglang_prompts_are_rendered_with_the_targets_chat_template(tiny_target: Path, tmp_path: Path) -> None:
    from curator.cli import main

    out = tmp_path / "bench.json"
    with FakeServingServer("sglang", acceptance=2.0) as spec:
        code = main(["bench-serve", "--endpoint", spec.url, "--tokenizer", str(tiny_target), "--prompts",
                     str(write_prompt_file(tmp_path / "p.jsonl")), "--max-tokens", "8", "--json", str(out)])
    assert code == 0
    assert json.loads(out.read_text())["concurrency"]["1"]["acceptance_length"] == pytest.approx(2.0)


def test_a_mix_with_the_draft_sends_only_the_rows_it_never_trained_on(tmp_path: Path) -> None:
    import pyarrow as pa

    from curator.mix.publish import write_tables
    from curator.serve_bench.prompts import load_bench_prompts
    from training.feed.batches import split_eval

    mix = tmp_path / "mix"
    ids = [f"row-{i}" for i in range(40)]
    write_tables(mix, [pa.Table.from_pylist([{"id": i, "source": "t", "category": "code", "turns": "all",
                                              "messages": [{"role": "user", "content": i}]} for i in ids])], name="t")
    ckpt = tmp_path / "run" / "checkpoints" / "step-0000001"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"store": {"path": str(tmp_path / "states")},
                                                "split": {"eval_fraction": 0.25, "eval_data": ""}}))
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"curator": {"checkpoint": str(ckpt)}}))
    held, source = load_bench_prompts(mix, draft_dir=export)
    assert sorted(p.id for p in held) == sorted(split_eval(ids, 0.25)[1]) and "eval_fraction 0.25" in source
    every, source = load_bench_prompts(mix)
    assert len(every) == 40 and "not checked against a training split" in source


def test_an_engine_error_is_one_line_naming_the_endpoint_and_the_engines_message() -> None:
    with FakeServingServer("vllm") as spec:
        with pytest.raises(EndpointError, match=r"/v1/chat/completions answered 404: The model `wrong` does not exist"):
            bench_serve(Endpoint("vllm", spec.url + "/v1/", "wrong"), None, prompts(2), concurrencies=[1],
                        max_tokens=4, source="test")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_request_carries_the_temperature_asked_for(engine: str) -> None:
    with FakeServingServer(engine, acceptance=by_category, step_s=0.0, draft_step_s=0.0) as spec:
        report = bench_serve(Endpoint(engine, spec.url), None, prompts(4), concurrencies=[1], max_tokens=4,
                             source="test", temperature=0.6)
        greedy = bench_serve(Endpoint(engine, spec.url), None, prompts(2), concurrencies=[1], max_tokens=4, source="test")
    sent = [b["sampling_params"]["temperature"] if engine == "sglang" else b["temperature"] for b in spec.bodies]
    assert sent == [0.6] * 5 + [0.0] * 3  # one warm-up request, then the measured ones, per run
    assert report.to_json()["temperature"] == 0.6 and greedy.to_json()["temperature"] == 0.0
    with pytest.raises(ConfigError, match="temperature"):
        bench_serve(Endpoint(engine, spec.url), None, prompts(2), concurrencies=[1], max_tokens=4, source="test",
                    temperature=float("nan"))


SSE_ANSWER = (b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
              b'data: {"choices": [], "usage": {"completion_tokens": 1}}\n\ndata: [DONE]\n\n')


@pytest.mark.parametrize("case", ["401", "500", "no metrics"])
def test_url_credentials_never_appear_in_bench_serves_errors_or_report(case: str, tmp_path: Path, capsys) -> None:
    """`--endpoint http://user:secret@host:port` once appeared whole in the error line (issue 38 item 5)."""
    from tests.fakes.hostile_server import HostileServer, Reply

    from curator.cli import main

    def script(request: dict) -> Reply:
        if "messages" not in request:  # GET /metrics
            return Reply(b"not found", status=404)
        if case == "401":
            return Reply(b'{"error": {"message": "bad credentials"}}', status=401)
        if case == "500":
            return Reply(b'{"error": {"message": "boom"}}', status=500)
        return Reply(SSE_ANSWER)

    with HostileServer(script) as server:
        url = server.url.replace("http://", "http://benchuser:s3cr3t-pw@")
        code = main(["bench-serve", "--engine", "vllm", "--endpoint", url, "--prompts",
                     str(write_prompt_file(tmp_path / "p.jsonl")), "--max-tokens", "4"])
    said = capsys.readouterr()
    assert code == 1 and "error:" in said.err
    assert "s3cr3t-pw" not in said.out + said.err and "benchuser" not in said.out + said.err
    assert server.url.removeprefix("http://") in " ".join(said.err.split())  # the endpoint is still named
    # the credentials were sent, as basic auth
    import base64
    assert any(h.get("authorization") == "Basic " + base64.b64encode(b"benchuser:s3cr3t-pw").decode()
               for h in server.seen_headers)


def test_bench_serves_timeout_bounds_the_whole_request_and_its_answer_size(tmp_path: Path) -> None:
    """A server dripping one byte at a time once kept a `--timeout 3` request for 68 s (issue 38 item 14)."""
    import time

    from tests.fakes.hostile_server import HostileServer, Reply

    with HostileServer(lambda request: Reply(SSE_ANSWER * 50, drip_s=0.05)) as server:
        start = time.perf_counter()
        with pytest.raises(EndpointError, match=r"no whole answer within 1 s \(--timeout\)"):
            bench_serve(Endpoint("vllm", server.url, "target"), None, prompts(1), concurrencies=[1], max_tokens=4,
                        source="test", timeout_s=1.0)
        assert time.perf_counter() - start < 5
    huge = b'data: {"choices": [{"delta": {"content": "' + b"x" * (17 * 2**20) + b'"}}]}\n\n'
    with HostileServer(lambda request: Reply(huge, chunked=True)) as server:
        with pytest.raises(EndpointError, match="larger than 16,777,216 bytes"):
            bench_serve(Endpoint("vllm", server.url, "target"), None, prompts(1), concurrencies=[1], max_tokens=4,
                        source="test")
