"""trioexec: a Trio-native task runtime whose tasks give their slot back while they wait."""

from ._coordinator import WorkflowResult as WorkflowResult
from ._coordinator import WorkflowRun as WorkflowRun
from ._core import ExecutorConfig as ExecutorConfig
from ._deterministic import DeterministicExecutor as DeterministicExecutor
from ._errors import CapacityExceeded as CapacityExceeded
from ._errors import ExecutorClosed as ExecutorClosed
from ._errors import PermanentError as PermanentError
from ._errors import StoreError as StoreError
from ._errors import TaskCancelled as TaskCancelled
from ._errors import TaskDefinitionError as TaskDefinitionError
from ._errors import TaskFailed as TaskFailed
from ._errors import TaskRejected as TaskRejected
from ._errors import TaskTimeout as TaskTimeout
from ._errors import TrioexecError as TrioexecError
from ._errors import WorkflowError as WorkflowError
from ._events import HealthEvent as HealthEvent
from ._executor import Executor as Executor
from ._executor import open_executor as open_executor
from ._handle import TaskHandle as TaskHandle
from ._machine._keys import KeyLimit as KeyLimit
from ._machine._keys import KeyStatistics as KeyStatistics
from ._metrics import ExecutorMetrics as ExecutorMetrics
from ._records import ExecutionRecord as ExecutionRecord
from ._records import HealthEventKind as HealthEventKind
from ._records import Overflow as Overflow
from ._records import ShutdownPolicy as ShutdownPolicy
from ._records import SubStatus as SubStatus
from ._records import TaskCompletion as TaskCompletion
from ._records import TaskStatus as TaskStatus
from ._results import wait_result as wait_result
from ._schedule import Schedule as Schedule
from ._signals import serve_until_signal as serve_until_signal
from ._slots import SlotPool as SlotPool
from ._slots import SlotToken as SlotToken
from ._spec import Backoff as Backoff
from ._spec import TaskSpec as TaskSpec
from ._spec import task as task
from ._store import Command as Command
from ._store import MemoryStore as MemoryStore
from ._store import Pause as Pause
from ._store import PostgresStore as PostgresStore
from ._store import Requeued as Requeued
from ._store import ScheduleRecord as ScheduleRecord
from ._store import SQLiteStore as SQLiteStore
from ._store import Store as Store
from ._store import open_store as open_store
from ._taskref import TaskRef as TaskRef
from ._workflow import Context as Context
from ._workflow import ExecutionStatus as ExecutionStatus
from ._workflow import RunProgress as RunProgress
from ._workflow import RunStatus as RunStatus
from ._workflow import StepState as StepState
from ._workflow import Workflow as Workflow
from ._workflow import WorkflowStatus as WorkflowStatus

__version__ = "0.1.0.dev0"

__all__ = [
    # slots
    "KeyLimit",
    "KeyStatistics",
    "SlotPool",
    "SlotToken",
    # tasks
    "task",
    "TaskSpec",
    "Backoff",
    "TaskHandle",
    # executor
    "open_executor",
    "Executor",
    "ExecutorConfig",
    "Schedule",
    "serve_until_signal",
    "DeterministicExecutor",
    "TaskRef",
    "Overflow",
    "ShutdownPolicy",
    "ExecutorMetrics",
    "HealthEvent",
    "HealthEventKind",
    # records
    "TaskStatus",
    "SubStatus",
    "TaskCompletion",
    "ExecutionRecord",
    "ScheduleRecord",
    "Command",
    "Pause",
    "Requeued",
    # persistence
    "Store",
    "MemoryStore",
    "SQLiteStore",
    "PostgresStore",
    "open_store",
    "wait_result",
    # workflows
    "Workflow",
    "Context",
    "WorkflowRun",
    "WorkflowResult",
    "WorkflowStatus",
    "RunProgress",
    "ExecutionStatus",  # (RunProgress's first name, kept)
    "RunStatus",
    "StepState",
    # errors
    "TrioexecError",
    "TaskDefinitionError",
    "WorkflowError",
    "TaskRejected",
    "CapacityExceeded",
    "ExecutorClosed",
    "TaskTimeout",
    "TaskCancelled",
    "TaskFailed",
    "PermanentError",
    "StoreError",
]
