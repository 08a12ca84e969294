"""Schedules: one task per occurrence of a cron expression (`Executor.schedule`;
``docs/howto/schedules.rst`` says what a user sees).

Occurrences are wall-clock times (the store's clock) that cronsim computes in the
schedule's `zoneinfo` zone. The wait for each is a sleep on Trio's clock, so a mock
clock drives schedules in tests, of at most `MAX_SLEEP` at a time, since the wall
clock may step. With a store, the claim (`Store.claim_occurrence`), not the
execution row, decides which executor runs an occurrence: a task can start before
its submission is durable.
"""

from __future__ import annotations

import datetime
import math
import zoneinfo
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, final

import attrs
import trio
from cronsim import CronSim, CronSimError

from ._errors import ExecutorClosed, TaskRejected
from ._machine._admit import Admit, rejection_reason
from ._records import MAX_ID_LENGTH, HealthEventKind, check_id
from ._spec import task_name
from ._store import ScheduleRecord

if TYPE_CHECKING:
    from ._core import ExecutorCore
    from ._taskref import TaskRef

__all__ = [
    "Schedule",
    "Schedules",
    "occurrence_after",
    "occurrence_before",
    "occurrence_task_id",
    "time_zone",
]

#: The longest sleep (seconds) before the wall clock is read again.
MAX_SLEEP = 60.0
#: How long releasing a claim may hold up a cancelled schedule (seconds).
RELEASE_BOUND = 10.0
#: What `occurrence_task_id` adds to a schedule id: ``"@2026-01-01T00:00:00Z"``.
_OCCURRENCE_SUFFIX = 21


def time_zone(tz: object) -> zoneinfo.ZoneInfo:
    """``tz`` as a zone. Raises ValueError naming a name `zoneinfo` does not know."""
    if not isinstance(tz, str):
        raise TypeError(f"tz must be the name of a time zone (a str), got {tz!r}")
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {tz!r} (an IANA name such as 'Europe/Berlin')"
        ) from None


def _at(t: float, zone: zoneinfo.ZoneInfo) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(t, zone)


def _cron(cron: str, start: datetime.datetime, *, reverse: bool = False) -> CronSim:
    try:
        return CronSim(cron, start, reverse=reverse)
    except CronSimError as exc:
        raise ValueError(f"bad cron expression {cron!r}: {exc}") from None


def occurrence_after(cron: str, zone: zoneinfo.ZoneInfo, t: float) -> float:
    """The first occurrence of ``cron`` in ``zone`` after the second ``t`` falls in
    (wall-clock seconds in, seconds out; always a whole second, always later than ``t``).
    Raises ValueError for a cron expression cronsim refuses, or one with no
    occurrence in the next 50 years."""
    occurrences = _cron(cron, _at(t, zone))
    try:
        found = next(occurrences).timestamp()
        # In the hour a DST change repeats, cronsim steps through local times: from
        # 01:10 of the second pass it yields 01:30 of the first, which is past.
        while found <= t:
            found = next(occurrences).timestamp()
    except StopIteration:
        raise ValueError(f"cron expression {cron!r} has no occurrence after {t}") from None
    return found


def occurrence_before(cron: str, zone: zoneinfo.ZoneInfo, t: float) -> float | None:
    """The last occurrence of ``cron`` in ``zone`` before the whole second ``t``
    (None: none in the 50 years before)."""
    occurrences = _cron(cron, _at(t, zone), reverse=True)
    try:
        found = next(occurrences).timestamp()
        while found >= t:  # (the repeated hour of a DST change, as in occurrence_after)
            found = next(occurrences).timestamp()
    except StopIteration:
        return None
    return found


def occurrence_task_id(schedule_id: str, at: float) -> str:
    """The task id of ``schedule_id``'s occurrence at ``at``: ``"nightly@2026-03-29T01:00:00Z"``."""
    when = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return f"{schedule_id}@{when:%Y-%m-%dT%H:%M:%SZ}"


