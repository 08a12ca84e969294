"""Durable promise and task records. The states they carry are stored in the
durable tables, so they are defined with them (`trioexec._store`); the protocol's
errors live with every other error, in `trioexec._errors`."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from .._errors import Conflict as Conflict
from .._errors import NotFound as NotFound
from .._store._durable_rows import PromiseState as PromiseState
from .._store._durable_rows import TaskState as TaskState


class Suspend(enum.StrEnum):
    """What `tasks.suspend` did."""

    SUSPENDED = "suspended"
    ALREADY_SETTLED = "already_settled"  #: an awaited promise had settled (Resonate's 300)


@attrs.frozen(kw_only=True)
class PromiseRecord:
    """A durable promise. ``data`` is JSON text (or None); times are wall-clock."""

    id: str
    state: PromiseState
    data: str | None = None
    timeout_at: float
    idempotency_key_create: str | None = None
    idempotency_key_settle: str | None = None
    tags: dict[str, str] = attrs.field(factory=dict)
    created_at: float
    settled_at: float | None = None

    @property
    def pending(self) -> bool:
        return self.state is PromiseState.PENDING


@attrs.frozen(kw_only=True)
class TaskRecord:
    """The claim on a promise's work. ``version`` is the OCC token every mutating
    call presents; only ``acquire`` increments it."""

    id: str
    state: TaskState
    version: int
    target: str | None = None
    pid: str | None = None
    ttl: float | None = None
    lease_expires_at: float | None = None  #: set exactly while ACQUIRED
    timeout_at: float | None = None  #: retry timeout, set exactly while PENDING
    awaiting: tuple[str, ...] = ()  #: promise ids a SUSPENDED task waits for


@attrs.frozen(kw_only=True)
class PromiseCreate:
    """`tasks.fence` action: create a promise, guarded by the task's version."""

    id: str
    timeout: float
    idempotency_key: str | None = None
    data: Any = None
    tags: dict[str, str] | None = None


@attrs.frozen(kw_only=True)
class PromiseSettle:
    """`tasks.fence` action: settle a promise, guarded by the task's version."""

    id: str
    state: PromiseState
    idempotency_key: str | None = None
    data: Any = None
