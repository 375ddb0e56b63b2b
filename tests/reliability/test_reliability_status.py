"""generation.json tells the truth: `complete` only when every row was generated, `failed` when
every row failed, `partial` with the count when some did; a row without an id is a malformed row
with its own error and never keeps a run incomplete."""

from __future__ import annotations

import json
from pathlib import Path

from curator.cli import main
from tests.fakes.openai_server import FakeOpenAIServer, write_mix


def _run(tmp_path: Path, rows: list[dict], exit_code: int = 0) -> dict:
    mix = write_mix(tmp_path / "mix", rows)
    with FakeOpenAIServer() as server:
        assert main(["generate", "--mix", str(mix), "--out", str(tmp_path / "gen"), "--model", "target",
                     "--endpoint", server.url, "--catalog", str(tmp_path / "c.duckdb")]) == exit_code
    return json.loads((tmp_path / "gen" / "generation.json").read_text())


def _errors(tmp_path: Path) -> dict[str, str]:
    lines = (tmp_path / "gen" / "errors.jsonl").read_text().splitlines()
    return {e["id"]: e["error"] for e in map(json.loads, lines)}


def test_a_run_where_every_row_failed_is_failed_not_complete(tmp_path: Path) -> None:
    # and the command exits non-zero: a script must not go on to capture states of nothing
    meta = _run(tmp_path, [{"id": f"p{i}", "messages": [{"role": "user", "content": f"POISON {i}"}]} for i in range(4)],
                exit_code=1)
    assert meta["status"] == "failed" and meta["failed_rows"] == 4
    assert meta["stats"]["done_total"] == 0 and meta["stats"]["missing"] == 0


def test_rows_without_an_id_are_malformed_rows_and_the_run_still_finishes(tmp_path: Path) -> None:
    rows = [{"id": f"q{i}", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(3)]
    rows.insert(1, {"id": None, "messages": [{"role": "user", "content": "who am I"}]})
    rows.append({"id": "", "messages": [{"role": "user", "content": "and I"}]})
    meta = _run(tmp_path, rows)
    stats = meta["stats"]
    assert stats["done_total"] == 3 and stats["errors_total"] == 2 and stats["missing"] == 0
    assert meta["status"] == "partial" and meta["failed_rows"] == 2
    errors = _errors(tmp_path)
    assert len(errors) == 2 and all("missing id" in e for e in errors.values())
    assert all("row 1 of" in k or "row 4 of" in k for k in errors)


def test_an_answer_with_content_null_is_a_row_error_not_an_empty_trained_turn(tmp_path: Path) -> None:
    """`content: null` answers were once stored as empty trained turns and the run said complete (issue 38 item 10)."""
    from tests.fakes.hostile_server import HostileServer, Reply, chat_answer

    def script(request: dict) -> Reply:
        text = request["messages"][-1]["content"]
        if "NULL" not in text:
            return Reply(chat_answer(f"answer to {text}"))
        body = json.loads(chat_answer("x"))
        body["choices"][0]["message"]["content"] = None
        return Reply(json.dumps(body).encode())

    rows = [{"id": f"q{i}", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(3)]
    rows.append({"id": "null", "messages": [{"role": "user", "content": "NULL please"}]})
    mix = write_mix(tmp_path / "mix", rows)
    with HostileServer(script) as server:
        assert main(["generate", "--mix", str(mix), "--out", str(tmp_path / "gen"), "--model", "target",
                     "--endpoint", server.url, "--catalog", str(tmp_path / "c.duckdb")]) == 0
    meta = json.loads((tmp_path / "gen" / "generation.json").read_text())
    assert meta["status"] == "partial" and meta["failed_rows"] == 1
    assert "content: null" in _errors(tmp_path)["null"]
    stored = [json.loads(line) for f in sorted((tmp_path / "gen").glob("shard-*.jsonl")) for line in f.read_text().splitlines()]
    assert sorted(r["id"] for r in stored) == ["q0", "q1", "q2"]
