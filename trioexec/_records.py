"""State enums and the value objects that describe a finished task."""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any, Final, Generic

import attrs

from ._errors import TaskCancelled, TaskRejected

if TYPE_CHECKING:
    # PEP 696 defaults (typing has them from 3.13), for type checkers only: a bare
    # `TaskCompletion` is `TaskCompletion[Any]`. At run time, plain TypeVars (no
    # dependency, no cost).
    from typing_extensions import TypeVar

    T_co = TypeVar("T_co", covariant=True, default=Any)
else:
    from typing import TypeVar

    T_co = TypeVar("T_co", covariant=True)
N = TypeVar("N", int, float)

MAX_ID_LENGTH = 1000


def check_id(what: str, value: object) -> str:
    """A task id, name or run id: a non-empty str of at most 1,000 characters
    that every store can hold (no lone surrogates, no NUL: PostgreSQL's text
    cannot hold one). Raises ValueError naming it."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a str, got {type(value).__name__} {value!r}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(
            f"{what} is {len(value)} characters long (at most {MAX_ID_LENGTH}): {value[:40]!r}..."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} {value!r} cannot be stored: it holds a lone surrogate (not UTF-8)"
        ) from None
    if "\x00" in value:
        raise ValueError(f"{what} {value!r} cannot be stored: it holds a NUL character")
    return value


def storable(value: str) -> bool:
    """Whether a store can hold ``value`` (else nothing stored can equal or hold it)."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def matchable(what: str, value: object) -> bool:
    """A text a store's lookup is asked for (`Store.execution`'s task id, a filter
    of `Store.executions`): False if no store can hold it (a NUL, a lone surrogate),
    so nothing stored matches it: the one rule of every store's lookups. Raises
    TypeError naming a value that is not a str."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__} {value!r}")
    return storable(value)


MAX_TEXT = 10_000


def safe_repr(obj: object) -> str:
    """``repr(obj)`` as text any store can hold: never raising (a broken
    ``__repr__``), lone surrogates escaped, at most ``MAX_TEXT`` characters."""
    try:
        text = repr(obj)
    except Exception as exc:  # a user exception with a broken __repr__
        return f"<unrepresentable {type(obj).__name__}: {type(exc).__name__}>"
    return storable_text(text)


def storable_text(text: str) -> str:
    """``text`` (an error message, say) as every store can hold it: lone surrogates
    and NUL escaped (``\\udc80``, ``\\x00``), cut to ``MAX_TEXT`` characters."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if len(text) > MAX_TEXT:
        text = f"{text[:MAX_TEXT]}... ({len(text) - MAX_TEXT} more characters)"
    return text


#: The range a 64-bit signed integer column holds (SQLite's INTEGER, PostgreSQL's
#: bigint): every int a store keeps or compares in SQL is within it.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _number(value: object) -> str:
    """``repr(value)``, short for an int of hundreds of digits (whose ``repr``
    may even raise: Python converts at most 4,300 digits)."""
    if isinstance(value, int) and value.bit_length() > 128:
        sign = "a negative" if value < 0 else "an"
        return f"{sign} int of {math.floor(math.log10(abs(value))) + 1} digits"
    return safe_repr(value)


def _int64(lowest: float | None) -> str:
    """What a 64-bit column holds, from ``lowest`` (None: its least)."""
    return f"an int from {'-2**63' if lowest is None else lowest} to 2**63 - 1"


#: `check_number`'s ``errors`` where a value that is no number is a TypeError.
TYPED = (TypeError, ValueError)


def check_number(
    what: str,
    value: object,
    kind: type[N],
    must: str,
    *,
    typed: str = "",
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    errors: tuple[type[Exception], type[Exception]] = (ValueError, ValueError),
    hint: str = "",
    stored: bool = False,
) -> N:
    """``value``, a number given by the user, checked: the one rule of every such
    number. It must be of ``kind`` (``int``; ``float``: an int or a float, returned
    as a float), not a bool, and within the bounds given (NaN is within none); an int
    no float holds counts as infinite. Else ``errors[0]`` for a value of another
    type, ``errors[1]`` for one out of bounds: "``what`` must be ``must`` (``typed``,
    if given, for the type), got <the value>``hint``".

    With ``stored`` (a store keeps the value): an int no float holds is refused
    (ValueError), an int must fit a 64-bit column (ValueError), and the value is
    shown as `_number` shows it."""
    shown = _number if stored else repr
    if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)):
        raise errors[0](f"{what} must be {typed or must}, got {shown(value)}")
    exact: float = value  # (compared as given: an int keeps all its digits)
    number: float = value
    if kind is float:
        try:
            number = float(value)
        except OverflowError:
            if stored:
                raise ValueError(
                    f"{what} is too large for a float (a number of seconds), got {_number(value)}"
                ) from None
            exact = number = math.inf if value > 0 else -math.inf
    if not (
        (gt is None or exact > gt)
        and (ge is None or exact >= ge)
        and (lt is None or exact < lt)
        and (le is None or exact <= le)
    ):
        raise errors[1](f"{what} must be {must}, got {shown(value)}{hint}")
    if stored and kind is int and not INT64_MIN <= exact <= INT64_MAX:
        raise ValueError(f"{what} must be {_int64(ge)}, got {_number(value)}")
    return number  # type: ignore[return-value]  # (an int for kind int)


