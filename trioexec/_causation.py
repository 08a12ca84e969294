"""Which execution is calling: for the causation id of what a task submits.

Every Trio run has one registry (a `trio.lowlevel.RunVar`, not a module
global): the Trio task that runs an attempt of an execution maps to its
`Job`, whatever executor runs it. A dict entry per running attempt, not a
context variable: setting one of those costs ~200 bytes per running task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ._taskref import Job

_REGISTRY: trio.lowlevel.RunVar[dict[trio.lowlevel.Task, Job]] = trio.lowlevel.RunVar(
    "trioexec_running"
)


def running() -> dict[trio.lowlevel.Task, Job]:
    """This run's registry: a worker keeps it at hand and sets its own entry."""
    try:
        return _REGISTRY.get()
    except LookupError:
        registry: dict[trio.lowlevel.Task, Job] = {}
        _REGISTRY.set(registry)
        return registry


def current_job(registry: dict[trio.lowlevel.Task, Job] | None = None) -> Job | None:
    """The execution whose code is calling: the one a worker of this Trio task, or
    of the nearest ancestor task, is running (so child tasks of a task and code
    in its threads count as it; `trio.from_thread` runs in the host task).
    ``registry``: this run's (`running`), if the caller has it at hand."""
    if registry is None:
        try:
            registry = _REGISTRY.get()
        except (LookupError, RuntimeError):  # nothing ran yet, or not in a Trio run
            return None
    if not registry:
        return None
    task = trio.lowlevel.current_task()
    while (ref := registry.get(task)) is None:
        nursery = task.parent_nursery
        if nursery is None:
            return None
        task = nursery.parent_task
    return ref
