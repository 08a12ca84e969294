"""The views open the database read-only (issue 13, defects 18 and 21): they never
create, migrate or lock it, and work while another process holds the write lock;
a locked database in the demo is one line. The real console script, real files,
and a real second process holding the lock."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_cli import TRIOEXEC, AppDb, build_app_db, cli, cli_env, ok, one_line_error
from test_sqlite_store import write_lock_held

VIEWS = [
    ["status"],
    ["status", "--json"],
    ["watch", "--once"],
    ["runs"],
    ["tasks"],
    ["promises"],
    ["promises", "list"],
    ["check"],
]


def view(args: list[str], db: str) -> list[str]:
    """``args`` with the database argument in its place (after ``promises list``)."""
    at = 2 if args[:2] == ["promises", "list"] else 1
    return [*args[:at], db, *args[at:]]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> AppDb:
    return build_app_db(tmp_path_factory.mktemp("readonly") / "app.db")


@pytest.mark.parametrize("args", [["status"], ["promises"], ["check"]], ids=" ".join)
def test_a_view_of_an_empty_file_leaves_it_empty(tmp_path: Path, args: list[str]) -> None:
    """Before the fix `status` on a 0-byte file made it a trioexec database."""
    (tmp_path / "empty.db").touch()
    line = one_line_error(cli(*view(args, "empty.db"), cwd=tmp_path), 1)
    assert line == "trioexec: empty.db: not a trioexec database (empty file)"
    assert [(p.name, p.stat().st_size) for p in tmp_path.iterdir()] == [("empty.db", 0)]


def test_every_view_works_while_another_process_holds_the_write_lock(app: AppDb) -> None:
    """Before the fix each view waited 10 s for the write lock, then failed."""
    before = app.path.read_bytes()
    with write_lock_held(app.path):
        views = {
            " ".join(args): subprocess.Popen(
                [*TRIOEXEC, *view(args, "app.db")],
                cwd=app.path.parent,
                env=cli_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for args in VIEWS
        }
        # The lock is held until every view has ended: a view that needed it
        # would wait its busy timeout and fail (its exit status, checked below).
        # No bound on the time: eight processes on a loaded 2-core machine under
        # coverage took 8.7-10.7 s, though none of them waited for the lock.
        done = {name: proc.communicate(timeout=60) for name, proc in views.items()}
    for name, (_out, errors) in done.items():
        assert (views[name].returncode, errors) == (0, ""), name
    assert "app.db: 1 pending, 3 running, 4 completed, 2 failed" in done["status"][0]
    assert "approval-old" in done["watch --once"][0]
    assert "run-bad" in done["runs"][0]
    assert "job-1" in done["tasks"][0]
    assert "approval-7" in done["promises"][0]
    assert "done-1" in done["promises list"][0]
    assert done["check"][0].strip() == "app.db: all invariants hold"
    assert app.path.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only files regardless")
def test_views_of_a_read_only_file(tmp_path: Path) -> None:
    """Before the fix a view opened the file for writing, and failed on a 0444 file."""
    app = build_app_db(tmp_path / "app.db")
    app.path.chmod(0o444)
    try:
        for args in VIEWS:
            ok(cli(*view(args, "app.db"), cwd=tmp_path))
    finally:
        app.path.chmod(0o644)


def test_resolving_a_promise_still_writes(app: AppDb, tmp_path: Path) -> None:
    """The actions are not views: they open the file read-write."""
    copy = tmp_path / "app.db"
    copy.write_bytes(app.path.read_bytes())
    out = ok(cli("promises", "resolve", "app.db", "approval-7", "--data", "1", cwd=tmp_path))
    assert out.strip() == "promise approval-7: resolved"
    listing = ok(cli("promises", "app.db", "--state", "resolved", cwd=tmp_path))
    assert "approval-7" in listing


def test_a_locked_database_in_the_demo_is_one_line(tmp_path: Path) -> None:
    """Before the fix: a write stuck behind another process's lock ended the demo in a
    100-line ExceptionGroup traceback. Now one line naming the file, exit 1."""
    demo = subprocess.Popen(
        [*TRIOEXEC, "demo", "--tasks", "8", "--slots", "2", "--db", "demo.db"],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert demo.stdout is not None
        # The demo says where it records once its store is open; then lock it.
        assert "Recording to" in demo.stdout.readline()
        with write_lock_held(tmp_path / "demo.db"):
            out, errors = demo.communicate(timeout=60)
    finally:
        demo.kill()
        demo.wait()
    assert demo.returncode == 1
    assert "Traceback" not in out + errors
    lines = errors.splitlines()
    assert len(lines) == 1, errors
    assert lines[0].startswith("trioexec: demo.db: ")
    assert "database is locked" in lines[0]