def check_seconds(name: str, value: object) -> None:
    """None, or a finite number of seconds > 0. (On the submit path: the common
    case, an int or a float from 0 to 2**1023, is taken without a call.)"""
    if value is None or ((type(value) is float or type(value) is int) and 0 < value < 2.0**1023):
        return
    must, typed = "a finite number of seconds > 0", "a number of seconds or None"
    check_number(name, value, float, must, typed=typed, gt=0, lt=math.inf, errors=TYPED)


def stored_int(what: str, value: object, *, minimum: int | None = None) -> int:
    """``value`` if it is an int (not a bool) from ``minimum`` to 2**63 - 1, as a
    64-bit column holds it (a version, say); else ValueError naming ``what`` and
    the value."""
    return check_number(what, value, int, _int64(minimum), typed="an int", ge=minimum, stored=True)


class Overflow(enum.StrEnum):
    """What `Executor.submit` does when pending + active + deferred is at capacity."""

    BLOCK = "block"  #: wait for space (``submit_nowait`` rejects instead)
    REJECT = "reject"  #: raise `TaskRejected`
    DROP_NEWEST = "drop_newest"  #: the new submission completes at once as ``DROPPED``
    DROP_OLDEST = "drop_oldest"  #: the oldest pending submission is dropped; the new one queues
    FAIL_FAST = "fail_fast"  #: raise `CapacityExceeded` (reason ``capacity_exceeded``)


class HealthEventKind(enum.StrEnum):
    """What a `HealthEvent` reports."""

    TASK_REJECT = "task_reject"
    TASK_DROP = "task_drop"
    TASK_DEFERRED = "task_deferred"
    TASK_RESUMED = "task_resumed"
    TASK_FAILED = "task_failed"
    TASK_RETRY_SCHEDULED = "task_retry_scheduled"
    TASK_ABANDONED = "task_abandoned"
    WORKFLOW_PROGRESS = "workflow_progress"
    SHUTDOWN_GRACE_EXPIRED = "shutdown_grace_expired"
    SCHEDULE_SKIPPED = "schedule_skipped"


TASK_DEFERRED: Final = HealthEventKind.TASK_DEFERRED  # (a deferral's: as `RUNNING`)
TASK_RESUMED: Final = HealthEventKind.TASK_RESUMED


class ShutdownPolicy(enum.StrEnum):
    """What happens to outstanding work when the executor shuts down."""

    DRAIN = "drain"  #: refuse new work; run everything queued and deferred to the end
    CANCEL_PENDING = "cancel_pending"  #: drop the queue; let running and deferred tasks finish
    CANCEL = "cancel"  #: drop the queue and cancel running and deferred tasks


