"""The acceptance workers' shared log: one line per event, appended atomically.

Several processes (some SIGKILLed mid-run) append to one file; a single
``write`` on an ``O_APPEND`` descriptor keeps every line whole.
"""

from __future__ import annotations

import os


def append_line(log: str, *fields: object) -> None:
    """Append ``fields`` joined by spaces as one line to ``log``."""
    line = (" ".join(str(f) for f in fields) + "\n").encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
