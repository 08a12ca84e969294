"""The CLI's tables keep ids and states whole (issue 34): at 80 columns in a real
terminal, in a pipe (one row a line), and for any width and content (hypothesis over
`layout`, rendered by rich as the commands render it)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pexpect
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console
from test_cli import ANSI, TRIOEXEC, cli, cli_env, ok

import trioexec
from trioexec.cli._table import Column, layout, show
from trioexec.durable import DurableStore

# Ids people paste: long, with the characters that break naive tables.
IDS = [
    "refund-A-1042",
    "charge-card-with-a-rather-long-id-0",
    "nightly@2026-11-28T02:00:00+00:00",
    "batch[/]",
    "o'brien-✉️-report",
]


def build(path: Path) -> None:
    async def ok_(x: int) -> int:
        return x

    async def bad(x: int) -> None:
        raise RuntimeError("payments API said 503: service unavailable, please retry later")

    async def main() -> None:
        with trioexec.SQLiteStore(path) as store:
            async with trioexec.open_executor(max_concurrent_tasks=2, store=store) as ex:
                for i, task_id in enumerate(IDS):
                    fn = bad if i % 2 else ok_
                    await ex.submit(
                        fn,
                        i,
                        task_id=task_id,
                        name="billing.charge_card_with_retries",
                        key="api.payments.example.com",
                    )
        with DurableStore(path) as ds:
            for task_id in IDS:
                await ds.promises.create(f"approval-{task_id}", 3600.0)

    trio.run(main)


def pty(args: list[str], cwd: Path, columns: int) -> str:
    child = pexpect.spawn(
        TRIOEXEC[0],
        [*TRIOEXEC[1:], *args],
        cwd=str(cwd),
        env=cli_env(columns=None),
        dimensions=(50, columns),
        encoding="utf-8",
        timeout=30,
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return ANSI.sub("", child.before).replace("\r\n", "\n")


def test_status_at_80_columns_in_a_terminal_keeps_ids_and_states_whole(tmp_path: Path) -> None:
    build(tmp_path / "app.db")
    out = pty(["status", "app.db"], tmp_path, 80)
    lines = out.splitlines()
    assert all(cell_len(line) <= 80 for line in lines), out
    for i, task_id in enumerate(IDS):
        (line,) = [line for line in lines if task_id in line]  # whole, on one line
        assert ("failed" if i % 2 else "completed") in line.split()
    # (too narrow for every column side by side: the names stand under each row)
    assert out.count("billing.charge_card_with_retries") == len(IDS)


def test_durable_tables_at_80_columns_keep_ids_and_states_whole(tmp_path: Path) -> None:
    build(tmp_path / "app.db")
    out = pty(["promises", "app.db"], tmp_path, 80)
    for task_id in IDS:
        (line,) = [line for line in out.splitlines() if f"approval-{task_id}" in line]
        assert "pending" in line.split()


def test_tables_in_a_pipe_are_one_row_a_line(tmp_path: Path) -> None:
    build(tmp_path / "app.db")
    # (COLUMNS=40 is ignored in a pipe: nothing is cut to fit a width)
    out = ok(cli("status", "app.db", cwd=tmp_path, columns=40))
    summary, header, *rows = out.rstrip("\n").splitlines()
    assert summary == "app.db: 3 completed, 2 failed"
    assert header.split() == ["task", "name", "key", "status", "try", "error"]
    assert len(rows) == len(IDS)
    records = {
        r["task_id"]: r for r in json.loads(ok(cli("status", "app.db", "--json", cwd=tmp_path)))
    }
    for row in rows:
        task_id = next(t for t in IDS if row.startswith(t + " "))
        assert records[task_id]["status"] in row.split()
        if records[task_id]["error"]:
            assert "please retry later" in row  # the error's whole first line
    promises = ok(cli("promises", "app.db", cwd=tmp_path, columns=40)).splitlines()
    assert len(promises) == 1 + len(IDS)
    assert all("pending" in line.split() for line in promises[1:])


def render(columns: list[Column], rows: list[list[str]], width: int | None) -> str:
    console = Console(
        file=io.StringIO(), width=width or 80, force_terminal=False, color_system=None
    )
    show(console, layout(columns, rows, width))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")),
    max_size=40,
)
word = st.text(alphabet="abcxyz-_.[]/'@:0189✉", min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(st.booleans(), min_size=1, max_size=7),
    data=st.data(),
    width=st.one_of(st.none(), st.integers(20, 200)),
)
def test_layout_never_cuts_a_whole_column(
    kinds: list[bool], data: st.DataObject, width: int | None
) -> None:
    columns = [Column(f"c{i}", fold=fold) for i, fold in enumerate(kinds)]
    rows = data.draw(st.lists(st.tuples(*(text if fold else word for fold in kinds)), max_size=6))
    out = render(columns, [list(r) for r in rows], width)
    lines = out.splitlines()
    if width is None:
        assert len(lines) == 1 + len(rows)  # one row a line
    else:
        whole = [
            max([cell_len(c.header), *(cell_len(r[i]) for r in rows)])
            for i, c in enumerate(columns)
            if not c.fold
        ]
        if sum(whole) + 2 * (len(whole) - 1) <= width:
            assert all(cell_len(line) <= width for line in lines), out
    for row in rows:
        for value, fold in zip(row, kinds, strict=True):
            if not fold:
                # every id-like value stands whole on one line
                assert any(value in line for line in lines), (value, out)


EVIL = "ok\x1b[2J\x1b[31mEVIL\x1b[0m\nFAKE: 0 failed\r\u202eabc"
FAMILY = "family-\U0001f468\u200d\U0001f469\u200d\U0001f467"  # (zero-width joiners)


def test_what_a_name_holds_never_reaches_the_terminal_raw(tmp_path: Path) -> None:
    """An escape sequence, a newline or a bidi override in a paused name, a key or
    who sent a command is shown escaped on every line that shows it; an emoji
    made with zero-width joiners stays as it is (people copy it)."""

    async def main() -> None:
        with trioexec.SQLiteStore(tmp_path / "app.db") as store:
            async with trioexec.open_executor(store=store) as ex:
                await ex.submit(trio.sleep, 0, task_id=FAMILY, key=EVIL)
                ex.pause(name=EVIL)
                ex.pause(key=EVIL)
            store.command("resume", name="nothing", who=EVIL)

    trio.run(main)
    for args in (["status", "app.db"], ["commands", "app.db"]):
        out = ok(cli(*args, cwd=tmp_path))
        for raw in ("\x1b", "\r", "\u202e", "\nFAKE"):
            assert raw not in out, (args, raw)
        assert "\\x1b[2J" in out  # (said, escaped)
    status = ok(cli("status", "app.db", cwd=tmp_path))
    assert FAMILY in status
    assert "paused: key ok\\x1b[2J" in status
