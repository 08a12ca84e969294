"""Handlers for ``trioexec worker ... --handlers worker_handlers:HANDLERS`` in
``test_worker_cli.py`` (not a test module: never collected; the worker imports it
from its current directory, this one).

Both handlers take ``{"n": n, "log": path, "go": path}``. Each run appends
``start <task id> <version> <os pid>`` to ``log`` (one ``O_APPEND`` write, see
`worklog`) and prints ``STARTED <task id>``; it then keeps its slot until the file
``go`` exists, appends ``end <task id> <version> <os pid>``, prints ``ENDED <task
id>`` and returns ``{"n": n}``. ``hold`` is an ``async def`` (it runs in the
worker's Trio thread), ``hold_sync`` a plain ``def`` (in one of its threads). The
file is looked at every 10 ms: that is the work, standing in for a real job's.
A cancelled ``hold`` ends at once; a cancelled ``hold_sync`` (a thread cannot be
cancelled) sees ``handle.cancel_requested`` and raises `Stopped`; neither logs
``end``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import trio
from worklog import append_line

LOOK_EVERY = 0.01


class Stopped(Exception):
    """A ``hold_sync`` run saw its cancellation (its outcome is not recorded)."""


def say(line: str) -> None:
    """``line`` on stdout in one write: runs in threads print at the same time."""
    os.write(1, f"{line}\n".encode())


def _started(param: dict[str, Any], handle: Any) -> None:
    append_line(param["log"], "start", handle.task_id, handle.version, os.getpid())
    say(f"STARTED {handle.task_id}")


def _ended(param: dict[str, Any], handle: Any) -> dict[str, int]:
    append_line(param["log"], "end", handle.task_id, handle.version, os.getpid())
    say(f"ENDED {handle.task_id}")
    return {"n": param["n"]}


async def hold(param: dict[str, Any], handle: Any) -> dict[str, int]:
    _started(param, handle)
    while not await trio.Path(param["go"]).exists():
        await trio.sleep(LOOK_EVERY)
    return _ended(param, handle)


def hold_sync(param: dict[str, Any], handle: Any) -> dict[str, int]:
    _started(param, handle)
    while not os.path.exists(param["go"]):
        if handle.cancel_requested:  # a thread is not cancelled: it must look
            raise Stopped(f"{handle.task_id} was cancelled")
        time.sleep(LOOK_EVERY)
    return _ended(param, handle)


HANDLERS = {"hold": hold, "hold_sync": hold_sync}

NOT_HANDLERS = 42
