"""A throwaway PostgreSQL server for the tests and benchmarks: its data directory
and socket in a temporary directory, on 127.0.0.1 and a free port, stopped and
deleted after.

PostgreSQL's ``initdb`` and ``postgres`` refuse to run as root (who runs CI here):
as root they run as the ``postgres`` user, with the directory chowned to it.
``TRIOEXEC_TEST_POSTGRES_URL`` names a server to use instead of starting one.

Run as a script, it starts a server and prints its URL until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

USER_ENV = "TRIOEXEC_TEST_POSTGRES_URL"
#: The servers `postgres_server` started, by URL: (pg_ctl, data directory, options, log).
_STARTED: dict[str, tuple[str, str, str, str]] = {}
#: The stores every conformance test runs over (``store_maker`` in conftest.py).
STORE_KINDS = ["memory", "sqlite", "postgres"]


class NoServer(RuntimeError):
    """No PostgreSQL server could be started here (the reason says why)."""


def _bindir() -> str:
    initdb = shutil.which("initdb")
    if initdb:
        return os.path.dirname(initdb)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        found = out.stdout.strip()
        if out.returncode == 0 and os.path.exists(os.path.join(found, "initdb")):
            return found
    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(found, "initdb")):
            return found
    raise NoServer("initdb not found (PATH, pg_config --bindir, /usr/lib/postgresql/*/bin)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--", *cmd]
    return ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(cmd)]


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(
        _as_server_user(cmd), capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise NoServer(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}")


@contextlib.contextmanager
def schema_at_version(url: str, schema: str, version: int) -> Iterator[object]:
    """A connection (autocommit) to a new ``schema`` as an older trioexec left it:
    its first ``version`` migrations applied and recorded, for the caller to write
    the old rows a migration test starts from."""
    import psycopg

    from trioexec._store import _pg_schema

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"SET search_path TO {schema}")
        for migration in _pg_schema.MIGRATIONS[:version]:
            conn.execute(migration.encode())
        conn.execute(
            "INSERT INTO trioexec_meta (key, value) VALUES ('schema_version', %s)", (str(version),)
        )
        yield conn


@contextlib.contextmanager
def postgres_server(*, durable: bool = False) -> Iterator[str]:
    """Start a server; yield its URL (user ``postgres``, database ``postgres``, no
    password). ``durable=False`` turns fsync off (tests: faster; a crash of the
    server itself is not what they test)."""
    given = os.environ.get(USER_ENV)
    if given:
        yield given
        return
    bindir = _bindir()
    if os.geteuid() == 0:
        try:
            import pwd

            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise NoServer("running as root and there is no 'postgres' user") from None
    top = tempfile.mkdtemp(prefix="trioexec-pg-")
    try:
        if os.geteuid() == 0:
            os.chown(top, pw.pw_uid, pw.pw_gid)
        data = os.path.join(top, "data")
        _run(
            [os.path.join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
             "-E", "UTF8", "--no-sync", "--no-instructions"],
            "initdb",
        )  # fmt: skip
        log = os.path.join(top, "server.log")
        taken = False
        for tries_left in reversed(range(5)):
            # (A port free now may be taken before the server binds it: by another
            # pytest-xdist worker starting its own server. Then take another.)
            port = _free_port()
            options = f"-p {port} -k {top} -h 127.0.0.1 -c max_connections=300"
            if not durable:
                options += " -F -c synchronous_commit=off -c full_page_writes=off"
            try:
                _run(
                    [os.path.join(bindir, "pg_ctl"), "-D", data, "-o", options,
                     "-l", log, "-w", "-t", "60", "start"],
                    "pg_ctl start",
                )  # fmt: skip
                break
            except NoServer:
                with contextlib.suppress(OSError), open(log, errors="replace") as f:
                    taken = "could not bind" in f.read()
                if not (tries_left and taken):
                    raise
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        _STARTED[url] = (
            os.path.join(bindir, "pg_ctl"),
            data,
            options,
            log,
        )
        try:
            yield url
        finally:
            del _STARTED[url]
            if os.path.exists(os.path.join(data, "postmaster.pid")):  # (a test may have stopped it)
                _run(
                    [os.path.join(bindir, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"],
                    "pg_ctl stop",
                )
    finally:
        shutil.rmtree(top, ignore_errors=True)


def pg_ctl(url: str, action: str) -> None:
    """``pg_ctl restart``, ``stop`` or ``start`` (``-m fast``, waiting for it) on a
    server `postgres_server` started here (not one named by ``USER_ENV``):
    a test's own server, to restart or stop under a running store."""
    if url not in _STARTED:
        raise NoServer(f"{url} is not a server these tests started (pg_ctl {action})")
    binary, data, options, log = _STARTED[url]
    cmd = [binary, "-D", data, "-w", "-t", "60"]
    if action in ("restart", "stop"):
        cmd += ["-m", "fast"]
    if action in ("restart", "start"):
        cmd += ["-o", options, "-l", log]
    _run([*cmd, action], f"pg_ctl {action}")


if __name__ == "__main__":
    with postgres_server(durable="--durable" in sys.argv) as url:
        print(url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
