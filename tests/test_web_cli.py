"""``trioexec dashboard``, the real command in a subprocess: it prints the URL line
(a free port with ``--port 0``), serves the pages over HTTP, and stops on SIGINT
or SIGTERM with exit 0, an event stream open or not; a missing database, or no
``web`` extra, is one line on stderr."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import trio
from test_cli import TRIOEXEC, cli, cli_env, one_line_error

import trioexec
from trioexec._changes import RunCreated, submitted
from trioexec.web._security import cookie_name, cookie_value

URL_LINE = re.compile(
    r"trioexec dashboard: (http://127\.0\.0\.1:(\d+)/\?token=([\w-]+))( \(read-only\))?"
)
DEADLINE = 30.0  # seconds a process gets to say something (another process: a deadline)


def make_db(path: Path) -> None:
    async def noop() -> None:
        await trio.lowlevel.checkpoint()

    async def main() -> None:
        with trioexec.open_store(path) as store:
            async with trioexec.open_executor(store=store) as ex:
                await (await ex.submit(noop, name="<script>x</script>")).wait()

    trio.run(main)


def read_line(proc: subprocess.Popen[str]) -> str:
    """The next stdout line, within `DEADLINE` (the process's stderr if it ends)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(DEADLINE):
            raise AssertionError("no line from the dashboard within the deadline")
    line = proc.stdout.readline()
    assert line, f"the dashboard ended: {proc.stderr.read() if proc.stderr else ''}"
    return line.rstrip("\n")


@contextmanager
def dashboard(*args: str, cwd: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [*TRIOEXEC, "dashboard", *args],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(DEADLINE)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def stop(proc: subprocess.Popen[str], how: int) -> int:
    proc.send_signal(how)
    return proc.wait(DEADLINE)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_prints_the_url_serves_and_stops_with_exit_0(tmp_path: Path, how: int) -> None:
    make_db(tmp_path / "app.db")
    with dashboard("app.db", "--port", "0", cwd=tmp_path) as proc:
        line = read_line(proc)
        found = URL_LINE.fullmatch(line)
        assert found, line
        assert found.group(4) is None
        url, port, token = found.group(1), found.group(2), found.group(3)
        with httpx.Client(timeout=DEADLINE) as client:
            page = client.get(url, follow_redirects=True)
            assert page.status_code == 200
            assert str(page.url) == f"http://127.0.0.1:{port}/"
            assert 'data-read-only="false"' in page.text
            tasks = client.get(f"http://127.0.0.1:{port}/tasks")
            assert "&lt;script&gt;x&lt;/script&gt;" in tasks.text
            assert "<script>x" not in tasks.text
            assert client.cookies.get(cookie_name(token)) == cookie_value(token)
            # An event stream open while it stops: the stream ends, the exit is clean.
            with client.stream("GET", f"http://127.0.0.1:{port}/events") as events:
                assert events.headers["content-type"].startswith("text/event-stream")
                lines = events.iter_lines()
                assert next(lines) == "retry: 3000"
                assert next(lines) == "event: refresh"
                started = time.monotonic()
                assert stop(proc, how) == 0
                assert time.monotonic() - started < 10
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read()


def test_read_only_says_so_and_has_no_actions(tmp_path: Path) -> None:
    make_db(tmp_path / "app.db")
    with dashboard("app.db", "--port", "0", "--read-only", cwd=tmp_path) as proc:
        found = URL_LINE.fullmatch(read_line(proc))
        assert found
        assert found.group(4) == " (read-only)"
        with httpx.Client(timeout=DEADLINE) as client:
            page = client.get(found.group(1), follow_redirects=True)
            assert 'data-read-only="true"' in page.text
            base = f"http://127.0.0.1:{found.group(2)}"
            refused = client.post(
                f"{base}/actions/pause",
                data={"kind": "name", "value": "x"},
                headers={"origin": base},
            )
            assert refused.status_code == 404
        assert stop(proc, signal.SIGINT) == 0
    with trioexec.open_store(tmp_path / "app.db", read_only=True) as store:
        assert store.pauses() == []


def test_server_errors_are_written_to_stderr(tmp_path: Path) -> None:
    """A page whose store read failed (the file deleted) leaves one line naming it
    on stderr (the web app's log, which trioexec alone would keep silent)."""
    make_db(tmp_path / "app.db")
    with trioexec.open_store(tmp_path / "app.db") as store:
        store.write([RunCreated(("bent", "w", "wf", "{}", time.time(), '{"a": []}'))])
    with sqlite3.connect(tmp_path / "app.db") as conn:  # (a graph no trioexec writes)
        conn.execute("""UPDATE workflow_runs SET graph = '{"a": 5}' WHERE run_id = 'bent'""")
    conn.close()
    with dashboard("app.db", "--port", "0", cwd=tmp_path) as proc:
        found = URL_LINE.fullmatch(read_line(proc))
        assert found
        base = f"http://127.0.0.1:{found.group(2)}"
        with httpx.Client(timeout=DEADLINE) as client:
            bent = client.get(f"{base}/runs/bent")
            (tmp_path / "app.db").unlink()
            gone = client.get(f"{base}/tasks")
        assert stop(proc, signal.SIGINT) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
    assert gone.status_code == 503
    assert "GET /tasks: the store could not be read" in err
    assert "app.db: the database file was deleted" in err
    # A graph no trioexec writes reads as none: the run's page draws its steps
    # as a column instead of failing.
    assert bent.status_code == 200


def test_ctrl_c_with_an_idle_keep_alive_connection_exits_at_once(tmp_path: Path) -> None:
    """A browser keeps its connection open between pages: the server stops without
    waiting long for it."""
    make_db(tmp_path / "app.db")
    with dashboard("app.db", "--port", "0", cwd=tmp_path) as proc:
        found = URL_LINE.fullmatch(read_line(proc))
        assert found
        with socket.create_connection(("127.0.0.1", int(found.group(2)))) as idle:
            idle.sendall(b"GET /static/dashboard.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            idle.settimeout(DEADLINE)
            assert idle.recv(12) == b"HTTP/1.1 200"
            started = time.monotonic()
            assert stop(proc, signal.SIGINT) == 0
            took = time.monotonic() - started
    assert took < 1.0, f"Ctrl-C took {took:.2f} s"


def test_a_static_file_asked_with_connection_close_closes_the_connection(tmp_path: Path) -> None:
    """Issue 30, 4: static files need no token even on 0.0.0.0, so a connection
    held open after one (``Connection: close`` ignored) is anyone's to keep: the
    server closes it after the response, as it does after a page."""
    make_db(tmp_path / "app.db")
    with dashboard("app.db", "--port", "0", "--host", "0.0.0.0", cwd=tmp_path) as proc:
        found = URL_LINE.fullmatch(read_line(proc))
        assert found
        for path in ("/static/dashboard.css", "/static/dashboard.js", "/static/nope.css"):
            with socket.create_connection(("127.0.0.1", int(found.group(2)))) as conn:
                conn.sendall(
                    f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
                )
                conn.settimeout(10.0)  # (a deadline: the response is a few KB)
                got = b""
                try:
                    while chunk := conn.recv(65536):
                        got += chunk
                except TimeoutError:
                    pytest.fail(f"{path}: the connection stayed open after {got[:200]!r}")
            head, _, body = got.partition(b"\r\n\r\n")
            status = 404 if "nope" in path else 200
            assert head.startswith(f"HTTP/1.1 {status}".encode()), (path, head)
            if status == 200:
                assert int(re.search(rb"content-length: (\d+)", head).group(1)) == len(body)  # type: ignore[union-attr]
                assert body == (Path(trioexec.__file__).parent / "web" / path[1:]).read_bytes()
        assert stop(proc, signal.SIGINT) == 0


@contextmanager
def cuttable_proxy(
    target_port: int,
) -> Iterator[tuple[int, Callable[[], None], threading.Event]]:
    """A TCP proxy to 127.0.0.1:``target_port`` in a thread: its port, a function
    that cuts it (the server gone unreachable: every connection closed, a new one
    accepted and never answered, as a lost route leaves a connect waiting for its
    timeout), and an event set once a connection waits so after the cut."""
    listener = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []
    cut = threading.Event()
    hanging = threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                conns.append(client)
                if cut.is_set():
                    hanging.set()
                    continue  # (silent)
                server = socket.create_connection(("127.0.0.1", target_port))
                conns.append(server)
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def do_cut() -> None:
        cut.set()
        for c in list(conns):
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], do_cut, hanging
    finally:
        listener.close()
        do_cut()


def test_ctrl_c_with_postgres_unreachable_exits_at_once(tmp_path: Path, pg_database: str) -> None:
    with trioexec.open_store(pg_database) as store:
        store.write([submitted("t1", 1, "n", None, None, None, "w", time.time())])
    parts = urllib.parse.urlsplit(pg_database)
    with cuttable_proxy(parts.port or 5432) as (port, cut, hanging):
        # (a 2 s connect timeout, libpq's least: the 503 below waits it out)
        netloc = f"{parts.username}@127.0.0.1:{port}"
        query = "&".join(q for q in (parts.query, "connect_timeout=2") if q)
        url = parts._replace(netloc=netloc, query=query).geturl()
        with dashboard(url, "--port", "0", cwd=tmp_path) as proc:
            found = URL_LINE.fullmatch(read_line(proc))
            assert found
            base = f"http://127.0.0.1:{found.group(2)}"
            with httpx.Client(timeout=DEADLINE) as client:
                assert client.get(f"{base}/").status_code == 200
                cut()
                assert client.get(f"{base}/tasks").status_code == 503  # (the store met it)
            # The store's next read (the poller's, within a second) waits for a
            # connection the server no longer answers: the proxy sees it wait.
            assert hanging.wait(DEADLINE), "no connection attempt after the cut"
            started = time.monotonic()
            assert stop(proc, signal.SIGINT) == 0
            took = time.monotonic() - started
    assert took < 3.0, f"Ctrl-C took {took:.1f} s"


def test_a_missing_database_is_one_line_and_exit_1(tmp_path: Path) -> None:
    proc = cli("dashboard", "nope.db", "--port", "0", cwd=tmp_path)
    assert "nope.db" in one_line_error(proc, 1)
    assert not (tmp_path / "nope.db").exists()


def test_without_the_web_extra_it_says_what_to_install(tmp_path: Path) -> None:
    make_db(tmp_path / "app.db")
    code = (
        "import sys; sys.modules['starlette'] = None\n"  # (as if it were not installed)
        "from trioexec.cli import run; run(['dashboard', 'app.db'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    line = one_line_error(proc, 2)
    assert "pip install 'trioexec[web]'" in line


def test_the_printed_url_and_which_hosts_are_loopback() -> None:
    from trioexec.web._security import is_loopback
    from trioexec.web._serve import url_of

    assert url_of("http://127.0.0.1:4321", "127.0.0.1", "T") == "http://127.0.0.1:4321/?token=T"
    assert url_of("http://0.0.0.0:80", "0.0.0.0", "T") == "http://127.0.0.1:80/?token=T"
    assert url_of("http://[::1]:80", "::1", "T") == "http://[::1]:80/?token=T"
    for host in ("127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.4", "example.com", "127.0.0.1.evil.example", ""):
        assert not is_loopback(host), host
