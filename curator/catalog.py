"""The catalog: one DuckDB file that records what the agents found, what a person approved,
and every mix, generation and training run made from it.

Human review is plain SQL (`curator sql`, or the duckdb CLI), so the schema is the interface.
DuckDB lets only one process hold a file open for writing and refuses everyone else, even
readers. A scout run lasts many minutes while a person wants to query the catalog, so this
module never keeps the file open: every call opens a connection, does its work in one
transaction and closes it, and waits for a short-lived holder to let go. Waiters queue in a
kernel "turnstile" (a flock on `<catalog>.turnstile`), so a writer that lets go and wants the
file back waits behind them instead of taking it again at once, and the wait is bounded per
holder: only a process that keeps the file open for more than LOCK_WAIT_S in one go (say an open
duckdb shell) makes a call fail, with a message that names it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb

from curator.errors import CatalogError, CatalogLockedError
from training.io.diskspace import DiskFullError, disk_full_error, is_disk_full

ENV_VAR = "CURATOR_CATALOG"
DEFAULT_PATH = "catalog.duckdb"
LOCK_WAIT_S = 10.0  # how long one process may keep the file before a waiter gives up
LOCK_POLL_MAX_S = 0.05  # the waiter at the front tries again at least this often

# Every connection this toolkit opens: no extension is installed or loaded behind the user's back.
# DuckDB's defaults would fetch httpfs from extensions.duckdb.org (a network call and a folder
# under ~/.duckdb) the moment a query names an https:// URL or an s3:// path. Set by SET, not by
# connect(config=...): a file open twice in one process must be opened with one configuration,
# and the setting is the database's, so it holds for every connection to it.
_NO_EXTENSIONS = "SET autoinstall_known_extensions = false; SET autoload_known_extensions = false"


def connect_duckdb(database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """Return a DuckDB connection that installs and loads no extension by itself."""
    con = duckdb.connect(database)
    try:
        con.execute(_NO_EXTENSIONS)
    except BaseException:
        con.close()
        raise
    return con


STATUSES = ("proposed", "approved", "rejected")

# Each migration brings the schema from version i to i+1; all are idempotent so that a crash
# between a migration and its version bump is harmless on the next open.
MIGRATIONS: list[str] = [
    # 1: what scouting records.
    """
    CREATE TABLE IF NOT EXISTS datasets (
        dataset_id VARCHAR PRIMARY KEY,
        author VARCHAR,
        sha VARCHAR,
        last_modified TIMESTAMP,
        downloads BIGINT,
        likes BIGINT,
        tags VARCHAR[],
        license VARCHAR,
        gated VARCHAR,
        size_category VARCHAR,
        num_rows BIGINT,
        features JSON,
        card_excerpt VARCHAR,
        fetched_at TIMESTAMP
    );
    CREATE SEQUENCE IF NOT EXISTS candidate_id_seq START 1;
    CREATE TABLE IF NOT EXISTS candidates (
        id BIGINT PRIMARY KEY DEFAULT nextval('candidate_id_seq'),
        run_id VARCHAR,
        agent VARCHAR,
        dataset_id VARCHAR NOT NULL,
        category VARCHAR,
        relevance DOUBLE,
        rationale VARCHAR,
        suggested_samples BIGINT,
        status VARCHAR DEFAULT 'proposed',
        created_at TIMESTAMP
    );
    CREATE TABLE IF NOT EXISTS scout_runs (
        run_id VARCHAR PRIMARY KEY,
        goal VARCHAR,
        planner VARCHAR,
        model VARCHAR,
        agents INTEGER,
        status VARCHAR,
        input_tokens BIGINT,
        output_tokens BIGINT,
        errors INTEGER,
        started_at TIMESTAMP,
        finished_at TIMESTAMP,
        wall_s DOUBLE
    );
    CREATE SEQUENCE IF NOT EXISTS tool_call_id_seq START 1;
    CREATE TABLE IF NOT EXISTS tool_calls (
        id BIGINT PRIMARY KEY DEFAULT nextval('tool_call_id_seq'),
        run_id VARCHAR,
        agent VARCHAR,
        turn INTEGER,
        tool VARCHAR,
        arguments JSON,
        ok BOOLEAN,
        result_summary VARCHAR,
        error VARCHAR,
        latency_ms DOUBLE,
        created_at TIMESTAMP
    );
    """,
    # 2: review, per-agent accounting, and the later stages' runs.
    """
    ALTER TABLE candidates ADD COLUMN IF NOT EXISTS approved_samples BIGINT;
    ALTER TABLE candidates ADD COLUMN IF NOT EXISTS note VARCHAR;
    ALTER TABLE candidates ADD COLUMN IF NOT EXISTS reviewed_at TIMESTAMP;
    ALTER TABLE datasets ADD COLUMN IF NOT EXISTS task_categories VARCHAR[];
    ALTER TABLE datasets ADD COLUMN IF NOT EXISTS configs JSON;
    ALTER TABLE datasets ADD COLUMN IF NOT EXISTS num_bytes BIGINT;
    CREATE TABLE IF NOT EXISTS scout_agents (
        run_id VARCHAR,
        agent VARCHAR,
        category VARCHAR,
        turns INTEGER,
        input_tokens BIGINT,
        output_tokens BIGINT,
        candidates INTEGER,
        errors INTEGER,
        state VARCHAR,
        wall_s DOUBLE,
        error VARCHAR,
        PRIMARY KEY (run_id, agent)
    );
    CREATE TABLE IF NOT EXISTS mixes (
        mix_id VARCHAR PRIMARY KEY,
        name VARCHAR,
        out_dir VARCHAR,
        rows BIGINT,
        recipe JSON,
        manifest JSON,
        created_at TIMESTAMP
    );
    CREATE TABLE IF NOT EXISTS generation_runs (
        run_id VARCHAR PRIMARY KEY,
        mix_dir VARCHAR,
        out_dir VARCHAR,
        model VARCHAR,
        endpoints VARCHAR[],
        stats JSON,
        created_at TIMESTAMP
    );
    CREATE TABLE IF NOT EXISTS training_runs (
        run_id VARCHAR PRIMARY KEY,
        out_dir VARCHAR,
        config JSON,
        metrics JSON,
        created_at TIMESTAMP
    );
    """,
    # 3: the database refuses a status outside STATUSES (a typo like 'aproved' would otherwise
    # drop the row out of every list). DuckDB cannot add a CHECK to a table, so the table is
    # rebuilt; a row that already holds an unknown status goes back to 'proposed', its old value
    # kept in the note.
    """
    CREATE TABLE candidates_checked (
        id BIGINT PRIMARY KEY DEFAULT nextval('candidate_id_seq'),
        run_id VARCHAR,
        agent VARCHAR,
        dataset_id VARCHAR NOT NULL,
        category VARCHAR,
        relevance DOUBLE,
        rationale VARCHAR,
        suggested_samples BIGINT,
        status VARCHAR NOT NULL DEFAULT 'proposed' CHECK (status IN ('proposed', 'approved', 'rejected')),
        created_at TIMESTAMP,
        approved_samples BIGINT,
        note VARCHAR,
        reviewed_at TIMESTAMP
    );
    INSERT INTO candidates_checked
    SELECT id, run_id, agent, dataset_id, category, relevance, rationale, suggested_samples,
           CASE WHEN status IN ('proposed', 'approved', 'rejected') THEN status ELSE 'proposed' END,
           created_at, approved_samples,
           CASE WHEN status IN ('proposed', 'approved', 'rejected') THEN note
                ELSE concat_ws('; ', note, 'status was ' || coalesce('''' || status || '''', 'NULL') || ' before statuses were checked') END,
           reviewed_at
    FROM candidates;
    DROP VIEW IF EXISTS candidate_summary;
    DROP TABLE candidates;
    ALTER TABLE candidates_checked RENAME TO candidates;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

_DATASET_COLUMNS = (
    "author", "sha", "last_modified", "downloads", "likes", "tags", "license", "gated",
    "size_category", "num_rows", "features", "card_excerpt", "task_categories", "configs", "num_bytes",
)
_JSON_COLUMNS = {"features", "configs"}


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def resolve_path(path: str | os.PathLike[str] | None) -> Path:
    """Return the catalog path: the argument, else $CURATOR_CATALOG, else ./catalog.duckdb."""
    return Path(path or os.environ.get(ENV_VAR) or DEFAULT_PATH)


@dataclass(frozen=True)
class AgentAccount:
    """One agent's row of `scout_agents`, in the table's column order."""

    run_id: str
    agent: str
    category: str
    turns: int
    input_tokens: int
    output_tokens: int
    candidates: int
    errors: int
    state: str
    wall_s: float
    error: str | None = None


class Catalog:
    """A catalog file. Cheap to create; every method opens and closes its own connection."""

    def __init__(self, path: Path, lock_wait_s: float = LOCK_WAIT_S) -> None:
        self.path = path
        self.lock_wait_s = lock_wait_s
        self._held: duckdb.DuckDBPyConnection | None = None

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, lock_wait_s: float = LOCK_WAIT_S) -> Catalog:
        """Return the catalog at `path` (see resolve_path), created and migrated if needed."""
        catalog = cls(resolve_path(path), lock_wait_s)
        catalog.migrate()
        return catalog

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: connections live only inside each call."""

    # -- connections -----------------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[Catalog]:
        """Hold one connection for every call made inside the block (each still its own transaction).

        Opening and closing the file costs ~0.1 s, so a writer with many small writes (the
        scout's single writer, draining its queue) holds it for one batch, then lets go so that
        readers get their turn.
        """
        if self._held is not None:
            yield self
            return
        self._held = self._open_with_wait()
        try:
            yield self
        finally:
            con, self._held = self._held, None
            con.close()

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Yield a connection inside one transaction; commit on success, roll back on error."""
        held = self._held is not None
        con = self._held if self._held is not None else self._open_with_wait()
        try:
            con.execute("BEGIN TRANSACTION")
            yield con
            con.execute("COMMIT")
        except BaseException as exc:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass  # the failed statement may already have ended the transaction
            if _disk_full(exc):
                # a full disk is not a broken catalog: nothing was written, reads still work
                raise disk_full_error(self.path) from exc
            raise
        finally:
            if not held:
                con.close()

    def _open_with_wait(self) -> duckdb.DuckDBPyConnection:
        if self.path.parent and not self.path.parent.exists():
            raise CatalogError(f"cannot create catalog {self.path}: folder {self.path.parent} does not exist")
        # One opener at a time goes through the turnstile and waits for the file there; the
        # others queue in the kernel behind it. A holder that lets go and wants the file back
        # queues too, so it cannot take the file again before the process that waited longer.
        with _Turnstile(self.path):
            deadline = time.monotonic() + self.lock_wait_s
            delay = 0.005
            holder: tuple[str, str] | None = None
            while True:
                try:
                    return connect_duckdb(str(self.path))
                except duckdb.IOException as exc:
                    message = str(exc)
                    if "lock" not in message.lower():
                        raise CatalogError(f"cannot open catalog {self.path}: {message}") from exc
                    named = re.search(r"held in (.+?) \(PID (\d+)\)", message)
                    now_holding = (named.group(1), named.group(2)) if named else holder
                    if now_holding != holder:
                        # Another process has had a turn: we wait behind busy users, not for one
                        # that never lets go, so the wait starts again.
                        holder, deadline = now_holding, time.monotonic() + self.lock_wait_s
                    if time.monotonic() >= deadline:
                        who = f"{holder[0]} (PID {holder[1]})" if holder else "another process"
                        raise CatalogLockedError(
                            f"catalog {self.path} is held open by {who} for more than "
                            f"{self.lock_wait_s:.0f} s; close that program (e.g. an open duckdb shell) "
                            f"or point --catalog / ${ENV_VAR} at another file"
                        ) from exc
                    time.sleep(delay)
                    delay = min(delay * 2, LOCK_POLL_MAX_S)
                except duckdb.Error as exc:
                    raise CatalogError(f"cannot open catalog {self.path}: {exc}") from exc

    def others_waiting(self) -> bool:
        """Return whether another open of the file is waiting for it (a holder should let go soon)."""
        return _Turnstile.occupied(self.path)

    # -- schema ----------------------------------------------------------------------------

    def schema_version(self) -> int:
        """Return the schema version recorded in the file (0 for a new or pre-versioning file)."""
        with self.connect() as con:
            return _read_version(con)

    def migrate(self) -> int:
        """Bring the file to SCHEMA_VERSION, and restore tables and columns that were dropped by
        hand; return the version it had before. A schema that cannot be restored is a CatalogError
        naming what is missing."""
        try:
            if self.path.exists():
                with self.connect() as con:
                    # Reads need no migration: a file already up to date is not written to at all,
                    # so `catalog list` and review SQL work on a full disk or a read-only copy.
                    current = _read_version(con)
                    if current == SCHEMA_VERSION and not _missing_schema(con) and _has_summary_view(con):
                        return current
            # A new file is created and given its tables under one connection: a reader that
            # sees the file between two connections would find it empty ("no table scout_runs").
            with self.connect() as con:
                con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
                before = _read_version(con)
                if before > SCHEMA_VERSION:
                    raise CatalogError(
                        f"catalog {self.path} has schema version {before}, newer than this curator "
                        f"understands ({SCHEMA_VERSION}); upgrade curator"
                    )
                for version in range(before, SCHEMA_VERSION):
                    con.execute(MIGRATIONS[version])
                if before != SCHEMA_VERSION:
                    con.execute("DELETE FROM schema_version")
                    con.execute("INSERT INTO schema_version VALUES (?)", [SCHEMA_VERSION])
                self._repair(con)
                con.execute(CANDIDATE_SUMMARY_VIEW)
        except DiskFullError:
            raise
        except duckdb.Error as exc:
            raise CatalogError(
                f"catalog {self.path}: its schema cannot be brought up to date "
                f"({str(exc).strip().splitlines()[0]}); move the file aside to start a new catalog"
            ) from exc
        return before

    def _repair(self, con: duckdb.DuckDBPyConnection) -> None:
        # A table or column dropped by hand (the duckdb CLI, an older curator without the
        # `curator sql` guard): the idempotent migrations create what is missing, empty; the
        # candidates table gets its status check back through the rebuild of migration 3.
        missing = _missing_schema(con)
        if not missing:
            return
        lost_candidates = "candidates" in missing and missing["candidates"] == _expected_schema()["candidates"]
        con.execute(MIGRATIONS[0])
        con.execute(MIGRATIONS[1])
        if lost_candidates:
            con.execute(MIGRATIONS[2])
        still = _missing_schema(con)
        if still:
            named = "; ".join(f"{t}: {', '.join(sorted(c))}" for t, c in sorted(still.items()))
            raise CatalogError(
                f"catalog {self.path} lacks columns curator needs ({named}), changed by hand; restore the "
                "file from a copy, or move it aside to start a new catalog"
            )

    # -- generic SQL -----------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one or more statements; return the last one's (columns, rows).

        Statements that return nothing (DDL) give ([], []). DuckDB errors become CatalogError
        with DuckDB's own one-line message.
        """
        try:
            with self.connect() as con:
                result = con.execute(sql, params) if params else con.execute(sql)
                if result.description is None:
                    return [], []
                columns = [d[0] for d in result.description]
                return columns, result.fetchall()
        except duckdb.Error as exc:
            first_line = str(exc).strip().splitlines()[0]
            raise CatalogError(first_line) from exc

    # -- datasets --------------------------------------------------------------------------

    def upsert_dataset(self, info: dict[str, Any]) -> None:
        """Insert or update one dataset's Hub metadata (keys: dataset_id + any of the columns)."""
        if not info.get("dataset_id"):
            raise CatalogError("upsert_dataset needs a dataset_id")
        cols = [c for c in _DATASET_COLUMNS if c in info]
        values = [json.dumps(info[c]) if c in _JSON_COLUMNS and info[c] is not None else info[c] for c in cols]
        placeholders = ", ".join("?" for _ in range(len(cols) + 2))
        updates = ", ".join(f"{c} = excluded.{c}" for c in [*cols, "fetched_at"])
        with self.connect() as con:
            con.execute(
                f"INSERT INTO datasets (dataset_id, {', '.join(cols)}{', ' if cols else ''}fetched_at) "
                f"VALUES ({placeholders}) ON CONFLICT (dataset_id) DO UPDATE SET {updates}",
                [info["dataset_id"], *values, _now()],
            )

    def dataset(self, dataset_id: str) -> dict[str, Any] | None:
        """Return one dataset's row as a dict, or None."""
        return self._one("SELECT * FROM datasets WHERE dataset_id = ?", [dataset_id])

    # -- candidates ------------------------------------------------------------------------

    def add_candidate(
        self,
        run_id: str,
        agent: str,
        dataset_id: str,
        category: str,
        relevance: float,
        rationale: str,
        suggested_samples: int,
    ) -> int:
        """Record one agent finding as a proposed candidate; return its id."""
        with self.connect() as con:
            row = con.execute(
                "INSERT INTO candidates (run_id, agent, dataset_id, category, relevance, rationale, "
                "suggested_samples, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'proposed', ?) RETURNING id",
                [run_id, agent, dataset_id, category, float(relevance), rationale, int(suggested_samples), _now()],
            ).fetchone()
        assert row is not None
        return int(row[0])

    def candidate(self, candidate_id: int) -> dict[str, Any]:
        """Return one candidate joined with its dataset's metadata; CatalogError if unknown."""
        row = self._one(
            "SELECT c.*, d.license, d.downloads, d.num_rows, d.tags, d.size_category "
            "FROM candidates c LEFT JOIN datasets d USING (dataset_id) WHERE c.id = ?",
            [candidate_id],
        )
        if row is None:
            raise CatalogError(f"no candidate with id {candidate_id} (see `curator catalog list`)")
        return row

    def candidates(self, status: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Return candidates, best first (relevance, then id), optionally of one status."""
        sql = "SELECT id, dataset_id, category, relevance, suggested_samples, approved_samples, status, agent, run_id FROM candidates"
        params: list[Any] = []
        if status:
            _check_status(status)
            sql += " WHERE status = ?"
            params.append(status)
        sql += " ORDER BY relevance DESC, id"
        if limit:
            sql += " LIMIT ?"
            params.append(int(limit))
        return self._all(sql, params)

    def approve(self, candidate_id: int, samples: int | None = None) -> dict[str, Any]:
        """Mark a candidate approved (optionally overriding its sample count); return it."""
        if samples is not None and samples < 0:
            raise CatalogError(f"--samples must be >= 0, got {samples}")
        return self._review(candidate_id, "approved", samples=samples)

    def reject(self, candidate_id: int, note: str | None = None) -> dict[str, Any]:
        """Mark a candidate rejected with an optional note; return it."""
        return self._review(candidate_id, "rejected", note=note)

    def _review(self, candidate_id: int, status: str, samples: int | None = None, note: str | None = None) -> dict[str, Any]:
        with self.session():  # check, update and re-read on one open of the file
            self.candidate(candidate_id)  # a clear error for an unknown id
            with self.connect() as con:
                con.execute(
                    "UPDATE candidates SET status = ?, approved_samples = coalesce(?, approved_samples), "
                    "note = coalesce(?, note), reviewed_at = ? WHERE id = ?",
                    [status, samples, note, _now(), candidate_id],
                )
            return self.candidate(candidate_id)

    def approved_candidates(self) -> list[dict[str, Any]]:
        """Return one entry per approved dataset: dataset_id, category, samples, license, ...

        A dataset approved in several candidate rows (found by several agents) counts once,
        with the largest approved (else suggested) sample count and its best row's category.
        """
        return self._all(
            """
            SELECT dataset_id,
                   arg_max(category, relevance) AS category,
                   max(coalesce(approved_samples, suggested_samples)) AS samples,
                   max(relevance) AS relevance,
                   string_agg(DISTINCT rationale, ' | ') AS rationale,
                   any_value(d.license) AS license,
                   any_value(d.num_rows) AS num_rows
            FROM candidates c LEFT JOIN datasets d USING (dataset_id)
            WHERE status = 'approved'
            GROUP BY dataset_id
            ORDER BY max(relevance) DESC, dataset_id
            """
        )

    # -- scout runs ------------------------------------------------------------------------

    def start_scout_run(
        self, goal: str, planner: str, model: str | None, agents: int, run_id: str | None = None
    ) -> str:
        """Record the start of a scout run (under `run_id`, else a new id); return its id."""
        run_id = run_id or new_run_id("scout")
        with self.connect() as con:
            con.execute(
                "INSERT INTO scout_runs (run_id, goal, planner, model, agents, status, input_tokens, "
                "output_tokens, errors, started_at) VALUES (?, ?, ?, ?, ?, 'running', 0, 0, 0, ?)",
                [run_id, goal, planner, model, agents, _now()],
            )
        return run_id

    def running_scout_runs(self) -> list[str]:
        """Return the ids of the scout runs whose row says `running`."""
        return [row["run_id"] for row in self._all("SELECT run_id FROM scout_runs WHERE status = 'running' ORDER BY run_id")]

    def abort_scout_runs(self, run_ids: Sequence[str]) -> None:
        """Mark these `running` scout runs `aborted` (their process is gone)."""
        if not run_ids:
            return
        with self.connect() as con:
            con.executemany(
                "UPDATE scout_runs SET status = 'aborted', finished_at = ? WHERE run_id = ? AND status = 'running'",
                [[_now(), run_id] for run_id in run_ids],
            )

    def finish_scout_run(
        self, run_id: str, status: str, input_tokens: int, output_tokens: int, errors: int, wall_s: float
    ) -> None:
        """Record how a scout run ended."""
        with self.connect() as con:
            con.execute(
                "UPDATE scout_runs SET status = ?, input_tokens = ?, output_tokens = ?, errors = ?, "
                "finished_at = ?, wall_s = ? WHERE run_id = ?",
                [status, input_tokens, output_tokens, errors, _now(), wall_s, run_id],
            )

    def record_agent(self, row: AgentAccount) -> None:
        """Insert or update one agent's accounting within a scout run."""
        with self.connect() as con:
            con.execute(
                "INSERT OR REPLACE INTO scout_agents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                list(dataclasses.astuple(row)),
            )

    def log_tool_calls(self, calls: Sequence[tuple[Any, ...]]) -> None:
        """Append many tool calls in one transaction (the scout's single writer batches them)."""
        if not calls:
            return
        now = _now()
        rows = [
            [run_id, agent, turn, tool, json.dumps(arguments, default=str), ok, result_summary, error, latency_ms, now]
            for (run_id, agent, turn, tool, arguments, ok, result_summary, error, latency_ms) in calls
        ]
        with self.connect() as con:
            con.executemany(
                "INSERT INTO tool_calls (run_id, agent, turn, tool, arguments, ok, result_summary, error, "
                "latency_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    # -- later stages ----------------------------------------------------------------------

    def record_mix(self, name: str, out_dir: str | os.PathLike[str], recipe: dict[str, Any], manifest: dict[str, Any]) -> str:
        """Record a built mix; return its id."""
        mix_id = new_run_id("mix")
        rows = manifest.get("total", {}).get("kept") if isinstance(manifest.get("total"), dict) else manifest.get("rows")
        with self._recording("mix") as con:
            con.execute(
                "INSERT INTO mixes VALUES (?, ?, ?, ?, ?, ?, ?)",
                [mix_id, name, str(out_dir), rows, json.dumps(recipe, default=str), json.dumps(manifest, default=str), _now()],
            )
        return mix_id

    def record_generation_run(
        self,
        run_id: str,
        mix_dir: str | os.PathLike[str],
        out_dir: str | os.PathLike[str],
        model: str,
        endpoints: Sequence[str],
        stats: dict[str, Any],
    ) -> None:
        """Insert or update one generation run (a resumed run updates its row); endpoints are
        recorded without user:password."""
        from curator.http import public_url, redact  # httpx: only the commands that record a run pay for it

        with self._recording("generation run") as con:
            con.execute(
                "INSERT OR REPLACE INTO generation_runs VALUES (?, ?, ?, ?, ?, ?, ?)",
                [run_id, str(mix_dir), str(out_dir), model, [public_url(e) for e in endpoints],
                 redact(json.dumps(stats, default=str)), _now()],
            )

    def record_training_run(
        self, run_id: str, out_dir: str | os.PathLike[str], config: dict[str, Any], metrics: dict[str, Any]
    ) -> None:
        """Insert or update one training run."""
        with self._recording("training run") as con:
            con.execute(
                "INSERT OR REPLACE INTO training_runs VALUES (?, ?, ?, ?, ?)",
                [run_id, str(out_dir), json.dumps(config, default=str), json.dumps(metrics, default=str), _now()],
            )

    # -- helpers ---------------------------------------------------------------------------

    @contextmanager
    def _recording(self, what: str) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for recording a stage's run: a DuckDB error becomes a CatalogError naming
        the file, so that a stage's caller catches one type (curator.stages turns it into a warning:
        the stage's output is on disk whatever the catalog says)."""
        try:
            with self.connect() as con:
                yield con
        except duckdb.Error as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CatalogError(f"cannot record the {what} in catalog {self.path}: {first_line}") from exc

    def _all(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        columns, rows = self.query(sql, params)
        return [dict(zip(columns, row)) for row in rows]

    def _one(self, sql: str, params: Sequence[Any]) -> dict[str, Any] | None:
        rows = self._all(sql, params)
        return rows[0] if rows else None


# One row per dataset across agents and runs: what a reviewer reads first.
# Re-created by every migration run; a file already at SCHEMA_VERSION keeps the view it has, so a
# change to this view needs a new migration (one that re-creates it) to reach existing catalogs.
CANDIDATE_SUMMARY_VIEW = """
CREATE OR REPLACE VIEW candidate_summary AS
SELECT c.dataset_id,
       count(*) AS findings,
       count(DISTINCT c.agent) AS agents,
       max(c.relevance) AS best_relevance,
       arg_max(c.category, c.relevance) AS category,
       max(c.suggested_samples) AS suggested_samples,
       bool_or(c.status = 'approved') AS approved,
       string_agg(c.agent || ': ' || c.rationale, ' | ' ORDER BY c.relevance DESC) AS rationales,
       any_value(d.license) AS license,
       any_value(d.downloads) AS downloads,
       any_value(d.num_rows) AS num_rows
FROM candidates c LEFT JOIN datasets d USING (dataset_id)
GROUP BY c.dataset_id
"""


class _Turnstile:
    """An exclusive flock on `<catalog>.turnstile`, held by the one opener of this catalog that is
    waiting for the file; every other opener blocks on it in the kernel, in arrival order, and
    a process that holds the file never holds the turnstile. The kernel drops a flock with its
    process, so a killed waiter leaves nothing to clean up."""

    def __init__(self, catalog: Path) -> None:
        self.path = catalog.with_name(catalog.name + ".turnstile")
        self._fd: int | None = None

    def __enter__(self) -> _Turnstile:
        try:
            self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o644)  # never through a planted link
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError:
            self.__exit__()  # e.g. a read-only folder: waiting still works, only without the queue
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None

    @staticmethod
    def occupied(catalog: Path) -> bool:
        """Return whether some opener is waiting in the turnstile right now."""
        try:
            fd = os.open(catalog.with_name(catalog.name + ".turnstile"), os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
        return False


@functools.cache
def _expected_schema() -> dict[str, frozenset[str]]:
    """Return the tables and columns the migrations make (built once, in memory; not to be changed)."""
    con = connect_duckdb()
    try:
        for migration in MIGRATIONS:
            con.execute(migration)
        return _schema(con)
    finally:
        con.close()


def _schema(con: duckdb.DuckDBPyConnection) -> dict[str, frozenset[str]]:
    rows = con.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = 'main' AND table_catalog = current_database()"
    ).fetchall()
    tables: dict[str, set[str]] = {}
    for table, column in rows:
        tables.setdefault(table, set()).add(column)
    return {t: frozenset(c) for t, c in tables.items()}


def _missing_schema(con: duckdb.DuckDBPyConnection) -> dict[str, frozenset[str]]:
    """Return {table: the expected columns it lacks} (every column for a table that is gone)."""
    have = _schema(con)
    missing = {t: cols - have.get(t, frozenset()) for t, cols in _expected_schema().items()}
    return {t: cols for t, cols in missing.items() if cols}


def _has_summary_view(con: duckdb.DuckDBPyConnection) -> bool:
    row = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'candidate_summary' AND NOT internal").fetchone()
    return bool(row and row[0])


def _disk_full(exc: BaseException) -> bool:
    """Whether a catalog write failed for want of space (DuckDB keeps the errno only in its message)."""
    if is_disk_full(exc):
        return True
    return isinstance(exc, duckdb.Error) and ("No space left on device" in str(exc) or "Disk quota exceeded" in str(exc))


def _read_version(con: duckdb.DuckDBPyConnection) -> int:
    has_table = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
    ).fetchone()
    if has_table and has_table[0]:
        row = con.execute("SELECT max(version) FROM schema_version").fetchone()
        if row and row[0] is not None:
            return int(row[0])
    # No recorded version: a file from before versioning still has the version-1 tables.
    legacy = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'candidates'").fetchone()
    return 1 if legacy and legacy[0] else 0


def _check_status(status: str) -> None:
    if status not in STATUSES:
        raise CatalogError(f"unknown status {status!r}; use one of {', '.join(STATUSES)}")


def new_run_id(kind: str) -> str:
    """Return a new, sortable run id such as scout-20260101-120000-1a2b3c."""
    return f"{kind}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
