"""Resume by id: a generation killed at any moment (SIGKILL included) and run again ends with
every id of the mix exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from curator.errors import ConfigError
from curator.generate import GenerateConfig, generate
from tests.fakes.openai_server import FakeOpenAIServer, write_mix

ROOT = Path(__file__).resolve().parents[3]
RUNNER = "import sys; from curator.generate import GenerateConfig, generate; " \
         "generate(GenerateConfig.model_validate_json(open(sys.argv[1]).read()))"


def rows(n: int) -> list[dict]:
    return [{"id": f"id-{i:04d}", "turns": "all",
             "messages": [{"role": "user", "content": f"question {i}"}, {"role": "user", "content": f"follow-up {i}"}]}
            for i in range(n)]


def shard_ids(out: Path) -> Counter[str]:
    ids: Counter[str] = Counter()
    for shard in out.glob("shard-*.jsonl"):
        ids.update(json.loads(line)["id"] for line in shard.read_text().splitlines())
    return ids


@pytest.mark.slow
def test_resume_after_kill_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    n = 400
    mix = write_mix(tmp_path / "mix", rows(n), files=2)
    out = tmp_path / "out"
    with FakeOpenAIServer(latency=0.02, record=False) as server:
        cfg = GenerateConfig(mix=mix, out=out, model="target", endpoints=[server.url], concurrency=6,
                             shard_rows=15, shard_seconds=0.3, retry_base_s=0.01)
        cfg_path = tmp_path / "config.json"
        cfg_path.write_text(cfg.model_dump_json())
        proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(cfg_path)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while len(list(out.glob("shard-*.jsonl"))) < 4:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "the run wrote no shards"
                time.sleep(0.02)
            # While it runs, the output folder is locked against a second writer.
            with pytest.raises(ConfigError, match=r"being written by another `curator generate` \(PID \d+"):
                generate(cfg)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(10)
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL
        before = shard_ids(out)
        assert 0 < sum(before.values()) < n
        assert max(before.values()) == 1
        assert json.loads((out / "generation.json").read_text())["status"] == "running"
        # A shard the kill caught half-written is a temporary file: never read, and cleaned up.
        (out / ".shard-09999.jsonl.tmp-12345").write_text('{"id": "id-0000", "messages": [')
        # So is a torn last line of the errors file.
        (out / "errors.jsonl").write_text('{"id": "id-0001", "error": "HTTP 500", "permanent": false}\n{"id": "id-00')

        stats = generate(cfg)

    after = shard_ids(out)
    assert set(after) == {f"id-{i:04d}" for i in range(n)}
    assert max(after.values()) == 1
    assert stats.already_done == sum(before.values())
    assert stats.generated == n - stats.already_done
    assert stats.missing == 0 and stats.errors_total == 0
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    assert json.loads((out / "generation.json").read_text())["status"] == "complete"
    for shard in out.glob("shard-*.jsonl"):  # every record whole, both turns answered
        for line in shard.read_text().splitlines():
            assert [m["train"] for m in json.loads(line)["messages"]] == [False, True, False, True]


def test_rerun_of_a_finished_output_sends_no_request(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", rows(30))
    with FakeOpenAIServer() as server:
        cfg = GenerateConfig(mix=mix, out=tmp_path / "out", model="target", endpoints=[server.url], concurrency=4)
        first = generate(cfg)
        chats = server.stats()["chat_requests"]
        second = generate(cfg)
        assert server.stats()["chat_requests"] == chats + 1  # only the start-up check
    assert first.generated == 30 and second.generated == 0 and second.already_done == 30
    assert sum(shard_ids(tmp_path / "out").values()) == 30


def test_duplicate_ids_in_the_mix_are_generated_once(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", rows(5) + rows(2))
    with FakeOpenAIServer() as server:
        stats = generate(GenerateConfig(mix=mix, out=tmp_path / "out", model="target", endpoints=[server.url]))
    assert stats.duplicate_ids_in_mix == 2 and stats.mix_rows == 5
    assert shard_ids(tmp_path / "out") == Counter({f"id-{i:04d}": 1 for i in range(5)})


def test_failures_that_ran_out_of_retries_are_tried_again_on_the_next_run(tmp_path: Path) -> None:
    mix = write_mix(tmp_path / "mix", rows(4))
    out = tmp_path / "out"
    # question 2 fails with 503 more often than the attempts allow, then the server recovers.
    with FakeOpenAIServer(faults_by_marker={"question 2": [503] * 3}) as server:
        cfg = GenerateConfig(mix=mix, out=out, model="target", endpoints=[server.url], max_attempts=3,
                             retry_base_s=0.0)
        first = generate(cfg)
        assert first.errors == 1 and first.errors_total == 1
        [err] = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
        assert err["id"] == "id-0002" and err["status"] == 503 and err["permanent"] is False
        second = generate(cfg)  # no --retry-errors needed for a transient failure
    assert second.generated == 1 and second.missing == 0 and second.errors_total == 0
    assert (out / "errors.jsonl").read_text() == ""
    assert set(shard_ids(out)) == {f"id-{i:04d}" for i in range(4)}
