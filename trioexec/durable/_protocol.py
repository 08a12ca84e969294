"""The promise/task protocol (Resonate's), written once over a small table layer.

Every operation runs in one transaction of the backend: it first applies what time
has done (promises past their timeout settle as rejected-timed-out, leases past
their expiry return tasks to pending with the same version), then acts. Settling
a promise resumes the tasks suspended on it in the same transaction: no polling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from .._store._durable_rows import Row, acquired
from .._store._durable_sql import SQLTables
from ._bulk import run_calls
from ._checks import (
    check_create,
    check_holds,
    check_id,
    check_limit,
    check_optional_id,
    check_seconds,
    encode,
    new_rows,
    promise_record,
)
from ._records import (
    Conflict,
    NotFound,
    PromiseCreate,
    PromiseRecord,
    PromiseSettle,
    PromiseState,
    Suspend,
    TaskRecord,
    TaskState,
)

R = TypeVar("R", PromiseRecord, TaskRecord)
_ACQUIRED = TaskState.ACQUIRED.value


class _RunAgain(Exception):
    """An operation of `Core.run` failed after writing, without a savepoint."""


class Core:
    """The protocol over ``tables``, synchronous. `DurableStore` wraps it in async calls.

    Args:
      retry_timeout: how long a pending task waits to be claimed before it is
        offered again (its "retry timeout", re-armed each time it passes).
    """

    def __init__(
        self, tables: SQLTables, clock: Callable[[], float], retry_timeout: float = 30.0
    ) -> None:
        self.tables = tables
        self.clock = clock
        self.retry_timeout = retry_timeout
        self._now: float | None = None  # the moment of the `run` in progress

    def run(self, take: Callable[[], Sequence[Callable[[], Any]]]) -> list[tuple[bool, Any]]:
        """Several operations (calls of this object's methods) in one transaction: a
        group commit. ``take()`` returns them once the transaction has begun (with
        the write lock: what was queued meanwhile joins), and again, with any more,
        if the transaction runs again. Time is applied once, at the start: each
        operation acts at that moment, sees those before it, and answers what it
        would have alone (order and undo: `run_calls`). A failure of the storage
        (or the commit) raises: nothing is written.
        """
        careful = False
        while True:
            try:
                with self.tables.transaction():
                    self._now = self._begin()
                    try:
                        results = run_calls(self, self._now, take(), careful=careful)
                    finally:
                        self._now = None
                    if results is None:
                        raise _RunAgain  # (rolls the transaction back)
                    return results
            except _RunAgain:
                careful = True  # one failed after writing: nothing was kept

    # ------------------------------------------------------------------ time

    @contextlib.contextmanager
    def _at(self) -> Iterator[float]:
        """One transaction (inside a `run`, part of its) and the moment it acts at."""
        with self.tables.transaction():
            yield self._begin()

    def _begin(self) -> float:
        """The moment an operation acts at, with what time has done applied
        (once per transaction: inside a `run`, its moment): promises past their
        timeout settle, expired leases lapse, due pending tasks are offered again."""
        if self._now is not None:
            return self._now
        now = self.clock()
        t = self.tables
        for row in t.timed_out_promises(now):
            self._settle(row, PromiseState.REJECTED_TIMEDOUT, None, None, now)
        for row in t.expired_leases(now):
            self._to_pending(row, now)
        for row in t.due_pending_tasks(now):
            row["timeout_at"] = now + self.retry_timeout  # offered again
            t.put_task(row)
        return now

    def _to_pending(self, task: Row, now: float) -> None:
        self._put_state(task, TaskState.PENDING, now + self.retry_timeout)

    def _put_state(self, task: Row, state: TaskState, timeout_at: float | None = None) -> None:
        """Store ``task`` in ``state``, unleased (a pending one's retry timeout at
        ``timeout_at``)."""
        task.update(state=state.value, pid=None, lease_expires_at=None, timeout_at=timeout_at)
        self.tables.put_task(task)

    def _settle(
        self, row: Row, state: PromiseState, data: str | None, iku: str | None, now: float
    ) -> None:
        """Settle promise ``row``: resume the tasks suspended on it and fulfil its own."""
        t = self.tables
        row.update(state=state.value, data=data, iku=iku, settled_at=now)
        t.put_promise(row)
        self.resume_waiters(row["id"], now)
        # Its own task has nothing left to do.
        own = t.task(row["id"])
        if own is not None and own["state"] != TaskState.FULFILLED.value:
            if own["state"] == TaskState.SUSPENDED.value:
                t.drop_callbacks(own["id"])  # (only a suspended task has callbacks)
            self._put_state(own, TaskState.FULFILLED)

    def resume_waiters(self, promise_id: str, now: float) -> None:
        """Promise ``promise_id`` has settled: every task suspended on it becomes
        pending (and forgets all its other callbacks)."""
        t = self.tables
        for task_id in t.tasks_awaiting(promise_id):
            task = t.task(task_id)
            t.drop_callbacks(task_id)
            if task is not None and task["state"] == TaskState.SUSPENDED.value:
                self._to_pending(task, now)

    # ------------------------------------------------------------------ promises

    def create_promise(
        self,
        id: str,
        timeout: float,
        *,
        idempotency_key: str | None = None,
        data: Any = None,
        tags: dict[str, str] | None = None,
        target: str | None = None,
    ) -> PromiseRecord:
        check_seconds(timeout, "timeout", zero=True)
        with self._at() as now:
            return promise_record(
                self._create(id, timeout, idempotency_key, data, tags, target, now)
            )

    def _create(
        self,
        id: str,
        timeout: float,
        ikc: str | None,
        data: Any,
        tags: dict[str, str] | None,
        target: str | None,
        now: float,
    ) -> Row:
        check_create(id, ikc, target, tags)
        t = self.tables
        existing = t.promise(id)
        if existing is not None:
            if ikc is not None and existing["ikc"] == ikc:
                return existing  # the same create, repeated
            raise Conflict(f"promise {id!r} already exists")
        row, task = new_rows(id, timeout, ikc, data, tags, target, now, self.retry_timeout)
        t.put_promise(row)
        if task is not None:
            t.put_task(task)
        if row["timeout_at"] <= now:  # born timed out (the same rule as _begin)
            self._settle(row, PromiseState.REJECTED_TIMEDOUT, None, None, now)
        return row

    def settle_promise(
        self, id: str, state: PromiseState, *, idempotency_key: str | None = None, data: Any = None
    ) -> PromiseRecord:
        with self._at() as now:
            return promise_record(self._settle_checked(id, state, idempotency_key, data, now))

    def _settle_checked(
        self, id: str, state: PromiseState | str, iku: str | None, data: Any, now: float
    ) -> Row:
        check_id(id, "promise id")
        check_optional_id(iku, "idempotency_key")
        state = PromiseState(state)
        if state is PromiseState.PENDING or state is PromiseState.REJECTED_TIMEDOUT:
            raise ValueError(f"a promise cannot be settled as {state.value!r}")
        row = self.tables.promise(id)
        if row is None:
            raise NotFound(f"no promise {id!r}")
        if row["state"] != PromiseState.PENDING.value:
            if iku is not None and row["iku"] == iku and row["state"] == state.value:
                return row  # the same settle, repeated
            raise Conflict(f"promise {id!r} is already {row['state']}")
        self._settle(row, state, encode(data), iku, now)
        return row

    def get_promise(self, id: str) -> PromiseRecord | None:
        check_id(id, "promise id")
        with self._at():
            row = self.tables.promise(id, shared=True)
            return None if row is None else promise_record(row)

    def search_promises(
        self,
        *,
        state: PromiseState | str | None = None,
        tag: tuple[str, str] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[PromiseRecord], str | None]:
        check_limit(limit)
        check_optional_id(cursor, "cursor")
        with self._at():
            want = None if state is None else PromiseState(state).value
            rows = self.tables.search_promises(want, tag, limit + 1, cursor)
            return _page(rows, promise_record, limit)

    # ------------------------------------------------------------------ tasks

    def _task(self, id: str) -> Row:
        check_id(id, "task id")
        row = self.tables.task(id)
        if row is None:
            raise NotFound(f"no task {id!r}")
        return row

    def _acquired(self, id: str, version: int, state: TaskState = TaskState.ACQUIRED) -> Row:
        """Task ``id``'s row, in ``state`` at ``version`` (else NotFound or Conflict)."""
        task = self._task(id)
        if task["state"] != state.value or task["version"] != version:
            raise Conflict(
                f"task {id!r} is {task['state']} at version {task['version']}, "
                f"not {state.value} at version {version}"
            )
        return task

    def task_record(self, row: Row) -> TaskRecord:
        awaiting: tuple[str, ...] = ()
        if row["state"] == TaskState.SUSPENDED.value:
            awaiting = tuple(sorted(self.tables.awaited_by(row["id"])))
        # (a task's row holds its record's other fields, by name)
        return TaskRecord(**{**row, "state": TaskState(row["state"])}, awaiting=awaiting)

    def create_task(
        self, id: str, *, pid: str, ttl: float, timeout: float, data: Any = None, target: str
    ) -> TaskRecord:
        check_id(id, "task id")
        check_seconds(timeout, "timeout", zero=True)
        check_seconds(ttl, "ttl")
        check_id(pid, "pid")
        check_id(target, "target")
        with self._at() as now:
            self._create(id, timeout, None, data, None, target, now)
            task = self._task(id)
            if task["state"] == TaskState.PENDING.value:
                self.tables.put_task(acquired(task, 1, pid, ttl, now))
            return self.task_record(task)

    def acquire(self, id: str, version: int, *, pid: str, ttl: float) -> TaskRecord:
        check_seconds(ttl, "ttl")
        check_id(pid, "pid")
        with self._at() as now:
            task = self._acquired(id, version, TaskState.PENDING)
            self.tables.put_task(acquired(task, version + 1, pid, ttl, now))
            return self.task_record(task)

    def claim_work(
        self, target: str, *, pid: str, ttl: float, limit: int
    ) -> list[tuple[TaskRecord, str | None]]:
        """Acquire up to ``limit`` pending tasks of ``target`` (each exactly as
        `acquire` would: version + 1, a lease of ``ttl``), each with its promise's
        data (JSON text): all a worker needs to start the work, in one transaction
        (two claims at once never get the same task)."""
        check_seconds(ttl, "ttl")
        check_limit(limit)
        check_id(target, "target")
        check_id(pid, "pid")
        with self._at() as now:
            claimed = self.tables.claim(target, limit, pid, ttl, now)
            return [(self.task_record(task), data) for task, data in claimed]

    def heartbeat(self, pid: str, tasks: Sequence[tuple[str, int]]) -> int:
        """Renew the lease of each (id, version) this pid holds; skip the rest.
        Returns how many were renewed."""
        check_holds(pid, tasks)
        with self._at() as now:
            renewed = 0
            for id, version in tasks:
                task = _held(self.tables, id, version, pid)
                if task is not None:
                    task["lease_expires_at"] = now + task["ttl"]
                    self.tables.put_task(task)
                    renewed += 1
            return renewed

    def lost_leases(self, pid: str, tasks: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        """The (id, version) pairs of ``tasks`` that are not acquired by ``pid`` at that
        version (any more: a task never comes back to a version it left)."""
        check_holds(pid, tasks)
        with self._at():
            return [(id, v) for id, v in tasks if _held(self.tables, id, v, pid) is None]

    def suspend(self, id: str, version: int, awaited: Sequence[str]) -> Suspend:
        if isinstance(awaited, str):
            raise ValueError(f"awaited must be a list of promise ids, got the str {awaited!r}")
        if not awaited:
            raise ValueError("suspend needs at least one awaited promise id")
        for promise_id in awaited:
            check_id(promise_id, "awaited promise id")
        with self._at():
            task = self._acquired(id, version)
            rows = []
            for pid in awaited:
                # Looked at, not changed: pending until this commits (a settle
                # waits, then sees the callbacks); concurrent suspends on the same
                # promises (in any order) do not wait for each other.
                row = self.tables.promise(pid, shared=True)
                if row is None:
                    raise NotFound(f"no promise {pid!r}")
                rows.append(row)
            if any(r["state"] != PromiseState.PENDING.value for r in rows):
                return Suspend.ALREADY_SETTLED
            for pid in dict.fromkeys(awaited):
                self.tables.add_callback(pid, id)
            self._put_state(task, TaskState.SUSPENDED)
            return Suspend.SUSPENDED

    def resume(self, id: str, version: int) -> TaskRecord:
        with self._at() as now:
            task = self._task(id)
            if task["state"] != TaskState.SUSPENDED.value or task["version"] != version:
                raise Conflict(f"task {id!r} is {task['state']} at version {task['version']}")
            self.tables.drop_callbacks(id)
            self._to_pending(task, now)
            return self.task_record(task)

    def release(self, id: str, version: int) -> TaskRecord:
        with self._at() as now:
            task = self._acquired(id, version)
            self._to_pending(task, now)
            return self.task_record(task)

    def fulfill(
        self, id: str, version: int, *, data: Any = None, rejected: bool = False
    ) -> PromiseRecord:
        check_id(id, "task id")
        state = PromiseState.REJECTED if rejected else PromiseState.RESOLVED
        t = self.tables
        with self._at() as now:
            # Two conditional updates (the version is the fence), not reads and
            # writes: a worker's commonest call, and its store's write lock held.
            done = {
                "state": TaskState.FULFILLED.value,
                "pid": None,
                "lease_expires_at": None,
                "timeout_at": None,
            }
            if not t.update_task(id, {"state": TaskState.ACQUIRED.value, "version": version}, done):
                self._acquired(id, version)  # raises, naming the state
                raise Conflict(f"task {id!r} is not acquired at version {version}")
            settled = {"state": state.value, "data": encode(data), "iku": None, "settled_at": now}
            row = t.update_promise(id, {"state": PromiseState.PENDING.value}, settled)
            if row is None:
                raise Conflict(f"promise {id!r} is not pending")
            self.resume_waiters(id, now)  # (its own task is fulfilled above)
            return promise_record(row)

    def fence(self, id: str, version: int, action: PromiseCreate | PromiseSettle) -> PromiseRecord:
        check_id(id, "task id")
        if not isinstance(action, PromiseCreate | PromiseSettle):
            raise ValueError(f"action must be a PromiseCreate or a PromiseSettle, got {action!r}")
        check_id(action.id, "promise id")
        if isinstance(action, PromiseCreate):
            check_seconds(action.timeout, "timeout", zero=True)
        with self._at() as now:
            self._acquired(id, version)
            own = self.tables.promise(id, shared=True)
            if own is None or own["state"] != PromiseState.PENDING.value:
                raise Conflict(f"task {id!r}: its promise is not pending")
            a = action
            if isinstance(a, PromiseCreate):
                row = self._create(a.id, a.timeout, a.idempotency_key, a.data, a.tags, None, now)
            else:
                row = self._settle_checked(a.id, a.state, a.idempotency_key, a.data, now)
            return promise_record(row)

    def halt(self, id: str) -> TaskRecord:
        with self._at():
            task = self._task(id)
            if task["state"] == TaskState.FULFILLED.value:
                raise Conflict(f"task {id!r} is fulfilled")
            if task["state"] != TaskState.HALTED.value:
                self.tables.drop_callbacks(id)
                self._put_state(task, TaskState.HALTED)
            return self.task_record(task)

    def continue_(self, id: str) -> TaskRecord:
        with self._at() as now:
            task = self._task(id)
            if task["state"] != TaskState.HALTED.value:
                raise Conflict(f"task {id!r} is {task['state']}, not halted")
            self._to_pending(task, now)
            return self.task_record(task)

    def get_task(self, id: str) -> TaskRecord | None:
        check_id(id, "task id")
        with self._at():
            row = self.tables.task(id, shared=True)
            return None if row is None else self.task_record(row)

    def search_tasks(
        self,
        *,
        state: TaskState | str | None = None,
        target: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[TaskRecord], str | None]:
        check_limit(limit)
        check_optional_id(target, "target")
        check_optional_id(cursor, "cursor")
        with self._at():
            want = None if state is None else TaskState(state).value
            rows = self.tables.search_tasks(want, target, limit + 1, cursor)
            return _page(rows, self.task_record, limit)

    # ------------------------------------------------------------------ invariants

    def check_invariants(self) -> list[str]:
        """The seed's seven task-store invariants that do not hold (empty: healthy)."""
        t = self.tables
        violated: set[str] = set()
        pending = PromiseState.PENDING.value
        with t.transaction():
            promises = {r["id"]: r["state"] for r in t.all_promises()}
            awaited_by: dict[str, list[str]] = {}
            for promise_id, task_id in t.all_callbacks():
                awaited_by.setdefault(task_id, []).append(promise_id)
            for task in t.all_tasks():
                state = task["state"]
                timed = task["timeout_at"] is not None or task["lease_expires_at"] is not None
                if task["id"] not in promises:
                    violated.add("orphan_tasks")
                if state == TaskState.PENDING.value and task["timeout_at"] is None:
                    violated.add("pending_task_no_ttimeout")
                if state == TaskState.ACQUIRED.value and task["lease_expires_at"] is None:
                    violated.add("acquired_task_no_lease")
                if state == TaskState.SUSPENDED.value:
                    mine = awaited_by.get(task["id"], [])
                    if not mine:
                        violated.add("suspended_no_callback")
                    if any(promises.get(p, pending) != pending for p in mine):
                        violated.add("suspended_with_consumed_callbacks")
                    if timed:
                        violated.add("suspended_task_has_ttimeout")
                if state == TaskState.FULFILLED.value and timed:
                    violated.add("fulfilled_task_has_ttimeout")
        return sorted(violated)


def claim_tagged(
    core: Core, target: str, *, pid: str, ttl: float, limit: int
) -> list[tuple[TaskRecord, str | None, dict[str, str]]]:
    """``core.claim_work``, each task also with its promise's tags (what a traced
    worker continues the creator's trace from: ``_store.trace_with``)."""
    with core.tables.transaction():
        claimed = core.claim_work(target, pid=pid, ttl=ttl, limit=limit)
        promises = [core.tables.promise(task.id, shared=True) for task, _ in claimed]
        return [
            (task, data, {} if row is None else dict(row["tags"]))
            for (task, data), row in zip(claimed, promises, strict=True)
        ]


def _page(rows: list[Row], record: Callable[[Row], R], limit: int) -> tuple[list[R], str | None]:
    """The records of a page of ``limit`` from ``rows``, read one past it (a search
    for ``limit + 1``), and the cursor of the next page (None: this is the last)."""
    page = [record(r) for r in rows[:limit]]
    return page, (page[-1].id if len(rows) > limit else None)


def _held(tables: SQLTables, id: str, version: int, pid: str) -> Row | None:
    """Task ``id``'s row if ``pid`` holds it at ``version`` (acquired), else None:
    what a heartbeat renews; the rest is lost."""
    task = tables.task(id)
    if task is None or (task["state"], task["version"], task["pid"]) != (_ACQUIRED, version, pid):
        return None
    return task
