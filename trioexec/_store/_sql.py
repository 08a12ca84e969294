"""What the two SQL stores (SQLite and PostgreSQL) share, written once with the
placeholder (``?`` or ``%s``) as a parameter: the query of execution records,
the filters of `Store.executions`, and one key of a `Store.key_round` (and the
pruning of full buckets that ends a round)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .._errors import StoreError
from .._records import ExecutionRecord, SubStatus, TaskStatus
from ._base import Filter
from ._key_ledger import PRUNE_MORE, Hold, KeyGrant, KeyRequest, full_at, settle

#: The SQL stores' query of executions with their owner's lease (``e``, ``o``).
RECORD_FIELDS = tuple(f.name for f in attrs.fields(ExecutionRecord))
#: Their columns (``e``: executions, ``o``: owners), in `RECORD_FIELDS`' order.
RECORD_COLUMNS = ", ".join(f"o.{f}" if f == "lease_expires_at" else f"e.{f}" for f in RECORD_FIELDS)
SELECT_RECORDS = (
    f"SELECT {RECORD_COLUMNS} FROM executions e LEFT JOIN owners o ON o.owner = e.owner"
)


def record_of(row: Sequence[object], where: str) -> ExecutionRecord:
    """A row of `SELECT_RECORDS` as a record; `StoreError` naming ``where`` (the
    store) and the task for a row this trioexec cannot read."""
    values: dict[str, Any] = dict(zip(RECORD_FIELDS, row, strict=True))
    try:
        status = TaskStatus(values["status"])
        sub = None if values["sub_status"] is None else SubStatus(values["sub_status"])
    except ValueError:
        raise StoreError(
            f"{where}: execution {values['task_id']!r} has an unreadable row"
            f" (status {values['status']!r}, sub-status {values['sub_status']!r})"
        ) from None
    values.update(status=status, sub_status=sub)
    return ExecutionRecord(**values)


def filter_clause(mark: str, found: Filter) -> tuple[str, list[object]]:
    """The SQL stores' ``WHERE`` for checked filters (on ``e``), with ``mark`` as
    the parameter placeholder (``?`` or ``%s``), and its parameters."""
    where: list[str] = []
    params: list[object] = []
    for column in ("status", "sub_status", "run_id", "key"):
        value = getattr(found, column)
        if value is not None:
            where.append(f"e.{column} = {mark}")
            params.append(getattr(value, "value", value))
    if found.deferred_before is not None:
        where.append(f"e.sub_status = 'deferred' AND e.deferred_since <= {mark}")
        params.append(found.deferred_before)
    return (" WHERE " + " AND ".join(where) if where else ""), params


def settle_key(conn: Any, mark: str, owner: str, request: KeyRequest, now: float) -> KeyGrant:
    """One key of a SQL store's `Store.key_round` (``mark``: the placeholder, ``?``
    or ``%s``): reclaim dead owners' slots, `settle`, write the owner's row and the
    key's bucket back. ``conn`` is in the round's transaction."""
    key = request.key
    conn.execute(
        f"DELETE FROM key_holds WHERE key = {mark} AND owner <> {mark} AND owner NOT IN"
        f" (SELECT owner FROM owners WHERE lease_expires_at >= {mark})",
        (key, owner, now),
    )
    rows = [
        Hold(row[0], held=row[1], wanted=row[2], since=row[3])
        for row in conn.execute(
            f"SELECT owner, held, wanted, since FROM key_holds WHERE key = {mark}", (key,)
        )
    ]
    others = [h for h in rows if h.owner != owner]
    mine = next((h for h in rows if h.owner == owner), None)
    found = conn.execute(
        f"SELECT tokens, stamp FROM key_buckets WHERE key = {mark}", (key,)
    ).fetchone()
    bucket_row = None if found is None else tuple(found)
    grant, row, bucket = settle(request, others, bucket_row, now, mine)
    if row is None:
        conn.execute(f"DELETE FROM key_holds WHERE key = {mark} AND owner = {mark}", (key, owner))
    else:
        conn.execute(
            f"INSERT INTO key_holds (key, owner, held, wanted, since) VALUES ({mark}, {mark},"
            f" {mark}, {mark}, {mark}) ON CONFLICT (key, owner) DO UPDATE SET"
            " held = excluded.held, wanted = excluded.wanted, since = excluded.since",
            (key, owner, row.held, row.wanted, row.since),
        )
    if bucket is None:
        conn.execute(f"DELETE FROM key_buckets WHERE key = {mark}", (key,))
    else:
        conn.execute(
            f"INSERT INTO key_buckets (key, tokens, stamp, full_at) VALUES ({mark}, {mark},"
            f" {mark}, {mark}) ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens,"
            " stamp = excluded.stamp, full_at = excluded.full_at",
            (key, *bucket, full_at(request, bucket)),
        )
    return grant


def prune_buckets(conn: Any, mark: str, now: float, settled: int, lock: str = "") -> None:
    """End a round that settled ``settled`` keys: delete the key buckets full
    by ``now``, earliest first, at most ``settled + PRUNE_MORE`` (a full
    bucket is the same as none, and a key used once is never settled again to
    delete its own). ``lock``: PostgreSQL's ``FOR UPDATE SKIP LOCKED`` (a row
    another round is writing is left for a later one: this round never waits
    for it, holding keys that round may wait for)."""
    limit = settled + PRUNE_MORE
    conn.execute(
        "DELETE FROM key_buckets WHERE key IN (SELECT key FROM key_buckets"
        f" WHERE full_at <= {mark} ORDER BY full_at, key LIMIT {mark}{lock})"
        f" AND full_at <= {mark}",
        (now, limit, now),
    )


def write_lease(conn: Any, mark: str, owner: str, lease_expires_at: float) -> None:
    """Create or renew ``owner``'s lease (``mark``: the placeholder)."""
    conn.execute(
        f"INSERT INTO owners (owner, lease_expires_at) VALUES ({mark}, {mark})"
        " ON CONFLICT (owner) DO UPDATE SET lease_expires_at = excluded.lease_expires_at",
        (owner, lease_expires_at),
    )
