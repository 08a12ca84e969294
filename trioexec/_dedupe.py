"""Submissions with a ``dedupe_key`` (API.md §13): one execution per key while
one is live, or completed within the submission's ``dedupe_window``.

Without a store, this executor's own executions decide (`Lifecycle.dedupes`,
remembered while it is open). With one, the store decides, in one transaction
at submission (`Store.dedupe`: the new row goes in then, or the execution that
holds the key comes back), so executors sharing it make one execution per key
even when they submit it at the same instant. A submission that uses no key
pays for none of this."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

from ._changes import R_DEDUPE
from ._records import TaskStatus, check_id, check_seconds
from ._remote import remote_job
from ._taskref import DuplicateRef, Extras, Job, TaskRef

if TYPE_CHECKING:
    from ._journal import Journal
    from ._machine._lifecycle import Lifecycle
    from ._records import ExecutionRecord

#: Past this many keys remembered, those of ended executions are forgotten (with
#: a store, which remembers them; the bound doubles while the live ones fill it).
_REMEMBERED = 4096


@final
class Dedupes:
    """One executor's side of deduplication: its submissions' keys, and the store's word."""

    def __init__(self, lifecycle: Lifecycle, journal: Journal | None, owner_id: str) -> None:
        self._lifecycle = lifecycle
        self._journal = journal
        self._owner_id = owner_id
        self._bound = _REMEMBERED

    async def submit(self, job: Job, key: object, window: object) -> TaskRef[Any] | None:
        """``job``'s submission with ``key``: the `TaskRef` of the execution that
        holds the key (``job`` is then dropped), or None: ``job`` holds it now
        (with a store, its row is stored) and goes on to admission."""
        found = self._mine(job, key, window)
        journal = self._journal
        if found is not None or journal is None:
            return found
        try:
            record = await journal.call(journal.store.dedupe, self._row(job, key), window)
        except BaseException:
            self._lifecycle.untrack(job)
            raise
        return self._decided(job, key, record)

    def submit_nowait(self, job: Job, key: object, window: object) -> TaskRef[Any] | None:
        """`submit` without a checkpoint: the store is called from this thread."""
        found = self._mine(job, key, window)
        journal = self._journal
        if found is not None or journal is None:
            return found
        try:
            record = journal.store.dedupe(self._row(job, key), window)  # type: ignore[arg-type]
        except BaseException:
            self._lifecycle.untrack(job)
            raise
        return self._decided(job, key, record)

    def _mine(self, job: Job, key: object, window: object) -> TaskRef[Any] | None:
        """Check the options; this executor's own execution that holds ``key``,
        if any (without a store, else ``job`` takes the key)."""
        try:
            if key is None:
                raise ValueError("dedupe_window needs a dedupe_key")
            check_id("dedupe_key", key)
            if window is not None:
                check_seconds("dedupe_window", window)
        except BaseException:
            self._lifecycle.untrack(job)
            raise
        assert isinstance(key, str)
        lifecycle = self._lifecycle
        found = lifecycle.dedupes.get(key)
        if found is not None and (
            not found.ended
            or (
                found.status is TaskStatus.COMPLETED
                and (window is None or lifecycle.wall() - found.finished_at < float(window))  # type: ignore[arg-type]
            )
        ):
            lifecycle.untrack(job)
            return DuplicateRef(found)
        if self._journal is None:
            self._take(job, key)
        return None

    def _row(self, job: Job, key: object) -> Any:
        """``job``'s row for `Store.dedupe`, made before ``job`` holds its key (a
        job that holds one has its row stored: the journal makes none)."""
        assert self._journal is not None
        row = self._journal.new_row(job, self._owner_id)
        assert row is not None
        row[R_DEDUPE] = key
        return row

    def _decided(self, job: Job, key: Any, record: ExecutionRecord | None) -> TaskRef[Any] | None:
        """The store stored ``job``'s row (``record`` None), or holds ``record``'s
        execution for the key."""
        if record is None:
            self._take(job, key)
            return None
        self._lifecycle.untrack(job)
        mine = self._lifecycle.live.get(record.task_id)
        if mine is not None:
            return DuplicateRef(mine)
        assert self._journal is not None
        who = f"executor {self._owner_id}"
        return DuplicateRef(remote_job(self._journal.store, record, who))

    def _take(self, job: Job, key: str) -> None:
        if job.extras is None:
            job.extras = Extras()
        job.extras.dedupe_key = key
        self._lifecycle.uses_extras = True
        dedupes = self._lifecycle.dedupes
        dedupes[key] = job
        if len(dedupes) > self._bound and self._journal is not None:
            for old in [k for k, j in dedupes.items() if j.ended]:
                del dedupes[old]
            self._bound = max(_REMEMBERED, 2 * len(dedupes))
