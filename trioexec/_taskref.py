"""`Job`, the per-task record the executor's parts share (docs/design.rst says
why one record), and `TaskRef`, its public face a submitter holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Protocol,
    TypedDict,
    TypeVar,
    TypeVarTuple,
    cast,
    final,
)

import attrs
import trio

from ._errors import StoreError
from ._records import (
    ACTIVE,
    FAILURES,
    PENDING,
    RUNNING,
    SubStatus,
    T_co,
    TaskCompletion,
    TaskStatus,
)
from ._spec import CallInfo

if TYPE_CHECKING:
    from ._changes import ExecutionRow
    from ._handle import TaskHandle


# The types of `Executor.submit`, `submit_nowait` and `run` (API.md §12): overloads,
# tried in order, each taking ``*args: *Ts`` (the handle is injected, not an argument):
#   async def f(*args) -> T                  -> TaskRef[T]
#   async def f(*args, h: TaskHandle) -> T   -> TaskRef[T] (the handle last, any name)
#   def f(*args) -> T, def f(*args, h) -> T  -> TaskRef[T] (run in a thread)
#   a keyword-only ``handle``/``task_handle`` -> TaskRef[Any]: the arguments are
#     checked, not the value (mypy solves no return type through a TypeVarTuple protocol).
# A `TaskSpec` is typed like its function. The overloads sit under TYPE_CHECKING (the
# facade's classes stay small); the implementations take ``*args: object`` (mypy
# matches no ``*args: Any`` with ``*Ts`` there).
Ts = TypeVarTuple("Ts")
R = TypeVar("R")


class RunOptions(TypedDict, total=False):
    """`Executor.run`'s keyword options, as its overloads type them."""

    keep_result: bool | None
    dedupe_key: str | None
    dedupe_window: float | None
    detached: bool


class SubmitOptions(RunOptions, total=False):
    """`Executor.submit`'s keyword options (`RunOptions`' and these), as its overloads type them."""

    name: str | None
    task_id: str | None
    timeout: float | None
    budget: float | None
    correlation_id: str | None
    key: str | None
    priority: int | None


class TakesHandleKeyword(Protocol[*Ts]):
    """A task function taking ``*args`` and the handle as keyword-only ``handle``."""

    def __call__(self, *args: *Ts, handle: TaskHandle) -> object: ...


class TakesTaskHandleKeyword(Protocol[*Ts]):
    """A task function taking ``*args`` and the handle as keyword-only ``task_handle``."""

    def __call__(self, *args: *Ts, task_handle: TaskHandle) -> object: ...


class Unread(Protocol):
    """The executor's count of failed tasks whose completion nobody read."""

    def read(self) -> None:
        """A failed job's completion was made, for whoever reads it."""


class Owner(Protocol):
    """What a job asks of the executor it belongs to."""

    def cancel(self, job: Job) -> None: ...
    @property
    def failure(self) -> StoreError | None: ...
    def failure_error(self) -> StoreError: ...
    def hurry(self) -> None:
        """Someone waits for a completion to be durable."""

    @property
    def unread(self) -> Unread: ...

    def waiting_on(self, job: Job) -> str | None: ...

    #: True for an execution of another executor (a deduplicated submission's):
    #: `TaskRef.wait` then waits with `RemoteOwner.wait_remote`
    remote: bool


class RemoteOwner(Owner, Protocol):
    """The owner of an execution another executor runs (`trioexec._remote`)."""

    async def wait_remote(self, job: Job) -> None:
        """Wait until ``job`` has ended in its store, and fill it in from its record."""


