"""`trioexec.contrib.prometheus`: the metrics of real executors on a real
registry, read back sample by sample."""

from __future__ import annotations

import sqlite3

import pytest
import trio
from pg_server import STORE_KINDS
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import trioexec
from trioexec import Backoff, SQLiteStore, TaskHandle, open_executor
from trioexec.contrib.prometheus import MAX_TASK_NAMES, OTHER, instrument
from trioexec.durable import DurableStore, PromiseState, open_worker
from trioexec.testing import FakeWallClock


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"executor": "default", **labels})


async def ok() -> None:
    pass


async def boom() -> None:
    raise ValueError("boom")


async def test_tasks_are_counted_as_submitted_and_completed_by_status_and_name(
    registry, autojump_clock
):
    async with open_executor(max_concurrent_tasks=1) as ex:
        instrument(ex, registry)
        for fn in (ok, ok, boom):
            await ex.submit(fn)
        slow = await ex.submit(trio.sleep, 10, timeout=1)
        blocker = await ex.submit(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        waiting = await ex.submit(ok)  # (cancelled while pending: it never starts)
        blocker.cancel()
        waiting.cancel()
    assert (await slow.wait()).status is trioexec.TaskStatus.TIMED_OUT
    counts = {
        (task, status): sample(registry, "trioexec_tasks_completed_total", task=task, status=status)
        for task in ("ok", "boom", "sleep", "sleep_forever")
        for status in ("completed", "failed", "cancelled", "timed_out", "dropped")
    }
    assert {key: n for key, n in counts.items() if n} == {
        ("ok", "completed"): 2,
        ("ok", "cancelled"): 1,
        ("boom", "failed"): 1,
        ("sleep", "timed_out"): 1,
        ("sleep_forever", "cancelled"): 1,
    }
    assert sample(registry, "trioexec_tasks_submitted_total", task="ok") == 3
    assert sample(registry, "trioexec_tasks_submitted_total", task="boom") == 1
    # The executor has closed: its gauges of what is now are gone, its counts stay.
    assert sample(registry, "trioexec_tasks_active", task="ok") is None
    assert sample(registry, "trioexec_tasks_active", task="sleep_forever") is None


async def test_a_dropped_task_counts_as_completed_with_status_dropped(registry):
    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=1, overflow=trioexec.Overflow.DROP_NEWEST
    ) as ex:
        instrument(ex, registry)
        running = await ex.submit(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        await ex.submit(ok)  # (queued)
        dropped = await ex.submit(ok)
        assert (await dropped.wait()).status is trioexec.TaskStatus.DROPPED
        running.cancel()
    assert sample(registry, "trioexec_tasks_completed_total", task="ok", status="dropped") == 1
    assert sample(registry, "trioexec_tasks_completed_total", task="ok", status="completed") == 1
    # (refused on arrival: never accepted)
    assert sample(registry, "trioexec_tasks_submitted_total", task="ok") == 1


async def test_the_gauges_follow_a_task_through_running_deferral_and_its_end(
    registry, autojump_clock
):
    go = trio.Event()
    resumed = trio.Event()
    finish = trio.Event()

    async def waits(handle: TaskHandle) -> None:
        await trio.sleep(1)
        await handle.defer_until(go)
        resumed.set()
        await finish.wait()

    def gauges() -> tuple[float | None, float | None]:
        return (
            sample(registry, "trioexec_tasks_active", task="waits"),
            sample(registry, "trioexec_tasks_deferred", task="waits"),
        )

    async with open_executor() as ex:
        instrument(ex, registry)
        ref = await ex.submit(waits, name="waits")
        await trio.testing.wait_all_tasks_blocked()
        assert gauges() == (1, 0)
        await trio.sleep(2)
        assert ref.waiting_on is not None
        assert gauges() == (0, 1)
        await trio.sleep(3)
        go.set()
        await resumed.wait()
        assert gauges() == (1, 0)
        await trio.sleep(4)
        finish.set()
        await ref.wait()
        assert gauges() == (0, 0)
    assert gauges() == (None, None)  # (closed: no series of what is now)
    # The mock clock makes the sums exact: deferred from t=1 to t=5, running from 0 to 9.
    assert sample(registry, "trioexec_task_deferred_seconds_count", task="waits") == 1
    assert sample(registry, "trioexec_task_deferred_seconds_sum", task="waits") == 4
    assert sample(registry, "trioexec_task_duration_seconds_count", task="waits") == 1
    assert sample(registry, "trioexec_task_duration_seconds_sum", task="waits") == 9


async def test_each_attempt_is_one_duration_and_a_deferral_ended_by_cancel_counts(
    registry, autojump_clock
):
    calls = 0

    @trioexec.task(retries=1, backoff=Backoff(initial=5.0, jitter=0))
    async def flaky() -> None:
        nonlocal calls
        calls += 1
        await trio.sleep(2)
        if calls == 1:
            raise ValueError("first")

    async def parked(handle: TaskHandle) -> None:
        await handle.defer_until(trio.Event())  # (never set)

    async with open_executor() as ex:
        instrument(ex, registry)
        first = await ex.submit(flaky, name="flaky")
        stuck = await ex.submit(parked, name="parked")
        await trio.sleep(20)
        assert sample(registry, "trioexec_tasks_deferred", task="parked") == 1
        stuck.cancel()
        await first.wait()
        await stuck.wait()
        assert sample(registry, "trioexec_tasks_deferred", task="parked") == 0
        assert sample(registry, "trioexec_tasks_active", task="parked") == 0
    assert sample(registry, "trioexec_task_duration_seconds_count", task="flaky") == 2
    assert sample(registry, "trioexec_task_duration_seconds_sum", task="flaky") == 4
    assert sample(registry, "trioexec_tasks_completed_total", task="flaky", status="completed") == 1
    assert sample(registry, "trioexec_task_deferred_seconds_sum", task="parked") == 20
    assert sample(registry, "trioexec_task_deferred_seconds_bucket", task="parked", le="30.0") == 1
    assert sample(registry, "trioexec_task_deferred_seconds_bucket", task="parked", le="10.0") == 0


async def test_queue_depth_and_slots_are_read_when_scraped(registry):
    release = trio.Event()
    async with open_executor(max_concurrent_tasks=2) as ex:
        instrument(ex, registry)
        for _ in range(5):
            await ex.submit(release.wait)
        await trio.testing.wait_all_tasks_blocked()
        assert sample(registry, "trioexec_queue_depth") == 3
        assert sample(registry, "trioexec_slots", state="in_use") == 2
        assert sample(registry, "trioexec_slots", state="available") == 0
        ex.slots.total = 4
        await trio.testing.wait_all_tasks_blocked()
        assert sample(registry, "trioexec_queue_depth") == 1
        assert sample(registry, "trioexec_slots", state="in_use") == 4
        release.set()
        await ex.wait_for_idle()
        assert sample(registry, "trioexec_queue_depth") == 0
        assert sample(registry, "trioexec_slots", state="available") == 4


async def test_two_executors_share_a_registry_under_their_names(registry):
    async with open_executor() as a, open_executor() as b:
        instrument(a, registry, name="a")
        instrument(b, registry, name="b")
        await a.run(ok)
        await b.run(ok)
        await b.run(ok)
    for name, n in (("a", 1), ("b", 2)):
        labels = {"executor": name, "task": "ok"}
        assert registry.get_sample_value("trioexec_tasks_submitted_total", labels) == n


async def test_an_executor_is_instrumented_once_per_registry_and_a_name_once_while_open(
    registry,
):
    async with open_executor() as a, open_executor() as b:
        instrumentation = instrument(a, registry)
        with pytest.raises(ValueError, match="already instrumented"):
            instrument(a, registry, name="again")
        with pytest.raises(ValueError, match="'default' is taken"):
            instrument(b, registry)
        instrument(a, CollectorRegistry())  # (another registry: fine)
        instrumentation.close()
        instrumentation.close()
        await a.run(ok)  # no longer counted
        instrument(b, registry)  # the name is free again
        await b.run(ok)
    assert sample(registry, "trioexec_tasks_submitted_total", task="ok") == 1
    async with open_executor() as again:
        instrument(again, registry)  # `b` has closed: its name is free
        await again.run(ok)
    assert sample(registry, "trioexec_tasks_submitted_total", task="ok") == 2


async def test_close_takes_the_running_tasks_out_of_the_gauges(registry):
    async with open_executor() as ex:
        instrumentation = instrument(ex, registry)
        ref = await ex.submit(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        assert sample(registry, "trioexec_tasks_active", task="sleep_forever") == 1
        instrumentation.close()
        assert sample(registry, "trioexec_tasks_active", task="sleep_forever") is None
        assert sample(registry, "trioexec_queue_depth") is None  # (no longer scraped)
        ref.cancel()


async def test_the_text_exposition_parses_with_the_names_and_odd_task_names(registry):
    names = ['say "hi"', "list[int]", "back\\slash", "new\nline", "🚀 launch"]
    async with open_executor() as ex:
        instrument(ex, registry, name='ex "1"')
        for name in names:
            await ex.submit(ok, name=name)
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {
        "trioexec_tasks_submitted",
        "trioexec_tasks_completed",
        "trioexec_task_duration_seconds",
        "trioexec_task_deferred_seconds",
        "trioexec_tasks_active",
        "trioexec_tasks_deferred",
        "trioexec_queue_depth",
        "trioexec_slots",
    } <= set(families)
    assert "_total_total" not in text
    submitted = {
        s.labels["task"]: s.value
        for s in families["trioexec_tasks_submitted"].samples
        if s.name == "trioexec_tasks_submitted_total"
    }
    assert submitted == dict.fromkeys(names, 1.0)
    completed = families["trioexec_tasks_completed"].samples
    assert {
        (s.labels["executor"], s.labels["task"], s.labels["status"])
        for s in completed
        if s.name.endswith("_total") and s.value
    } == {('ex "1"', name, "completed") for name in names}
    assert families["trioexec_task_duration_seconds"].type == "histogram"
    assert families["trioexec_tasks_active"].type == "gauge"


async def test_closing_one_of_two_instrumentations_leaves_the_other_counting(registry):
    other = CollectorRegistry()
    async with open_executor() as ex:
        first = instrument(ex, registry)
        instrument(ex, other)
        await ex.run(ok)
        first.close()
        await ex.run(ok)
    assert sample(registry, "trioexec_tasks_submitted_total", task="ok") == 1
    assert sample(other, "trioexec_tasks_submitted_total", task="ok") == 2


# ------------------------------------------------- found by a review


def _gauge(registry, name: str, task: str) -> float | None:
    return registry.get_sample_value(name, {"executor": "default", "task": task})


@pytest.mark.parametrize("when", ["deferred", "running"])
async def test_tasks_already_under_way_when_instrumented_leave_the_gauges_alone(
    autojump_clock, when
):
    registry = CollectorRegistry()
    go = trio.Event()

    async def work(handle: TaskHandle) -> None:
        await trio.sleep(1)
        await handle.defer_until(go)

    async with trioexec.open_executor() as ex:
        ref = await ex.submit(work)
        await trio.sleep(2.0 if when == "deferred" else 0.5)
        instrumentation = instrument(ex, registry)
        await trio.sleep(1)
        if when == "deferred":
            go.set()
        else:
            ref.cancel()
        await ref.wait()
    assert _gauge(registry, "trioexec_tasks_active", ref.name) in (None, 0.0)
    assert _gauge(registry, "trioexec_tasks_deferred", ref.name) in (None, 0.0)
    assert not instrumentation._observer._started
    assert not instrumentation._observer._deferred_since


async def test_a_deterministic_executor_is_refused_in_a_line():
    with pytest.raises(TypeError, match="takes an Executor, not DeterministicExecutor"):
        instrument(trioexec.DeterministicExecutor(), CollectorRegistry())


# ------------------------------------------------------------ buckets


async def test_buckets_are_the_histograms_bounds(registry, autojump_clock):
    async def waits(handle: TaskHandle) -> None:
        await trio.sleep(0.5)
        await handle.defer_until(lambda: trio.current_time() >= 3, poll_interval=1)

    async with open_executor() as ex:
        instrument(ex, registry, buckets=[0.1, 1, 10.0, float("inf")])
        ref = await ex.submit(waits, name="waits")
        await ref.wait()

    def bucket(metric: str, le: str) -> float | None:
        return sample(registry, f"{metric}_bucket", task="waits", le=le)

    duration, deferred = "trioexec_task_duration_seconds", "trioexec_task_deferred_seconds"
    assert [bucket(duration, le) for le in ("0.1", "1.0", "10.0", "+Inf")] == [0, 0, 1, 1]
    assert [bucket(deferred, le) for le in ("0.1", "1.0", "10.0", "+Inf")] == [0, 0, 1, 1]
    assert bucket(duration, "0.005") is None  # (not the default buckets)


@pytest.mark.parametrize(
    ("buckets", "named"),
    [
        ([], r"\[\]"),
        ([float("inf")], r"\[inf\]"),
        ([1, 0.5], r"0\.5 comes after 1"),
        ([0.5, 0.5], r"0\.5 comes after 0\.5"),
        ([0, 1], r"> 0, got 0"),
        ([-1.0], r"> 0, got -1\.0"),
        ([1, float("nan")], r"> 0, got nan"),
        ([1, float("inf"), 10], r"> 0, got inf"),
        ([1, "2"], r"number of seconds, got '2'"),
        ([True, 2], r"number of seconds, got True"),
        ("0.1", r"got '0\.1'"),
    ],
)
async def test_bad_buckets_are_refused_naming_the_value(registry, buckets, named):
    async with open_executor() as ex:
        with pytest.raises(ValueError, match=named):
            instrument(ex, registry, buckets=buckets)
        instrument(ex, registry)  # (nothing was registered by the refused call)


async def test_the_executors_of_a_registry_share_its_buckets(registry):
    async with open_executor() as a, open_executor() as b, open_executor() as c:
        instrument(a, registry, name="a", buckets=(1, 2))
        with pytest.raises(ValueError, match=r"\(1\.0, 2\.0\).* not \(1\.0, 3\.0\)"):
            instrument(b, registry, name="b", buckets=(1, 3))
        instrument(b, registry, name="b", buckets=[1.0, 2.0])  # the same: fine
        instrument(c, registry, name="c")  # none given: the registry's
        await c.run(ok)
    labels = {"executor": "c", "task": "ok", "le": "2.0"}
    assert registry.get_sample_value("trioexec_task_duration_seconds_bucket", labels) == 1


# ------------------------------------------------------------ task names


async def test_names_past_max_task_names_are_counted_as_other(registry):
    gate = trio.Event()

    async def waits() -> None:
        await gate.wait()

    async with open_executor(max_concurrent_tasks=5) as ex:
        instrument(ex, registry, max_task_names=2)
        for name in ("a", "b", "c", "d", "a"):
            await ex.submit(waits, name=name)
        await trio.testing.wait_all_tasks_blocked()
        assert sample(registry, "trioexec_tasks_active", task="other") == 2
        assert sample(registry, "trioexec_tasks_active", task="a") == 2
        gate.set()
        await ex.wait_for_idle()
        assert sample(registry, "trioexec_tasks_active", task="other") == 0
    submitted = {
        task: sample(registry, "trioexec_tasks_submitted_total", task=task)
        for task in ("a", "b", "c", "d", "other")
    }
    assert submitted == {"a": 2, "b": 1, "c": None, "d": None, "other": 2}
    done = sample(registry, "trioexec_tasks_completed_total", task="other", status="completed")
    assert done == 2
    assert sample(registry, "trioexec_task_duration_seconds_count", task="other") == 2


async def test_max_task_names_zero_counts_every_task_as_other(registry):
    async with open_executor() as ex:
        instrument(ex, registry, max_task_names=0)
        await ex.run(ok)
    assert sample(registry, "trioexec_tasks_submitted_total", task="other") == 1
    assert sample(registry, "trioexec_tasks_submitted_total", task="ok") is None


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
async def test_a_bad_max_task_names_is_refused_naming_it(registry, bad):
    async with open_executor() as ex:
        with pytest.raises(ValueError, match=f"got {bad!r}"):
            instrument(ex, registry, max_task_names=bad)


# ------------------------------------------------------------ fenced out


@pytest.fixture(params=STORE_KINDS)
def store(request, store_maker):
    return store_maker(request.param)


async def test_an_end_the_store_fences_out_counts_as_fenced_out(registry, store, autojump_clock):
    """The task completes here, and is counted so; the store then refuses the
    completion (another executor took the task over): it counts as fenced out."""
    store.clock = FakeWallClock(start=0)

    @trioexec.task(id="work")
    async def work() -> str:
        await trio.sleep(1)
        return "done"

    async with open_executor(store=store, lease=30, tasks=[work]) as ex:
        instrument(ex, registry)
        ref = await ex.submit(work)
        await ex.flush()
        assert [r.task_id for r in store.recover("B", 10**6, lambda r: True, 3).claimed] == [
            ref.task_id
        ]
        assert (await ref.wait()).status is trioexec.TaskStatus.CANCELLED  # (lease_lost)
        kept = await ex.run(work)  # (not fenced: not counted so)
    assert kept == "done"
    fenced = {
        status: sample(registry, "trioexec_tasks_fenced_out_total", task="work", status=status)
        for status in ("completed", "failed", "cancelled")
    }
    assert fenced == {"completed": 1, "failed": None, "cancelled": None}
    assert sample(registry, "trioexec_tasks_completed_total", task="work", status="completed") == 2


# ------------------------------------------------------------ issue 30, item 18

LIVE = (
    "trioexec_tasks_active",
    "trioexec_tasks_deferred",
    "trioexec_queue_depth",
    "trioexec_slots",
)


def scraped(registry: CollectorRegistry) -> dict[str, list]:
    """A scrape, parsed back: the samples of each metric family by its name."""
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def live_series(registry: CollectorRegistry) -> set[tuple[str, str]]:
    """Each gauge of what is now, with each executor it has series for."""
    families = scraped(registry)
    return {(name, s.labels["executor"]) for name in LIVE for s in families.get(name, [])}


def of(*executors: str) -> set[tuple[str, str]]:
    return {(name, executor) for name in LIVE for executor in executors}


async def test_a_closed_executors_gauges_are_gone_and_its_counts_stay(registry):
    """Issue 30 item 18: a closed executor's slots were scraped as available
    (its other gauges too) until `Instrumentation.close`."""
    release = trio.Event()

    async def waits() -> None:
        await release.wait()

    async with open_executor() as other:
        instrument(other, registry, name="other")
        await other.submit(waits)
        async with open_executor(max_concurrent_tasks=3) as ex:
            instrument(ex, registry, name="ex")
            await ex.run(ok)
            await ex.submit(waits, name="waits")
            await trio.testing.wait_all_tasks_blocked()
            assert live_series(registry) == of("ex", "other")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ex.shutdown)  # (DRAIN: `waits` runs on)
                await trio.testing.wait_all_tasks_blocked()
                assert ex.closed
                assert live_series(registry) == of("ex", "other")  # draining: still at work
                assert sample(registry, "trioexec_slots", executor="ex", state="in_use") == 1
                release.set()
            # Drained, its block not left yet: it runs nothing more.
            assert live_series(registry) == of("other")
        assert live_series(registry) == of("other")
        assert sample(registry, "trioexec_slots", executor="other", state="available") == 4
        # Its counts stay (counters and histograms are totals).
        assert sample(registry, "trioexec_tasks_submitted_total", executor="ex", task="ok") == 1
        done = sample(
            registry,
            "trioexec_tasks_completed_total",
            executor="ex",
            task="waits",
            status="completed",
        )
        assert done == 1
        assert (
            sample(registry, "trioexec_task_duration_seconds_count", executor="ex", task="ok") == 1
        )
    assert live_series(registry) == of()


async def test_a_store_failed_executors_gauges_are_gone(registry, tmp_path):
    """A SQLite file another connection holds locked: the executor's next write
    fails, and the executor stops. Its gauges go at once (not at the block's end,
    nor at `Instrumentation.close`)."""
    path = tmp_path / "locked.db"
    lock = None
    with SQLiteStore(path, busy_timeout=0) as store:
        with pytest.raises(trioexec.StoreError, match="locked"):
            async with open_executor(store=store) as ex:
                instrument(ex, registry)
                await ex.submit(trio.sleep_forever)
                await ex.flush()
                await trio.testing.wait_all_tasks_blocked()
                assert sample(registry, "trioexec_slots", state="in_use") == 1
                lock = sqlite3.connect(path, isolation_level=None)
                lock.execute("BEGIN IMMEDIATE")  # (held: every write is refused)
                try:
                    await ex.submit(ok)
                    await ex.flush()
                finally:
                    # The store failed (the body learns it as the StoreError or
                    # as a cancellation): read at once, nothing awaited since.
                    at_once = live_series(registry)
                    lock.rollback()
    lock.close()
    assert at_once == of()
    assert live_series(registry) == of()
    assert sample(registry, "trioexec_tasks_submitted_total", task="sleep_forever") == 1


async def test_a_durable_workers_runs_are_counted_under_their_target(
    registry, tmp_path, autojump_clock, caplog
):
    """80 durable tasks made 80 ``task`` label values (``durable:<id>``): a worker
    names its runs by their target; a run's id (in its log record) says which
    task it was."""
    clock = FakeWallClock(0)
    with DurableStore(SQLiteStore(tmp_path / "durable.db", inline=True, clock=clock)) as ds:
        for n in range(80):
            await ds.promises.create(f"refund-{n}", 600, target="refunds", data=n)

        async def refund(n: int) -> int:
            if n == 13:
                raise ValueError("no refund 13")
            return n

        async with open_worker(ds, "refunds", refund) as worker:
            instrument(worker.executor, registry, name="refunds")
            with trio.fail_after(600):
                while worker.fulfilled < 80:
                    await trio.sleep(0.1)
        states = {(await ds.promises.get(f"refund-{n}")).state for n in range(80)}
    assert worker.rejected == 1
    assert states == {PromiseState.RESOLVED, PromiseState.REJECTED}
    families = scraped(registry)
    submitted = {
        s.labels["task"]: s.value
        for s in families["trioexec_tasks_submitted"]
        if s.name == "trioexec_tasks_submitted_total"
    }
    assert submitted == {"durable:refunds": 80}
    assert {s.labels["task"] for s in families["trioexec_task_duration_seconds"]} == {
        "durable:refunds"
    }
    (failed,) = [r for r in caplog.records if r.name == "trioexec" and r.levelname == "ERROR"]
    assert (failed.task_name, failed.task_id) == ("durable:refunds", "refund-13@1")
    assert "refund-13@1" in failed.getMessage()


async def test_the_task_label_is_bounded_by_default(registry):
    """Unless told, an executor has at most `MAX_TASK_NAMES` names of its own."""
    assert MAX_TASK_NAMES == 100
    async with open_executor() as ex:
        instrument(ex, registry)
        for n in range(MAX_TASK_NAMES + 20):
            await ex.submit(ok, name=f"name-{n}")
    submitted = {
        s.labels["task"]: s.value
        for s in scraped(registry)["trioexec_tasks_submitted"]
        if s.name == "trioexec_tasks_submitted_total"
    }
    assert len(submitted) == MAX_TASK_NAMES + 1
    assert submitted["name-99"] == 1
    assert submitted[OTHER] == 20
    assert "name-100" not in submitted
    # None still means no bound.
    unbounded = CollectorRegistry()
    async with open_executor() as ex:
        instrument(ex, unbounded, max_task_names=None)
        for n in range(MAX_TASK_NAMES + 20):
            await ex.submit(ok, name=f"name-{n}")
    assert sample(unbounded, "trioexec_tasks_submitted_total", task="name-119") == 1
    assert sample(unbounded, "trioexec_tasks_submitted_total", task=OTHER) is None
