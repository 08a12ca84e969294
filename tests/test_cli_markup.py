"""What comes from the database is printed as it is (issue 13, defect 19): names, ids,
errors, tags and paths are never parsed as rich markup (a task named ``batch[/]``
crashed ``status``; ``[bold]`` vanished) nor as emoji codes; and the views cut in SQL
(``status --json`` honours ``--limit``). The real console script, real files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio
from test_cli import cli, ok, one_line_error, squash

from trioexec import SQLiteStore, SubStatus, TaskStatus
from trioexec._changes import Finish, RunCreated, Start, StepRecorded, Sub, submitted
from trioexec.durable import DurableStore

NAMES = [
    "batch[/]",
    "[bold]loud[/bold]",
    "[red]",
    "[link=http://example.com]click[/link]",
    "say \"hi\" 'there'",
    "party \N{PARTY POPPER}",
    ":smile:",
    "back\\slash[/]",
]


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database (in a directory whose name is markup too) where every name, id,
    error, tag and target is one of NAMES."""
    path = tmp_path_factory.mktemp("markup") / "[bold]odd :smile:.db"
    now = time.time()
    changes: list[tuple[object, ...]] = [RunCreated(("[run]/1", "w", "wf[/]", "{}", now, None))]
    for i, name in enumerate(NAMES):
        task_id = f"{name}#{i}"
        run_id = "[run]/1" if i == 0 else None
        changes += [
            submitted(task_id, 1, name, run_id, None, None, "w", now - 100 + i),
            Start((task_id, 1, 1, now - 100 + i)),
        ]
        if i % 2:
            changes.append(Sub((task_id, 1, SubStatus.DEFERRED, now - 50 + i, None)))
        else:
            changes.append(
                Finish((task_id, 1, TaskStatus.FAILED, now, f"Error({name!r})", None, None))
            )
    changes.append(StepRecorded(("[run]/1", "w", "[step]", "failed", None, f"{NAMES[0]}#0")))
    with SQLiteStore(path) as store:
        store.heartbeat("w", now + 3600)
        store.write(changes)

    async def durable() -> None:
        with DurableStore(path) as ds:
            for name in NAMES:
                await ds.promises.create(name, 3600, data=name, tags={"k[/]": name})
            await ds.promises.create("job[/]", 3600, target="target[/]")

    trio.run(durable)
    return path


@pytest.mark.parametrize(
    "args",
    [["status"], ["status", "--sub-status", "deferred"], ["watch", "--once"], ["runs", "[run]/1"]],
    ids=" ".join,
)
def test_execution_views_print_names_as_they_are(odd: Path, args: list[str]) -> None:
    """Before the fix: `MarkupError: closing tag '[/]' ... has nothing to close`."""
    out = squash(ok(cli(args[0], odd.name, *args[1:], cwd=odd.parent)))
    shown = [
        (i, name)
        for i, name in enumerate(NAMES)
        if args[1:] != ["--sub-status", "deferred"] or i % 2
    ]
    if args[0] == "watch":
        shown = [(i, name) for i, name in shown if i % 2]
    elif args[0] == "runs":
        shown = shown[:1]
        assert "[run]/1 wf[/] running" in out
    for i, name in shown:
        assert f"{name}#{i} {name} " in out, name
    if args == ["status"]:
        assert out.startswith(f"{odd.name}: 4 running, 4 failed ")
        assert "Error('batch[/]')" in out
    if args[0] == "watch":
        assert f"trioexec watch {odd.name} — " in out


def test_durable_views_print_ids_data_and_tags_as_they_are(odd: Path) -> None:
    promises = squash(ok(cli("promises", odd.name, cwd=odd.parent)))
    for name in NAMES:
        assert f"{name} pending {json.dumps(name)}" in promises, name  # data: stored JSON
        assert json.dumps({"k[/]": name}, ensure_ascii=False) in promises, name
    tasks = squash(ok(cli("tasks", odd.name, cwd=odd.parent)))
    assert "job[/] pending 0 target[/]" in tasks
    assert ok(cli("check", odd.name, cwd=odd.parent)) == f"{odd.name}: all invariants hold\n"


def test_an_error_naming_a_database_value_is_printed_as_it_is(odd: Path) -> None:
    line = one_line_error(cli("runs", odd.name, "nope[/]", cwd=odd.parent), 1)
    assert line == f"trioexec: {odd.name}: no workflow run 'nope[/]'"
    line = one_line_error(cli("status", "[red]gone[/].db", cwd=odd.parent), 1)
    assert line == "trioexec: [red]gone[/].db: no such database file"


def test_status_json_honours_limit(odd: Path) -> None:
    """Before the fix `--json` printed every row, whatever --limit said."""
    got = json.loads(ok(cli("status", odd.name, "--json", "--limit", "3", cwd=odd.parent)))
    assert [r["task_id"] for r in got] == [f"{name}#{i}" for i, name in enumerate(NAMES[:3])]


def test_status_limit_counts_what_matches(odd: Path) -> None:
    out = ok(cli("status", odd.name, "--status", "running", "--limit", "1", cwd=odd.parent))
    assert out.rstrip().splitlines()[-1] == "... and 3 more (--limit)"
    out = ok(cli("status", odd.name, "--older-than", "30s", "--limit", "2", cwd=odd.parent))
    assert out.rstrip().splitlines()[-1] == "... and 2 more (--limit)"
