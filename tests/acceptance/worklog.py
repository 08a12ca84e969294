"""What the acceptance workers share: their log, one line per event appended
atomically, and how they see that a store has nothing live left.

Several processes (some SIGKILLed mid-run) append to one file; a single
``write`` on an ``O_APPEND`` descriptor keeps every line whole.
"""

from __future__ import annotations

import os

from trioexec import Store, TaskStatus


def append_line(log: str, *fields: object) -> None:
    """Append ``fields`` joined by spaces as one line to ``log``."""
    line = (" ".join(str(f) for f in fields) + "\n").encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def any_live(store: Store) -> bool:
    """True while ``store`` holds a pending or running execution. One read: two
    (pending, then running) can both miss a row that a recovery claims between
    them, moving it from running to pending, and a worker then leaves early."""
    counts = store.counts()
    return counts[TaskStatus.PENDING] + counts[TaskStatus.RUNNING] > 0
