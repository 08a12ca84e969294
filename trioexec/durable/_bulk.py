"""A group commit's operations (`Core.run` hands them here): a batch's fulfils (a
worker's) and creates (a producer's) go to the backend as one statement each where
it can (`BulkTables`: PostgreSQL) and all are plainly valid; else each runs alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast, runtime_checkable

from .._store._durable_rows import BulkTables, Row
from .._store._durable_sql import SQLTables
from ._checks import check_create, check_id, check_seconds, encode, new_rows, promise_record
from ._records import PromiseRecord, PromiseState

_FULFIL_KEYWORDS = frozenset({"data", "rejected"})
_CREATE_KEYWORDS = frozenset({"idempotency_key", "data", "tags", "target"})


#: Writes a run of like operations at once (`_fulfils`, `_creates`).
_Many = Callable[["Core", BulkTables, float, Sequence[Any]], list[PromiseRecord] | None]


@runtime_checkable
class AloneTables(Protocol):
    """A backend that counts its writes, so that an operation of a group commit
    can run without a savepoint: one that fails having written nothing leaves
    nothing to undo.

    ``writes`` grows with every change of a row; ``errors`` are the storage's own
    errors (they fail the whole transaction, as in `SQLTables.attempt`)."""

    writes: int
    errors: tuple[type[Exception], ...]


class Core(Protocol):
    """What `run_calls` needs of the protocol (`trioexec.durable._protocol.Core`)."""

    tables: SQLTables
    retry_timeout: float

    @property
    def fulfill(self) -> Callable[..., Any]: ...
    @property
    def create_promise(self) -> Callable[..., Any]: ...
    def resume_waiters(self, promise_id: str, now: float) -> None: ...


def run_calls(
    core: Core, now: float, calls: Sequence[Callable[[], Any]], *, careful: bool
) -> list[tuple[bool, Any]] | None:
    """Each of ``calls`` (operations of ``core``, in the transaction open at ``now``):
    ``(True, value)`` or ``(False, exception)``, in the order of ``calls``, each
    operation's own answer.

    Every fulfil of the batch runs at the place of its first, as one run, and so
    does every create (written all or nothing where the backend can); the other
    operations run alone, in order. (They were called concurrently: none of their
    callers has had an answer yet, so any order is one they could have seen.)

    An operation that fails is undone alone: ``careful``, each runs in a savepoint
    (`SQLTables.attempt`); else (a backend that can, `AloneTables`) without one, and
    an operation that fails after writing returns None: roll the transaction back
    and run them again, carefully. A batch of one runs as it is: its failure fails
    the transaction."""
    tables = core.tables
    bulk = tables if isinstance(tables, BulkTables) else None
    alone = None if careful or not isinstance(tables, AloneTables) else tables
    results: list[tuple[bool, Any] | None] = [None] * len(calls)
    for many, run in _runs(core, calls, bulk is not None):
        if many is not None and bulk is not None:
            done = many(core, bulk, now, [calls[i] for i in run])
            if done is not None:
                for i, record in zip(run, done, strict=True):
                    results[i] = (True, record)
                continue
        for i in run:
            if len(calls) == 1:
                results[i] = (True, calls[i]())
            elif alone is not None:
                result = _try_alone(alone, calls[i])
                if result is None:
                    return None
                results[i] = result
            else:
                results[i] = tables.attempt(calls[i])
    return cast("list[tuple[bool, Any]]", results)


def _try_alone(tables: AloneTables, call: Callable[[], Any]) -> tuple[bool, Any] | None:
    """``call()`` as it is: ``(True, its value)``, ``(False, its exception)`` if it
    failed having written nothing, or None if it failed after writing (it cannot
    be undone alone)."""
    writes = tables.writes
    try:
        return True, call()
    except tables.errors:
        raise
    except Exception as exc:
        return (False, exc) if tables.writes == writes else None


def _runs(
    core: Core, calls: Sequence[Callable[[], Any]], bulk: bool
) -> list[tuple[_Many | None, list[int]]]:
    """The indices of ``calls`` in the runs they go in, in order, each with what
    writes its run at once (with ``bulk``, every fulfil in one run at the place of
    the first, likewise every create; every other operation a run of its own)."""
    runs: list[tuple[_Many | None, list[int]]] = []
    first: dict[_Many, int] = {}
    for i, call in enumerate(calls):
        kind = _kind(core, call) if bulk else None
        if kind is None:
            runs.append((None, [i]))
        elif kind in first:
            runs[first[kind]][1].append(i)
        else:
            first[kind] = len(runs)
            runs.append((kind, [i]))
    return runs


def _kind(core: Core, call: Callable[[], Any]) -> _Many | None:
    if not isinstance(call, functools.partial) or len(call.args) != 2:
        return None
    if call.func == core.fulfill and _FULFIL_KEYWORDS.issuperset(call.keywords):
        return _fulfils
    if call.func == core.create_promise and _CREATE_KEYWORDS.issuperset(call.keywords):
        return _creates
    return None


def _fulfils(
    core: Core, bulk: BulkTables, now: float, calls: Sequence[Any]
) -> list[PromiseRecord] | None:
    """Every fulfil of ``calls`` at once, or None (nothing done: run them one by one)."""
    items = []
    for call in calls:
        id, version = call.args
        if type(version) is not int:
            return None
        try:
            check_id(id, "task id")
            data = encode(call.keywords.get("data"))
        except ValueError:
            return None
        rejected = call.keywords.get("rejected")
        state = PromiseState.REJECTED if rejected else PromiseState.RESOLVED
        items.append((id, version, state.value, data))
    if len({item[0] for item in items}) < len(items):
        return None
    rows = bulk.fulfil_many(items, now)
    if rows is None:
        return None
    out = []
    for row, awaited in rows:
        if awaited:  # tasks are suspended on it: they resume
            core.resume_waiters(row["id"], now)
        out.append(promise_record(row))
    return out


def _creates(
    core: Core, bulk: BulkTables, now: float, calls: Sequence[Any]
) -> list[PromiseRecord] | None:
    """Every create of ``calls`` at once, or None (nothing done: run them one by one)."""
    promises: list[Row] = []
    tasks: list[Row] = []
    for call in calls:
        id, timeout = call.args
        kw = call.keywords
        ikc, target = kw.get("idempotency_key"), kw.get("target")
        try:
            # (a timeout of 0 is born timed out: below)
            check_seconds(timeout, "timeout", zero=True)
            check_create(id, ikc, target, kw.get("tags"))
            data, tags = kw.get("data"), kw.get("tags")
            row, task = new_rows(id, timeout, ikc, data, tags, target, now, core.retry_timeout)
        except ValueError:
            return None
        if row["timeout_at"] <= now:
            return None  # born timed out: settles at once (one by one)
        promises.append(row)
        if task is not None:
            tasks.append(task)
    if len({row["id"] for row in promises}) < len(promises):
        return None
    if not bulk.create_many(promises, tasks):
        return None
    return [promise_record(row) for row in promises]
