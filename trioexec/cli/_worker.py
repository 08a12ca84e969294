"""``trioexec worker``: a durable worker (`trioexec.durable.open_worker`) run from the
command line, stopped by a signal as `trioexec.serve_until_signal` stops an executor
(docs/reference/cli.rst). The first signal drains it (`Worker.drain`); a second, or
``--grace`` running out, cancels the runs still going, and leaving `open_worker`'s
block releases their tasks. The grace is this command's, not the drain's own, so its
lines can say how many runs were still going when either came.
"""

from __future__ import annotations

import importlib
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import click
import trio

from trioexec.durable._checks import check_id

from ._common import shown
from ._durable import open_durable

if TYPE_CHECKING:
    from trioexec.durable import DurableStore, Worker

Handler = Callable[..., Any]
Handlers = Handler | Mapping[str, Handler]

SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: How often a progress line may be printed (only when the counts changed).
PROGRESS_EVERY = 5.0


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
    except Exception as exc:
        gone = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if gone is not None and (module_name + ".").startswith(gone + "."):
            raise _bad(
                f"no module named {module_name!r} (looked in the current directory and sys.path)"
            ) from None
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


def _seconds(value: float | None) -> str:
    return "no limit" if value is None else f"{value:g}s"


def _counts(worker: Worker) -> str:
    parts = [f"{worker.fulfilled - worker.rejected} completed", f"{worker.rejected} failed"]
    rare = {"cancelled": worker.cancelled, "suspended": worker.suspended, "lost": worker.lost}
    parts += [f"{n} {what}" for what, n in rare.items() if n]
    parts.append(f"{worker.running} running")
    return ", ".join(parts)


def _say(text: str) -> None:
    click.echo(f"trioexec worker: {text}", err=True)


async def _progress(worker: Worker) -> None:
    last = ""
    while True:
        await trio.sleep(PROGRESS_EVERY)
        now = _counts(worker)
        if now != last:
            _say(now)
            last = now


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

    async def serve(ds: DurableStore) -> None:
        from trioexec.durable import open_worker

        with trio.open_signal_receiver(*SIGNALS) as signals:
            async with open_worker(
                ds, target, handlers, lease=lease, max_concurrent_tasks=concurrency
            ) as worker:
                _say(
                    f"pid {os.getpid()} serving target {target!r} of {shown(db)} with {spec}"
                    f" ({', '.join(names)}); {concurrency} slots, lease {lease:g}s,"
                    f" grace {_seconds(grace)}; worker id {worker.pid}"
                )
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_progress, worker)
                    first = signal.Signals(await signals.__anext__())
                    _say(
                        f"{first.name}: draining ({worker.running} running; no new task starts;"
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
                            await worker.drain()
                            waiting.cancel_scope.cancel()
                    left = worker.running
                    if second is not None:
                        _say(
                            f"{second.name}: cancelling {left} running; their tasks go back"
                            " to pending"
                        )
                    elif drain.cancelled_caught:
                        _say(
                            f"grace of {_seconds(grace)} ran out with {left} running: cancelling"
                            " them; their tasks go back to pending"
                        )
                    nursery.cancel_scope.cancel()
                # Leaving the block cancels what still runs, writes the last fulfils and
                # releases every task still held (claimed, not finished) to pending.
            how = "drained" if second is None and not drain.cancelled_caught else "cancelled"
            _say(f"stopped ({first.name}, {how}): {_counts(worker)}")

    with open_durable(db, read_only=False) as ds:
        trio.run(serve, ds)
