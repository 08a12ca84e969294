"""A subprocess whose stdout is read line by line, with a deadline (shared by the
multi-process acceptance tests; not a test module)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest


class LineProcess:
    """``python SCRIPT ARGS...``; `expect` waits (on the pipe, bounded) for a line."""

    def __init__(
        self,
        script: Path,
        args: list[str],
        stderr_path: Path,
        *,
        stdin: int = subprocess.DEVNULL,
        # Bounds a hang, never a wait for success: on a loaded machine a crash
        # worker's READY (start-up, 200 submissions, a flush) took over 20 s.
        timeout: float = 60.0,
    ) -> None:
        self.stderr_path = stderr_path
        self.timeout = timeout
        self._stderr = stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=stdin,
        )
        self._buffer = b""
        self.lines: list[str] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect(self, word: str, timeout: float | None = None) -> list[str]:
        """Read stdout until a line starting with ``word``; return that line's fields."""
        timeout = self.timeout if timeout is None else timeout
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n", 1)
                line = raw.decode()
                self.lines.append(line)
                if line.split(" ", 1)[0] == word:
                    return line.split()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.fail(f"no {word!r} line within {timeout}s")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait()
                self.fail(f"exited with {self.proc.returncode} before printing {word!r}")
            self._buffer += chunk

    def send(self, line: str) -> None:
        """Write ``line`` and a newline to its stdin (made with ``stdin=subprocess.PIPE``)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def fail(self, why: str) -> None:
        self._stderr.flush()
        pytest.fail(
            f"worker {self.pid} {why}; stdout so far: {self.lines!r}\n"
            f"stderr:\n{self.stderr_path.read_text(errors='replace')}"
        )

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stdin):
            if pipe is not None:
                pipe.close()
        self._stderr.close()
