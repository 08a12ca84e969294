"""The demo's workload (``trioexec demo``): tasks that wait on the outside world, run
on a few slots, with and without giving their slot back while they wait.

Everything happens on one timeline of ``plan.seconds``, placed by fractions of it (the
story itself: the demo command's help). `run_workload` runs it with deferral
(``handle.defer_until``) or holding the slots while waiting (polling where deferral
would poll); `simulate` runs it under Trio's mock clock, which gives both makespans
exactly and at once.
"""

from __future__ import annotations

import os
import random
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

import trioexec
from trioexec import Backoff, Context, MemoryStore, Store, TaskHandle, Workflow
from trioexec.durable import DurableStore
from trioexec.testing import FakeWallClock

KINDS = ("webhook", "upload", "api")
DEFAULT_SECONDS = 30.0
QUICK_SECONDS = 5.0
FILE_WAITERS = 2
WORKFLOW_STEPS = 4
REPORT = "inbox/report.csv"


@dataclass(frozen=True)
class Plan:
    """What happens when, in seconds from the start."""

    slots: int
    seconds: float
    waits: list[float]  # when each event waiter's event is set
    works: list[float]  # the work of each base task (the event waiters' first)

    @property
    def total(self) -> int:
        """The base tasks, the file waiters, charge-card and the workflow's steps."""
        return len(self.works) + FILE_WAITERS + 1 + WORKFLOW_STEPS

    @property
    def file_at(self) -> float:
        return round(0.35 * self.seconds, 2)

    @property
    def promise_at(self) -> float:
        return round(0.5 * self.seconds, 2)

    @property
    def poll(self) -> float:
        """How often a polled condition (the file, the promise) is looked at."""
        return round(self.seconds / 30, 3)

    @property
    def retry_delay(self) -> float:
        return round(0.1 * self.seconds, 2)

    @property
    def step(self) -> float:
        """A small piece of work (a workflow step, charge-card, a file import)."""
        return round(0.02 * self.seconds, 3)


def demo_plan(n_tasks: int, slots: int, seconds: float = DEFAULT_SECONDS, seed: int = 7) -> Plan:
    """``n_tasks`` base tasks on ``slots``: twice as many event waiters as slots
    (at most ``n_tasks``; the last one's event comes at 95 % of the timeline),
    the rest compute for about 85 % of it."""
    rng = random.Random(seed)
    n_waiters = min(n_tasks, 2 * slots)
    waits = [round(rng.uniform(0.1, 0.9) * seconds, 2) for _ in range(n_waiters)]
    if waits:  # the last one comes near the end: the timeline is the run's length
        waits[waits.index(max(waits))] = round(0.95 * seconds, 2)
    n_compute = n_tasks - n_waiters
    mean = 0.85 * seconds * slots / max(n_compute, 1)
    works = [round(rng.uniform(0.01, 0.03) * seconds, 3) for _ in range(n_waiters)]
    works += [round(rng.uniform(0.6, 1.4) * mean, 3) for _ in range(n_compute)]
    return Plan(slots, seconds, waits, works)


class FileAppears:
    """A polled condition: ``path`` exists. Says so in ``waiting_on``."""

    def __init__(self, path: str, shown: str) -> None:
        self.path = path
        self.__trioexec_waiting_on__ = f"condition {shown} exists"

    def __call__(self) -> bool:
        return os.path.exists(self.path)


