"""A task of an executor waits for a durable promise without holding a slot
(`Promises.settled` with `TaskHandle.defer_until`), and says it waits on
``"promise <id>"`` (API §9) in its TaskRef and in the store."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from pg_server import STORE_KINDS

import trioexec
from trioexec import TaskHandle, TaskStatus
from trioexec.durable import DurableStore, NotFound, PromiseState
from trioexec.testing import FakeWallClock

ID = "approval [o'brien] 🚀"


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, store_maker: Any) -> Any:
    """One store for the executor and the durable promises (clock: Trio's)."""
    return store_maker(request.param, clock=FakeWallClock(start=1_000.0))


async def test_a_task_waits_for_a_promise_without_its_slot(
    store: Any, autojump_clock: trio.abc.Clock
) -> None:
    with DurableStore(store) as ds:
        await ds.promises.create(ID, timeout=3600)
        seen: list[object] = []

        async def approve(handle: TaskHandle) -> str | None:
            await handle.defer_until(ds.promises.settled(ID, poll=5))
            record = await ds.promises.get(ID)
            assert record is not None
            seen.append(record.state)
            return record.data

        async with trioexec.open_executor(store=store, max_concurrent_tasks=1) as ex:
            ref = await ex.submit(approve)
            await trio.sleep(1)
            assert ref.waiting_on == f"promise {ID}"
            await ex.flush()
            assert store.execution(ref.task_id).waiting_on == f"promise {ID}"
            # Its slot is free: another task runs meanwhile.
            other = await ex.submit(trio.sleep, 1)
            assert (await other.wait()).ok
            assert ref.status is TaskStatus.RUNNING
            await ds.promises.resolve(ID, data="yes")
            completion = await ref.wait()
        assert completion.ok
        assert completion.result == '"yes"'  # (the promise's data, as JSON)
        assert seen == [PromiseState.RESOLVED]
        # Looked every 5 s: it ended within a poll of the resolution.
        assert completion.finished_at - 1_000.0 <= 2 + 5 + 1


async def test_waiting_for_a_promise_that_does_not_exist_fails(
    store: Any, autojump_clock: trio.abc.Clock
) -> None:
    with DurableStore(store) as ds:

        async def waits(handle: TaskHandle) -> None:
            await handle.defer_until(ds.promises.settled("nope"))

        async with trioexec.open_executor(store=store) as ex:
            completion = await (await ex.submit(waits)).wait()
        assert completion.status is TaskStatus.FAILED
        assert isinstance(completion.error, NotFound)


@pytest.mark.parametrize("poll", [0, -1, float("inf"), float("nan"), "1"])
def test_a_bad_poll_is_refused(poll: object) -> None:
    with DurableStore(trioexec.MemoryStore()) as ds:
        with pytest.raises(ValueError, match="poll must be a positive number"):
            ds.promises.settled("p", poll=poll)  # type: ignore[arg-type]
