"""Submissions with a ``dedupe_key`` (API.md §13): one execution per key while
one is live, or completed within the submission's ``dedupe_window``.

Without a store, this executor's own executions decide (`Lifecycle.dedupes`,
remembered while it is open). With one, the store decides, in one transaction
at submission (`Store.dedupe`: the new row goes in then, or the execution that
holds the key comes back), so executors sharing it make one execution per key
even when they submit it at the same instant. A submission without a key goes
nowhere near this module."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

import attrs

from ._changes import R_DEDUPE, Finish, widen
from ._errors import ExecutorClosed
from ._records import COMPLETED, REJECTED, check_id, check_seconds, safe_repr
from ._remote import remote_job
from ._taskref import DuplicateRef, Extras, Job, TaskRef

if TYPE_CHECKING:
    from ._changes import ExecutionRow
    from ._journal import Journal
    from ._machine._lifecycle import Lifecycle
    from ._records import ExecutionRecord

#: Past this many keys remembered, those of ended executions are forgotten (with
#: a store, which remembers them; the bound doubles while the live ones fill it).
_REMEMBERED = 4096


@final
@attrs.define(eq=False)
class Dedupes:
    """One executor's side of deduplication: its submissions' keys, and the store's word."""

    _lifecycle: Lifecycle
    _journal: Journal | None
    _owner_id: str
    _check_new_id: Callable[[str, bool], None]
    _check_open: Callable[[], None]  # (raises ExecutorClosed)
    _bound: int = attrs.field(default=_REMEMBERED, init=False)

    async def submit(
        self, job: Job, key: object, window: object, chosen: bool
    ) -> TaskRef[Any] | None:
        """``job``'s submission with ``key`` (made by ``new_job(...,
        deduping=key)``; ``chosen``: with a ``task_id``, not claimed yet): the
        `TaskRef` of the execution that holds the key, or None: ``job`` holds it
        now (with a store, its row is stored) and goes on to admission."""
        found = self._mine(job, key, window, chosen)
        journal = self._journal
        if found is not None or journal is None:
            return found
        row = self._row(job, key)
        try:
            record = await journal.call(journal.store.dedupe, row, window)
            if self._ended_here(record):  # (its end is not written yet)
                await journal.flush()
                record = await journal.call(journal.store.dedupe, row, window)
        except BaseException:
            self._lifecycle.untrack(job)
            raise
        found = self._decided(job, key, record)
        if found is None:
            try:
                self._check_open()  # (the executor may have begun to close meanwhile)
            except ExecutorClosed as closed:
                # Its row is stored, and the journal may write no more: end it here.
                assert job.extras is not None
                job.extras.dedupe_key = None  # (it holds the key no more)
                if self._lifecycle.dedupes.get(str(key)) is job:
                    del self._lifecycle.dedupes[str(key)]
                self._lifecycle.untrack(job)
                job.status, job.finished_at = REJECTED, self._lifecycle.wall()
                error = safe_repr(closed)
                finish = (job.task_id, job.version, job.status, job.finished_at, error, None, None)
                await journal.call(journal.store.write, [Finish(finish)])
                raise
        return found

    def submit_nowait(
        self, job: Job, key: object, window: object, chosen: bool
    ) -> TaskRef[Any] | None:
        """`submit` without a checkpoint: the store is called from this thread
        (and an execution of this executor that ended moments ago, its end not
        written yet, still holds its key)."""
        found = self._mine(job, key, window, chosen)
        journal = self._journal
        if found is not None or journal is None:
            return found
        try:
            record = journal.store.dedupe(self._row(job, key), window)  # type: ignore[arg-type]
        except BaseException:
            self._lifecycle.untrack(job)
            raise
        return self._decided(job, key, record)

    def _mine(self, job: Job, key: object, window: object, chosen: bool) -> TaskRef[Any] | None:
        """Check the options; this executor's own execution that holds ``key``,
        if any. Else the job's id, if ``chosen`` by its submitter, is claimed
        (and without a store, the job takes the key)."""
        if key is None:  # (then new_job claimed a chosen id already)
            self._lifecycle.untrack(job)
            raise ValueError("dedupe_window needs a dedupe_key")
        check_id("dedupe_key", key)
        if window is not None:
            check_seconds("dedupe_window", window)
        assert isinstance(key, str)
        lifecycle = self._lifecycle
        found = lifecycle.dedupes.get(key)
        if found is not None and (
            not found.ended
            or (
                found.status is COMPLETED
                and (window is None or lifecycle.wall() - found.finished_at < window)  # type: ignore[operator]
            )
        ):
            return DuplicateRef(found)
        if chosen:  # (the store refuses one it has as it inserts the row)
            self._check_new_id(job.task_id, False)
            lifecycle.track_named(job)
        if self._journal is None:
            self._take(job, key)
        return None

    def _row(self, job: Job, key: object) -> ExecutionRow:
        """``job``'s row for `Store.dedupe`, made before ``job`` holds its key (a
        job that holds one has its row stored: the journal makes none)."""
        assert self._journal is not None
        row = self._journal.new_row(job, self._owner_id)
        assert row is not None
        widen(row)[R_DEDUPE] = key
        return row

    def _ended_here(self, record: ExecutionRecord | None) -> bool:
        """``record`` is live in the store, but its execution ended here already,
        other than completed (it does not hold its key any more)."""
        if record is None:
            return False
        mine = self._lifecycle.dedupes.get(record.dedupe_key)  # type: ignore[arg-type]
        return (
            mine is not None
            and mine.task_id == record.task_id
            and mine.ended
            and mine.status is not COMPLETED
        )

    def _decided(self, job: Job, key: Any, record: ExecutionRecord | None) -> TaskRef[Any] | None:
        """The store stored ``job``'s row (``record`` None), or holds ``record``'s
        execution for the key."""
        if record is None:
            self._take(job, key)
            return None
        self._lifecycle.untrack(job)
        mine = self._lifecycle.dedupes.get(key)
        if mine is None or mine.task_id != record.task_id:
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
        self._lifecycle.use_extras()
        dedupes = self._lifecycle.dedupes
        dedupes[key] = job
        if len(dedupes) > self._bound and self._journal is not None:
            for old in [k for k, j in dedupes.items() if j.ended]:
                del dedupes[old]
            self._bound = max(_REMEMBERED, 2 * len(dedupes))