async def run_workload(
    plan: Plan,
    *,
    defer: bool,
    store: Store | None = None,
    ds: DurableStore,
    on_start: Callable[[trioexec.Executor, dict[str, Any]], None] | None = None,
) -> float:
    """Run the demo workload; return its makespan (seconds on Trio's clock).

    ``state`` (given to ``on_start``) is what a view shows: ``t0``, ``done`` and
    ``total``, ``watch`` (task id -> (name, a TaskRef or TaskHandle: its
    ``waiting_on``)), ``log`` (time, line) of what happened, ``run`` (the
    workflow run) and ``since`` (the view's: task id -> (reason, since when))."""
    t0 = trio.current_time()
    waits, works = plan.waits, plan.works
    events = [trio.Event() for _ in waits]
    run_id = f"refund-{secrets.token_hex(3)}"
    promise = f"approval-{run_id}"
    state: dict[str, Any] = {
        "t0": t0,
        "done": 0,
        "total": plan.total,
        "watch": {},
        "log": [],
        "run": None,
        "since": {},
    }

    def log(line: str) -> None:
        state["log"].append((trio.current_time() - t0, line))

    async def wait(handle: TaskHandle, condition: Any) -> None:
        """Wait for ``condition``: deferring, or holding the slot (and polling)."""
        if defer:
            await handle.defer_until(condition, poll_interval=plan.poll)
        elif callable(getattr(condition, "wait", None)):
            await condition.wait()
        else:
            while not condition():  # noqa: ASYNC110 - a poll, as defer_until does
                await trio.sleep(plan.poll)

    def watch(name: str, handle: TaskHandle) -> None:
        state["watch"][handle.task_id] = (name, handle)

    with tempfile.TemporaryDirectory(prefix="trioexec-demo-") as inbox:
        report = os.path.join(inbox, os.path.basename(REPORT))
        report_ready = FileAppears(report, REPORT)

        async def outside_world() -> None:
            happenings: list[tuple[float, Callable[[], Any]]] = [
                (at, events[i].set) for i, at in enumerate(waits)
            ]
            happenings.append((plan.file_at, write_report))
            happenings.append((plan.promise_at, approve))
            for at, act in sorted(happenings, key=lambda e: e[0]):
                await trio.sleep_until(t0 + at)
                outcome = act()
                if outcome is not None:
                    await outcome

        def write_report() -> None:
            with open(report, "w") as f:
                f.write("order,amount\nA-1042,120.00\n")
            log(f"the demo wrote {REPORT}: its importers wake up")

        async def approve() -> None:
            await ds.promises.resolve(promise, data={"approved": True, "by": "the demo"})
            log(f"the demo resolved promise {promise}: the refund goes on")

        async def waiter(i: int, handle: TaskHandle) -> None:
            local_state = {"request": i}  # what the task keeps across the wait
            watch(f"{KINDS[i % len(KINDS)]}-{i}", handle)
            await wait(handle, events[i])
            await trio.sleep(works[i])
            assert local_state == {"request": i}
            state["done"] += 1

        async def import_report(part: int, handle: TaskHandle) -> None:
            watch(f"import-{part}", handle)
            await wait(handle, report_ready)
            await trio.sleep(plan.step)
            state["done"] += 1

        async def compute(seconds: float) -> None:
            await trio.sleep(seconds)
            state["done"] += 1

        attempts: list[float] = []

        @trioexec.task(retries=2, backoff=Backoff(initial=plan.retry_delay, factor=2.0, jitter=0.0))
        async def charge_card(amount: float) -> str:
            attempts.append(trio.current_time())
            await trio.sleep(plan.step)
            if len(attempts) == 1:
                log(
                    f"charge-card: attempt 1 failed (503 from the payments API);"
                    f" retry in {plan.retry_delay:g}s"
                )
                raise ConnectionError("payments API: 503 Service Unavailable")
            log(f"charge-card: attempt {len(attempts)} succeeded")
            state["done"] += 1
            return f"charged {amount:.2f}"

        @trioexec.task(id="fetch-order")
        async def fetch_order(ctx: Context) -> None:
            await trio.sleep(plan.step)
            ctx["order"] = {"id": "A-1042", "amount": 120.0}
            state["done"] += 1

        @trioexec.task(id="approval", dependencies=["fetch-order"])
        async def approval(ctx: Context, handle: TaskHandle) -> None:
            watch("refund: approval", handle)
            approval_waits.set()
            await wait(handle, ds.promises.settled(ctx["promise"], poll=plan.poll))
            record = await ds.promises.get(ctx["promise"])
            assert record is not None
            ctx["approval"] = record.state.value
            state["done"] += 1

        @trioexec.task(id="pay", dependencies=["approval"])
        async def pay(ctx: Context) -> None:
            await trio.sleep(plan.step)
            ctx["refunded"] = ctx["order"]["amount"]
            state["done"] += 1

        @trioexec.task(id="notify", dependencies=["pay"])
        async def notify(ctx: Context) -> None:
            await trio.sleep(plan.step)
            ctx["notified"] = True
            state["done"] += 1

        approval_waits = trio.Event()
        refund = Workflow("refund", [fetch_order, approval, pay, notify])
        await ds.promises.create(promise, 3600, data={"order": "A-1042"}, tags={"demo": "1"})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(outside_world)
            async with trioexec.open_executor(max_concurrent_tasks=plan.slots, store=store) as ex:
                if on_start is not None:
                    on_start(ex, state)
                run = await ex.start_workflow(refund, {"promise": promise}, run_id=run_id)
                state["run"] = run
                await approval_waits.wait()  # (before the others fill the queue)
                ref = await ex.submit(charge_card, 120.0, name="charge-card")
                state["watch"][ref.task_id] = ("charge-card", ref)
                for part in range(FILE_WAITERS):
                    await ex.submit(import_report, part, name=f"import-{part}")
                for i in range(len(waits)):
                    await ex.submit(waiter, i, name=f"{KINDS[i % len(KINDS)]}-{i}")
                for seconds in works[len(waits) :]:
                    await ex.submit(compute, seconds, name="compute")
                result = await run.wait()
                assert result.ok, result.error
                log(f"workflow {run_id} completed: refunded {result.context['refunded']:.2f}")
    return trio.current_time() - t0


def simulate(plan: Plan, defer: bool) -> float:
    """The same workload under Trio's mock clock: an exact makespan, instantly."""

    async def go() -> float:
        with MemoryStore(clock=FakeWallClock()) as memory, DurableStore(memory) as ds:
            return await run_workload(plan, defer=defer, ds=ds)

    # (here, not at the top: trio.testing imports pytest when it is installed,
    # a tenth of a second of every ``trioexec`` command's start)
    from trio.testing import MockClock

    return trio.run(go, clock=MockClock(autojump_threshold=0))
