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

A SELECT can read any file the user can (`read_csv('/etc/passwd')`): that is the user's own power at
their own prompt, and the reason no other stage ever feeds text it did not write into this function.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import duckdb

from curator.catalog import Catalog, resolve_path
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
        statements = duckdb.connect(":memory:").extract_statements(text)
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
        parsed = duckdb.connect(":memory:").extract_statements(inner) if inner.strip() else []
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


def run_sql(text: str, catalog: str | os.PathLike[str] | None = None) -> list[StatementResult]:
    """Return the result of every statement in `text`, in order (the catalog's, or in memory; see the module)."""
    statements = split_statements(text)
    refuse_schema_changes(statements)
    path = resolve_path(catalog)
    if not path.exists() and all(effective_type(s) in _READ_ONLY for s in statements):
        return _run_in_memory(statements, path)
    cat = Catalog.open(path)
    results = []
    with cat.session():
        for statement in statements:
            columns, rows = cat.query(statement.query)
            results.append(StatementResult(statement.query.strip(), columns, rows))
    return results


def _run_in_memory(statements: list[Any], catalog: os.PathLike[str]) -> list[StatementResult]:
    con = duckdb.connect(":memory:")
    results = []
    try:
        for statement in statements:
            try:
                cursor = con.execute(statement.query)
            except duckdb.CatalogException as exc:
                raise CatalogError(
                    f"{str(exc).strip().splitlines()[0]} (there is no catalog at {catalog} yet: run `curator scout` "
                    "or pass --catalog)"
                ) from exc
            except duckdb.Error as exc:
                raise CatalogError(str(exc).strip().splitlines()[0]) from exc
            columns = [d[0] for d in cursor.description] if cursor.description else []
            results.append(StatementResult(statement.query.strip(), columns, cursor.fetchall() if columns else []))
    finally:
        con.close()
    return results
