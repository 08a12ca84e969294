"""Runs of like operations in one group commit, each run as one statement where the
backend can (`BulkTables`: PostgreSQL): a worker's fulfils, a producer's creates.

`Core.run` hands its operations here. A run of two or more consecutive fulfils (or
creates) goes to the backend at once if every one of them is plainly valid and
would succeed; the backend then writes them all, or nothing (and says so). Else,
and for every other operation, each runs alone as before (`Tables.attempt`). The
answers are the same either way: each operation's own, in order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._store._durable_rows import BulkTables, Row
from ._checks import check_create, check_id, encode, new_rows, promise_record
from ._records import PromiseRecord, PromiseState

if TYPE_CHECKING:
    from ._protocol import Core

_FULFIL_KEYWORDS = frozenset({"data", "rejected"})
_CREATE_KEYWORDS = frozenset({"idempotency_key", "data", "tags", "target"})


def run_calls(core: Core, now: float, calls: Sequence[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    """Each of ``calls`` (operations of ``core``, in the transaction open at ``now``),
    in order: ``(True, value)`` or ``(False, exception)``."""
    tables = core.tables
    bulk = tables if isinstance(tables, BulkTables) else None
    results: list[tuple[bool, Any]] = []
    i = 0
    while i < len(calls):
        j = i + 1
        kind = None if bulk is None else _kind(core, calls[i])
        if kind is not None and bulk is not None:
            while j < len(calls) and _kind(core, calls[j]) == kind:
                j += 1
            if j - i >= 2:
                run = calls[i:j]
                done = (
                    _fulfils(core, bulk, now, run)
                    if kind == "fulfil"
                    else _creates(core, bulk, now, run)
                )
                if done is not None:
                    results.extend((True, record) for record in done)
                    i = j
                    continue
        results.extend(tables.attempt(call) for call in calls[i:j])
        i = j
    return results


def _kind(core: Core, call: Callable[[], Any]) -> str | None:
    if not isinstance(call, functools.partial) or len(call.args) != 2:
        return None
    if call.func == core.fulfill and _FULFIL_KEYWORDS.issuperset(call.keywords):
        return "fulfil"
    if call.func == core.create_promise and _CREATE_KEYWORDS.issuperset(call.keywords):
        return "create"
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
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            return None
        if not 0 < timeout < math.inf:
            return None
        ikc, target = kw.get("idempotency_key"), kw.get("target")
        try:
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
