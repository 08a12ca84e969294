"""A reference model of `trioexec.durable`'s promise/task protocol, in plain Python.

Written from the seed (Resonate's tasks: lifecycle, version OCC, leases, heartbeat,
suspend's 300, fence, the seven store invariants) and API.md §6, independently of
``trioexec.durable._protocol``: only the record and enum classes and the two errors
are imported, to build the same return values and raise the same exceptions.

The semantics modelled, where the seed leaves a choice:

* Time is applied lazily: every operation first applies what time has done up to
  ``now`` (promises whose ``timeout_at <= now`` settle ``REJECTED_TIMEDOUT`` at
  ``now``; acquired tasks whose ``lease_expires_at <= now`` go back to pending with
  the same version; pending tasks whose retry timeout has passed get it re-armed to
  ``now + retry_timeout``), then acts. An operation is one transaction: if it
  raises, nothing it did -- that catching-up included -- is kept.
* Settling a promise resumes (to pending) every task suspended on it, forgetting all
  that task's awaited promises, and fulfils the promise's own task.
* ``create`` of an existing id returns the existing promise only when the same
  non-None idempotency key is given; a settle of a settled promise returns it only
  for the same non-None key and the same state. Otherwise `Conflict`.
* A task is pending with a retry timeout, acquired with a lease, suspended with a
  non-empty set of awaited (pending) promises, halted, or fulfilled; ``ttl`` and
  ``target`` are kept across states. ``acquire`` (and ``create_task``, at 1) are the
  only operations that move the version.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from trioexec.durable import (
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

PENDING = PromiseState.PENDING
TARGET_TAG = "resonate:target"

INVARIANTS = (
    "orphan_tasks",
    "pending_task_no_ttimeout",
    "acquired_task_no_lease",
    "suspended_no_callback",
    "suspended_with_consumed_callbacks",
    "suspended_task_has_ttimeout",
    "fulfilled_task_has_ttimeout",
)


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def _timeout_ok(timeout: Any) -> None:
    if not _number(timeout) or not 0 <= timeout < math.inf:
        raise ValueError(f"bad timeout {timeout!r}")


def _ttl_ok(ttl: Any) -> None:
    if not _number(ttl) or not 0 < ttl < math.inf:
        raise ValueError(f"bad ttl {ttl!r}")


def _limit_ok(limit: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"bad limit {limit!r}")


def _encode(data: Any) -> str | None:
    return None if data is None else json.dumps(data, allow_nan=False)


class Model:
    """The whole store as three dicts. Methods mirror ``Core``'s, by name, arguments,
    return values and exceptions."""

    def __init__(self, clock: Callable[[], float], retry_timeout: float = 30.0) -> None:
        self.clock = clock
        self.retry_timeout = retry_timeout
        # id -> fields of PromiseRecord (state as PromiseState)
        self.promises: dict[str, dict[str, Any]] = {}
        # id -> fields of TaskRecord except awaiting (state as TaskState)
        self.tasks: dict[str, dict[str, Any]] = {}
        # task id -> the promise ids it waits for; a key exactly while SUSPENDED
        self.awaiting: dict[str, set[str]] = {}

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _op(self) -> Iterator[float]:
        """One transaction: catch up with time, act; on any error keep nothing."""
        saved = copy.deepcopy((self.promises, self.tasks, self.awaiting))
        try:
            now = self.clock()
            self._catch_up(now)
            yield now
        except BaseException:
            self.promises, self.tasks, self.awaiting = saved
            raise

    def _catch_up(self, now: float) -> None:
        for id in sorted(self.promises):
            p = self.promises[id]
            if p["state"] is PENDING and p["timeout_at"] <= now:
                self._settle(id, PromiseState.REJECTED_TIMEDOUT, None, None, now)
        for task in self.tasks.values():
            if task["state"] is TaskState.ACQUIRED and task["lease_expires_at"] <= now:
                self._make_pending(task, now)
        for task in self.tasks.values():
            if task["state"] is TaskState.PENDING and task["timeout_at"] <= now:
                task["timeout_at"] = now + self.retry_timeout

    def _make_pending(self, task: dict[str, Any], now: float) -> None:
        self.awaiting.pop(task["id"], None)
        task.update(
            state=TaskState.PENDING,
            pid=None,
            lease_expires_at=None,
            timeout_at=now + self.retry_timeout,
        )

    def _settle(
        self, id: str, state: PromiseState, data: str | None, iku: str | None, now: float
    ) -> None:
        self.promises[id].update(state=state, data=data, iku=iku, settled_at=now)
        for task_id, awaited in list(self.awaiting.items()):
            if id in awaited:
                self._make_pending(self.tasks[task_id], now)
        own = self.tasks.get(id)
        if own is not None and own["state"] is not TaskState.FULFILLED:
            self.awaiting.pop(id, None)
            own.update(state=TaskState.FULFILLED, pid=None, lease_expires_at=None, timeout_at=None)

    def _promise_record(self, id: str) -> PromiseRecord:
        p = self.promises[id]
        return PromiseRecord(
            id=id,
            state=p["state"],
            data=p["data"],
            timeout_at=p["timeout_at"],
            idempotency_key_create=p["ikc"],
            idempotency_key_settle=p["iku"],
            tags=dict(p["tags"]),
            created_at=p["created_at"],
            settled_at=p["settled_at"],
        )

    def _task_record(self, id: str) -> TaskRecord:
        t = self.tasks[id]
        return TaskRecord(
            id=id,
            state=t["state"],
            version=t["version"],
            target=t["target"],
            pid=t["pid"],
            ttl=t["ttl"],
            lease_expires_at=t["lease_expires_at"],
            timeout_at=t["timeout_at"],
            awaiting=tuple(sorted(self.awaiting.get(id, ()))),
        )

    def _get_task(self, id: str) -> dict[str, Any]:
        if id not in self.tasks:
            raise NotFound(id)
        return self.tasks[id]

    def _held(self, id: str, version: int) -> dict[str, Any]:
        """The task, acquired at ``version`` (else NotFound / Conflict)."""
        task = self._get_task(id)
        if task["state"] is not TaskState.ACQUIRED or task["version"] != version:
            raise Conflict(id)
        return task

    def _new_promise(
        self,
        id: str,
        timeout: float,
        ikc: str | None,
        data: Any,
        tags: dict[str, str] | None,
        target: str | None,
        now: float,
    ) -> None:
        """Create (or, for the same create key, find) promise ``id``."""
        if id in self.promises:
            if ikc is not None and self.promises[id]["ikc"] == ikc:
                return
            raise Conflict(id)
        tags = dict(tags or {})
        if target is not None:
            tags[TARGET_TAG] = target
        self.promises[id] = {
            "state": PENDING,
            "data": _encode(data),
            "timeout_at": now + timeout,
            "ikc": ikc,
            "iku": None,
            "tags": tags,
            "created_at": now,
            "settled_at": None,
        }
        if target is not None:
            self.tasks[id] = {
                "id": id,
                "state": TaskState.PENDING,
                "version": 0,
                "target": target,
                "pid": None,
                "ttl": None,
                "lease_expires_at": None,
                "timeout_at": now + self.retry_timeout,
            }
        if self.promises[id]["timeout_at"] <= now:  # a zero timeout: timed out at birth
            self._settle(id, PromiseState.REJECTED_TIMEDOUT, None, None, now)

    def _settle_promise(
        self, id: str, state: PromiseState, iku: str | None, data: Any, now: float
    ) -> None:
        if state in (PromiseState.PENDING, PromiseState.REJECTED_TIMEDOUT):
            raise ValueError(f"cannot settle as {state}")
        if id not in self.promises:
            raise NotFound(id)
        p = self.promises[id]
        if p["state"] is not PENDING:
            if iku is not None and p["iku"] == iku and p["state"] is state:
                return
            raise Conflict(id)
        self._settle(id, state, _encode(data), iku, now)

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
        _timeout_ok(timeout)
        with self._op() as now:
            self._new_promise(id, timeout, idempotency_key, data, tags, target, now)
            return self._promise_record(id)

    def settle_promise(
        self,
        id: str,
        state: PromiseState,
        *,
        idempotency_key: str | None = None,
        data: Any = None,
    ) -> PromiseRecord:
        with self._op() as now:
            self._settle_promise(id, state, idempotency_key, data, now)
            return self._promise_record(id)

    def get_promise(self, id: str) -> PromiseRecord | None:
        with self._op():
            return self._promise_record(id) if id in self.promises else None

    def search_promises(
        self,
        *,
        state: PromiseState | str | None = None,
        tag: tuple[str, str] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[PromiseRecord], str | None]:
        _limit_ok(limit)
        with self._op():
            want = None if state is None else PromiseState(state)
            hits = [
                id
                for id in sorted(self.promises)
                if (cursor is None or id > cursor)
                and (want is None or self.promises[id]["state"] is want)
                and (tag is None or self.promises[id]["tags"].get(tag[0]) == tag[1])
            ]
            page = [self._promise_record(id) for id in hits[:limit]]
            return page, (hits[limit - 1] if len(hits) > limit else None)

    # ------------------------------------------------------------------ tasks

    def create_task(
        self,
        id: str,
        *,
        pid: str,
        ttl: float,
        timeout: float,
        data: Any = None,
        target: str,
    ) -> TaskRecord:
        _timeout_ok(timeout)
        _ttl_ok(ttl)
        with self._op() as now:
            if id in self.promises:
                raise Conflict(id)
            self._new_promise(id, timeout, None, data, None, target, now)
            task = self.tasks[id]
            if task["state"] is TaskState.PENDING:  # not timed out at birth
                task.update(
                    state=TaskState.ACQUIRED,
                    version=1,
                    pid=pid,
                    ttl=ttl,
                    lease_expires_at=now + ttl,
                    timeout_at=None,
                )
            return self._task_record(id)

    def acquire(self, id: str, version: int, *, pid: str, ttl: float) -> TaskRecord:
        _ttl_ok(ttl)
        with self._op() as now:
            task = self._get_task(id)
            if task["state"] is not TaskState.PENDING or task["version"] != version:
                raise Conflict(id)
            task.update(
                state=TaskState.ACQUIRED,
                version=version + 1,
                pid=pid,
                ttl=ttl,
                lease_expires_at=now + ttl,
                timeout_at=None,
            )
            return self._task_record(id)

    def heartbeat(self, pid: str, tasks: Sequence[tuple[str, int]]) -> int:
        with self._op() as now:
            renewed = 0
            for id, version in tasks:
                task = self.tasks.get(id)
                if (
                    task is not None
                    and task["state"] is TaskState.ACQUIRED
                    and task["version"] == version
                    and task["pid"] == pid
                ):
                    task["lease_expires_at"] = now + task["ttl"]
                    renewed += 1
            return renewed

    def suspend(self, id: str, version: int, awaited: Sequence[str]) -> Suspend:
        if not awaited:
            raise ValueError("nothing awaited")
        with self._op():
            task = self._held(id, version)
            for p in awaited:
                if p not in self.promises:
                    raise NotFound(p)
            if any(self.promises[p]["state"] is not PENDING for p in awaited):
                return Suspend.ALREADY_SETTLED  # the 300: stays acquired
            self.awaiting[id] = set(awaited)
            task.update(state=TaskState.SUSPENDED, pid=None, lease_expires_at=None, timeout_at=None)
            return Suspend.SUSPENDED

    def resume(self, id: str, version: int) -> TaskRecord:
        with self._op() as now:
            task = self._get_task(id)
            if task["state"] is not TaskState.SUSPENDED or task["version"] != version:
                raise Conflict(id)
            self._make_pending(task, now)
            return self._task_record(id)

    def release(self, id: str, version: int) -> TaskRecord:
        with self._op() as now:
            self._make_pending(self._held(id, version), now)
            return self._task_record(id)

    def fulfill(
        self, id: str, version: int, *, data: Any = None, rejected: bool = False
    ) -> PromiseRecord:
        with self._op() as now:
            self._held(id, version)
            if self.promises[id]["state"] is not PENDING:
                raise Conflict(id)
            state = PromiseState.REJECTED if rejected else PromiseState.RESOLVED
            self._settle(id, state, _encode(data), None, now)
            return self._promise_record(id)

    def fence(self, id: str, version: int, action: PromiseCreate | PromiseSettle) -> PromiseRecord:
        if isinstance(action, PromiseCreate):
            _timeout_ok(action.timeout)  # a bad argument before any state is looked at
        with self._op() as now:
            self._held(id, version)
            if self.promises[id]["state"] is not PENDING:
                raise Conflict(id)
            if isinstance(action, PromiseCreate):
                self._new_promise(
                    action.id,
                    action.timeout,
                    action.idempotency_key,
                    action.data,
                    action.tags,
                    None,
                    now,
                )
            else:
                self._settle_promise(
                    action.id, action.state, action.idempotency_key, action.data, now
                )
            return self._promise_record(action.id)

    def halt(self, id: str) -> TaskRecord:
        with self._op():
            task = self._get_task(id)
            if task["state"] is TaskState.FULFILLED:
                raise Conflict(id)
            self.awaiting.pop(id, None)
            task.update(state=TaskState.HALTED, pid=None, lease_expires_at=None, timeout_at=None)
            return self._task_record(id)

    def continue_(self, id: str) -> TaskRecord:
        with self._op() as now:
            task = self._get_task(id)
            if task["state"] is not TaskState.HALTED:
                raise Conflict(id)
            self._make_pending(task, now)
            return self._task_record(id)

    def get_task(self, id: str) -> TaskRecord | None:
        with self._op():
            return self._task_record(id) if id in self.tasks else None

    def search_tasks(
        self,
        *,
        state: TaskState | str | None = None,
        target: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[TaskRecord], str | None]:
        _limit_ok(limit)
        with self._op():
            want = None if state is None else TaskState(state)
            hits = [
                id
                for id in sorted(self.tasks)
                if (cursor is None or id > cursor)
                and (want is None or self.tasks[id]["state"] is want)
                and (target is None or self.tasks[id]["target"] == target)
            ]
            page = [self._task_record(id) for id in hits[:limit]]
            return page, (hits[limit - 1] if len(hits) > limit else None)

    # ------------------------------------------------------------------ checks

    def callbacks(self) -> set[tuple[str, str]]:
        """(promise id, task id) pairs: what a store's callback table should hold."""
        return {(p, t) for t, awaited in self.awaiting.items() for p in awaited}

    def check_invariants(self) -> list[str]:
        """The seed's seven invariants, over the model's own state (plus the model's
        own bookkeeping, asserted)."""
        violated = set()
        for id, task in self.tasks.items():
            state = task["state"]
            awaited = self.awaiting.get(id, set())
            assert (id in self.awaiting) == (state is TaskState.SUSPENDED), (id, state)
            if id not in self.promises:
                violated.add("orphan_tasks")
            if state is TaskState.PENDING and task["timeout_at"] is None:
                violated.add("pending_task_no_ttimeout")
            if state is TaskState.ACQUIRED and task["lease_expires_at"] is None:
                violated.add("acquired_task_no_lease")
            if state is TaskState.SUSPENDED:
                if not awaited:
                    violated.add("suspended_no_callback")
                if any(self.promises[p]["state"] is not PENDING for p in awaited):
                    violated.add("suspended_with_consumed_callbacks")
                if task["timeout_at"] is not None or task["lease_expires_at"] is not None:
                    violated.add("suspended_task_has_ttimeout")
            if state is TaskState.FULFILLED:
                if task["timeout_at"] is not None or task["lease_expires_at"] is not None:
                    violated.add("fulfilled_task_has_ttimeout")
                assert self.promises[id]["state"] is not PENDING, id
            else:
                assert self.promises[id]["state"] is PENDING, (id, state)
            assert (task["pid"] is not None) == (state is TaskState.ACQUIRED), id
        return sorted(violated)
