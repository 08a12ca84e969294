"""``trioexec worker``: a durable worker (`trioexec.durable.open_worker`) run from the
command line, stopped by a signal the way `trioexec.serve_until_signal` stops an
executor.

The first SIGTERM or SIGINT drains it: no handler starts from then on, the runs
already started go on to their end (bounded by ``--grace``), then the worker leaves
its block. A second signal, or the grace running out, cancels the runs still going.
Either way nothing is lost: leaving `open_worker`'s block cancels what still runs
and releases every task the worker holds (a cancelled run's task, and tasks it had
claimed but not started) back to pending, same version, for another worker; a
finished run's fulfil is written before it leaves.

`open_worker` has no drain of its own, so the drain is made here, around the
handlers: each one is wrapped in a `_Gate` that, once closed, lets no handler start.
A run the worker starts after that (it claims ahead of its free slots, and its claim
loop goes on) is parked without its slot (deferred on an event that is never set)
until leaving the block cancels it; its handler never ran, so it runs once,
elsewhere.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import click
import trio

from trioexec._spec import call_info
from trioexec._store._open import is_postgres_url
from trioexec.durable._checks import check_id

from ._durable import open_durable

if TYPE_CHECKING:
    from trioexec.durable import DurableStore, Worker

Handler = Callable[..., Any]
Handlers = Handler | Mapping[str, Handler]

SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: How often a progress line may be printed (only when the counts changed).
PROGRESS_EVERY = 5.0


# --------------------------------------------------------------------------- --handlers


def load_handlers(spec: str) -> tuple[Handlers, list[str]]:
    """``module:NAME`` -> the handlers `open_worker` takes and their names.

    NAME (dots for attributes of attributes) is a mapping of handler names to
    callables, one callable, or a list or tuple of callables (named by their
    ``__name__``). The current directory comes first on ``sys.path``, as with
    ``python -m``. Any problem is a `click.BadParameter` naming the module or
    attribute (a usage error: exit 2).
    """
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise _bad(f"{spec!r} is not module:NAME (e.g. myapp.jobs:HANDLERS)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise _bad(
                f"no module named {module_name!r} (looked in the current directory and sys.path)"
            ) from None
        raise _bad(f"importing {module_name!r} failed: {_where(exc)}") from None
    except Exception as exc:
        raise _bad(f"importing {module_name!r} failed: {_where(exc)}") from None
    value: Any = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise _bad(f"module {module_name!r} has no attribute {attr!r}") from None
    return _as_handlers(value, spec)


def _as_handlers(value: Any, spec: str) -> tuple[Handlers, list[str]]:
    if isinstance(value, Mapping):
        for name, fn in value.items():
            if not isinstance(name, str) or not callable(fn):
                raise _bad(f"{spec}: entry {name!r} is not a name mapped to a callable")
        if not value:
            raise _bad(f"{spec} is an empty mapping: no handlers")
        return value, sorted(value)
    if isinstance(value, list | tuple):
        by_name: dict[str, Handler] = {}
        for fn in value:
            name = getattr(fn, "__name__", None)
            if not callable(fn) or not isinstance(name, str):
                raise _bad(f"{spec}: {fn!r} is not a named callable")
            if name in by_name:
                raise _bad(f"{spec}: two handlers are named {name!r}")
            by_name[name] = fn
        if not by_name:
            raise _bad(f"{spec} is empty: no handlers")
        return by_name, sorted(by_name)
    if callable(value):
        return value, [getattr(value, "__qualname__", repr(value))]
    raise _bad(
        f"{spec} is a {type(value).__name__}, not a mapping of names to callables,"
        " a callable or a list of them"
    )


def _bad(message: str) -> click.BadParameter:
    return click.BadParameter(message, param_hint="'--handlers'")


def _where(exc: BaseException) -> str:
    """``exc`` in one line, with the innermost place it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{place}"


# --------------------------------------------------------------------------- the gate


