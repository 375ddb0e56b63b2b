"""A newcomer's first hour with the data: outcomes with nothing in them are errors that say why,
the catalog keeps its statuses valid, no network is found out in seconds, and a mix folder
reads back with the usual tools."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import duckdb
import pytest

from curator.catalog import MIGRATIONS, Catalog
from curator.cli import main
from curator.errors import CatalogError


def _recipe(folder: Path, sources: list[dict]) -> Path:
    import yaml

    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({"name": "first-hour", "seed": 0, "sources": sources}))
    return path


def _chat_file(path: Path, n: int) -> Path:
    rows = [{"conversations": [{"from": "human", "value": f"question number {i}: how do I sort a list of {i} items?"},
                               {"from": "gpt", "value": "use sorted()"}]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_status_outside_the_three_is_refused_by_the_database(tmp_path: Path) -> None:
    catalog = Catalog.open(tmp_path / "c.duckdb")
    catalog.add_candidate("run", "agent", "org/data", "chat", 0.9, "fits", 100)
    with pytest.raises(CatalogError, match="CHECK constraint"):
        catalog.query("UPDATE candidates SET status = 'aproved'")
    assert catalog.candidates(status="proposed")[0]["dataset_id"] == "org/data"


def test_an_older_catalog_with_a_misspelt_status_is_repaired_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    for migration in MIGRATIONS[:2]:
        con.execute(migration)
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (2)")
    con.execute("INSERT INTO candidates (dataset_id, status) VALUES ('org/a', 'aproved'), ('org/b', 'approved')")
    con.close()
    catalog = Catalog.open(path)
    rows = {r["dataset_id"]: r for r in catalog.candidates()}
    assert rows["org/a"]["status"] == "proposed" and rows["org/b"]["status"] == "approved"
    note = catalog.query("SELECT note FROM candidates WHERE dataset_id = 'org/a'")[1][0][0]
    assert "'aproved'" in note


def test_a_source_whose_every_row_is_malformed_fails_the_build_and_records_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _chat_file(tmp_path / "good.jsonl", 20)
    (tmp_path / "broken.jsonl").write_text('{"conversations": 7}\n{"no": "turns"}\nnot json\n')
    recipe = _recipe(tmp_path, [{"path": "good.jsonl", "name": "good", "samples": 10, "category": "chat"},
                                {"path": "broken.jsonl", "name": "broken", "samples": 10, "category": "chat",
                                 "format": "sharegpt"}])
    catalog = tmp_path / "c.duckdb"
    code = main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix"), "--catalog", str(catalog)])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1 and error.startswith("error:") and "broken: 3 read, 3 malformed" in error and "good" not in error
    assert not (tmp_path / "mix").exists()
    assert Catalog.open(catalog).query("SELECT count(*) FROM mixes")[1][0][0] == 0


def test_a_mix_with_no_rows_left_is_an_error_that_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _chat_file(tmp_path / "chat.jsonl", 5)
    recipe = _recipe(tmp_path, [{"path": "chat.jsonl", "name": "chat", "samples": 5, "category": "chat"}])
    (tmp_path / "recipe.yaml").write_text(recipe.read_text() + "filters: {max_prompt_chars: 3}\n")
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix"),
                 "--catalog", str(tmp_path / "c.duckdb")]) == 1
    err = capsys.readouterr().err
    assert "empty" in err and "5 filtered" in err


def test_a_missing_source_file_leaves_no_output_folder(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, [{"path": "missing.jsonl", "name": "m", "samples": 5, "category": "chat"}])
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix"),
                 "--catalog", str(tmp_path / "c.duckdb")]) == 1
    assert not (tmp_path / "mix").exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_network_build_mix_says_so_in_seconds_naming_every_hub_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = ["org/first", "org/second", "org/third"]
    recipe = _recipe(tmp_path, [{"dataset": d, "samples": 5, "category": "chat"} for d in hub])
    start = time.perf_counter()
    code = main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix"), "--catalog", str(tmp_path / "c.duckdb")])
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 1 and elapsed < 10
    assert all(d in err for d in hub) and "--offline" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "mix").exists()


def test_a_mix_folder_reads_back_with_datasets_duckdb_and_pandas(tmp_path: Path) -> None:
    import datasets
    import pandas as pd

    from curator.mix import build_mix, load_recipe, read_manifest

    _chat_file(tmp_path / "chat.jsonl", 30)
    mix = tmp_path / "mix"
    build_mix(load_recipe(_recipe(tmp_path, [{"path": "chat.jsonl", "name": "chat", "samples": 20,
                                              "category": "chat"}])), mix)
    assert read_manifest(mix)["rows"] == 20
    assert datasets.load_dataset("parquet", data_dir=str(mix), split="train").num_rows == 20
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{mix}/*')").fetchall()[0][0] == 20
    assert duckdb.sql(f"SELECT count(*) FROM '{mix}/*.parquet'").fetchall()[0][0] == 20
    assert len(pd.read_parquet(mix)) == 20
    # a mix folder is also a valid local source: its manifest is not read as rows
    again = build_mix(load_recipe(_recipe(tmp_path, [{"path": "mix", "name": "again", "samples": 20,
                                                      "category": "chat"}])), tmp_path / "mix2")
    assert again["sources"][0]["malformed"] == 0 and again["rows"] == 20


def test_the_demo_warns_when_most_answers_are_one_token_repeated(tmp_path: Path, tiny_target: Path) -> None:
    from curator.demo.pipeline import QUICK, Demo, repeated_token_share

    assert repeated_token_share([5, 5, 5, 7]) == 0.75 and repeated_token_share([]) == 0.0
    demo = Demo(tmp_path, QUICK)
    (tmp_path / "target").symlink_to(tiny_target)
    gen = tmp_path / "gen"
    gen.mkdir()
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": "hi"},
                                         {"role": "assistant", "content": "<|user|>" * 12 if i < 8 else "def f(x): return x"}]}
            for i in range(10)]
    (gen / "shard-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert demo._check_answers(gen) == "8 of 10"
    assert demo.report.warnings and "8 of 10 regenerated answers" in demo.report.warnings[0]


def _small_mix(tmp_path: Path) -> Path:
    from curator.mix.build import build_mix
    from curator.mix.recipe import load_recipe

    _chat_file(tmp_path / "chat.jsonl", 4)
    mix = tmp_path / "mix"
    build_mix(load_recipe(_recipe(tmp_path, [{"path": "chat.jsonl", "name": "chat", "samples": 4, "category": "chat"}])),
              mix)
    return mix


def test_generate_refused_before_its_first_request_leaves_no_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mix = _small_mix(tmp_path)
    common = ["generate", "--mix", str(mix), "--model", "m", "--catalog", str(tmp_path / "c.duckdb"),
              "--endpoint", f"http://127.0.0.1:{_closed_port()}", "--max-attempts", "1"]
    assert main([*common, "--out", str(tmp_path / "gen"), "--engine", "chat"]) == 1
    assert "not reachable" in capsys.readouterr().err and not (tmp_path / "gen").exists()

    assert main([*common, "--out", str(tmp_path / "gen2"), "--engine", "sglang", "--tokenizer",
                 str(tmp_path / "missing" / "folder")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: --tokenizer {tmp_path / 'missing' / 'folder'}: no such folder (give the target's model " \
                  "folder, or its Hub id)"
    assert not (tmp_path / "gen2").exists()


def test_catalog_commands_without_a_catalog_say_so_and_create_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CURATOR_CATALOG", raising=False)
    for argv in (["catalog", "list"], ["catalog", "show", "1"], ["catalog", "approve", "1"], ["catalog", "reject", "1"]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: no catalog at catalog.duckdb yet") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_missing_model_folder_is_named_as_such_and_draws_no_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "shard-00000.jsonl").write_text('{"id": "a", "messages": []}\n')
    missing = tmp_path / "no-such-model"
    assert main(["hidden-states", "--model", str(missing), "--data", str(gen), "--out", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert f"--model {missing}: no such folder" in err and "--target-dir" not in err and "0/?" not in err

    assert main(["train", f"data={tmp_path / 'no-states'}", f"target={missing}", f"out={tmp_path / 'run'}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "0/?" not in err and "ETA" not in err
