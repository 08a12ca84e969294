"""`ExecutorCore`: the parts of one executor, wired together, and the submission path
that runs through them: `new_job` checks a submission, the `Gate` decides, the
`Lifecycle` accepts and hands the job to the `Workers`. Both facades hold one.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, final

import attrs
import trio

from ._admission import Gate
from ._causation import current_job
from ._control import Control
from ._dedupe import Dedupes
from ._events import EventStream
from ._journal import Journal
from ._keyshare import KeyBroker
from ._machine._admit import Admit
from ._machine._keys import KeyLimit, KeyState, check_key, key_limits_for
from ._machine._lifecycle import Lifecycle, journal_waiting
from ._machine._pending import Pending
from ._metrics import ExecutorMetrics, Tally
from ._records import (
    TYPED,
    ExecutionRecord,
    Overflow,
    ShutdownPolicy,
    check_id,
    check_number,
    check_seconds,
)
from ._recovery import RecoverableRuns, Recovery
from ._shutdown import Shutdown
from ._slots import SlotPool
from ._spec import CallInfo, TaskSpec, call_info, check_priority, spec_key, task_name
from ._store import Store
from ._taskref import Extras, Job
from ._waits import LifecycleWaits, Timer
from ._workers import Workers


def check_grace(name: str, value: object) -> None:
    """A shutdown's grace: None (no limit) or a finite number of seconds >= 0."""
    if value is not None:
        must, typed = "a finite number of seconds >= 0", "a number of seconds or None"
        check_number(name, value, float, must, typed=typed, ge=0, lt=math.inf, errors=TYPED)


Validator = Callable[[Any, "attrs.Attribute[Any]", object], object]


def _validator(check: Callable[[str, object], object]) -> Validator:
    """``check(name, value)`` as an attrs validator."""
    return lambda _, attribute, value: check(attribute.name, value)


def _int_at_least(minimum: int) -> Validator:
    """An attrs validator: an int (not a bool) >= ``minimum``."""
    return lambda _, attribute, value: check_number(
        attribute.name, value, int, f">= {minimum}", typed="an int", ge=minimum, errors=TYPED
    )


_seconds = _validator(check_seconds)


def _check_fairness(name: str, value: object) -> None:
    """``fairness=``: None (submission order) or ``"keys"`` (round-robin over keys)."""
    if value is not None and value != "keys":
        raise ValueError(f"{name} must be None or 'keys', got {value!r}")


def check_bool(name: str, value: object) -> None:
    """A bool option (``keep_results``, ``keep_result``, ``detached``; None, where
    it may be, is checked by the caller)."""
    if type(value) is not bool:
        raise TypeError(f"{name} must be a bool, got {value!r}")


@attrs.frozen(kw_only=True)
class ExecutorConfig:
    """The options of `open_executor`, validated once (a bad one raises
    ``TypeError`` or ``ValueError`` naming it and the value)."""

    max_concurrent_tasks: int = attrs.field(default=4, validator=_int_at_least(1))
    queue_capacity: int = attrs.field(default=1024, validator=_int_at_least(0))
    overflow: Overflow = attrs.field(default=Overflow.BLOCK, converter=Overflow)
    shutdown_policy: ShutdownPolicy = attrs.field(
        default=ShutdownPolicy.DRAIN, converter=ShutdownPolicy
    )
    thread_workers: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_int_at_least(1))
    )
    event_capacity: int = attrs.field(default=1024, validator=_int_at_least(1))
    task_budget: float | None = attrs.field(default=None, validator=_seconds)
    lease: float = attrs.field(default=30.0, validator=_seconds)
    max_recovery_attempts: int = attrs.field(default=3, validator=_int_at_least(0))
    # (A dict: left out of the hash, so a config stays hashable.)
    key_limits: dict[str, KeyLimit] = attrs.field(
        factory=dict, converter=key_limits_for, hash=False
    )
    priority_aging: float | None = attrs.field(default=60.0, validator=_seconds)
    shutdown_grace: float | None = attrs.field(default=None, validator=_validator(check_grace))
    fairness: str | None = attrs.field(default=None, validator=_validator(_check_fairness))
    keep_results: bool = attrs.field(default=False, validator=_validator(check_bool))

    @property
    def capacity(self) -> int:
        """The admission bound over pending + active + deferred."""
        return self.max_concurrent_tasks + self.queue_capacity


