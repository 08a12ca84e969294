"""The four-slot story: tasks waiting on the outside world give their slot back.

An executor has 4 slots. Four tasks start, do a little setup, and then have
nothing to do but wait: A for a webhook, B for a file to appear, C for a human
approval, D for a job on an external API. Holding their slots for the whole
wait would leave no room for anything else. Instead each calls
``await handle.defer_until(condition)``: its slot goes back to the pool at once,
eight short compute tasks (E-L) run in the freed slots, and each waiter takes a
slot back (FIFO) when its condition holds, its local state exactly as it left it.

Run it with ``python examples/deferral.py`` (about 2 seconds of real time). It
prints a timeline, then asserts what it showed, so a regression makes it fail.
"""

from __future__ import annotations

import copy
import math
import pathlib
import tempfile
from typing import Any

import trio
import trio_util

import trioexec

SLOTS = 4
SETUP = 0.1  # each waiter's work before it defers, holding its slot
FINISH = 0.1  # ... and after it resumes
WORK = 0.25  # each compute task's work, holding its slot
COMPUTE_TASKS = "EFGHIJKL"
# When the outside world answers, in seconds after the start.
WEBHOOK_AT, FILE_AT, APPROVAL_AT, API_JOB_AT = 1.0, 1.15, 1.3, 1.45


class Timeline:
    """Prints what happens, when, and how many slots are in use.

    It also keeps its own count of tasks running non-deferred code, to check the
    slot bound independently of the executor.
    """

    def __init__(self, ex: trioexec.Executor) -> None:
        self.ex = ex
        self.t0 = trio.current_time()
        self.running = 0
        self.max_running = 0
        self.first_deferral = math.inf
        self.first_resume = math.inf
        self.compute: dict[str, tuple[float, float]] = {}  # name -> (start, end)
        self.waiter_done: dict[str, float] = {}

    def now(self) -> float:
        return trio.current_time() - self.t0

    def log(self, who: str, what: str) -> None:
        stats = self.ex.statistics()
        in_use = self.ex.slots.in_use
        assert in_use <= SLOTS, f"{in_use} slots in use"
        print(
            f"{self.now():5.2f}s  {who:<10} {what:<46} "
            f"slots {in_use}/{SLOTS}  deferred {stats.deferred_count}  queued {stats.queue_depth}"
        )

    def enter(self) -> None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)

    def leave(self) -> None:
        self.running -= 1

    def deferring(self, who: str, waiting_for: str) -> None:
        self.leave()
        self.first_deferral = min(self.first_deferral, self.now())
        self.log(who, f"calls defer_until({waiting_for})")

    def resumed(self, who: str, handle: trioexec.TaskHandle) -> None:
        self.enter()
        self.first_resume = min(self.first_resume, self.now())
        self.log(who, f"resumed after {handle.deferred_seconds:.2f}s deferred")


# --------------------------------------------------------------- the four waiters
#
# Each builds some local state, defers, and shows afterwards that the state is
# untouched: the task's coroutine was simply parked, holding no slot.


async def finish(tl: Timeline, who: str, state: dict[str, Any], before: dict[str, Any]) -> str:
    assert state == before, f"{who}: local state changed while deferred"
    await trio.sleep(FINISH)  # the work the wait was for
    key, value = next(iter(state.items()))
    tl.log(who, f"done, state intact: {key}={value!r}, ...")
    tl.waiter_done[who] = tl.now()
    tl.leave()
    return who


async def wait_for_webhook(tl: Timeline, webhook: trio.Event, handle: trioexec.TaskHandle) -> str:
    who = "A webhook"
    tl.enter()
    tl.log(who, "started: asks the provider for a payment")
    state = {"order": 1041, "items": ["book", "lamp"], "total": 57.5}
    await trio.sleep(SETUP)
    before = copy.deepcopy(state)
    tl.deferring(who, "trio.Event")
    await handle.defer_until(webhook)  # woken at once when the event is set
    tl.resumed(who, handle)
    return await finish(tl, who, state, before)


async def wait_for_file(tl: Timeline, upload: pathlib.Path, handle: trioexec.TaskHandle) -> str:
    who = "B file"
    tl.enter()
    tl.log(who, f"started: expects {upload.name}")
    state = {"expected": upload.name, "columns": ["id", "amount"], "rows_seen": 0}
    await trio.sleep(SETUP)
    before = copy.deepcopy(state)
    tl.deferring(who, "path.exists, 0.1s")
    await handle.defer_until(upload.exists, poll_interval=0.1)  # a sync predicate, polled
    tl.resumed(who, handle)
    return await finish(tl, who, state, before)


async def wait_for_approval(
    tl: Timeline, approved: trio_util.AsyncBool, handle: trioexec.TaskHandle
) -> str:
    who = "C approval"
    tl.enter()
    tl.log(who, "started: asks a human to approve a refund")
    state = {"refund": 120.0, "reason": "damaged", "approver": "ops"}
    await trio.sleep(SETUP)
    before = copy.deepcopy(state)
    tl.deferring(who, "trio_util.AsyncBool")
    await handle.defer_until(approved)  # woken at once when its value turns true
    tl.resumed(who, handle)
    return await finish(tl, who, state, before)


class FakeJobService:
    """An external API whose job finishes at a given time; it never calls back."""

    def __init__(self, done_at: float) -> None:
        self.done_at = done_at
        self.polls = 0

    async def status(self, job_id: int) -> str:
        self.polls += 1
        await trio.sleep(0.005)  # the HTTP round trip
        return "done" if trio.current_time() >= self.done_at else "running"


