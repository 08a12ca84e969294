"""What observers are told (`trioexec._observe`, for `trioexec.contrib`), and
the ``trioexec`` logger's records."""

from __future__ import annotations

import logging

import pytest
import trio

import trioexec
from trioexec import Backoff, TaskHandle, TaskStatus, open_executor
from trioexec._changes import Start, submitted
from trioexec._observe import combine, without


class Recorder:
    def __init__(self, tag: str = "") -> None:
        self.seen: list[tuple[str, ...]] = []
        self.tag = tag

    def submitted(self, job) -> None:
        self.seen.append((self.tag + "submitted", job.name))

    def started(self, job) -> None:
        self.seen.append((self.tag + "started", job.name, str(job.attempts)))

    def deferred(self, job) -> None:
        self.seen.append((self.tag + "deferred", job.name))

    def resumed(self, job) -> None:
        self.seen.append((self.tag + "resumed", job.name))

    def retrying(self, job, status, delay) -> None:
        self.seen.append((self.tag + "retrying", job.name, status.value))

    def finished(self, job, status) -> None:
        self.seen.append((self.tag + "finished", job.name, status.value))


async def test_an_observer_sees_each_step_of_a_task_in_order(autojump_clock):
    recorder = Recorder()
    go = trio.Event()
    calls = []

    @trioexec.task(retries=1, backoff=Backoff(initial=1.0, jitter=0))
    async def flaky(handle: TaskHandle) -> str:
        calls.append(handle)
        if len(calls) == 1:
            raise ValueError("first")
        await handle.defer_until(go)
        return "ok"

    async with open_executor() as ex:
        lifecycle = ex._core.lifecycle
        lifecycle.observer = combine(lifecycle.observer, recorder)
        ref = await ex.submit(flaky)
        await trio.sleep(5)
        go.set()
        assert (await ref.wait()).result == "ok"
    name = ref.name
    assert recorder.seen == [
        ("submitted", name),
        ("started", name, "1"),
        ("retrying", name, "failed"),
        ("started", name, "2"),
        ("deferred", name),
        ("resumed", name),
        ("finished", name, "completed"),
    ]


async def test_several_observers_are_told_in_the_order_they_were_added():
    first, second, third = Recorder("1:"), Recorder("2:"), Recorder("3:")
    async with open_executor() as ex:
        lifecycle = ex._core.lifecycle
        for recorder in (first, second, third):
            lifecycle.observer = combine(lifecycle.observer, recorder)
        await ex.run(trio.sleep, 0)
    assert [s[0] for s in first.seen] == ["1:submitted", "1:started", "1:finished"]
    assert len(second.seen) == len(third.seen) == 3


async def test_the_logger_records_a_failure_and_a_retry_with_the_tasks_fields(
    autojump_clock, caplog
):
    @trioexec.task(retries=1, backoff=Backoff(initial=0.5, jitter=0))
    async def always_fails() -> None:
        raise RuntimeError("boom")

    caplog.set_level(logging.INFO, logger="trioexec")
    async with open_executor() as ex:
        ref = await ex.submit(always_fails)
        completion = await ref.wait()
    assert completion.status is TaskStatus.FAILED
    records = [r for r in caplog.records if r.name == "trioexec"]
    assert [(r.levelname, r.task_id, r.task_name, r.attempt) for r in records] == [
        ("INFO", ref.task_id, ref.name, 1),
        ("ERROR", ref.task_id, ref.name, 2),
    ]
    assert "retrying in 0.5 s" in records[0].getMessage()
    assert records[1].exc_info is not None
    assert records[1].exc_info[1] is completion.error


def test_the_logger_prints_nothing_until_logging_is_configured():
    logger = logging.getLogger("trioexec")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)


@pytest.mark.parametrize("broken", ["repr", "str"])
async def test_a_failure_whose_error_cannot_be_shown_is_still_logged(caplog, broken):
    class Odd(Exception):
        def __repr__(self) -> str:
            if broken == "repr":
                raise RuntimeError("no repr")
            return "Odd()"

        def __str__(self) -> str:
            if broken == "str":
                raise RuntimeError("no str")
            return "odd"

    async def fails() -> None:
        raise Odd()

    caplog.set_level(logging.ERROR, logger="trioexec")
    async with open_executor() as ex:
        await (await ex.submit(fails)).wait()
    (record,) = [r for r in caplog.records if r.name == "trioexec"]
    assert "failed after 1 attempt(s)" in record.getMessage()


