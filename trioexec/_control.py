"""`Control`: pauses, and the commands operators send through the store.

Without a store, `Executor.pause` and `Executor.resume` change this executor's
pauses at once, and that is all. With one, the store holds what is paused, for
every executor on it. A pause or resume takes effect here at once and is
recorded later, in order, by one task; as another executor's command issued after it may
be recorded first, each carries its issue time (`issue_time`) and the store applies them
in that order. Each executor reads the commands after the last it has seen
(`Store.commands`) every `POLL` seconds, or as soon as PostgreSQL notifies it: a pause
or resume re-reads what is paused, a cancel stops the task if it runs here, a retry
starts a recovery pass now.
"""

from __future__ import annotations

import getpass
import math
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, final

import trio
from trio.lowlevel import RunVar

from ._errors import ExecutorClosed
from ._records import TaskStatus, check_id
from ._store._control import MAX_SKEW

if TYPE_CHECKING:
    from ._journal import Journal
    from ._machine._lifecycle import Lifecycle
    from ._machine._pending import Pending
    from ._store import Command, Store

#: How often an executor reads the store's commands (within a second, as promised).
POLL = 0.5
#: The last issue time handed out per database, in this Trio run (`issue_time`).
_ISSUED: RunVar[dict[object, float]] = RunVar("trioexec_commands_issued")


def issue_time(store: Store) -> float:
    """When a command is issued now: the store's clock, but strictly later than
    the last command issued on the same database in this Trio run, so two
    executors of one process order their callers' commands even when the clock
    has not moved (a mock clock, or its resolution); across processes the clocks
    order them (as the leases already need). A clock set back by `MAX_SKEW` or
    more starts again from its reading (a store refuses an issue time that far ahead)."""
    try:
        issued = _ISSUED.get()
    except LookupError:
        issued = {}
        _ISSUED.set(issued)
    database = (type(store).__name__, getattr(store, "path", None) or id(store))
    at = store.clock()
    last = issued.get(database)
    if last is not None and at <= last < at + MAX_SKEW:
        at = math.nextafter(last, math.inf)
    issued[database] = at
    return at


