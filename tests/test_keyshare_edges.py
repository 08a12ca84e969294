"""Shared key limits, the review's cases (issue 17): a rate-only key asks the
store again when its bucket has a token (not when a task ends), cancel_pending
gives the key's slots back, a forgotten key gives back its unused tokens, and
PostgreSQL rounds keep the bound whatever the database's default isolation."""

from __future__ import annotations

import trio
import trio.testing
from store_rows import select

import trioexec
from trioexec import KeyLimit
from trioexec.testing import FakeWallClock

KEY = "api.example.com"


def memory_store() -> trioexec.MemoryStore:
    return trioexec.MemoryStore(clock=FakeWallClock(start=1_000.0))


async def test_rate_only_key_third_start_waits_for_the_refill_not_a_task_end(autojump_clock):
    """Rate 2/s, no concurrency, one executor, 3 tasks queued at once: the third
    may start 0.5 s later (the bucket's next token), not when a task ends (100 s)."""
    store = memory_store()
    starts: list[float] = []

    async def work() -> None:
        starts.append(trio.current_time())
        await trio.sleep(100)

    async with trioexec.open_executor(
        store=store, key_limits=KeyLimit(rate=2, per=1.0), lease=30.0
    ) as ex:
        t0 = trio.current_time()
        refs = [ex.submit_nowait(work, key=KEY) for _ in range(3)]
        for ref in refs:
            await ref.wait()
    assert sorted(s - t0 for s in starts)[2] <= 0.5 + 1e-6, starts


async def test_rate_only_key_hangs_when_the_started_tasks_wait_for_the_last(autojump_clock):
    """Same, where the first two wait for the third: it never starts (lost wake-up)."""
    store = memory_store()
    third_ran = trio.Event()

    async def waits() -> None:
        await third_ran.wait()

    async def third() -> None:
        third_ran.set()

    async with trioexec.open_executor(
        store=store, key_limits=KeyLimit(rate=2, per=1.0), lease=30.0
    ) as ex:
        refs = [ex.submit_nowait(waits, key=KEY) for _ in range(2)]
        refs.append(ex.submit_nowait(third, key=KEY))
        with trio.move_on_after(3600) as scope:
            for ref in refs:
                await ref.wait()
        stuck = scope.cancelled_caught
        if stuck:
            for ref in refs:
                ref.cancel()
    assert not stuck, "the third task never started although the bucket refilled"


async def test_cancel_pending_gives_the_key_back_to_other_executors(autojump_clock):
    """A's key tasks are let through (waiting for A's only slot), then
    cancel_pending ends them: A keeps holding both slots of the key in the
    store, and B's task of the key never starts while A lives."""
    store = memory_store()
    limits = KeyLimit(concurrency=2)
    release = trio.Event()
    blocker_started = trio.Event()

    async def blocker() -> None:
        blocker_started.set()
        await release.wait()

    async with trioexec.open_executor(
        store=store, key_limits=limits, lease=30.0, max_concurrent_tasks=1
    ) as a:
        await a.submit(blocker)  # (no key: holds A's only slot)
        await blocker_started.wait()
        for _ in range(2):
            a.submit_nowait(trio.sleep, 0, key=KEY)
        await trio.testing.wait_all_tasks_blocked()
        assert a._core.keyshare.held() == {KEY: 2}
        assert a.cancel_pending() == 2
        async with trioexec.open_executor(store=store, key_limits=limits, lease=30.0) as b:
            ref = await b.submit(trio.sleep, 0, key=KEY)
            with trio.move_on_after(60) as scope:
                await ref.wait()
            held_by_a = a._core.keyshare.held()
            if scope.cancelled_caught:
                ref.cancel()
            release.set()
    assert held_by_a == {}, f"A still holds {held_by_a} a minute after cancel_pending"
    assert not scope.cancelled_caught


async def test_a_forgotten_key_gives_back_its_unused_tokens(autojump_clock):
    """A took K's only token for a task that was then cancelled before it
    started; with more than 1,024 keys the idle KeyState is forgotten at once,
    and with it the token: the store's bucket stays empty for a whole ``per``."""
    store = memory_store()
    limits = {"K": KeyLimit(rate=1, per=60.0)}
    release = trio.Event()
    n = 1100

    async def hold() -> None:
        await release.wait()

    async with trioexec.open_executor(
        store=store, key_limits=limits, lease=30.0, max_concurrent_tasks=n
    ) as a:
        for i in range(n):
            a.submit_nowait(hold, key=f"other{i}")  # (unlimited keys: n states, slots full)
        await trio.testing.wait_all_tasks_blocked()
        # A slot looks free when the token is asked for (it is then taken by
        # another task: here, none was free).
        a._core.keyshare.free_slots = lambda: 1
        ref = a.submit_nowait(trio.sleep, 0, key="K")
        await trio.testing.wait_all_tasks_blocked()
        assert a._core.pending.keys.states["K"].tokens == 1.0  # (its token, earmarked)
        ref.cancel()
        await trio.testing.wait_all_tasks_blocked()
        bucket = select(store, "SELECT tokens, stamp FROM key_buckets WHERE key = 'K'")
        release.set()
    assert bucket == [], f"the token was never given back: bucket {bucket}"


def test_postgres_rounds_keep_the_bound_under_repeatable_read(store_maker, monkeypatch):
    """key_round relies on READ COMMITTED (each statement after the advisory
    lock sees the previous holder's commit) but never sets it: on a database
    whose default_transaction_isolation is REPEATABLE READ, the snapshot is
    taken by the lock statement itself, before the lock is granted, and racing
    owners each see the key as free."""

    from test_store_key_ledger import Clock, most_held_in_racing_threads

    monkeypatch.setenv("PGOPTIONS", "-c default_transaction_isolation=repeatable\\ read")
    limit = 3
    stores = [store_maker("postgres", clock=Clock()) for _ in range(4)]
    assert most_held_in_racing_threads(stores, limit) <= limit
