"""The public API's types, as a user's ``mypy --strict`` sees them (API.md §12).

Checked, not run: ``tests/test_typing.py`` runs mypy over this file and expects
no error. Every ``assert_type`` states what a user's code gets, with no cast.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, assert_type

import trio

import trioexec
from trioexec import (
    Context,
    DeterministicExecutor,
    Executor,
    TaskCompletion,
    TaskHandle,
    TaskRef,
    TaskSpec,
    Workflow,
    WorkflowResult,
)

# ---------------------------------------------------------------- task functions


async def fetch(url: str) -> bytes:
    return url.encode()


async def add(a: int, b: int) -> int:
    return a + b


async def nothing() -> None:
    pass


async def wait_for(event: trio.Event, handle: TaskHandle) -> str:
    await handle.defer_until(event)
    return handle.task_id


async def any_name(size: int, h: TaskHandle) -> float:  # annotated: injected under any name
    return size / 2


async def optional_handle(n: int, handle: TaskHandle | None = None) -> int:
    return n


async def keyword_handle(n: int, *, handle: TaskHandle) -> str:
    return str(n)


async def keyword_task_handle(*, task_handle: TaskHandle) -> str:
    return task_handle.task_id


def crunch(data: list[int]) -> int:  # a plain def: runs in a worker thread
    return sum(data)


def crunch_deferring(data: list[int], handle: TaskHandle) -> list[int]:
    handle.defer_until_sync(lambda: True)
    return sorted(data)


class Client:
    async def get(self, path: str) -> dict[str, int]:
        return {path: 1}


@trioexec.task
async def bare_spec(url: str) -> bytes:
    return url.encode()


@trioexec.task(id="with_options", retries=3, timeout=10.0, key="api", priority=1)
async def spec_with_handle(n: int, handle: TaskHandle) -> list[str]:
    return [handle.task_id] * n


@trioexec.task
def sync_spec(n: int) -> str:
    return "x" * n


@trioexec.task(dependencies=["load"])
async def step(context: Context, handle: TaskHandle) -> None:
    context["seen"] = handle.task_id


@trioexec.task(id="load")
async def load(context: Context) -> None:
    context["loaded"] = True


# ---------------------------------------------------------------- specs


# (assignments: assert_type would want the parameters' names too)
bare_spec_type: TaskSpec[[str], Coroutine[Any, Any, bytes]] = bare_spec
with_handle_type: TaskSpec[[int, TaskHandle], Coroutine[Any, Any, list[str]]] = spec_with_handle
sync_spec_type: TaskSpec[[int], str] = sync_spec


async def check_specs() -> None:
    assert_type(await bare_spec("u"), bytes)
    assert_type(sync_spec(3), str)  # still callable like the function
    assert_type(bare_spec.id, str)
    assert_type(bare_spec.dependencies, tuple[str, ...])
    assert_type(bare_spec.requires_handle, bool)
    any_spec: TaskSpec = step  # a bare TaskSpec takes any spec
    assert_type(any_spec, TaskSpec[..., Any])


# ---------------------------------------------------------------- code generic over tasks

T = TypeVar("T")


async def submit_each(
    ex: Executor, fn: Callable[[int], Awaitable[T]], items: list[int]
) -> list[TaskRef[T]]:
    return [await ex.submit(fn, item) for item in items]


async def run_untyped(ex: Executor, fn: Callable[..., Any], *args: Any) -> Any:
    return await ex.run(fn, *args)


async def check_generic_code(ex: Executor) -> None:
    assert_type(await submit_each(ex, fetch_length, [1, 2]), list[TaskRef[int]])
    assert_type(await run_untyped(ex, add, 1, 2), Any)
    pair = (1, 2)
    assert_type(await ex.run(add, *pair), int)  # a tuple of known length unpacks
    untyped: Callable[..., Any] = add
    assert_type(await ex.submit(untyped, "anything"), TaskRef[Any])


async def fetch_length(n: int) -> int:
    return n


# ---------------------------------------------------------------- the executor


async def check_executor() -> None:
    async with trioexec.open_executor(
        max_concurrent_tasks=2,
        overflow=trioexec.Overflow.REJECT,
        key_limits=trioexec.KeyLimit(concurrency=1),
        tasks=[bare_spec, spec_with_handle],
    ) as ex:
        assert_type(ex, Executor)

        # submit: TaskRef[T] of what the function returns
        ref = await ex.submit(fetch, "https://example.com", name="get", key="example.com")
        assert_type(ref, TaskRef[bytes])
        completion = await ref.wait()
        assert_type(completion, TaskCompletion[bytes])
        assert_type(completion.unwrap(), bytes)
        assert_type(completion.result, bytes)
        assert_type(completion.ok, bool)
        assert_type(completion.error, BaseException | None)
        assert_type(completion.status, trioexec.TaskStatus)
        assert_type(ref.completion, TaskCompletion[bytes] | None)
        assert_type(ref.task_id, str)
        assert_type(ref.status, trioexec.TaskStatus)
        assert_type(ref.sub_status, trioexec.SubStatus | None)
        assert_type(ref.waiting_on, str | None)
        ref.cancel()

        assert_type(await ex.submit(add, 1, 2, priority=5, timeout=1.0), TaskRef[int])
        assert_type(await ex.submit(nothing), TaskRef[None])
        assert_type(ex.submit_nowait(add, 1, 2, task_id="sum-1"), TaskRef[int])

        # run: the value itself
        assert_type(await ex.run(fetch, "u"), bytes)
        assert_type(await ex.run(add, 1, 2), int)
        assert_type(await ex.run(nothing), None)

        # a handle is injected, so it is not among the arguments
        event = trio.Event()
        assert_type(await ex.submit(wait_for, event), TaskRef[str])
        assert_type(await ex.run(wait_for, event), str)
        assert_type(await ex.submit(any_name, 3), TaskRef[float])
        assert_type(await ex.submit(optional_handle, 3), TaskRef[int])
        # keyword-only handles: the arguments are checked, the value is Any
        assert_type(await ex.submit(keyword_handle, 3), TaskRef[Any])
        assert_type(await ex.submit(keyword_task_handle), TaskRef[Any])
        assert_type(await ex.run(keyword_handle, 3), Any)

        # plain functions (threads), with and without a handle
        assert_type(await ex.submit(crunch, [1, 2]), TaskRef[int])
        assert_type(await ex.run(crunch, [1, 2]), int)
        assert_type(await ex.submit(crunch_deferring, [3, 1]), TaskRef[list[int]])
        assert_type(ex.submit_nowait(crunch_deferring, [3, 1]), TaskRef[list[int]])

        # specs are typed like their functions
        assert_type(await ex.submit(bare_spec, "u"), TaskRef[bytes])
        assert_type(await ex.run(spec_with_handle, 2), list[str])
        assert_type(await ex.submit(sync_spec, 4), TaskRef[str])

        # bound methods, lambdas and partials
        client = Client()
        assert_type(await ex.run(client.get, "/"), dict[str, int])
        assert_type(await ex.run(lambda: 5), int)
        assert_type(await ex.run(functools.partial(add, 1), 2), int)

        # refs of different values together
        refs: list[TaskRef[object]] = [ref, await ex.submit(add, 1, 2)]
        done: list[TaskCompletion[object]] = [await r.wait() for r in refs]
        assert_type(done[0].result, object)

        # the module-level helpers and the rest of the facade
        assert_type(ex.cancel_pending(), int)
        assert_type(ex.statistics(), trioexec.ExecutorMetrics)
        await ex.wait_for_idle()

        # workflows
        wf = Workflow("etl", [load, step])
        result = await ex.run_workflow(wf, context={"job_id": 7})
        assert_type(result, WorkflowResult)
        assert_type(result.steps["load"], TaskCompletion[Any])
        run = await ex.start_workflow(wf)
        assert_type(await run.wait(), WorkflowResult)


async def check_deterministic() -> None:
    ex = DeterministicExecutor(max_concurrent_tasks=1)
    ref = ex.submit_nowait(add, 1, 2)
    assert_type(ref, TaskRef[int])
    assert_type(ex.submit_nowait(wait_for, trio.Event()), TaskRef[str])
    assert_type(ex.submit_nowait(bare_spec, "u", name="n"), TaskRef[bytes])
    assert_type(ex.submit_nowait(crunch, [1]), TaskRef[int])
    completions = await ex.run_ready()
    assert_type(completions, list[TaskCompletion[Any]])
    assert_type((await ref.wait()).unwrap(), int)
