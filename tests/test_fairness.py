"""Fair order over admission keys (API.md section 13, ``fairness="keys"``)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import trioexec
from trioexec import DeterministicExecutor, KeyLimit, open_executor


async def _started_order(
    submissions: list[tuple[str, str | None]],
    priorities: dict[str, int] | None = None,
    **options: object,
) -> list[str]:
    """Submit ``(name, key)`` pairs (with ``priorities`` by name, else 0) to a
    one-slot executor held busy, then let them run: the order they started in."""
    started: list[str] = []
    gate = trio.Event()

    async def blocker() -> None:
        await gate.wait()

    async def task(name: str) -> None:
        started.append(name)

    async with open_executor(max_concurrent_tasks=1, **options) as ex:  # type: ignore[arg-type]
        await ex.submit(blocker)
        await trio.testing.wait_all_tasks_blocked()
        for name, key in submissions:
            priority = (priorities or {}).get(name, 0)
            await ex.submit(task, name, key=key, name=name, priority=priority)
        gate.set()
    return started


async def test_the_contracts_example(autojump_clock: trio.testing.MockClock) -> None:
    subs = [("A1", "a"), ("A2", "a"), ("A3", "a"), ("B1", "b"), ("B2", "b")]
    assert await _started_order(subs, fairness="keys") == ["A1", "B1", "A2", "B2", "A3"]
    # The default: submission order.
    assert await _started_order(subs) == ["A1", "A2", "A3", "B1", "B2"]


async def test_keyless_tasks_are_one_group(autojump_clock: trio.testing.MockClock) -> None:
    subs = [("N1", None), ("N2", None), ("A1", "a"), ("A2", "a"), ("N3", None)]
    assert await _started_order(subs, fairness="keys") == ["N1", "A1", "N2", "A2", "N3"]


async def test_priority_comes_first(autojump_clock: trio.testing.MockClock) -> None:
    subs = [("A1", "a"), ("A2", "a"), ("B1", "b"), ("B2", "b")]
    order = await _started_order(subs, {"B1": 5, "B2": 5}, fairness="keys")
    assert order == ["B1", "B2", "A1", "A2"]


async def test_a_new_key_joins_after_the_key_that_started_last(
    autojump_clock: trio.testing.MockClock,
) -> None:
    started: list[str] = []
    gates = {name: trio.Event() for name in ("A1", "B1")}

    async def task(name: str) -> None:
        started.append(name)
        if name in gates:
            await gates[name].wait()

    async with open_executor(max_concurrent_tasks=1, fairness="keys") as ex:
        for name, key in [("A1", "a"), ("A2", "a"), ("A3", "a"), ("B1", "b"), ("B2", "b")]:
            await ex.submit(task, name, key=key)
        await trio.testing.wait_all_tasks_blocked()
        gates["A1"].set()
        await trio.testing.wait_all_tasks_blocked()
        assert started == ["A1", "B1"]
        await ex.submit(task, "C1", key="c")  # B started last: C comes next, then A
        gates["B1"].set()
    assert started == ["A1", "B1", "C1", "A2", "B2", "A3"]


async def test_fair_order_under_key_limits(autojump_clock: trio.testing.MockClock) -> None:
    subs = [("A1", "a"), ("A2", "a"), ("A3", "a"), ("B1", "b"), ("B2", "b")]
    order = await _started_order(subs, fairness="keys", key_limits=KeyLimit(concurrency=1))
    assert order == ["A1", "B1", "A2", "B2", "A3"]


@pytest.mark.parametrize("bad", ["key", "KEYS", 1, True, ""])
async def test_any_other_value_is_a_value_error_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match=r"fairness must be None or 'keys', got"):
        async with open_executor(fairness=bad):  # type: ignore[arg-type]
            pass


async def test_the_deterministic_executor_takes_it_too() -> None:
    ex = DeterministicExecutor(max_concurrent_tasks=1, fairness="keys")
    started: list[str] = []

    async def task(name: str) -> None:
        started.append(name)

    for name, key in [("A1", "a"), ("A2", "a"), ("A3", "a"), ("B1", "b"), ("B2", "b")]:
        ex.submit_nowait(task, name, key=key)
    await ex.run_ready()
    assert started == ["A1", "B1", "A2", "B2", "A3"]


def test_it_is_an_option_of_open_executor() -> None:
    assert "fairness" in trioexec._executor.ExecutorOptions.__annotations__


@given(
    keys=st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=40),
)
@settings(max_examples=200, deadline=None)
def test_a_batch_starts_in_turns(keys: list[str | None]) -> None:
    """Tasks of one priority submitted at once start in turns: at every point of
    the start order, no key (keyless tasks being one) has started two more than
    another that still had a task waiting then."""
    started: list[str | None] = []

    async def main() -> None:
        ex = DeterministicExecutor(max_concurrent_tasks=1, fairness="keys")

        async def task(key: str | None) -> None:
            started.append(key)

        for key in keys:
            ex.submit_nowait(task, key, key=key)
        await ex.run_ready()

    trio.run(main)
    assert sorted(started, key=str) == sorted(keys, key=str)
    total = {k: keys.count(k) for k in set(keys)}
    done = dict.fromkeys(total, 0)
    for key in started:
        waiting = [k for k in total if done[k] < total[k] and k != key]
        assert all(done[key] <= done[k] for k in waiting), (keys, started)
        done[key] += 1


async def test_many_keys_used_once_are_forgotten(autojump_clock: trio.testing.MockClock) -> None:
    async def task() -> None:
        pass

    async with open_executor(max_concurrent_tasks=4, fairness="keys") as ex:
        for n in range(5000):
            await ex.submit(task, key=f"customer-{n}")
        await ex.wait_for_idle()
        kept = len(ex._core.pending._rounds)
    assert kept <= 2048, kept
