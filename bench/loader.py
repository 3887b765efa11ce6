"""A fast bulk loader: PostgreSQL COPY, with the table's secondary indexes
dropped while it runs and built once at the end (the way a restore does it).

These rows are written directly, not through the transitions: the queue and
export benchmarks measure reads of a large ledger, and how it came to be
large does not matter to them. Where a benchmark then moves rows through the
ledger (the reconciler), the tenant's chain head already exists.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

ATTEMPT_COLUMNS = (
    "id",
    "tenant_id",
    "task_id",
    "tool_name",
    "idempotency_key",
    "provider_key",
    "args",
    "args_hash",
    "state",
    "policy_version",
    "credential_scope",
    "fence",
    "dispatch_fence",
    "dispatch_count",
    "provider_request_id",
    "result_ref",
    "check_count",
    "last_error",
    "last_lookup",
    "last_note",
    "owner_id",
    "next_check_at",
    "first_dispatched_at",
    "created_at",
    "updated_at",
)
EVENT_COLUMNS = (
    "tenant_id",
    "seq",
    "attempt_id",
    "kind",
    "actor_kind",
    "actor_user_id",
    "actor_label",
    "from_state",
    "to_state",
    "fence",
    "reason",
    "details",
    "created_at",
    "content_hash",
    "prev_hash",
    "hash",
)


def _escape(value: Any) -> str:
    """One value in COPY's text format."""
    if value is None:
        return "\\N"
    text = str(value)
    if any(c in text for c in "\\\t\n\r"):
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def copy_rows(conn: psycopg.Connection[Any], table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """COPY ``rows`` into ``table``; returns how many."""
    count = 0
    chunk: list[str] = []
    with conn.cursor() as cursor, cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            chunk.append("\t".join(_escape(v) for v in row))
            count += 1
            if len(chunk) >= 5000:
                copy.write("\n".join(chunk) + "\n")
                chunk.clear()
        if chunk:
            copy.write("\n".join(chunk) + "\n")
    return count


def secondary_indexes(conn: psycopg.Connection[Any], table: str) -> list[tuple[str, str]]:
    """(name, definition) of the indexes of ``table`` that back no constraint."""
    return [
        (str(name), str(definition))
        for name, definition in conn.execute(
            """
            SELECT i.indexname, i.indexdef FROM pg_indexes i
            WHERE i.tablename = %s AND NOT EXISTS (
                SELECT FROM pg_constraint c WHERE c.conname = i.indexname
            )
            """,
            [table],
        ).fetchall()
    ]


def bulk_load(
    conn: psycopg.Connection[Any], table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> dict[str, float]:
    """Drop ``table``'s secondary indexes, COPY the rows, rebuild the indexes,
    VACUUM ANALYZE (so the planner and index-only scans see the table as
    autovacuum would leave it). ``conn`` must be in autocommit mode."""
    began = time.monotonic()
    indexes = secondary_indexes(conn, table)
    for name, _ in indexes:
        conn.execute(f'DROP INDEX "{name}"')
    with conn.transaction():
        count = copy_rows(conn, table, columns, rows)
    copied = time.monotonic()
    conn.execute("SET maintenance_work_mem = '512MB'")
    for _, definition in indexes:
        # A partitioned table's index reads "ON ONLY" in pg_indexes (as pg_dump
        # writes it, before it attaches each partition's): made that way it
        # would stay invalid, on no partition. Made on the table, it is built
        # on every partition.
        conn.execute(definition.replace(" ON ONLY ", " ON ", 1))
    indexed = time.monotonic()
    conn.execute(f"VACUUM ANALYZE {table}")
    done = time.monotonic()
    return {
        "rows": count,
        "copy_s": round(copied - began, 1),
        "index_s": round(indexed - copied, 1),
        "vacuum_s": round(done - indexed, 1),
        "rows_per_s": round(count / max(copied - began, 1e-9)),
    }


def reserve_ids(conn: psycopg.Connection[Any], table: str, count: int) -> int:
    """Reserve ``count`` ids of ``table``'s identity sequence; returns the first."""
    row = conn.execute(
        "SELECT setval(pg_get_serial_sequence(%s, 'id'), nextval(pg_get_serial_sequence(%s, 'id')) + %s)",
        [table, table, count],
    ).fetchone()
    assert row is not None
    return int(row[0]) - count
