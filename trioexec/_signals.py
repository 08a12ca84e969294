"""`serve_until_signal`: the shutdown an application wants from SIGTERM and SIGINT.

A service manager (systemd, Kubernetes, a terminal's Ctrl+C) asks a worker to stop
with a signal, and sends a stronger one, or SIGKILL, when it has waited long
enough: the first signal drains, the second cancels.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterable

import trio

from ._core import check_grace
from ._executor import Executor, wait_closed
from ._records import ShutdownPolicy

__all__ = ["serve_until_signal"]

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})


async def serve_until_signal(
    ex: Executor, *, signals: Iterable[int] = DEFAULT_SIGNALS, grace: float | None = None
) -> signal.Signals | None:
    """Wait for one of ``signals``, then shut ``ex`` down; return that signal
    (None: ``ex`` was shut down otherwise, without a signal).

    Await it inside the ``async with open_executor(...)`` block, once the work is
    started. The first signal drains the executor (``ShutdownPolicy.DRAIN``:
    nothing new is accepted, what was accepted runs to its end) for at most
    ``grace`` seconds (default: the executor's ``shutdown_grace``; None there
    means no limit), after which what is left is cancelled; a second signal
    cancels what is left at once (``ShutdownPolicy.CANCEL``). Returns once
    nothing is outstanding; leaving the block then closes the executor.

    If ``ex`` shuts down some other way first (one of its tasks, or another task,
    called `Executor.shutdown`; a store failure), it returns None once that
    shutdown is over, without waiting for a signal. A signal that arrives while
    such a shutdown still drains is handled as above.

    Its handlers are in place before it first yields, so a task started just
    before the call runs with them installed; they are taken down when it
    returns (a signal after that gets Python's usual handling: SIGINT raises
    `KeyboardInterrupt`, SIGTERM ends the process). Like
    `trio.open_signal_receiver`, it must run in the main thread of the program.

    If cancelled while waiting for a signal, nothing was shut down; if cancelled
    during the drain, the executor goes on draining (the block's exit decides).

    Example::

        async with trioexec.open_executor(store=store, shutdown_grace=30.0) as ex:
            await ex.submit(work)
            signum = await trioexec.serve_until_signal(ex)
        print(f"stopped by {signum.name if signum else 'the work itself'}")

    Raises:
      ValueError: ``signals`` is empty or names a signal that cannot be caught
        (SIGKILL, SIGSTOP); ``grace`` is negative, NaN or infinite.
      TypeError: ``grace`` is not a number (or None).
      RuntimeError: not in the main thread.
    """
    check_grace("grace", grace)
    wanted = tuple(signal.Signals(s) for s in signals)  # (ValueError for a bad number)
    if not wanted:
        raise ValueError("serve_until_signal needs at least one signal, got none")
    for s in wanted:
        if s in _UNCATCHABLE:
            raise ValueError(f"{s.name} cannot be caught; signals must not include it")
    with trio.open_signal_receiver(*wanted) as received:
        first = await _first_signal(ex, received)
        if first is None:
            return None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_next, ex, received)
            await ex.shutdown(ShutdownPolicy.DRAIN, grace=grace)
            nursery.cancel_scope.cancel()
    return signal.Signals(first)


async def _first_signal(ex: Executor, received: AsyncIterator[int]) -> int | None:
    """The first signal, or None once ``ex`` has shut down otherwise."""
    signum: int | None = None

    async def closed(cancel_scope: trio.CancelScope) -> None:
        await wait_closed(ex)
        cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(closed, nursery.cancel_scope)
        signum = await anext(received)
        nursery.cancel_scope.cancel()
    return signum


async def _cancel_on_next(ex: Executor, received: AsyncIterator[int]) -> None:
    """The second signal: the drain has taken long enough."""
    await anext(received)
    await ex.shutdown(ShutdownPolicy.CANCEL)
