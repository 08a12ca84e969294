"""The durable protocol's records: those the store shares (`trioexec._durable_records`),
its errors (`trioexec._errors`), and its own."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from .._durable_records import PromiseRecord as PromiseRecord
from .._durable_records import PromiseState as PromiseState
from .._durable_records import TaskRecord as TaskRecord
from .._durable_records import TaskState as TaskState
from .._errors import Conflict as Conflict
from .._errors import NotFound as NotFound


class Suspend(enum.StrEnum):
    """What `tasks.suspend` did."""

    SUSPENDED = "suspended"
    ALREADY_SETTLED = "already_settled"  #: an awaited promise had settled (Resonate's 300)


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