def who_am_i(what: str | None = None) -> str:
    """Who sends a command, as it is recorded: ``user@host pid N`` (and ``what``)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container's numeric user)
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"
    who = f"{user}@{socket.gethostname()} pid {os.getpid()}"
    return who if what is None else f"{who} ({what})"


def check_target(name: str | None, key: str | None) -> list[tuple[str, str]]:
    """``name`` and ``key`` of a pause or resume as ``[(kind, value)]``: at least
    one, each a valid id. Raises ValueError naming the bad value."""
    targets = []
    if name is not None:
        targets.append(("name", check_id("name", name)))
    if key is not None:
        targets.append(("key", check_id("key", key)))
    if not targets:
        raise ValueError("pause and resume need a task name= or a key=")
    return targets


@final
class Control:
    """The pauses of one executor, and (with a store) the commands it follows."""

    def __init__(
        self,
        pending: Pending,
        lifecycle: Lifecycle,
        journal: Journal | None,
        owner_id: str,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        self._pending = pending
        self._lifecycle = lifecycle
        self._journal = journal
        self.names: set[str] = set()
        self.keys: set[str] = set()
        self._on_retry = on_retry  # (recovery's `poke`: requeued rows are recovered now)
        self._who = who_am_i(f"executor {owner_id[:8]}")
        # (command, kind, value, issued at): not recorded yet
        self._outbox: list[tuple[str, str, str, float]] = []
        self._seq = 0  # the last command seen
        self._wake = trio.Event()
        self._closed = False  # (the executor has: pause and resume raise; `close`)

    # ------------------------------------------------------------ here

    def pause(self, name: str | None, key: str | None) -> None:
        self._command("pause", check_target(name, key))

    def resume(self, name: str | None, key: str | None) -> None:
        self._command("resume", check_target(name, key))

    def _command(self, command: str, targets: list[tuple[str, str]]) -> None:
        if self._closed:
            raise ExecutorClosed(f"cannot {command}: the executor has closed")
        at = None if self._journal is None else issue_time(self._journal.store)
        for kind, value in targets:
            self._apply(command, kind, value)
            if at is not None:
                self._outbox.append((command, kind, value, at))
        self._changed()
        self._wake.set()

    def _apply(self, command: str, kind: str, value: str) -> None:
        into = self.names if kind == "name" else self.keys
        if command == "pause":
            into.add(value)
        else:
            into.discard(value)

    def _changed(self) -> None:
        self._pending.set_paused(frozenset(self.names), frozenset(self.keys))

    # ------------------------------------------------------------ the store

    async def load(self) -> None:
        """Take what the store has paused, and start after its last command
        (before any task starts): two short reads, however long the log."""
        journal = self._journal
        assert journal is not None
        self._seq = await journal.call(journal.store.last_command_seq)
        await self._sync()

    async def _sync(self) -> None:
        """What is paused is what the store says, and what is not recorded yet."""
        journal = self._journal
        assert journal is not None
        pauses = await journal.call(journal.store.pauses)
        self.names = {p.value for p in pauses if p.kind == "name"}
        self.keys = {p.value for p in pauses if p.kind == "key"}
        for command, kind, value, _ in self._outbox:
            self._apply(command, kind, value)
        self._changed()

    async def run(self) -> None:
        """Record this executor's commands and follow everyone's, forever."""
        journal = self._journal
        assert journal is not None
        store = journal.store
        listen = getattr(store, "wait_for_command", None)
        while True:
            if not self._outbox:  # (else: record it now)
                if listen is not None:  # PostgreSQL: until a command is sent, or POLL
                    await trio.to_thread.run_sync(listen, POLL, abandon_on_cancel=True)
                else:
                    with trio.move_on_after(POLL):
                        await self._wake.wait()
            self._wake = trio.Event()
            await self.flush()
            await self.follow(await journal.call(store.commands, self._seq))

    async def _cancel_descendants(self, task_id: str) -> None:
        """A cancel command of ``task_id``: its unfinished descendants this
        executor runs end too (wherever it ran: the store knows the tree)."""
        lifecycle = self._lifecycle
        if not lifecycle.uses_extras:
            return  # (nothing here has a parent)
        journal = self._journal
        assert journal is not None
        for record in await journal.call(journal.store.descendants, task_id):
            job = lifecycle.live.get(record.task_id)
            if job is not None:
                lifecycle.end_under(job, TaskStatus.CANCELLED, task_id)

    def close(self) -> None:
        """The executor has closed: a pause or resume from now on raises."""
        self._closed = True

    async def flush(self) -> None:
        """Record this executor's commands not recorded yet (also as it closes)."""
        journal = self._journal
        assert journal is not None
        while self._outbox:
            command, kind, value, at = self._outbox.pop(0)  # (taken first: recorded once)
            await journal.call(self._record, command, kind, value, at)

    def _record(self, command: str, kind: str, value: str, at: float) -> None:
        """Record one of this executor's commands (in the store's thread)."""
        assert self._journal is not None
        name, key = (value, None) if kind == "name" else (None, value)
        self._journal.store.command(command, name=name, key=key, who=self._who, at=at)

    async def follow(self, commands: list[Command]) -> None:
        """Act on ``commands`` (new, in order)."""
        if not commands:
            return
        self._seq = commands[-1].seq
        lifecycle = self._lifecycle
        for command in commands:
            if command.kind == "cancel" and command.task_id is not None:
                job = lifecycle.live.get(command.task_id)
                if job is not None and not job.ended:
                    lifecycle.cancelled_by[job.task_id] = command.who  # (its error says so)
                    lifecycle.cancel(job)
                await self._cancel_descendants(command.task_id)
            elif command.kind == "retry" and command.changed and self._on_retry is not None:
                self._on_retry()
        if any(c.kind in ("pause", "resume") for c in commands):
            await self._sync()
