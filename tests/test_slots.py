import pytest
import trio
import trio.testing

from trioexec import SlotPool, SlotToken


async def test_acquire_release_accounting():
    pool = SlotPool(2)
    assert (pool.total, pool.in_use, pool.available) == (2, 0, 2)
    assert isinstance(pool.limiter, trio.CapacityLimiter)
    token = await pool.acquire()
    assert token.is_held
    assert (pool.in_use, pool.available) == (1, 1)
    assert token.release() is True
    assert not token.is_held
    assert (pool.in_use, pool.available) == (0, 2)


async def test_release_is_idempotent_and_never_blocks():
    pool = SlotPool(1)
    token = await pool.acquire()
    assert token.release() is True
    assert token.release() is False
    assert token.release() is False
    assert pool.in_use == 0


async def test_reclaim_while_held_raises():
    pool = SlotPool(2)
    token = await pool.acquire()
    with pytest.raises(RuntimeError, match="already holds"):
        await token.reclaim()
    assert pool.in_use == 1


@pytest.mark.parametrize("bad", [0, -1, 0.5, 1.5])
def test_total_below_one_or_fractional_is_value_error(bad):
    with pytest.raises(ValueError, match=str(bad)):
        SlotPool(bad)
    pool = SlotPool(1)
    with pytest.raises(ValueError, match=str(bad)):
        pool.total = bad
    assert pool.total == 1


@pytest.mark.parametrize("bad", ["2", True, None])
def test_total_must_be_int(bad):
    with pytest.raises(TypeError):
        SlotPool(bad)


async def test_context_manager_releases_on_normal_exit_and_error():
    pool = SlotPool(1)
    with await pool.acquire() as token:
        assert token.is_held
    assert pool.in_use == 0
    with pytest.raises(KeyError):
        with await pool.acquire():
            raise KeyError("boom")
    assert pool.in_use == 0


async def test_context_manager_releases_on_cancel(autojump_clock):
    pool = SlotPool(1)
    with trio.move_on_after(1):
        with await pool.acquire():
            await trio.sleep(10)
    assert pool.in_use == 0


async def test_context_manager_after_manual_release_is_fine():
    pool = SlotPool(1)
    with await pool.acquire() as token:
        token.release()
    assert pool.in_use == 0


async def test_reclaim_waits_fifo(autojump_clock):
    pool = SlotPool(1)
    holder = await pool.acquire()
    order = []

    async def waiter(i, token):
        await token.reclaim()
        order.append(i)
        await trio.sleep(1)
        token.release()

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(waiter, i, pool.token())
            # Each waiter queues before the next starts.
            await trio.testing.wait_all_tasks_blocked()
        assert pool.waiting == 5
        holder.release()
    assert order == [0, 1, 2, 3, 4]


async def test_cancelled_reclaim_takes_no_slot(autojump_clock):
    pool = SlotPool(1)
    holder = await pool.acquire()
    token = pool.token()
    with trio.move_on_after(5):
        await token.reclaim()
    assert not token.is_held
    assert pool.in_use == 1
    holder.release()
    assert pool.in_use == 0


async def test_grow_wakes_waiters_and_shrink_lets_holders_finish():
    pool = SlotPool(1)
    first = await pool.acquire()
    second = pool.token()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(second.reclaim)
        await trio.testing.wait_all_tasks_blocked()
        assert not second.is_held
        pool.total = 2  # grows: the waiter gets in at once
    assert second.is_held
    assert pool.in_use == 2

    pool.total = 1  # shrink below use: holders keep their slots
    assert pool.in_use == 2
    assert pool.available == 0
    third = pool.token()
    assert not third.try_reclaim()
    first.release()
    assert not third.try_reclaim()  # still 1 in use of 1
    second.release()
    assert third.try_reclaim()


async def test_reclaim_is_a_checkpoint_even_when_a_slot_is_free():
    pool = SlotPool(1)
    token = SlotToken(pool)
    with trio.CancelScope() as scope:
        scope.cancel()
        await token.reclaim()
    assert scope.cancelled_caught
    assert not token.is_held


async def test_try_reclaim_takes_a_free_slot_without_waiting_and_keeps_fifo():
    pool = SlotPool(1)
    first = pool.token()
    assert first.try_reclaim()
    assert first.is_held
    with pytest.raises(RuntimeError, match="already holds"):
        first.try_reclaim()
    second, third = pool.token(), pool.token()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(second.reclaim)
        await trio.testing.wait_all_tasks_blocked()
        assert pool.reclaiming == 1
        first.release()  # handed to `second`, who was queued: nobody jumps the line
        assert not third.try_reclaim()
    assert second.is_held
    assert pool.reclaiming == 0


async def test_on_resize_is_told_after_every_resize():
    pool = SlotPool(2)
    seen = []
    pool.on_resize(lambda: seen.append(pool.total))
    pool.total = 5
    pool.total = 1
    assert seen == [5, 1]