@final
@attrs.define(eq=False, weakref_slot=False)
class Extras:
    """What a job uses that most do not: made only for those that do, so that a
    plain task pays for none of it (`Job.extras`)."""

    #: keep its value in the store as JSON (None: as its executor does)
    keep_result: bool | None = None
    #: ``submit(dedupe_key=...)``: with a store, its row was stored as it took the key
    dedupe_key: str | None = None
    #: the task of its executor that submitted it (the task tree); None for a
    #: root, or a recovered child (it knows only ``parent_id``)
    parent: Job | None = None
    parent_id: str | None = None
    #: its unfinished children (cancelled with it)
    children: set[Job] | None = None
    #: the earliest of its ancestors' deadlines when it was submitted (Trio's
    #: clock), and which ancestor's it is
    deadline: float = math.inf
    deadline_of: str | None = None
    #: the ancestor whose cancel or deadline ended it, if one did
    ended_by: str | None = None
    #: its parent ended while it was pending: its inherited deadline has an entry
    #: in `Lifecycle`'s deadlines (cleared as the entry goes stale or is taken)
    watched: bool = False
    #: (with a ``budget``) the seconds its attempts held a slot so far, and
    #: whether they passed the budget
    active_seconds: float = 0.0
    budget_exceeded: bool = False


@final
@attrs.define(eq=False, repr=False, weakref_slot=False)
class Job:
    """One accepted (or refused) submission, as the executor's parts see it."""

    owner: Owner
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    info: CallInfo
    task_id: str
    name: str
    timeout: float | None
    budget: float | None
    correlation_id: str | None
    causation_id: str | None
    submitted_at: float
    #: (with a store) True until its completion is durable
    pending_ack: bool
    #: one plain async call (no retries, timeout or budget): the workers' fast path
    simple: bool
    run_id: str | None = None  # the workflow run it is a step of
    key: str | None = None  # its admission key (`KeyLimit`)
    priority: int = 0
    #: called once it has ended (with a store: once that is durable), or the store failed
    on_done: Callable[[Job], None] | None = None
    #: what it uses that most tasks do not (None: nothing of it)
    extras: Extras | None = None
    status: TaskStatus = PENDING
    attempts: int = 0
    cancel_requested: bool = False
    paused: bool = False  # queued, but held out of the queue by a pause (`Pauses.parked`)
    deadline: float = math.inf  # the running attempt's timeout, on Trio's clock
    handle: TaskHandle | None = None
    scope: trio.CancelScope | None = None  # set once a worker has taken it
    done: trio.Event | None = None  # made by the first waiter
    completion: TaskCompletion[Any] | None = None
    result: Any = None
    error: BaseException | None = None
    version: int = 1  # the store's fencing version (-1: nothing more may be written)
    started_at: float | None = None
    finished_at: float = 0.0
    #: (with a store) its `ExecutionRow` while the journal may still fold into it
    row: ExecutionRow | None = None
    row_batch: int = -1  # the journal batch that row is in

    @property
    def ended(self) -> bool:
        """True once the execution has its completion."""
        status = self.status
        return status is not PENDING and status is not RUNNING

    @property
    def waited_on(self) -> bool:
        """Someone waits for its end (`TaskRef.wait`, or an ``on_done`` callback)."""
        return self.done is not None or self.on_done is not None

    def wake_waiters(self) -> None:
        """It has ended (with a store: durably), or the store failed: tell whoever
        waits (each finds out which by looking at it)."""
        if self.done is not None:
            self.done.set()
        if self.on_done is not None:
            self.on_done(self)

    def make_completion(self) -> TaskCompletion[Any]:
        """The `TaskCompletion` of an ended job (made once)."""
        if self.completion is None:
            handle = self.handle
            self.completion = TaskCompletion(
                task_id=self.task_id,
                name=self.name,
                status=self.status,
                result=self.result,
                error=self.error,
                attempts=self.attempts,
                submitted_at=self.submitted_at,
                started_at=self.started_at,
                finished_at=self.finished_at,
                deferred_seconds=0.0 if handle is None else handle.deferred_seconds,
                budget_exceeded=self.extras is not None and self.extras.budget_exceeded,
                correlation_id=self.correlation_id,
                causation_id=self.causation_id,
            )
            # The completion holds what a waiter needs; drop the call itself.
            self.fn = self.args = None  # type: ignore[assignment]
            if self.status in FAILURES and self.run_id is None:
                self.owner.unread.read()  # (`trioexec._machine._lifecycle.UnreadFailures`)
        return self.completion

    def __repr__(self) -> str:
        return f"<Job {self.task_id!r} {self.name!r} {self.status.value}>"


