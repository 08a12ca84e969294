"""The public API's types (API.md §12), checked the way a user's CI would: mypy
--strict over code that uses trioexec (``tests/typing/``, never run).

``test_public_api.py`` must be clean: its ``assert_type`` calls pin what each call
returns, with no cast anywhere. ``mistakes.py`` must fail exactly where marked:
each line ending ``# E: <text>`` gets an error whose message (with its ``[code]``)
contains ``<text>``, and no other line gets one.
"""

from __future__ import annotations

import io
import pathlib
import re
import tokenize

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is not installed")

ROOT = pathlib.Path(__file__).parent.parent
TYPING = pathlib.Path(__file__).parent / "typing"
CLEAN = TYPING / "test_public_api.py"
MISTAKES = TYPING / "mistakes.py"

ERROR = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+): error: (?P<message>.*)$", re.MULTILINE)
MARK = re.compile(r"^#\s*E:\s*(?P<expected>.+?)\s*$")


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, list[str]]]:
    """mypy --strict's errors over both files, by file name and line (one run)."""
    cache = tmp_path_factory.mktemp("mypy_cache")
    stdout, stderr, status = mypy_api.run(
        [
            "--strict",
            "--python-version=3.11",
            "--config-file=",  # this, not the repository's settings: a user's plain --strict
            f"--cache-dir={cache}",
            # trioexec as users get it: checked for its types, its own errors not shown
            "--follow-imports=silent",
            "--no-error-summary",
            "--show-error-codes",
            "--hide-error-context",
            "--no-pretty",
            "--no-color-output",
            str(CLEAN),
            str(MISTAKES),
        ]
    )
    assert status in (0, 1), f"mypy crashed ({status}):\n{stdout}\n{stderr}"
    errors: dict[str, dict[int, list[str]]] = {CLEAN.name: {}, MISTAKES.name: {}}
    for match in ERROR.finditer(stdout):
        name = pathlib.Path(match["path"]).name
        errors.setdefault(name, {}).setdefault(int(match["line"]), []).append(match["message"])
    unexpected = set(errors) - {CLEAN.name, MISTAKES.name}
    assert not unexpected, f"mypy reported errors outside tests/typing:\n{stdout}"
    return errors


def test_the_public_api_checks_clean(mypy_errors: dict[str, dict[int, list[str]]]) -> None:
    found = mypy_errors[CLEAN.name]
    assert found == {}, "\n".join(
        f"{CLEAN.name}:{line}: {message}"
        for line, messages in sorted(found.items())
        for message in messages
    )


def _marked_lines() -> dict[int, str]:
    """The expected error of each marked line (its comment ``# E: <text>``)."""
    marks = {}
    source = io.StringIO(MISTAKES.read_text(encoding="utf-8"))
    for token in tokenize.generate_tokens(source.readline):
        if token.type == tokenize.COMMENT and (match := MARK.match(token.string)):
            marks[token.start[0]] = match["expected"]
    return marks


def test_every_marked_mistake_is_reported_and_nothing_else(
    mypy_errors: dict[str, dict[int, list[str]]],
) -> None:
    marks = _marked_lines()
    assert len(marks) >= 15  # (the file is read as it should be)
    found = mypy_errors[MISTAKES.name]
    missed = {
        line: (expected, found.get(line, []))
        for line, expected in marks.items()
        if not any(expected in message for message in found.get(line, []))
    }
    extra = {line: messages for line, messages in found.items() if line not in marks}
    assert not missed, "marked lines without the expected error:\n" + "\n".join(
        f"  {MISTAKES.name}:{line}: expected {expected!r}, got {got}"
        for line, (expected, got) in sorted(missed.items())
    )
    assert not extra, "errors on unmarked lines:\n" + "\n".join(
        f"  {MISTAKES.name}:{line}: {messages}" for line, messages in sorted(extra.items())
    )
