"""How-to: wait for an external API's job without holding a slot.

A task submits a job to an external service that never calls back, then polls its
status endpoint with an async predicate and a growing interval
(``poll_interval=Backoff(initial=10, factor=2, max=30)``: after 10 s, 30 s, 60 s,
then every 30 s). The predicate treats a transient network error as "not yet"
instead of failing the task. With one slot, other tasks run while it waits.

The intervals are realistic (tens of seconds), so the script runs on Trio's
``MockClock`` with autojump: virtual time jumps ahead whenever every task is
waiting, the whole run takes milliseconds, and the poll times it asserts are
exact. In production you would call ``trio.run(main)``.

Run it with ``python examples/howto_api_polling.py``.
"""

from __future__ import annotations

import trio
import trio.testing

import trioexec
from trioexec import Backoff, TaskHandle


class JobService:
    """A fake external API: job 7 is done 95 s after it was submitted."""

    def __init__(self) -> None:
        self.submitted_at = 0.0
        self.polls: list[float] = []  # when the status endpoint was called

    async def submit(self, params: dict[str, str]) -> int:
        await trio.lowlevel.checkpoint()  # a real client awaits an HTTP request
        self.submitted_at = trio.current_time()
        return 7

    async def status(self, job_id: int) -> str:
        await trio.lowlevel.checkpoint()
        elapsed = trio.current_time() - self.submitted_at
        self.polls.append(elapsed)
        if len(self.polls) == 3:
            raise ConnectionError("connection reset by peer")  # a transient failure
        return "done" if elapsed >= 95 else "running"

    async def result(self, job_id: int) -> dict[str, int]:
        await trio.lowlevel.checkpoint()
        return {"rows": 1234}


async def run_remote_job(api: JobService, handle: TaskHandle) -> dict[str, int]:
    params = {"size": "large"}  # local state survives the wait
    job_id = await api.submit(params)

    async def job_done() -> bool:
        try:
            return await api.status(job_id) == "done"
        except ConnectionError:
            return False  # keep polling; an exception here would fail the task

    await handle.defer_until(job_done, poll_interval=Backoff(initial=10, factor=2, max=30))
    return await api.result(job_id)


async def report(n: int) -> float:
    await trio.sleep(20)  # other work, holding the slot
    return trio.current_time()  # when it finished


async def main() -> None:
    api = JobService()
    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        start = trio.current_time()
        job = await ex.submit(run_remote_job, api)
        reports = [await ex.submit(report, n) for n in range(3)]
        done = await job.wait()
        report_done = [(await r.wait()).result - start for r in reports]
        elapsed = trio.current_time() - start

    print(f"polled at {api.polls} s; result {done.result} after {elapsed:.0f}s")
    print(f"deferred {done.deferred_seconds:.0f}s; 3 reports of 20 s ran meanwhile in the one slot")
    # Checked at once, then after 10, 20, 30, 30, 30 s: 0, 10, 30, 60, 90, 120.
    assert api.polls == [0, 10, 30, 60, 90, 120], api.polls
    assert done.ok
    assert done.result == {"rows": 1234}
    assert done.deferred_seconds == 120  # exact: virtual time
    assert report_done == [20, 40, 60], report_done  # they did not wait for the job
    assert elapsed == 120


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