async def wait_for_api_job(tl: Timeline, api: FakeJobService, handle: trioexec.TaskHandle) -> str:
    who = "D api-job"
    tl.enter()
    tl.log(who, "started: submits job 7 to the API")
    job_id = 7
    state = {"job": job_id, "params": {"size": "large"}, "submitted": round(tl.now(), 2)}
    await trio.sleep(SETUP)
    before = copy.deepcopy(state)

    async def job_done() -> bool:
        return await api.status(job_id) == "done"

    tl.deferring(who, "async poll, Backoff")
    # Polled after 0.1s, 0.2s, then every 0.4s: an async predicate with growing intervals.
    await handle.defer_until(job_done, poll_interval=trioexec.Backoff(initial=0.1, max=0.4))
    tl.resumed(who, handle)
    tl.log(who, f"(the job was seen done on poll {api.polls})")
    return await finish(tl, who, state, before)


# --------------------------------------------------------------- compute tasks


async def crunch(tl: Timeline, who: str, n: int) -> int:
    tl.enter()
    start = tl.now()
    tl.log(who, "compute task started")
    result = sum(i * i for i in range(n))
    await trio.sleep(WORK)  # more work, holding the slot (no deferral)
    tl.compute[who] = (start, tl.now())
    tl.log(who, "compute task done")
    tl.leave()
    return result


# --------------------------------------------------------------- the outside world


async def send_webhook(tl: Timeline, webhook: trio.Event) -> None:
    await trio.sleep_until(tl.t0 + WEBHOOK_AT)
    tl.log("world", "payment provider calls the webhook")
    webhook.set()


async def upload_file(tl: Timeline, upload: pathlib.Path) -> None:
    await trio.sleep_until(tl.t0 + FILE_AT)
    await trio.Path(upload).write_text("id,amount\n1,57.5\n")
    tl.log("world", f"another system writes {upload.name}")


async def approve(tl: Timeline, approved: trio_util.AsyncBool) -> None:
    await trio.sleep_until(tl.t0 + APPROVAL_AT)
    tl.log("world", "a human clicks 'approve'")
    approved.value = True


async def finish_api_job(tl: Timeline) -> None:
    await trio.sleep_until(tl.t0 + API_JOB_AT)
    tl.log("world", "the API finishes job 7 (tells nobody)")


# --------------------------------------------------------------- main


async def main() -> None:
    print(f"An executor with {SLOTS} slots; real time since the start. Counts are read as each")
    print("line prints: ex.slots.in_use, ex.statistics().deferred_count and .queue_depth.\n")
    with tempfile.TemporaryDirectory() as tmp:
        upload = pathlib.Path(tmp) / "report.csv"
        webhook = trio.Event()
        approved = trio_util.AsyncBool()
        async with (
            trio.open_nursery() as world,
            trioexec.open_executor(max_concurrent_tasks=SLOTS) as ex,
        ):
            tl = Timeline(ex)
            api = FakeJobService(done_at=tl.t0 + API_JOB_AT)
            world.start_soon(send_webhook, tl, webhook)
            world.start_soon(upload_file, tl, upload)
            world.start_soon(approve, tl, approved)
            world.start_soon(finish_api_job, tl)

            waiters = [
                await ex.submit(wait_for_webhook, tl, webhook),
                await ex.submit(wait_for_file, tl, upload),
                await ex.submit(wait_for_approval, tl, approved),
                await ex.submit(wait_for_api_job, tl, api),
            ]
            computes = [
                await ex.submit(crunch, tl, name, 10_000 * (i + 1), name=name)
                for i, name in enumerate(COMPUTE_TASKS)
            ]
            tl.log("main", f"submitted A-D, then {COMPUTE_TASKS[0]}-{COMPUTE_TASKS[-1]}")
            completions = [await ref.wait() for ref in waiters + computes]
        makespan = tl.now()
    stats = ex.statistics()

    # ---- summary
    parked = [
        name
        for name, (start, end) in tl.compute.items()
        if tl.first_deferral <= start and end <= tl.first_resume
    ]
    first_waiter_done = min(tl.waiter_done.values())
    print()
    print(f"makespan: {makespan:.2f}s")
    print(
        f"compute tasks that ran while A-D were deferred: {len(parked)}/{len(COMPUTE_TASKS)} "
        f"(without deferral none could start before {first_waiter_done:.2f}s)"
    )
    print(f"most tasks running non-deferred code at once: {tl.max_running} (slots: {SLOTS})")
    print(
        f"ex.statistics(): completed_count={stats.completed_count} "
        f"deferral_count={stats.deferral_count} resumed_count={stats.resumed_count} "
        f"max_deferred_count={stats.max_deferred_count}"
    )

    # ---- what this example demonstrates; a regression fails the `examples` session
    assert all(c.ok for c in completions), [c for c in completions if not c.ok]
    assert [c.result for c in completions[:4]] == ["A webhook", "B file", "C approval", "D api-job"]
    assert tl.max_running <= SLOTS, tl.max_running
    assert sorted(parked) == sorted(COMPUTE_TASKS), (parked, tl.compute)
    assert all(c.deferred_seconds > 0 for c in completions[:4])
    assert api.polls > 2  # D was woken by polling, not by a notification
    assert stats.completed_count == len(completions) == 4 + len(COMPUTE_TASKS)
    assert stats.failed_count == 0
    assert stats.deferral_count == stats.resumed_count == 4
    assert stats.max_deferred_count == 4
    assert stats.active_count == stats.deferred_count == stats.queue_depth == 0


if __name__ == "__main__":
    trio.run(main)
