"""What the durable tables hold (their rows, the rule of an acquired task) and what
a backend may offer beyond the table layer the protocol runs on (`SQLTables`): here,
below `trioexec.durable`, so that the tables import nothing from the protocol.
"""

from __future__ import annotations

from collections.abc import Callable
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


@runtime_checkable
class BulkTables(Protocol):
    """What a backend offers beyond `SQLTables` to write a run of like operations in one
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
    being applied), or None: write it. Any other write on a read-only store raises
    ``StoreError("<path>: opened read-only")``."""
    overlay = note(overlay, call)
    if read_only and (overlay is None or not overlay.ticking):
        raise StoreError(f"{path}: opened read-only")
    return overlay


def acquired(task: Row, version: int, pid: str, ttl: float, now: float) -> Row:
    """``task`` acquired by ``pid`` at ``version``, leased for ``ttl`` from ``now``."""
    task.update(
        state=TaskState.ACQUIRED.value,
        version=version,
        pid=pid,
        ttl=ttl,
        lease_expires_at=now + ttl,
        timeout_at=None,
    )
    return task


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
