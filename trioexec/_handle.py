"""`TaskHandle`: what a running task uses to give its slot back while it waits.

``await handle.defer_until(condition)`` releases the task's slot, waits for the
condition without one, and takes a slot back (FIFO) before returning. The task's
coroutine is simply parked meanwhile, so its local state is untouched.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, final

import trio
from trio_util import AsyncValue

from ._backoff import Backoff
from ._errors import TaskCancelled
from ._poller import Poller
from ._records import ACTIVE, DEFERRED, TYPED, SubStatus, check_number
from ._slots import SlotToken

if TYPE_CHECKING:
    from typing import TypeAlias

    Condition: TypeAlias = Any


class _Observer(Protocol):
    """The executor side of a handle, told of every sub-status change
    synchronously; ``job`` is the executor's record of the task."""

    def deferred(self, handle: TaskHandle, job: Any) -> None: ...
    def resumed(self, handle: TaskHandle, job: Any) -> None: ...
    def reclaim_deadline(self, job: Any) -> float: ...
    def poller(self) -> Poller | None: ...
    async def reclaim(self, job: Any, slot: SlotToken) -> None: ...
    async def thread_resumed(self, handle: TaskHandle) -> None: ...
    def thread_lend_ended(self, handle: TaskHandle) -> None: ...


def _check_poll_interval(interval: float | Backoff) -> None:
    if type(interval) is float and 0 < interval < math.inf:
        return  # (the common case, without a call: every `defer_until` checks it)
    if not isinstance(interval, Backoff):
        must, typed = "a finite number > 0", "a number or a Backoff"
        check_number(
            "poll_interval", interval, float, must, typed=typed, gt=0, lt=math.inf, errors=TYPED
        )


class _Waiter:
    """A condition, classified once: how to check it now and how to wait for it."""

    __slots__ = ("_condition", "_kind", "_poll_interval", "_sync")

    VALUE = 0  # trio-util AsyncValue / AsyncBool: wait_value(bool)
    WAITABLE = 1  # trio.Event or anything with an async wait()
    PREDICATE = 2  # zero-argument callable -> bool | Awaitable[bool]
    DEADLINE = 3  # a number: a deadline on Trio's clock (trio.sleep_until)

    def __init__(self, condition: Any, poll_interval: float | Backoff) -> None:
        _check_poll_interval(poll_interval)
        self._condition = condition
        self._poll_interval = poll_interval
        self._sync = False  # a predicate that returned a plain value when first checked
        if isinstance(condition, AsyncValue):
            self._kind = self.VALUE
        elif isinstance(condition, int | float) and not isinstance(condition, bool):
            # A deadline on Trio's clock, as a float (an int past a float's range is
            # ±inf: never, or passed).
            self._condition = check_number(
                "defer_until's deadline", condition, float, "a number", ge=-math.inf
            )
            self._kind = self.DEADLINE
        elif inspect.iscoroutinefunction(getattr(condition, "wait", None)):
            self._kind = self.WAITABLE
        elif callable(condition):
            self._kind = self.PREDICATE
        elif callable(getattr(condition, "is_set", None)):
            # e.g. threading.Event: its wait() would block the event loop, so poll is_set().
            self._condition = condition.is_set
            self._kind = self.PREDICATE
        elif inspect.iscoroutine(condition):
            condition.close()  # (never to be awaited: no "never awaited" warning)
            raise TypeError(
                f"defer_until got a coroutine object, {condition!r}: pass the async"
                " function itself (defer_until(ready), not defer_until(ready()))"
            )
        else:
            raise TypeError(
                "defer_until needs a trio.Event, an object with an async wait(), "
                "a trio-util AsyncValue, a zero-argument callable, or a deadline "
                f"(a number, on Trio's clock); got {condition!r}"
            )

    async def holds(self) -> bool:
        """Check the condition now (the fast path). May await an async predicate."""
        cond = self._condition
        if self._kind == self.VALUE:
            return bool(cond.value)
        if self._kind == self.DEADLINE:
            return bool(trio.current_time() >= cond)
        if self._kind == self.WAITABLE:
            is_set = getattr(cond, "is_set", None)
            return bool(is_set()) if callable(is_set) else False
        result = cond()
        if inspect.isawaitable(result):
            result = await result
        else:
            self._sync = True
        return bool(result)

    async def wait(self, poller_for: Callable[[], Poller | None] | None) -> None:
        """Wait until the condition holds (it did not a moment ago). A sync
        predicate is handed to the poller ``poller_for()`` gives, if any."""
        cond = self._condition
        if self._kind == self.VALUE:
            await cond.wait_value(bool)
        elif self._kind == self.DEADLINE:
            await trio.sleep_until(cond)
        elif self._kind == self.WAITABLE:
            await cond.wait()
        elif self._sync and poller_for is not None and (poller := poller_for()) is not None:
            await poller.wait(cond, self._poll_interval)
        else:
            interval, n = self._poll_interval, 0
            while True:
                n += 1
                await trio.sleep(interval.delay(n) if isinstance(interval, Backoff) else interval)
                result = cond()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return


