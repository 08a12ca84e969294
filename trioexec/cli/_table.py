"""The CLI's tables: what people copy stays whole, only free text folds.

Ids, statuses, counts and times are never cut, folded or wrapped: people paste them
into the next command. Free text (a name, an error, a reason) folds when the terminal
is narrow; narrower still, each row's whole columns stand on one line, its free text
folded under it. Not a terminal (a pipe, a file): plain lines, one row a line, columns
padded with spaces, nothing cut, for ``grep``, ``awk`` and ``cut`` (``--json`` is
there for scripts).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Literal

import attrs
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

#: Spaces between two columns.
GAP = 2
#: A folding column narrower than this reads as a ladder of fragments: the table is
#: printed as plain lines instead.
MIN_FOLD = 12


@attrs.frozen
class Column:
    """One column: its header, and whether its text may fold (free text) or must
    stay whole (ids, states, numbers, times: the default)."""

    header: str
    fold: bool = False
    justify: Literal["left", "right"] = "left"


def one_line(value: object) -> str:
    """``value`` as table text on one line: control characters (a newline in an
    error, an escape sequence in a name), line separators and the bidirectional
    controls that reorder what a terminal shows are written escaped, as ``repr``
    writes them; other characters (a zero-width joiner in an emoji) stay."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(
        repr(c)[1:-1] if unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in _BIDI else c
        for c in text
    )


#: The bidirectional embedding, override and isolate controls ("Trojan Source").
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def layout(
    columns: Sequence[Column], rows: Sequence[Sequence[object]], width: int | None
) -> RenderableType:
    """The table of ``rows`` for a terminal ``width`` columns wide (None: not a
    terminal). Every row has one value per column."""
    cells = [[one_line(v) for v in row] for row in rows]
    natural = [
        max([cell_len(c.header), *(cell_len(row[i]) for row in cells)])
        for i, c in enumerate(columns)
    ]
    if width is not None:
        folding = [i for i, c in enumerate(columns) if c.fold]
        whole = sum(w for i, w in enumerate(natural) if not columns[i].fold)
        spare = width - whole - GAP * (len(columns) - 1)
        if sum(natural[i] for i in folding) <= spare:
            return _rich(columns, cells, natural)
        if folding and spare >= MIN_FOLD * len(folding):
            return _rich(columns, cells, _share(natural, folding, spare))
        if folding:
            return _stacked(columns, cells, natural)
    return _plain(columns, cells, natural)


def print_table(
    console: Console, columns: Sequence[Column], rows: Sequence[Sequence[object]]
) -> None:
    """Print the table of ``rows`` to ``console``: folded to its width on a terminal,
    plain lines otherwise (see the module's docstring)."""
    show(console, layout(columns, rows, console.width if console.is_terminal else None))


def show(console: Console, table: RenderableType) -> None:
    """Print what `layout` made: lines it laid out itself (plain or stacked) as
    they are, never wrapped or cropped again by rich."""
    console.print(table, soft_wrap=isinstance(table, Text), crop=False, highlight=False)


def _share(natural: list[int], folding: list[int], spare: int) -> list[int]:
    """Widths where the folding columns share ``spare`` cells, left to right: each
    takes what it needs while leaving ``MIN_FOLD`` to each one after it, and the last
    takes the rest (free text comes last: names keep their line, errors fold)."""
    widths = list(natural)
    for n, i in enumerate(folding):
        after = len(folding) - n - 1
        widths[i] = min(natural[i], spare - MIN_FOLD * after) if after else spare
        spare -= widths[i]
    return widths


def _rich(columns: Sequence[Column], cells: list[list[str]], widths: list[int]) -> Table:
    table = Table(box=None, padding=(0, GAP, 0, 0), pad_edge=False, collapse_padding=True)
    for i, c in enumerate(columns):
        # Fixed widths: rich never shrinks a column of a table that fits, so the
        # whole ones stay whole; the folding ones fold at their share.
        table.add_column(
            c.header, width=widths[i], no_wrap=not c.fold, overflow="fold", justify=c.justify
        )
    for row in cells:
        table.add_row(*(Text(v) for v in row))
    return table


def _stacked(columns: Sequence[Column], cells: list[list[str]], natural: list[int]) -> Group:
    """Too narrow for a table: each row's whole columns on one line, and under it
    each folding column that has a value, as ``header: value``, folded by rich to the
    terminal's width."""
    whole = [i for i, c in enumerate(columns) if not c.fold]

    # (the whole columns' line is never wrapped: wider than the terminal, the
    # terminal wraps it, without rich cutting an id in two)
    def line(row: list[str]) -> Text:
        return Text(_line(columns, natural, row, whole), no_wrap=True, overflow="ignore")

    parts: list[RenderableType] = [line([c.header for c in columns])]
    for row in cells:
        parts.append(line(row))
        parts.extend(
            Padding(Text(f"{c.header}: {row[i]}", overflow="fold"), (0, 0, 0, 2))
            for i, c in enumerate(columns)
            if c.fold and row[i]
        )
    return Group(*parts)


def _line(columns: Sequence[Column], widths: list[int], row: list[str], at: Sequence[int]) -> str:
    """The cells of ``row`` at the indices ``at``, padded to ``widths``."""
    parts = []
    for i in at:
        pad = " " * (widths[i] - cell_len(row[i]))
        parts.append(pad + row[i] if columns[i].justify == "right" else row[i] + pad)
    return (" " * GAP).join(parts).rstrip()


def _plain(columns: Sequence[Column], cells: list[list[str]], widths: list[int]) -> Text:
    rows = [[c.header for c in columns], *cells]
    return Text("\n".join(_line(columns, widths, row, range(len(columns))) for row in rows))
