"""What the durable tables hold: their row shape (the states stored in them are
values, `trioexec._durable_records`), and the table layer the durable protocol
runs on.

They live with the store, below `trioexec.durable`, so the tables import nothing
from the protocol built on them; `trioexec.durable` re-exports the state enums.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from .._durable_records import PromiseState as PromiseState
from .._durable_records import TaskState as TaskState
from .._errors import StoreError

#: A promise or task row: a plain dict of column name to value, ``tags`` decoded.
Row = dict[str, Any]


class TransactionAborted(StoreError):
    """The database rolled a transaction back because it met a concurrent one (a
    deadlock, a row inserted meanwhile), or ended its connection before it could
    commit (a restart): nothing was written, and running it again may succeed."""


class Tables(Protocol):
    """Row access for the protocol. Rows are plain dicts; ``put_*`` writes back.

    ``promise(id)``/``task(id)`` read a row to change it: a backend several
    processes share locks it (a concurrent transaction waits for it, then sees
    what this one wrote). With ``shared``, the row is only looked at: it stays as
    read until the transaction ends, but other transactions looking at it do not
    wait (two that look at rows in different orders cannot deadlock).

    ``update_task/update_promise(id, expect, changes)`` change a row only if it
    exists and its columns hold the (non-None) values of ``expect``; they answer
    whether it did (the promise: the row as changed, or None). ``transaction()``
    opened inside an open one is part of it; ``attempt(call)`` runs ``call()``
    inside the open transaction as a unit that is undone if it raises (returning
    ``(False, exc)``; ``(True, value)`` otherwise).

    ``claim(target, limit, pid, ttl, now)`` acquires up to ``limit`` pending tasks
    of ``target``, oldest id first (each: version + 1, leased to ``pid`` until
    ``now + ttl``, no retry timeout), and returns each row with its promise's data;
    a backend shared by several processes skips the rows a concurrent transaction
    holds, so concurrent claims get different tasks."""

    def transaction(self) -> AbstractContextManager[None]: ...
    def attempt(self, call: Callable[[], Any]) -> tuple[bool, Any]: ...
    def promise(self, id: str, *, shared: bool = False) -> Row | None: ...
    def put_promise(self, row: Row) -> None: ...
    def task(self, id: str, *, shared: bool = False) -> Row | None: ...
    def put_task(self, row: Row) -> None: ...
    def update_task(self, id: str, expect: Row, changes: Row) -> bool: ...
    def update_promise(self, id: str, expect: Row, changes: Row) -> Row | None: ...
    def claim(
        self, target: str, limit: int, pid: str, ttl: float, now: float
    ) -> list[tuple[Row, str | None]]: ...
    def add_callback(self, promise_id: str, task_id: str) -> None: ...
    def tasks_awaiting(self, promise_id: str) -> list[str]: ...
    def awaited_by(self, task_id: str) -> list[str]: ...
    def drop_callbacks(self, task_id: str) -> None: ...
    def timed_out_promises(self, now: float) -> list[Row]: ...
    def expired_leases(self, now: float) -> list[Row]: ...
    def due_pending_tasks(self, now: float) -> list[Row]: ...
    def search_promises(
        self, state: str | None, tag: tuple[str, str] | None, limit: int, cursor: str | None
    ) -> list[Row]: ...
    def search_tasks(
        self, state: str | None, target: str | None, limit: int, cursor: str | None
    ) -> list[Row]: ...
    def all_promises(self) -> Iterator[Row]: ...
    def all_tasks(self) -> Iterator[Row]: ...
    def all_callbacks(self) -> Iterator[tuple[str, str]]: ...


@runtime_checkable
class BulkTables(Protocol):
    """What a backend offers beyond `Tables` to write a run of like operations in one
    statement (each all or nothing: it writes every one, or none and says so).

    ``fulfil_many([(id, version, state, data), ...], now)``: each task acquired at
    that version becomes fulfilled and its pending promise settles as ``state``
    with ``data`` at ``now``; returns each promise's row as settled (in order) with
    whether tasks await it, or None if any would fail (nothing written).
    ``create_many(promises, tasks)``: inserts the new rows; False if any promise
    exists already (nothing written)."""

    def fulfil_many(
        self, items: list[tuple[str, int, str, str | None]], now: float
    ) -> list[tuple[Row, bool]] | None: ...
    def create_many(self, promises: list[Row], tasks: list[Row]) -> bool: ...


# ---------------------------------------------------------------------- read-only views

#: What the protocol calls while it applies time at the start of an operation
#: (`Core._begin`): timed-out promises settle (resuming their waiters), expired leases
#: and due pending tasks are re-armed. `due_pending_tasks` is its last query; only
#: `put_task` follows.
TICK_CALLS = frozenset(
    {
        "timed_out_promises",
        "expired_leases",
        "due_pending_tasks",
        "put_promise",
        "put_task",
        "task",
        "tasks_awaiting",
        "drop_callbacks",
    }
)


class Overlay:
    """A read-only transaction's view of what applying time would have written: kept
    here, read back by the rest of the operation, never written to the database."""

    def __init__(self) -> None:
        self.promises: dict[str, Row] = {}
        self.tasks: dict[str, Row] = {}
        self.dropped: set[str] = set()  # task ids whose callbacks were dropped
        self.ticking = True  # still applying time: writes go here
        self.after_due = False


def note(overlay: Overlay | None, call: str) -> Overlay | None:
    """``overlay`` (None on a writable store), its time phase ended at the first
    call that is not part of applying time."""
    if overlay is not None and overlay.ticking:
        if call not in TICK_CALLS or (overlay.after_due and call != "put_task"):
            overlay.ticking = False
        elif call == "due_pending_tasks":
            overlay.after_due = True
    return overlay


def keep(overlay: Overlay | None, read_only: bool, path: str, call: str) -> Overlay | None:
    """Where write ``call`` goes on a read-only store (its overlay, while time is
    being applied), or None: write it.

    Raises:
      StoreError: ``"<path>: opened read-only"`` for any other write on a read-only
        store.
    """
    overlay = note(overlay, call)
    if read_only and (overlay is None or not overlay.ticking):
        raise StoreError(f"{path}: opened read-only")
    return overlay


def copy_promise(row: Row) -> Row:
    return dict(row, tags=dict(row["tags"]))


def due_at(row: Row, state: str, when: str, now: float) -> bool:
    return bool(row["state"] == state and row[when] is not None and row[when] <= now)


def merge_rows(rows: list[Row], overlay: dict[str, Row], keep: Callable[[Row], bool]) -> list[Row]:
    """``rows`` (read from the database) with the overlay's versions in their place:
    those the overlay holds are replaced by its copy if it still ``keep``s, and the
    overlay's other kept rows join in; by id."""
    if not overlay:
        return rows
    merged = {r["id"]: r for r in rows if r["id"] not in overlay}
    merged.update({id: dict(r) for id, r in overlay.items() if keep(r)})
    return [merged[id] for id in sorted(merged)]