@final
class TaskHandle:
    """Execution control for one running task, injected by the executor.

    A task asks for it by having a parameter named ``handle`` or ``task_handle``
    (or one annotated ``TaskHandle``). It can also be made by hand for tests:
    ``TaskHandle(await pool.acquire(), task_id="t1")``.
    """

    __slots__ = (
        "_attempt_over",
        "_cancel_event",
        "_cancel_requested",
        "_deferred_at",
        "_deferred_seconds",
        "_in_thread",
        "_job",
        "_observer",
        "_reclaim_scope",
        "_slot",
        "_sub_status",
        "_task_id",
        "_thread_scope",
        "_waiting_for",
    )

    def __init__(
        self,
        slot: SlotToken,
        task_id: str = "",
        *,
        _observer: _Observer | None = None,
        _job: Any = None,
        _in_thread: bool = False,
    ) -> None:
        self._slot = slot
        self._task_id = task_id
        self._observer = _observer
        self._sub_status = ACTIVE
        self._cancel_event: trio.Event | None = None
        self._cancel_requested = False
        self._deferred_at = 0.0
        self._deferred_seconds = 0.0
        self._in_thread = _in_thread  # a sync task, running in a worker thread
        self._job = _job  # the executor's record of this task
        self._reclaim_scope: trio.CancelScope | None = None  # reclaiming after a cancel
        self._thread_scope: trio.CancelScope | None = None  # defer_until_sync's wait
        self._attempt_over = False  # the executor ended the attempt (its thread abandoned)
        self._waiting_for: object = None  # the condition of the deferral under way

    @property
    def task_id(self) -> str:
        """The execution id."""
        return self._task_id

    @property
    def slot(self) -> SlotToken:
        """The task's `SlotToken`."""
        return self._slot

    @property
    def sub_status(self) -> SubStatus:
        """`SubStatus.DEFERRED` from the moment `defer_until` gives the slot back
        until it holds one again (queueing to reclaim included); otherwise
        `SubStatus.ACTIVE`."""
        return self._sub_status

    @property
    def deferred_seconds(self) -> float:
        """Total time spent deferred so far, on Trio's clock."""
        total = self._deferred_seconds
        if self._sub_status is DEFERRED:
            total += trio.current_time() - self._deferred_at
        return total

    @property
    def cancel_requested(self) -> bool:
        """True once the executor has asked this task to stop."""
        return self._cancel_requested

    async def cancelled(self) -> None:
        """Return once the executor asks this task to stop (shutdown ``CANCEL``,
        ``ref.cancel()``, a lost lease). A checkpoint; returns at once if it already has."""
        if self._cancel_event is None:
            self._cancel_event = trio.Event()
            if self._cancel_requested:
                self._cancel_event.set()
        await self._cancel_event.wait()

    def _request_cancel(self) -> None:
        self._cancel_requested = True
        if self._cancel_event is not None:
            self._cancel_event.set()
        if self._reclaim_scope is not None:
            self._reclaim_scope.cancel()  # the task ends: no slot needed for that

    def _end_attempt(self) -> None:
        """The executor is done with this attempt (it ended, or its thread was
        abandoned): a `defer_until_sync` still waiting in that thread stops."""
        self._attempt_over = True
        if self._thread_scope is not None:
            self._thread_scope.cancel()
        if self._reclaim_scope is not None:
            self._reclaim_scope.cancel()

    async def defer_until(self, condition: Condition, poll_interval: float | Backoff = 1.0) -> None:
        """Give the slot back until ``condition`` holds, then take one back (FIFO).

        ``condition`` is one of:

        * a `trio.Event`, or any object with an async ``wait()``: woken at
          once, no polling;
        * a trio-util ``AsyncValue``/``AsyncBool``: woken as soon as its value is
          truthy, no polling;
        * a deadline: a number on Trio's clock, as `trio.sleep_until` takes
          (``trio.current_time() + 30``): woken exactly then, no polling;
        * a function that takes no arguments, called now and then every
          ``poll_interval`` seconds (a float > 0, or a `Backoff` for growing
          intervals) until its result is truthy: a plain function returning a
          bool, or an ``async def`` function (any callable whose result is
          awaitable: it is awaited each time). Pass the function itself
          (``is_ready``), not a call of it: a coroutine object
          (``is_ready()``) is refused with ``TypeError``.

        If the condition already holds, returns at once, releasing nothing;
        otherwise the sub-status is ``DEFERRED`` from the slot's release until a
        slot is reclaimed.

        Always a checkpoint. If the wait is cancelled or the condition raises,
        the slot is reclaimed (shielded) before the exception propagates, so
        code after a ``with trio.move_on_after(...)`` block around this call
        runs holding its slot.

        Raises:
          TypeError: for an unsupported condition or ``poll_interval`` type.
          ValueError: for ``poll_interval <= 0``, or a deadline that is NaN.
          RuntimeError: if the handle's slot is not held when called.

        Example::

            await handle.defer_until(upload_done)                 # a trio.Event
            await handle.defer_until(trio.current_time() + 30)    # a deadline
            await handle.defer_until(lambda: path.exists(), poll_interval=5)
        """
        if not self._slot.is_held:
            raise RuntimeError(f"defer_until called on task {self._task_id!r} without its slot")
        if type(condition) is trio.Event:  # the common case, without a _Waiter
            _check_poll_interval(poll_interval)
            if condition.is_set():
                await trio.lowlevel.checkpoint()
                return
            waiter = None
        else:
            waiter = _Waiter(condition, poll_interval)
            if await waiter.holds():
                await trio.lowlevel.checkpoint()
                return
        self._waiting_for = condition
        self._enter(DEFERRED)
        slot = self._slot
        slot.release()
        try:
            if waiter is None:
                await condition.wait()
            else:
                # An executor offers a shared poller (asked for only if it is needed).
                observer = self._observer
                await waiter.wait(None if observer is None else observer.poller)
        except BaseException:
            self._waiting_for = None
            await self._reclaim_unless_ending(slot)
            raise
        self._waiting_for = None
        try:
            await self._reclaim(slot)
        except trio.Cancelled:  # cancelled while queueing: no slot was taken
            await self._reclaim_unless_ending(slot)
            raise
        self._enter(ACTIVE)

    async def _reclaim(self, slot: SlotToken) -> None:
        observer = self._observer
        if observer is None:
            await slot.reclaim()
        else:  # (the executor takes the task's key back first, if it has one)
            await observer.reclaim(self._job, slot)

    @property
    def waiting_on(self) -> str | None:
        """What a deferred task waits for: ``"event"`` (a `trio.Event` or an object
        with an async ``wait()``), ``"condition <name>"`` (a predicate, or a
        trio-util ``AsyncValue``), ``"deadline"`` (a number), or ``"slot"`` once
        that holds and it queues for a slot again; None while it holds its slot.
        A condition object may say itself what it is, with a str attribute
        ``__trioexec_waiting_on__`` (``trioexec.durable``'s
        ``Promises.settled(id)`` says ``"promise <id>"``)."""
        if self._sub_status is not DEFERRED:
            return None
        condition = self._waiting_for
        if condition is None:
            return "slot"
        named = getattr(condition, "__trioexec_waiting_on__", None)
        if isinstance(named, str):
            return named
        if isinstance(condition, AsyncValue):
            return f"condition {type(condition).__name__}"
        if isinstance(condition, int | float):
            return "deadline"
        if inspect.iscoroutinefunction(getattr(condition, "wait", None)) or callable(
            getattr(condition, "is_set", None)
        ):
            return "event"
        name = getattr(condition, "__qualname__", None) or type(condition).__qualname__
        return f"condition {name}"

    async def _reclaim_unless_ending(self, slot: SlotToken) -> None:
        """The wait was cancelled or failed: take a slot back, shielded, so code
        after a ``move_on_after`` around the wait runs holding one; unless the
        task itself is ending (cancelled by its executor, timed out, its attempt
        over): then it ends at once, deferred, waiting for no slot. (Only the
        exceptional paths pay for this scope.)"""
        observer = self._observer
        deadline = math.inf if observer is None else observer.reclaim_deadline(self._job)
        if self._attempt_over or deadline == -math.inf:
            return  # ending: nothing to take back (not even a place in a key's line)
        with trio.CancelScope(shield=True, deadline=deadline) as self._reclaim_scope:
            await self._reclaim(slot)
        self._reclaim_scope = None
        if slot.is_held:
            self._enter(ACTIVE)
        # else: still DEFERRED; the executor closes the deferral as the task ends

    def defer_until_sync(self, condition: Condition, poll_interval: float | Backoff = 1.0) -> None:
        """`defer_until` for a plain ``def`` task running in a worker thread.

        Blocks only the calling thread (through `trio.from_thread.run`); the slot
        is released and reclaimed exactly as in `defer_until`, and so is the
        task's thread (``thread_workers``): it waits for one to be free again
        before it returns. A predicate is called in the Trio thread, so it must
        be quick; a ``threading.Event`` is polled through its ``is_set()``.

        Raises:
          TaskCancelled: the attempt ended meanwhile (cancelled, timed out): the
            thread has been abandoned and should just unwind.
        """
        trio.from_thread.run(self._defer_from_thread, condition, poll_interval)

    async def _defer_from_thread(
        self, condition: Condition, poll_interval: float | Backoff
    ) -> None:
        # Runs in a Trio system task (the thread may be abandoned), so the
        # executor cancels this scope when the attempt ends.
        observer = self._observer
        with trio.CancelScope() as self._thread_scope:
            if self._attempt_over:
                self._thread_scope.cancel()
            try:
                await self.defer_until(condition, poll_interval)
            except BaseException:
                if self._in_thread and observer is not None:
                    observer.thread_lend_ended(self)
                raise
            if self._in_thread and observer is not None:
                await observer.thread_resumed(self)
        if self._thread_scope.cancelled_caught:
            raise TaskCancelled(f"task {self._task_id!r}: its attempt is over (cancelled)")
        self._thread_scope = None

    def _close_deferral(self) -> None:
        """The task ends while deferred (no slot taken back): stop the clock."""
        self._deferred_seconds += trio.current_time() - self._deferred_at
        self._sub_status = ACTIVE

    def _enter(self, sub_status: SubStatus) -> None:
        now = trio.current_time()
        if sub_status is DEFERRED:
            self._deferred_at = now
        else:
            self._deferred_seconds += now - self._deferred_at
        self._sub_status = sub_status
        observer = self._observer
        if observer is not None:
            if sub_status is DEFERRED:
                observer.deferred(self, self._job)
            else:
                observer.resumed(self, self._job)

    def __repr__(self) -> str:
        return f"<TaskHandle {self._task_id!r} {self._sub_status.value}>"