class TaskRef(Generic[T_co]):
    """One accepted (or refused) submission: its status now, and its completion later.

    Generic in the task's value: ``ex.submit(fn, ...)`` of ``async def fn(...) -> T``
    (or a plain ``def``) gives a ``TaskRef[T]``, and ``await ref.wait()`` a
    ``TaskCompletion[T]``.
    """

    __slots__ = ("_job",)

    #: Whether this submission made no execution of its own (it found another
    #: with its ``dedupe_key`` live or completed recently, and this is that one's).
    deduplicated: bool = False

    def __init__(self, job: Job) -> None:
        self._job = job

    @property
    def task_id(self) -> str:
        """The execution id."""
        return self._job.task_id

    @property
    def name(self) -> str:
        """The task's name (the function's qualified name unless given)."""
        return self._job.name

    @property
    def status(self) -> TaskStatus:
        """The execution's `TaskStatus` now."""
        return self._job.status

    @property
    def sub_status(self) -> SubStatus | None:
        """`SubStatus.ACTIVE` or `SubStatus.DEFERRED` while RUNNING, else None."""
        job = self._job
        if job.status is not RUNNING:
            return None
        return ACTIVE if job.handle is None else job.handle.sub_status

    @property
    def key(self) -> str | None:
        """Its admission key (`KeyLimit`), or None."""
        return self._job.key

    @property
    def priority(self) -> int:
        """Its priority (higher starts first)."""
        return self._job.priority

    @property
    def dedupe_key(self) -> str | None:
        """Its submission's ``dedupe_key``, or None."""
        extras = self._job.extras
        return None if extras is None else extras.dedupe_key

    @property
    def parent_id(self) -> str | None:
        """The id of the task of its executor that submitted it, or None for a
        root (submitted from outside a task, or with ``detached=True``)."""
        extras = self._job.extras
        return None if extras is None else extras.parent_id

    @property
    def waiting_on(self) -> str | None:
        """Why it is not running now: ``"slot"``, ``"key concurrency <key>"``,
        ``"rate limit <key>"``, ``"retry backoff"``, ``"event"`` or
        ``"condition <name>"`` (deferred); None while it runs or once it ended."""
        return self._job.owner.waiting_on(self._job)

    @property
    def done(self) -> bool:
        """True once the execution has its completion."""
        return self._job.ended

    @property
    def completion(self) -> TaskCompletion[T_co] | None:
        """The `TaskCompletion`, or None while the task has not finished."""
        job = self._job
        return job.make_completion() if job.ended else None

    async def wait(self) -> TaskCompletion[T_co]:
        """Wait until the task ends and return its `TaskCompletion`. A checkpoint.

        Cancelling the wait does not cancel the task (use `cancel`). A
        deduplicated ref of an execution another executor runs (or ran) waits
        for it in the store: its completion's ``result`` is the kept result, and
        the ``error`` of one that ended otherwise is a `TaskFailed`.

        Raises:
          StoreError: the executor's store failed before this completion was
            durable (the executor has stopped; the wait never hangs).
        """
        job = self._job
        if not job.ended or job.pending_ack:
            owner = job.owner
            if owner.remote:
                await cast(RemoteOwner, owner).wait_remote(job)
            elif owner.failure is None:
                if job.done is None:
                    job.done = trio.Event()
                if job.pending_ack and job.ended:
                    owner.hurry()  # finished, not durable yet: no gathering for it
                await job.done.wait()
            else:
                await trio.lowlevel.checkpoint()
            if owner.failure is not None and (not job.ended or job.pending_ack):
                raise owner.failure_error()
        else:
            await trio.lowlevel.checkpoint()
        return job.make_completion()

    def cancel(self) -> None:
        """Ask the task to stop: a pending task ends ``CANCELLED`` at once; a running
        or deferred one has ``handle.cancelled()`` fire and its scope cancelled.
        Its unfinished descendants end too (see `Executor.submit`), also once it
        has ended itself. Never blocks; otherwise does nothing if it ended."""
        self._job.owner.cancel(self._job)

    def __repr__(self) -> str:
        job = self._job
        return f"<TaskRef {job.task_id!r} {job.name!r} {job.status.value}>"


@final
class DuplicateRef(TaskRef[T_co]):
    """The `TaskRef` a deduplicated submission returns: the execution's that holds its key."""

    __slots__ = ()
    deduplicated = True
