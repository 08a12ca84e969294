"""Durable promises and leased tasks shared by many worker processes (Resonate's model)."""

from .._errors import Conflict as Conflict
from .._errors import NotFound as NotFound
from .._errors import PromiseRejected as PromiseRejected
from ._records import PromiseCreate as PromiseCreate
from ._records import PromiseRecord as PromiseRecord
from ._records import PromiseSettle as PromiseSettle
from ._records import PromiseState as PromiseState
from ._records import Suspend as Suspend
from ._records import TaskRecord as TaskRecord
from ._records import TaskState as TaskState
from ._store import DurableStore as DurableStore
from ._suspend import DurableHandle as DurableHandle
from ._worker import Worker as Worker
from ._worker import open_worker as open_worker

__all__ = [
    "DurableStore",
    "open_worker",
    "Worker",
    "DurableHandle",
    "PromiseRejected",
    "PromiseRecord",
    "TaskRecord",
    "PromiseState",
    "TaskState",
    "Suspend",
    "PromiseCreate",
    "PromiseSettle",
    "Conflict",
    "NotFound",
]
