"""Durable promises' and tasks' records and states: values, below the durable
tables that keep them (`trioexec._store`) and the errors that carry them
(`PromiseRejected`); `trioexec.durable` exports them."""

from __future__ import annotations

import enum

import attrs


class PromiseState(enum.StrEnum):
    PENDING = "pending"
    RESOLVED = "resolved"
    REJECTED = "rejected"
    REJECTED_CANCELED = "rejected_canceled"
    REJECTED_TIMEDOUT = "rejected_timedout"


class TaskState(enum.StrEnum):
    PENDING = "pending"
    ACQUIRED = "acquired"
    SUSPENDED = "suspended"
    HALTED = "halted"
    FULFILLED = "fulfilled"


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