def adopt(parent: Job, child: Job) -> None:
    """``child`` was submitted by ``parent``'s code (the task tree): its deadline is
    never later than its ancestors', and once accepted it is one of the parent's
    children (`Lifecycle.use_extras`: a submission refused or still waiting for
    room is nobody's to end)."""
    extras = child.extras
    assert extras is not None
    extras.parent, extras.parent_id = parent, parent.task_id
    if parent.extras is None:
        parent.extras = Extras()
    above = parent.extras
    # (the parent's running attempt's deadline, which its own inherited one may be)
    deadline, of = parent.deadline, parent.task_id
    if above.deadline <= deadline and above.deadline_of is not None:
        deadline, of = above.deadline, above.deadline_of
    if deadline < math.inf:
        extras.deadline, extras.deadline_of = deadline, of
        child.simple = False  # (its attempts run under that deadline)


def check_store(store: object) -> None:
    """``store=``: None or something with the `Store` operations."""
    if store is not None and not callable(getattr(store, "write", None)):
        raise TypeError(f"store must be a trioexec Store (e.g. SQLiteStore), got {store!r}")


@final
class ExecutorCore:
    """One executor's parts, and its submission path."""

    def __init__(
        self,
        config: ExecutorConfig,
        store: Store | None = None,
        specs: dict[str, TaskSpec] | None = None,
        share_keys: bool = True,
        inline: bool = False,
        runs: Callable[[ExecutorCore], RecoverableRuns] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.owner_id = owner = uuid.uuid4().hex
        self.wall = wall = time.time if store is None else store.clock
        self.tally = tally = Tally()
        self.events = events = EventStream(config.event_capacity)
        # With a store, limited keys are shared with every executor on it.
        shared = share_keys and store is not None and bool(config.key_limits)
        # Each part is made after the parts it calls, and told of them as it is made;
        # what the queue and the journal decide reaches later parts through this core
        # (its Listener methods, and `_written`).
        self.pending = pending = Pending(
            trio.current_time,
            config.key_limits,
            config.priority_aging,
            self.wall,
            shared,
            inline,
            self,
            config.fairness,
        )
        self.key_timer = Timer(pending.keys.timers.next, pending.keys.tick, "trioexec key timer")
        self.slots = slots = SlotPool(config.max_concurrent_tasks)
        self.journal = journal = None if store is None else Journal(store, self._written)
        self.keyshare = keyshare = (
            None
            if journal is None or not shared
            else KeyBroker(pending, journal, owner, lambda: slots.available - pending.startable)
        )
        self.gate = gate = Gate(config.capacity, config.overflow, tally, pending, journal, events)
        # (The workflow runs are made first: the lifecycle tells them of their steps.)
        self.runs = None if runs is None else runs(self)
        self.lifecycle = lifecycle = Lifecycle(
            tally, pending, gate, events, journal, wall, owner, self, self.runs, config.keep_results
        )
        self.waits = LifecycleWaits(lifecycle)
        self.deadline_timer = Timer(lifecycle.next_deadline, lifecycle.expire, "trioexec deadlines")
        self.dedupes = Dedupes(
            lifecycle, journal, self.owner_id, self.check_new_id, lambda: self.shutdown.check_open()
        )
        self.workers = Workers(
            slots,
            self.lifecycle,
            config.thread_workers or config.max_concurrent_tasks,
            (self.key_timer, self.deadline_timer),
            None if keyshare is None else keyshare.slot_freed,
        )
        if keyshare is not None:
            slots.on_resize(keyshare.slot_freed)
        self.shutdown = Shutdown(self.gate, lifecycle, self.waits, self.workers)
        self.recovery = (
            None
            if journal is None
            else Recovery(
                journal,
                lifecycle,
                self.waits,
                self.gate,
                self.shutdown,
                self.events,
                self.owner_id,
                specs or {},
                self._recovered,
                self.runs,
            )
        )
        # (A DeterministicExecutor keeps its pauses, like its limits, to itself.)
        self.control = Control(
            pending,
            self.lifecycle,
            journal if share_keys else None,
            self.owner_id,
            None if self.recovery is None else self.recovery.poke,
        )
        self._id_prefix = uuid.uuid4().hex[:12] + "-"
        self._ids = itertools.count(1)
        self._last_fn: object = None
        self._last_info = CallInfo(True, None)
        self._last_name = ""
        self._last_spec: TaskSpec | None = None
        self._last_plain = -1
        self._good_keys: set[str] = set()

    # ------------------------------------------------------------ submission

    def new_job(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        name: str | None,
        task_id: str | None,
        timeout: float | None,
        budget: float | None,
        correlation_id: str | None,
        run_id: str | None = None,
        key: str | None = None,
        priority: int | None = None,
        keep_result: bool | None = None,
        detached: bool = False,
        deduping: object = None,
        on_done: Callable[[Job], None] | None = None,
    ) -> Job:
        """Check one submission and make its `Job` (not accepted yet): the child of
        the task of this executor submitting it, unless ``detached``. With a
        ``deduping`` key, a chosen ``task_id`` is not claimed yet (`Dedupes.submit`
        does, if the key does not find its execution first)."""
        self.tally.submitted_count += 1
        if self.shutdown.closing:
            self.shutdown.check_open(run_id is not None)
        if fn is not self._last_fn:  # producers tend to submit one function many times
            self._learn(fn)
        registry = self.workers.registry
        parent = None
        if (
            len(args) <= self._last_plain
            and name is None
            and task_id is None
            and timeout is None
            and budget is None
            and correlation_id is None
            and run_id is None
            and key is None
            and priority is None
            and keep_result is None
            and deduping is None
            and registry is not None
            # (no task of this Trio run calls: no causation, no parent)
            and (not registry or current_job(registry) is None)
        ):
            # Most submissions: nothing to check or inherit, only the record to make.
            info, causation_id, simple = self._last_info, None, True
        else:
            info = self._last_info
            position = info.handle_position
            if position is not None and len(args) > position:
                info = info.for_args(args)  # the caller passes that argument: no handle
            spec = self._last_spec
            if spec is not None:
                timeout = spec.timeout if timeout is None else timeout
                budget = spec.budget if budget is None else budget
                if key is None and spec.key is not None:
                    key = spec_key(spec, args)
                if priority is None:
                    priority = spec.priority
                if keep_result is None:
                    keep_result = spec.keep_result
            if run_id is None:  # (a step's spec and run id were checked as made)
                if timeout is not None:
                    check_seconds("timeout", timeout)
                if budget is not None:
                    check_seconds("budget", budget)
                if name is not None:
                    check_id("name", name)
                if correlation_id is not None:
                    check_id("correlation_id", correlation_id)
                if task_id is not None:
                    # New: not live here, not in the store (else the same execution
                    # would run twice under one record).
                    check_id("task_id", task_id)
                    if deduping is None:
                        self.check_new_id(task_id, self.store is not None)
            if key is not None and (type(key) is not str or key not in self._good_keys):
                check_key(key)
                if len(self._good_keys) >= 4096:  # (a cache of keys checked lately)
                    self._good_keys.clear()
                self._good_keys.add(key)
            if priority is not None:
                check_priority(priority)
            causation_id = None
            # Nothing running in this Trio run (the usual producer): no caller to look up.
            if registry is None or registry:
                parent = current_job(registry)
            if parent is not None:
                causation_id = parent.task_id
                if correlation_id is None:
                    correlation_id = parent.correlation_id
                if detached is not False:
                    check_bool("detached", detached)
                    parent = None
                elif parent.owner is not self.lifecycle:
                    parent = None  # (another executor's task: a root here)
            if budget is None:
                budget = self.config.task_budget
            # One plain async call (no retries, timeout or budget): the workers' fast path.
            simple = info.is_async and timeout is None and budget is None and spec is None
        job = Job(
            self.lifecycle,
            fn,
            args,
            info,
            task_id if task_id is not None else self._id_prefix + str(next(self._ids)),
            name if name is not None else self._last_name,
            timeout,
            budget,
            correlation_id,
            causation_id,
            self.wall(),
            self.journal is not None,
            simple,
            run_id,
            key,
            priority or 0,
            on_done,  # (positional: a keyword costs the hot path a name search)
        )
        if parent is not None or keep_result is not None:
            if keep_result is not None:
                check_bool("keep_result", keep_result)
            job.extras = Extras(keep_result)
            self.lifecycle.use_extras()
            if parent is not None:
                adopt(parent, job)
        if task_id is not None and deduping is None:
            self.lifecycle.track_named(job)
        return job

    def _learn(self, fn: Callable[..., Any]) -> None:
        """What `new_job` needs to know of ``fn``, learnt once while it is
        submitted again and again."""
        if not callable(fn):
            raise TypeError(f"submit needs a callable, got {fn!r}")
        self._last_info = info = call_info(fn)
        self._last_name = task_name(fn)
        self._last_spec = spec = fn if isinstance(fn, TaskSpec) else None
        self._last_fn = fn
        # `new_job` makes a plain job of a call of ``fn`` with up to this many
        # arguments (-1: none): an async function, not passed its handle argument.
        plain = spec is None and info.is_async and self.config.task_budget is None
        position = info.handle_position
        self._last_plain = -1 if not plain else sys.maxsize if position is None else position

    def check_new_id(self, task_id: str, in_store: bool) -> None:
        """Refuse a chosen ``task_id`` live here, or (``in_store``) in the store."""
        if self.lifecycle.is_live(task_id):
            raise ValueError(f"task id {task_id!r} is already live in this executor")
        if in_store and self.store is not None and self.store.execution(task_id) is not None:
            raise ValueError(f"task id {task_id!r} is already recorded in the store")

    def _recovered(self, spec: TaskSpec, args: tuple[Any, ...], record: ExecutionRecord) -> None:
        """Queue an execution recovery claimed: a `Job` with its record's id,
        version, attempts, key and priority (and no new submission counted)."""
        parent = current_job()
        causation_id = None if parent is None else parent.task_id
        correlation_id = None if parent is None else parent.correlation_id
        job = Job(
            self.lifecycle,
            spec,
            args,
            call_info(spec).for_args(args),
            record.task_id,
            record.name,
            spec.timeout,
            spec.budget if spec.budget is not None else self.config.task_budget,
            correlation_id,
            # Recovered in a task of another executor, it counts as caused by that task.
            causation_id,
            record.submitted_at or self.wall(),
            True,
            False,
            key=record.key,
            priority=record.priority,
            version=record.version,
            attempts=record.attempt,
        )
        if spec.keep_result is not None or record.dedupe_key or record.parent_id:
            job.extras = Extras(spec.keep_result, record.dedupe_key, parent_id=record.parent_id)
            self.lifecycle.use_extras()
            # (its parent, recovered here too, first: cancelling it reaches this one)
            parent = self.lifecycle.live.get(record.parent_id or "")
            if parent is not None:
                adopt(parent, job)
        self.lifecycle.accept(job, recovered=True)
        self.workers.work_arrived()

    def accept_if_fits(self, job: Job) -> bool:
        """Accept ``job`` at once if it fits (the common case, decided without
        the general decision); False if `submit` must decide."""
        if self.gate.fits():
            try:
                self.lifecycle.accept(job)
            except BaseException:  # (accepting raised, before it changed anything)
                self.lifecycle.untrack(job)
                raise
            self.workers.work_arrived()
            return True
        return False

    async def submit(self, job: Job, *, internal: bool = False, held: bool = False) -> None:
        """Admit ``job``: a checkpoint; under ``BLOCK`` waits for space. ``held``:
        the caller holds a place (`Gate.hold`) for ``job``, which goes in ahead of
        the submitters who blocked since (the place is given back if unused)."""
        # (`new_job` checked that the executor is open.)
        if held:
            self.gate.reserved -= 1
        elif self.accept_if_fits(job):
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        try:
            decision = self.gate.decide(True, woken=held)
            if decision is Admit.WAIT:
                check_open = functools.partial(self.shutdown.check_open, internal)
                decision = await self.gate.wait_turn(check_open)
                self.apply(job, decision)
                self.gate.wake_next()
                return
            self.apply(job, decision)
        except BaseException:  # refused, closed or cancelled while waiting: not accepted
            self.lifecycle.untrack(job)
            if held:
                self.gate.wake_next()  # (the place it held is free)
            raise
        await trio.lowlevel.cancel_shielded_checkpoint()

    def submit_nowait(self, job: Job) -> None:
        # (`new_job` checked that the executor is open.)
        try:
            self.apply(job, self.gate.decide(can_wait=False))
        except BaseException:
            self.lifecycle.untrack(job)
            raise

    def apply(self, job: Job, decision: Admit) -> None:
        """Carry out the gate's decision on ``job`` (raises a refusal)."""
        if decision is Admit.ACCEPT:
            self.lifecycle.accept(job)
        elif decision is Admit.DROP_NEW:
            self.lifecycle.drop_new(job)
            return
        elif decision is Admit.DROP_OLDEST:
            self.lifecycle.accept(job, displace=True)
        else:
            raise self.gate.refusal(job, decision)
        self.workers.work_arrived()

    def new_step(
        self,
        spec: TaskSpec,
        args: tuple[Any, ...],
        run_id: str,
        on_done: Callable[[Job], None],
    ) -> tuple[Job, bool]:
        """A workflow run's step as a `Job` that calls ``on_done`` once ended
        (allowed while a DRAIN lets started runs finish), and True if accepted at
        once; else it goes through `submit`. Not a checkpoint (the coordinator
        checkpoints as it waits for its steps)."""
        # (every argument positional: a keyword costs a search of the parameters)
        job = self.new_job(
            spec,
            args,
            spec.id,
            None,
            None,
            None,
            run_id,
            run_id,
            None,
            None,
            False if self.config.keep_results else None,  # (a step's value is its run's: not kept)
            False,
            None,
            on_done,
        )
        return job, self.accept_if_fits(job)

    def run_ended(self) -> None:
        """A workflow run ended: the executor may be idle now."""
        self.lifecycle.maybe_idle()

    def statistics(self) -> ExecutorMetrics:
        return self.tally.snapshot(self.events.dropped)

    # ------------------------------------------------------------ the parts' Listeners, on_written

    def ready(self) -> None:
        self.workers.work_arrived()

    def waiting(self, job: Job) -> None:
        journal_waiting(self.lifecycle, job)

    def want(self, state: KeyState) -> None:
        if self.keyshare is not None:
            self.keyshare.want(state)

    def parked(self, job: Job) -> None:
        self.shutdown.parked(job)

    def timer(self, at: float) -> None:
        self.key_timer.due_at(at)

    def deadline_due(self, at: float) -> None:
        self.deadline_timer.due_at(at)

    def space_freed(self) -> None:
        self.waits.space_freed()

    def idle(self) -> None:
        self.waits.idle()

    def _written(self, notify: list[Any], fenced: list[str]) -> None:
        self.lifecycle.written(notify, fenced)

    # ------------------------------------------------------------ the store's services

    async def guarded(self, service: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run one of the store's services (writer, heartbeat, recovery); a failure
        of the store stops the executor instead of escaping into its nursery."""
        try:
            await service(*args)
        except Exception as exc:
            self.store_failed(exc)

    def store_failed(self, exc: Exception) -> None:
        """The store failed: stop everything and wake every waiter (each gets one
        `StoreError` naming the store)."""
        journal = self.journal
        assert journal is not None
        if journal.fail(exc) is None:
            return  # (failed already)
        self.shutdown.begin(ShutdownPolicy.CANCEL)
        if self.workers.nursery is not None:
            self.workers.nursery.cancel_scope.cancel()
        self.lifecycle.wake_all_waiters()

    async def close_store(self) -> None:
        """Write what is left and give up the lease. After a store failure the
        rest is still tried once (the failure may have passed: a lock held too
        long); a failure here is recorded like any other."""
        assert self.recovery is not None
        with trio.move_on_after(60, shield=True):
            try:
                await self.control.flush()  # (a pause just before the end is recorded)
                await self.recovery.close()
            except Exception as exc:
                self.store_failed(exc)
