"""What `curator sql` runs: one or more SQL statements against the catalog, or over files.

A query that only reads files (`SELECT ... FROM 'mix/*.parquet'`) needs no catalog, so where
the catalog file does not exist yet such a query runs in an in-memory database and leaves no
`catalog.duckdb` behind; any other statement opens (and so creates) the catalog.

Review is reads and row changes: SELECT (DESCRIBE, SHOW, SUMMARIZE), EXPLAIN, UPDATE, INSERT,
DELETE, MERGE and transactions. Everything else (DROP, ALTER, CREATE, ATTACH, COPY, EXPORT, LOAD,
PRAGMA, CALL, SET, ...) is refused before any statement runs, by DuckDB's own statement type: the
other stages rely on the catalog's schema, and a file written by COPY lands wherever it says.
EXPLAIN is judged by the statement it explains (EXPLAIN ANALYZE runs it). The toolkit's own
bookkeeping tables (the schema version) are read-only: a row change that names one is refused,
since a planted version locks every command out of the catalog.

A batch runs as one transaction, all or nothing: a statement that fails rolls back every change the
batch made before it. `BEGIN` and `COMMIT` (`START TRANSACTION`, `END`) are accepted and change
nothing (the batch is already one transaction, committed when every statement succeeded);
`ROLLBACK` (`ABORT`) may end the batch, which then changes nothing: a dry run
(`BEGIN; UPDATE ...; SELECT ...; ROLLBACK`).

A SELECT can read any file the user can (`read_csv('/etc/passwd')`): that is the user's own power at
their own prompt, and the reason no other stage ever feeds text it did not write into this function.
It reads local files only: every connection has DuckDB's automatic extension install and load off
(`curator.catalog.connect_duckdb`), so an `https://` or `s3://` path is refused instead of fetching
httpfs from the network.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import duckdb

from curator import http
from curator.catalog import Catalog, connect_duckdb, resolve_path
from curator.errors import CatalogError, ConfigError

_READ_ONLY = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
_ROW_CHANGES = {duckdb.StatementType.UPDATE, duckdb.StatementType.INSERT, duckdb.StatementType.DELETE,
                duckdb.StatementType.MERGE_INTO, duckdb.StatementType.TRANSACTION}
ALLOWED = _READ_ONLY | _ROW_CHANGES
# Tables only curator writes (the schema version; migration 3's scratch table).
BOOKKEEPING = ("schema_version", "candidates_checked")
_BOOKKEEPING_RE = re.compile("|".join(BOOKKEEPING), re.IGNORECASE)
_SKIP = r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*"  # blanks and comments between keywords
_EXPLAIN_RE = re.compile(rf"{_SKIP}EXPLAIN\b{_SKIP}(?:ANALY[SZ]E\b)?{_SKIP}(?:\([^()]*\))?", re.IGNORECASE | re.DOTALL)
_FIRST_WORD_RE = re.compile(rf"{_SKIP}([A-Za-z]+)", re.DOTALL)
_ROLLBACK_WORDS = ("ROLLBACK", "ABORT")
# DuckDB's words for a quoted name it took for a table: a path without an extension it knows
_NO_TABLE_RE = re.compile(r"Table with name (.+?) does not exist")
_PATH_CHARS = frozenset("/\\*?.")


@dataclass
class StatementResult:
    """One statement's outcome: its text, and its columns and rows ([] for statements that return none)."""

    statement: str
    columns: list[str]
    rows: list[tuple[Any, ...]]


def split_statements(text: str) -> list[Any]:
    """Return the parsed statements of `text`; ConfigError when there are none, CatalogError when it does not parse."""
    if not text.strip():
        raise ConfigError('no SQL given: curator sql "SELECT ..." (several statements separated by ";")')
    try:
        statements = connect_duckdb().extract_statements(text)
    except duckdb.Error as exc:
        raise CatalogError(str(exc).strip().splitlines()[0]) from exc
    if not statements:
        raise ConfigError(f"no SQL statement in {text!r}")
    return statements


def effective_type(statement: Any, depth: int = 0) -> Any:
    """Return the statement's DuckDB type; for EXPLAIN, the type of the statement it explains.

    An EXPLAIN whose inner statement cannot be told (it does not parse alone) counts as refused.
    """
    if statement.type != duckdb.StatementType.EXPLAIN:
        return statement.type
    head = _EXPLAIN_RE.match(statement.query)
    inner = statement.query[head.end():] if head is not None and depth < 8 else ""
    try:
        parsed = connect_duckdb().extract_statements(inner) if inner.strip() else []
    except duckdb.Error:
        parsed = []
    if len(parsed) != 1:
        return duckdb.StatementType.INVALID
    return effective_type(parsed[0], depth + 1)


