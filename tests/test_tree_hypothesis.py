"""The task tree under random trees, cancels and deadlines (API.md §13): no
descendant outlives a cancelled or timed-out ancestor, nor an ancestor's
deadline (also once that ancestor has ended), and no detached task is touched. Hypothesis draws the
tree; each example runs on Trio's autojump clock."""

from __future__ import annotations

import math
from typing import Any

import attrs
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import trioexec
from trioexec import TaskHandle, TaskStatus

ENDED_BY_TREE = "its ancestor"


@attrs.frozen
class Node:
    parent: int | None  #: submitted by that node's code (None: from outside)
    detached: bool
    timeout: int | None
    behaviour: str  #: "defer", "sleep" or "forever"
    seconds: int


@attrs.frozen
class Plan:
    nodes: list[Node]
    cancels: list[tuple[int, int]]  #: (at, node): cancel that node's ref then
    slots: int


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    count = draw(st.integers(1, 10))
    nodes = []
    for i in range(count):
        parent = None if i == 0 else draw(st.one_of(st.none(), st.integers(0, i - 1)))
        nodes.append(
            Node(
                parent,
                parent is not None and draw(st.booleans()),
                draw(st.one_of(st.none(), st.integers(1, 30))),
                draw(st.sampled_from(["defer", "sleep", "forever"])),
                draw(st.integers(0, 40)),
            )
        )
    cancels = draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, count - 1)), max_size=4))
    return Plan(nodes, sorted(cancels), draw(st.integers(1, 4)))


def run(plan: Plan) -> tuple[dict[int, Any], dict[int, float], dict[int, float], float]:
    """Run ``plan``; the completion, start and end time (Trio's clock) of each
    node that was submitted, and when the final clean-up began."""
    refs: dict[int, trioexec.TaskRef[Any]] = {}
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    completions: dict[int, Any] = {}
    children = {
        i: [j for j, n in enumerate(plan.nodes) if n.parent == i] for i in range(len(plan.nodes))
    }
    cleanup = [math.inf]

    async def main() -> None:
        async with (
            trio.open_nursery() as watchers,
            trioexec.open_executor(
                max_concurrent_tasks=plan.slots, queue_capacity=64, report_unread_failures=False
            ) as ex,
        ):

            async def watch(i: int, ref: trioexec.TaskRef[Any]) -> None:
                completions[i] = await ref.wait()
                ended[i] = trio.current_time()

            async def submit(i: int) -> None:
                node = plan.nodes[i]
                ref = await ex.submit(body, i, timeout=node.timeout, detached=node.detached)
                refs[i] = ref
                watchers.start_soon(watch, i, ref)

            async def body(i: int, handle: TaskHandle) -> int:
                started[i] = trio.current_time()
                for j in children[i]:
                    await submit(j)
                node = plan.nodes[i]
                if node.behaviour == "sleep":
                    await trio.sleep(node.seconds)
                elif node.behaviour == "defer":
                    woken = trio.Event()
                    watchers.start_soon(wake, woken, node.seconds)
                    await handle.defer_until(woken)
                else:
                    await trio.sleep_forever()
                return i

            async def wake(event: trio.Event, seconds: float) -> None:
                await trio.sleep(seconds)
                event.set()

            for i, node in enumerate(plan.nodes):
                if node.parent is None:
                    await submit(i)
            now = 0.0
            for at, i in plan.cancels:
                await trio.sleep(at - now)
                now = at
                if i in refs:
                    refs[i].cancel()
            await trio.sleep(100 - now)  # (every timeout and sleep is over by then)
            cleanup[0] = trio.current_time()
            for ref in refs.values():
                ref.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return completions, started, ended, cleanup[0]


def ancestors(plan: Plan, i: int) -> list[int]:
    """``i``'s ancestors in the tree, nearest first (a detached node has none)."""
    found = []
    node = plan.nodes[i]
    while node.parent is not None and not node.detached:
        found.append(node.parent)
        node = plan.nodes[node.parent]
    return found


@settings(max_examples=150, deadline=None)
@given(plans())
def test_no_descendant_outlives_a_cancelled_or_timed_out_ancestor(plan: Plan) -> None:
    completions, started, ended, cleanup = run(plan)
    assert set(completions) == set(ended)
    for d, completion in completions.items():
        above = ancestors(plan, d)
        for a in above:
            if a not in completions:
                continue
            stopped = completions[a].status in (TaskStatus.CANCELLED, TaskStatus.TIMED_OUT)
            if stopped and ended[a] < cleanup:
                # it ended no later than its ancestor did (pending ones without running)
                assert ended[d] <= ended[a], (plan, d, a)
                if d not in started:
                    assert completion.status in (TaskStatus.CANCELLED, TaskStatus.TIMED_OUT)
            timeout = plan.nodes[a].timeout
            if timeout is not None and a in started:
                # never outlived an ancestor's deadline (one it inherited, also
                # after that ancestor ended; pending ones too), nor started past it
                deadline = started[a] + timeout
                assert min(ended[d], cleanup) <= deadline, (plan, d, a)
                assert d not in started or started[d] < deadline, (plan, d, a)
        error = str(completion.error)
        if ENDED_BY_TREE in error and ended[d] < cleanup:
            # the ancestor it names is one of its own
            named = error.split(ENDED_BY_TREE, 1)[1].split("'")[1]
            assert named in {completions[a].task_id for a in above if a in completions}, (
                plan,
                d,
                error,
            )
        if not above:  # a root, or detached: nothing of the tree touched it
            assert ENDED_BY_TREE not in error, (plan, d, error)