class _Gate:
    """Lets handlers start until `close`; counts the runs of those that started.

    The counts are kept under a lock: a plain ``def`` handler runs in one of the
    executor's threads. `wait_idle` returns once it is closed and no handler runs.
    """

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._lock = threading.Lock()
        self._open = True
        self._idle = trio.Event()
        self._never = trio.Event()  # what a parked run waits on
        self.running = 0
        self.completed = 0
        self.failed = 0
        self.cancelled = 0

    def close(self) -> None:
        with self._lock:
            self._open = False
            idle = self.running == 0
        if idle:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def _enter(self) -> bool:
        with self._lock:
            if self._open:
                self.running += 1
            return self._open

    def _leave(self, outcome: BaseException | None, handle: Any) -> None:
        with self._lock:
            self.running -= 1
            if outcome is None:
                self.completed += 1
            elif handle.cancel_requested:  # (a thread's run may raise anything then)
                self.cancelled += 1
            elif isinstance(outcome, Exception):  # the worker rejects its promise
                self.failed += 1
            idle = not self._open and self.running == 0
        if idle:  # (from a handler's thread too: run_sync_soon is thread-safe)
            self._token.run_sync_soon(self._idle.set)

    def wrap(self, handlers: Handlers) -> Handlers:
        if isinstance(handlers, Mapping):
            return {name: self._wrap(fn) for name, fn in handlers.items()}
        return self._wrap(handlers)

    def _wrap(self, fn: Handler) -> Handler:
        info = call_info(fn)
        # The wrapper always takes the worker's DurableHandle (parked runs defer on
        # it); the handler gets it only if it asks, under its own parameter name.
        keyword = info.handle_param

        if info.is_async:

            async def run_async(param: Any, handle: Any) -> Any:
                if not self._enter():
                    await handle.defer_until(self._never)  # until cancelled
                try:
                    result = await (fn(param, **{keyword: handle}) if keyword else fn(param))
                except BaseException as exc:
                    self._leave(exc, handle)
                    raise
                self._leave(None, handle)
                return result

            return run_async

        def run_sync(param: Any, handle: Any) -> Any:
            if not self._enter():
                try:
                    handle.defer_until_sync(self._never)  # until cancelled
                except Exception:
                    _cancelled_in_thread(handle)
                    raise
            try:
                result = fn(param, **{keyword: handle}) if keyword else fn(param)
            except BaseException as exc:
                self._leave(exc, handle)
                if isinstance(exc, Exception):
                    _cancelled_in_thread(handle)
                raise
            self._leave(None, handle)
            return result

        return run_sync


def _cancelled_in_thread(handle: Any) -> None:
    """In a plain ``def`` handler's thread, whose run raised an exception: if the run
    was cancelled, raise `trio.Cancelled` instead (from the run's Trio task).

    A thread cannot be cancelled: a cancelled run learns of it from
    ``handle.cancel_requested`` (or `TaskCancelled` from a ``*_sync`` call) and
    unwinds with an exception. `open_worker` would reject the task's promise with
    that exception, as with any failure of a handler; the run was cancelled
    instead, so its task must go back to pending (released) like an async one.
    """
    if handle.cancel_requested:
        trio.from_thread.check_cancelled()


# --------------------------------------------------------------------------- the command


def _seconds(value: float | None) -> str:
    return "no limit" if value is None else f"{value:g}s"


def _counts(gate: _Gate, worker: Worker) -> str:
    parts = [f"{gate.completed} completed", f"{gate.failed} failed"]
    if gate.cancelled:
        parts.append(f"{gate.cancelled} cancelled")
    if worker.suspended:
        parts.append(f"{worker.suspended} suspended")
    if worker.lost:
        parts.append(f"{worker.lost} lost")
    parts.append(f"{gate.running} running")
    return ", ".join(parts)


def _say(text: str) -> None:
    click.echo(f"trioexec worker: {text}", err=True)


async def _progress(gate: _Gate, worker: Worker) -> None:
    last = ""
    while True:
        await trio.sleep(PROGRESS_EVERY)
        now = _counts(gate, worker)
        if now != last:
            _say(now)
            last = now


