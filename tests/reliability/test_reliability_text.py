"""Hostile text is one counted malformed row, never a failed stage: a lone surrogate from the
server or in a source, NUL characters, JSON nested 100,000 deep, a 60 MB line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from curator.cli import main
from curator.mix import read_manifest
from tests.fakes.openai_server import FakeOpenAIServer, write_mix

DEEP = 100_000
LONE = "\ud800"


class LoneSurrogateServer(FakeOpenAIServer):
    """Answers prompts that contain LONE-MARK with text holding a lone surrogate (JSON "\\ud800")."""

    def _completion(self, req: dict[str, Any], messages: list[dict[str, Any]], last_user: str) -> dict[str, Any]:
        out = super()._completion(req, messages, last_user)
        if "LONE-MARK" in last_user:
            out["choices"][0]["message"]["content"] += f" {LONE} tail"
        return out


def _deep_line(row_id: str) -> str:
    return '{"id": "' + row_id + '", "conversations": ' + "[" * DEEP + "]" * DEEP + "}"


def test_an_answer_with_a_lone_surrogate_costs_one_row_not_the_shard(tmp_path: Path) -> None:
    rows = [{"id": f"r{i:03d}", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(300)]
    rows[150]["messages"][0]["content"] = "question LONE-MARK"
    mix = write_mix(tmp_path / "mix", rows)
    out = tmp_path / "gen"
    args = ["generate", "--mix", str(mix), "--out", str(out), "--model", "target", "--temperature", "0",
            "--catalog", str(tmp_path / "c.duckdb")]
    with LoneSurrogateServer() as server:
        assert main([*args, "--endpoint", server.url]) == 0
        assert main([*args, "--endpoint", server.url]) == 0  # the rerun does not ask for that answer again
        asked = [r for r in server.requests if "LONE-MARK" in json.dumps(r["messages"])]
    assert len(asked) == 1
    stored = [json.loads(line)["id"] for p in sorted(out.glob("shard-*.jsonl")) for line in p.read_text().splitlines()]
    assert len(stored) == 299 and "r150" not in stored
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text(encoding="ascii").splitlines()]
    assert [e["id"] for e in errors] == ["r150"] and "cannot be stored" in errors[0]["error"]
    meta = json.loads((out / "generation.json").read_text())
    assert meta["status"] == "partial" and meta["failed_rows"] == 1 and meta["stats"]["missing"] == 0


def test_build_mix_counts_surrogates_deep_nesting_and_huge_lines_as_malformed(tmp_path: Path) -> None:
    good = [{"conversations": [{"from": "human", "value": f"prompt number {i} about parsing"},
                               {"from": "gpt", "value": "ok"}]} for i in range(20)]
    lines = [json.dumps(r) for r in good]
    lines.append(json.dumps({"conversations": [{"from": "human", "value": f"bad {LONE} text"}]}))
    lines.append(json.dumps({"conversations": [{"from": "human", "value": "with a \x00 NUL inside"}]}))
    lines.append(_deep_line("deep"))
    lines.append(json.dumps({"conversations": [{"from": "human", "value": "x" * (60 << 20)}]}))  # a 60 MB line
    (tmp_path / "chat.jsonl").write_text("\n".join(lines) + "\n")
    # A deep element inside a JSON array file, which is streamed element by element: skipped alone.
    deep_element = '{"conversations": ' + "[" * DEEP + "]" * DEEP + "}"
    (tmp_path / "array.json").write_text("[" + ", ".join([deep_element] + [json.dumps(r) for r in good[:5]]) + "]")
    (tmp_path / "recipe.yaml").write_text(
        "name: hostile\nsources:\n  - path: chat.jsonl\n    name: chat\n    format: sharegpt\n    samples: 100\n"
        "  - path: array.json\n    name: array\n    format: sharegpt\n    samples: 100\ndedup: {exact: true, near: false}\n"
    )
    code = main(["build-mix", "--recipe", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "mix"),
                 "--catalog", str(tmp_path / "c.duckdb")])
    assert code == 0
    manifest = read_manifest(tmp_path / "mix")
    chat, array_src = manifest["sources"]
    assert chat["read"] == 24 and chat["malformed"] == 2 and chat["filtered"] == 1 and chat["kept"] == 21
    assert any("surrogate" in reason for reason in chat["malformed_reasons"])
    assert any("nested too deep" in reason for reason in chat["malformed_reasons"])
    assert array_src["read"] == 6 and array_src["malformed"] == 1 and array_src["duplicates"] == 5


@pytest.fixture
def gen_with_hostile_records(tmp_path: Path) -> Path:
    from tests.training.capture.test_hidden_states import conversation, write_gen

    surrogate, nul = conversation(90), conversation(91)
    surrogate["id"], nul["id"] = "surrogate", "nul"
    surrogate["messages"][2]["content"] = f"an answer {LONE} here"
    nul["messages"][2]["content"] = "an answer \x00 here"
    records = [conversation(i) for i in range(4)] + [json.dumps(surrogate), json.dumps(nul), _deep_line("deep")]
    return write_gen(tmp_path / "gen", records)


def test_hidden_states_and_plan_count_hostile_records_as_malformed(
    tiny_target: Path, gen_with_hostile_records: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.storage.reader import HiddenStateStore

    assert main(["plan", "--model", str(tiny_target), "--data", str(gen_with_hostile_records), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["samples"] == 5 and "2 malformed" in plan["lengths_from"]
    store = tmp_path / "store"
    assert main(["hidden-states", "--model", str(tiny_target), "--data", str(gen_with_hostile_records),
                 "--out", str(store)]) == 0
    opened = HiddenStateStore.open(store)
    assert sorted(opened.ids()) == sorted(["c000", "c001", "c002", "c003", "nul"])


HUGE_INT = "9" * 5000  # json.loads refuses integers past 4,300 digits with a plain ValueError


def test_a_5000_digit_integer_is_one_malformed_row_in_profile_build_mix_plan_and_hidden_states(
    tiny_target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 38 item 7: "unexpected ValueError" once stopped each of these stages."""
    from tests.training.capture.test_hidden_states import conversation, write_gen
    from training.storage.reader import HiddenStateStore

    good = [{"messages": [{"role": "user", "content": f"how do I sort list {i}?"}]} for i in range(6)]
    lines = [json.dumps(r) for r in good] + ['{"messages": [{"role": "user", "content": "x"}], "n": ' + HUGE_INT + "}"]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "a.json").write_text("[" + ", ".join(lines) + "]")
    for traffic in ("t.jsonl", "a.json"):
        assert main(["profile", "--traffic", str(tmp_path / traffic), "--out", str(tmp_path / "p.json")]) == 0
        assert json.loads((tmp_path / "p.json").read_text())["malformed"] == 1
    (tmp_path / "recipe.yaml").write_text("name: n\nsources:\n  - path: t.jsonl\n    samples: 10\n"
                                          "dedup: {exact: true, near: false}\n")
    assert main(["build-mix", "--recipe", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "mix"),
                 "--catalog", str(tmp_path / "c.duckdb")]) == 0
    (source,) = read_manifest(tmp_path / "mix")["sources"]
    assert source["malformed"] == 1 and source["kept"] == 6
    huge = conversation(7)
    huge["id"] = "huge"
    line = json.dumps(huge)[:-1] + ', "n": ' + HUGE_INT + "}"
    bad_call = conversation(9)
    bad_call["id"] = "call"
    bad_call["messages"][2]["tool_calls"] = [{"id": "c1", "type": "function",
                                               "function": {"name": "f", "arguments": '{"x": ' + HUGE_INT + "}"}}]
    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(4)] + [line, json.dumps(bad_call)])
    capsys.readouterr()
    assert main(["plan", "--model", str(tiny_target), "--data", str(gen), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["samples"] == 4 and "2 malformed" in plan["lengths_from"], plan["lengths_from"]
    assert main(["hidden-states", "--model", str(tiny_target), "--data", str(gen), "--out", str(tmp_path / "s")]) == 0
    assert sorted(HiddenStateStore.open(tmp_path / "s").ids()) == ["c000", "c001", "c002", "c003"]


def test_a_lone_surrogate_in_a_request_is_one_malformed_row_of_the_profile(tmp_path: Path) -> None:
    """issue 38 item 7: profile once failed writing with "unexpected UnicodeEncodeError"."""
    rows = [{"messages": [{"role": "user", "content": f"question {i}"}]} for i in range(5)]
    rows.append({"messages": [{"role": "user", "content": f"hi {LONE} there"}]})
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["profile", "--traffic", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "p.json")]) == 0
    profile = json.loads((tmp_path / "p.json").read_text())
    assert profile["rows"] == 5 and profile["malformed"] == 1
    assert any("Unicode" in reason for reason in profile["malformed_reasons"])


