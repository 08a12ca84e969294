"""Mistakes a user's ``mypy --strict`` must catch in code that uses trioexec.

Checked, not run: ``tests/test_typing.py`` runs mypy over this file and expects
an error on every line marked ``# E: <what>`` (``<what>`` is found in mypy's
message, its ``[code]`` included) and on no other line.
"""

from __future__ import annotations

import trio

import trioexec
from trioexec import DeterministicExecutor, TaskCompletion, TaskHandle, TaskRef


async def add(a: int, b: int) -> int:
    return a + b


async def wait_for(event: trio.Event, handle: TaskHandle) -> str:
    await handle.defer_until(event)
    return "done"


async def keyword_handle(n: int, *, handle: TaskHandle) -> str:
    return str(n)


def crunch(data: list[int]) -> int:
    return sum(data)


@trioexec.task(retries=2)
async def fetch(url: str) -> bytes:
    return url.encode()


async def mistakes() -> None:
    async with trioexec.open_executor(max_concurrent_tasks=2) as ex:
        # arguments that do not fit the function
        await ex.submit(add, 1, "2")  # E: arg-type
        await ex.submit(add, 1)  # E: arg-type
        await ex.submit(add, 1, 2, 3)  # E: arg-type
        await ex.run(crunch, ["1"])  # E: arg-type
        ex.submit_nowait(fetch, 7)  # E: arg-type
        await ex.run(keyword_handle, "1")  # E: arg-type
        # the handle is injected: it is not the caller's to pass as an argument
        await ex.submit(wait_for)  # E: Too few arguments
        # options are keyword-only, and typed
        await ex.submit(add, 1, 2, prio=1)  # E: Unexpected keyword argument "prio"
        await ex.submit(add, 1, 2, name=3)  # E: call-overload
        await ex.submit(add, 1, 2, priority="high")  # E: call-overload

        # the value's type follows the function's
        text: str = await ex.run(add, 1, 2)  # E: Awaitable[str]
        ref: TaskRef[str] = await ex.submit(add, 1, 2)  # E: Awaitable[str]
        completion = await (await ex.submit(fetch, "u")).wait()
        print(completion.unwrap() + "x")  # E: Unsupported operand types for +
        number: TaskCompletion[int] = completion  # E: assignment
        # a missing await
        task_id = ex.submit(add, 1, 2).task_id  # E: attr-defined
        print(text, ref, number, task_id)

    # open_executor's and DeterministicExecutor's options are keyword-only
    async with trioexec.open_executor(4) as ex:  # E: Too many positional arguments
        pass
    det = DeterministicExecutor(1)  # E: Too many positional arguments
    det.submit_nowait(crunch, "x")  # E: arg-type


@trioexec.task(retrys=3)  # E: Unexpected keyword argument "retrys"
async def misspelt() -> None:
    pass