async def test_the_logger_records_a_lost_lease_and_an_abandoned_task(autojump_clock, caplog):
    from trioexec import MemoryStore
    from trioexec.testing import FakeWallClock

    caplog.set_level(logging.WARNING, logger="trioexec")
    store = MemoryStore(clock=FakeWallClock(start=1_000.0))
    # An execution of an owner whose lease lapsed, recovered too often already.
    store.write(
        [
            submitted("gone-1", 1, "gone", None, "gone", "[]", "dead", 900.0),
            Start(("gone-1", 1, 1, 900.0)),
        ]
    )
    store.heartbeat("dead", 950.0)
    started = trio.Event()

    async def hold() -> None:
        started.set()
        await trio.sleep_forever()

    async with open_executor(store=store, recover=True, max_recovery_attempts=0) as ex:
        ref = await ex.submit(hold)
        await started.wait()
        ex._core.lifecycle.lose(ref.task_id)  # (as the heartbeat does when taken over)
        await ref.wait()
    by_level = {r.levelname: r for r in caplog.records if r.name == "trioexec"}
    assert by_level["ERROR"].task_id == "gone-1"
    assert "abandoned" in by_level["ERROR"].getMessage()
    assert by_level["WARNING"].task_id == ref.task_id
    assert "lease lost" in by_level["WARNING"].getMessage()


class Raises(Recorder):
    def __init__(self, step: str) -> None:
        super().__init__()
        self.step = step

    def __getattribute__(self, name: str):
        if name == object.__getattribute__(self, "step"):
            raise_now = object.__getattribute__(self, "_raise")
            return raise_now
        return object.__getattribute__(self, name)

    def _raise(self, *args) -> None:
        raise RuntimeError("observer bug")


@pytest.mark.parametrize("step", ["submitted", "started", "finished"])
async def test_an_observer_that_raises_is_logged_and_dropped_and_the_task_goes_on(
    autojump_clock, caplog, step
):
    bad, good = Raises(step), Recorder()
    caplog.set_level(logging.ERROR, logger="trioexec")
    async with open_executor() as ex:
        lifecycle = ex._core.lifecycle
        lifecycle.observer = combine(combine(lifecycle.observer, bad), good)
        first = await ex.submit(trio.sleep, 1)
        assert (await first.wait()).status is TaskStatus.COMPLETED
        second = await ex.submit(trio.sleep, 1)
        assert (await second.wait()).status is TaskStatus.COMPLETED
        with trio.fail_after(10):
            await ex.wait_for_idle()
    assert [s[0] for s in good.seen] == ["submitted", "started", "finished"] * 2
    (record,) = [r for r in caplog.records if r.name == "trioexec"]
    assert f"raised in {step}" in record.getMessage()
    assert lifecycle.observer.all == [good]


async def test_an_observer_raising_when_a_pending_task_is_cancelled_does_not_hang(
    autojump_clock, caplog
):
    gate = trio.Event()
    async with open_executor(max_concurrent_tasks=1) as ex:
        lifecycle = ex._core.lifecycle
        lifecycle.observer = combine(lifecycle.observer, Raises("finished"))
        busy = await ex.submit(gate.wait)
        queued = await ex.submit(trio.sleep, 0)
        queued.cancel()
        assert (await queued.wait()).status is TaskStatus.CANCELLED
        gate.set()
        await busy.wait()
        with trio.fail_after(10):
            await ex.wait_for_idle()


def test_removing_the_last_observer_leaves_none_to_call():
    """A removed observer costs nothing: once none is left, a transition calls none."""
    a, b = object(), object()
    both = combine(combine(None, a), b)  # type: ignore[arg-type]
    assert without(both, a) is both
    assert both.all == [b]
    assert without(both, b) is None
    assert without(None, a) is None  # type: ignore[arg-type]