def test_deep_nesting_binary_files_and_bad_optimizer_values_are_named_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 38 item 7: RecursionError (--match, a train config), UnicodeDecodeError (a binary recipe), and
    ValueError (lr=-1) once came out as "unexpected ..."."""
    deep = "[" * DEEP + "]" * DEEP
    (tmp_path / "deep.json").write_text('{"kind": ' + deep + "}")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00name: x\x80\x81")
    (tmp_path / "t.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    (tmp_path / "r.yaml").write_text("name: n\nsources:\n  - path: t.jsonl\n    samples: 1\n")
    (tmp_path / "cfg.json").write_text('{"lr": ' + deep + "}")
    runs = [
        ["build-mix", "--recipe", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "m"), "--match",
         str(tmp_path / "deep.json"), "--catalog", str(tmp_path / "c.duckdb")],
        ["build-mix", "--recipe", str(tmp_path / "binary.yaml"), "--out", str(tmp_path / "m"),
         "--catalog", str(tmp_path / "c.duckdb")],
        ["train", "--config", str(tmp_path / "cfg.json"), "data=x", "target=y", "out=z"],
        ["train", "data=x", "target=y", f"out={tmp_path / 'run'}", "lr=-1"],
    ]
    for argv in runs:
        capsys.readouterr()
        assert main(argv) == 1, argv
        err = " ".join(capsys.readouterr().err.split())
        assert "error:" in err and "unexpected" not in err, (argv, err)
    assert not (tmp_path / "run").exists()