@attrs.define(eq=False, kw_only=True)
class Schedule:
    """A schedule running in an executor, as `Executor.schedule` returns it.

    ``next_run`` and ``last_run`` are wall-clock seconds (the store's clock): the
    next occurrence this executor waits for (None once the schedule has ended),
    and the last one it submitted (None: none yet).
    """

    schedule_id: str
    cron: str
    tz: str
    name: str  #: the task name its occurrences run under
    catch_up: bool
    next_run: float | None
    last_run: float | None = None
    _spec: Callable[..., Any] = attrs.field(repr=False)
    _args: tuple[Any, ...] = attrs.field(repr=False)
    _zone: zoneinfo.ZoneInfo = attrs.field(repr=False)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once the schedule was cancelled (or its executor shut down)."""
        return self._scope.cancel_called

    def cancel(self) -> None:
        """Stop the schedule: no occurrence is submitted from now on (tasks already
        submitted go on). Never blocks; idempotent. The store keeps its record."""
        self._scope.cancel()
        self.next_run = None


Submit = Callable[..., Awaitable["TaskRef"]]


@final
class Schedules:
    """The schedules of one executor: each a task in the executor's nursery."""

    def __init__(self, core: ExecutorCore, submit: Submit) -> None:
        self._core = core
        self._submit = submit
        self.active: dict[str, Schedule] = {}

    def add(
        self,
        spec: Callable[..., Any],
        cron: str,
        schedule_id: str,
        tz: str,
        catch_up: bool,
        args: Iterable[Any],
    ) -> Schedule:
        """Check a schedule, start it, and return it (see `Executor.schedule`)."""
        core = self._core
        if core.shutdown.closing:
            raise ExecutorClosed("the executor is shutting down; no new schedules")
        nursery = core.workers.nursery
        if nursery is None:
            raise RuntimeError("schedules run only in an executor from open_executor")
        if not callable(spec):
            raise TypeError(f"schedule needs a TaskSpec or a function, got {spec!r}")
        check_id("schedule_id", schedule_id)
        if len(schedule_id) > MAX_ID_LENGTH - _OCCURRENCE_SUFFIX:
            raise ValueError(
                f"schedule_id is {len(schedule_id)} characters long (at most"
                f" {MAX_ID_LENGTH - _OCCURRENCE_SUFFIX}, so that its occurrences' task ids"
                f" fit in {MAX_ID_LENGTH}): {schedule_id[:40]!r}..."
            )
        if schedule_id in self.active:
            raise ValueError(f"schedule {schedule_id!r} is already running in this executor")
        if not isinstance(cron, str):
            raise TypeError(f"cron must be a cron expression (a str), got {cron!r}")
        zone = time_zone(tz)
        # The first occurrence is the first at or after now (a whole second).
        first = occurrence_after(cron, zone, math.ceil(core.wall()) - 1)
        schedule = Schedule(
            schedule_id=schedule_id,
            cron=cron,
            tz=tz,
            name=task_name(spec),
            catch_up=bool(catch_up),
            next_run=first,
            spec=spec,
            args=tuple(args),
            zone=zone,
        )
        self.active[schedule_id] = schedule
        if core.journal is None:
            nursery.start_soon(self._run, schedule, first, name=f"trioexec schedule {schedule_id}")
        else:  # (a store failure stops the executor, as the writer's does)
            nursery.start_soon(
                core.guarded, self._run, schedule, first, name=f"trioexec schedule {schedule_id}"
            )
        return schedule

    def remove(self, schedule_id: str) -> bool:
        """Cancel the schedule ``schedule_id`` runs here; False if none does."""
        schedule = self.active.pop(schedule_id, None)
        if schedule is None:
            return False
        schedule.cancel()
        return True

    def close(self) -> None:
        """The executor is shutting down: every schedule stops."""
        for schedule_id in list(self.active):
            self.remove(schedule_id)

    async def _run(self, schedule: Schedule, first: float) -> None:
        try:
            with schedule._scope:
                await self._occurrences(schedule, first)
        finally:
            # However it ended (cancelled, its executor closed or failed, its
            # nursery cancelled), ``cancelled`` says so.
            if self.active.get(schedule.schedule_id) is schedule:
                del self.active[schedule.schedule_id]
            schedule.cancel()

    async def _occurrences(self, schedule: Schedule, at: float) -> None:
        core = self._core
        wall = core.wall
        cron, zone = schedule.cron, schedule._zone
        journal = core.journal
        if journal is not None:
            record = ScheduleRecord(
                schedule_id=schedule.schedule_id,
                cron=cron,
                tz=schedule.tz,
                name=schedule.name,
                next_run=at,
            )
            before = await journal.call(journal.store.save_schedule, record)
            if schedule.catch_up and before is not None:
                missed = occurrence_before(cron, zone, at)
                if (
                    missed is not None
                    and _missed(missed, before)
                    and await self._fire(schedule, missed, at)
                ):
                    return
        while True:
            delay = at - wall()
            if delay > 0:
                # (in steps of at most MAX_SLEEP: the wall clock may lag Trio's, or jump)
                await trio.sleep(min(delay, MAX_SLEEP))
                continue
            # (if a submission waits for room past several occurrences, the first
            # of them runs late and the others are skipped)
            following = occurrence_after(cron, zone, max(at, wall()))
            assert following > at, (at, following)  # each occurrence once, in order
            schedule.next_run = following
            if await self._fire(schedule, at, following):
                return
            at = following

    async def _fire(self, schedule: Schedule, at: float, following: float) -> bool:
        """Claim and submit the occurrence at ``at``. True: the executor closed.
        Checkpoints on every path."""
        core = self._core
        journal = core.journal
        schedule_id = schedule.schedule_id
        task_id = occurrence_task_id(schedule_id, at)
        held = False
        if journal is not None:
            # Claim only what this executor can take (claimed, then refused or
            # dropped, it would be lost to an executor that had room). A place is held
            # back while the claim is made, for the submission right after it (ahead of
            # those who blocked meanwhile: they came after it).
            gate = core.gate
            decision = gate.decide(True)
            if decision not in (Admit.ACCEPT, Admit.WAIT, Admit.DROP_OLDEST):
                tally = core.tally
                reason = rejection_reason(decision, gate.overflow, backlogged=gate.backlogged())
                error = (
                    f"no room (overflow={gate.overflow.value}, {reason}: {tally.queue_depth}"
                    f" pending, {tally.active_count} active, {tally.deferred_count} deferred,"
                    f" capacity {gate.capacity}): left unclaimed for another executor on the store"
                )
                self._skipped(schedule, task_id, at, "no_room", error)
                await trio.lowlevel.checkpoint()
                return False
            held = decision is Admit.ACCEPT
            if held:
                gate.hold(1)
            won = False
            try:
                won = await journal.call(
                    journal.store.claim_occurrence, schedule_id, at, core.owner_id, following
                )
            finally:
                if held and not won:
                    gate.release(1)
            if not won:
                return False  # another executor on the store runs it
        try:
            if held:
                await self._submit_held(schedule, task_id)
            else:
                await self._submit(schedule._spec, *schedule._args, task_id=task_id)
        except ExecutorClosed:
            await self._release(schedule, at)
            return True
        except (TaskRejected, ValueError) as exc:
            # Refused (a full executor, or a ValueError: an argument its key is made
            # of, say): the claim goes back for another executor, unless the id is in
            # use here or in the store (the occurrence was submitted already).
            in_use = isinstance(exc, ValueError) and (
                core.lifecycle.is_live(task_id)
                or (core.store is not None and core.store.execution(task_id) is not None)
            )
            if not in_use:
                await self._release(schedule, at)
            reason = "task_id_in_use" if in_use else "refused"
            self._skipped(schedule, task_id, at, reason, f"{type(exc).__name__}: {exc}")
            await trio.lowlevel.checkpoint()  # (submit refuses before its first yield)
            return False
        except BaseException:  # cancelled while it waited for room
            with trio.move_on_after(RELEASE_BOUND, shield=True):
                await self._release(schedule, at)
            raise
        schedule.last_run = at
        return False

    async def _submit_held(self, schedule: Schedule, task_id: str) -> None:
        """Submit an occurrence, as `Executor.submit` does, into the place held
        for it while it was claimed (given back if it is not submitted)."""
        core = self._core
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            job = core.new_job(schedule._spec, schedule._args, None, task_id, None, None, None)
        except BaseException:
            core.gate.release(1)
            raise
        await core.submit(job, held=True)

    def _skipped(
        self, schedule: Schedule, task_id: str, at: float, reason: str, error: str
    ) -> None:
        self._core.events.publish(
            HealthEventKind.SCHEDULE_SKIPPED,
            task_id,
            reason=reason,
            attributes={"schedule_id": schedule.schedule_id, "at": at, "error": error},
        )

    async def _release(self, schedule: Schedule, at: float) -> None:
        """Give the claim of the occurrence at ``at`` back (if there is a store)."""
        core = self._core
        journal = core.journal
        if journal is None:
            return
        try:
            await journal.call(
                journal.store.release_occurrence, schedule.schedule_id, at, core.owner_id
            )
        except Exception as exc:  # (the store failed: that stops the executor)
            core.store_failed(exc)


def _missed(at: float, before: ScheduleRecord) -> bool:
    """``at`` (an occurrence before now) was due and did not run, by the store's record."""
    if before.last_run is not None:
        return at > before.last_run
    return before.next_run is not None and at >= before.next_run
