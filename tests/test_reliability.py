"""Regression tests for the edges of issue 13: each one failed before its fix.

Numbers in the test names are the issue's defect numbers.
"""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

import trioexec
from trioexec import (
    MemoryStore,
    SQLiteStore,
    StoreError,
    TaskHandle,
    TaskStatus,
    open_executor,
)

from faults import FaultyStore

# ----------------------------------------------------------------- 1, 2: store failures


async def test_01_exit_ends_when_closing_the_store_fails(autojump_clock):
    store = FaultyStore(MemoryStore())
    with trio.fail_after(5):  # before the fix: hung forever in a shielded scope
        with pytest.raises(StoreError, match="injected failure in release_owner"):
            async with open_executor(store=store) as ex:
                await ex.run(trio.sleep, 0)
                store.fail_on.add("release_owner")


async def test_01_exit_ends_when_the_last_write_fails(autojump_clock):
    store = FaultyStore(MemoryStore())
    with trio.fail_after(5):
        with pytest.raises(StoreError, match="injected failure in write"):
            async with open_executor(store=store) as ex:
                ex.submit_nowait(trio.sleep, 1)
                await trio.testing.wait_all_tasks_blocked()
                store.fail_on.add("write")


async def test_02_store_failure_is_one_error_and_every_wait_returns(autojump_clock):
    store = FaultyStore(MemoryStore())
    outcomes: list[object] = []
    release = trio.Event()

    async def wait_on(ref: trioexec.TaskRef) -> None:
        try:
            outcomes.append(await ref.wait())
        except StoreError as exc:
            outcomes.append(exc)

    with trio.fail_after(100):
        async with trio.open_nursery() as outside:  # waiters outside the executor
            with pytest.raises(StoreError) as info:
                async with open_executor(store=store) as ex:
                    refs = [await ex.submit(release.wait) for _ in range(3)]
                    pending = await ex.submit(trio.sleep, 1)  # queued behind them
                    for ref in [*refs, pending]:
                        outside.start_soon(wait_on, ref)
                    await trio.testing.wait_all_tasks_blocked()
                    store.fail_on.add("write")
                    await ex.submit(trio.sleep, 0)  # gives the writer something to fail on
                    await trio.sleep(10)
                    pytest.fail("the body should have been cancelled by the failure")
    assert type(info.value) is StoreError  # not inside an ExceptionGroup
    assert "faulty.db" in str(info.value)
    assert len(outcomes) == 4
    assert all(isinstance(o, StoreError) for o in outcomes), outcomes


async def test_02_wait_after_the_failure_raises_at_once(autojump_clock):
    store = FaultyStore(MemoryStore())
    with pytest.raises(StoreError):
        async with open_executor(store=store) as ex:
            ref = await ex.submit(trio.sleep_forever)
            store.fail_on.add("write")
            await trio.sleep(1)
    with trio.fail_after(1):
        with pytest.raises(StoreError, match="faulty.db"):
            await ref.wait()
        with pytest.raises(StoreError):
            await ex.flush()


async def test_02_heartbeat_failure_stops_the_executor(autojump_clock):
    store = FaultyStore(MemoryStore())
    with trio.fail_after(100):
        with pytest.raises(StoreError, match="injected failure in heartbeat"):
            async with open_executor(store=store, lease=3.0) as ex:
                await ex.submit(trio.sleep_forever)
                store.fail_on.add("heartbeat")
                await trio.sleep_forever()


async def test_02_store_error_from_a_real_file(tmp_path, autojump_clock):
    store = SQLiteStore(tmp_path / "runs.db", inline=True)
    with pytest.raises(StoreError) as info:
        async with open_executor(store=store) as ex:
            await ex.run(trio.sleep, 0)
            ex.submit_nowait(trio.sleep, 1)
            store.close()  # every later write fails
            await trio.sleep(5)
    assert type(info.value) is StoreError
    assert str(tmp_path / "runs.db") in str(info.value)


# ----------------------------------------------------------------- 7: groups


async def test_07_a_users_exception_group_reaches_them_as_it_is():
    group = ExceptionGroup("mine", [ValueError("a")])
    with pytest.raises(ExceptionGroup) as info:
        async with open_executor():
            raise group
    assert info.value is group

    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [KeyError("k")])])
    with pytest.raises(ExceptionGroup) as info:
        async with open_executor(store=MemoryStore()):
            raise nested
    assert info.value is nested


async def test_07_a_single_error_is_still_unwrapped():
    with pytest.raises(KeyError):
        async with open_executor(store=MemoryStore()):
            raise KeyError("k")