async def _serve(
    ds: DurableStore,
    target: str,
    handlers: Handlers,
    names: list[str],
    *,
    shown: str,
    spec: str,
    lease: float,
    concurrency: int,
    grace: float | None,
) -> None:
    from trioexec.durable import open_worker

    gate = _Gate()
    with trio.open_signal_receiver(*SIGNALS) as signals:
        async with open_worker(
            ds, target, gate.wrap(handlers), lease=lease, max_concurrent_tasks=concurrency
        ) as worker:
            _say(
                f"pid {os.getpid()} serving target {target!r} of {shown} with {spec}"
                f" ({', '.join(names)}); {concurrency} slots, lease {lease:g}s,"
                f" grace {_seconds(grace)}; worker id {worker.pid}"
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_progress, gate, worker)
                first = signal.Signals(await signals.__anext__())
                gate.close()
                _say(
                    f"{first.name}: draining ({gate.running} running; no new task starts;"
                    f" grace {_seconds(grace)}; another signal cancels)"
                )
                second: signal.Signals | None = None
                with trio.move_on_after(math.inf if grace is None else grace) as drain:
                    async with trio.open_nursery() as waiting:

                        async def on_second() -> None:
                            nonlocal second
                            second = signal.Signals(await signals.__anext__())
                            waiting.cancel_scope.cancel()

                        waiting.start_soon(on_second)
                        await gate.wait_idle()
                        waiting.cancel_scope.cancel()
                left = gate.running
                if second is not None:
                    _say(
                        f"{second.name}: cancelling {left} running; their tasks go back to pending"
                    )
                elif drain.cancelled_caught:
                    _say(
                        f"grace of {_seconds(grace)} ran out with {left} running: cancelling"
                        " them; their tasks go back to pending"
                    )
                nursery.cancel_scope.cancel()
            # Leaving the block cancels what still runs, writes the last fulfils and
            # releases every task still held (claimed, not finished) to pending.
        with trio.move_on_after(lease, shield=True):
            await _release_leftovers(ds, target, worker.pid)
        how = "drained" if second is None and not drain.cancelled_caught else "cancelled"
        _say(f"stopped ({first.name}, {how}): {_counts(gate, worker)}")


async def _release_leftovers(ds: DurableStore, target: str, pid: str) -> None:
    """Release the tasks of ``target`` still acquired by the worker ``pid`` once it
    has left its block.

    A claim that is under way when the worker leaves completes (its transaction
    has begun), but the worker's claim loop is cancelled at its next checkpoint,
    before it has taken in the whole batch: those tasks would stay acquired until
    their leases lapse. Nothing of this worker runs any more, so each is released
    now, for another worker to take at once.
    """
    from trioexec.durable import Conflict, NotFound

    cursor = None
    while True:
        page, cursor = await ds.tasks.search(
            state="acquired", target=target, limit=500, cursor=cursor
        )
        for task in page:
            if task.pid == pid:
                with contextlib.suppress(Conflict, NotFound):
                    await ds.tasks.release(task.id, task.version)
        if cursor is None:
            return


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--target", required=True, help="the durable tasks' target to claim")
@click.option(
    "--handlers",
    "spec",
    required=True,
    metavar="MODULE:NAME",
    help="a mapping of handler names to callables (or one callable, or a list of them)"
    " to import; the current directory is on the path",
)
@click.option(
    "--lease",
    type=click.FloatRange(0, min_open=True, max=1e9),
    default=30.0,
    show_default=True,
    help="seconds a claim is leased (renewed every third of it)",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 10_000),
    default=4,
    show_default=True,
    help="handlers running at once (the worker's slots)",
)
@click.option(
    "--grace",
    type=click.FloatRange(0, max=1e9),
    default=None,
    help="seconds the first signal's drain may take before what runs is cancelled"
    " (default: no limit)",
)
def worker(
    db: str, target: str, spec: str, lease: float, concurrency: int, grace: float | None
) -> None:
    """Run a durable worker: claim DB's pending tasks for --target and run them with
    --handlers until SIGTERM or SIGINT.

    The first signal drains (no new task starts; the running ones finish, within
    --grace), a second one cancels them; their tasks, and those claimed but not
    started, go back to pending for another worker. Exits 0 once stopped. A start
    line and progress go to stderr.
    """
    try:
        check_id(target, "target")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--target'") from None
    handlers, names = load_handlers(spec)
    if is_postgres_url(db):
        from trioexec._store._pg_conn import redact

        shown = redact(db)
    else:
        shown = db
    with open_durable(db, read_only=False) as ds:
        trio.run(
            lambda: _serve(
                ds,
                target,
                handlers,
                names,
                shown=shown,
                spec=spec,
                lease=lease,
                concurrency=concurrency,
                grace=grace,
            )
        )
