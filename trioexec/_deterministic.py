"""`DeterministicExecutor`: the executor's parts with no workers' nursery: jobs run
one at a time, in the caller's task, during `run_ready`. Admission, overflow
policies, key limits, retries, timeouts, budgets, metrics and events behave as in
`open_executor`.

A task's `TaskHandle.defer_until` waits inline, so a task that defers or waits to
retry keeps its key: the key's next tasks, which could only run in the same task,
run after it ends, in order. A key's refill timer runs during `run_ready`, started
as in `open_executor` (`Workers.start`).
"""

from __future__ import annotations

import math
from typing import Any, Unpack, final

import trio

from ._core import ExecutorCore
from ._executor import ExecutorOptions, Facade, Setup, one_level
from ._records import TaskCompletion
from ._taskref import Job


@final
class DeterministicExecutor(Facade):
    """Queue with `submit_nowait`, run with ``await run_ready()``.

    Takes the same options as `open_executor` (keyword-only). A ``store`` must be
    inline (it is written in the caller's task after each task); ``recover`` is not
    supported and the lease options (and ``shutdown_policy``, ``shutdown_grace``: it has no
    shutdown of its own) are accepted for symmetry.

    Example::

        ex = DeterministicExecutor(max_concurrent_tasks=1)
        ref = ex.submit_nowait(job, 1)
        [completion] = await ex.run_ready()
    """

    def __init__(self, **options: Unpack[ExecutorOptions]) -> None:
        setup = Setup.read(options, "DeterministicExecutor()")
        # (report_unread_failures: taken as open_executor takes it; `run_ready`
        # returns every completion it makes, so none is ever left unread here)
        store = setup.store
        if setup.recover:
            raise ValueError("DeterministicExecutor does not recover; use open_executor")
        if store is not None and not store.inline:
            raise ValueError(
                "DeterministicExecutor writes in the caller's task: give it an inline store "
                "(MemoryStore, or SQLiteStore(path, inline=True))"
            )
        # The same parts as `open_executor`'s, with no nursery: jobs run in `run_ready`.
        # (inline: a key's room goes to the task that runs, in the caller's task)
        self._core = ExecutorCore(setup.config, store, setup.specs, share_keys=False, inline=True)
        if store is not None:
            store.heartbeat(self._core.owner_id, math.inf)  # never expires: nothing to recover

    async def run_ready(
        self, max_tasks: int | None = None, cancel: trio.Event | None = None
    ) -> list[TaskCompletion[Any]]:
        """Run pending tasks one at a time, in the order they may start (oldest
        first, but higher priority first and keys honoured), in the calling task.
        A task held back by its key's rate is waited for (``trio.sleep_until``
        its next token: under a `trio.testing.MockClock`, no real time passes).

        Stops after ``max_tasks`` tasks (all pending ones by default). If ``cancel``
        is set before a task starts (or while a key's next token is waited for),
        every pending task is cancelled and the call returns. Returns the
        completions of the tasks that ended during the call, in order (cancelled
        ones included). A checkpoint.
        """
        if max_tasks is not None and max_tasks < 0:
            raise ValueError(f"max_tasks must be >= 0 or None, got {max_tasks!r}")
        core = self._core
        journal = core.journal
        completions: list[TaskCompletion[Any]] = []
        body_error: list[BaseException] = []
        async with one_level(body_error), trio.open_nursery() as nursery:
            core.workers.start(nursery, inline=True)
            try:
                ran = 0
                await trio.lowlevel.checkpoint()
                while max_tasks is None or ran < max_tasks:
                    if cancel is not None and cancel.is_set():
                        cancelled: list[Job] = []
                        core.lifecycle.cancel_pending(cancelled)
                        if journal is not None:
                            journal.write_inline()
                        completions.extend(job.make_completion() for job in cancelled)
                        break
                    pending = core.pending
                    pending.keys.tick()
                    job = await core.workers.run_next()
                    if job is None:
                        if not pending.keys.held or math.isinf(pending.keys.timers.next()):
                            break
                        with trio.move_on_at(pending.keys.timers.next()):  # its key's next token...
                            if cancel is None:
                                await trio.sleep_forever()
                            await cancel.wait()  # ...or the cancel
                        continue
                    ran += 1
                    if journal is not None:
                        journal.write_inline()
                    completions.append(job.make_completion())
            except BaseException as exc:
                body_error.append(exc)
                raise
            finally:
                core.key_timer.close()  # (the timer tasks end)
                core.deadline_timer.close()
        return completions

    @property
    def pending(self) -> int:
        """Tasks queued and not yet run."""
        return self._core.tally.queue_depth
