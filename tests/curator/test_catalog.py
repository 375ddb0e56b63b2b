"""The catalog: schema and migrations, review round trips, SQL from the CLI, and sharing the
file between processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curator.catalog import MIGRATIONS, SCHEMA_VERSION, Catalog
from curator.cli import main
from curator.errors import CatalogError, CatalogLockedError


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return Catalog.open(tmp_path / "catalog.duckdb")


def _tables(path: Path) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        con.close()


def test_first_use_creates_every_table(tmp_path: Path) -> None:
    path = tmp_path / "new.duckdb"
    cat = Catalog.open(path)
    assert cat.schema_version() == SCHEMA_VERSION
    assert {"datasets", "candidates", "scout_runs", "tool_calls", "scout_agents", "mixes",
            "generation_runs", "training_runs", "candidate_summary"} <= _tables(path)


def test_old_file_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    # A version-1 file as an earlier curator wrote it: no schema_version table, no review columns.
    con = duckdb.connect(str(path))
    con.execute(MIGRATIONS[0])
    con.execute(
        "INSERT INTO candidates (run_id, agent, dataset_id, category, relevance, rationale, suggested_samples, status) "
        "VALUES ('r1', 'coding', 'ise-uiuc/Magicoder-Evol-Instruct-110K', 'code', 0.8, 'evol code', 20000, 'proposed')"
    )
    con.close()

    cat = Catalog.open(path)
    assert cat.schema_version() == SCHEMA_VERSION
    [row] = cat.candidates()
    assert row["dataset_id"] == "ise-uiuc/Magicoder-Evol-Instruct-110K"
    assert cat.approve(row["id"], samples=5000)["approved_samples"] == 5000
    # Opening again changes nothing (idempotent).
    assert Catalog.open(path).migrate() == SCHEMA_VERSION
    assert len(Catalog.open(path).candidates()) == 1


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.duckdb"
    Catalog.open(path).query("UPDATE schema_version SET version = 99")
    with pytest.raises(CatalogError, match="newer"):
        Catalog.open(path)


def test_approve_reject_round_trip(catalog: Catalog) -> None:
    catalog.upsert_dataset({"dataset_id": "nebius/SWE-agent-trajectories", "license": "cc-by-4.0", "num_rows": 80036})
    first = catalog.add_candidate("run", "agentic", "nebius/SWE-agent-trajectories", "agentic", 0.95, "real SWE runs", 10000)
    second = catalog.add_candidate("run", "eagle", "nebius/SWE-agent-trajectories", "agentic", 0.7, "long tool use", 4000)
    third = catalog.add_candidate("run", "chat", "HuggingFaceH4/ultrachat_200k", "chat", 0.6, "chat", 25000)

    assert main(["catalog", "approve", str(first), "--samples", "12000", "--catalog", str(catalog.path)]) == 0
    assert main(["catalog", "approve", str(second), "--catalog", str(catalog.path)]) == 0
    assert main(["catalog", "reject", str(third), "--note", "no license check", "--catalog", str(catalog.path)]) == 0

    assert catalog.candidate(third)["status"] == "rejected"
    assert catalog.candidate(third)["note"] == "no license check"
    approved = catalog.approved_candidates()
    assert [a["dataset_id"] for a in approved] == ["nebius/SWE-agent-trajectories"]
    assert approved[0]["samples"] == 12000 and approved[0]["license"] == "cc-by-4.0"

    # Re-opening the review: reject what was approved.
    catalog.reject(first)
    catalog.reject(second)
    assert catalog.approved_candidates() == []


def test_unknown_candidate_is_a_one_line_error(catalog: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "approve", "424242", "--catalog", str(catalog.path)]) == 1
    err = capsys.readouterr().err
    assert "no candidate with id 424242" in err and len(err.strip().splitlines()) == 1


def test_sql_bad_statement_names_the_error(catalog: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "SELEC * FROM candidates", "--catalog", str(catalog.path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "syntax error" in err.lower() and len(err.splitlines()) == 1
    assert main(["sql", "SELECT * FROM no_such_table", "--catalog", str(catalog.path)]) == 1
    assert "no_such_table" in capsys.readouterr().err


def test_sql_update_then_csv_and_json(catalog: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    cid = catalog.add_candidate("run", "reasoning", "open-r1/Mixture-of-Thoughts", "reasoning", 0.9, "traces", 25000)
    path = str(catalog.path)
    assert main(["sql", "UPDATE candidates SET status='approved' WHERE relevance > 0.8", "--catalog", path]) == 0
    capsys.readouterr()
    assert main(["sql", "SELECT id, status FROM candidates", "--format", "csv", "--catalog", path]) == 0
    assert capsys.readouterr().out.splitlines() == ["id,status", f"{cid},approved"]
    assert main(["sql", "SELECT dataset_id, created_at FROM candidates", "--format", "json", "--catalog", path]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["dataset_id"] == "open-r1/Mixture-of-Thoughts" and isinstance(row["created_at"], str)


def test_sql_queries_parquet_files(tmp_path: Path, catalog: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(pa.table({"id": ["a", "b", "c"], "category": ["code", "code", "chat"]}), tmp_path / "part-0.parquet")
    sql = f"SELECT category, count(*) AS n FROM '{tmp_path}/*.parquet' GROUP BY category ORDER BY category"
    assert main(["sql", sql, "--format", "csv", "--catalog", str(catalog.path)]) == 0
    assert capsys.readouterr().out.splitlines() == ["category,n", "chat,1", "code,2"]


def test_writes_are_parameterised(catalog: Catalog) -> None:
    hostile = "x'); DROP TABLE candidates; --"
    cid = catalog.add_candidate("run", "a", hostile, "code", 0.5, hostile, 1)
    assert catalog.candidate(cid)["dataset_id"] == hostile
    catalog.upsert_dataset({"dataset_id": hostile, "card_excerpt": hostile, "features": {"q": hostile}})
    assert catalog.dataset(hostile)["card_excerpt"] == hostile


WRITER = textwrap.dedent(
    """
    import sys, time
    from curator.catalog import Catalog
    cat = Catalog.open(sys.argv[1])
    end = time.monotonic() + float(sys.argv[2])
    n = 0
    while time.monotonic() < end:
        cat.add_candidate("run", "writer", f"ds/{n}", "code", 0.5, "busy writer", 1)
        n += 1
    print(n)
    """
)


def test_readers_run_while_another_process_keeps_writing(catalog: Catalog) -> None:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(catalog.path), "3"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        seen = []
        while writer.poll() is None:
            _, rows = Catalog.open(catalog.path).query("SELECT count(*) FROM candidates")
            seen.append(rows[0][0])
        written = int(writer.communicate()[0])
    finally:
        writer.kill()
    assert len(seen) >= 3 and seen == sorted(seen)
    assert Catalog.open(catalog.path).query("SELECT count(*) FROM candidates")[1][0][0] == written


HOLDER = textwrap.dedent(
    """
    import sys, time, duckdb
    con = duckdb.connect(sys.argv[1])
    print("holding", flush=True)
    time.sleep(30)
    """
)


def test_catalog_held_open_by_another_program_says_so(catalog: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(catalog.path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(CatalogLockedError, match=f"PID {holder.pid}"):
            Catalog(catalog.path, lock_wait_s=0.3).query("SELECT 1")
    finally:
        holder.kill()
        holder.wait()
    assert Catalog.open(catalog.path).query("SELECT 1")[1] == [(1,)]


@pytest.mark.parametrize("statement", [
    "DROP TABLE candidates",
    "ALTER TABLE candidates DROP COLUMN relevance",
    "CREATE TABLE junk (x INT)",
    "ATTACH 'other.duckdb'",
    "COPY (SELECT 1) TO 'out.csv'",
    "SELECT 1; DROP TABLE candidates",
])
def test_sql_refuses_schema_changes_before_running_anything(
    catalog: Catalog, statement: str, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog.add_candidate("r", "a", "org/ds", "chat", 0.9, "why", 100)
    assert main(["sql", statement, "--catalog", str(catalog.path)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "reads and row changes" in err and "unexpected" not in err
    assert len(Catalog.open(catalog.path).candidates()) == 1  # nothing ran, the schema is whole
    assert "junk" not in _tables(catalog.path)
    assert main(["sql", "UPDATE candidates SET status = 'approved'", "--catalog", str(catalog.path)]) == 0


@pytest.mark.parametrize("statement", [
    "EXPLAIN ANALYZE DROP TABLE candidates",
    "explain analyse CREATE TABLE junk (x INT)",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO 'junk.csv'",
    "/* note */ EXPLAIN /* c */ ANALYZE -- c\n DROP TABLE candidates",
    "EXPLAIN DROP TABLE candidates",
    "EXPLAIN (FORMAT json) DROP TABLE candidates",
    "EXPLAIN ANALYZE ALTER TABLE candidates DROP COLUMN relevance",
])
def test_sql_judges_the_statement_inside_explain(
    catalog: Catalog, statement: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    catalog.add_candidate("r", "a", "org/ds", "chat", 0.9, "why", 100)
    assert main(["sql", statement, "--catalog", str(catalog.path)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "reads and row changes" in err and "unexpected" not in err
    assert len(Catalog.open(catalog.path).candidates()) == 1 and "junk" not in _tables(catalog.path)
    assert not (tmp_path / "junk.csv").exists()
    # what EXPLAIN explains decides: a read or a row change still runs
    assert main(["sql", "EXPLAIN ANALYZE SELECT count(*) FROM candidates", "--catalog", str(catalog.path)]) == 0
    assert main(["sql", "EXPLAIN UPDATE candidates SET status = 'approved'", "--catalog", str(catalog.path)]) == 0


@pytest.mark.parametrize("statement", [
    "INSERT INTO schema_version VALUES (999)",
    'insert into main."Schema_Version" values (999)',
    "UPDATE schema_version SET version = 999",
    "DELETE FROM schema_version",
    "EXPLAIN ANALYZE INSERT INTO schema_version VALUES (999)",
])
def test_sql_keeps_curators_bookkeeping_read_only(
    catalog: Catalog, statement: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = catalog.schema_version()
    assert main(["sql", statement, "--catalog", str(catalog.path)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "schema_version" in err and "bookkeeping" in err and "unexpected" not in err
    assert catalog.schema_version() == before
    assert main(["catalog", "list", "--catalog", str(catalog.path)]) == 0  # nobody is locked out
    assert main(["sql", "SELECT max(version) FROM schema_version", "--catalog", str(catalog.path)]) == 0


def test_sql_help_says_review_is_reads_and_row_changes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "reads and row changes" in out and "refused" in out
    words = " ".join(re.sub("[\u2500-\u257f]", " ", out).split())  # the help's box drawn around the text
    assert "also under EXPLAIN" in words and "schema_version are refused" in words
    assert "A SELECT reads any file you can" in words  # the user's own power, said where they read about it


def test_a_catalog_whose_tables_were_dropped_by_hand_is_restored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.duckdb"
    Catalog.open(path).add_candidate("r", "a", "org/ds", "chat", 0.9, "why", 100)
    con = duckdb.connect(str(path))
    con.execute("DROP VIEW candidate_summary; DROP TABLE candidates; DROP TABLE generation_runs")
    con.close()
    assert main(["catalog", "list", "--catalog", str(path)]) == 0
    cat = Catalog.open(path)
    assert {"candidates", "generation_runs"} <= _tables(path) and cat.candidates() == []
    with pytest.raises(CatalogError, match="(?i)constraint"):  # the status check came back with the table
        cat.query("INSERT INTO candidates (dataset_id, status) VALUES ('x', 'aproved')")


def test_a_catalog_missing_a_column_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.duckdb"
    Catalog.open(path)
    con = duckdb.connect(str(path))
    con.execute("DROP VIEW candidate_summary; ALTER TABLE candidates DROP COLUMN relevance")
    con.close()
    assert main(["catalog", "list", "--catalog", str(path)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "candidates: relevance" in err and "unexpected" not in err


# -- issue 49 item 9: no extension fetched; a batch is all or nothing; BEGIN ... COMMIT works ------


@pytest.mark.parametrize("query", ["SELECT * FROM 'https://127.0.0.1:9/x.csv'",
                                   "SELECT * FROM read_json('https://127.0.0.1:9/x.json')"])
@pytest.mark.parametrize("with_catalog", [False, True])
def test_sql_over_a_url_fetches_no_extension(
    query: str, with_catalog: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # where DuckDB would install httpfs (~/.duckdb/extensions)
    path = Catalog.open(tmp_path / "c.duckdb").path if with_catalog else tmp_path / "none.duckdb"
    assert main(["sql", query, "--catalog", str(path)]) == 1
    err = capsys.readouterr().err
    assert "requires the extension httpfs" in err and "installs and loads no DuckDB extension" in err, err
    assert not (tmp_path / ".duckdb").exists()


def test_every_catalog_connection_has_automatic_extensions_off(catalog: Catalog) -> None:
    _, rows = catalog.query("SELECT current_setting('autoinstall_known_extensions'), "
                            "current_setting('autoload_known_extensions')")
    assert rows == [(False, False)]


def _statuses(catalog: Catalog) -> list[str]:
    return [row[0] for row in catalog.query("SELECT status FROM candidates ORDER BY id")[1]]


def test_a_batch_whose_later_statement_fails_changes_nothing(catalog: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    catalog.add_candidate("run", "reasoning", "open-r1/Mixture-of-Thoughts", "reasoning", 0.9, "traces", 25000)
    batch = "UPDATE candidates SET status = 'approved'; DELETE FROM candidates; SELECT * FROM no_such_table"
    assert main(["sql", batch, "--catalog", str(catalog.path)]) == 1
    err = capsys.readouterr().err
    assert "statement 3 of 3" in err and "no_such_table" in err and "nothing was changed" in err, err
    assert _statuses(catalog) == ["proposed"]


def test_begin_commit_is_accepted_and_a_final_rollback_is_a_dry_run(
    catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog.add_candidate("run", "reasoning", "open-r1/Mixture-of-Thoughts", "reasoning", 0.9, "traces", 25000)
    path = str(catalog.path)
    dry = "BEGIN TRANSACTION; UPDATE candidates SET status = 'rejected'; SELECT status FROM candidates; ROLLBACK"
    assert main(["sql", dry, "--format", "csv", "--catalog", path]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["status", "rejected"]  # seen inside the batch
    assert _statuses(catalog) == ["proposed"]  # and undone
    assert main(["sql", "BEGIN; UPDATE candidates SET status = 'approved'; COMMIT", "--catalog", path]) == 0
    assert _statuses(catalog) == ["approved"]
    assert main(["sql", "UPDATE candidates SET status = 'rejected'; ROLLBACK; SELECT 1", "--catalog", path]) == 1
    assert "ROLLBACK may only end it" in capsys.readouterr().err
    assert _statuses(catalog) == ["approved"]  # refused before anything ran


def test_a_path_without_an_extension_gets_the_fix_not_no_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 46 item 4: `curator sql "SELECT * FROM 'mix/*'"` said there is no catalog."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mix").mkdir()
    pq.write_table(pa.table({"id": ["a", "b"]}), tmp_path / "mix" / "part-0.parquet")
    assert main(["sql", "SELECT * FROM 'mix/*'"]) == 1
    err = capsys.readouterr().err
    assert "'mix/*.parquet'" in err and "read_parquet('mix/*')" in err and "no catalog" not in err, err
    assert main(["sql", "SELECT count(*) FROM 'mix/*.parquet'", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["count_star()", "2"]
    assert not (tmp_path / "catalog.duckdb").exists()