def refuse_schema_changes(statements: list[Any]) -> None:
    """Raise ConfigError, before anything runs, when a statement is not a read or a row change, or is a
    row change that names one of curator's bookkeeping tables."""
    for statement in statements:
        kind = effective_type(statement)
        shown = repr(" ".join(statement.query.split())[:80])
        if kind not in ALLOWED:
            name = kind.name.replace("_", " ")
            raise ConfigError(
                f"`curator sql` runs reads and row changes (SELECT, UPDATE, INSERT, DELETE), not {name}: "
                f"{shown}; the catalog's schema belongs to curator "
                "(use the duckdb CLI on a copy of the file for anything else)"
            )
        named = _BOOKKEEPING_RE.search(statement.query)
        if kind in _ROW_CHANGES - {duckdb.StatementType.TRANSACTION} and named is not None:
            raise ConfigError(
                f"`curator sql` does not change {named.group(0).lower()}, curator's own bookkeeping (read it "
                f"with SELECT): {shown}"
            )


def _transaction_word(statement: Any) -> str | None:
    """Return the first word of a transaction statement (BEGIN, COMMIT, ROLLBACK, ...), upper case;
    None for any other statement."""
    if statement.type != duckdb.StatementType.TRANSACTION:
        return None
    word = _FIRST_WORD_RE.match(statement.query)
    return word.group(1).upper() if word else ""


def _is_dry_run(statements: list[Any]) -> bool:
    """Return whether the batch ends in ROLLBACK; ConfigError for a ROLLBACK anywhere else (a batch is
    one transaction: what came after a rollback in the middle would have no transaction to belong to)."""
    words = [_transaction_word(s) for s in statements]
    for i, word in enumerate(words):
        if word in _ROLLBACK_WORDS and i != len(words) - 1:
            raise ConfigError(
                f"`curator sql` runs a batch as one transaction, all or nothing: {word} may only end it "
                "(a dry run: \"BEGIN; UPDATE ...; SELECT ...; ROLLBACK\"); run the statements after it "
                "as a batch of their own"
            )
    return bool(words) and words[-1] in _ROLLBACK_WORDS


def run_sql(text: str, catalog: str | os.PathLike[str] | None = None) -> list[StatementResult]:
    """Return the result of every statement in `text`, in order (the catalog's, or in memory; see the
    module), all of them in one transaction: a failure changes nothing, a final ROLLBACK neither."""
    statements = split_statements(text)
    refuse_schema_changes(statements)
    dry_run = _is_dry_run(statements)
    work = [s for s in statements if _transaction_word(s) is None]  # the batch is the transaction
    path = resolve_path(catalog)
    if not path.exists() and all(effective_type(s) in _READ_ONLY for s in work):
        con = connect_duckdb()
        try:
            return _execute(con, work, path, have_catalog=False)
        finally:
            con.close()
    cat = Catalog.open(path)
    with cat.connect() as con:  # BEGIN ... COMMIT, or ROLLBACK when a statement raises
        results = _execute(con, work, path, have_catalog=True)
        if dry_run:
            con.execute("ROLLBACK")
            con.execute("BEGIN TRANSACTION")  # connect() commits this empty one
    return results


def _execute(con: duckdb.DuckDBPyConnection, statements: list[Any], catalog: os.PathLike[str],
             have_catalog: bool) -> list[StatementResult]:
    results = []
    changes = any(effective_type(s) in _ROW_CHANGES for s in statements)
    for number, statement in enumerate(statements, 1):
        try:
            cursor = con.execute(statement.query)
            columns = [d[0] for d in cursor.description] if cursor.description else []
            rows = cursor.fetchall() if columns else []
        except duckdb.Error as exc:
            where = f"statement {number} of {len(statements)}: " if len(statements) > 1 else ""
            undone = "; the batch is one transaction: nothing was changed" if changes and have_catalog else ""
            raise CatalogError(f"{where}{_explain(exc, catalog, have_catalog)}{undone}") from exc
        results.append(StatementResult(statement.query.strip(), columns, rows))
    return results


def _explain(exc: duckdb.Error, catalog: os.PathLike[str], have_catalog: bool) -> str:
    """Return DuckDB's one-line message (credentials out of any URL it quotes) with the fix it lacks."""
    line = http.redact(str(exc).strip().splitlines()[0])
    missing = _NO_TABLE_RE.search(line)
    if missing is not None and _PATH_CHARS & set(missing.group(1)):
        # 'mix/*' is a table name to DuckDB: only a path ending in an extension it knows is read as a file
        name = missing.group(1).strip("'\"")
        stem = name.rstrip("/")
        example = f"{stem}.parquet" if stem.endswith("*") else f"{stem}/*.parquet"
        return (f"{line} ('{name}' was taken for a table name: DuckDB reads a quoted path as files only with "
                f"their extension, e.g. '{example}', or through a reader: read_parquet('{name}'))")
    if isinstance(exc, duckdb.CatalogException) and not have_catalog:
        return f"{line} (there is no catalog at {catalog} yet: run `curator scout` or pass --catalog)"
    if "requires the extension" in line:
        return (f"{line} (`curator sql` reads local files only: it installs and loads no DuckDB extension; "
                "download the file first)")
    return line
