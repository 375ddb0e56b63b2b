"""One byte that is not UTF-8 in a generation shard or errors.jsonl (issue 49 item 6): `plan`,
`hidden-states` and a `generate` resume count that line as one malformed row and go on; before, each
ended with "unexpected UnicodeDecodeError ... please report it"."""

from __future__ import annotations

import json
from pathlib import Path

from curator.cli import main
from curator.generate import GenerateConfig, generate
from curator.generate.shards import ErrorLog, scan_shards
from tests.fakes.openai_server import FakeOpenAIServer, write_mix
from training.records.chat_tokens import GenerationReadStats, iter_generation

BAD_LINE = b'{"id": "broken", "messages": [{"role": "user", "content": "caf\xe9"}]}\n'  # Latin-1, not UTF-8


def rows(n: int) -> list[dict]:
    return [{"id": f"id-{i}", "turns": "all", "messages": [{"role": "user", "content": f"def value {i}"}]}
            for i in range(n)]


def generated(tmp_path: Path, n: int = 4) -> tuple[FakeOpenAIServer, GenerateConfig]:
    """Generate the first `n` of 5 rows; return the server (running) and the config."""
    server = FakeOpenAIServer().start()
    cfg = GenerateConfig(mix=write_mix(tmp_path / "mix", rows(5)), out=tmp_path / "out", model="target",
                         endpoints=[server.url], concurrency=2, limit=n)
    generate(cfg)
    return server, cfg


def spoil(path: Path) -> None:
    with open(path, "ab") as fh:
        fh.write(BAD_LINE)


def test_a_shard_line_that_is_not_utf8_is_one_malformed_record(tmp_path: Path) -> None:
    server, cfg = generated(tmp_path)
    server.stop()
    shard = next((tmp_path / "out").glob("shard-*.jsonl"))
    spoil(shard)
    read = GenerationReadStats()
    ids = [r["id"] for r in iter_generation(tmp_path / "out", read)]
    assert sorted(ids) == [f"id-{i}" for i in range(4)] and read.malformed == 1
    scan = scan_shards(tmp_path / "out")
    assert scan.malformed_lines == 1 and len(scan.done_ids) == 4


def test_a_generate_resume_reads_past_bad_bytes_in_shards_and_errors_jsonl(tmp_path: Path) -> None:
    server, cfg = generated(tmp_path, 3)
    try:
        out = tmp_path / "out"
        spoil(next(out.glob("shard-*.jsonl")))
        (out / "errors.jsonl").write_bytes(json.dumps({"id": "gone", "error": "x"}).encode() + b"\n" + BAD_LINE)
        log = ErrorLog(out)
        assert set(log.load()) == {"gone"} and log.malformed_lines == 1
        stats = generate(cfg.model_copy(update={"limit": None}))
    finally:
        server.stop()
    assert stats.generated == 2 and stats.done_total == 5 and stats.status == "complete"


def test_plan_and_hidden_states_count_the_line_and_go_on(tmp_path: Path, tiny_target: Path) -> None:
    server, _ = generated(tmp_path)
    server.stop()
    out = tmp_path / "out"
    spoil(next(out.glob("shard-*.jsonl")))
    assert main(["plan", "--model", str(tiny_target), "--data", str(out), "--json"]) == 0
    assert main(["hidden-states", "--model", str(tiny_target), "--data", str(out), "--out",
                 str(tmp_path / "store")]) == 0
    assert len(list((tmp_path / "store").glob("**/*.safetensors"))) >= 1
