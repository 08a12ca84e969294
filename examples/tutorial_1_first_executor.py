"""Tutorial, part 1: open an executor, submit tasks, read their completions.

Shows `trioexec.open_executor`, ``await ex.submit(fn, *args)`` returning a
`trioexec.TaskRef`, ``await ref.wait()`` returning a `trioexec.TaskCompletion`,
``await ex.run(...)`` (submit, wait and unwrap in one call), that a failing task's
error is captured in its completion instead of raised, and that at most
``max_concurrent_tasks`` tasks run at once.

Run it with ``python examples/tutorial_1_first_executor.py`` (about 0.3 s). It
asserts what it shows, so a regression makes it fail.
"""

from __future__ import annotations

import functools

import trio
import trio.testing

import trioexec
from trioexec import TaskStatus


async def add(a: int, b: int) -> int:
    await trio.sleep(0.1)  # stands for real work: I/O, a request, ...
    return a + b


async def greet(name: str, *, punctuation: str = ".") -> str:
    return f"hello, {name}{punctuation}"


async def divide(a: float, b: float) -> float:
    return a / b


async def main() -> None:
    async with trioexec.open_executor(max_concurrent_tasks=2) as ex:
        # submit() returns a TaskRef as soon as the task is accepted ...
        ref = await ex.submit(add, 1, 2)
        # ... and ref.wait() returns its TaskCompletion once it has finished.
        completion = await ref.wait()
        print(completion.status, completion.ok, completion.result)  # completed True 3
        assert completion.status is TaskStatus.COMPLETED
        assert completion.ok
        assert completion.result == 3

        # run() is submit + wait + unwrap: the value, or the task's exception.
        assert await ex.run(add, 3, 4) == 7

        # Arguments are positional, as with nursery.start_soon: use
        # functools.partial for keyword arguments.
        assert await ex.run(functools.partial(greet, "trio", punctuation="!")) == "hello, trio!"

        # A failing task does not raise out of the executor: its error is in
        # the completion. Only run() re-raises it.
        failed = await (await ex.submit(divide, 1, 0)).wait()
        print(failed.status, repr(failed.error))  # failed ZeroDivisionError(...)
        assert failed.status is TaskStatus.FAILED
        assert not failed.ok
        assert isinstance(failed.error, ZeroDivisionError)
        try:
            await ex.run(divide, 1, 0)
        except ZeroDivisionError:
            pass
        else:
            raise AssertionError("run() should re-raise the task's error")

        # Two slots: of four 0.1 s tasks, two run and two wait in the queue, so
        # they take two rounds, about 0.2 s.
        start = trio.current_time()
        refs = [await ex.submit(add, i, i) for i in range(4)]
        await trio.testing.wait_all_tasks_blocked()  # until the first two are running
        stats = ex.statistics()
        print(f"active {stats.active_count}, queued {stats.queue_depth}")  # active 2, queued 2
        assert (stats.active_count, stats.queue_depth) == (2, 2)
        results = [(await r.wait()).result for r in refs]
        elapsed = trio.current_time() - start
        print(results, f"in {elapsed:.2f}s")  # [0, 2, 4, 6] in 0.20s
        assert results == [0, 2, 4, 6]
        assert elapsed >= 0.2, elapsed

    # Leaving the block waited for everything (ShutdownPolicy.DRAIN).
    stats = ex.statistics()
    print(f"completed {stats.completed_count}, failed {stats.failed_count}")
    assert stats.completed_count == 7
    assert stats.failed_count == 2


if __name__ == "__main__":
    trio.run(main)