class TaskStatus(enum.StrEnum):
    """Where an execution is in its life. Terminal: everything but PENDING and RUNNING."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    DROPPED = "dropped"
    REJECTED = "rejected"


# The members as module constants, for the hot path: on Python 3.11 a member
# read off its class goes through `enum.EnumType.__getattr__`'s hook (about 800
# instructions a read; 3.12 dropped the hook), a global is a dict lookup.
PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMED_OUT, DROPPED, REJECTED = TaskStatus

#: The ends of a task that failed: its completion is a failure (counted unread
#: until read), its row a dead letter.
FAILURES = (FAILED, TIMED_OUT)


class SubStatus(enum.StrEnum):
    """What a RUNNING execution is doing: holding a slot, or waiting without one."""

    ACTIVE = "active"
    DEFERRED = "deferred"


ACTIVE, DEFERRED = SubStatus  # (as `RUNNING`)


@attrs.frozen(kw_only=True)
class TaskCompletion(Generic[T_co]):
    """How one execution ended. Exactly one exists per accepted submission.

    Generic in the task's value: a ``TaskRef[T]``'s ``wait()`` returns a
    ``TaskCompletion[T]``, whose `unwrap` returns that ``T`` or raises the task's error.

    ``error`` is the exception object (or None).
    ``submitted_at``/``started_at``/``finished_at`` are wall-clock Unix seconds
    (``started_at`` is None if the task never started); ``deferred_seconds`` is
    measured on Trio's clock.
    """

    task_id: str
    name: str
    status: TaskStatus
    #: the return value (a ``T`` when ``ok``; None otherwise)
    result: T_co = None  # type: ignore[assignment]
    error: BaseException | None = None
    attempts: int = 0
    submitted_at: float = 0.0
    started_at: float | None = None
    finished_at: float = 0.0
    deferred_seconds: float = 0.0
    budget_exceeded: bool = False
    correlation_id: str | None = None
    causation_id: str | None = None

    @property
    def ok(self) -> bool:
        """True when the task returned normally."""
        return self.status is TaskStatus.COMPLETED

    def unwrap(self) -> T_co:
        """The task's value if it completed, else its error raised (what `Executor.run`
        does with a completion).

        Raises:
          BaseException: the task's own exception, as it is, if it failed or
            timed out (`TaskTimeout`).
          TaskCancelled: it was cancelled without an error of its own.
          TaskRejected: it was dropped or rejected.
        """
        status = self.status
        if status is TaskStatus.COMPLETED:
            return self.result
        if self.error is not None:
            raise self.error
        if status is TaskStatus.CANCELLED:
            raise TaskCancelled(f"task {self.name!r} ({self.task_id}) was cancelled")
        raise TaskRejected(f"task {self.name!r} ({self.task_id}) was {status.value}")


@attrs.frozen(kw_only=True)
class ExecutionRecord:
    """One execution as a store has it (see `Store.executions`).

    Times are wall-clock Unix seconds from the store's clock. ``sub_status`` is set
    only while ``status`` is RUNNING. ``lease_expires_at`` is the owner's lease
    (one per executor, renewed by its heartbeat). ``key`` and ``priority`` are
    the submission's admission key (None: no key) and priority, as submitted (not
    aged). ``waiting_on`` is why a live execution is not running, as its executor
    last journaled it (`TaskRef.waiting_on`: ``"slot"``, ``"key concurrency <key>"``,
    ``"rate limit <key>"``, ``"paused"``, ``"retry backoff"``, ``"event"``,
    ``"condition <name>"``, ``"promise <id>"``); None while it runs or once it
    ended. ``traceback`` is the formatted traceback of the error that ended a
    FAILED or TIMED_OUT execution (None otherwise); both are None in rows written
    before the stores recorded them. A requeued execution keeps its last error
    and traceback until its next attempt ends. ``result_kept`` is True for a
    COMPLETED execution whose value was kept (`open_executor`'s ``keep_results``,
    or the task's or submission's ``keep_result``), and ``result`` is that value
    decoded from its JSON (None when not kept). ``dedupe_key`` is the
    submission's (``submit(dedupe_key=...)``); ``parent_id`` names the task of its
    executor that submitted it (None for a root).
    """

    task_id: str
    name: str
    run_id: str | None = None
    status: TaskStatus = TaskStatus.PENDING
    sub_status: SubStatus | None = None
    attempt: int = 0
    recovery_attempts: int = 0
    owner: str | None = None
    lease_expires_at: float | None = None
    version: int = 1
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    deferred_since: float | None = None
    error: str | None = None
    spec_id: str | None = None
    args: str | None = None  # JSON array of the arguments; None if they were not JSON
    key: str | None = None
    priority: int = 0
    waiting_on: str | None = None
    traceback: str | None = None
    dedupe_key: str | None = None
    parent_id: str | None = None
    result_kept: bool = False
    result: Any = None

    @property
    def recreatable(self) -> bool:
        """True if recovery can run it again (a registered spec id and JSON arguments)."""
        return self.spec_id is not None and self.args is not None

    def owner_gone_for(self, now: float) -> float | None:
        """Seconds since this live execution's owner stopped holding it: its lease
        expired (nothing heartbeats it) or it has no owner (requeued: 0.0). None
        once it ended, or while a live owner holds it; ``now`` on the store's clock."""
        if self.status is not TaskStatus.PENDING and self.status is not TaskStatus.RUNNING:
            return None
        if self.owner is None:
            return 0.0
        expires = self.lease_expires_at
        if expires is None or expires > now:
            return None
        return now - expires

    def owner_note(self, now: float) -> str | None:
        """What becomes of a live execution nobody holds (see `owner_gone_for`),
        in words for the CLI and the dashboard; None if it ended or is held."""
        gone = self.owner_gone_for(now)
        if gone is None:
            return None
        since = "no owner" if self.owner is None else f"owner gone {age(gone)} ago"
        if self.run_id is not None:  # (a step: recovery resumes its workflow run)
            return f"{since}; an executor with recover=True will resume its run"
        if self.recreatable:
            return f"{since}; an executor with recover=True will run it again"
        return f"{since}; orphaned: it cannot be re-created, recovery will fail it"


def age(seconds: float, *, tenths: bool = False, days: bool = True) -> str:
    """``seconds`` as a person reads an age, in the largest unit it reaches: whole
    units rounded down (40s, 3m, 2h, 5d), or with ``tenths`` (40.0s, 3.5m); without
    ``days``, hours are the largest (36.0h). A negative age (two clocks) reads 0.
    The one rule for the owner notes, the CLI's and the dashboard's ages."""
    seconds = max(0.0, seconds)
    units = _UNITS if days else _UNITS[1:]
    unit, size = next(((u, n) for u, n in units if seconds >= n), ("s", 1))
    return f"{seconds / size:.1f}{unit}" if tenths else f"{int(seconds // size)}{unit}"


_UNITS = (("d", 86400), ("h", 3600), ("m", 60))
